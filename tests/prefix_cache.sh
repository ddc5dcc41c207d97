#!/bin/sh
# Prefix caching (on by default): prompts that start alike read the keys and values of
# their common full blocks from the cache instead of computing them, and every output is
# what it is with --no-enable-prefix-caching (CPU backend: byte for byte, logprobs
# included): greedy and sampled requests, n = 2, a prompt repeated whole (its last token
# is computed all the same), prompt logprobs (computed whole, never from the cache), prefill
# chunks, a KV cache so small that cached blocks are evicted and sequences preempted,
# OpenAI batch lines, tp 2 and pp 2. usage.prompt_tokens_details.cached_tokens says how many
# prompt tokens a request read from the cache, the status file their sum, the log the
# run's; --dump-logits turns the cache off (a dump holds every prompt token's logits).
# PREFIX_BACKEND=cuda (tests/gpu/run.sh): in float32, the same tokens.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
shared="Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her dog, Max. Every morning they ran to the big tree by the river, and"
cat >"$TMP/in.jsonl" <<JSONL
{"id": "a", "prompt": "$shared she saw a bird.", "max_tokens": 10, "logprobs": 2}
{"id": "b", "prompt": "$shared Max found a stick.", "max_tokens": 8, "temperature": 0.9, "seed": 3, "logprobs": 1}
{"id": "c", "prompt": "$shared they sat down.", "max_tokens": 6, "n": 2, "temperature": 0.8, "seed": 1}
{"id": "d", "prompt": "$shared she saw a bird.", "max_tokens": 10, "logprobs": 2}
{"id": "e", "prompt": "$shared the sun was hot.", "max_tokens": 5, "logprobs": 2, "prompt_logprobs": 2}
{"id": "f", "prompt": "The cat sat on the mat.", "max_tokens": 7}
{"id": "g", "prompt": "$shared it began to rain.", "max_tokens": 9, "temperature": 1.0, "top_k": 5, "seed": 9}
{"id": "h", "prompt": "$shared", "max_tokens": 4, "logprobs": 1}
JSONL
ab_backend "${PREFIX_BACKEND:-cpu}"
# run NAME INPUT LAUNCHER/TPINFER [flags...]
run() {
    local rname=$1 rinput=$2; shift 2
    TPINFER_WARMUP=0 "$@" --model "$m" --backend "$backend" $flags --input "$rinput" --output "$TMP/$rname.jsonl" \
        2>"$TMP/$rname.err" || { cat "$TMP/$rname.err"; fail "run $rname"; }
}
# ab NAME INPUT [launcher and flags...]: the cache on (the default) and off give the same output
ab() {
    name=$1 input=$2; shift 2
    run "$name-on" "$input" "$@"
    run "$name-off" "$input" "$@" --no-enable-prefix-caching
    [ "$(ab_output "$TMP/$name-on.jsonl")" = "$(ab_output "$TMP/$name-off.jsonl")" ] ||
        { diff "$TMP/$name-on.jsonl" "$TMP/$name-off.jsonl" | head -6; fail "$name: the prefix cache changed the output"; }
    grep -q "read from the prefix cache" "$TMP/$name-on.err" || { cat "$TMP/$name-on.err"; fail "$name: nothing read from the cache"; }
    ! grep -q "read from the prefix cache" "$TMP/$name-off.err" || fail "$name: --no-enable-prefix-caching read the cache"
    ! grep -q '"cached_tokens":[1-9]' "$TMP/$name-off.jsonl" || fail "$name: cached tokens without the cache"
}
# two sequences at a time: the later ones arrive when the first ones' blocks are in the cache
ab plain "$TMP/in.jsonl" "$TPINFER" --max-num-seqs 2
"$PYTHON3" - "$TMP/plain-on.jsonl" "$TMP/plain-on.err" <<'PY' || fail "cached_tokens"
import json, re, sys
rows = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
cached = {k: r["usage"]["prompt_tokens_details"]["cached_tokens"] for k, r in rows.items()}
for k, r in rows.items():
    n, c = r["usage"]["prompt_tokens"], cached[k]
    assert c % 16 == 0 and 0 <= c < n, (k, c, n)      # whole blocks, the last token computed
