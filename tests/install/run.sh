#!/usr/bin/env bash
# Installs a built tree into a temporary prefix with `cmake --install`, checks the layout, then
# builds hello.c and hello.cc out of tree against that prefix two ways, with pkg-config and with
# find_package(Loom), and runs each of the 4 programs as 2 ranks (LOOM_RANK, LOOM_WORLD_SIZE,
# LOOM_COMM_ID on a free loopback port; the programs use loomCommInitFromEnv). The programs find
# libloom through an rpath to the prefix, and must not pick up the build tree's copy.
# Exit status: 0 when all 4 pass, 1 on a failure, 77 (skip) without pkg-config.
# usage: run.sh BUILD_DIR
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd) || exit 1
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v pkg-config >/dev/null; then
  echo "SKIP: pkg-config is not installed (scripts/setup.sh installs it)"
  exit 77
fi
work=$(mktemp -d /tmp/loom_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# A loopback port nothing listens on.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    if ! (: </dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# ---- Install and check the layout ----
if ! cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
  cat "$work/install.log"
  echo "FAIL: cmake --install $build"
  exit 1
fi
pc=$(find "$prefix" -name loom.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no loom.pc under $prefix"; find "$prefix"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
echo "installed into $prefix (libdir ${libdir#"$prefix"/})"
[ -f "$prefix/include/loom/loom.h" ] || fail "include/loom/loom.h is not installed"
for f in libloom.so libloom.so.0; do
  [ -L "$libdir/$f" ] || fail "$f is not a symbolic link"
done
[ -f "$(readlink -f "$libdir/libloom.so")" ] || fail "libloom.so does not lead to the library"
soname=$(readelf -d "$libdir/libloom.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libloom.so.0" ] || fail "SONAME is '$soname', want libloom.so.0"
cmdir=$libdir/cmake/Loom
for f in LoomConfig.cmake LoomConfigVersion.cmake LoomTargets.cmake; do
  [ -f "$cmdir/$f" ] || fail "$f is not installed in ${cmdir#"$prefix"/}"
done
if grep -qE 'loom_(util|bootstrap|transport|algorithms|kernels)' "$cmdir"/LoomTargets*.cmake; then
  fail "the exported targets name Loom's internal static libraries"
fi

# ---- Build the programs ----
mkdir -p "$work/pc" "$work/cm"
# A sanitizer build's libloom needs its runtime loaded first: build the programs with it too.
san=()
if grep -q '^LOOM_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  san=(-fsanitize=address,undefined)
fi
export PKG_CONFIG_LIBDIR="$(dirname "$pc")"  # only this prefix's loom.pc
unset PKG_CONFIG_PATH
pcver=$(pkg-config --modversion loom) || fail "pkg-config cannot read loom.pc"
pclibdir=$(cd "$(pkg-config --variable=libdir loom)" && pwd) || fail "pkg-config: bad libdir"
read -r -a pcflags <<<"$(pkg-config --cflags --libs loom)"
echo "pkg-config: loom $pcver: ${pcflags[*]}"
cc -std=c99 -Wall -Wextra -Werror ${san[@]+"${san[@]}"} -o "$work/pc/hello_c" "$here/hello.c" \
  "${pcflags[@]}" -Wl,-rpath,"$pclibdir" || fail "pkg-config: cc hello.c"
c++ -std=c++17 -Wall -Wextra -Werror ${san[@]+"${san[@]}"} -o "$work/pc/hello_cc" \
  "$here/hello.cc" "${pcflags[@]}" -Wl,-rpath,"$pclibdir" || fail "pkg-config: c++ hello.cc"

cat >"$work/cm/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(loom_hello LANGUAGES C CXX)
find_package(Loom 0.1 REQUIRED CONFIG)
message(STATUS "Loom \${Loom_VERSION} from \${Loom_DIR}")
add_executable(hello_c "$here/hello.c")
target_link_libraries(hello_c PRIVATE Loom::loom)
add_executable(hello_cc "$here/hello.cc")
set_target_properties(hello_cc PROPERTIES CXX_STANDARD 17)
target_link_libraries(hello_cc PRIVATE Loom::loom)
CMAKE
if cmake -S "$work/cm" -B "$work/cm/build" -DCMAKE_PREFIX_PATH="$prefix" \
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_C_FLAGS="${san[*]-}" -DCMAKE_CXX_FLAGS="${san[*]-}" >"$work/cm.log" 2>&1 &&
   cmake --build "$work/cm/build" -j1 >>"$work/cm.log" 2>&1; then
  grep -o "Loom .* from .*" "$work/cm.log"
  grep -q "from $cmdir\$" "$work/cm.log" || fail "find_package(Loom) found another Loom"
else
  cat "$work/cm.log"
  fail "find_package(Loom): configure or build"
fi

# ---- Run each program as 2 ranks ----
run2() {
  local name=$1 bin=$2 port r rc=0
  local -a pids=()
  if [ ! -x "$bin" ]; then
    fail "$name: not built"
    return
  fi
  local libs
  libs=$(env -u LD_LIBRARY_PATH ldd "$bin" 2>&1)
  if ! grep -q "libloom.so.0 => $libdir/" <<<"$libs"; then
    echo "$libs"
    fail "$name: does not load libloom from the prefix"
    return
  fi
  port=$(free_port) || { fail "$name: no free port"; return; }
  for r in 0 1; do
    env -u LD_LIBRARY_PATH LOOM_RANK=$r LOOM_WORLD_SIZE=2 LOOM_COMM_ID=127.0.0.1:$port \
      LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT_MS=30000 timeout 120 "$bin" >"$work/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || rc=1
  done
  if [ $rc -eq 0 ] && [ "$(cat "$work/$name".*.log | grep -c ' OK')" -eq 2 ]; then
    echo "PASS: $name: $(head -n 1 "$work/$name.0.log")"
  else
    for r in 0 1; do sed "s/^/  $name rank $r: /" "$work/$name.$r.log"; done
    fail "$name"
  fi
}
run2 pkg-config-c "$work/pc/hello_c"
run2 pkg-config-c++ "$work/pc/hello_cc"
run2 cmake-c "$work/cm/build/hello_c"
run2 cmake-c++ "$work/cm/build/hello_cc"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all 4 variants passed"
