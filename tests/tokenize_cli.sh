#!/bin/sh
# tpinfer --tokenize / --detokenize on a directory holding only the tokenizer files (no
# weights, no config.json needed): ids and texts equal Hugging Face's references, chat
# messages render as transformers renders them, and a bad line is an error record.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "$PYTHON3" != no ] || skip "python3 not found"
for model in tiny-llama3 tiny-qwen3 stories260K-hf; do
    src="$MODELS/$model"
    d="$TMP/$model"
    mkdir -p "$d"
    cp "$src/tokenizer.json" "$d/"
    [ -f "$src/tokenizer_config.json" ] && cp "$src/tokenizer_config.json" "$d/"
    "$PYTHON3" - "$src/reference/tokens.json" "$TMP/in.jsonl" "$TMP/want.jsonl" "$TMP/ids.jsonl" "$TMP/wanttext.jsonl" "$TMP/bad.json" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
cases = ref["cases"][:20]
with open(sys.argv[2], "w") as f, open(sys.argv[3], "w") as w, open(sys.argv[4], "w") as i, open(sys.argv[5], "w") as t:
    for c in cases:
        f.write(json.dumps({"text": c["text"], "add_special_tokens": True}) + "\n")
        w.write(json.dumps(c["ids"]) + "\n")
        i.write(json.dumps({"ids": c["ids"], "skip_special_tokens": True}) + "\n")
        t.write(json.dumps(c["decode_skip_special"]) + "\n")
    if "chat" in ref:
        f.write(json.dumps({"messages": ref["chat"]["messages"], "add_generation_prompt": True}) + "\n")
        w.write(json.dumps(ref["chat"]["ids"]) + "\n")
    # bad lines, each an error record saying what is wrong (written to the last argument)
    bad = [('{"text": 42}', None), ('[1, 2]', "a line must be a JSON object"),
           ('{"messages": 5}', '"messages" must be an array')]
    if "chat" in ref:
        bad.append(('{"messages": [{"role": "user", "content": "x"}], "tools": 5}', '"tools" must be an array'))
    for line, _ in bad:
        f.write(line + "\n")
    json.dump([m for _, m in bad], open(sys.argv[6], "w"))
PY
    rc=0
    "$TPINFER" --model "$d" --tokenize --input "$TMP/in.jsonl" --output "$TMP/out.jsonl" 2>"$TMP/err" || rc=$?
    [ $rc -eq 2 ] || { cat "$TMP/err"; fail "$model: --tokenize with bad lines exited $rc, wanted 2"; }
    "$PYTHON3" - "$TMP/out.jsonl" "$TMP/want.jsonl" "$TMP/bad.json" <<'PY' || fail "$model: --tokenize ids differ from Hugging Face, or a bad line's record"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
bad = json.load(open(sys.argv[3]))
assert len(out) == len(want) + len(bad), (len(out), len(want), len(bad))
for o, w in zip(out, want):
    assert o["ids"] == w, (o, w)
for k, message in enumerate(bad):
    o = out[len(want) + k]
    assert "error" in o and o["error"]["line"] == len(want) + k + 1, o
    assert message is None or message in o["error"]["message"], (o, message)
PY
    "$TPINFER" --model "$d" --detokenize --input "$TMP/ids.jsonl" --output "$TMP/text.jsonl" 2>"$TMP/err" ||
        { cat "$TMP/err"; fail "$model: --detokenize"; }
    "$PYTHON3" - "$TMP/text.jsonl" "$TMP/wanttext.jsonl" <<'PY' || fail "$model: --detokenize text differs from Hugging Face"
import json, sys
for o, w in zip(open(sys.argv[1]), open(sys.argv[2])):
    assert json.loads(o)["text"] == json.loads(w), (o, w)
PY
    echo "$model: --tokenize and --detokenize match"
done
exit 0
