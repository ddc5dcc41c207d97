#!/bin/sh
# A rank stopped (SIGSTOP) in the middle of generation: its peers wait in a collective, and
# --step-timeout ends the job non-zero within seconds of the timeout, saying why, with no
# rank left; the requests finished before it are in the output and --resume completes the
# rest, each id once. With two replicas of one rank each, rank 0 ends the job when the other
# replica goes silent. A rank that stops as its group begins the warm-up (whose steps are
# collectives of the group) ends the job the same way, naming the phase. A job stopped as a whole (Ctrl-Z, a scheduler's suspend) for longer than
# the timeout is no hang: continued, it finishes.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
for i in $(seq 1 32); do echo "{\"id\": \"r$i\", \"prompt\": \"Once upon a time there was a girl number $i\"}"; done \
    >"$TMP/p.jsonl"
# stop_second_rank ARGS OUT LOG: two ranks of tpinfer ARGS --output OUT in the background, the
# second stopped (SIGSTOP) once OUT has a line; sets job, victim and stopped_at
stop_second_rank() {
    mpi 2 "$TPINFER" $1 --output "$2" >"$3" 2>&1 &
    job=$!
    victim=""
    for _ in $(seq 1 100); do
        pids=$(pgrep -f "^$TPINFER $1") # the ranks (mpirun's command line starts otherwise)
        [ "$(echo "$pids" | wc -w)" -eq 2 ] && { victim=$(echo "$pids" | sed -n 2p); break; }
        sleep 0.1
    done
    [ -n "$victim" ] || { kill $job; fail "the ranks did not start"; }
    for _ in $(seq 1 600); do
        [ -s "$2" ] && break
        sleep 0.1
    done
    [ -s "$2" ] || { kill $job; fail "no request finished within 60 s"; }
    kill -STOP "$victim"
    stopped_at=$(date +%s)
}
# job_ended ARGS: the job's end (rc, elapsed since the stop); the victim continued, no rank of
# ARGS may be left
job_ended() {
    rc=0
    wait $job || rc=$?
    elapsed=$(( $(date +%s) - stopped_at ))
    kill -CONT "$victim" 2>/dev/null
    sleep 0.5
    left=$(pgrep -f "^$TPINFER $1" || true)
    [ -z "$left" ] || { kill -9 $left; fail "ranks still running after the job ended: $left"; }
}

# stopped once some requests are done (4 at a time, so later ones are still to run)
args="--model $m --backend cpu --tp 2 --input $TMP/p.jsonl --max-tokens 300 --ignore-eos --max-num-seqs 4"
stop_second_rank "$args --step-timeout 3" "$TMP/out.jsonl" "$TMP/log"
job_ended "$args"
[ $rc -ne 0 ] || fail "mpirun exited 0 with a rank stopped"
[ $elapsed -le 20 ] || fail "the job took ${elapsed}s to end after the rank stopped (--step-timeout 3)"
grep -q "no step has finished for [0-9]* s (--step-timeout 3): a rank of the job is stopped" "$TMP/log" ||
    { cat "$TMP/log"; fail "no message saying why the job ended"; }
done_before=$(grep -c '"id":"r' "$TMP/out.jsonl")
[ "$done_before" -ge 1 ] && [ "$done_before" -lt 32 ] ||
    fail "$done_before requests were done when the rank stopped (wanted some, not all)"
mpi 2 "$TPINFER" $args --step-timeout 10 --output "$TMP/out.jsonl" --resume >"$TMP/log2" 2>&1 ||
    { cat "$TMP/log2"; fail "--resume after the timeout"; }
