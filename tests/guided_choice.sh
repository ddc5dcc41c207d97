#!/bin/sh
# guided_choice (vLLM's, also as "structured_outputs": {"choice": [...]}): the completion is
# one of the choices, on stories260K (a SentencePiece tokenizer): greedy, sampled and n = 3,
# in plain and OpenAI batch lines; greedy under choices that start with the model's own
# greedy text follows it token for token and ends there; max_tokens cuts a choice short
# (finish_reason length); what cannot run is an error record beside lines that run.
# tests/check_guided.c checks the token sets on real tokenizers; tests/sample_paths.sh the
# device's sample op on a guided line (tests/sample_prompts.jsonl), as on a GPU.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
py() { python3 -c "$@"; }

# 1. the model's own greedy start as a choice: followed token for token, then the end
run_lines plain '{"id": "p", "prompt": "The dog", "max_tokens": 3, "temperature": 0}'
start=$(py 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["text"])' "$TMP/plain.jsonl")
ids=$(py 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["token_ids"])' "$TMP/plain.jsonl")
[ -n "$start" ] || fail "no greedy text"
run_lines follow "{\"id\": \"f\", \"prompt\": \"The dog\", \"max_tokens\": 10, \"temperature\": 0, \"guided_choice\": [\"Xylophone zebra\", \"$start\"]}"
py 'import json,sys
d = json.loads(open(sys.argv[1]).readline())
want = json.loads(sys.argv[3])
assert d["text"] == sys.argv[2], (d["text"], sys.argv[2])
assert d["token_ids"][:len(want)] == want and len(d["token_ids"]) == len(want) + 1, (d["token_ids"], want)
assert d["finish_reason"] == "stop", d' "$TMP/follow.jsonl" "$start" "$ids" || fail "greedy did not follow its own start"

# 2. every completion is a choice: greedy, sampled, n = 3, both spellings, an OpenAI body
choices='["yes", "no", "maybe so", "Positive \u2713", "The end."]'
run_lines many "{\"id\": \"g\", \"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0, \"guided_choice\": $choices}" \
    "{\"id\": \"s\", \"prompt\": \"Lily\", \"max_tokens\": 20, \"temperature\": 1.2, \"seed\": 9, \"n\": 3, \"guided_choice\": $choices, \"logprobs\": 1}" \
    "{\"id\": \"o\", \"prompt\": \"Tom\", \"max_tokens\": 20, \"temperature\": 1.0, \"seed\": 1, \"structured_outputs\": {\"choice\": $choices}}"
run_lines openai "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"Lily\", \"max_tokens\": 20, \"temperature\": 1.2, \"seed\": 9, \"n\": 3, \"guided_choice\": $choices}}"
py 'import json,sys
choices = json.loads(sys.argv[2])
seen = set()
for f in sys.argv[1].split():
    for l in open(f):
        d = json.loads(l)
        body = d.get("response", {}).get("body")
        outs = body["choices"] if body else d.get("choices", [d])
        for c in outs:
            assert c["text"] in choices and c["finish_reason"] == "stop", (f, c["text"], c["finish_reason"])
            seen.add(c["text"])
assert len(seen) >= 2, seen' "$TMP/many.jsonl $TMP/openai.jsonl" "$choices" || fail "a completion is not one of the choices"
# the OpenAI body draws what the plain line with the same seed draws
[ "$(py 'import json,sys; print([c["text"] for c in json.loads(open(sys.argv[1]).readline())["response"]["body"]["choices"]])' "$TMP/openai.jsonl")" = \
  "$(py 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["id"] == "s": print([c["text"] for c in d["choices"]])' "$TMP/many.jsonl")" ] || fail "the OpenAI body and the plain line differ"

# 3. max_tokens cuts a choice short: a prefix of it, finish_reason length
run_lines cut '{"id": "t", "prompt": "Lily", "max_tokens": 2, "temperature": 0, "guided_choice": ["Xylophone orchestra"]}'
py 'import json,sys
d = json.loads(open(sys.argv[1]).readline())
assert d["finish_reason"] == "length" and "Xylophone orchestra".startswith(d["text"]) and d["text"], d' "$TMP/cut.jsonl" ||
    fail "a cut choice: $(cat "$TMP/cut.jsonl")"

