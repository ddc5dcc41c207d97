#!/bin/bash
# bench/gpu_decode.sh [TP [PP [DP]]]: tpinfer's speed on the GPU machine, in one call.
# Builds tpinfer there (as tests/gpu/run.sh does), writes random-weight bf16 checkpoints of
# Llama-3-8B's and Llama-3.2-1B's shapes, measures the card's copy bandwidth, then on the
# first shape of BENCH_SHAPES (the main one):
#   bN            N prompts of 128 tokens, 128 new tokens each (b1: ms/token and the fraction
#                 of the HBM limit; the sweep's batch sizes are bN runs too);
#   oNxINxOUT     N prompts of IN tokens, OUT new tokens each (the issue's offline sets:
#                 o1024x128x128, o1024x2048x128, o1024x128x2048);
#   sNxSxUxOUT    N prompts of S tokens they all share (a system prompt) then U of their own,
#                 OUT new tokens each (prefix caching: s1024x1024x128x128);
#   the Hugging Face generate() baseline (bench/hf_baseline.py) at batches 1 and 128;
# then the op microbenchmarks (build-gpu/bench/gpu_matmul, gpu_attention) when they exist,
# and BENCH_RUNS_OTHER on the other shapes. Every run reports generated and total tok/s over
# the engine loop (prefill included) and tpinfer's TTFT / ITL p50/p90/p99.
# Writes $OUT/bench.json (every figure; bench/plot draws it) and $OUT/bench-results.md (the
# table printed last, ready for bench/RESULTS.md). Ranks: TP*PP*DP under mpirun.
# Environment (bench/README.md explains each): BENCH_BACKEND, BENCH_SHAPES, BENCH_RUNS,
# BENCH_RUNS_OTHER, BENCH_SWEEP, BENCH_HF, BENCH_HF_BATCHES, BENCH_HF_TIMEOUT, BENCH_HF_ATTN, BENCH_OPS,
# BENCH_OPS_TIMEOUT, BENCH_MAX_SEQS, BENCH_ARGS, BENCH_BUDGET_S, BENCH_RUN_TIMEOUT,
# BENCH_TPINFER, BENCH_PYTHON, BENCH_GEN, BENCH_WORK, BENCH_COMMIT, BENCH_BREAKDOWN, BENCH_REQUEST,
# BENCH_TOKENIZER.
set -u
TP=${1:-1}
PP=${2:-1}
DP=${3:-1}
NP=$((TP * PP * DP))
BACKEND=${BENCH_BACKEND:-cuda}
SHAPES=${BENCH_SHAPES:-llama-3-8b:4096:32:32:8:14336:128256 llama-3.2-1b:2048:16:32:8:8192:128256}
RUNS=${BENCH_RUNS:-b1 b128 o1024x128x128}
RUNS_OTHER=${BENCH_RUNS_OTHER:-b1 b128}
SWEEP=${BENCH_SWEEP-1 8 32 128}
HF=${BENCH_HF:-1}
HF_BATCHES=${BENCH_HF_BATCHES:-1 128}
OPS=${BENCH_OPS:-1}
MAX_SEQS=${BENCH_MAX_SEQS:-auto}
BUDGET=${BENCH_BUDGET_S:-480}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-300}
PY=${BENCH_PYTHON:-python3}
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
OUTDIR=${OUT:-/tmp/tpinfer-bench-out}
WORK=${BENCH_WORK:-/tmp/tpinfer-bench}
mkdir -p "$OUTDIR" "$WORK"
root=$(pwd)
START=$SECONDS
stop=0 # set by SIGTERM / SIGINT: the parts not yet started are skipped, what was measured is written
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RECORDS=$OUTDIR/records.jsonl # one JSON object per run, HF batch, op benchmark; bench.json is made from it
: >"$RECORDS"

