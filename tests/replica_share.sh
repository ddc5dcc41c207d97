#!/bin/sh
# Data parallel: a replica keeps, tokenizes and runs only its share of the input (every
# dp-th request), and rank 0 reads every id; no rank holds the whole input. The output at
# dp 3 is dp 1's, error records included (each replica sends its own, in the input's
# dialect), in the input's order with --ordered; the exit status counts every replica's
# failed requests; --resume at dp 3 finishes a dp 1 run. No ../shared needed.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
export OMP_NUM_THREADS=1
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/m" || fail "gen"

# 29 requests (the blank lines are none): 4 that cannot run, in the shares of replicas 1, 1,
# 2 and 0 at dp 3 (pos 4, 7, 11 and 18: a line that is not JSON, messages for a model without
# a chat template, a prompt too long, a bad top_p), and one of token ids
long=$("$PYTHON3" -c 'print("word " * 300)')
i=0
while [ $i -lt 30 ]; do
    case $i in
    4) echo '{"id":"bad-json", "prompt": ' ;;
    7) echo '{"id":"chat","messages":[{"role":"user","content":"hi"}]}' ;;
    9) echo '{"id":"ids","prompt_token_ids":[72,101,108],"max_tokens":3,"ignore_eos":true}' ;;
    11) printf '{"id":"too-long","prompt":"%s"}\n' "$long" ;;
    18) echo '{"id":"top-p","prompt":"x","top_p":2}' ;;
    23) printf '\n  \n' ;;
    *) printf '{"id":"r%d","prompt":"Once upon a time %d","max_tokens":%d,"ignore_eos":true}\n' $i $i $((i % 5 + 1)) ;;
    esac
    i=$((i + 1))
done >"$TMP/in.jsonl"

run() { # run NAME NP INPUT [flags...]: exits 4 (some requests failed)
    name=$1 np=$2 input=$3
    shift 3
    rc=0
    TPINFER_LOG=debug mpi "$np" "$TPINFER" --model "$TMP/m" --backend cpu --input "$input" \
        --output "$TMP/$name.jsonl" --max-model-len 128 --ordered "$@" 2>"$TMP/$name.err" || rc=$?
    [ "$rc" -eq 4 ] || { cat "$TMP/$name.err"; fail "$name exited $rc, wanted 4 (failed requests)"; }
}
plain() { sed 's/"created":[0-9]*,//' "$1"; }

run dp1 1 "$TMP/in.jsonl"
run dp3 3 "$TMP/in.jsonl"
[ "$(wc -l <"$TMP/dp1.jsonl")" -eq 29 ] || fail "dp 1 wrote $(wc -l <"$TMP/dp1.jsonl") records, not 29"
plain "$TMP/dp1.jsonl" >"$TMP/dp1.plain"
plain "$TMP/dp3.jsonl" >"$TMP/dp3.plain"
cmp -s "$TMP/dp1.plain" "$TMP/dp3.plain" ||
    { diff "$TMP/dp1.plain" "$TMP/dp3.plain" | head; fail "dp 3 wrote other records than dp 1, or in another order"; }
for name in dp1 dp3; do
    grep -q "4 request(s) failed" "$TMP/$name.err" || { cat "$TMP/$name.err"; fail "$name: not 4 failed requests"; }
done
grep -q '"id":"line 5","line":5,"code":"invalid_json"' "$TMP/dp3.jsonl" || fail "replica 1's invalid line"
grep -q '"id":"too-long".*"code":"context_length_exceeded"' "$TMP/dp3.jsonl" || fail "replica 2's long prompt"
grep -q '"id":"top-p".*"code":"invalid_request"' "$TMP/dp3.jsonl" || fail "replica 0's bad top_p"
grep -q '"id":"chat".*"code":"invalid_request".*chat template' "$TMP/dp3.jsonl" || fail "replica 1's chat request"

# the ranks of a replica share its tokenizing: at tp 2, pp 2 and tp 2 x dp 2 each rank
# tokenizes part and sends the ids (or the errors) to the others; the records are dp 1's
for grid in "tp2 2 --tp 2" "pp2 2 --pp 2" "tp2dp2 4 --tp 2"; do
    set -- $grid
    name=$1 np=$2
    shift 2
    run "$name" "$np" "$TMP/in.jsonl" "$@"
    plain "$TMP/$name.jsonl" >"$TMP/$name.plain"
    cmp -s "$TMP/dp1.plain" "$TMP/$name.plain" ||
        { diff "$TMP/dp1.plain" "$TMP/$name.plain" | head; fail "$name wrote other records than dp 1"; }
done
# (26 prompts to tokenize: not the token ids, the bad JSON, the bad top_p; 13 a rank at tp 2)
for r in 0 1; do
    grep -q "rank $r (replica 0): 13 of the replica's 29 prompts tokenized here" "$TMP/tp2.err" ||
        { grep "tokenized here" "$TMP/tp2.err"; fail "tp 2: rank $r did not tokenize its half"; }
