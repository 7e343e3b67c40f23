#!/usr/bin/env bash
# Runs the Python package's tests with python3 -m unittest against a built libloom.
#   run.sh LIBLOOM bindings   test_loom.py and test_dlpack.py, a smoke run of
#                             bench/python/mem_alloc_bench.py, then `pip install` of python/
#                             into a temporary folder (offline, --no-build-isolation) and an
#                             import of the installed copy
#   run.sh LIBLOOM torch      test_torch_backend.py (the loom torch backend against gloo), then
#                             smoke runs of bench/python/torch_allreduce.py, torch_p2p.py and
#                             torch_tp_decode.py (eager)
#   run.sh LIBLOOM suite      torch_suite.py: PyTorch's own distributed suite on gloo and loom
#                             (2 and 3 processes); torch and suite exit 77 (skip) without torch
# The interpreter is $LOOM_PYTHON, else the project's .venv (scripts/setup.sh makes it, with
# torch 2.13.0), else Debian's /usr/bin/python3, else python3 on PATH.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 LIBLOOM bindings|torch|suite" >&2; exit 2; }
lib=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../python" && pwd)
py=${LOOM_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$here/../../.venv/bin/python" ]; then
    py=$here/../../.venv/bin/python
  elif [ -x /usr/bin/python3 ]; then
    py=/usr/bin/python3
  else
    py=$(command -v python3)
  fi
fi
[ -n "$py" ] || { echo "SKIP: no python3"; exit 77; }
export LOOM_LIBRARY=$lib PYTHONPATH=$src:$here PYTHONDONTWRITEBYTECODE=1
echo "python: $py ($("$py" --version 2>&1)), LOOM_LIBRARY=$lib"

case $2 in
  bindings)
    "$py" -m unittest -v test_loom test_dlpack 2>&1
    rc=$?
    [ $rc -eq 0 ] || exit $rc
    # The mem_alloc benchmark's smoke run: it checks its sums and prints a ratio per rank count.
    out=$("$py" "$here/../../bench/python/mem_alloc_bench.py" --quick 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] && [ "$(grep -cE '^mem_alloc_bench: ranks [24] .* ratio [0-9.]+$' <<<"$out")" -eq 2 ] ||
      { echo "FAIL: bench/python/mem_alloc_bench.py --quick"; exit 1; }
    # An offline install of the package, used from outside the source tree.
    # An interpreter with pip, setuptools and wheel (Debian: python3-pip, python3-wheel).
    pip_py=
    for p in "$py" "$(command -v python3)"; do
      if [ -n "$p" ] && "$p" -c 'import pip, setuptools, wheel' >/dev/null 2>&1; then
        pip_py=$p
        break
      fi
    done
    if [ -z "$pip_py" ]; then
      echo "pip install: not checked (no interpreter with pip, setuptools and wheel)"
      exit 0
    fi
    work=$(mktemp -d /tmp/loom_pip_XXXXXX)
    trap 'rm -rf "$work"' EXIT
    cp -r "$src" "$work/src"  # pip builds in place; keep the checkout clean
    if ! "$pip_py" -m pip install --no-build-isolation --no-deps --no-index --target "$work/site" \
        "$work/src" >"$work/pip.log" 2>&1; then
      cat "$work/pip.log"
      echo "FAIL: pip install --no-build-isolation ./python"
      exit 1
    fi
    (cd "$work" && PYTHONPATH=$work/site "$pip_py" -c '
import loom, os, sys
assert loom.__file__.startswith(sys.argv[1]), loom.__file__
v = loom.version()
with loom.Communicator(0, 1, loom.unique_id()) as c:
    b = bytearray(b"\x01\x02"); c.all_reduce(b); assert b == bytearray(b"\x01\x02")
print("pip install: ok, loom %d from %s" % (v, os.path.dirname(loom.__file__)))' "$work/site") || {
      echo "FAIL: the pip-installed package does not work"; exit 1; }
    ;;
  torch|suite)
    if ! "$py" -c 'import torch.distributed' >/dev/null 2>&1; then
      echo "SKIP: torch not installed for $py (scripts/setup.sh installs torch 2.13.0 in .venv)"
      exit 77
    fi
    if [ "$2" = torch ]; then
      "$py" -m unittest -v test_torch_backend 2>&1 || exit 1
      # The benchmarks' smoke runs: every size's values checked, on gloo and loom.
      "$py" "$here/../../bench/python/torch_allreduce.py" --quick -np 2 --backends gloo,loom 2>&1 ||
        exit 1
      "$py" "$here/../../bench/python/torch_p2p.py" --quick --backends gloo,loom 2>&1 || exit 1
      # Tensor-parallel decode, eager (the compiled model is test_torch_backend's tp_compiled):
      # every token's output checked against the unsharded model's.
      "$py" "$here/../../bench/python/torch_tp_decode.py" --quick --modes eager \
        --backends gloo,loom 2>&1
    else
      "$py" "$here/torch_suite.py" 2>&1
    fi
    ;;
  *) echo "usage: $0 LIBLOOM bindings|torch|suite" >&2; exit 2 ;;
esac
