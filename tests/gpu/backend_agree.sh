#!/bin/bash
# tests/gpu/backend_agree.sh BUILD_DIR: ranks that cannot all run one backend end the job at
# once, with the reason, instead of leaving a tp group in NCCL's bootstrap for good; one GPU is
# enough (rank 0 takes it, rank 1 is shown none through CUDA_VISIBLE_DEVICES=, an MPMD launch):
#   1. --backend cuda on both: rank 1 cannot make its backend: exit 1 within 30 s, "rank 1 sees no GPU";
#   2. --backend auto on both: rank 1 falls back to the CPU: exit 1 within 30 s, "1 of the 2 have a GPU";
#   3. tpinfer --check on this machine's GPU: exit 0 with the GPU and the all-reduce sweep's header.
# The CPU versions run in CI (tests/rank_failure.sh). Run from the repository root; the shared
# models in ./.gpu-shared, ./shared or ../shared (TPINFER_SHARED). Prints a result table last.
set -u
B=${1:?usage: tests/gpu/backend_agree.sh BUILD_DIR}
. "$(dirname "$0")/jobs.sh"
echo "Hello" >"$W/hello.txt"
m=$SHARED/models/stories260K-hf

for backend in cuda auto; do
    want=$([ "$backend" = cuda ] && echo "rank 1 sees no GPU" || echo "1 of the 2 have a GPU")
    args=(--model "$m" --backend "$backend" --tp 2 --input "$W/hello.txt" --output "$W/$backend.jsonl")
    t0=$(date +%s)
    rc=0
    timeout 60 mpirun --allow-run-as-root "${pass[@]}" -np 1 "$T" "${args[@]}" : \
        -np 1 env CUDA_VISIBLE_DEVICES= "$T" "${args[@]}" >"$W/$backend.log" 2>&1 || rc=$?
    dt=$(( $(date +%s) - t0 ))
    said=$(grep -c "$want" "$W/$backend.log" || true)
    detail="exit $rc after $dt s; \"$want\" said $said time(s)"
    if [ "$rc" -eq 1 ] && [ "$dt" -le 30 ] && [ "$said" -ge 1 ]; then
        record "--backend $backend, rank 1 without a GPU" PASS "$detail"
    else
        record "--backend $backend, rank 1 without a GPU" FAIL "$detail: $(grep -m2 -i error "$W/$backend.log" | tr '\n' ' ')"
    fi
done
pkill -9 -f "^$T " 2>/dev/null # leftovers of these jobs alone

rc=0
timeout 120 "$T" --check >"$W/check.log" 2>&1 || rc=$?
gpu=$(grep -c "H200\|GPU" "$W/check.log" || true)
sweep=$(grep -ci "all-reduce\|all_reduce" "$W/check.log" || true)
detail="exit $rc; lines naming the GPU: $gpu, the all-reduce: $sweep"
if [ "$rc" -eq 0 ] && [ "$gpu" -ge 1 ] && [ "$sweep" -ge 1 ]; then
    record "tpinfer --check, one GPU" PASS "$detail"
else
    record "tpinfer --check, one GPU" FAIL "$detail: $(tail -3 "$W/check.log" | tr '\n' ' ')"
fi
sed 's/^/    /' "$W/check.log" | head -40

print_table
