#!/usr/bin/env bash
# The GPU check, on a machine with one (or more) NVIDIA GPUs, the CUDA toolkit, CMake, ninja, a
# C++ compiler and Python 3, and no package registry. Builds Loom with CUDA against the folder
# tests/gpu/prepare.sh made (default gpu-deps/, or LOOM_GPU_DEPS), then within about 9 minutes:
#   1. loom-gpu-bench: the reduce kernel's GB/s beside cudaMemcpy device to device
#   2. loom-perf -G 1 (device buffers), all-reduce 16 B .. 256 MiB on 2 ranks sharing GPU 0, and
#      the 256 MiB row against what the copy bandwidth allows for its traffic
#   3. ctest -L gpu (kernels vs the CPU build, every collective on 1/2/4 ranks, graph replay,
#      device-side timeout)
#   4. loom-perf -G 1 on 1, 4 and 8 ranks, and 2 ranks staged through the host
# Starts the MPS control daemon when nvidia-cuda-mps-control exists (ranks sharing a GPU then run
# their kernels concurrently; if a short kernel run then fails, it runs without) and stops it at
# the end. Writes gpu-run.log and gpu-results.json
# (every step's status, seconds and figures) into $OUT when set, else build-gpu/. Exit status 0
# when every step passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/build-gpu}
mkdir -p "$out"
log=$out/gpu-run.log
results=$out/gpu-results.json
deps=${LOOM_GPU_DEPS:-$root/gpu-deps}
build=${LOOM_GPU_BUILD:-$root/build-gpu/build}
archs=${LOOM_GPU_ARCHS:-90-real}
budget=${LOOM_GPU_BUDGET_S:-540}  # the whole script, seconds
jobs=$(nproc)
steps=$(mktemp)
: > "$log"
exec > >(tee -a "$log") 2>&1

left() { echo $((budget - SECONDS)); }
# step NAME LIMIT_S CMD...: runs CMD with a timeout of min(LIMIT, time left), records the result.
step() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -le 5 ]; then
    echo "=== $name: skipped, no time left"
    printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$steps"
    return 1
  fi
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS rc=0
  # Through bash: timeout runs a program, and the build steps are this script's functions
  # (exported below).
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" || rc=$?
  local status=ok
  [ $rc -ne 0 ] && status="failed rc=$rc"
  [ $rc -eq 124 ] && status="timed out"
  echo "=== $name: $status in $((SECONDS - t0))s"
  printf '%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) >> "$steps"
  return $rc
}

echo "=== host $(hostname), $(date -u +%FT%TZ), budget ${budget}s, $jobs cores"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv 2>&1 || true
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$nvcc_bin" --version | tail -2 || true
cmake --version | head -1
command -v ninja >/dev/null && gen=Ninja || gen="Unix Makefiles"

mps_started=0
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  if nvidia-cuda-mps-control -d; then
    mps_started=1
    echo "=== MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
  else
    echo "=== MPS control daemon did not start; ranks sharing a GPU time-slice"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
else
  echo "=== no nvidia-cuda-mps-control: ranks sharing a GPU time-slice"
fi
stop_mps() { [ $mps_started -eq 1 ] && echo quit | nvidia-cuda-mps-control && mps_started=0; }
trap stop_mps EXIT

# --- build ---------------------------------------------------------------------------------------
gtest_prefix=$build/gtest-install
build_gtest() {
  [ -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ] && return 0
  cmake -S "$deps/src/googletest" -B "$build/gtest" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$gtest_prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null &&
    cmake --build "$build/gtest" -j "$jobs" >/dev/null && cmake --install "$build/gtest" >/dev/null
}
# libcrypto: the machine's own OpenSSL 3 (Python's ssl module brings one) with the carried
# headers, else the carried static library.
openssl_args() {
  local so
  so=$(ldconfig -p 2>/dev/null | sed -n 's|.*libcrypto\.so\.3 (libc6,x86-64) => ||p' | head -1)
  if [ -n "$so" ]; then
    mkdir -p "$build/openssl/lib"
    ln -sf "$so" "$build/openssl/lib/libcrypto.so"
    echo "-DOPENSSL_INCLUDE_DIR=$deps/openssl/include -DOPENSSL_CRYPTO_LIBRARY=$build/openssl/lib/libcrypto.so"
  else
    echo "-DOPENSSL_INCLUDE_DIR=$deps/openssl/include -DOPENSSL_CRYPTO_LIBRARY=$deps/openssl/lib/libcrypto.a"
  fi
}
configure() {
  # shellcheck disable=SC2046
  cmake -S "$root" -B "$build/loom" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
    $(openssl_args) \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    -DLOOM_TOPOLOGY=OFF -DLOOM_BUILD_TOOLS=OFF -DLOOM_NCCL_SHIM=OFF \
    -DCMAKE_PREFIX_PATH="$gtest_prefix;$deps" -DBoost_INCLUDE_DIR="$deps/include" \
    -DBoost_NO_BOOST_CMAKE=ON -DBoost_NO_SYSTEM_PATHS=ON
}
export root deps build gen jobs gtest_prefix nvcc_bin archs
export -f build_gtest openssl_args configure
targets="loom loom-perf loom-gpu-bench loom_gpu_kernel_tests loom_gpu_collective_tests loom_cuda_fallback_tests"
mkdir -p "$build"
step build_gtest 120 build_gtest &&
  step configure 60 configure &&
  step build 300 cmake --build "$build/loom" -j "$jobs" --target $targets