assert cached["e"] == 0, cached                        # prompt logprobs: every prompt row computed
assert cached["f"] == 0, cached                        # nothing in common
assert cached["d"] > 0 and cached["g"] > 0 and cached["h"] > 0, cached
assert rows["e"]["prompt_logprobs"][1] is not None
total = int(re.search(r"(\d+) prompt tokens read from the prefix cache", open(sys.argv[2]).read()).group(1))
# c has two choices: its second sequence may read what its first wrote; the line counts the first's
assert total >= sum(cached.values()) > 0, (total, cached)
PY
ab chunked "$TMP/in.jsonl" "$TPINFER" --max-num-seqs 2 --max-num-batched-tokens 7
# 10 blocks of 16 tokens (20 KiB each), room for about two sequences: cached blocks are
# evicted and running sequences preempted (on the CPU backend), each request asking for 40
# new tokens: sequences are admitted only when all of their tokens fit, so they must grow
# after admission for the cache to run short
sed 's/"max_tokens": [0-9]*/"max_tokens": 40/' "$TMP/in.jsonl" >"$TMP/long.jsonl"
ab tight "$TMP/long.jsonl" "$TPINFER" --kv-cache-memory 200KiB --max-model-len 160
# (--kv-cache-memory sizes the CPU backend's cache; a GPU's comes from --gpu-memory-utilization)
[ "$backend" != cpu ] || grep -q " [1-9][0-9]* preempted" "$TMP/tight-on.err" ||
    { cat "$TMP/tight-on.err"; fail "tight: no preemption"; }
# OpenAI batch lines: the body's usage carries the count
"$PYTHON3" - "$TMP/in.jsonl" >"$TMP/openai.jsonl" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if r["id"] in "adh":
        print(json.dumps({"custom_id": r["id"], "method": "POST", "url": "/v1/completions",
                          "body": {"model": "m", "prompt": r["prompt"], "max_tokens": 4}}))
PY
ab openai "$TMP/openai.jsonl" "$TPINFER" --max-num-seqs 1 --status-file "$TMP/status.json"
"$PYTHON3" - "$TMP/openai-on.jsonl" "$TMP/status.json" <<'PY' || fail "OpenAI usage / status file"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cached = [r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rows]
assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
status = json.load(open(sys.argv[2]))          # the last run's (off): nothing cached
assert status["usage"]["input_tokens_details"]["cached_tokens"] == 0, status["usage"]
PY
run status "$TMP/openai.jsonl" "$TPINFER" --max-num-seqs 1 --status-file "$TMP/status-on.json"
"$PYTHON3" - "$TMP/status-on.json" "$TMP/openai-on.jsonl" <<'PY' || fail "status file's cached tokens"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
want = sum(r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rows)
got = json.load(open(sys.argv[1]))["usage"]["input_tokens_details"]["cached_tokens"]
assert got == want > 0, (got, want)
PY
# requests ended by a stop string on the path that enqueues steps ahead (no prompt logprobs
# in the run): their lines count what they read, as with TPINFER_OVERLAP=0
grep -v '"id": "e"' "$TMP/in.jsonl" | sed 's/"max_tokens"/"stop": ["the", "a"], "max_tokens"/' >"$TMP/stop.jsonl"
run stop-ahead "$TMP/stop.jsonl" "$TPINFER" --max-num-seqs 1
TPINFER_OVERLAP=0 run stop-plain "$TMP/stop.jsonl" "$TPINFER" --max-num-seqs 1
"$PYTHON3" - "$TMP/stop-ahead.jsonl" "$TMP/stop-plain.jsonl" <<'PY' || fail "cached_tokens of requests ended by a stop"
import json, sys
got = [{r["id"]: r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in map(json.loads, open(f))} for f in sys.argv[1:]]
assert got[0] == got[1] and sum(got[0].values()) > 0, got
PY
# a dump holds every prompt token's logits: no cache
TPINFER_WARMUP=0 "$TPINFER" --model "$m" --backend "$backend" $flags --input "$TMP/in.jsonl" --output "$TMP/dump.jsonl" \
    --max-num-seqs 2 --dump-logits "$TMP/dump" 2>"$TMP/dump.err" || { cat "$TMP/dump.err"; fail "dump"; }
! grep -q "read from the prefix cache" "$TMP/dump.err" || fail "--dump-logits read the prefix cache"
[ "$(ab_output "$TMP/dump.jsonl")" = "$(ab_output "$TMP/plain-off.jsonl")" ] || fail "the dump run's output differs"
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    ab tp2 "$TMP/in.jsonl" mpi 2 "$TPINFER" --tp 2 --max-num-seqs 2
    ab pp2 "$TMP/in.jsonl" mpi 2 "$TPINFER" --pp 2 --max-num-seqs 2
fi
exit 0
