#!/bin/sh
# The default --max-num-seqs (engine.c default_max_seqs). On a GPU of 70 GiB or more it is as
# many of the run's sequences as the KV cache holds at full length (prompt + max_tokens),
# from 256 to 1024, at most the run's own; TPINFER_LARGE_GPU_DEFAULTS=1 gives the CPU backend
# those defaults, with --kv-cache-memory sizing the cache. tiny-llama3 on the CPU: 1 KiB of
# K/V a token, 16 KiB a block of 16.
. "$top_srcdir/tests/lib.sh"
need_shared
MODEL=$MODELS/tiny-llama3
BLOCK=16384
# prompts N LEN MAX_TOKENS [N LEN MAX_TOKENS]: JSONL of N prompts of LEN tokens each
prompts() {
    "$PYTHON3" - "$@" <<'PY'
import json, sys
a = list(map(int, sys.argv[1:]))
r = 0
for i in range(0, len(a), 3):
    n, ln, mx = a[i:i + 3]
    for _ in range(n):
        print(json.dumps({"id": "r%d" % r, "prompt_token_ids": [5 + (r * 7 + t) % 90 for t in range(ln)],
                          "max_tokens": mx, "ignore_eos": True}))
        r += 1
PY
}
# run NAME ARGS...: tpinfer on $TMP/NAME.jsonl into $TMP/NAME.out, its log in $TMP/NAME.log
run() {
    name=$1; shift
    "$TPINFER" --model "$MODEL" --input "$TMP/$name.jsonl" --output "$TMP/$name.out" "$@" >"$TMP/$name.log" 2>&1 ||
        { cat "$TMP/$name.log"; fail "$name: tpinfer $*"; }
}
at_once() { sed -n 's/.*replica 0: \([0-9]*\) sequences at once.*/\1/p' "$TMP/$1.log"; }
preempted() { sed -n 's/.*replica 0: .* steps, \([0-9]*\) preempted.*/\1/p' "$TMP/$1.log"; }
same() { # the completions of two runs, without their timestamps
    completions "$TMP/$1.out" >"$TMP/$1.sorted"
    completions "$TMP/$2.out" >"$TMP/$2.sorted"
    cmp -s "$TMP/$1.sorted" "$TMP/$2.sorted" || fail "$1 and $2 differ: $(diff "$TMP/$1.sorted" "$TMP/$2.sorted" | head -3)"
}

# 300 sequences of 5 + 11 tokens (one block each) in a cache of 300 blocks: all 300 at once,
# none preempted, the same completions as --max-num-seqs 300
prompts 300 5 11 >"$TMP/fit.jsonl"
cp "$TMP/fit.jsonl" "$TMP/flag.jsonl"
TPINFER_LARGE_GPU_DEFAULTS=1 run fit --kv-cache-memory $((300 * BLOCK))
[ "$(at_once fit)" = 300 ] || fail "300 blocks of one-block sequences: '$(at_once fit)' at once, wanted 300"
[ "$(preempted fit)" = 0 ] || fail "fit: $(preempted fit) preempted"
TPINFER_LARGE_GPU_DEFAULTS=1 run flag --kv-cache-memory $((300 * BLOCK)) --max-num-seqs 300
[ -z "$(at_once flag)" ] || fail "--max-num-seqs given, yet the default's line: $(at_once flag)"
same fit flag

# mixed lengths: 200 of one block, 100 of three (5 + 40 tokens): 500 blocks for 300
# sequences; a cache of 700 blocks holds 700 * 300 / 500 = 420 of the mean, more than the run
# has: 300
prompts 200 5 11 100 5 40 >"$TMP/mixed.jsonl"
TPINFER_LARGE_GPU_DEFAULTS=1 run mixed --kv-cache-memory $((700 * BLOCK))
[ "$(at_once mixed)" = 300 ] || fail "mixed, 700 blocks: '$(at_once mixed)' at once, wanted 300 (the run's own)"
# 400 blocks: 400 * 300 / 500 = 240, under the floor of 256
cp "$TMP/mixed.jsonl" "$TMP/mixed2.jsonl"
TPINFER_LARGE_GPU_DEFAULTS=1 run mixed2 --kv-cache-memory $((400 * BLOCK))
[ "$(at_once mixed2)" = 256 ] || fail "mixed, 400 blocks: '$(at_once mixed2)' at once, wanted 256"
same mixed mixed2
# 1200 sequences of one block in 2000 blocks: 1024, the ceiling
prompts 1200 5 3 >"$TMP/many.jsonl"
TPINFER_LARGE_GPU_DEFAULTS=1 run many --kv-cache-memory $((2000 * BLOCK))
[ "$(at_once many)" = 1024 ] || fail "1200 sequences, 2000 blocks: '$(at_once many)' at once, wanted 1024"
# 40 sequences of 5 + 60 tokens (5 blocks each when whole) in 100 blocks at --max-num-seqs 40:
# all admitted on their first block, they outgrow the cache and some are preempted; the
# closing warning names what the cache holds whole (20) as the --max-num-seqs that avoids it;
# at 20 none is preempted, no warning, the same completions
prompts 40 5 60 >"$TMP/tight.jsonl"
cp "$TMP/tight.jsonl" "$TMP/tight20.jsonl"
run tight --kv-cache-memory $((100 * BLOCK)) --max-model-len 128 --max-num-seqs 40
[ "$(preempted tight)" -gt 0 ] || { cat "$TMP/tight.log"; fail "tight: nothing preempted"; }
grep -q "preempted .* its 100 blocks of 16 tokens hold about 20 of this run's sequences at full length .* --max-num-seqs let 40 run at once. Where outputs run to max_tokens, --max-num-seqs 20 avoids this" "$TMP/tight.log" ||
    { cat "$TMP/tight.log"; fail "tight: no warning naming --max-num-seqs 20"; }
