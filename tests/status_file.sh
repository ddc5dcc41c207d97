#!/bin/sh
# The status file is a view of the run, never a reason to lose it: when its directory goes
# away in the middle of a run, every status update and the final state fail to be written,
# and the run still finishes every request with exit 0, warning once that the status is not
# being updated and once that its final state was not written. A status file that cannot be
# made, or would replace the results, the input, the manifest or the errors file, is an
# error before anything is written, naming the option and why; a run that fails before
# its requests are counted leaves the status "failed", not "validating".
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
for i in $(seq 1 24); do echo "{\"id\": \"r$i\", \"prompt\": \"Once upon a time there was a boy number $i\"}"; done \
    >"$TMP/p.jsonl"
mkdir "$TMP/st"
"$TPINFER" --model "$m" --backend cpu --input "$TMP/p.jsonl" --max-tokens 300 --ignore-eos --max-num-seqs 4 \
    --progress-interval 0.2 --status-file "$TMP/st/status.json" --output "$TMP/out.jsonl" >"$TMP/log" 2>&1 &
job=$!
for _ in $(seq 1 1200); do # "in_progress" once the requests are counted, before the first step
    grep -q '"status": "in_progress"' "$TMP/st/status.json" 2>/dev/null && break
    sleep 0.05
done
grep -q '"status": "in_progress"' "$TMP/st/status.json" ||
    { kill $job; cat "$TMP/log"; fail "no in_progress status within 60 s"; }
# stopped while the directory goes (no status write half-way through the rm), still running
kill -STOP $job
kill -0 $job 2>/dev/null && ! grep -q "summary (" "$TMP/log" ||
    { kill -CONT $job; cat "$TMP/log"; fail "the run ended before its status directory was removed"; }
rm -rf "$TMP/st"
kill -CONT $job
rc=0
wait $job || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/log"; fail "exit $rc with the status file's directory gone (wanted 0)"; }
grep -q "the status file's final state was not written" "$TMP/log" ||
    { cat "$TMP/log"; fail "no warning that the final status was not written"; }
[ "$(grep -c 'the status file is not being updated' "$TMP/log")" -le 1 ] ||
    { cat "$TMP/log"; fail "the update failure was warned more than once"; }
[ "$(grep -c '"id":"r' "$TMP/out.jsonl")" -eq 24 ] || fail "not every request in the output"
[ "$(grep -o '"id":"r[0-9]*"' "$TMP/out.jsonl" | sort -u | wc -l)" -eq 24 ] || fail "an id twice in the output"
grep -q "summary (completed)" "$TMP/log" || { cat "$TMP/log"; fail "the run did not complete"; }
[ ! -e "$TMP/st" ] || fail "the status file's directory came back"
echo "the status directory removed mid-run: exit 0, 24 of 24 requests, both warnings"

# a status file in a directory that does not exist: an error before any request runs, naming
# the option and saying why
rc=0
"$TPINFER" --model "$m" --backend cpu --input "$TMP/p.jsonl" --max-tokens 2 --status-file "$TMP/none/status.json" \
    --output "$TMP/out2.jsonl" >"$TMP/log2" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$TMP/log2"; fail "exit $rc with --status-file in a missing directory (wanted 1)"; }
grep -q -- "--status-file $TMP/none/status.json: the directory $TMP/none does not exist; create it first" \
    "$TMP/log2" || { cat "$TMP/log2"; fail "the message does not name --status-file and the missing directory"; }
[ ! -e "$TMP/out2.jsonl" ] || fail "the output was created although the status file cannot be"

# a status file that would replace the results, the input, the manifest or the errors file;
# results on standard output; a link to a missing directory; a FIFO nobody reads: each an
# error before the output is touched (an earlier output given --overwrite keeps its lines)
cp "$TMP/out.jsonl" "$TMP/prev.jsonl"
cp "$TMP/p.jsonl" "$TMP/in.jsonl"
ln -s "$TMP/none/s.json" "$TMP/dangling"
mkfifo "$TMP/fifo"
base="--model $m --backend cpu --input $TMP/in.jsonl --max-tokens 2"
n=0
while IFS='|' read -r name args want; do
    n=$((n + 1))
    rc=0
    # shellcheck disable=SC2086
    "$TPINFER" $base $args >"$TMP/o.txt" 2>"$TMP/e.txt" || rc=$?
    [ $rc -ne 0 ] || { cat "$TMP/e.txt"; fail "$name: exit 0"; }
    grep -q -- "$want" "$TMP/e.txt" || { cat "$TMP/e.txt"; fail "$name: no \"$want\""; }
    [ "$(grep -c '"id":"r' "$TMP/prev.jsonl")" -eq 24 ] || fail "$name: the earlier output lost lines"
    cmp -s "$TMP/in.jsonl" "$TMP/p.jsonl" || fail "$name: the input changed"
done <<EOF2
the output|--output $TMP/prev.jsonl --overwrite --status-file $TMP/prev.jsonl|is the output ($TMP/prev.jsonl): writing it would replace that
the input|--output $TMP/prev.jsonl --overwrite --status-file $TMP/in.jsonl|is the input file ($TMP/in.jsonl)
the manifest|--output $TMP/prev.jsonl --overwrite --status-file $TMP/prev.jsonl.manifest.json|is the output's manifest
the errors file|--output $TMP/prev.jsonl --overwrite --errors $TMP/err.jsonl --status-file $TMP/err.jsonl|is the errors file
results on stdout|--status-file /dev/stdout|is standard output, where the results go without --output
a dangling link|--output $TMP/prev.jsonl --overwrite --status-file $TMP/dangling|a link to $TMP/none/s.json: the directory $TMP/none does not exist
a FIFO nobody reads|--output $TMP/prev.jsonl --overwrite --status-file $TMP/fifo|(a FIFO no process has open for reading)
EOF2
[ $n -eq 7 ] || fail "$n of the 7 bad status files were tried"
echo "7 bad status files refused before the output was touched"

# a run that ends before its requests are counted (a --resume of an output with no manifest):
# the status file, "validating" until then, says "failed"
rc=0
"$TPINFER" $base --output "$TMP/prev.jsonl" --resume --status-file "$TMP/early.json" >/dev/null 2>"$TMP/e.txt" || rc=$?
[ $rc -ne 0 ] && grep -q "has no manifest" "$TMP/e.txt" || { cat "$TMP/e.txt"; fail "a --resume without a manifest"; }
grep -q '"status": "failed"' "$TMP/early.json" || { cat "$TMP/early.json"; fail "the early failure's status file"; }
grep -q '"failed_at": [0-9]' "$TMP/early.json" || { cat "$TMP/early.json"; fail "no failed_at"; }
exit 0