done

# each rank kept its replica's share only, and they add up to the input
kept=0
for r in 0 1 2; do
    k=$(sed -n "s/.*rank $r (replica $r): \([0-9]*\) of the input's 29 requests kept.*/\1/p" "$TMP/dp3.err")
    [ -n "$k" ] && [ "$k" -le 10 ] || { grep "requests kept" "$TMP/dp3.err"; fail "rank $r kept '$k' requests"; }
    kept=$((kept + k))
done
[ "$kept" -eq 29 ] || fail "the replicas kept $kept requests, not 29"

# the records of an OpenAI batch file's bad lines are OpenAI-shaped in every replica
{
    for i in 0 1 2 3; do
        if [ $i -eq 1 ]; then echo '{"custom_id":"b1","method":"POST","url":"/v1/completions","body":{'; continue; fi
        printf '{"custom_id":"b%d","method":"POST","url":"/v1/completions","body":{"prompt":"Once %d","max_tokens":2}}\n' $i $i
    done
} >"$TMP/batch.jsonl"
run oa1 1 "$TMP/batch.jsonl"
run oa2 2 "$TMP/batch.jsonl"
plain "$TMP/oa1.jsonl" >"$TMP/oa1.plain"
plain "$TMP/oa2.jsonl" >"$TMP/oa2.plain"
cmp -s "$TMP/oa1.plain" "$TMP/oa2.plain" || { diff "$TMP/oa1.plain" "$TMP/oa2.plain"; fail "OpenAI records differ at dp 2"; }
grep -q '"custom_id":"line 2".*"status_code":400' "$TMP/oa2.jsonl" || { cat "$TMP/oa2.jsonl"; fail "replica 1's bad line is not an OpenAI record"; }

# rank 0 gathers the replicas' ids: a duplicate across replicas stops the job before any
# output, naming both lines; a line whose id cannot be read is "line N", so it takes no
# other line's id (line 3's 2 here); and the fields no replica reads are summed over them
printf '{"id":"a","prompt":"x"}\n{"id":"b","prompt":"y"}\n{"id":"c","prompt":"z"}\n{"id":"b","prompt":"w"}\n' >"$TMP/dup.jsonl"
expect_fail 2 'dup.jsonl: id "b" is used on line 2 and again on line 4; ids must be unique' \
    mpi 3 "$TPINFER" --model "$TMP/m" --backend cpu --input "$TMP/dup.jsonl" --output "$TMP/dup.out"
[ ! -e "$TMP/dup.out" ] || fail "a refused input left an output"
printf '{"id":"a","prompt":"x","max_tokens":1}\nnot json\n{"id":"2","prompt":"z","max_tokens":1}\n' >"$TMP/standin.jsonl"
rc=0
mpi 2 "$TPINFER" --model "$TMP/m" --backend cpu --input "$TMP/standin.jsonl" --output "$TMP/standin.out" \
    2>"$TMP/standin.err" || rc=$?
[ $rc -eq 4 ] || { cat "$TMP/standin.err"; fail "a broken line beside an id of its number: exit $rc, wanted 4"; }
grep -q '"id":"line 2","line":2,"code":"invalid_json"' "$TMP/standin.out" && grep -q '"id":"2","text"' "$TMP/standin.out" &&
    grep -q '"id":"a","text"' "$TMP/standin.out" || { cat "$TMP/standin.out"; fail "standin: the records"; }
printf '{"id":"a","prompt":"x","max_tokens":1}\n{"id":"b","prompt":"y","max_token":1}\n{"id":"c","prompt":"z","max_tokens":1,"shade":1}\n{"id":"d","prompt":"w","max_tokens":1,"max_token":1,"colour":1}\n{"id":"e","prompt":"v","max_token":1,"max_tokens":1}\n' >"$TMP/fields.jsonl"
mpi 2 "$TPINFER" --model "$TMP/m" --backend cpu --input "$TMP/fields.jsonl" --output "$TMP/fields.out" 2>"$TMP/fields.err" ||
    { cat "$TMP/fields.err"; fail "unknown fields at dp 2"; }
# (in the file's order: rank 0 saw "shade" on line 3 and "max_token" first on line 5)
grep -q 'fields.jsonl: 4 line(s) hold fields tpinfer does not read, which it ignores: "max_token" (3 lines, first line 2), "shade" (line 3), "colour" (line 4)' "$TMP/fields.err" ||
    { cat "$TMP/fields.err"; fail "the unknown fields of both replicas"; }

