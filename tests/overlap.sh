#!/bin/sh
# Steps enqueued ahead (a replica of one rank whose requests are all plain greedy: the next
# step goes to the backend before the host reads this one's tokens, its tokens taken on the
# backend) give the completions each step waiting for the one before gives
# (TPINFER_OVERLAP=0): with sequences ending on a stop token, a stop string and by length
# while their next row is already enqueued, n = 2, admissions as others finish, chunked
# prefill, preemption, padded decode steps, sampled requests (the sample op, logprobs,
# min_tokens), rules that read the tokens not read yet (penalties, guided decoding, bad words:
# the step's forward enqueued ahead, its sample op once the step before is read), two
# data-parallel replicas and tp 2 (greedy, and sampled: every rank runs the sample op by the
# sampler's rules, and their choices are compared).
# OVERLAP_BACKEND=cuda runs it on GPUs (tests/gpu/overlap.sh: no data-parallel part, and the
# tp 2 part with OVERLAP_TP2=1 where two GPUs are).
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
backend=${OVERLAP_BACKEND:-cpu}
# 426 is "." in this tokenizer
cat >"$TMP/in.jsonl" <<'EOF'
{"id": "a", "prompt": "Once upon a time", "max_tokens": 90}
{"id": "b", "prompt": "Lily and Ben", "max_tokens": 1}
{"id": "c", "prompt": "The cat sat", "max_tokens": 2}
{"id": "d", "prompt": "One day, a little girl", "max_tokens": 60, "stop": ["."]}
{"id": "e", "prompt": "Tom had a red ball", "max_tokens": 40, "n": 2, "stop_token_ids": [426]}
{"id": "f", "prompt": "The sun", "max_tokens": 80, "ignore_eos": true}
{"id": "g", "prompt": "Sam was sad because", "max_tokens": 100, "stop_token_ids": [426]}
{"id": "h", "prompt": "A big dog", "max_tokens": 7, "stop": ["Max"], "include_stop_str_in_output": true}
EOF
# sampled by the sample op (its rules count the tokens not read yet: the draw's step,
# min_tokens' bans), logprobs; and with a penalty, which needs those tokens' values
sed -e '$ s/^{/{"temperature": 0.8, "seed": 5, /' -e '1 s/^{/{"temperature": 0.7, "top_p": 0.9, "min_tokens": 30, /' \
    -e '3 s/^{/{"logprobs": 2, /' "$TMP/in.jsonl" >"$TMP/sampled.jsonl"
sed '2 s/^{/{"temperature": 0.8, "repetition_penalty": 1.2, /' "$TMP/in.jsonl" >"$TMP/penalty.jsonl"
# every rule that reads the output's tokens, beside plain rows: penalties (one greedy), JSON
# (greedy, sampled, a schema), a choice with n = 2, bad words, a regex
sed -e '1 s/^{/{"temperature": 0.9, "seed": 2, "presence_penalty": 0.8, "frequency_penalty": 0.4, /' \
    -e '4 s/^{/{"repetition_penalty": 1.3, /' \
    -e '5 s/^{/{"response_format": {"type": "json_object"}, /' \
    -e '6 s/^{/{"temperature": 0.7, "seed": 4, "bad_words": ["the", " and", "."], /' \
    -e '7 s/^{/{"temperature": 1.0, "seed": 9, "response_format": {"type": "json_object"}, /' "$TMP/in.jsonl" >"$TMP/reads.jsonl"
cat >>"$TMP/reads.jsonl" <<'EOF'
{"id": "i", "prompt": "Lily", "max_tokens": 12, "temperature": 0.9, "seed": 1, "n": 2, "guided_choice": ["a big dog", "a cat", "the sun"]}
{"id": "j", "prompt": "Ben", "max_tokens": 40, "temperature": 0.8, "seed": 3, "guided_json": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["name", "age"]}}
{"id": "k", "prompt": "Tom", "max_tokens": 20, "temperature": 0.8, "seed": 6, "guided_regex": "(yes|no)( [a-z]+){2,4}"}
EOF
sed '$ s/^{/{"temperature": 0.8, "seed": 5, /' "$TMP/in.jsonl" >"$TMP/mixed.jsonl"

