#!/bin/sh
# A rank killed (SIGKILL) or crashing (SIGSEGV) in the middle of generation ends the job
# non-zero within 10 s, with no rank left running.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
for i in $(seq 1 64); do echo "Once upon a time there was a girl number $i"; done >"$TMP/p.txt"
for sig in KILL SEGV; do
    mpi 4 "$TPINFER" --model "$m" --backend cpu --tp 2 --pp 2 --input "$TMP/p.txt" --max-tokens 400 \
        --ignore-eos --output "$TMP/out-$sig.jsonl" >"$TMP/log" 2>&1 &
    job=$!
    # wait until the four ranks are generating, then signal one
    victim=""
    for _ in $(seq 1 100); do
        pids=$(pgrep -f "tpinfer --model $m --backend cpu --tp 2 --pp 2 --input $TMP/p.txt" | head -4)
        [ "$(echo "$pids" | wc -w)" -eq 4 ] && { victim=$(echo "$pids" | sed -n 3p); break; }
        sleep 0.1
    done
    [ -n "$victim" ] || { kill $job; fail "the ranks did not start"; }
    sleep 1.5
    kill -"$sig" "$victim"
    killed_at=$(date +%s)
    rc=0
    wait $job || rc=$?
    elapsed=$(( $(date +%s) - killed_at ))
    [ $rc -ne 0 ] || fail "mpirun exited 0 after a rank got SIG$sig"
    [ $elapsed -le 10 ] || fail "the job took ${elapsed}s to end after SIG$sig"
    sleep 0.5
    left=$(pgrep -f "tpinfer --model $m --backend cpu --tp 2 --pp 2 --input $TMP/p.txt" || true)
    [ -z "$left" ] || fail "ranks still running after the job ended (SIG$sig): $left"
    echo "SIG$sig to rank pid $victim; mpirun exited $rc after ${elapsed}s"
done
exit 0
