#!/bin/sh
# logit_bias (OpenAI's, token id strings to biases added to the logits before the penalties,
# clamped to [-100, 100] as vLLM does) and allowed_token_ids (vLLM's: the only ids drawn), on
# stories260K: a -100 bias on greedy's first choice picks the runner-up that a run without it
# ranked second, with the raw logprob that run reported for it; +100 makes every token that
# one, greedy or sampled; allowed ids are the only ones drawn; an OpenAI chat body's fields
# work as a plain line's; a bad bias is an error record and the lines beside it run. And
# bad_words (vLLM's): a word's tokens never come out in a row.
# tests/sample_paths.sh checks the device's sample op against the host sampler on such rows.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
py_ids() { python3 -c 'import json,sys; print(",".join(map(str, json.loads(sys.stdin.read())[int(sys.argv[1]):int(sys.argv[2])])))' "$@"; }
field() { # field FILE ID EXPR: a Python expression over the output line d of request ID
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get("custom_id", d.get("id")) == sys.argv[2]: print(eval(sys.argv[3]))' "$1" "$2" "$3"
}

# 1. greedy's first token sunk by -100: the runner-up, with its raw logprob
run_lines plain '{"id": "p", "prompt": "The dog", "max_tokens": 4, "temperature": 0, "logprobs": 3}'
first=$(field "$TMP/plain.jsonl" p 'd["logprobs"][0]["top_logprobs"][0]["id"]')
second=$(field "$TMP/plain.jsonl" p 'd["logprobs"][0]["top_logprobs"][1]["id"]')
second_lp=$(field "$TMP/plain.jsonl" p 'd["logprobs"][0]["top_logprobs"][1]["logprob"]')
[ -n "$first" ] && [ "$first" != "$second" ] || fail "no top logprobs to steer by"
run_lines sunk "{\"id\": \"s\", \"prompt\": \"The dog\", \"max_tokens\": 4, \"temperature\": 0, \"logprobs\": 3, \"logit_bias\": {\"$first\": -100}}"
[ "$(field "$TMP/sunk.jsonl" s 'd["token_ids"][0]')" = "$second" ] ||
    fail "-100 on token $first: first token $(field "$TMP/sunk.jsonl" s 'd["token_ids"][0]'), wanted the runner-up $second"
[ "$(field "$TMP/sunk.jsonl" s 'd["logprobs"][0]["logprob"]')" = "$second_lp" ] ||
    fail "the biased run's logprob is not the raw one ($second_lp)"
[ "$(field "$TMP/sunk.jsonl" s 'd["logprobs"][0]["top_logprobs"][0]["id"]')" = "$first" ] ||
    fail "the top logprobs are not the raw distribution's (token $first leads it)"
field "$TMP/sunk.jsonl" s 'd["token_ids"]' | grep -qw "$first" && fail "token $first was drawn under a -100 bias"

# 2. +100 (and 1e9, clamped to 100) on one token: every token it, greedy and sampled
run_lines lifted '{"id": "g", "prompt": "Lily", "max_tokens": 6, "temperature": 0, "logit_bias": {"300": 100}}' \
    '{"id": "t", "prompt": "Lily", "max_tokens": 6, "temperature": 1.0, "seed": 4, "logit_bias": {"300": 1e9}}'
for id in g t; do
    [ "$(field "$TMP/lifted.jsonl" $id 'sorted(set(d["token_ids"]))')" = "[300]" ] ||
        fail "request $id: +100 on token 300 gave $(field "$TMP/lifted.jsonl" $id 'd["token_ids"]')"
done

# 3. allowed_token_ids: sampled at temperature 1.5, only they come out
allowed="[261, 268, 286, 337, 346, 370, 397, 432]"
run_lines allowed "{\"id\": \"a\", \"prompt\": \"The dog\", \"max_tokens\": 30, \"temperature\": 1.5, \"seed\": 8, \"ignore_eos\": true, \"allowed_token_ids\": $allowed}"
field "$TMP/allowed.jsonl" a "all(t in $allowed for t in d['token_ids']) and len(d['token_ids']) == 30" | grep -qx True ||
    fail "allowed_token_ids: drew $(field "$TMP/allowed.jsonl" a 'd["token_ids"]')"
field "$TMP/allowed.jsonl" a "len(set(d['token_ids'])) > 2" | grep -qx True || fail "allowed_token_ids: no variety at temperature 1.5"

