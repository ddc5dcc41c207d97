#!/bin/sh
# CPU backend speed: a random-weight ~100M-parameter Llama (bf16 weights, float32 math),
# decode throughput at batch 1 and batch 16 at tp=1 (one rank, all cores) and tp=2 (two
# ranks, one core each). Run from a build directory:  sh ../bench/cpu_decode.sh
# Prints a table; copy it into bench/RESULTS.md with the date, machine and commit.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tpinfer=${TPINFER:-./tpinfer}
work=${BENCH_DIR:-/tmp/tpinfer-bench}
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="$work/llama-100m"
[ -f "$model/model.safetensors" ] ||
    python3 "$here/../tests/gen_tiny_model.py" "$model" --dtype bfloat16 --hidden 768 --layers 12 \
        --heads 12 --kv-heads 12 --intermediate 2304 --vocab 8192
params=$(python3 -c "import json,sys;c=json.load(open(sys.argv[1]));h,i,l,v=c['hidden_size'],c['intermediate_size'],c['num_hidden_layers'],c['vocab_size'];print(round((l*(4*h*h+3*h*i)+2*v*h)/1e6,1))" "$model/config.json")
cores=$(nproc)

rate() { sed -n 's/.*s: \([0-9.]*\) generated tok\/s.*/\1/p' "$1"; }
run() { # run TP BATCH -> tok/s
    tp=$1 batch=$2
    i=0; : >"$work/p.txt"
    while [ $i -lt "$batch" ]; do echo "Once upon a time, request $i" >>"$work/p.txt"; i=$((i + 1)); done
    if [ "$tp" -eq 1 ]; then
        "$tpinfer" --model "$model" --backend cpu --input "$work/p.txt" --output /dev/null \
            --max-tokens 64 --ignore-eos 2>"$work/log"
    else
        OMP_NUM_THREADS=$((cores / tp > 0 ? cores / tp : 1)) mpirun --oversubscribe -np "$tp" \
            "$tpinfer" --model "$model" --backend cpu --tp "$tp" --input "$work/p.txt" \
            --output /dev/null --max-tokens 64 --ignore-eos 2>"$work/log"
    fi
    rate "$work/log"
}
printf '%s\n' "model: random Llama, ${params}M parameters, bf16 weights; $cores cores; 64 new tokens per request"
printf '%-6s %-6s %s\n' "tp" "batch" "generated tok/s"
for tp in 1 2; do
    for batch in 1 16; do
        printf '%-6s %-6s %s\n' "$tp" "$batch" "$(run "$tp" "$batch")"
    done
done
