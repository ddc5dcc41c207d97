#!/bin/bash
# tests/gpu/gate_up.sh: the MLP's gate/up product at 1 to 8 rows (decode) through cuBLASLt
# then swiglu.cu (the default at tp=1) against the GEMV that applies SwiGLU as it writes
# (TPINFER_GEMV=fused, the default before), on a GPU machine, in one call, from the
# repository root (the -dev packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops; its matmul group (matmul_swiglu through
#      cuBLASLt, and the fused GEMV itself, against the CPU);
#   2. bench/ab_decode.sh at b1 b2 b4 b8 b128 (BENCH_RUNS), the default and
#      TPINFER_GEMV=fused interleaved, GATE_UP_REPEAT times (default 2);
#   3. unless GATE_UP_PROFILE=0: TPINFER_PROFILE_OPS=1 at b1 and b2 (eager steps, GPU time
#      per operation and product shape: where a one-row step differs from a two-row one).
# Prints a table last; logs in $OUT (default /tmp/tpinfer-gu-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-gu-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer tests/check_backend_ops
ops_check matmul "matmul_swiglu blocks=matmul_swiglu.*ok"
args=()
for _ in $(seq "${GATE_UP_REPEAT:-2}"); do args+=("" "TPINFER_GEMV=fused"); done
OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b1 b2 b4 b8 b128} BENCH_TPINFER=$B/tpinfer timeout 480 \
    bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
ab_rows "ab" "$OUTDIR/ab.log"
if [ "${GATE_UP_PROFILE:-1}" = 1 ]; then
    OUT=$OUTDIR/prof BENCH_RUNS="b1 b2" BENCH_TPINFER=$B/tpinfer timeout 200 \
        bash bench/ab_decode.sh "TPINFER_PROFILE_OPS=1" >"$OUTDIR/prof.log" 2>&1
    cp "$OUTDIR/prof.log" "$OUTDIR/profile-b1-b2.md"
fi
print_results