# 4. what cannot run: an error record each, naming the field; the lines beside them run
run_lines_with_errors bad '{"id": "ok", "prompt": "Lily", "max_tokens": 8, "guided_choice": ["a b"]}' \
    '{"id": "e1", "prompt": "Lily", "guided_choice": []}' \
    '{"id": "e2", "prompt": "Lily", "guided_choice": ["a", 5]}' \
    '{"id": "e3", "prompt": "Lily", "guided_choice": ["a"], "allowed_token_ids": [5]}' \
    '{"id": "e4", "prompt": "Lily", "guided_choice": ["a"], "min_tokens": 2}' \
    '{"id": "e5", "prompt": "Lily", "guided_choice": ["a"], "ignore_eos": true}' \
    '{"id": "e6", "prompt": "Lily", "structured_outputs": {"grammar": "root ::= x"}}' \
    '{"id": "e7", "prompt": "Lily", "guided_grammar": "root ::= x"}' \
    '{"id": "e8", "prompt": "Lily", "guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}}' \
    '{"id": "ok2", "prompt": "Lily", "max_tokens": 8, "structured_outputs": {"choice": ["b c"]}}'
for want in 'e1.*\\"guided_choice\\" must be a non-empty array of strings, not an empty array' \
    'e2.*\\"guided_choice\\"\[1\] must be a non-empty string, not 5' \
    'e3.*both say which tokens may come' 'e4.*\\"min_tokens\\" 2: a choice may end sooner' \
    'e5.*\\"ignore_eos\\": true: a choice ends at the end token' \
    'e6.*\\"structured_outputs\\".\\"grammar\\": guided decoding other than \\"choice\\", \\"json\\", \\"json_object\\" and \\"regex\\"' \
    'e7.*\\"guided_grammar\\": guided decoding by a grammar is not supported' 'e8.*give one of'; do
    grep -q "\"id\":\"$want" "$TMP/bad.jsonl" || fail "no error record matching $want: $(cat "$TMP/bad.jsonl")"
done
[ "$(grep -c '"finish_reason":"stop"' "$TMP/bad.jsonl")" -eq 2 ] || fail "the good lines beside the bad ones: $(grep -v '"code"' "$TMP/bad.jsonl")"
grep -q '"id":"ok","text":"a b"' "$TMP/bad.jsonl" && grep -q '"id":"ok2","text":"b c"' "$TMP/bad.jsonl" ||
    fail "a one-choice line did not give its choice"
# --ignore-eos would let a choice run on past its end token: an error record, unless the line
# says "ignore_eos": false; bad_words beside guided_choice are refused as the line is read
lines_flags=--ignore-eos run_lines_with_errors ie '{"id": "i1", "prompt": "Lily", "max_tokens": 8, "guided_choice": ["yes", "no"]}' \
    '{"id": "i2", "prompt": "Lily", "max_tokens": 8, "guided_choice": ["yes", "no"], "ignore_eos": false}' \
    '{"id": "i3", "prompt": "Lily", "max_tokens": 8, "guided_choice": ["yes"], "bad_words": ["no"]}'
grep -q '"id":"i1".*guided_choice with --ignore-eos' "$TMP/ie.jsonl" || fail "no error record under --ignore-eos: $(cat "$TMP/ie.jsonl")"
grep -q '"id":"i3".*the choices alone say what may come' "$TMP/ie.jsonl" || fail "bad_words beside guided_choice: $(cat "$TMP/ie.jsonl")"
py 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["id"] == "i2": assert d["text"] in ("yes", "no") and d["finish_reason"] == "stop", d; break
else: raise SystemExit("no i2")' "$TMP/ie.jsonl" || fail "ignore_eos false under --ignore-eos: $(cat "$TMP/ie.jsonl")"
echo PASS
