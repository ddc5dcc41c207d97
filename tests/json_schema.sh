#!/bin/sh
# JSON schemas (response_format json_schema, vLLM's guided_json and structured_outputs.json):
#   1. the recognizer against Python's jsonschema (tests/json_schema_check.py through
#      tests/json_schema_driver): random instances taken whole, every edited text taken whole
#      valid, texts and schemas it must refuse refused;
#   2. end to end on stories260K: every completion that ends validates against its schema,
#      one cut by max_tokens is the start of a JSON value; the sample op draws what the host
#      sampler draws; an unsupported schema is an error record naming the keyword; a pattern
#      under maxLength that greedy decoding once followed into a dead end ("abc" of
#      ^(ab|abcdef)$, no token allowed after it, the text ended unfinished as "stop") ends valid;
#      one still left with no string of its lengths (2 or 8, within 3..5) warns where it ends;
#   3. a named tool_choice on tiny-llama3 (OpenAI chat and plain lines): one call to the tool,
#      content null (""), its arguments valid under the tool's parameters where they end;
#   4. tool_choice "required" on tiny-llama3: the calls are what the same line under vLLM's
#      schema (guided_json, built here) writes, each arguments json.dumps of its parameters,
#      valid under its tool's; "tool_calls" where the list ended; OpenAI's body alike.
. "$top_srcdir/tests/lib.sh"
need_shared
python3 -c "import jsonschema" 2>/dev/null || skip "python3 with the jsonschema package is needed (Debian: python3-jsonschema)"
export OMP_NUM_THREADS=1
python3 "$top_srcdir/tests/json_schema_check.py" "$top_builddir/tests/json_schema_driver" || fail "the recognizer against jsonschema"

m="$MODELS/stories260K-hf"
person='{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12, "pattern": "^[A-Za-z][a-z .,]*$"}, "age": {"type": "integer", "minimum": 1, "maximum": 120}, "mood": {"enum": ["happy", "sad"]}, "pets": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}, "required": ["name", "age", "mood", "pets"], "additionalProperties": false}'
# "\"" is 436 in stories260K's vocabulary, "]" <0x5D> 94, "}" <0x7D> 128: biased up, the
# strings and the object end within max_tokens
bias='{"436": 6, "94": 8, "128": 8}'
short='{"type": "object", "properties": {"a": {"type": "string", "pattern": "^(ab|abcdef)$", "maxLength": 3}}, "required": ["a"]}'
dead='{"type": "object", "properties": {"a": {"type": "string", "pattern": "^(ab|abcdefgh)$", "minLength": 3, "maxLength": 5}}, "required": ["a"]}'
printf '%s\n' \
  "{\"id\": \"a\", \"prompt\": \"Lily\", \"max_tokens\": 120, \"temperature\": 0.7, \"seed\": 1, \"n\": 3, \"logit_bias\": $bias, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"person\", \"strict\": true, \"schema\": $person}}}" \
  "{\"id\": \"b\", \"prompt\": \"Tom\", \"max_tokens\": 160, \"temperature\": 0, \"logit_bias\": $bias, \"guided_json\": $person}" \
  "{\"id\": \"c\", \"prompt\": \"The cat\", \"max_tokens\": 20, \"temperature\": 1.0, \"seed\": 4, \"structured_outputs\": {\"json\": {\"enum\": [\"yes\", \"no\", 42, null]}}}" \
  "{\"id\": \"d\", \"prompt\": \"Once\", \"max_tokens\": 12, \"temperature\": 1.0, \"seed\": 5, \"guided_json\": $person}" \
  '{"id": "e", "prompt": "Once", "guided_json": {"type": "integer", "multipleOf": 3}}' \
  "{\"id\": \"f\", \"prompt\": \"Once\", \"max_tokens\": 40, \"temperature\": 0, \"guided_json\": $short}" \
  "{\"id\": \"g\", \"prompt\": \"Once\", \"max_tokens\": 40, \"temperature\": 0, \"guided_json\": $dead}" \
  > "$TMP/out.in"
