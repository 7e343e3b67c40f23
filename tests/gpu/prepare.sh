#!/usr/bin/env bash
# Prepares, on a machine with Debian's packages installed (scripts/setup.sh), the folder of build
# dependencies that tests/gpu/run.sh needs on a GPU machine without a package registry:
#   include/boost/...   the Boost headers Loom's bootstrap (Boost.Asio) includes, found with the
#                       compiler's dependency output, plus boost/config and boost/predef whole
#                       (their choice of files depends on the compiler)
#   src/googletest      GoogleTest's sources (run.sh builds them with the GPU machine's compiler,
#                       so no binary from this machine has to match that one's C++ library)
#   openssl/            OpenSSL's headers and static libcrypto (a C library)
# Everything else the GPU build needs (CMake, ninja, nvcc, a C++ compiler, Python) is on the GPU
# machine; the GPU build leaves out topology detection (hwloc, libxml2), loom-trace
# (nlohmann-json), the NCCL shim and the peers (LOOM_TOPOLOGY=OFF, LOOM_BUILD_TOOLS=OFF,
# LOOM_NCCL_SHIM=OFF).
#   tests/gpu/prepare.sh [folder, default gpu-deps]   (the folder is ignored by git: build*/ and
#   gpu-deps/; pass it to the device machine as a carried path)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/gpu-deps}
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/src"

# Boost: every header the Asio users include with this compiler, and the compiler-dependent trees.
boost_root=/usr/include
[ -f "$boost_root/boost/version.hpp" ] || { echo "prepare.sh: no Boost headers in $boost_root" >&2; exit 1; }
deps=$(mktemp)
for f in "$root"/src/bootstrap/*.cc "$root"/transport/tcp/*.cc; do
  g++ -std=c++17 -M -I"$root/include" -I"$root" -I"$root/src" "$f" | tr ' \\' '\n\n' |
    grep "^$boost_root/boost/" >> "$deps" || true
done
echo "$boost_root/boost/version.hpp" >> "$deps"
(cd "$boost_root" && sort -u "$deps" | sed "s|^$boost_root/||" | xargs cp --parents -t "$dest/include")
for d in boost/config boost/predef boost/asio/detail boost/asio/impl boost/system boost/align; do
  [ -d "$boost_root/$d" ] && (cd "$boost_root" && cp -r --parents "$d" "$dest/include")
done
rm -f "$deps"

# GoogleTest sources (Debian's googletest package).
gtest_src=/usr/src/googletest
[ -f "$gtest_src/CMakeLists.txt" ] || { echo "prepare.sh: no $gtest_src (apt-get install googletest)" >&2; exit 1; }
cp -r "$gtest_src" "$dest/src/googletest"

# OpenSSL's libcrypto (the handshake's MACs): its headers, and the static library for a machine
# whose own libcrypto.so.3 cannot be found (run.sh prefers that one).
mkdir -p "$dest/openssl/include" "$dest/openssl/lib"
cp -r /usr/include/openssl "$dest/openssl/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$dest/openssl/include/openssl/"
cp /usr/lib/x86_64-linux-gnu/libcrypto.a "$dest/openssl/lib/"

echo "prepare.sh: $dest holds $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1)"
