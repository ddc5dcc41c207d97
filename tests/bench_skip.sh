#!/bin/sh
# TPINFER_BENCH_SKIP (bench/step_parts.sh's setting): each part of the step it names is left
# out (the dumped logits differ from a full step's; lm_head's are zeros, what the logits
# buffer starts as), with a warning; allreduce leaves out nothing at tp 1 and changes tp 2's
# logits; an unknown or empty name is an error that names it, before any request runs.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m=$MODELS/stories260K-hf
cat >"$TMP/in.jsonl" <<'JSONL'
{"id": "a", "prompt": "Once upon a time", "max_tokens": 6}
{"id": "b", "prompt": "Lily and Ben went to the park and", "max_tokens": 4}
JSONL
# run NAME SKIP [launcher...]: the run's output, stderr and dumped logits under $TMP/NAME*
# ($grid: tpinfer's grid flags)
grid=
run() {
    name=$1 parts=$2; shift 2
    TPINFER_BENCH_SKIP=$parts "$@" "$TPINFER" --model "$m" --backend cpu $grid --input "$TMP/in.jsonl" \
        --output "$TMP/$name.jsonl" --dump-logits "$TMP/$name.dump" 2>"$TMP/$name.err" ||
        { cat "$TMP/$name.err"; fail "$name: TPINFER_BENCH_SKIP=$parts failed"; }
}
# same_logits A B: every dumped logit of the two runs is the same (both runs dumped both
# requests: a missing dump is a failure, not a difference)
same_logits() {
    for r in a b; do
        [ -s "$TMP/$1.dump/$r.safetensors" ] && [ -s "$TMP/$2.dump/$r.safetensors" ] ||
            fail "$1 or $2: no dump of request $r"
        cmp -s "$TMP/$1.dump/$r.safetensors" "$TMP/$2.dump/$r.safetensors" || return 1
    done
}
# zero_logits NAME: every dumped logit (the F32 tensors) of the run is 0
zero_logits() {
    "${PYTHON3:-python3}" - "$TMP/$1.dump"/* <<'PY'
import json, struct, sys
for path in sys.argv[1:]:
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    for name, t in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__" and t["dtype"] == "F32":
            a, b = t["data_offsets"]
            if raw[8 + n + a:8 + n + b].strip(b"\0"):
                sys.exit(1)
PY
}
run full ""
! grep -q TPINFER_BENCH_SKIP "$TMP/full.err" || fail "a warning without TPINFER_BENCH_SKIP"
for p in embedding norm qkv attention o gate_up down lm_head qkv,o; do
    run "skip-$p" "$p"
    grep -q "TPINFER_BENCH_SKIP=$p: every step leaves these parts out; the output is wrong" "$TMP/skip-$p.err" ||
        { cat "$TMP/skip-$p.err"; fail "$p: no warning"; }
    ! same_logits full "skip-$p" || fail "leaving out $p changed no logit"
    [ "$(wc -l <"$TMP/skip-$p.jsonl")" -eq 2 ] || fail "$p: not both completions written"
done
zero_logits skip-lm_head || fail "lm_head left out: logits not all zeros"
! zero_logits skip-o || fail "zero_logits finds nonzero logits"
run skip-allreduce allreduce
same_logits full skip-allreduce || fail "allreduce left out at tp 1 changed the logits"
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    grid="--tp 2"
    run tp2 "" mpi 2
    run tp2-skip allreduce mpi 2
    ! same_logits tp2 tp2-skip || fail "allreduce left out at tp 2 changed no logit"
fi
# bad_parts SKIP NAMED: an error naming NAMED and the parts there are; no completion written
bad_parts() {
    rm -f "$TMP/bad.jsonl"
    TPINFER_BENCH_SKIP=$1 "$TPINFER" --model "$m" --backend cpu --input "$TMP/in.jsonl" --output "$TMP/bad.jsonl" \
        2>"$TMP/bad.err" && fail "TPINFER_BENCH_SKIP=$1 ran"
    grep -q "TPINFER_BENCH_SKIP=$1: '$2' is not a part of the step; name some of embedding, norm, qkv, attention, o, gate_up, down, lm_head, allreduce" \
        "$TMP/bad.err" || { cat "$TMP/bad.err"; fail "TPINFER_BENCH_SKIP=$1: no message naming '$2'"; }
    [ ! -s "$TMP/bad.jsonl" ] || fail "TPINFER_BENCH_SKIP=$1: completions written"
}
bad_parts foo foo
bad_parts "qkv,,o" ""
bad_parts "qkv,Attention" Attention
exit 0
