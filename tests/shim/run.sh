#!/usr/bin/env bash
# The NCCL shim as a user meets it. Checks that libnccl.so.2 is named and linked as NCCL's is and
# exports every entry point NCCL's header declares; builds nccl_host_test.c out of tree against
# that header with `cc ... -lnccl`, once with an rpath to the shim and once without; checks with
# ldd which libnccl.so.2 each binary loads; runs the collectives on 2 and 3 ranks through the
# rpath, through LD_LIBRARY_PATH (replacing whatever libnccl.so.2 the system has) and through
# LD_PRELOAD; runs nccl_env_test.c (NCCL's variables: NCCL_COMM_ID from the program's setenv,
# NCCL_SOCKET_IFNAME, NCCL_DEBUG in lower case). With BUILD_DIR, also installs the build into a temporary prefix and runs the
# program on the installed <libdir>/loom-nccl/libnccl.so.2.
# usage: run.sh SHIM_DIR NCCL_INCLUDE_DIR [BUILD_DIR]     exit 0 pass, 1 fail, 77 skip
set -uo pipefail
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 SHIM_DIR NCCL_INCLUDE_DIR [BUILD_DIR]" >&2; exit 2; }
shim=$(cd "$1" 2>/dev/null && pwd) || { echo "SKIP: no shim folder $1 (nccl.h not found at configure time)"; exit 77; }
inc=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$inc/nccl.h" ] || { echo "SKIP: $inc/nccl.h does not exist"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "SKIP: no C compiler ($cc)"; exit 77; }
work=$(mktemp -d /tmp/loom_shim_XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# ---- The library: names, links, exports ----
lib=$shim/libnccl.so.2
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ] && ok "SONAME libnccl.so.2" || fail "SONAME is '$soname'"
[ -L "$shim/libnccl.so" ] && [ "$(readlink -f "$shim/libnccl.so")" = "$(readlink -f "$lib")" ] \
  && ok "libnccl.so links to the library" || fail "libnccl.so does not lead to libnccl.so.2"
# Every function NCCL's header declares (nccl* and the profiling pnccl*) is exported.
grep -oE '^[a-zA-Z_ *]*[ *](p?nccl[A-Za-z0-9]+)\(' "$inc/nccl.h" | grep -oE 'p?nccl[A-Za-z0-9]+\($' |
  tr -d '(' | sort -u >"$work/declared"
nm -D --defined-only "$lib" | awk '{print $3}' | sort -u >"$work/exported"
missing=$(comm -23 "$work/declared" "$work/exported")
extra=$(comm -13 "$work/declared" "$work/exported")
if [ -z "$missing" ]; then
  ok "exports all $(wc -l <"$work/declared") functions nccl.h declares"
else
  fail "not exported: $(echo $missing)"
fi
[ -z "$extra" ] && ok "exports nothing else" || fail "exports more than nccl.h declares: $(echo $extra)"

# ---- A program built against nccl.h, linked with -lnccl ----
cflags=(-std=c11 -O1 -Wall -Werror -I"$inc")
if ! "$cc" "${cflags[@]}" "$here/nccl_host_test.c" -L"$shim" -lnccl -lm -Wl,-rpath,"$shim" \
    -o "$work/t_rpath" 2>"$work/cc.log"; then
  cat "$work/cc.log"
  fail "nccl_host_test.c does not build against $inc/nccl.h"
  echo "$passed passed, $failed failed"
  exit 1
fi
"$cc" "${cflags[@]}" "$here/nccl_host_test.c" -L"$shim" -lnccl -lm -o "$work/t_plain" \
  && ok "built against $inc/nccl.h with -lnccl, with and without an rpath" \
  || fail "build without rpath"

resolves() {  # resolves BINARY [env...] -> the path libnccl.so.2 resolves to
  local bin=$1
  shift
  env "$@" ldd "$bin" | awk '$1 == "libnccl.so.2" {print $3}'
}
want=$(readlink -f "$lib")
got=$(resolves "$work/t_rpath")
[ "$(readlink -f "$got")" = "$want" ] && ok "rpath binary loads the shim" \
  || fail "rpath binary loads '$got', not $lib"