# 4. the same fields in an OpenAI batch body: the same completion as the plain line's
run_lines openai '{"custom_id": "g", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Lily", "max_tokens": 6, "temperature": 0, "logit_bias": {"300": 100}}}'
[ "$(field "$TMP/openai.jsonl" g 'd["response"]["body"]["choices"][0]["text"]')" = "$(field "$TMP/lifted.jsonl" g 'd["text"]')" ] ||
    fail "openai body: $(cat "$TMP/openai.jsonl")"

# 5. a bad bias is an error record naming the field; its neighbours run
run_lines_with_errors bad '{"id": "ok1", "prompt": "Lily", "max_tokens": 2}' \
    '{"id": "bad", "prompt": "Lily", "max_tokens": 2, "logit_bias": {"512": 1}}' \
    '{"id": "bad2", "prompt": "Lily", "max_tokens": 2, "allowed_token_ids": []}' \
    '{"id": "ok2", "prompt": "Lily", "max_tokens": 2, "logit_bias": {"5": -1}}'
grep -q '"id":"bad".*\\"logit_bias\\" key \\"512\\" is outside \[0, 512) (the vocabulary)' "$TMP/bad.jsonl" ||
    fail "no error record for the out-of-vocabulary bias: $(cat "$TMP/bad.jsonl")"
grep -q '"id":"bad2".*\\"allowed_token_ids\\" is an empty array' "$TMP/bad.jsonl" ||
    fail "no error record for the empty allowed_token_ids: $(cat "$TMP/bad.jsonl")"
[ "$(grep -c '"finish_reason"' "$TMP/bad.jsonl")" -eq 2 ] || fail "the lines beside the bad ones did not run"

# 6. bad_words (vLLM's): a word's tokens never come out in a row; the run is the plain one up
# to where that one had the word. Words from the plain run's own tokens: 2 (one token, given
# with white space before it, which vLLM strips) and 4-5 (two tokens).
run_lines plain12 '{"id": "p", "prompt": "The dog", "max_tokens": 12, "temperature": 0}'
plain=$(field "$TMP/plain12.jsonl" p 'd["token_ids"]')
printf '{"ids": [%s]}\n{"ids": [%s]}\n' "$(echo "$plain" | py_ids 2 3)" "$(echo "$plain" | py_ids 4 6)" >"$TMP/words.in"
"$TPINFER" --detokenize --model "$m" --input "$TMP/words.in" --output "$TMP/words.jsonl" 2>"$TMP/words.err" || { cat "$TMP/words.err"; fail "detokenize"; }
one=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[0])["text"].strip())' "$TMP/words.jsonl")
two=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[1])["text"].strip())' "$TMP/words.jsonl")
printf '{"text": "%s", "add_special_tokens": false}\n' "$two" >"$TMP/two.in"
"$TPINFER" --tokenize --model "$m" --input "$TMP/two.in" --output "$TMP/two.jsonl" 2>"$TMP/two.err" || { cat "$TMP/two.err"; fail "tokenize"; }
[ "$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["ids"])' "$TMP/two.jsonl")" = "[$(echo "$plain" | py_ids 4 6 | sed 's/,/, /g')]" ] ||
    fail "test setup: '$two' does not encode to plain's tokens 4-5 ($plain)"
run_lines bad1 "{\"id\": \"b\", \"prompt\": \"The dog\", \"max_tokens\": 12, \"temperature\": 0, \"bad_words\": [\"  $one\"]}"
run_lines bad2 "{\"id\": \"b\", \"prompt\": \"The dog\", \"max_tokens\": 12, \"temperature\": 0, \"bad_words\": [\"$two\"]}"
python3 - "$plain" "$(field "$TMP/bad1.jsonl" b 'd["token_ids"]')" "$(field "$TMP/bad2.jsonl" b 'd["token_ids"]')" <<'PY' || fail "bad_words"
import json, sys
plain, bad1, bad2 = (json.loads(a) for a in sys.argv[1:4])
# the one-token word banned: it (plain's third) never comes, the run is plain's before it
assert bad1[:2] == plain[:2] and bad1[2] != plain[2] and plain[2] not in bad1, (plain, bad1)
# plain's tokens 4-5 as a word banned: they never come in a row; each alone may
assert bad2[:5] == plain[:5] and bad2[5] != plain[5], (plain, bad2)
assert all(bad2[i:i + 2] != plain[4:6] for i in range(len(bad2) - 1)), (plain, bad2)
PY
# a bad word of only white space is an error record
run_lines_with_errors ws '{"id": "w", "prompt": "Lily", "max_tokens": 2, "bad_words": [" \t"]}'
grep -q '\\"bad_words\\"\[0\] must be a string with more than white space' "$TMP/ws.jsonl" ||
    fail "a blank bad word: $(cat "$TMP/ws.jsonl")"
echo "PASS"
