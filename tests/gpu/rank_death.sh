#!/bin/bash
# tests/gpu/rank_death.sh BUILD_DIR [NP]: a job's end when one rank goes, on GPUs under NCCL
# (the CPU backend's versions, tests/rank_death.sh and tests/rank_failure.sh, run in CI):
#   1. a rank killed (SIGKILL) in the middle of a tp=NP generation: mpirun exits non-zero
#      within 15 s, no tpinfer process is left 15 s after the kill, and every line of the
#      output is a whole JSON record (what finished before the kill is kept, nothing half-written);
#   2. a failure on the pipeline's last stage only (a weight of the wrong shape that only
#      it loads), at tp=NP/2 x pp=2 with the NCCL communicators up: every rank ends within
#      30 s, non-zero, and the failing ranks name the tensor;
#   3. a rank that stops (SIGSTOP, TPINFER_TEST_STOP_AT) as its tp group makes the NCCL
#      communicators, and 4. as the warm-up begins: with --step-timeout 5 the job ends within
#      30 s, non-zero, rank 0 naming the phase, no rank left 15 s after mpirun's exit.
# Run from the repository root on a machine with NP GPUs (default 2); the shared models
# in ./.gpu-shared, ./shared or ../shared (TPINFER_SHARED). Prints a result table last.
set -u
B=${1:?usage: tests/gpu/rank_death.sh BUILD_DIR [NP]}
NP=${2:-2}
. "$(dirname "$0")/jobs.sh"

# ---- 1. a rank killed mid-generation
m=$SHARED/models/stories260K-hf
for i in $(seq 1 2048); do echo "Once upon a time there was a girl number $i"; done >"$W/p.txt"
args=(--model "$m" --backend cuda --tp "$NP" --input "$W/p.txt" --max-tokens 400 --ignore-eos --output "$W/out.jsonl")
mpirun --allow-run-as-root "${pass[@]}" -np "$NP" "$T" "${args[@]}" >"$W/kill.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 300); do # until the first completions are written (the ranks generate)
    if [ -s "$W/out.jsonl" ]; then
        victim=$(pgrep -x tpinfer | tail -1) # a rank (mpirun is not named tpinfer)
        break
    fi
    sleep 0.1
done
if [ -z "$victim" ]; then
    kill "$job" 2>/dev/null
    wait "$job" 2>/dev/null
    pkill -9 -x tpinfer 2>/dev/null
    record "rank killed mid-generation, tp=$NP" FAIL "no completion within 30 s: $(tail -2 "$W/kill.log" | tr '\n' ' ')"