# every rank must read the same file: per-node copies that differ stop the job at once (each
# rank here in its own directory, whose in.jsonl holds 3 or 4 requests), whichever rank differs
mkdir -p "$TMP/a" "$TMP/b"
head -n 3 "$TMP/fields.jsonl" >"$TMP/a/in.jsonl"
head -n 4 "$TMP/fields.jsonl" >"$TMP/b/in.jsonl"
args="--model $TMP/m --backend cpu --input in.jsonl --output $TMP/differ.jsonl"
differ() { # differ TP NP_AFTER: rank 0 reads a/, rank 1 b/, NP_AFTER more a/
    expect_fail 2 "rank 1 reads 4 requests in in.jsonl, rank 0 reads 3: the file differs between nodes" \
        mpi 1 -wdir "$TMP/a" "$TPINFER" $args --tp "$1" : -np 1 -wdir "$TMP/b" "$TPINFER" $args --tp "$1" \
        ${2:+: -np "$2" -wdir "$TMP/a" "$TPINFER" $args --tp "$1"}
}
differ 1 ""  # dp 2: rank 1 is its replica's first rank
differ 2 ""  # tp 2: rank 1 is rank 0's peer
differ 2 2   # tp 2 x dp 2
[ ! -e "$TMP/differ.jsonl" ] || fail "a file that differs between ranks left an output"

# --resume at dp 3 finishes what a dp 1 run left: the first 12 records kept
head -n 12 "$TMP/dp1.jsonl" >"$TMP/part.jsonl"
cp "$TMP/dp1.jsonl.manifest.json" "$TMP/part.jsonl.manifest.json" 2>/dev/null || true
run part 3 "$TMP/in.jsonl" --resume --output "$TMP/part.jsonl"
plain "$TMP/part.jsonl" | sort >"$TMP/part.sorted"
sort "$TMP/dp1.plain" >"$TMP/dp1.sorted"
cmp -s "$TMP/dp1.sorted" "$TMP/part.sorted" || { diff "$TMP/dp1.sorted" "$TMP/part.sorted" | head; fail "--resume at dp 3"; }
grep -q "17 to go" "$TMP/part.err" || { grep resum "$TMP/part.err"; fail "the resume did not skip 12 requests"; }
# ... and the replicas split what is to go, not the file: where an earlier dp 2 run finished
# all of replica 0's share (the even positions), both replicas of the resumed run have work
awk 'NR % 2 == 1' "$TMP/dp1.jsonl" >"$TMP/even.jsonl"
cp "$TMP/dp1.jsonl.manifest.json" "$TMP/even.jsonl.manifest.json" 2>/dev/null || true
run even 2 "$TMP/in.jsonl" --resume --output "$TMP/even.jsonl"
plain "$TMP/even.jsonl" | sort >"$TMP/even.sorted"
cmp -s "$TMP/dp1.sorted" "$TMP/even.sorted" || { diff "$TMP/dp1.sorted" "$TMP/even.sorted" | head; fail "--resume of the odd positions"; }
for r in 0 1; do
    grep -q "rank $r (replica $r): 7 of the input's requests to go kept" "$TMP/even.err" ||
        { grep "kept" "$TMP/even.err"; fail "resumed at dp 2, replica $r did not take half of the 14 to go"; }
done
# a file that grows between --resume's two reads (the share is read again once the done
# requests are known) stops the job with a message, and the engine frees what the second read
# kept (once it walked the first read's requests by the second's count, past their end)
cp "$TMP/in.jsonl" "$TMP/grow.jsonl"
head -n 12 "$TMP/dp1.jsonl" >"$TMP/grow-out.jsonl"
cp "$TMP/dp1.jsonl.manifest.json" "$TMP/grow-out.jsonl.manifest.json" # (--force: it names in.jsonl)
TPINFER_TEST_STOP_AT=reread:0 mpi 1 "$TPINFER" --model "$TMP/m" --backend cpu --input "$TMP/grow.jsonl" \
    --output "$TMP/grow-out.jsonl" --max-model-len 128 --resume --force 2>"$TMP/grow.err" &
job=$!
stopped=""
for _ in $(seq 1 600); do # the rank stops itself (SIGSTOP) before the second read
    stopped=$(ps -eo pid=,stat=,args= | awk '$2 ~ /^T/ && /grow-out\.jsonl/ && !/mpirun/ {print $1}')
    [ -n "$stopped" ] && break
    sleep 0.1
done
[ -n "$stopped" ] || { kill "$job" 2>/dev/null; cat "$TMP/grow.err"; fail "the rank never reached the second read"; }
# more new lines than the first read kept (29): the second read keeps the 17 to go and these
for i in $(seq 1 20); do echo "{\"id\":\"late-$i\",\"prompt\":\"written during the run\"}"; done >>"$TMP/grow.jsonl"
kill -CONT $stopped
rc=0
wait "$job" || rc=$?
[ "$rc" -ne 0 ] || fail "a file that grew between --resume's reads was accepted"
grep -q "grow.jsonl changed while tpinfer read it (29 requests, then 49)" "$TMP/grow.err" ||
    { cat "$TMP/grow.err"; fail "a file that grew between --resume's reads: no message"; }
exit 0