norm() { completions "$1"; }
# both NAME INPUT [flags...]: TPINFER_OVERLAP=0 and the default, the same completions; prints
# how many steps the default enqueued ahead
both() {
    name=$1 input=$2; shift 2
    for ov in 0 1; do
        TPINFER_LOG=debug TPINFER_OVERLAP=$ov "$TPINFER" --model "$m" --backend "$backend" --input "$input" \
            --output "$TMP/$name$ov.jsonl" "$@" 2>"$TMP/$name$ov.err" || { cat "$TMP/$name$ov.err"; fail "$name, TPINFER_OVERLAP=$ov"; }
    done
    [ "$(norm "$TMP/${name}0.jsonl")" = "$(norm "$TMP/${name}1.jsonl")" ] ||
        { diff "$TMP/${name}0.jsonl" "$TMP/${name}1.jsonl" | head; fail "$name: the completions differ with steps enqueued ahead"; }
    ! grep -q "enqueued before the step before was read" "$TMP/${name}0.err" || fail "$name: TPINFER_OVERLAP=0 enqueued ahead"
    grep -c "enqueued before the step before was read" "$TMP/${name}1.err" || :
}
n=$(both plain "$TMP/in.jsonl") && [ "$n" -gt 10 ] || fail "plain: $n steps enqueued ahead"
# (and a profiler range that is not one is named, and changes nothing)
for v in 5 3:1 x:y 1:2:3; do
    TPINFER_PROFILE_STEPS=$v "$TPINFER" --model "$m" --backend "$backend" --input "$TMP/in.jsonl" \
        --output "$TMP/prof.jsonl" --overwrite 2>"$TMP/prof.err" || { cat "$TMP/prof.err"; fail "TPINFER_PROFILE_STEPS=$v"; }
    grep -q "TPINFER_PROFILE_STEPS=$v is not A:B" "$TMP/prof.err" || { cat "$TMP/prof.err"; fail "TPINFER_PROFILE_STEPS=$v: no warning"; }
    [ "$(norm "$TMP/prof.jsonl")" = "$(norm "$TMP/plain1.jsonl")" ] || fail "TPINFER_PROFILE_STEPS=$v changed the completions"
done
# the ends this test means to cover happened
for want in '"id":"d".*"finish_reason":"stop"' '"id":"g".*"finish_reason":"stop"' '"id":"h".*Max.*"finish_reason":"stop"' \
    '"id":"b".*"finish_reason":"length"' '"id":"f".*"finish_reason":"length"'; do
    grep -q "$want" "$TMP/plain1.jsonl" || { cat "$TMP/plain1.jsonl"; fail "no line matches $want"; }
done
both seqs2 "$TMP/in.jsonl" --max-num-seqs 2 >/dev/null || exit 1
both chunked "$TMP/in.jsonl" --max-num-batched-tokens 7 --max-num-seqs 3 >/dev/null || exit 1
# room for about one sequence: they preempt each other, and are recomputed from tokens the
# host read after the next step was enqueued
if [ "$backend" = cpu ]; then
    both tight "$TMP/in.jsonl" --kv-cache-memory 200KiB --max-model-len 160 >/dev/null || exit 1
    grep -q " 0 preempted" "$TMP/tight1.err" && { cat "$TMP/tight1.err"; fail "the tight KV cache did not force preemption"; }
fi
TPINFER_PAD_DECODE=1 both padded "$TMP/in.jsonl" >/dev/null || exit 1
n=$(both sampled "$TMP/sampled.jsonl") && [ "$n" -gt 10 ] || fail "sampled requests: $n steps enqueued ahead"
# sampled requests admitted later: argmax steps then sample-op steps, taking from each other
both sampled2 "$TMP/sampled.jsonl" --max-num-seqs 2 >/dev/null || exit 1
grep -q '"id":"c".*"logprobs"' "$TMP/sampled1.jsonl" || { cat "$TMP/sampled1.jsonl"; fail "no logprobs"; }
n=$(both penalty "$TMP/penalty.jsonl") && [ "$n" -gt 10 ] || fail "a request with a penalty: $n steps enqueued ahead"
n=$(both reads "$TMP/reads.jsonl") && [ "$n" -gt 10 ] || fail "rules that read the output: $n steps enqueued ahead"
n=$(grep -c "(its rules made after)" "$TMP/reads1.err") && [ "$n" -gt 10 ] ||
    fail "rules that read the output: $n steps sampled after the step before was read"
! grep -q '"error"' "$TMP/reads1.jsonl" || { cat "$TMP/reads1.jsonl"; fail "reads: an error record"; }
[ "$(grep -c '"id"' "$TMP/reads1.jsonl")" = 11 ] || { cat "$TMP/reads1.jsonl"; fail "reads: not 11 records"; }
both reads2 "$TMP/reads.jsonl" --max-num-seqs 3 >/dev/null || exit 1
if [ "$backend" = cpu ]; then
# two replicas of one rank each: every rank enqueues ahead
for ov in 0 1; do
    TPINFER_OVERLAP=$ov mpi 2 "$TPINFER" --model "$m" --backend cpu --input "$TMP/in.jsonl" \
        --output "$TMP/dp$ov.jsonl" 2>"$TMP/dp$ov.err" || { cat "$TMP/dp$ov.err"; fail "dp 2, TPINFER_OVERLAP=$ov"; }
