#!/bin/sh
# Never lose work: 20 runs (mpirun -np 4, tp 2 x pp 2 and dp 2 x tp 2) each lose a random
# rank to kill -9 at a random moment, then --resume finishes them: each of the 24 input ids ends up
# in the output exactly once, with lines identical to an uninterrupted run (half of them
# greedy, half sampled with their own seeds).
# SIGUSR1 to mpirun (Slurm's warning) and SIGTERM to the ranks exit 3 within 10 s, and
# --resume completes those runs too, as it does after a SIGTERM during the startup (the input
# being prepared, the weights loading); resuming a finished run is a no-op that exits 0.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "$PYTHON3" != no ] || skip "python3 not found"
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
"$PYTHON3" - "$TMP/in.jsonl" "$TMP/long.jsonl" <<'PY'
import json, random, sys
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(24):
        r = {"id": "req-%02d" % i, "prompt": "Once upon a time, child %d" % i,
             "max_tokens": rng.randint(80, 300), "ignore_eos": True}
        if i % 2:  # sampled: the stream depends on (seed, id, step) only, so a resume redraws the same
            r.update(temperature=0.9, top_p=0.95, seed=1000 + i)
        f.write(json.dumps(r) + "\n")
with open(sys.argv[2], "w") as f:  # long enough to be signalled in the middle (2 s on an idle machine)
    for i in range(48):
        f.write(json.dumps({"id": "long-%02d" % i, "prompt": "Once upon a time, child %d" % i,
                            "max_tokens": 400, "ignore_eos": True}) + "\n")
PY
run() { # run OUT GRID... : one mpirun of 4 ranks
    out=$1; shift
    mpi 4 "$TPINFER" --model "$m" --backend cpu --input "${INPUT:-$TMP/in.jsonl}" --output "$out" --max-num-seqs 2 "$@"
}
run "$TMP/ref.jsonl" --tp 2 --pp 2 2>"$TMP/ref.err" || { cat "$TMP/ref.err"; fail "the uninterrupted run"; }
sort "$TMP/ref.jsonl" >"$TMP/ref.sorted"
[ "$(wc -l <"$TMP/ref.sorted")" -eq 24 ] || fail "the uninterrupted run wrote $(wc -l <"$TMP/ref.sorted") lines"

check_complete() { # check_complete OUT WHAT
    sort "$1" >"$TMP/got.sorted"
    "$PYTHON3" -c 'import json,sys; ids=[json.loads(l)["id"] for l in open(sys.argv[1])]; assert len(ids)==len(set(ids))==24, (len(ids), len(set(ids)))' "$1" ||
        fail "$2: the output does not hold each of the 24 ids exactly once"
    cmp -s "$TMP/ref.sorted" "$TMP/got.sorted" || fail "$2: lines differ from the uninterrupted run"
}

ranks_of() { pgrep -f "^[^ ]*tpinfer --model $m --backend cpu --input ${INPUT:-$TMP/in.jsonl} --output $1" || true; }

trials=${TPINFER_RESUME_TRIALS:-20}
t=1
while [ $t -le "$trials" ]; do
    out="$TMP/out$t.jsonl"
    grid="--tp 2 --pp 2"
    [ $((t % 2)) -eq 0 ] && grid="--tp 2"
    run "$out" $grid >/dev/null 2>"$TMP/run.err" &
    job=$!
    # a random moment: once the output holds a random number of lines (0 to 23), so the
    # kill lands inside the run however fast the machine is
    want=$(awk -v s=$t 'BEGIN { srand(s); print int(24 * rand()) }')
    n=0
    while [ "$n" -lt 400 ]; do
        lines=$( [ -f "$out" ] && wc -l <"$out" || echo 0)
        [ "$lines" -ge "$want" ] && [ -n "$(ranks_of "$out")" ] && break
        sleep 0.05
        n=$((n + 1))
    done
    delay="$want lines"
    pids=$(ranks_of "$out")
    if [ -n "$pids" ]; then
        victim=$(echo "$pids" | awk -v s=$t 'BEGIN { srand(s * 7) } { p[NR] = $1 } END { print p[int(rand() * NR) + 1] }')
        kill -9 "$victim" 2>/dev/null || true
    fi
    wait $job || true
    # mpirun has returned; ranks it killed may take a moment to be gone (a loaded machine)
    k=0
    while [ -n "$(ranks_of "$out")" ] && [ $k -lt 40 ]; do sleep 0.05; k=$((k + 1)); done
    [ -z "$(ranks_of "$out")" ] || fail "trial $t: ranks left running 2 s after the job ended"
    before=$( [ -f "$out" ] && wc -l <"$out" || echo 0)
    run "$out" $grid --resume >/dev/null 2>"$TMP/resume.err" || { cat "$TMP/resume.err"; fail "trial $t: --resume failed"; }
    check_complete "$out" "trial $t (killed at $delay, $before lines kept)"
    echo "trial $t: killed a rank at $delay, $before lines kept; resumed to 24"
    t=$((t + 1))