else
    kill -9 "$victim"
    t0=$(date +%s%N)
    rc=0
    wait "$job" || rc=$?
    dt=$(( ($(date +%s%N) - t0) / 1000000000 ))
    # the other rank may still be releasing its GPU (a context of ~140 GB): give it until 15 s
    # after the kill to be gone
    left=$(pgrep -x tpinfer | tr '\n' ' ' || true)
    while [ -n "$left" ] && [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 15 ]; do
        sleep 0.2
        left=$(pgrep -x tpinfer | tr '\n' ' ' || true)
    done
    gone=$(( ($(date +%s%N) - t0) / 1000000 ))
    lines=$(grep -c . "$W/out.jsonl" || true)
    whole=$(python3 -c 'import json,sys
n=0
for l in open(sys.argv[1]):
    json.loads(l); n+=1
print(n)' "$W/out.jsonl" 2>/dev/null || echo broken)
    detail="mpirun exited $rc after $dt s, every rank gone after $gone ms; $lines of 2048 records kept, $whole whole; left running: ${left:-none}"
    [ -n "$left" ] && ps -o pid,stat,etime,wchan:24,cmd -p "$(echo $left | tr ' ' ,)" >>"$W/kill.log" 2>&1 && tail -4 "$W/kill.log"
    if [ "$rc" -ne 0 ] && [ "$dt" -le 15 ] && [ -z "$left" ] && [ "$whole" = "$lines" ]; then
        record "rank killed mid-generation, tp=$NP" PASS "$detail"
    else
        record "rank killed mid-generation, tp=$NP" FAIL "$detail"
    fi
fi

# ---- 2. a failure on the last pipeline stage only
if [ $((NP % 2)) -eq 0 ]; then
    python3 "$root/tests/gen_tiny_model.py" "$W/m" >/dev/null 2>&1 &&
    python3 "$root/tests/swap_tensor_shape.py" "$W/m/model.safetensors" model.layers.3.mlp.down_proj.weight
    echo "Hello" >"$W/one.txt"
    t0=$(date +%s)
    rc=0
    timeout 120 mpirun --allow-run-as-root "${pass[@]}" -np "$NP" "$T" --model "$W/m" --backend cuda \
        --tp $((NP / 2)) --pp 2 --input "$W/one.txt" --output "$W/fail.jsonl" >"$W/fail.log" 2>&1 || rc=$?
    dt=$(( $(date +%s) - t0 ))
    named=$(grep -c "model.layers.3.mlp.down_proj.weight" "$W/fail.log" || true)
    detail="exit $rc after ${dt} s; $named line(s) name the tensor"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$dt" -le 30 ] && [ "$named" -ge 1 ]; then
        record "failure on pp stage 1 only, tp=$((NP / 2)) pp=2" PASS "$detail"
    else
        record "failure on pp stage 1 only, tp=$((NP / 2)) pp=2" FAIL "$detail: $(grep -m2 -i error "$W/fail.log" | tr '\n' ' ')"
    fi
fi

# ---- 3, 4. a rank stopped in a startup phase that waits for the whole group
echo "Hello" >"$W/hello.txt"
for phase in comms warm-up; do
    what=$([ "$phase" = comms ] && echo "making the NCCL communicators" || echo "the warm-up")
    t0=$(date +%s)
    rc=0
    TPINFER_TEST_STOP_AT=$phase:1 TPINFER_WARMUP=1 timeout 120 mpirun --allow-run-as-root "${pass[@]}" \
        -x TPINFER_TEST_STOP_AT -x TPINFER_WARMUP -np "$NP" "$T" --model "$SHARED/models/stories260K-hf" \
        --backend cuda --tp "$NP" --input "$W/hello.txt" --output "$W/stop-$phase.jsonl" --step-timeout 5 \
        >"$W/stop-$phase.log" 2>&1 || rc=$?
    dt=$(( $(date +%s) - t0 ))
    # as in case 1: a rank may still be releasing its GPU (the KV cache is allocated before
    # the warm-up) a while after mpirun's exit
    t1=$(date +%s)
    left=$(pgrep -x tpinfer | tr '\n' ' ' || true)
    while [ -n "$left" ] && [ $(( $(date +%s) - t1 )) -lt 15 ]; do
        sleep 0.2
        left=$(pgrep -x tpinfer | tr '\n' ' ' || true)
    done
    if [ -n "$left" ]; then
        ps -o pid,stat,etime,wchan:24,cmd -p "$(echo $left | tr ' ' ,)" >>"$W/stop-$phase.log" 2>&1
        kill -9 $left 2>/dev/null
    fi
    said=$(grep -c "rank 0: $what has made no progress for [0-9]* s (--step-timeout 5)" "$W/stop-$phase.log" || true)
    detail="exit $rc after ${dt} s; rank 0 named the phase: $said; left running: ${left:-none}"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$dt" -le 30 ] && [ "$said" -ge 1 ] && [ -z "$left" ]; then
        record "a rank stopped in $what, tp=$NP" PASS "$detail"
    else
        record "a rank stopped in $what, tp=$NP" FAIL "$detail: $(grep -m2 -i error "$W/stop-$phase.log" | tr '\n' ' ')"
    fi
done

print_table