both_samplers out 4
PYTHONPATH="$top_srcdir/tests" python3 -c 'import json, sys, jsonschema
from json_prefix_check import completable
person = json.loads(sys.argv[2])
schemas = {"a": person, "b": person, "c": {"enum": ["yes", "no", 42, None]}, "d": person, "f": json.loads(sys.argv[3])}
ended = 0
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["id"] == "e":
        assert d["code"] == "invalid_request" and "multipleOf is not supported" in d["message"], d
        continue
    if d["id"] == "g": # the dead end: what was written, then the end token
        assert d["finish_reason"] == "stop" and d["text"].endswith("\"ab"), d
        continue
    for c in d.get("choices", [d]):
        t = c["text"]
        if c["finish_reason"] == "stop":
            jsonschema.validate(json.loads(t), schemas[d["id"]])
            ended += 1
        else:
            assert c["finish_reason"] == "length", c
            assert d["id"] == "c" or completable(t), (d["id"], t)
        assert d["id"] != "f" or c["finish_reason"] == "stop", c
assert ended >= 3, ended
print("json_schema: %d completions ended, each valid" % ended)' "$TMP/out-0.jsonl" "$person" "$short" ||
    fail "a completion breaks its schema: $(cat "$TMP/out-0.jsonl")"
grep -q 'request g (choice 0): after [0-9]* generated tokens its guided decoding (schema, regex or choices) allows no next token' \
    "$TMP/out-0.err" || fail "the dead end of request g was not said: $(cat "$TMP/out-0.err")"
# seven such choices: five named, then one count at the end (a million would drown the log)
printf '{"id": "h", "prompt": "Once", "n": 7, "max_tokens": 40, "temperature": 0, "guided_json": %s}\n' "$dead" >"$TMP/dead.in"
"$TPINFER" --model "$m" --backend cpu --input "$TMP/dead.in" --output "$TMP/dead.jsonl" 2>"$TMP/dead.err" ||
    { cat "$TMP/dead.err"; fail "seven dead ends: tpinfer failed"; }
named=$(grep -c 'request h (choice [0-6]): after' "$TMP/dead.err")
[ "$named" = 5 ] && grep -q 'replica 0: 7 guided choice(s) reached a point where their guide allowed no next token' "$TMP/dead.err" ||
    fail "seven dead ends: $named named, and the count: $(grep -i 'guide' "$TMP/dead.err")"
# a named tool choice (tiny-llama3's chat template): one call to it, its arguments held to the
# tool's parameters ("\"" is 1 and "}" 92 in its vocabulary: biased up, the object ends)
m="$MODELS/tiny-llama3"
params='{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}}, "required": ["city", "unit"]}'
tools="[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": $params}}, {\"type\": \"function\", \"function\": {\"name\": \"other\"}}]"
named='{"type": "function", "function": {"name": "get_weather"}}'
run_lines tool "{\"custom_id\": \"w\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": $tools, \"tool_choice\": $named, \"max_tokens\": 80, \"temperature\": 0.8, \"seed\": 3, \"n\": 3, \"logit_bias\": {\"1\": 5, \"92\": 7}}}"
run_lines tool_plain "{\"id\": \"p\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": $tools, \"tool_choice\": $named, \"max_tokens\": 80, \"temperature\": 0, \"logit_bias\": {\"1\": 5, \"92\": 7}}"
PYTHONPATH="$top_srcdir/tests" python3 -c 'import json, sys, jsonschema
from json_prefix_check import completable
params = json.loads(sys.argv[3])
calls = []
for c in json.loads(open(sys.argv[1]).readline())["response"]["body"]["choices"]:
    assert c["message"]["content"] is None, c
    calls.append((c["message"]["tool_calls"], c["finish_reason"]))
p = json.loads(open(sys.argv[2]).readline())
assert p["text"] == "", p
calls.append((p["tool_calls"], p["finish_reason"]))
ended = 0
for tc, reason in calls:
    assert len(tc) == 1 and tc[0]["type"] == "function" and tc[0]["function"]["name"] == "get_weather", tc
    args = tc[0]["function"]["arguments"]
    if reason == "stop":
        jsonschema.validate(json.loads(args), params)
        ended += 1
    else:
        assert reason == "length" and completable(args), (reason, args)
assert ended >= 1, calls
print("json_schema: a named tool: %d of %d calls ended, each valid" % (ended, len(calls)))' "$TMP/tool.jsonl" "$TMP/tool_plain.jsonl" "$params" ||
    fail "a named tool call: $(cat "$TMP/tool.jsonl" "$TMP/tool_plain.jsonl")"
# "required": a list of calls; the same line under vLLM's schema for it writes the same text
# ("]" is 60: biased up, the list ends)
vllm_schema=$(python3 -c 'import json, sys
tools = json.loads(sys.argv[1])
print(json.dumps({"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
    {"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                    "parameters": t["function"].get("parameters", {"type": "object", "properties": {}})},
     "required": ["name", "parameters"]} for t in tools]}}))' "$tools")
