#!/bin/bash
# tests/gpu/gemv_early.sh: the one-row GEMV's ways of keeping weights in flight, each against
# the way before it, on a GPU machine, in one call, from the repository root (the -dev
# packages in .gpu-deps/ as for tests/gpu/run.sh; GPU_PREBUILT=DIR for binaries built
# elsewhere): its first chunks loaded before the wait for the kernel before
# (TPINFER_GEMV_EARLY=0: into L2 only) and, at one row, the next round's chunks loaded half a
# round at a time (TPINFER_GEMV_PIPE=0: when this round is summed). Both old ways stay options,
# so each is checked:
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_matmul; the matmul group as it is
#      (the one-row route) and under TPINFER_GEMV=all (every GEMV shape at 1-8 rows) as it
#      is, with TPINFER_GEMV_PIPE=0 and with TPINFER_GEMV_EARLY=0;
#   2. bench/ab_decode.sh on Llama-3.2-1B's shape (b1, b2) and Llama-3-8B's (b1): the default
#      and TPINFER_GEMV_PIPE=0, then the same with every one-row product on the GEMV
#      (TPINFER_GEMV=one: the warm-up does not choose), interleaved REPEAT times (default 2),
#      TPINFER_GEMV=0 once, then the default and PIPE=0 at TPINFER_LOG=debug: the warm-up's
#      timings of a batch-1 step through the GEMV and through cuBLASLt, and its choice;
#   3. bench/gpu_matmul's one-row products as they are, with PIPE=0 and with EARLY=0.
# Prints a table last; logs in $OUT (default /tmp/tpinfer-ge-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-ge-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer tests/check_backend_ops bench/gpu_matmul
ops_check matmul 200 "one-row calls=one row, .*ok"
TPINFER_GEMV=all ops_check matmul 200
TPINFER_GEMV=all TPINFER_GEMV_PIPE=0 ops_check matmul 200
TPINFER_GEMV=all TPINFER_GEMV_EARLY=0 ops_check matmul 200
args=()
for _ in $(seq "${REPEAT:-2}"); do
    args+=("" "TPINFER_GEMV_PIPE=0" "TPINFER_GEMV=one" "TPINFER_GEMV=one TPINFER_GEMV_PIPE=0")
done
args+=("TPINFER_GEMV=0" "TPINFER_LOG=debug" "TPINFER_LOG=debug TPINFER_GEMV_PIPE=0")
OUT=$OUTDIR/ab BENCH_SHAPES="llama-3.2-1b:2048:16:32:8:8192:128256 llama-3-8b:4096:32:32:8:14336:128256" \
    BENCH_RUNS=${BENCH_RUNS:-b1 b2} BENCH_RUNS_OTHER=${BENCH_RUNS_OTHER:-b1} BENCH_TPINFER=$B/tpinfer timeout 420 \
    bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
ab_rows "ab" "$OUTDIR/ab.log"
n=${#args[@]}
ab_lines "$OUTDIR/ab" "warm-up: a batch-1 step takes.*" "ab-$((n - 1))" "ab-$n"
matmul_rows "TPINFER_GEMV_PIPE=1" "TPINFER_GEMV_PIPE=0" "TPINFER_GEMV_EARLY=0"
print_results
