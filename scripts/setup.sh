#!/usr/bin/env bash
# Installs what Loom needs to build and test: Debian 12's packages, then the Python side's
# packages (python/requirements.txt, pinned) into .venv, the interpreter that the Python tests
# and benchmarks use (tests/python/run.sh, bench/python/). LOOM_VENV moves it.
set -euo pipefail
pkgs=(cmake make g++ libgtest-dev libgmock-dev libbenchmark-dev libboost-dev iproute2 procps
      openmpi-bin libopenmpi-dev libgloo-dev pkg-config
      libhwloc-dev libxml2-dev libssl-dev nlohmann-json3-dev chromium
      python3-pip python3-setuptools python3-wheel python3-numpy python3-venv python3-dev
      clang libclang-rt-14-dev clang-format-14
      libibverbs-dev ibverbs-providers qemu-system-x86 busybox-static cpio valgrind)
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

# The virtual environment, made from Debian's interpreter where there is one.
venv=${LOOM_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}
req=$(cd "$(dirname "$0")/../python" && pwd)/requirements.txt
base=python3
[ -x /usr/bin/python3 ] && base=/usr/bin/python3
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
# Installs nothing when every pin is already met (a second run takes about a second).
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >"$venv/pip.log" 2>&1; then
  cat "$venv/pip.log" >&2
  exit 1
fi

# NCCL's header, for the NCCL shim (shim/CMakeLists.txt looks in .deps/nccl/include): taken from
# NCCL's pinned wheel, of which nothing else is kept. The header includes the CUDA runtime's
# headers, which come with the CUDA toolkit (/usr/local/cuda). The shim is optional: without
# either it is not built, and its test skips.
nccl_pin=nvidia-nccl-cu13==2.30.7
nccl_inc=$(cd "$(dirname "$0")/.." && pwd)/.deps/nccl/include
if [ ! -f "$nccl_inc/nccl.h" ] || ! grep -qx "$nccl_pin" "$nccl_inc/.pin" 2>/dev/null; then
  wheels=$(mktemp -d)
  if "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" \
       "$nccl_pin" >"$venv/pip-nccl.log" 2>&1; then
    mkdir -p "$nccl_inc"
    if "$venv/bin/python" - "$wheels" "$nccl_inc" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("nvidia/nccl/include/nccl.h")
with open(os.path.join(sys.argv[2], "nccl.h"), "wb") as f:
    f.write(data)
PY
    then
      echo "$nccl_pin" >"$nccl_inc/.pin"
    else
      echo "setup.sh: no nccl.h in $nccl_pin's wheel; the NCCL shim will not be built" >&2
    fi
  else
    echo "setup.sh: $nccl_pin could not be fetched (see $venv/pip-nccl.log); the NCCL shim" \
         "will not be built" >&2
  fi
  rm -rf "$wheels"
fi
