#!/bin/bash
# tests/gpu/two_gpus.sh COMMIT: issue 8's whole check on a 2-GPU machine in one call.
#   1. tests/gpu/run.sh at tp=2 (operations, every model, compute-sanitizer on both ranks),
#      pp=2 and dp=2 (models);
#   2. tpinfer --check on the two GPUs (P2P matrix, all-reduce sweep);
#   3. bench/gpu_decode.sh for Llama-3-8B at tp=2 (with and without the layers'
#      all-reduces, for their share of a decode step), pp=2 and dp=2.
# Leaves a few files in $OUT (the device tool returns only a handful): results.md, and
# logs.tar.gz with everything else.
set -u
COMMIT=${1:-?}
root=$(pwd)
R=${OUT:-/tmp/two-gpus-out}
L=/tmp/two-gpus-logs
mkdir -p "$R" "$L"
export NCCL_NVLS_ENABLE=0 TPINFER_SHARED=${TPINFER_SHARED:-$root/.gpu-shared} GPU_HF_BF16=0
S=llama-3-8b:4096:32:32:8:14336:128256
{
    echo "## tests/gpu/run.sh"
    OUT=$L/tp2 timeout 260 bash tests/gpu/run.sh 2 1 1 2>&1 | grep -E '^\| ' | tail -20
    OUT=$L/pp2 GPU_OPS=0 GPU_SANITIZER=0 timeout 90 bash tests/gpu/run.sh 1 2 1 2>&1 | grep -E '^\| ' | tail -16
    OUT=$L/dp2 GPU_OPS=0 GPU_SANITIZER=0 timeout 90 bash tests/gpu/run.sh 1 1 2 2>&1 | grep -E '^\| ' | tail -16
} >"$R/results.md"
lib=$root/.gpu-deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$root/build-gpu/tpinfer
{
    echo "## tpinfer --check (2 ranks)"
    timeout 60 mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np 2 "$T" --check --tp 2 2>&1 | tail -40
} >>"$R/results.md"
bench() { # bench NAME TP PP DP RUNS [env...]
    local name=$1 tp=$2 pp=$3 dp=$4 runs=$5
    shift 5
    env "$@" BENCH_COMMIT="$COMMIT" BENCH_TPINFER="$T" BENCH_RUNS="$runs" BENCH_RUNS_OTHER= BENCH_SWEEP= BENCH_HF=0 \
        BENCH_OPS=0 BENCH_SHAPES=$S BENCH_BUDGET_S=100 OUT=$L/bench-$name timeout 110 \
        bash bench/gpu_decode.sh "$tp" "$pp" "$dp" >"$L/bench-$name.log" 2>&1
    echo "### $name"
    grep -E '^\| llama' "$L/bench-$name/bench-results.md" 2>/dev/null || tail -3 "$L/bench-$name.log"
}
{
    echo "## bench (Llama-3-8B shape, bf16)"
    bench tp2 2 1 1 "b1 b128"
    bench tp2-no-allreduce 2 1 1 "b1 b128" TPINFER_BENCH_SKIP_ALLREDUCE=1
    grep -c "TPINFER_BENCH_SKIP_ALLREDUCE=1: the layers" "$L"/bench-tp2-no-allreduce/*-b1.log 2>/dev/null |
        sed 's/^/skip-all-reduce warnings seen: /'
    bench pp2 1 2 1 "b1 b128"
    bench dp2 1 1 2 "b128"
} >>"$R/results.md"
tar -czf "$R/logs.tar.gz" -C /tmp two-gpus-logs 2>/dev/null
cat "$R/results.md"
