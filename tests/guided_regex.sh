#!/bin/sh
# vLLM's guided_regex (and "structured_outputs": {"regex": ...}): the whole completion
# matches the regular expression (src/regex_nfa.c; anchored at both ends, as vLLM's). On
# stories260K (SentencePiece with byte tokens), greedy and sampled, n = 3: a text that ends
# ("stop") is re.fullmatch's (Python, ASCII classes), one that max_tokens cuts is the start of
# a match (some ending of at most a few characters makes one); the host sampler and the
# sample op draw the same; a pattern tpinfer does not take is an error record naming it.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
cat >"$TMP/out.in" <<'EOF2'
{"id": "a", "prompt": "Is it", "max_tokens": 8, "temperature": 1.0, "seed": 1, "n": 3, "guided_regex": "(yes|no|maybe)"}
{"id": "b", "prompt": "Once upon", "max_tokens": 40, "temperature": 0.8, "seed": 2, "n": 3, "guided_regex": "[A-Z][a-z]{2,8}( [a-z]{1,8}){0,3}\\."}
{"id": "c", "prompt": "Call", "max_tokens": 12, "temperature": 0, "structured_outputs": {"regex": "\\d{3}-\\d{4}"}}
{"id": "d", "prompt": "Tom", "max_tokens": 5, "temperature": 1.0, "seed": 3, "n": 2, "guided_regex": "(ab|cd)+x"}
{"id": "e", "prompt": "Lily", "max_tokens": 30, "temperature": 0.9, "seed": 4, "guided_regex": "\u00e9t\u00e9 [^\\n]{1,20}!"}
{"id": "f", "prompt": "Lily", "guided_regex": "a(?=b)"}
EOF2
both_samplers out 4
python3 - "$TMP/out-0.jsonl" <<'PY' || fail "a completion does not match its pattern: $(cat "$TMP/out-0.jsonl")"
import itertools, json, re, sys
patterns = {"a": "(yes|no|maybe)", "b": r"[A-Z][a-z]{2,8}( [a-z]{1,8}){0,3}\.", "c": r"\d{3}-\d{4}", "d": "(ab|cd)+x",
            "e": "\u00e9t\u00e9 [^\\n]{1,20}!"}
ends = ["", "a", "b", "c", "d", "x", "y", "s", "e", "o", "0", "1", "-", " ", ".", "!", "ab", "cd", "abx", "aa.", "es", "aybe", "o.", " a.",
        "0-0000", "00-0000", "-0000", "000", "0000", "00", "cdx", "a!"]
def completable(p, t):
    return any(re.fullmatch(p, t + a + b, re.ASCII) for a, b in itertools.product(ends, ["", "x", "."]))
stopped = cut = 0
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["id"] == "f":
        assert d["code"] == "invalid_request" and "lookaround" in d["message"], d
        continue
    for c in d.get("choices", [d]):
        t = c["text"]
        if c["finish_reason"] == "stop":
            assert re.fullmatch(patterns[d["id"]], t, re.ASCII), (d["id"], t)
            stopped += 1
        else:
            assert c["finish_reason"] == "length" and completable(patterns[d["id"]], t), (d["id"], t)
            cut += 1
assert stopped >= 4 and cut >= 1, (stopped, cut)
print("guided_regex: %d completions matched whole, %d cut ones are starts of matches" % (stopped, cut))
PY
echo "guided_regex: PASS"