# ---- helpers
left() { echo $((BUDGET - (SECONDS - START))); } # seconds of the budget left
# the time limit for one part: its own cap, or what the budget leaves; empty when under 15 s remain
limit_for() { local l; [ "$stop" = 1 ] && return 1; l=$(left); [ "$l" -lt 15 ] && return 1; [ "$1" -lt "$l" ] && l=$1; echo "$l"; }
# record JSON_FIELDS: append one record (the caller passes the fields, without braces)
record() { printf '{%s}\n' "$1" >>"$RECORDS"; }
# parse_log LOG: tpinfer's closing lines as JSON fields (null where a line is missing):
#   replica 0: P prompt + G generated tokens in S s: R generated tok/s; N steps, M preempted
#   summary (STATUS): ...   summary: tokens: P prompt, G completion; ...
#   summary: p50/p90/p99 (nearest rank): time to first token A/B/C ms (...), inter-token latency A/B/C ms (...)
parse_log() {
    awk '
    function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ ? x : "null" }
    function pcts(x, name,   p) {
        if (split(x, p, "/") != 3 || x == "n/a") return "\"" name "\":null"
        return sprintf("\"%s\":{\"p50\":%s,\"p90\":%s,\"p99\":%s}", name, num(p[1]), num(p[2]), num(p[3]))
    }
    /replica 0: .* generated tokens in / {
        s = $0; sub(/.*replica 0: /, "", s); split(s, a, " ")
        P0 = a[1]; G0 = a[4]; S = a[8]; R = a[10]; ST = a[13]; PR = a[15]
    }
    /summary \([a-z]*\):/ { s = $0; sub(/.*summary \(/, "", s); sub(/\).*/, "", s); STATUS = s }
    /summary: tokens: / { s = $0; sub(/.*summary: tokens: /, "", s); split(s, a, " "); PA = a[1]; GA = a[3] }
    /summary: p50\/p90\/p99/ {
        s = $0; sub(/.*time to first token /, "", s); split(s, a, " "); TT = a[1]
        s = $0; sub(/.*inter-token latency /, "", s); split(s, a, " "); IT = a[1]
    }
    /loaded .* of weights on / { s = $0; sub(/.* of weights on [0-9]+ rank\(s\) in /, "", s); split(s, a, " "); LS = a[1] }
    /replica 0: [0-9]+ sequences at once/ { s = $0; sub(/.*replica 0: /, "", s); split(s, a, " "); SO = a[1] }
    END {
        printf "\"summary\":%s,\"seconds\":%s,\"prompt_tokens_replica0\":%s,\"generated_tokens_replica0\":%s,", \
            STATUS == "" ? "null" : "\"" STATUS "\"", num(S), num(P0), num(G0)
        printf "\"generated_tok_s_replica0\":%s,\"prompt_tokens\":%s,\"generated_tokens\":%s,\"steps\":%s,\"preempted\":%s,", \
            num(R), num(PA), num(GA), num(ST), num(PR)
        printf "\"load_s\":%s,\"seqs_at_once\":%s,%s,%s", num(LS), num(SO), pcts(TT, "ttft_ms"), pcts(IT, "itl_ms")
    }' "$1"
}
# run_name NAME: "N IN OUT SHARED" for bN (N x 128/128), oNxINxOUT or sNxSxUxOUT (IN = S + U)
run_name() {
    local n i o s=0 u
    case $1 in
        b*) n=${1#b}; i=128; o=128 ;;
        o*) IFS=x read -r n i o <<<"${1#o}" ;;
        s*) IFS=x read -r n s u o <<<"${1#s}"
            [[ $s =~ ^[1-9][0-9]*$ && $u =~ ^[1-9][0-9]*$ ]] || return 1
            i=$((s + u)) ;;
        *) return 1 ;;
    esac
    [[ $n =~ ^[1-9][0-9]*$ && $i =~ ^[1-9][0-9]*$ && $o =~ ^[1-9][0-9]*$ ]] || return 1
    echo "$n $i $o $s"
}
# prompts N IN OUT [SHARED]: the path of a JSONL of N token-id prompts (ids 1..250, which every
# shape has), the first SHARED tokens the same in all, the others each prompt's own (drawn at
# random: no two prompts share a KV-cache block past SHARED, so prefix caching finds nothing else);
# BENCH_REQUEST's fields (a JSON object) added to every line
prompts() {
    local tag=
    [ -n "${BENCH_REQUEST:-}" ] && tag=-$(printf '%s' "$BENCH_REQUEST" | md5sum | cut -c1-8)
    local f=$WORK/prompts-$1x$2x$3s${4:-0}$tag.jsonl
    [ -s "$f" ] || "$PY" - "$f" "$1" "$2" "$3" "${4:-0}" "${BENCH_REQUEST:-}" <<'PY' || return 1
import json, random, sys
f, n, i, o, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
extra = json.loads(sys.argv[6]) if sys.argv[6] else {}
shared = [1 + (t * 31) % 250 for t in range(s)]
with open(f + ".tmp", "w") as out:
    for r in range(n):
        own = random.Random(r)
        ids = shared + [own.randint(1, 250) for _ in range(i - s)]
        line = {"id": "r%d" % r, "prompt_token_ids": ids, "max_tokens": o, "ignore_eos": True}
        line.update(extra)
        out.write(json.dumps(line) + "\n")
import os; os.replace(f + ".tmp", f)
PY
    echo "$f"
}
# with_tokenizer DIR: DIR, or with BENCH_TOKENIZER (a directory with a tokenizer.json) a
# directory of links to DIR's files whose tokenizer files are BENCH_TOKENIZER's (a real
# vocabulary for guided decoding's host work; the checkpoint's own is a few hundred tokens)
with_tokenizer() {
    [ -n "${BENCH_TOKENIZER:-}" ] || { echo "$1"; return; }
    local d=$1-tok f
    rm -rf "$d" && mkdir -p "$d" || return 1
    for f in "$1"/*; do ln -s "$f" "$d/"; done
    rm -f "$d"/tokenizer*.json
    cp "$BENCH_TOKENIZER"/tokenizer*.json "$d/" || return 1
    echo "$d"
}
launch_cmd=()
if [ "$NP" -gt 1 ]; then
    launch_cmd=(mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np "$NP")
    [ "$BACKEND" = cpu ] && launch_cmd+=(--oversubscribe)
fi

# ---- build (or BENCH_TPINFER: a tpinfer already built)
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
if [ -d "$deps" ]; then
    export PKG_CONFIG_PATH=$lib/pkgconfig LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cflags=(CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib")
else
    cflags=()
fi
if [ -n "${BENCH_TPINFER:-}" ]; then
    T=$BENCH_TPINFER
    B=$(dirname "$T")
else
    if [ "$BACKEND" = cpu ]; then B=$root/build-cpu; with=--without-cuda; else B=$root/build-gpu; with=--with-cuda; fi
    ( set -e
      [ -f "$B/Makefile" ] || { autoreconf -fi >/dev/null 2>&1; mkdir -p "$B"; cd "$B"
                                "$root/configure" -q "$with" "${cflags[@]}" >"$OUTDIR/configure.log" 2>&1; }
      make -C "$B" -j16 >"$OUTDIR/build.log" 2>&1 ) ||
        { tail -20 "$OUTDIR/configure.log" "$OUTDIR/build.log" 2>/dev/null; echo "build failed"; exit 1; }
    T=$B/tpinfer
fi
[ "$OPS" = 1 ] && { make -C "$B" -j16 bench >"$OUTDIR/build-bench.log" 2>&1 || echo "make bench failed (see build-bench.log)"; }
echo "built in $((SECONDS - START)) s: $T"

# ---- the machine
if [ "$BACKEND" = cpu ]; then
    device="CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    bw=
else
    device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    nvidia-smi >"$OUTDIR/nvidia-smi.txt" 2>&1
    # copy bandwidth (bytes read + written per second), the ceiling of a decode step
    bw=$("$PY" - <<'PY' 2>"$OUTDIR/bandwidth.log"
import torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize()
print("%.0f" % (2 * x.numel() * 10 / (s.elapsed_time(e) / 1e3)))
PY
)
    echo "copy bandwidth: ${bw:-?} B/s"
fi
. "$root/bench/tree_commit.sh"
commit=$(tree_commit "$root")
command=
for v in "${!BENCH_@}"; do # the BENCH_ settings, quoted where they need it, then the call
    if [[ ${!v} =~ ^[A-Za-z0-9_./:,=+-]*$ ]]; then command+="$v=${!v} "
    elif [[ ${!v} != *\'* ]]; then command+="$v='${!v}' "; else command+="$v=\"${!v}\" "; fi
done
command+="bash bench/gpu_decode.sh $TP $PP $DP"

# ---- model directories
# model_dir SHAPE MAXPOS: the checkpoint directory of SHAPE (written once, reused while the shape is
# the same); its max_position_embeddings raised to MAXPOS (gen_tiny_model.py writes 256).
# BENCH_GEN=torch writes the weights with torch (on the GPU when there is one: seconds, where
# gen_tiny_model.py's numpy takes minutes for 8B); script uses gen_tiny_model.py; auto picks torch
# when it imports.
model_dir() {
    local name hidden layers heads kv inter vocab dir gen
    IFS=: read -r name hidden layers heads kv inter vocab <<<"$1"
    dir=$WORK/$name
    if [ ! -f "$dir/model.safetensors" ] || [ "$(cat "$dir/bench-shape" 2>/dev/null)" != "$1" ]; then
        gen=${BENCH_GEN:-auto}
        [ "$gen" = auto ] && { if "$PY" -c 'import torch' 2>/dev/null; then gen=torch; else gen=script; fi; }
        rm -rf "$dir"
        if [ "$gen" = torch ]; then # metadata from gen_tiny_model.py's tiny model, weights written below
            python3 "$root/tests/gen_tiny_model.py" "$dir" --dtype bfloat16 >"$OUTDIR/gen-$name.log" 2>&1
        else
            python3 "$root/tests/gen_tiny_model.py" "$dir" --dtype bfloat16 --hidden "$hidden" --layers "$layers" \
                --heads "$heads" --kv-heads "$kv" --intermediate "$inter" --vocab "$vocab" >"$OUTDIR/gen-$name.log" 2>&1
        fi || { echo "generating $name failed" >&2; tail -5 "$OUTDIR/gen-$name.log" >&2; return 1; }
    else
        gen=none
    fi
    "$PY" - "$root" "$dir" "$gen" "$hidden" "$layers" "$heads" "$kv" "$inter" "$vocab" "$2" <<'PY' >>"$OUTDIR/gen-$name.log" 2>&1 ||
import importlib.util, json, os, struct, sys, time
root, d, gen = sys.argv[1:4]
hidden, layers, heads, kv, inter, vocab, maxpos = map(int, sys.argv[4:11])
with open(d + "/config.json") as f:
    cfg = json.load(f)
if gen == "torch":
    import torch
    spec = importlib.util.spec_from_file_location("gen_tiny_model", root + "/tests/gen_tiny_model.py")
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    cfg.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
               intermediate_size=inter, vocab_size=vocab, head_dim=hidden // heads, torch_dtype="bfloat16")
    specs = g.weight_specs(cfg)  # the names, shapes and scales gen_tiny_model.py uses
    header, off = {}, 0
    for name, shape, std in specs:
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt", "generator": "tpinfer bench/gpu_decode.sh (torch)"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rng = torch.Generator(device=dev).manual_seed(1234)
    t0 = time.time()
    with open(d + "/model.safetensors.tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape, std in specs:
            v = torch.randn(shape, generator=rng, device=dev, dtype=torch.float32)
            v = 1 + 0.1 * v if std is None else std * v
            f.write(v.to(torch.bfloat16).view(torch.int16).cpu().numpy())
    os.replace(d + "/model.safetensors.tmp", d + "/model.safetensors")
    print("wrote %d bytes on %s in %.1f s" % (8 + len(text) + off, dev, time.time() - t0))
if cfg.get("max_position_embeddings", 0) < maxpos:
    cfg["max_position_embeddings"] = maxpos
with open(d + "/config.json.tmp", "w") as f:
    json.dump(cfg, f, indent=2)
os.replace(d + "/config.json.tmp", d + "/config.json")
PY
        { echo "writing $name failed" >&2; tail -5 "$OUTDIR/gen-$name.log" >&2; return 1; }
    echo "$1" >"$dir/bench-shape"
    echo "$dir"
}

# ---- one tpinfer run: bench_run SHAPE_NAME DIR RUN
bench_run() {
    local name=$1 dir=$2 run=$3 nio n i o sh f lim seqs log rc fields
    nio=$(run_name "$run") || { echo "unknown run name $run (bN, oNxINxOUT or sNxSxUxOUT)"; return; }
    read -r n i o sh <<<"$nio"
    # bN: all N at once; oN, sN: BENCH_MAX_SEQS at once, or tpinfer's default for the card (auto)
    seqs=$n
    if [ "${run:0:1}" != b ]; then
        if [ "$MAX_SEQS" = auto ]; then seqs=auto; elif [ "$n" -gt "$MAX_SEQS" ]; then seqs=$MAX_SEQS; fi
    fi
    local seqs_flag=(--max-num-seqs "$seqs") seqs_json=$seqs
    [ "$seqs" = auto ] && seqs_flag=() seqs_json='"auto"'
    local meta="\"kind\":\"tpinfer\",\"model\":\"$name\",\"run\":\"$run\",\"prompts\":$n,\"in\":$i,\"shared\":$sh,\"out\":$o,\"max_num_seqs\":$seqs_json,\"max_model_len\":$((i + o))"
    if ! lim=$(limit_for "$RUN_TIMEOUT"); then
        echo "$name $run: skipped (time budget or interrupted)"; record "$meta,\"status\":\"skipped\""; return
    fi
    f=$(prompts "$n" "$i" "$o" "$sh") || { record "$meta,\"status\":\"failed\""; return; }
    log=$name-$run.log
    rm -f "$WORK/out.jsonl"*
    timeout -k 30 "$lim" "${launch_cmd[@]}" "$T" --model "$dir" --backend "$BACKEND" --tp "$TP" --pp "$PP" \
        --input "$f" --output "$WORK/out.jsonl" --max-model-len $((i + o)) "${seqs_flag[@]}" "${EXTRA[@]}" \
        >"$OUTDIR/$log" 2>&1
    rc=$?
    fields=$(parse_log "$OUTDIR/$log")
    local status=ok
    [ $rc = 124 ] || [ $rc = 137 ] && status=timeout
    [ $rc = 3 ] && status=interrupted
    [ $status = ok ] && [ $rc != 0 ] && status=failed
    record "$meta,\"status\":\"$status\",\"exit\":$rc,\"time_limit_s\":$lim,\"log\":\"$log\",$fields"
    echo "$name $run: $status (exit $rc) $(grep -o '[0-9.]* generated tok/s' "$OUTDIR/$log" | tail -1)"
    [ $status = failed ] && tail -3 "$OUTDIR/$log"
}

# ---- the Hugging Face baseline: hf_run SHAPE_NAME DIR, once per BENCH_HF_ATTN entry ("default":
# transformers' own choice, sdpa in 5.x; "eager"; "sdpa"); the first is the one tpinfer is compared with
hf_run() {
    local name=$1 dir=$2 lim f attn tag
    f=$(prompts 128 128 128) || return
    local dev=cuda
    [ "$BACKEND" = cpu ] && dev=cpu
    for attn in ${BENCH_HF_ATTN:-default eager}; do
        tag=$name
        [ "$attn" = default ] || tag=$name-$attn
        if ! lim=$(limit_for "${BENCH_HF_TIMEOUT:-240}"); then
            echo "$tag HF: skipped (time budget or interrupted)"
            record "\"kind\":\"hf_error\",\"model\":\"$name\",\"attn_asked\":\"$attn\",\"status\":\"skipped\""; return
        fi
        local attn_flag=()
        [ "$attn" = default ] || attn_flag=(--attn "$attn")
        timeout -k 10 "$lim" "$PY" "$root/bench/hf_baseline.py" --model "$dir" --prompts "$f" --batches "$HF_BATCHES" \
            --new-tokens 128 --device $dev "${attn_flag[@]}" >"$OUTDIR/hf-$tag.jsonl" 2>"$OUTDIR/hf-$tag.log"
        local rc=$?
        local line body
        while read -r line; do # hf_baseline.py prints one JSON object per line
            body=${line#\{}
            body=${body%\}}
            case $line in
                '{"batch"'*) record "\"kind\":\"hf\",\"model\":\"$name\",\"status\":\"ok\",\"attn_asked\":\"$attn\",$body" ;;
                '{"event": "load"'*) record "\"kind\":\"hf_load\",\"model\":\"$name\",\"attn_asked\":\"$attn\",$body" ;;
            esac
        done <"$OUTDIR/hf-$tag.jsonl"
        echo "$tag HF: exit $rc, $(grep -c '^{"batch"' "$OUTDIR/hf-$tag.jsonl") batch(es) measured"
        if [ $rc != 0 ]; then
            tail -3 "$OUTDIR/hf-$tag.log"
            record "\"kind\":\"hf_error\",\"model\":\"$name\",\"attn_asked\":\"$attn\",\"status\":\"failed\",\"exit\":$rc,\"time_limit_s\":$lim,\"log\":\"hf-$tag.log\""
        fi
    done
}

# ---- op microbenchmarks (built by make bench where they exist)
ops_run() {
    local op lim rc
    for op in gpu_matmul gpu_attention; do
        [ -x "$B/bench/$op" ] || continue
        if ! lim=$(limit_for "${BENCH_OPS_TIMEOUT:-90}"); then record "\"kind\":\"op\",\"name\":\"$op\",\"status\":\"skipped\""; continue; fi
        timeout -k 10 "$lim" "$B/bench/$op" >"$OUTDIR/op-$op.log" 2>&1
        rc=$?
        record "\"kind\":\"op\",\"name\":\"$op\",\"exit\":$rc,\"log\":\"op-$op.log\""
        echo "$op: exit $rc"
    done
}

# ---- results: bench.json and bench-results.md from the records
assemble() {
    BM_COMMAND=$command BM_DEVICE=${device:-?} BM_COMMIT=$commit BM_BACKEND=$BACKEND BM_BW=${bw:-} \
    BM_GRID="$TP $PP $DP" BM_SECONDS=$((SECONDS - START)) "$PY" - "$RECORDS" "$OUTDIR" "${BENCH_BREAKDOWN:-}" <<'PY'
import json, os, sys, time
records, outdir, breakdown = sys.argv[1:4]
E = os.environ
tp, pp, dp = map(int, E["BM_GRID"].split())
bw = float(E["BM_BW"]) if E.get("BM_BW") else None
out = {"command": E["BM_COMMAND"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "device": E["BM_DEVICE"], "commit": E["BM_COMMIT"], "backend": E["BM_BACKEND"], "tp": tp, "pp": pp,
       "dp": dp, "copy_bandwidth_Bps": bw, "seconds": int(E["BM_SECONDS"]), "models": {}, "ops": {}}
models = out["models"]
recs = []
with open(records) as f:
    for line in f:
        try:
            recs.append(json.loads(line))
        except ValueError:
            print("bad record: " + line.strip(), file=sys.stderr)
for r in recs:
    kind = r.pop("kind")
    if kind == "op":
        try:
            with open(os.path.join(outdir, r["log"]), errors="replace") as f:
                r["output"] = f.read()[-6000:]
        except (KeyError, OSError):
            pass
        out["ops"][r.pop("name")] = r
        continue
    m = models.setdefault(r.pop("model"), {})
    if kind == "model":
        m.update(r)
        if m.get("weight_bytes"):  # bytes streamed per decoded token: all but the embedding table
            m["bytes_per_token"] = m["weight_bytes"] - 2 * m["vocab"] * m["hidden"]
            if bw:
                m["hbm_limit_ms"] = 1e3 * m["bytes_per_token"] / tp / bw
    elif kind == "tpinfer":
        R, G0 = r.get("generated_tok_s_replica0"), r.get("generated_tokens_replica0")
        if R and G0:  # per second of replica 0's engine loop; all replicas' tokens (dp > 1)
            g, p = r.get("generated_tokens"), r.get("prompt_tokens")
            if r.get("status") != "ok" or not g:  # the summary counts finished requests only
                g, p = G0 * dp, (r.get("prompt_tokens_replica0") or 0) * dp
            r["generated_tok_s"] = g * R / G0
            r["total_tok_s"] = (g + p) * R / G0
            r["ms_per_token_run"] = 1e3 / R
        itl = (r.get("itl_ms") or {}).get("p50")
        if r["run"].startswith("b") and r["prompts"] == 1 and itl:
            r["ms_per_token"] = itl
            if m.get("hbm_limit_ms"):
                r["hbm_fraction"] = m["hbm_limit_ms"] / itl
        m.setdefault("runs", {})[r.pop("run")] = r
    elif kind == "hf":  # every attention asked for in hf_runs; the first one's in hf, which speedups use
        if r.get("status") == "ok":
            m.setdefault("hf_runs", []).append(dict(r))
            first = m.setdefault("hf_attn", r.get("attn_asked", "default"))
            if r.get("attn_asked", "default") == first:
                m.setdefault("hf", {})[str(r.pop("batch"))] = r
    elif kind == "hf_load":
        m.setdefault("hf_load", r)
        m.setdefault("hf_loads", []).append(r)
    elif kind == "hf_error":  # failed or skipped, one record per attention asked for
        m.setdefault("hf_errors", []).append(r)
for m in models.values():
    runs, hf = m.get("runs", {}), m.get("hf", {})
    sweep = {r["prompts"]: r["generated_tok_s"] for k, r in runs.items()
             if k.startswith("b") and r.get("status") == "ok" and r.get("generated_tok_s")}
    if sweep:
        m["sweep"] = {str(b): sweep[b] for b in sorted(sweep)}
    sp = {b: runs["b" + b]["generated_tok_s"] / h["tok_s"] for b, h in hf.items()
          if h.get("tok_s") and runs.get("b" + b, {}).get("status") == "ok" and runs["b" + b].get("generated_tok_s")}
    if sp:
        m["speedup_vs_hf"] = sp
if breakdown:
    try:
        with open(breakdown) as f:
            out["breakdown"] = json.load(f)
    except (OSError, ValueError) as e:
        print("BENCH_BREAKDOWN %s: %s" % (breakdown, e), file=sys.stderr)
with open(os.path.join(outdir, "bench.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")


def n(x, unit=""):
    if x is None:
        return "-"
    return ("{:,.0f}" if x >= 100 else "{:.2f}" if x < 10 else "{:.1f}").format(x) + unit


def pct(d):
    return "/".join(n(d.get(k)) for k in ("p50", "p90", "p99")) + " ms" if d else "-"


L = ["### %s %s, tp=%d pp=%d dp=%d, commit %s" % (out["date"][:10], out["device"], tp, pp, dp, out["commit"]), "",
     "Command: `%s`%s." % (out["command"], ". Copy bandwidth measured: %.2f TB/s" % (bw / 1e12) if bw else ""),
     "Throughput is over the engine loop (prefill included); TTFT and ITL are tpinfer's p50/p90/p99.", "",
     "| model | run | generated tok/s | total tok/s | time | TTFT | ITL | note |",
     "| --- | --- | --- | --- | --- | --- | --- | --- |"]
for name, m in models.items():
    if m.get("status") in ("failed", "skipped"):
        L.append("| %s | checkpoint | %s | | | | | %s |" % (name, m["status"].upper(),
                 "see gen-%s.log" % name if m["status"] == "failed" else "time budget"))
    for run, r in m.get("runs", {}).items():
        what = "%s: %d x (%d in / %d out)" % (run, r["prompts"], r["in"], r["out"])
        st = r.get("status")
        if st in ("skipped", "failed") or not r.get("generated_tok_s"):
            why = r.get("log", "")
            try:  # the log's last line says why
                with open(os.path.join(outdir, why), errors="replace") as f:
                    why += ": " + [x for x in f.read().splitlines() if x.strip()][-1][:160].replace("|", "/")
            except (OSError, IndexError):
                pass
            L.append("| %s | %s | %s | | | | | %s |" % (name, what, (st or "failed").upper(), why))
            continue
        note = []
        if st == "timeout":
            note.append("stopped at its %d s limit: partial" % r.get("time_limit_s", 0))
        elif st != "ok":
            note.append("%s: partial" % st)
        if r.get("ms_per_token"):
            note.append("%.2f ms/token (ITL p50)" % r["ms_per_token"])
        if r.get("hbm_fraction"):
            note.append("%.0f %% of the HBM limit (%.2f ms)" % (100 * r["hbm_fraction"], m["hbm_limit_ms"]))
        if r.get("seqs_at_once"):
            note.append("%d at once (the default)" % r["seqs_at_once"])
        if r.get("preempted"):
            note.append("%d preempted" % r["preempted"])
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, what, n(r["generated_tok_s"]), n(r.get("total_tok_s")), n(r.get("seconds"), " s"),
            pct(r.get("ttft_ms")), pct(r.get("itl_ms")), "; ".join(note)))
hf_rows = [(name, h, m) for name, m in models.items() for h in m.get("hf_runs", [])]
if hf_rows:
    L += ["", "| model | batch (128 in / 128 out) | Hugging Face generate() tok/s (attention) | tpinfer tok/s | "
          "tpinfer / HF | HF decode tok/s | tpinfer decode tok/s (batch / ITL p50) | decode: tpinfer / HF |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, h, m in hf_rows:
        b = str(h["batch"])
        run = m.get("runs", {}).get("b" + b, {})
        tpi = run.get("generated_tok_s") if run.get("status") == "ok" else None
        sp = tpi / h["tok_s"] if tpi and h.get("tok_s") else None
        itl = (run.get("itl_ms") or {}).get("p50")
        tpd = int(b) * 1e3 / itl if itl else None
        hfd = h.get("decode_tok_s")
        L.append("| %s | %s | %s (%s) | %s | %s | %s | %s | %s |" % (
            name, b, n(h.get("tok_s")), h.get("attn") or h.get("attn_asked", "?"), n(tpi),
            "%.2fx" % sp if sp else "-", n(hfd), n(tpd), "%.2fx" % (tpd / hfd) if tpd and hfd else "-"))
for name, m in models.items():
    for e in m.get("hf_errors", []):
        if e.get("status") == "skipped":
            what = "skipped (the time budget)"
        elif e.get("exit") in (124, 137):
            what = "stopped at its %d s limit (see %s)" % (e.get("time_limit_s", 0), e.get("log"))
        else:
            what = "failed (exit %s, see %s)" % (e.get("exit"), e.get("log"))
        L += ["", "Hugging Face baseline on %s, attention %s: %s." % (name, e.get("attn_asked", "default"), what)]
if out["ops"]:
    L += ["", "Op microbenchmarks: " + ", ".join("%s (exit %s, %s)" % (k, v.get("exit", "-"), v.get("log", v.get("status")))
                                                for k, v in out["ops"].items()) + "."]
text = "\n".join(L) + "\n"
with open(os.path.join(outdir, "bench-results.md"), "w") as f:
    f.write(text)
PY
}
trap 'echo "interrupted: skipping the rest, writing what was measured"; stop=1' TERM INT

# ---- the runs
echo "== $device; tp=$TP pp=$PP dp=$DP, backend $BACKEND, commit $commit"
idx=0
for shape in $SHAPES; do
    name=${shape%%:*}
    IFS=: read -r _ hidden layers heads kv inter vocab <<<"$shape"
    if [ $idx = 0 ]; then list="$RUNS"; for b in $SWEEP; do list="$list b$b"; done; else list=$RUNS_OTHER; fi
    # b runs first, then (main shape) the HF baseline, then the longer o runs
    declare -A seen=()
    bruns=() oruns=() maxpos=8192
    for run in $list; do
        [ -n "${seen[$run]:-}" ] && continue
        seen[$run]=1
        nio=$(run_name "$run") || { echo "unknown run name $run (bN, oNxINxOUT or sNxSxUxOUT)"; continue; }
        read -r n i o _ <<<"$nio"
        [ $((i + o)) -gt $maxpos ] && maxpos=$((i + o))
        if [ "${run:0:1}" = b ]; then bruns+=("$run"); else oruns+=("$run"); fi
    done
    unset seen
    [ ${#bruns[@]} -gt 0 ] && mapfile -t bruns < <(printf '%s\n' "${bruns[@]}" | sort -k1.2n)
    t0=$SECONDS
    if ! limit_for 60 >/dev/null; then
        echo "$name: skipped (time budget or interrupted)"; record "\"kind\":\"model\",\"model\":\"$name\",\"status\":\"skipped\""
    elif dir=$(model_dir "$shape" "$maxpos"); then
        echo "$name: $dir ready in $((SECONDS - t0)) s"
        record "\"kind\":\"model\",\"model\":\"$name\",\"hidden\":$hidden,\"layers\":$layers,\"heads\":$heads,\"kv_heads\":$kv,\"intermediate\":$inter,\"vocab\":$vocab,\"weight_bytes\":$(stat -c %s "$dir/model.safetensors"),\"prepare_s\":$((SECONDS - t0))"
        tdir=$(with_tokenizer "$dir") || { echo "BENCH_TOKENIZER=$BENCH_TOKENIZER: no tokenizer.json"; exit 1; }
        for run in "${bruns[@]}"; do bench_run "$name" "$tdir" "$run"; done
        [ $idx = 0 ] && [ "$HF" = 1 ] && hf_run "$name" "$dir"
        for run in "${oruns[@]}"; do bench_run "$name" "$tdir" "$run"; done
    else
        record "\"kind\":\"model\",\"model\":\"$name\",\"status\":\"failed\""
    fi
    [ $idx = 0 ] && [ "$OPS" = 1 ] && ops_run
    idx=$((idx + 1))
done
trap - TERM INT
assemble
if [ "$stop" = 0 ] && "$PY" -c 'import matplotlib' 2>/dev/null; then
    "$PY" "$root/bench/plot" "$OUTDIR/bench.json" "$OUTDIR/bench.png" && echo "plot: $OUTDIR/bench.png"
fi
echo
cat "$OUTDIR/bench-results.md"
[ "$stop" = 0 ] || exit 143
! grep -q '"status":"failed"' "$RECORDS" # exit 1 when a run or a checkpoint failed
