#!/bin/sh
# response_format {"type": "json_object"} (also vLLM's "structured_outputs": {"json_object":
# true}): the completion is a JSON object, on stories260K (SentencePiece with byte tokens:
# inside a string most of its 512 tokens may come, so the engine sends the few that may not)
# and tiny-llama3 (byte-level BPE): greedy, sampled, n = 3, logit_bias toward closing, in
# plain and OpenAI batch lines (completions and chat). Every text keeps llama.cpp's whitespace rule
# (with structured_outputs.disable_any_whitespace: none between tokens); one that ends
# ("stop") parses as an object (Python's json), one that max_tokens cuts ("length") is the
# start of one (tests/json_prefix_check.py finds an ending that parses). The host sampler
# and the backend's sample op draw the same; what cannot run is an error record.
# tests/check_json_prefix.c checks the recognizer against jansson, tests/check_guided.c the
# token sets on real tokenizers.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
py() { PYTHONPATH="$top_srcdir/tests" python3 -c "$@"; }
check_json() { # check_json FILE...: every completion as the header says; prints how many ended
    # (COMPACT=1: no whitespace between tokens at all, disable_any_whitespace's)
    COMPACT=${COMPACT:-0} py 'import json, os, re, sys
from json_prefix_check import completable
ended = 0
for f in sys.argv[1:]:
    for l in open(f):
        d = json.loads(l)
        body = d.get("response", {}).get("body")
        if body:
            outs = [c.get("message", c) for c in body["choices"]]
            reasons = [c["finish_reason"] for c in body["choices"]]
            texts = [o.get("content", o.get("text")) for o in outs]
        else:
            cs = d.get("choices", [d])
            texts, reasons = [c["text"] for c in cs], [c["finish_reason"] for c in cs]
        for t, r in zip(texts, reasons):
            bare = re.sub(r"\"(\\\\.|[^\"\\\\])*\"?", "\"\"", t) # strings out: whitespace between tokens left
            for ws in re.findall(r"[ \t\n\r]+", bare):
                assert ws == " " or re.fullmatch("\n[ \t]{0,20}", ws), (f, repr(t), repr(ws))
                assert os.environ["COMPACT"] == "0", ("whitespace in a compact text", f, repr(t))
            if r == "stop":
                assert isinstance(json.loads(t), dict), (f, t)
                ended += 1
            else:
                assert r == "length" and completable(t), (f, r, repr(t))
print(ended)' "$@"
}

