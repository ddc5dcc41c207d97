#!/bin/sh
# Requests end to end: OpenAI batch lines in and out (completions and chat), TensorRT-LLM
# lines, JSONL with stop strings, stop_token_ids, n, logprobs and prompt_logprobs; a bad
# line becomes an error record without losing its neighbours; --errors and --ordered;
# the exit status says some requests failed.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "$PYTHON3" != no ] || skip "python3 not found"
export OMP_NUM_THREADS=1
st="$MODELS/stories260K-hf"
qw="$MODELS/tiny-qwen2"
py() { "$PYTHON3" - "$@"; }

# 1. OpenAI batch: completions, chat, a broken line and a prompt too long for the context
cat >"$TMP/openai.jsonl" <<'EOF2'
{"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "Once upon a time", "max_tokens": 12, "logprobs": 2}}
{"custom_id": "bad", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 5,
{"custom_id": "c2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hello! What is 2+2?"}], "max_tokens": 8, "logprobs": true, "top_logprobs": 1}}
{"custom_id": "long", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 100000}}
EOF2
rc=0
"$TPINFER" --model "$qw" --input "$TMP/openai.jsonl" --output "$TMP/openai.out" --ordered 2>"$TMP/err" || rc=$?
[ $rc -eq 4 ] || { cat "$TMP/err"; fail "OpenAI batch with failures: exit $rc, wanted 4"; }
py "$TMP/openai.out" <<'PY' || fail "OpenAI batch output"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
# an unreadable line is known by its line number, as "line N"
assert [l["custom_id"] for l in lines] == ["c1", "line 2", "c2", "long"], [l["custom_id"] for l in lines]
c1, bad, c2, long_ = lines
assert c1["response"]["status_code"] == 200 and c1["error"] is None
b = c1["response"]["body"]
assert b["object"] == "text_completion" and b["usage"]["completion_tokens"] <= 12
lp = b["choices"][0]["logprobs"]
assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == b["usage"]["completion_tokens"]
assert all(len(t) <= 2 for t in lp["top_logprobs"])
assert "".join(lp["tokens"]) == b["choices"][0]["text"] or b["choices"][0]["finish_reason"] == "stop"
assert bad["response"]["status_code"] == 400 and bad["response"]["body"]["error"]["code"] == "invalid_json"
b2 = c2["response"]["body"]
assert b2["object"] == "chat.completion" and b2["choices"][0]["message"]["role"] == "assistant"
assert len(b2["choices"][0]["logprobs"]["content"]) == b2["usage"]["completion_tokens"]
assert long_["response"]["status_code"] == 400
assert long_["response"]["body"]["error"]["code"] == "context_length_exceeded", long_
PY