done
[ "$(norm "$TMP/dp0.jsonl")" = "$(norm "$TMP/plain0.jsonl")" ] || fail "dp 2 without overlap differs from one rank"
[ "$(norm "$TMP/dp1.jsonl")" = "$(norm "$TMP/plain0.jsonl")" ] || fail "dp 2 with steps enqueued ahead differs"
fi
[ "$backend" = cpu ] || [ "${OVERLAP_TP2:-0}" = 1 ] || exit 0 # (on GPUs: OVERLAP_TP2=1 where two are)
# tp 2: the ranks' argmax winners compared on the device, the sampler's stop decisions shared;
# padded decode steps (as graphs run them); sampled rows sampled by both ranks, by the rules
# the sampler sends (after the step before is read where they read its tokens)
# tp2 NAME INPUT [flags...]: both ways at tp 2 into $TMP/tpNAME{0,1}.{jsonl,err}, the same completions
tp2() {
    name=$1 input=$2; shift 2
    for ov in 0 1; do
        TPINFER_LOG=debug TPINFER_PAD_DECODE=1 TPINFER_OVERLAP=$ov mpi 2 "$TPINFER" --model "$m" --backend "$backend" --tp 2 \
            --input "$input" --output "$TMP/tp$name$ov.jsonl" "$@" 2>"$TMP/tp$name$ov.err" ||
            { cat "$TMP/tp$name$ov.err"; fail "tp 2 $name, TPINFER_OVERLAP=$ov"; }
    done
    [ "$(norm "$TMP/tp${name}0.jsonl")" = "$(norm "$TMP/tp${name}1.jsonl")" ] ||
        { diff "$TMP/tp${name}0.jsonl" "$TMP/tp${name}1.jsonl" | head; fail "tp 2 $name: the completions differ"; }
}
for input in in mixed sampled reads; do tp2 $input "$TMP/$input.jsonl"; done
# sampled rows admitted as others finish, in chunks, and preempted (recomputed from the
# tokens read after the next step was enqueued), the rules sent each time
if [ "$backend" = cpu ]; then
    tp2 reads3 "$TMP/reads.jsonl" --max-num-seqs 3
    tp2 chunked "$TMP/sampled.jsonl" --max-num-batched-tokens 7 --max-num-seqs 3
    tp2 tight "$TMP/sampled.jsonl" --kv-cache-memory 100KiB --max-model-len 160
    grep -q " 0 preempted" "$TMP/tptight1.err" && { cat "$TMP/tptight1.err"; fail "tp 2: the tight KV cache did not force preemption"; }
fi
n=$(grep -c "enqueued before the step before was read" "$TMP/tpin1.err") && [ "$n" -gt 10 ] || fail "tp 2: $n steps enqueued ahead"
# and the winners compared right: tp 1's greedy completions (no near ties in these)
[ "$(norm "$TMP/tpin0.jsonl")" = "$(norm "$TMP/plain0.jsonl")" ] || fail "tp 2's greedy completions differ from tp 1's"
for input in mixed sampled reads; do
    n=$(grep -c "enqueued before the step before was read" "$TMP/tp${input}1.err") && [ "$n" -gt 10 ] ||
        fail "tp 2 $input: $n steps enqueued ahead"
done
n=$(grep -c "(its rules made after)" "$TMP/tpreads1.err") && [ "$n" -gt 10 ] ||
    fail "tp 2, rules that read the output: $n steps sampled after the step before was read"
[ "$(grep -c '"id"' "$TMP/tpreads1.jsonl")" = 11 ] && ! grep -q '"error"' "$TMP/tpreads1.jsonl" ||
    { cat "$TMP/tpreads1.jsonl"; fail "tp 2 reads: not 11 completions"; }
# ranks whose choices part (a peer misreads one, TPINFER_TEST_SKEW_AT) end the job with a
# message that says so, not with caches that differ
if [ "$backend" = cpu ]; then
    TPINFER_TEST_SKEW_AT=read:1 mpi 2 "$TPINFER" --model "$m" --backend cpu --tp 2 --input "$TMP/sampled.jsonl" \
        --output "$TMP/skew.jsonl" 2>"$TMP/skew.err"
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$TMP/skew.err"; fail "tp 2, a peer's choice apart: exit $rc"; }
    grep -q "rank 1 chose token .* where its group's sampler (replica rank 0) chose .*: the TP ranks' sample ops disagree" \
        "$TMP/skew.err" || { cat "$TMP/skew.err"; fail "tp 2, a peer's choice apart: no message"; }
fi
# TPINFER_OVERLAP=0 on one rank only (mpirun without -x across hosts): the ranks agree to wait
if [ "$backend" = cpu ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 10 120 "$MPIRUN" --oversubscribe \
        -np 1 env TPINFER_LOG=debug TPINFER_PAD_DECODE=1 TPINFER_OVERLAP=0 "$TPINFER" --model "$m" --backend cpu --tp 2 \
        --input "$TMP/in.jsonl" --output "$TMP/tpone.jsonl" : \
        -np 1 env TPINFER_LOG=debug TPINFER_PAD_DECODE=1 "$TPINFER" --model "$m" --backend cpu --tp 2 \
        --input "$TMP/in.jsonl" --output "$TMP/tpone.jsonl" 2>"$TMP/tpone.err" ||
        { cat "$TMP/tpone.err"; fail "tp 2, TPINFER_OVERLAP=0 on rank 0 only"; }
    [ "$(norm "$TMP/tpone.jsonl")" = "$(norm "$TMP/tpin0.jsonl")" ] || fail "tp 2, TPINFER_OVERLAP=0 on rank 0 only: the completions differ"
    ! grep -q "enqueued before the step before was read" "$TMP/tpone.err" || fail "tp 2, TPINFER_OVERLAP=0 on rank 0: a rank enqueued ahead"
fi
exit 0