m="$MODELS/stories260K-hf"
# "}" is <0x7D> (128), "\"" 436 in stories260K's vocabulary
lines="{\"id\": \"g\", \"prompt\": \"Once upon a time\", \"max_tokens\": 48, \"temperature\": 0, \"response_format\": {\"type\": \"json_object\"}}
{\"id\": \"s\", \"prompt\": \"Lily\", \"max_tokens\": 48, \"temperature\": 1.0, \"seed\": 3, \"n\": 3, \"response_format\": {\"type\": \"json_object\"}, \"logprobs\": 1}
{\"id\": \"b\", \"prompt\": \"Tom\", \"max_tokens\": 64, \"temperature\": 0.8, \"seed\": 4, \"logit_bias\": {\"128\": 20, \"436\": 3}, \"structured_outputs\": {\"json_object\": true}}
{\"id\": \"c\", \"prompt\": \"The dog\", \"max_tokens\": 64, \"temperature\": 0, \"logit_bias\": {\"128\": 20, \"436\": 4}, \"response_format\": {\"type\": \"json_object\"}}"
printf '%s\n' "$lines" > "$TMP/stories.in"
both_samplers stories
[ "$(grep -c '"finish_reason"' "$TMP/stories-0.jsonl")" -ge 4 ] || fail "not every line ran: $(cat "$TMP/stories-0.jsonl")"
ended=$(check_json "$TMP/stories-0.jsonl") || fail "a stories260K completion is not JSON: $(cat "$TMP/stories-0.jsonl")"
[ "$ended" -ge 1 ] || fail "no stories260K completion ended (the biased lines should): $(cat "$TMP/stories-0.jsonl")"

# an OpenAI batch line (completions) draws what the plain line with the same seed draws
run_lines openai "{\"custom_id\": \"o\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"Lily\", \"max_tokens\": 48, \"temperature\": 1.0, \"seed\": 3, \"n\": 3, \"response_format\": {\"type\": \"json_object\"}, \"logprobs\": 1}}"
check_json "$TMP/openai.jsonl" >/dev/null || fail "the OpenAI line's completions: $(cat "$TMP/openai.jsonl")"
[ "$(py 'import json,sys; print([c["text"] for c in json.loads(open(sys.argv[1]).readline())["response"]["body"]["choices"]])' "$TMP/openai.jsonl")" = \
  "$(py 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["id"] == "s": print([c["text"] for c in d["choices"]])' "$TMP/stories-0.jsonl")" ] || fail "the OpenAI body and the plain line differ"

# structured_outputs.disable_any_whitespace: no whitespace between tokens (json_object, a
# schema, a named tool), the same tokens from the sample op and the host sampler
compact="{\"id\": \"w\", \"prompt\": \"Lily\", \"max_tokens\": 64, \"temperature\": 0.8, \"seed\": 3, \"n\": 3, \"logit_bias\": {\"128\": 6, \"436\": 4}, \"structured_outputs\": {\"json_object\": true, \"disable_any_whitespace\": true}}
{\"id\": \"x\", \"prompt\": \"Tom\", \"max_tokens\": 64, \"temperature\": 0.8, \"seed\": 5, \"n\": 2, \"logit_bias\": {\"128\": 6, \"436\": 4}, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\", \"maximum\": 99}}}}}, \"structured_outputs\": {\"disable_any_whitespace\": true}}"
printf '%s\n' "$compact" > "$TMP/compact.in"
both_samplers compact
ended=$(COMPACT=1 check_json "$TMP/compact-0.jsonl") || fail "a compact completion: $(cat "$TMP/compact-0.jsonl")"
[ "$ended" -ge 1 ] || fail "no compact completion ended: $(cat "$TMP/compact-0.jsonl")"
# the check sees whitespace: the same lines without the option have some
sed 's/, \"disable_any_whitespace\": true//; s/, \"structured_outputs\": {}//' "$TMP/compact.in" > "$TMP/spaced.in"
"$TPINFER" --model "$m" --backend cpu --input "$TMP/spaced.in" --output "$TMP/spaced.jsonl" 2>/dev/null || fail "the spaced lines"
COMPACT=1 check_json "$TMP/spaced.jsonl" >/dev/null 2>&1 && fail "no whitespace without disable_any_whitespace either: the check sees none"

# tiny-llama3, byte-level BPE ("}" 92, "\"" 1): sampled and biased toward closing
m="$MODELS/tiny-llama3"
run_lines llama "{\"id\": \"s\", \"prompt\": \"Hello\", \"max_tokens\": 40, \"temperature\": 1.0, \"seed\": 7, \"n\": 3, \"response_format\": {\"type\": \"json_object\"}}" \
    "{\"id\": \"b\", \"prompt\": \"Hello\", \"max_tokens\": 60, \"temperature\": 0.7, \"seed\": 8, \"logit_bias\": {\"92\": 8, \"1\": 4}, \"response_format\": {\"type\": \"json_object\"}}"
ended=$(check_json "$TMP/llama.jsonl") || fail "a tiny-llama3 completion is not JSON: $(cat "$TMP/llama.jsonl")"
[ "$ended" -ge 1 ] || fail "no tiny-llama3 completion ended: $(cat "$TMP/llama.jsonl")"
# a chat request (the model's chat template), its message content held to an object
run_lines chat "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"Reply in JSON\"}], \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": 2, \"n\": 2, \"logit_bias\": {\"92\": 6, \"1\": 3}, \"response_format\": {\"type\": \"json_object\"}}}"
grep -q '"object":"chat.completion"' "$TMP/chat.jsonl" || fail "the chat line did not run: $(cat "$TMP/chat.jsonl")"
check_json "$TMP/chat.jsonl" >/dev/null || fail "a chat message is not JSON: $(cat "$TMP/chat.jsonl")"

# what cannot run: an error record each, naming the field; the lines beside them run
m="$MODELS/stories260K-hf"
run_lines_with_errors bad '{"id": "ok", "prompt": "Lily", "max_tokens": 8, "response_format": {"type": "json_object"}}' \
    '{"id": "e1", "prompt": "Lily", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "multipleOf": 3}}}}' \
    '{"id": "e2", "prompt": "Lily", "response_format": {"type": "json_object"}, "guided_choice": ["a"]}' \
    '{"id": "e3", "prompt": "Lily", "response_format": {"type": "json_object"}, "min_tokens": 3}' \
    '{"id": "e4", "prompt": "Lily", "structured_outputs": {"json_object": true}, "ignore_eos": true}' \
    '{"id": "e5", "prompt": "Lily", "response_format": {"type": "json_object"}, "bad_words": ["x"]}' \
    '{"id": "e6", "prompt": "Lily", "response_format": {"type": "yaml"}}' \
    '{"id": "e7", "prompt": "Lily", "structured_outputs": {"json_object": true, "disable_any_whitespace": "yes"}}' \
    '{"id": "e8", "prompt": "Lily", "structured_outputs": {"json_object": true, "whitespace_pattern": " "}}'
for want in 'e1.*\\"response_format\\": the JSON schema at its root: multipleOf is not supported' 'e2.*give one' \
    'e3.*the object may be whole sooner' 'e4.*the object ends at the end token' 'e5.*\\"bad_words\\"' \
    'e6.*must be {\\"type\\": \\"text\\"}, {\\"type\\": \\"json_object\\"} or {\\"type\\": \\"json_schema\\", ...}, not \\"yaml\\"' \
    'e7.*disable_any_whitespace must be true or false, not \\"yes\\"' 'e8.*\\"whitespace_pattern\\": guided decoding other than'; do
    grep -q "\"id\":\"$want" "$TMP/bad.jsonl" || fail "no error record matching $want: $(cat "$TMP/bad.jsonl")"
done
grep '"id":"ok"' "$TMP/bad.jsonl" > "$TMP/ok.jsonl" && check_json "$TMP/ok.jsonl" >/dev/null || fail "the good line: $(cat "$TMP/bad.jsonl")"
# --ignore-eos for the run: a JSON line is an error record (its object ends at the end token)
lines_flags=--ignore-eos run_lines_with_errors ignore '{"id": "j", "prompt": "Lily", "max_tokens": 8, "response_format": {"type": "json_object"}}' \
    '{"id": "p", "prompt": "Lily", "max_tokens": 4}'
grep -q '"id":"j".*with --ignore-eos' "$TMP/ignore.jsonl" && grep -q '"id":"p","text"' "$TMP/ignore.jsonl" ||
    fail "--ignore-eos with a JSON line: $(cat "$TMP/ignore.jsonl")"
echo "guided_json: PASS"