[ "$(grep -c '"id":"r' "$TMP/out.jsonl")" -eq 32 ] || fail "not every request once after --resume"
[ "$(grep -o '"id":"r[0-9]*"' "$TMP/out.jsonl" | sort -u | wc -l)" -eq 32 ] || fail "an id twice after --resume"
grep -q '"finish_reason":"length"' "$TMP/out.jsonl" || fail "no completion in the output"
echo "stopped rank pid $victim after $done_before requests; the job ended (exit $rc) after ${elapsed}s"

# two data-parallel replicas of one rank each (tp 1): rank 1 stopped has no peer in its
# replica to notice; rank 0 finishes its own share, then waits for rank 1's results, and ends
# the job when rank 1 has sent nothing (results or beats) for twice --step-timeout
dpargs="--model $m --backend cpu --input $TMP/p.jsonl --max-tokens 300 --ignore-eos --max-num-seqs 4 --step-timeout 3"
stop_second_rank "$dpargs" "$TMP/dp.jsonl" "$TMP/log7"
job_ended "$dpargs"
[ $rc -ne 0 ] || { cat "$TMP/log7"; fail "mpirun exited 0 with a replica stopped"; }
[ $elapsed -le 40 ] || fail "the job took ${elapsed}s to end after a replica stopped (--step-timeout 3)"
grep -q "rank 0: rank 1, which sends its replica's results, has sent nothing for [0-9]* s (twice --step-timeout 3)" \
    "$TMP/log7" || { cat "$TMP/log7"; fail "no message naming the silent replica"; }
mpi 2 "$TPINFER" $dpargs --output "$TMP/dp.jsonl" --resume >"$TMP/log8" 2>&1 ||
    { cat "$TMP/log8"; fail "--resume after the silent replica"; }
[ "$(grep -o '"id":"r[0-9]*"' "$TMP/dp.jsonl" | sort -u | wc -l)" -eq 32 ] &&
    [ "$(grep -c '"id":"r' "$TMP/dp.jsonl")" -eq 32 ] || fail "not every request once after --resume (dp 2)"
echo "a stopped replica (dp 2): the job ended (exit $rc) after ${elapsed}s; --resume finished the rest"
# ... but the whole job suspended while rank 0 waits for the other replica is no silence: rank
# 0's short requests done, both ranks stopped for 3 s (twice --step-timeout 1 is 2), continued:
# the run finishes
for i in $(seq 1 20); do
    echo "{\"id\": \"s$i\", \"prompt\": \"Once upon a time\", \"max_tokens\": 1}"
    echo "{\"id\": \"l$i\", \"prompt\": \"Once upon a time\", \"max_tokens\": 300, \"ignore_eos\": true}"
done >"$TMP/uneven.jsonl"
susargs="--model $m --backend cpu --input $TMP/uneven.jsonl --max-num-seqs 1 --step-timeout 1"
mpi 2 "$TPINFER" $susargs --output "$TMP/sus.jsonl" >"$TMP/log10" 2>&1 &
job=$!
for _ in $(seq 1 600); do
    [ "$(grep -c '"id":"s' "$TMP/sus.jsonl" 2>/dev/null)" = 20 ] && break
    sleep 0.1
done
pids=$(pgrep -f "^$TPINFER $susargs")
[ "$(echo "$pids" | wc -w)" -eq 2 ] || { kill $job; fail "the suspended dp job's ranks: '$pids'"; }
kill -STOP $pids
sleep 3
kill -CONT $pids
wait $job || { cat "$TMP/log10"; fail "a dp job suspended as a whole while rank 0 waited was ended"; }
[ "$(grep -c '"id":"' "$TMP/sus.jsonl")" -eq 40 ] || fail "the suspended dp job did not finish every request"

# rank 1 stops itself as the warm-up begins (TPINFER_TEST_STOP_AT), rank 0 waits in its first
# all-reduce: its watchdog ends the job
start=$(date +%s)
rc=0
TPINFER_WARMUP=1 TPINFER_TEST_STOP_AT=warm-up:1 mpi 2 "$TPINFER" $args --step-timeout 3 \
    --output "$TMP/warm.jsonl" >"$TMP/log4" 2>&1 || rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || { cat "$TMP/log4"; fail "mpirun exited 0 with a rank stopped in the warm-up"; }
[ $elapsed -le 30 ] || fail "the job took ${elapsed}s to end with a rank stopped in the warm-up (--step-timeout 3)"
grep -q "rank 0: the warm-up has made no progress for [0-9]* s (--step-timeout 3): a rank of its group is stopped" \
    "$TMP/log4" || { cat "$TMP/log4"; fail "no message saying which phase did not finish"; }
sleep 0.5
left=$(pgrep -f "^$TPINFER $args" || true)
[ -z "$left" ] || { kill -9 $left; fail "ranks still running after the warm-up's timeout: $left"; }
echo "a rank stopped in the warm-up: the job ended (exit $rc) after ${elapsed}s"

# the whole (one-rank) job stopped for 5 s with --step-timeout 2, then continued: it finishes
"$TPINFER" --model "$m" --backend cpu --input "$TMP/p.jsonl" --max-tokens 300 --ignore-eos --max-num-seqs 4 \
    --step-timeout 2 --output "$TMP/whole.jsonl" >"$TMP/log3" 2>&1 &
job=$!
for _ in $(seq 1 600); do
    [ -s "$TMP/whole.jsonl" ] && break
    sleep 0.1
done
kill -STOP $job
sleep 5
kill -CONT $job
wait $job || { cat "$TMP/log3"; fail "a job suspended as a whole was ended by its watchdog"; }
[ "$(grep -c '"id":"r' "$TMP/whole.jsonl")" -eq 32 ] || fail "the suspended job did not finish every request"
# the deadline is per warm-up step: a warm-up of 4 steps of 1 s each (TPINFER_TEST_WARMUP_STEP_S;
# small steps, which stay well under the limit even under the sanitizers) under --step-timeout 3
# goes on and the run finishes; one step of 3.6 s is ended, naming the phase
one="--model $m --backend cpu --input $TMP/p.jsonl --max-tokens 4 --max-num-seqs 4 --max-num-batched-tokens 64 --step-timeout 3"
TPINFER_WARMUP=1 TPINFER_PAD_DECODE=1 TPINFER_TEST_WARMUP_STEP_S=1 "$TPINFER" $one --output "$TMP/slow_warm.jsonl" \
    >"$TMP/log5" 2>&1 || { cat "$TMP/log5"; fail "a warm-up of short steps, longer than --step-timeout, was ended"; }
ms=$(sed -n 's/.*warm-up before the first step: \([0-9]*\) ms.*/\1/p' "$TMP/log5")
[ -n "$ms" ] && [ "$ms" -gt 3500 ] || { cat "$TMP/log5"; fail "the slowed warm-up took ${ms:-?} ms, not over --step-timeout"; }
[ "$(grep -c '"id":"r' "$TMP/slow_warm.jsonl")" -eq 32 ] || fail "the run after a long warm-up did not finish every request"
rc=0
TPINFER_WARMUP=1 TPINFER_PAD_DECODE=1 TPINFER_TEST_WARMUP_STEP_S=3.6 "$TPINFER" $one --output "$TMP/stuck_warm.jsonl" \
    >"$TMP/log6" 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat "$TMP/log6"; fail "a warm-up step longer than --step-timeout was not ended"; }
grep -q "rank 0: the warm-up has made no progress for [0-9]* s (--step-timeout 3)" "$TMP/log6" ||
    { cat "$TMP/log6"; fail "no message naming the warm-up"; }
echo "a warm-up of $ms ms in short steps went on under --step-timeout 3; a 3.6 s step was ended (exit $rc)"
# at pp 2 the second stage waits for the first stage's prefill-sized warm-up step alone (its
# output is sent on at once), not for the first stage's whole warm-up: two steps of 1.7 s
# each, 3.4 s in all, under --step-timeout 3
TPINFER_WARMUP=1 TPINFER_TEST_WARMUP_STEP_S=1.7 mpi 2 "$TPINFER" $one --pp 2 --max-num-seqs 2 \
    --output "$TMP/pp_warm.jsonl" >"$TMP/log9" 2>&1 || { cat "$TMP/log9"; fail "pp 2: a warm-up of short steps was ended"; }
[ "$(grep -c '"id":"r' "$TMP/pp_warm.jsonl")" -eq 32 ] || fail "pp 2: the run after a long warm-up did not finish every request"
exit 0