built=$?
bin=$build/loom

# --- measurements and tests ----------------------------------------------------------------------
perf() {  # perf NAME NP [extra flags]: loom-perf on device buffers, JSON into $out/NAME.json
  local name=$1 np=$2
  shift 2
  step "$name" 90 "$bin/loom-perf" -G 1 -np "$np" -b 16 -e 256M -f 4 -n 10 -w 3 -c 1 -T 80 \
    -J "$out/$name.json" "$@"
}
# A rank that fails must not leave the others' kernels waiting out the default 300 s; a test that
# finds no device fails here instead of skipping.
export LOOM_TIMEOUT_MS=30000 LOOM_GPU_REQUIRED=1
# The MPS control daemon starts its server only when the first client connects; where that
# server cannot run, every CUDA call fails. A short kernel run tells, before the steps rely on it.
probe() { timeout 60 "$bin/loom-gpu-bench" $((1 << 20)) 1 > /dev/null; }
if [ $built -eq 0 ] && [ $mps_started -eq 1 ] && ! probe; then
  echo "=== CUDA did not start under MPS: stopping MPS, ranks sharing a GPU time-slice"
  stop_mps
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if [ $built -eq 0 ]; then
  step gpu_bench 40 sh -c "'$bin/loom-gpu-bench' $((256 << 20)) 20 > '$out/gpu_bench.json'"
  cat "$out/gpu_bench.json" 2>/dev/null
  perf perf_2ranks 2
  step ctest_gpu 240 ctest --test-dir "$bin" -L gpu --output-on-failure --timeout 200 \
    --output-junit "$out/ctest-gpu.xml"
  step ctest_fallback 60 ctest --test-dir "$bin" -R CudaBuildFallback --output-on-failure
  perf perf_1rank 1
  perf perf_4ranks 4
  perf perf_8ranks 8
  LOOM_CUDA_IPC_DISABLE=1 perf perf_2ranks_staged 2 -e 64M
fi
stop_mps

# --- results -------------------------------------------------------------------------------------
python3 - "$steps" "$out" "$results" <<'PY'
import json, os, sys
steps_file, out, results = sys.argv[1:4]
steps = []
for line in open(steps_file):
    name, status, secs = line.rstrip("\n").split("\t")
    steps.append({"step": name, "status": status, "seconds": int(secs)})
doc = {"steps": steps, "passed": all(s["status"] == "ok" for s in steps) and len(steps) > 3}
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.loads(f.read().strip().splitlines()[-1]) if name.endswith("bench.json") else json.load(f)
    except Exception as e:
        return None
bench = load("gpu_bench.json")
doc["gpu_bench"] = bench
if bench:
    doc["reduce_vs_memcpy"] = bench.get("reduce_float32_vs_memcpy")
    doc["reduce_target_met"] = (bench.get("reduce_float32_vs_memcpy") or 0) >= 0.9
def rows(name):
    d = load(name + ".json")
    if d is None: return None
    return d
for n in ("perf_1rank", "perf_2ranks", "perf_4ranks", "perf_8ranks", "perf_2ranks_staged"):
    doc[n] = rows(n)
# The 256 MiB all-reduce on 2 ranks of one GPU: one-shot moves, per rank, its input into its
# buffer (read B, write B) and both buffers into its output (read 2B, write B): 10B for both
# ranks on the one GPU, which at the copy bandwidth (bytes read + written per second) takes
# 10B / copy_bw.
try:
    r2 = [x for x in doc["perf_2ranks"] if int(x.get("size", 0)) == 256 << 20][0]
    t_us = float(r2["oop_time_us"])
    B = 256 << 20
    allowed_us = 10 * B / (bench["memcpy_d2d_GBps"] * 1e9) * 1e6
    doc["allreduce_256MiB_2ranks"] = {"time_us": t_us, "copy_bound_us": allowed_us,
                                      "fraction_of_copy_bound": allowed_us / t_us,
                                      "target_met": allowed_us / t_us >= 0.8}
except Exception as e:
    doc["allreduce_256MiB_2ranks"] = {"error": "not computed: %r" % (e,)}
json.dump(doc, open(results, "w"), indent=1)
print(json.dumps({k: doc[k] for k in doc if not k.startswith("perf_")}, indent=1))
PY
rm -f "$steps"
python3 -c "import json,sys; sys.exit(0 if json.load(open('$results'))['passed'] else 1)"
