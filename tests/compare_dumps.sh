#!/bin/sh
# compare_logits --dump-ref: one backend's --dump-logits run as the reference for another's
# (tests/gpu/run.sh checks the CUDA backend's tensor-core attention so against the CPU's).
# A run against itself passes to the last bit; one of another model fails, and its greedy-step
# logits count only up to the first id that differs; tp 2 against tp 1 within 1e-3; a NaN
# logit never passes; a directory without dumps, or with one that does not read, is an error.
# The CPU backend, a generated model of head_dim 64.
. "$top_srcdir/tests/lib.sh"
[ "${PYTHON3:-no}" != no ] || skip "python3 not found"
export OMP_NUM_THREADS=1
cmp="$top_builddir/tests/compare_logits"
gen() { "$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/$1" --dtype bfloat16 --hidden 256 --heads 4 \
    --kv-heads 2 --layers 2 --intermediate 512 --seed "$2" --prompts "$TMP/p.jsonl" --prompt-lengths 70,16,33 \
    --max-tokens 6 >/dev/null || fail "gen $1"; }
gen m 1234
gen other 99
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
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 3, lines
for line in lines:
    m = re.search(r"\((\d+) steps of the same context\), greedy ids (\d+)/6", line)
    assert m and int(m.group(1)) == min(int(m.group(2)) + 1, 6), line
PYEOF
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    mpi 2 "$TPINFER" --model "$TMP/m" --backend cpu --tp 2 --input "$TMP/p.jsonl" --output "$TMP/tp2.jsonl" \
        --dump-logits "$TMP/tp2" 2>"$TMP/tp2.err" || { cat "$TMP/tp2.err"; fail "tp 2"; }
    "$cmp" "$TMP/ref.safetensors" "$TMP/tp2" 1e-3 || fail "tp 2 against tp 1"
fi
# a NaN logit fails under any bound, even in margin mode (where only the ids are relaxed)
mkdir "$TMP/nan" && cp "$TMP/a"/*.safetensors "$TMP/nan/"
"$PYTHON3" - "$TMP/nan/p1.safetensors" <<'PYEOF' || fail "writing a NaN"
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
at = 8 + n + json.loads(b[8:8 + n])["prompt_logits"]["data_offsets"][0] + 4 * 5
b[at:at + 4] = struct.pack("<I", 0x7fc00000)
open(sys.argv[1], "wb").write(b)
PYEOF
rc=0
"$cmp" "$TMP/ref.safetensors" "$TMP/nan" inf 0.05 >"$TMP/nan.cmp" || rc=$?
[ $rc = 1 ] && grep -q "prompt 1: .*prefill max|d| nan.*FAIL" "$TMP/nan.cmp" ||
    { cat "$TMP/nan.cmp"; fail "a NaN logit passed (exit $rc)"; }
# no dumps, and a dump that does not read: errors, not a shorter reference
mkdir "$TMP/empty"
expect_fail 2 "no p0.safetensors" "$cmp" --dump-ref "$TMP/empty" "$TMP/x.safetensors"
cp "$TMP/a/p0.safetensors" "$TMP/empty/" && printf 'garbage' >"$TMP/empty/p1.safetensors"
expect_fail 2 "p1.safetensors" "$cmp" --dump-ref "$TMP/empty" "$TMP/x.safetensors"
echo "ok"
