#!/bin/sh
# compare_logits --dump-ref: one backend's --dump-logits run as the reference for another's
# (tests/gpu/run.sh checks the CUDA backend's tensor-core attention so against the CPU's).
# A run against itself passes to the last bit; one of another model fails, and its greedy-step
# logits count only up to the first id that differs; tp 2 against tp 1 within 1e-3; a
# directory without dumps is an error. The CPU backend, a generated model of head_dim 64.
. "$top_srcdir/tests/lib.sh"
export OMP_NUM_THREADS=1
cmp="$top_builddir/tests/compare_logits"
gen() { "$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/$1" --dtype bfloat16 --hidden 256 --heads 4 \
    --kv-heads 2 --layers 2 --intermediate 512 --seed "$2" >/dev/null || fail "gen $1"; }
gen m 1234
gen other 99
"$PYTHON3" - "$TMP/m" >"$TMP/p.jsonl" <<'PYEOF' || fail "prompts"
import json, random, sys
vocab = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
random.seed(7)
for k, n in enumerate((70, 16, 33)):
    ids = [random.randrange(3, vocab - 3) for _ in range(n)]
    print(json.dumps({"id": "p%d" % k, "prompt_token_ids": ids, "max_tokens": 6, "ignore_eos": True}))
PYEOF
run() { # run NAME MODEL [flags...]
    name=$1 model=$2; shift 2
    "$TPINFER" --model "$TMP/$model" --backend cpu --input "$TMP/p.jsonl" --output "$TMP/$name.jsonl" \
        --dump-logits "$TMP/$name" "$@" 2>"$TMP/$name.err" || { cat "$TMP/$name.err"; fail "run $name"; }
}
run a m
"$cmp" --dump-ref "$TMP/a" "$TMP/ref.safetensors" || fail "--dump-ref"
"$cmp" "$TMP/ref.safetensors" "$TMP/a" 1e-30 >"$TMP/self" || { cat "$TMP/self"; fail "a run against itself"; }
[ "$(grep -c 'prefill max|d| 0, greedy steps max|d| 0 (6 steps of the same context), greedy ids 6/6 equal' "$TMP/self")" = 3 ] ||
    { cat "$TMP/self"; fail "a run against itself: not every prompt exactly equal"; }
run b other
rc=0
"$cmp" "$TMP/ref.safetensors" "$TMP/b" >"$TMP/other.cmp" || rc=$?
[ $rc = 1 ] || { cat "$TMP/other.cmp"; fail "another model's run: exit $rc, wanted 1"; }
# each prompt's step logits up to and with its first different id: same + 1 steps
"$PYTHON3" - "$TMP/other.cmp" <<'PYEOF' || fail "another model's run: the steps of the same context"
import re, sys
for line in open(sys.argv[1]):
    m = re.search(r"\((\d+) steps of the same context\), greedy ids (\d+)/6", line)
    assert m and int(m.group(1)) == min(int(m.group(2)) + 1, 6), line
PYEOF
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    mpi 2 "$TPINFER" --model "$TMP/m" --backend cpu --tp 2 --input "$TMP/p.jsonl" --output "$TMP/tp2.jsonl" \
        --dump-logits "$TMP/tp2" 2>"$TMP/tp2.err" || { cat "$TMP/tp2.err"; fail "tp 2"; }
    "$cmp" "$TMP/ref.safetensors" "$TMP/tp2" 1e-3 || fail "tp 2 against tp 1"
fi
mkdir "$TMP/empty"
expect_fail 2 "no p0.safetensors" "$cmp" --dump-ref "$TMP/empty" "$TMP/x.safetensors"
echo "ok"
