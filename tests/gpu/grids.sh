#!/bin/bash
# tests/gpu/grids.sh GPUS COMMIT: the multi-GPU issues' whole check on a GPUS-GPU machine
# (2, 4 or 8) in one call.
#   1. tests/gpu/run.sh at each grid of that machine (operations, every model whose shapes
#      split, compute-sanitizer on every rank at the first grid):
#        2 GPUs: tp=2, pp=2, dp=2      4 GPUs: tp=4, tp=2 x pp=2, dp=2 x tp=2
#        8 GPUs: tp=8, tp=4 x pp=2
#   2. tests/gpu/custom_ar.sh on all GPUs (the one-shot all-reduce against NCCL),
#      tests/gpu/rank_death.sh (a rank killed, a rank failing, a rank stopped as the NCCL
#      communicators are made and as the warm-up begins), tests/gpu/backend_agree.sh (a rank
#      without a GPU), tpinfer --check at the largest tp (P2P matrix, all-reduce sweep);
#   3. bench/gpu_decode.sh at each grid: Llama-3-8B's shape on 2 and 4 GPUs (and at the first
#      grid again without the layers' all-reduces, for their share of a decode step), a
#      Llama-3-70B shape on 8 GPUs (BENCH_SHAPES overrides).
# GRIDS_PARTS picks parts ("run checks bench", the default; e.g. "run" in one call and
# "checks bench" in the next when one call's time limit cannot hold all three).
# Leaves results.md and logs.tar.gz in $OUT (the device tool returns only a handful of files).
set -u
PARTS=" ${GRIDS_PARTS:-run checks bench} "
part() { [[ $PARTS == *" $1 "* ]]; }
GPUS=${1:?usage: tests/gpu/grids.sh GPUS COMMIT}
COMMIT=${2:-?}
root=$(pwd)
R=${OUT:-/tmp/grids-out}
L=/tmp/grids-logs
mkdir -p "$R" "$L"
export NCCL_NVLS_ENABLE=0 TPINFER_SHARED=${TPINFER_SHARED:-$root/.gpu-shared} GPU_HF_BF16=0
case $GPUS in
2) grids=("2 1 1" "1 2 1" "1 1 2"); S=${BENCH_SHAPES:-llama-3-8b:4096:32:32:8:14336:128256} ;;
4) grids=("4 1 1" "2 2 1" "2 1 2"); S=${BENCH_SHAPES:-llama-3-8b:4096:32:32:8:14336:128256} ;;
8) grids=("8 1 1" "4 2 1"); S=${BENCH_SHAPES:-llama-3-70b:8192:80:64:8:28672:128256} ;;
*) echo "tests/gpu/grids.sh: GPUS is 2, 4 or 8, not $GPUS" >&2; exit 2 ;;
esac
: >"$R/results.md"
part run && {
    echo "## tests/gpu/run.sh"
    first=1
    for g in "${grids[@]}"; do
        read -r tp pp dp <<<"$g"
        if [ $first = 1 ]; then
            OUT=$L/run-$tp-$pp-$dp timeout 300 bash tests/gpu/run.sh "$tp" "$pp" "$dp" 2>&1 | grep -E '^\| ' | tail -20
        else
            OUT=$L/run-$tp-$pp-$dp GPU_OPS=0 GPU_SANITIZER=0 timeout 120 bash tests/gpu/run.sh "$tp" "$pp" "$dp" 2>&1 |
                grep -E '^\| ' | tail -16
        fi
        first=0
    done
} >>"$R/results.md"
lib=$root/.gpu-deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T=$root/build-gpu/tpinfer
read -r tp0 _ _ <<<"${grids[0]}"
part checks && {
    echo "## tests/gpu/custom_ar.sh ($GPUS ranks): the one-shot all-reduce against NCCL"
    timeout 150 bash tests/gpu/custom_ar.sh "$root/build-gpu" "$GPUS" 2>&1 | tail -8
    echo "## tests/gpu/rank_death.sh ($GPUS ranks): a rank killed, failing, stopped at startup, under NCCL"
    timeout 300 bash tests/gpu/rank_death.sh "$root/build-gpu" "$GPUS" 2>&1 | grep -E '^\| '
    echo "## tests/gpu/backend_agree.sh: a rank without a GPU (MPMD), tpinfer --check on one GPU"
    timeout 120 bash tests/gpu/backend_agree.sh "$root/build-gpu" 2>&1 | grep -E '^\| '
    echo "## tpinfer --check --tp $tp0 ($GPUS ranks)"
    timeout 90 mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np "$GPUS" "$T" --check --tp "$tp0" 2>&1 |
        tail -45
} >>"$R/results.md"
bench() { # bench NAME TP PP DP RUNS [env...]
    local name=$1 tp=$2 pp=$3 dp=$4 runs=$5
    shift 5
    env "$@" BENCH_COMMIT="$COMMIT" BENCH_TPINFER="$T" BENCH_RUNS="$runs" BENCH_RUNS_OTHER= BENCH_SWEEP= BENCH_HF=0 \
        BENCH_OPS=0 BENCH_SHAPES="$S" BENCH_BUDGET_S="${BENCH_BUDGET_S:-150}" OUT=$L/bench-$name \
        timeout "${BENCH_TIMEOUT:-170}" bash bench/gpu_decode.sh "$tp" "$pp" "$dp" >"$L/bench-$name.log" 2>&1
    echo "### $name"
    grep -E '^\| llama' "$L/bench-$name/bench-results.md" 2>/dev/null || tail -3 "$L/bench-$name.log"
}
part bench && {
    echo "## bench ($S, bf16)"
    first=1
    for g in "${grids[@]}"; do
        read -r tp pp dp <<<"$g"
        runs="b1 b128"
        [ "$tp" -eq 1 ] && [ "$pp" -eq 1 ] && runs="b128"
        bench "tp$tp-pp$pp-dp$dp" "$tp" "$pp" "$dp" "$runs"
        if [ $first = 1 ]; then
            bench "tp$tp-pp$pp-dp$dp-no-allreduce" "$tp" "$pp" "$dp" "$runs" TPINFER_BENCH_SKIP=allreduce
            first=0
        fi
    done
} >>"$R/results.md"
tar -czf "$R/logs.tar.gz" -C /tmp grids-logs 2>/dev/null
cat "$R/results.md"