# 2. the chat rendering is the model's (tokens.json "chat" of the reference)
py "$qw/reference/tokens.json" "$TMP/chat.jsonl" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["chat"]
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({"id": "chat", "messages": ref["messages"], "max_tokens": 1}) + "\n")
PY
"$TPINFER" --model "$qw" --input "$TMP/chat.jsonl" --output "$TMP/chat.out" 2>"$TMP/err" || { cat "$TMP/err"; fail "chat"; }
py "$qw/reference/tokens.json" "$TMP/chat.out" <<'PY' || fail "chat prompt differs from transformers' apply_chat_template"
import json, sys
ref = json.load(open(sys.argv[1]))["chat"]
out = json.loads(open(sys.argv[2]).readline())
assert out["usage"]["prompt_tokens"] == len(ref["ids"]), (out["usage"], len(ref["ids"]))
PY
# the template as transformers >= 4.52 saves it: chat_template.jinja (none in tokenizer_config.json)
# renders the same; where both are, the file's wins (as transformers reads them); a multimodal
# model's processor's chat_template.json where the tokenizer has none (as vLLM reads it); none:
# the request's error record says so; a chat_template.json that is not JSON: the load says where
for how in jinja both processor none; do
    m=$TMP/qw-$how
    mkdir -p "$m"
    for f in "$qw"/*; do [ "$(basename "$f")" = tokenizer_config.json ] || ln -sf "$f" "$m/"; done
    py "$qw/tokenizer_config.json" "$m" "$how" <<'PY'
import json, os, sys
cfg = json.load(open(sys.argv[1]))
template = cfg.pop("chat_template") if sys.argv[3] != "both" else "{{ 'Zebra zebra zebra' }}" + cfg["chat_template"]
json.dump(cfg, open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w"))
if sys.argv[3] == "processor":
    json.dump({"chat_template": template}, open(os.path.join(sys.argv[2], "chat_template.json"), "w"))
elif sys.argv[3] != "none":
    open(os.path.join(sys.argv[2], "chat_template.jinja"), "w").write(template)
PY
    "$TPINFER" --model "$m" --input "$TMP/chat.jsonl" --output "$TMP/chat-$how.out" 2>"$TMP/err" ||
        [ $how = none ] || { cat "$TMP/err"; fail "chat ($how)"; }
    py "$qw/reference/tokens.json" "$TMP/chat-$how.out" "$how" <<'PY' || fail "chat_template.jinja ($how): $(cat "$TMP/chat-$how.out")"
import json, sys
ref = json.load(open(sys.argv[1]))["chat"]
out = json.loads(open(sys.argv[2]).readline())
if sys.argv[3] == "none":
    assert "no chat_template.jinja, tokenizer_config.json's chat_template or chat_template.json" in out["message"], out
elif sys.argv[3] == "both":
    assert out["usage"]["prompt_tokens"] > len(ref["ids"]), (out["usage"], len(ref["ids"]))
else:
    assert out["usage"]["prompt_tokens"] == len(ref["ids"]), (out["usage"], len(ref["ids"]))
PY
done
# an error naming the template names the file it came from
printf '{%% if false %%}x{%% endif %%}' >"$TMP/qw-jinja/chat_template.jinja"
"$TPINFER" --model "$TMP/qw-jinja" --input "$TMP/chat.jsonl" --output "$TMP/chat-empty.out" 2>"$TMP/err"
grep -q "the chat template (the model's chat_template.jinja) renders these messages as no text" "$TMP/chat-empty.out" ||
    { cat "$TMP/chat-empty.out" "$TMP/err"; fail "an empty rendering does not name chat_template.jinja"; }
printf '{"chat_template": ' >"$TMP/qw-none/chat_template.json"
"$TPINFER" --model "$TMP/qw-none" --input "$TMP/chat.jsonl" --output "$TMP/chat-bad.out" 2>"$TMP/err" &&
    fail "a chat_template.json that is not JSON was taken"
grep -q "qw-none/chat_template.json: invalid JSON at line 1" "$TMP/err" || { cat "$TMP/err"; fail "chat_template.json not JSON"; }
printf '{"chat_template": 5}' >"$TMP/qw-none/chat_template.json"
"$TPINFER" --model "$TMP/qw-none" --input "$TMP/chat.jsonl" --output "$TMP/chat-bad.out" 2>"$TMP/err" &&
    fail "a chat_template.json whose chat_template is a number was taken"
grep -q 'qw-none/chat_template.json: "chat_template" must be a string' "$TMP/err" || { cat "$TMP/err"; fail "chat_template.json's number"; }
printf 'a\000b' >"$TMP/qw-none/chat_template.jinja"
"$TPINFER" --model "$TMP/qw-none" --input "$TMP/chat.jsonl" --output "$TMP/chat-bad.out" 2>"$TMP/err" &&
    fail "a chat_template.jinja with a NUL byte was taken"
grep -q "qw-none/chat_template.jinja: a NUL byte at offset 1" "$TMP/err" || { cat "$TMP/err"; fail "chat_template.jinja's NUL"; }

# 3. JSONL on stories260K: stop strings, stop_token_ids, n, prompt_logprobs, TRT-LLM lines
cat >"$TMP/jsonl.jsonl" <<'EOF2'
{"id": "plain", "prompt": "Once upon a time", "max_tokens": 40}
{"id": "stop", "prompt": "Once upon a time", "max_tokens": 40, "stop": ["Lily", "zzz"]}
{"id": "stop-incl", "prompt": "Once upon a time", "max_tokens": 40, "stop": "Lily", "include_stop_str_in_output": true}
{"id": "stop-id", "prompt": "Once upon a time", "max_tokens": 40, "stop_token_ids": [286]}
{"id": "n3", "prompt": "Once upon a time", "max_tokens": 10, "n": 3, "temperature": 1.0, "seed": 5}
{"id": "plp", "prompt": "Once upon a time", "max_tokens": 2, "prompt_logprobs": 1}
EOF2
"$TPINFER" --model "$st" --input "$TMP/jsonl.jsonl" --output "$TMP/a.out" --ordered 2>"$TMP/err" || { cat "$TMP/err"; fail "jsonl"; }
mpi 2 "$TPINFER" --model "$st" --tp 2 --input "$TMP/jsonl.jsonl" --output "$TMP/b.out" --ordered 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "jsonl at tp 2"; }
py "$TMP/a.out" "$TMP/b.out" <<'PY' || fail "JSONL output"
import json, sys
a = {l["id"]: l for l in map(json.loads, open(sys.argv[1]))}
b = {l["id"]: l for l in map(json.loads, open(sys.argv[2]))}
plain = a["plain"]["text"]
assert plain.startswith(", there was a little girl named Lily"), plain
i = plain.index("Lily")
assert a["stop"]["text"] == plain[:i] and a["stop"]["finish_reason"] == "stop", a["stop"]
assert a["stop-incl"]["text"] == plain[:i + 4] and a["stop-incl"]["finish_reason"] == "stop"
ids = a["plain"]["token_ids"]
k = ids.index(286)
assert a["stop-id"]["token_ids"] == ids[:k + 1] and a["stop-id"]["finish_reason"] == "stop"
assert a["plain"]["finish_reason"] == "length" and len(ids) == 40
n3 = a["n3"]["choices"]
assert len(n3) == 3 and all(len(c["token_ids"]) == 10 for c in n3)
assert len({tuple(c["token_ids"]) for c in n3}) > 1, "n=3 choices should differ at temperature 1"
assert a["n3"]["usage"]["completion_tokens"] == 30
assert a["n3"]["choices"] == b["n3"]["choices"], "sampling differs between tp 1 and tp 2"
plp = a["plp"]["prompt_logprobs"]
assert plp[0] is None and len(plp) == a["plp"]["usage"]["prompt_tokens"]
assert all(len(e) in (1, 2) for e in plp[1:])
for k in a:
    if k != "n3":
        assert a[k]["token_ids"] == b[k]["token_ids"], k
PY
# sampling depends on (seed, id, step) only: the same request alone, and with a batch of
# four at a time in 5-token chunks, samples the same tokens
grep '"id": "n3"' "$TMP/jsonl.jsonl" >"$TMP/n3.jsonl"
"$TPINFER" --model "$st" --input "$TMP/n3.jsonl" --output "$TMP/n3.out" 2>"$TMP/err" || { cat "$TMP/err"; fail "n3 alone"; }
"$TPINFER" --model "$st" --input "$TMP/jsonl.jsonl" --output "$TMP/c.out" --max-num-seqs 4 --max-num-batched-tokens 5 \
    2>"$TMP/err" || { cat "$TMP/err"; fail "small batches"; }
py "$TMP/n3.out" "$TMP/a.out" "$TMP/c.out" <<'PY' || fail "sampling depends on the batch"
import json, sys
alone = json.loads(open(sys.argv[1]).readline())
a = {l["id"]: l for l in map(json.loads, open(sys.argv[2]))}
c = {l["id"]: l for l in map(json.loads, open(sys.argv[3]))}
assert alone["choices"] == a["n3"]["choices"] == c["n3"]["choices"]
for k in a:
    assert a[k]["token_ids"] == c[k]["token_ids"], k
PY
printf '%s\n' '{"task_id": 7, "input_ids": [1, 403, 407, 261, 378], "output_tokens": 16}' >"$TMP/trt.jsonl"
"$TPINFER" --model "$st" --input "$TMP/trt.jsonl" --output "$TMP/trt.out" --ignore-eos 2>"$TMP/err" || { cat "$TMP/err"; fail "trtllm"; }
py "$TMP/trt.out" "$TMP/a.out" <<'PY' || fail "TRT-LLM line"
import json, sys
t = json.loads(open(sys.argv[1]).readline())
a = {l["id"]: l for l in map(json.loads, open(sys.argv[2]))}
assert t["id"] == "7" and t["usage"]["completion_tokens"] == 16
assert t["token_ids"] == a["plain"]["token_ids"][:16]
PY

# 3b. vLLM's and OpenAI's semantics where they are easy to get wrong: "logprobs": false is
# none; a chat line without max_tokens runs to the context's end (unless --max-tokens); a
# line's own seed alone names its stream; stop_reason; a stop token's text kept with
# include_stop_str_in_output; completions' top_logprobs always hold the sampled token and
# text_offset counts characters; a completion's prompt_logprobs are its choice's
cat >"$TMP/sem-qw.jsonl" <<'EOF2'
{"custom_id": "lp-false", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hello there"}], "logprobs": false, "max_tokens": 3}}
{"custom_id": "room", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hello there"}], "ignore_eos": true}}
{"custom_id": "offs", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "logprobs": 2, "max_tokens": 5}}
EOF2
"$TPINFER" --model "$qw" --input "$TMP/sem-qw.jsonl" --output "$TMP/sem-qw.out" --ordered --max-model-len 64 \
    --dump-logits "$TMP/sem-dump" 2>"$TMP/err" || { cat "$TMP/err"; fail "OpenAI semantics (tiny-qwen2)"; }
"$TPINFER" --model "$qw" --input "$TMP/sem-qw.jsonl" --output "$TMP/sem-qw16.out" --ordered --max-model-len 64 \
    --max-tokens 16 2>"$TMP/err" || { cat "$TMP/err"; fail "OpenAI semantics with --max-tokens"; }
py "$TMP/sem-qw.out" "$TMP/sem-qw16.out" <<'PY' || fail "OpenAI semantics (logprobs false, chat max_tokens, text_offset)"
import json, sys
a = {l["custom_id"]: l["response"]["body"] for l in map(json.loads, open(sys.argv[1]))}
b16 = {l["custom_id"]: l["response"]["body"] for l in map(json.loads, open(sys.argv[2]))}
assert a["lp-false"]["choices"][0]["logprobs"] is None, a["lp-false"]
room = a["room"]
assert room["usage"]["completion_tokens"] == 64 - room["usage"]["prompt_tokens"] > 16, room["usage"]
assert room["choices"][0]["finish_reason"] == "length" and room["choices"][0]["stop_reason"] is None
assert b16["room"]["usage"]["completion_tokens"] == 16, b16["room"]["usage"]
# --dump-logits keeps every step's row of a line that may run to the context (its rows grow as it goes)
import os, struct
raw = open(os.path.join(os.path.dirname(sys.argv[1]), "sem-dump", "room.safetensors"), "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert head["logits"]["shape"][0] == room["usage"]["completion_tokens"], head["logits"]
lp = a["offs"]["choices"][0]["logprobs"]
toks, offs = lp["tokens"], lp["text_offset"]
assert any(ord(ch) > 127 for t in toks for ch in t), "no non-ASCII token to count: %r" % toks
assert offs == [sum(len(t) for t in toks[:i]) for i in range(len(toks))], (toks, offs)
for t, top in zip(toks, lp["top_logprobs"]):
    assert t in top and len(top) <= 3, (t, top)
PY
# the manifest says how chat lines without max_tokens end only where the input has some; an
# earlier run's manifest without it (such lines cut at --max-tokens) is refused with what to do
py "$TMP/sem-qw.out.manifest.json" "$TMP/sem-qw16.out.manifest.json" <<'PY' || fail "chat_max_tokens in the manifest"
import json, sys
a, b = (json.load(open(f))["settings"] for f in sys.argv[1:3])
assert a.get("chat_max_tokens") == "the context (no --max-tokens)" and "chat_max_tokens" not in b, (a, b)
m = json.load(open(sys.argv[1]))
del m["settings"]["chat_max_tokens"]
json.dump(m, open(sys.argv[1], "w"))
PY
head -1 "$TMP/sem-qw.out" >"$TMP/sem-qw.part" && mv "$TMP/sem-qw.part" "$TMP/sem-qw.out"
rc=0
"$TPINFER" --model "$qw" --input "$TMP/sem-qw.jsonl" --output "$TMP/sem-qw.out" --ordered --max-model-len 64 --resume \
    2>"$TMP/err" || rc=$?
[ $rc -ne 0 ] && grep -q 'settings.chat_max_tokens differs.*give the same --max-tokens to resume it' "$TMP/err" ||
    { cat "$TMP/err"; fail "resuming an earlier run whose chat lines stopped at --max-tokens: exit $rc"; }
"$TPINFER" --model "$qw" --input "$TMP/sem-qw.jsonl" --output "$TMP/sem-qw.out" --ordered --max-model-len 64 --resume \
    --max-tokens 16 2>"$TMP/err" || { cat "$TMP/err"; fail "resuming with the earlier run's --max-tokens"; }
[ "$(wc -l <"$TMP/sem-qw.out")" -eq 3 ] || fail "the resumed run did not finish the batch"
cat >"$TMP/sem-st.jsonl" <<'EOF2'
{"id": "s1", "prompt": "Once upon a time", "temperature": 1.0, "seed": 42, "max_tokens": 12}
{"id": "s2", "prompt": "Once upon a time", "temperature": 1.0, "seed": 42, "max_tokens": 12}
{"id": "u1", "prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 12}
{"id": "u2", "prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 12}
{"id": "plain", "prompt": "Once upon a time", "max_tokens": 40}
{"id": "str", "prompt": "Once upon a time", "max_tokens": 40, "stop": ["zzz", "Lily"]}
{"id": "tok", "prompt": "Once upon a time", "max_tokens": 40, "stop_token_ids": [286]}
{"id": "tok-incl", "prompt": "Once upon a time", "max_tokens": 40, "stop_token_ids": [286], "include_stop_str_in_output": true}
{"id": "nl", "prompt": "Once upon a time", "max_tokens": 60, "stop_token_ids": [13]}
{"id": "nl-incl", "prompt": "Once upon a time", "max_tokens": 60, "stop_token_ids": [13], "include_stop_str_in_output": true}
{"id": "nl-next", "prompt": "Once upon a time", "max_tokens": 60, "stop_token_ids": [438]}
{"id": "m0", "prompt": "Once upon a time there was a girl named Lily. She was happy. The end.", "max_tokens": 3, "logprobs": 3, "stop_token_ids": [385]}
{"id": "m1", "prompt": "Once upon a time there was a girl named Lily. She was happy. The end.", "max_tokens": 3, "logprobs": 3, "stop_token_ids": [385], "min_tokens": 2}
EOF2
cat >"$TMP/sem-oa.jsonl" <<'EOF2'
{"custom_id": "c0", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 3, "logprobs": 0, "prompt_logprobs": 1}}
{"custom_id": "chat-plp", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": 1}}
EOF2
printf '%s' "{% for m in messages %}{{ m['content'] }}{% endfor %}" >"$TMP/plain.jinja"
for f in sem-st sem-oa; do
    "$TPINFER" --model "$st" --input "$TMP/$f.jsonl" --output "$TMP/$f.out" --ordered \
        --chat-template "$TMP/plain.jinja" 2>"$TMP/err" || { cat "$TMP/err"; fail "vLLM semantics (stories260K, $f)"; }
done
py "$TMP/sem-st.out" "$TMP/sem-oa.out" <<'PY' || fail "vLLM semantics (seed, stop_reason, stop token text, completions logprobs)"
import json, sys
a = {}
for l in [*map(json.loads, open(sys.argv[1])), *map(json.loads, open(sys.argv[2]))]:
    a[l.get("custom_id") or l["id"]] = l
assert a["s1"]["text"] == a["s2"]["text"], "the same seed and request, different completions"
assert a["u1"]["text"] != a["u2"]["text"], "without a seed the id should name the stream"
assert a["plain"]["stop_reason"] is None and a["plain"]["finish_reason"] == "length"
assert a["str"]["stop_reason"] == "Lily" and a["str"]["finish_reason"] == "stop", a["str"]
ids = a["plain"]["token_ids"]
k = ids.index(286)
assert a["tok"]["stop_reason"] == 286 and a["tok"]["token_ids"] == ids[:k + 1]
assert a["tok-incl"]["token_ids"] == ids[:k + 1] and a["tok-incl"]["stop_reason"] == 286
assert a["tok-incl"]["text"].startswith(a["tok"]["text"]) and len(a["tok-incl"]["text"]) > len(a["tok"]["text"]), \
    (a["tok"]["text"], a["tok-incl"]["text"])
c0 = a["c0"]["response"]["body"]
ch = c0["choices"][0]
assert "prompt_logprobs" not in c0 and ch["prompt_logprobs"][0] is None, c0
lp = ch["logprobs"]
assert all(list(top) == [t] for t, top in zip(lp["tokens"], lp["top_logprobs"])), lp
assert [top[t] for t, top in zip(lp["tokens"], lp["top_logprobs"])] == lp["token_logprobs"]
# a byte-fallback token (13 is <0x0A>, "\n") the detokenizer holds back is text at a stop by
# token: the stop token's own with include_stop_str_in_output, the ones before it always
assert a["nl"]["token_ids"][-1] == 13 and not a["nl"]["text"].endswith("\n"), a["nl"]
assert a["nl-incl"]["text"] == a["nl"]["text"] + "\n", (a["nl"]["text"], a["nl-incl"]["text"])
assert a["nl-next"]["token_ids"][-2:] == [13, 438] and a["nl-next"]["text"] == a["nl-incl"]["text"], a["nl-next"]
# min_tokens bans the end tokens from the draw, not from the raw logprobs (vLLM's)
m0, m1 = a["m0"]["logprobs"][0], a["m1"]["logprobs"][0]
assert m0["id"] == 385 and a["m0"]["token_ids"] == [385], a["m0"]
assert m1["id"] != 385 and m1["top_logprobs"] == m0["top_logprobs"], (m0, m1)
assert any(t["id"] == m1["id"] and abs(t["logprob"] - m1["logprob"]) < 1e-6 for t in m0["top_logprobs"]), (m0, m1)
cp = a["chat-plp"]["response"]["body"]
assert cp["prompt_logprobs"][0] is None and "prompt_logprobs" not in cp["choices"][0], cp
PY

# 3c. tools: the template renders them (as apply_chat_template(tools=)); with "tool_choice":
# "none" the completion is text; with "auto" (OpenAI's default) the line needs --tool-call-parser
# (without it, an error record saying so), with it the calls are parsed out of the text (this
# random model writes none: the text is the content); "required" is a list of calls held to
# the tools (json_schema.sh checks them; here: cut by max_tokens, no call whole yet);
# --tokenize renders them too
printf '%s' "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m['content'] }}{% endfor %}" \
    >"$TMP/tools.jinja"
cat >"$TMP/tools.jsonl" <<'EOF2'
{"id": "t-none", "messages": [{"role": "user", "content": "Once upon a time"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}], "tool_choice": "none", "max_tokens": 3}
{"id": "t-auto", "messages": [{"role": "user", "content": "Once upon a time"}], "tools": [{"type": "function", "function": {"name": "get_weather"}}], "max_tokens": 3}
{"id": "plain", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 3}
{"id": "t-required", "messages": [{"role": "user", "content": "Once upon a time"}], "tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": "required", "max_tokens": 3}
EOF2
rc=0
"$TPINFER" --model "$st" --input "$TMP/tools.jsonl" --output "$TMP/tools.out" --ordered --chat-template "$TMP/tools.jinja" \
    2>"$TMP/err" || rc=$?
[ $rc -eq 4 ] || { cat "$TMP/err"; fail "tools: exit $rc, wanted 4 (error records)"; }
rc=0
"$TPINFER" --model "$st" --input "$TMP/tools.jsonl" --output "$TMP/tools-parsed.out" --ordered \
    --chat-template "$TMP/tools.jinja" --tool-call-parser hermes 2>"$TMP/err" || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/err"; fail "tools, --tool-call-parser hermes: exit $rc, wanted 0"; }
rc=0
"$TPINFER" --model "$st" --input "$TMP/tools.jsonl" --output "$TMP/tools-bad.out" --tool-call-parser qwen 2>"$TMP/err" || rc=$?
[ $rc -ne 0 ] && grep -q -- "--tool-call-parser: 'qwen' is not allowed; give hermes" "$TMP/err" && [ ! -s "$TMP/tools-bad.out" ] ||
    { cat "$TMP/err"; fail "--tool-call-parser qwen: exit $rc"; }
"$TPINFER" --tokenize --model "$st" --chat-template "$TMP/tools.jinja" --input "$TMP/tools.jsonl" --output "$TMP/tools.tok" \
    2>"$TMP/err" || { cat "$TMP/err"; fail "tools: --tokenize"; }
py "$TMP/tools.out" "$TMP/tools.tok" <<'PY' || fail "tools rendered into the prompt"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
tok = [json.loads(l) for l in open(sys.argv[2])]
assert tok[0]["text"] == "[get_weather]Once upon a time" and tok[2]["text"] == "Once upon a time", tok
assert out[0]["id"] == "t-none" and out[0]["usage"]["prompt_tokens"] == len(tok[0]["ids"]), (out[0], tok[0])
assert out[0]["usage"]["prompt_tokens"] > out[2]["usage"]["prompt_tokens"], out
assert out[1]["code"] == "invalid_request" and "no --tool-call-parser was given" in out[1]["message"] \
    and out[1]["message"].startswith("line 2: tools with"), out[1]
r = out[3]
assert r["id"] == "t-required" and r["tool_calls"] == [] and r["text"] == "" and r["finish_reason"] == "length", r
assert r["usage"]["completion_tokens"] == 3, r
PY
# a template that writes hermes' marker: the error record names the parser to give
printf '%s' "{% if false %}<tool_call>{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}" >"$TMP/hermes.jinja"
sed -n 2p "$TMP/tools.jsonl" >"$TMP/tools-auto.jsonl"
"$TPINFER" --model "$st" --input "$TMP/tools-auto.jsonl" --output "$TMP/tools-hint.out" --chat-template "$TMP/hermes.jinja" \
    2>"$TMP/err" && fail "tools without a parser: exit 0"
grep -q 'the chat template writes <tool_call>: --tool-call-parser hermes)' "$TMP/tools-hint.out" ||
    fail "tools without a parser, hermes' template: $(cat "$TMP/tools-hint.out")"
py "$TMP/tools-parsed.out" "$TMP/tools.out" <<'PY' || fail "tools with --tool-call-parser"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
before = [json.loads(l) for l in open(sys.argv[2])]
a = out[1]
assert a["id"] == "t-auto" and "code" not in a and "tool_calls" not in a, a
assert a["finish_reason"] in ("stop", "length") and a["usage"]["prompt_tokens"] == out[0]["usage"]["prompt_tokens"], a
# the other lines are as without the parser
assert out[0] == before[0] and out[2] == before[2] and out[3] == before[3], out
PY

# 4. --errors: error records apart; good lines around a bad one all run
printf '%s\n' '{"id": "a", "prompt": "Once"}' '{"id": "b", "prompt": "x", "top_p": 1.5}' '{"id": "c", "prompt": "Once"}' >"$TMP/mixed.jsonl"
rc=0
"$TPINFER" --model "$st" --input "$TMP/mixed.jsonl" --output "$TMP/m.out" --errors "$TMP/m.err" 2>"$TMP/err" || rc=$?
[ $rc -eq 4 ] || fail "one bad request: exit $rc, wanted 4"
[ "$(wc -l <"$TMP/m.out")" -eq 2 ] && [ "$(wc -l <"$TMP/m.err")" -eq 1 ] || fail "--errors did not separate the records"
grep -q '"code":"invalid_request"' "$TMP/m.err" && grep -q '"line":2' "$TMP/m.err" || fail "error record: $(cat "$TMP/m.err")"

# 4b. a misspelt field runs as if absent with a warning naming it and its first line; a field
# asking for what tpinfer does not do (suffix) is an error record, its neighbours run
printf '%s\n' '{"id": "t1", "prompt": "Once", "max_token": 2, "model": "m"}' \
    '{"id": "t2", "prompt": "Once", "max_tokens": 2, "suffix": "end"}' \
    '{"id": "t3", "prompt": "Once", "max_tokens": 2, "max_token": 9}' >"$TMP/typo.jsonl"
rc=0
"$TPINFER" --model "$st" --input "$TMP/typo.jsonl" --output "$TMP/typo.out" 2>"$TMP/typo.err" || rc=$?
[ $rc -eq 4 ] || { cat "$TMP/typo.err"; fail "a line with suffix: exit $rc, wanted 4"; }
grep -q 'typo.jsonl: 2 line(s) hold fields tpinfer does not read, which it ignores: "max_token" (2 lines, first line 1); check their spelling' \
    "$TMP/typo.err" || { cat "$TMP/typo.err"; fail "no warning naming the misspelt field"; }
grep -q '"model"' "$TMP/typo.err" && fail "the warning names \"model\", which means nothing in a batch"
grep -q '"id":"t2".*"suffix\\" (fill-in-the-middle) is not supported' "$TMP/typo.out" || fail "no error record for suffix: $(cat "$TMP/typo.out")"
[ "$(grep -c '"finish_reason"' "$TMP/typo.out")" -eq 2 ] || fail "the lines beside the refused one did not run"
# a resumed batch's exit status counts the error records an earlier run wrote (as that run's did)
grep -v '"id":"t3"' "$TMP/typo.out" >"$TMP/typo.cut" && cat "$TMP/typo.cut" >"$TMP/typo.out"
rc=0
"$TPINFER" --model "$st" --input "$TMP/typo.jsonl" --output "$TMP/typo.out" --resume 2>"$TMP/typo2.err" || rc=$?
[ $rc -eq 4 ] || { cat "$TMP/typo2.err"; fail "a resume over an earlier error record: exit $rc, wanted 4"; }
grep -q -- "--resume: the output holds 1 error record(s) from an earlier run" "$TMP/typo2.err" ||
    { cat "$TMP/typo2.err"; fail "the resume did not say it counts the earlier error record"; }
[ "$(grep -c '"finish_reason"' "$TMP/typo.out")" -eq 2 ] || fail "the resume did not finish the cut request"

# 5. fatal input problems stop before the model loads, naming lines
printf '%s\n' '{"id": "a", "prompt": "x"}' '{"id": "a", "prompt": "y"}' >"$TMP/dup.jsonl"
expect_fail 2 "line 2" "$TPINFER" --model "$st" --input "$TMP/dup.jsonl" --output "$TMP/dup.out"
cp "$TMP/mixed.jsonl" "$TMP/self.jsonl"
expect_fail 2 "same file" "$TPINFER" --model "$st" --input "$TMP/self.jsonl" --output "$TMP/self.jsonl" --overwrite
cmp -s "$TMP/mixed.jsonl" "$TMP/self.jsonl" || fail "the input was damaged"
expect_fail 1 "cannot open" "$TPINFER" --model "$st" --input "$TMP/missing.jsonl"
# memory that cannot be had: the message says what did not fit and which flags make room
expect_fail 1 "for the KV cache did not fit" "$TPINFER" --model "$st" --input "$TMP/mixed.jsonl" --output "$TMP/oom.out" \
    --kv-cache-memory 16TiB --max-num-seqs 1048576 --max-num-batched-tokens 64
"$TPINFER" --model "$st" --input "$TMP/mixed.jsonl" --output "$TMP/m.out" 2>/dev/null && fail "an existing output was overwritten"
grep -q '"id":"a"' "$TMP/m.out" || fail "the existing output was damaged"
exit 0
