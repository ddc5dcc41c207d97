#!/bin/sh
# "echo": true on completions (OpenAI's, as vLLM does it), on stories260K: the text is the
# prompt's then the completion's, as Hugging Face's tokenizers decode the prompt's ids and the
# generated ones in a row; the tokens drawn are the same as without echo; with max_tokens 0
# the output is the prompt alone; with logprobs the OpenAI body's logprobs list the prompt's
# tokens first (the first one null), their logprobs those "prompt_logprobs" gives, and
# text_offset where each token starts in the echoed text. A chat line cannot echo, nor can
# max_tokens be 0 without echo: error records beside lines that run.
. "$top_srcdir/tests/lib.sh"
need_shared
python3 -c "import tokenizers" 2>/dev/null || skip "python3 with the tokenizers package is needed (pip install tokenizers)"
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
py() { python3 -c "$@"; }

run_lines plain '{"id": "a", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}' \
    '{"id": "b", "prompt": "Lily and Tom", "max_tokens": 10, "temperature": 0.9, "seed": 3, "n": 2}' \
    '{"id": "c", "prompt": "The dog", "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}'
run_lines echo '{"id": "a", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "echo": true}' \
    '{"id": "b", "prompt": "Lily and Tom", "max_tokens": 10, "temperature": 0.9, "seed": 3, "n": 2, "echo": true}' \
    '{"id": "c", "prompt": "The dog", "max_tokens": 0, "echo": true, "logprobs": 2}' \
    '{"id": "d", "prompt_token_ids": [1, 403, 407, 261], "max_tokens": 0, "echo": true, "n": 2}'
py 'import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[3] + "/tokenizer.json")
plain = {d["id"]: d for d in map(json.loads, open(sys.argv[1]))}
echo = {d["id"]: d for d in map(json.loads, open(sys.argv[2]))}
for i, prompt in (("a", "Once upon a time"), ("b", "Lily and Tom")):
    ids = tok.encode(prompt).ids
    for p, e in zip(plain[i].get("choices", [plain[i]]), echo[i].get("choices", [echo[i]])):
        assert e["token_ids"] == p["token_ids"], (i, "echo changed the tokens drawn")
        assert e["finish_reason"] == p["finish_reason"] == "length", (i, e, p)
        want = tok.decode(ids + p["token_ids"], skip_special_tokens=True)
        assert e["text"] == want and e["text"].startswith(prompt), (i, e["text"], want)
c, d = echo["c"], echo["d"]
assert c["text"] == "The dog" and c["token_ids"] == [] and c["logprobs"] == [], c
assert c["usage"]["completion_tokens"] == 0 and c["finish_reason"] == "length", c
assert c["prompt_logprobs"] == plain["c"]["prompt_logprobs"], (c["prompt_logprobs"], plain["c"]["prompt_logprobs"])
assert [x["text"] for x in d["choices"]] == [tok.decode([1, 403, 407, 261], skip_special_tokens=True)] * 2, d
' "$TMP/plain.jsonl" "$TMP/echo.jsonl" "$m" || fail "echo in plain lines: $(cat "$TMP/echo.jsonl")"

# OpenAI bodies: the prompt's tokens first in logprobs
body='"prompt": "Lily", "max_tokens": 6, "temperature": 0, "logprobs": 2'
run_lines openai "{\"custom_id\": \"e\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {$body, \"echo\": true}}" \
    "{\"custom_id\": \"p\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {$body, \"prompt_logprobs\": 2}}"
py 'import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2] + "/tokenizer.json")
by = {d["custom_id"]: d["response"]["body"]["choices"][0] for d in map(json.loads, open(sys.argv[1]))}
e, p = by["e"], by["p"]
prompt_ids = tok.encode("Lily").ids
n = len(prompt_ids)
lp, plp = e["logprobs"], p["prompt_logprobs"]
assert len(lp["tokens"]) == n + len(p["logprobs"]["tokens"]), lp
assert lp["tokens"][n:] == p["logprobs"]["tokens"] and lp["token_logprobs"][n:] == p["logprobs"]["token_logprobs"], (lp, p)
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
for i in range(1, n):
    own = plp[i][str(prompt_ids[i])]
    assert lp["token_logprobs"][i] == own["logprob"], (i, lp["token_logprobs"][i], own)
    assert len(lp["top_logprobs"][i]) >= min(2, len(plp[i])), (i, lp["top_logprobs"][i], plp[i])
# the completion read after the prompt: "Lily" then its text, the space SentencePiece drops
# at the start of a text back in place (the plain lines above check the whole text exactly)
assert e["text"] in ("Lily" + p["text"], "Lily " + p["text"]), (e["text"], p["text"])
offs = lp["text_offset"]
assert offs == sorted(offs) and offs[0] == 0 and offs[-1] < len(e["text"]), offs
' "$TMP/openai.jsonl" "$m" || fail "echo in an OpenAI body: $(cat "$TMP/openai.jsonl")"

# what cannot run
run_lines_with_errors bad '{"id": "ok", "prompt": "Lily", "max_tokens": 0, "echo": true}' \
    '{"id": "e1", "messages": [{"role": "user", "content": "hi"}], "echo": true}' \
    '{"id": "e2", "prompt": "Lily", "max_tokens": 0}' \
    '{"id": "e3", "prompt": "Lily", "max_tokens": 0, "echo": true, "max_completion_tokens": 4}' \
    '{"id": "e4", "prompt": "Lily", "echo": "yes"}'
for want in 'e1.*\\"echo\\" is for completions' 'e2.*\\"max_tokens\\" 0 is outside \[1, 2147483647\]' \
    'e3.*give one' 'e4.*\\"echo\\" must be'; do
    grep -q "\"id\":\"$want" "$TMP/bad.jsonl" || fail "no error record matching $want: $(cat "$TMP/bad.jsonl")"
done
grep -q '"id":"ok","text":"Lily","token_ids":\[\]' "$TMP/bad.jsonl" || fail "the good line: $(cat "$TMP/bad.jsonl")"
echo "echo: PASS"