system=$(resolves "$work/t_plain")
echo "   without LD_LIBRARY_PATH the plain binary loads: ${system:-nothing (not found)}"
got=$(resolves "$work/t_plain" LD_LIBRARY_PATH="$shim")
[ "$(readlink -f "$got")" = "$want" ] && ok "LD_LIBRARY_PATH=$shim makes the plain binary load the shim" \
  || fail "with LD_LIBRARY_PATH the plain binary loads '$got'"
# libloom comes with the shim (its RUNPATH), whatever the caller's paths.
[ -n "$(env LD_LIBRARY_PATH="$shim" ldd "$work/t_plain" | awk '$1 == "libloom.so.0" && $3 != "not" {print $3}')" ] \
  && ok "the shim finds libloom.so.0 by itself" || fail "libloom.so.0 not found through the shim"

# ---- Collectives on host buffers ----
run() {  # run LABEL NRANKS BINARY [env...]
  local label=$1 n=$2 bin=$3
  shift 3
  if env "$@" timeout 300 "$bin" "$n" >"$work/out" 2>&1; then
    ok "$label, $n ranks: $(tail -n 1 "$work/out")"
  else
    cat "$work/out"
    fail "$label, $n ranks"
  fi
}
run "rpath" 2 "$work/t_rpath"
run "rpath" 3 "$work/t_rpath"
run "LD_LIBRARY_PATH" 2 "$work/t_plain" LD_LIBRARY_PATH="$shim"
run "LD_LIBRARY_PATH" 3 "$work/t_plain" LD_LIBRARY_PATH="$shim"
run "LD_PRELOAD" 2 "$work/t_plain" LD_PRELOAD="$lib"

# ---- NCCL's variables: read as NCCL reads them, none of Loom's written for children ----
if "$cc" "${cflags[@]}" "$here/nccl_env_test.c" -L"$shim" -lnccl -Wl,-rpath,"$shim" \
    -o "$work/t_env" 2>"$work/cc.log"; then
  port=$((20000 + RANDOM % 20000))
  if env -u LOOM_COMM_ID -u LOOM_DEBUG -u LOOM_SOCKET_IFNAME NCCL_SOCKET_IFNAME=lo \
      NCCL_DEBUG=info NCCL_DEBUG_SUBSYS=BOOTSTRAP timeout 120 "$work/t_env" "$port" \
      >"$work/env.out" 2>"$work/env.err"; then
    ok "$(tail -n 1 "$work/env.out")"
  else
    cat "$work/env.out" "$work/env.err"
    fail "NCCL_COMM_ID set by the program"
  fi
  if env LOOM_TIMEOUT_MS=1500 timeout 120 "$work/t_env" "$((port + 1))" timeout \
      >"$work/env.out" 2>&1; then
    ok "$(tail -n 1 "$work/env.out")"
  else
    cat "$work/env.out"
    fail "a non-blocking timeout through ncclCommGetAsyncError"
  fi
  # NCCL_DEBUG=info (any case, as NCCL takes it) logs; NCCL_SOCKET_IFNAME picks the interface.
  grep -q "INFO BOOTSTRAP using interface lo " "$work/env.err" &&
    ok "NCCL_DEBUG=info and NCCL_SOCKET_IFNAME=lo taken" ||
    { head -n 5 "$work/env.err"; fail "NCCL_DEBUG=info or NCCL_SOCKET_IFNAME=lo not taken"; }
else
  cat "$work/cc.log"
  fail "nccl_env_test.c does not build"
fi
# ---- Installed: <libdir>/loom-nccl/libnccl.so.2 finds <libdir>/libloom.so.0 ----
if [ $# -eq 3 ]; then
  if cmake --install "$3" --prefix "$work/prefix" >"$work/install.log" 2>&1; then
    idir=$(dirname "$(find "$work/prefix" -path '*/loom-nccl/libnccl.so.2' | head -n 1)")
    if [ -f "$idir/libnccl.so.2" ]; then
      got=$(env LD_LIBRARY_PATH="$idir" ldd "$work/t_plain" | awk '$1 == "libloom.so.0" {print $3}')
      case $got in "$work/prefix"/*) ok "installed shim finds the installed libloom.so.0" ;;
        *) fail "installed shim loads libloom.so.0 from '$got'" ;; esac
      run "installed" 2 "$work/t_plain" LD_LIBRARY_PATH="$idir"
    else
      fail "cmake --install put no loom-nccl/libnccl.so.2 under the prefix"
    fi
  else
    tail -n 5 "$work/install.log"
    fail "cmake --install $3"
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
