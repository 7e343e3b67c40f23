#!/usr/bin/env bash
# Installs what Loom needs to build and test, from Debian 12's packages.
set -euo pipefail
pkgs=(cmake make g++ libgtest-dev libgmock-dev libbenchmark-dev libboost-dev iproute2 procps
      openmpi-bin libopenmpi-dev libgloo-dev pkg-config
      libhwloc-dev libxml2-dev libssl-dev nlohmann-json3-dev chromium
      python3-pip python3-setuptools python3-wheel python3-numpy python3-torch
      clang libclang-rt-14-dev
      libibverbs-dev ibverbs-providers qemu-system-x86 busybox-static cpio)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || true
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