run tight20 --kv-cache-memory $((100 * BLOCK)) --max-model-len 128 --max-num-seqs 20
[ "$(preempted tight20)" = 0 ] || fail "tight20: $(preempted tight20) preempted"
! grep -q "were preempted" "$TMP/tight20.log" || fail "tight20: a preemption warning without preemption"
same tight tight20
# the same at --pp 2 (two ranks): sequences go to the two micro-batches in turn, each with half
# of the cache's blocks; 80 prompts in a cache of 200 blocks a rank (half the layers a rank,
# so half the K/V a token) are 40 a micro-batch in 100 blocks: preempted at 40, whose warning
# says it is per micro-batch, none at 20; the default counts a micro-batch's own sequences (40)
# and says so
prompts 80 5 60 >"$TMP/pp.jsonl"
# run_pp NAME ARGS...: run at --pp 2 under mpirun
run_pp() {
    name=$1; shift
    cp "$TMP/pp.jsonl" "$TMP/$name.jsonl"
    mpi 2 -x TPINFER_LARGE_GPU_DEFAULTS "$TPINFER" --model "$MODEL" --pp 2 --input "$TMP/$name.jsonl" \
        --output "$TMP/$name.out" --kv-cache-memory $((100 * BLOCK)) --max-model-len 128 "$@" >"$TMP/$name.log" 2>&1 ||
        { cat "$TMP/$name.log"; fail "$name: tpinfer --pp 2 $*"; }
}
TPINFER_LARGE_GPU_DEFAULTS=0 run_pp pp40 --max-num-seqs 40
[ "$(preempted pp40)" -gt 0 ] || { cat "$TMP/pp40.log"; fail "pp40: nothing preempted"; }
grep -q "preempted .* its 100 blocks of 16 tokens a micro-batch hold about 20 of this run's sequences at full length .* --max-num-seqs let 40 run at once in each of 2 micro-batches. Where outputs run to max_tokens, --max-num-seqs 20 avoids this" "$TMP/pp40.log" ||
    { cat "$TMP/pp40.log"; fail "pp40: no warning naming --max-num-seqs 20 a micro-batch"; }
TPINFER_LARGE_GPU_DEFAULTS=0 run_pp pp20 --max-num-seqs 20
[ "$(preempted pp20)" = 0 ] || fail "pp20: $(preempted pp20) preempted"
same pp40 pp20
TPINFER_LARGE_GPU_DEFAULTS=1 run_pp ppdefault
[ "$(at_once ppdefault)" = 40 ] || fail "--pp 2, 80 sequences: '$(at_once ppdefault)' at once, wanted 40 (a micro-batch's own)"
grep -q "sequences at once .*, in each pipeline micro-batch" "$TMP/ppdefault.log" || fail "ppdefault: the line does not say it is per micro-batch"
same pp40 ppdefault
# two replicas (two ranks at --tp 1 --pp 1): each replica has 40 of the 80 and a cache of 100 blocks, so each is
# preempted at 40, and each replica's first rank says so for its own (replica 1's warning came
# from no rank while only rank 0 spoke)
cp "$TMP/pp.jsonl" "$TMP/dp40.jsonl"
mpi 2 "$TPINFER" --model "$MODEL" --input "$TMP/dp40.jsonl" --output "$TMP/dp40.out" \
    --kv-cache-memory $((100 * BLOCK)) --max-model-len 128 --max-num-seqs 40 >"$TMP/dp40.log" 2>&1 ||
    { cat "$TMP/dp40.log"; fail "dp40: tpinfer on two ranks"; }
for r in 0 1; do
    n=$(sed -n "s/.*replica $r: .* steps, \([0-9]*\) preempted.*/\1/p" "$TMP/dp40.log")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { cat "$TMP/dp40.log"; fail "dp40: replica $r: '$n' preempted, wanted some"; }
    grep -q "replica $r: $n sequence(s) were preempted .* its 100 blocks of 16 tokens hold about 20 of this run's sequences at full length .* --max-num-seqs let 40 run at once. Where outputs run to max_tokens, --max-num-seqs 20 avoids this" "$TMP/dp40.log" ||
        { cat "$TMP/dp40.log"; fail "dp40: no preemption warning of replica $r"; }
done
same pp40 dp40

# 3 prompts, one with n = 2: 4 sequences at once (a warm-up of graphs up to 4)
prompts 3 5 4 | sed '1s/}$/, "n": 2}/' >"$TMP/few.jsonl"
TPINFER_LARGE_GPU_DEFAULTS=1 run few
[ "$(at_once few)" = 4 ] || fail "3 prompts, one of n 2: '$(at_once few)' at once, wanted 4"
# without the large GPU's defaults (the CPU's own): no line, the same completions
cp "$TMP/few.jsonl" "$TMP/few_cpu.jsonl"
run few_cpu
[ -z "$(at_once few_cpu)" ] || fail "the CPU's defaults printed the large GPU's line"
same few few_cpu
exit 0