done

# resuming a finished run does nothing and exits 0
cp "$TMP/ref.jsonl" "$TMP/done.jsonl"
cp "$TMP/ref.jsonl.manifest.json" "$TMP/done.jsonl.manifest.json"
run "$TMP/done.jsonl" --tp 2 --pp 2 --resume 2>"$TMP/noop.err" || { cat "$TMP/noop.err"; fail "resume of a finished run"; }
cmp -s "$TMP/ref.jsonl" "$TMP/done.jsonl" || fail "resume of a finished run changed the output"

# a mismatched manifest is refused (another input), unless --force
cp "$TMP/in.jsonl" "$TMP/in.orig"
echo '{"id": "extra", "prompt": "x"}' >>"$TMP/in.jsonl"
expect_fail 2 "--force" run "$TMP/done.jsonl" --tp 2 --pp 2 --resume
cp "$TMP/in.orig" "$TMP/in.jsonl"

# SIGUSR1 to mpirun (what a Slurm batch script forwards) and SIGTERM to the ranks, in the
# middle of a longer batch (a few seconds on an idle machine; minutes where 4 ranks share 2
# busy cores, hence the longer limit), once its first results are written (a fixed delay
# raced the end of the batch on a fast machine)
INPUT="$TMP/long.jsonl"
export MPI_TIMEOUT=600
run "$TMP/long-ref.jsonl" --tp 2 --pp 2 2>"$TMP/ref.err" || { cat "$TMP/ref.err"; fail "the long uninterrupted run"; }
sort "$TMP/long-ref.jsonl" >"$TMP/long-ref.sorted"
for how in usr1-mpirun term-ranks; do
    out="$TMP/$how.jsonl"
    run "$out" --tp 2 --pp 2 >/dev/null 2>"$TMP/sig.err" &
    job=$!
    k=0
    while [ ! -s "$out" ] && [ $k -lt 1200 ]; do sleep 0.05; k=$((k + 1)); done
    if [ $how = usr1-mpirun ]; then
        kill -USR1 $(pgrep -f "^[^ ]*mpirun --oversubscribe -np 4 .*--output $out") || fail "$how: no mpirun to signal (done already?)"
    else
        kill -TERM $(ranks_of "$out") || fail "$how: no ranks to signal (done already?)"
    fi
    start=$(date +%s)
    rc=0
    wait $job || rc=$?
    took=$(( $(date +%s) - start ))
    [ $rc -eq 3 ] || { cat "$TMP/sig.err"; fail "$how: exit status $rc, wanted 3"; }
    [ $took -le 10 ] || fail "$how: took ${took}s to exit"
    kept=$( [ -f "$out" ] && wc -l <"$out" || echo 0)
    run "$out" --tp 2 --pp 2 --resume >/dev/null 2>"$TMP/resume.err" || { cat "$TMP/resume.err"; fail "$how: --resume"; }
    sort "$out" | cmp -s "$TMP/long-ref.sorted" - || fail "$how: resumed output differs from the uninterrupted run"
    [ "$kept" -lt 48 ] || fail "$how: the batch was done before the signal"
    echo "$how: exit 3 after ${took}s with $kept lines kept; resumed to 48"
done

# a signal during the startup (TPINFER_TEST_TERM_AT: as the requests are prepared, or as the
# weights load) stops every rank at that phase's end, not after the load and warm-up: exit 3,
# the manifest says interrupted, and --resume runs everything
for at in input:0 load:3; do
    out="$TMP/startup-$at.jsonl"
    rc=0
    TPINFER_TEST_TERM_AT=$at run "$out" --tp 2 --pp 2 >/dev/null 2>"$TMP/term.err" || rc=$?
    [ $rc -eq 3 ] || { cat "$TMP/term.err"; fail "SIGTERM at $at: exit status $rc, wanted 3"; }
    grep -q '"status": "interrupted"' "$out.manifest.json" || fail "SIGTERM at $at: the manifest does not say interrupted"
    [ ! -s "$out" ] || fail "SIGTERM at $at: the run went on to generate ($(wc -l <"$out") lines)"
    run "$out" --tp 2 --pp 2 --resume >/dev/null 2>"$TMP/resume.err" || { cat "$TMP/resume.err"; fail "$at: --resume"; }
    sort "$out" | cmp -s "$TMP/long-ref.sorted" - || fail "$at: resumed output differs from the uninterrupted run"
    echo "SIGTERM at $at: exit 3 before the first step; resumed to 48"
done
exit 0
