#!/bin/bash
# tests/gpu/one_row.sh: products of one row (batch-1 decode) through the GEMV or cuBLASLt as
# the warm-up's timing of a batch-1 step both ways chooses (the default), against cuBLASLt
# alone (TPINFER_GEMV=0, the default before) and the GEMV alone (TPINFER_GEMV=one), on a GPU
# machine, in one call, from the repository root (the -dev packages in .gpu-deps/ as for
# tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops; its matmul group (matmul_tuned: every
#      candidate of every form against the CPU, then matmul_one_row's both ways);
#   2. bench/ab_decode.sh on Llama-3.2-1B's shape (b1, b2) and Llama-3-8B's (b1, b128): the
#      default and TPINFER_GEMV=0 interleaved ONE_ROW_REPEAT times (default 2), then
#      TPINFER_GEMV=one once, and one run at TPINFER_LOG=debug: the warm-up's two timings
#      and its choice, and the shapes tuned. ONE_ROW_BASE=PATH: another build's tpinfer in
#      each round too (the tree before).
# Prints a table last; logs in $OUT (default /tmp/tpinfer-or-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-or-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer tests/check_backend_ops
ops_check matmul "tuning calls=tuning, call.*ok" "one-row calls=one row, .*ok"
args=()
for _ in $(seq "${ONE_ROW_REPEAT:-2}"); do
    args+=("" "TPINFER_GEMV=0")
    [ -n "${ONE_ROW_BASE:-}" ] && args+=("BENCH_TPINFER=$ONE_ROW_BASE")
done
args+=("TPINFER_GEMV=one" "TPINFER_LOG=debug")
OUT=$OUTDIR/ab BENCH_SHAPES="llama-3.2-1b:2048:16:32:8:8192:128256 llama-3-8b:4096:32:32:8:14336:128256" \
    BENCH_RUNS=${BENCH_RUNS:-b1 b2} BENCH_RUNS_OTHER=${BENCH_RUNS_OTHER:-b1 b128} BENCH_TPINFER=$B/tpinfer timeout 520 \
    bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
ab_rows "ab" "$OUTDIR/ab.log"
n=${#args[@]}
ab_lines "$OUTDIR/ab" 'warm-up: a batch-1 step takes.*\|matmul: [0-9]* shapes tuned.*\|warm-up before the first step: [0-9]* ms' "ab-$n"
print_results