req="\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": $tools, \"max_tokens\": 90, \"temperature\": 0.9, \"seed\": 11, \"n\": 4, \"logit_bias\": {\"1\": 5, \"92\": 6, \"60\": 6}"
run_lines required "{\"id\": \"r\", $req, \"tool_choice\": \"required\"}"
run_lines required_openai "{\"custom_id\": \"o\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {$req, \"tool_choice\": \"required\"}}"
run_lines required_as_json "{\"id\": \"r\", $req, \"tool_choice\": \"none\", \"guided_json\": $vllm_schema}"
PYTHONPATH="$top_srcdir/tests" python3 -c 'import json, sys, jsonschema
from json_prefix_check import completable
params = {"get_weather": json.loads(sys.argv[3]), "other": {"type": "object"}}
mine = json.loads(open(sys.argv[1]).readline())
openai = json.loads(open(sys.argv[4]).readline())
plain = json.loads(open(sys.argv[2]).readline())
def whole_items(t):
    """the items of a JSON list written whole, where the text is the list or its start"""
    dec, i, items = json.JSONDecoder(), t.index("[") + 1, []
    while True:
        while i < len(t) and t[i] in " \t\n\r,": i += 1
        try:
            v, i = dec.raw_decode(t, i)
        except ValueError:
            return items
        items.append(v)
n_calls = ended = 0
body = openai["response"]["body"]["choices"]
for j, (r, g) in enumerate(zip(mine["choices"], plain["choices"])):
    t = g["text"]
    assert r["text"] == "" and r["token_ids"] == g["token_ids"], (r, g)
    if r["finish_reason"] == "tool_calls":
        assert g["finish_reason"] == "stop", g
        items = json.loads(t)
        ended += 1
    else:
        assert r["finish_reason"] == g["finish_reason"] == "length" and completable(t, list), (r, g)
        items = whole_items(t)
    want = [(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in r["tool_calls"]]
    assert got == want, (got, want, t)
    for name, args in got:
        jsonschema.validate(json.loads(args), params[name])
    n_calls += len(got)
    o = body[j]
    assert o["message"]["content"] is None and o["finish_reason"] == r["finish_reason"], o
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in o["message"]["tool_calls"]] == got, o
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in o["message"]["tool_calls"]), o
assert ended >= 1 and n_calls >= 2, (ended, n_calls)
print("json_schema: tool_choice required: %d of 4 lists ended, %d calls, each valid" % (ended, n_calls))' \
    "$TMP/required.jsonl" "$TMP/required_as_json.jsonl" "$params" "$TMP/required_openai.jsonl" ||
    fail "tool_choice required: $(cat "$TMP/required.jsonl" "$TMP/required_as_json.jsonl")"
echo "json_schema: PASS"
