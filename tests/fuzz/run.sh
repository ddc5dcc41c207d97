#!/bin/sh
# tests/fuzz/run.sh [SECONDS] [TARGET...]: coverage-guided fuzzing (libFuzzer, clang) of
# every parser of a file a user gives, under AddressSanitizer and UBSan. Builds src/libtp.a
# with clang in $TPINFER_FUZZ_BUILD (default /tmp/tpinfer-fuzz), seeds each target from
# the project's tests and ../shared (when there), runs each for SECONDS (default 60), and
# prints a table. A crash leaves its input in $TPINFER_FUZZ_BUILD/crashes/TARGET/: copy it
# into tests/fuzz/regressions/TARGET/ with the fix, and `make check` replays it from then
# on. TPINFER_FUZZ_CC: the compiler (clang); TPINFER_FUZZ_TOKENIZER: the tokenizer
# directory the tokenizer target encodes with (GPT-2's from ../shared).
# Needs clang with its sanitizer runtimes (Debian: clang, libclang-rt-14-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
shared=${TPINFER_SHARED:-$top/../shared}
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-chat_template chat_context tokenizer tokenizer_json requests safetensors model_config shard_index resume tool_calls json_prefix json_schema}
build=${TPINFER_FUZZ_BUILD:-/tmp/tpinfer-fuzz}
cc=${TPINFER_FUZZ_CC:-clang}
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

mkdir -p "$build"
# configured once; make rebuilds what changed (also while an earlier build ran)
echo "== building src/libtp.a with $cc for fuzzing in $build"
[ -f "$top/configure" ] || (cd "$top" && autoreconf -fi)
(cd "$build" && { [ -f Makefile ] || "$top/configure" -q --without-cuda CC="$cc" \
    CFLAGS="-g -O1 $san -fsanitize=fuzzer-no-link" LDFLAGS="$san"; } && make -s src/libtp.a) \
    >"$build/build.log" 2>&1 || { tail -30 "$build/build.log"; exit 1; }
var() { sed -n "s/^$1 = //p" "$build/Makefile"; } # what configure found, as the build uses it
cflags="-std=c11 -D_GNU_SOURCE -g -O1 $san -I$top/src -I$top/tests -I$build $(var MPI_CFLAGS) $(var JANSSON_CFLAGS) $(var PCRE2_CFLAGS)"
libs="$build/src/libtp.a $(var JANSSON_LIBS) $(var PCRE2_LIBS) $(var UNISTRING_LIBS) $(var MPI_LIBS) $(var LIBS) $(var OPENMP_CFLAGS)"

# seeds: small valid inputs of each kind, from the tree and ../shared
seed() { mkdir -p "$build/seeds/$1"; cp -f "$2" "$build/seeds/$1/$(echo "$2" | cksum | cut -d' ' -f1)"; }
for t in chat_template chat_context tokenizer tokenizer_json requests safetensors model_config shard_index resume tool_calls json_prefix json_schema; do
    mkdir -p "$build/seeds/$t" "$build/corpus/$t" "$build/crashes/$t"
done
for f in "$here"/regressions/*/*; do [ -f "$f" ] && seed "$(basename "$(dirname "$f")")" "$f"; done
for f in "$here"/seeds/*/*; do [ -f "$f" ] && seed "$(basename "$(dirname "$f")")" "$f"; done
if [ -d "$shared/models" ]; then
    for d in "$shared"/models/* "$shared"/tokenizers/*; do
        [ -f "$d/config.json" ] && seed model_config "$d/config.json"
        [ -f "$d/generation_config.json" ] && seed model_config "$d/generation_config.json"
        [ -f "$d/tokenizer_config.json" ] &&
            python3 -c 'import json,sys; t=json.load(open(sys.argv[1])).get("chat_template"); t and isinstance(t,str) and sys.stdout.write(t)' \
                "$d/tokenizer_config.json" > "$build/seeds/chat_template/$(basename "$d")" || true
        for s in "$d"/*.safetensors; do [ -f "$s" ] && [ "$(wc -c < "$s")" -lt 2000000 ] && seed safetensors "$s"; done
    done
fi
python3 - "$build/seeds/requests" "$top/tests/sample_prompts.jsonl" <<'PY'
import sys
out, sample = sys.argv[1], sys.argv[2]
lines = open(sample, "rb").read()
for fmt in range(5):  # the first byte picks the format
    open(f"{out}/sample{fmt}", "wb").write(bytes([fmt]) + lines[:4000])
PY
# the real templates the chat template tests render (Llama-3.1, Qwen2.5, Qwen3, Mistral, ...)
{
    echo '#include <stdio.h>'
    echo '#include "check_chat_template_cases.h"'
    echo 'int main(int argc, char **argv) { (void)argc; char p[4096]; FILE *f;'
    for v in $(grep -o 'static const char TPL_[A-Z0-9_]*' "$top/tests/check_chat_template_cases.h" | cut -d' ' -f4); do
        echo "snprintf(p, sizeof p, \"%s/$v\", argv[1]); f = fopen(p, \"wb\"); fputs($v, f); fclose(f);"
    done
    echo 'return 0; }'
} > "$build/dump_templates.c"
$cc -I"$top/tests" -w "$build/dump_templates.c" -o "$build/dump_templates" && "$build/dump_templates" "$build/seeds/chat_template"
find "$build/seeds" -type f -size 0 -exec rm -f {} +

tok_dir=${TPINFER_FUZZ_TOKENIZER:-$shared/tokenizers/gpt2}
status=0
results=""
for t in $targets; do
    echo "== $t: building"
    $cc $cflags -fsanitize=fuzzer "$here/fuzz_$t.c" $libs -o "$build/fuzz_$t"
    extra="-dict=$here/json.dict"
    [ "$t" = chat_template ] && extra="-dict=$here/jinja.dict"
    [ "$t" = tokenizer ] && extra=""
    case $t in resume | chat_context) export TPINFER_FUZZ_SEED_DIR="$build/seeds/$t" ;; esac
    if [ "$t" = tokenizer ]; then
        [ -d "$tok_dir" ] || { echo "$t: skipped, $tok_dir is absent"; continue; }
        TPINFER_FUZZ_TOKENIZER="$tok_dir"
        TPINFER_FUZZ_ROUNDTRIP=$([ "$(basename "$tok_dir")" = gpt2 ] && echo 1 || echo 0)
        export TPINFER_FUZZ_TOKENIZER TPINFER_FUZZ_ROUNDTRIP
    fi
    echo "== $t: ${seconds}s"
    set +e
    : >"$build/$t.stamp"
    (cd "$build/crashes/$t" && "$build/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
        -max_len=65536 -print_final_stats=1 $extra "$build/corpus/$t" "$build/seeds/$t" > "$build/$t.log" 2>&1)
    rc=$?
    set -e
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$t.log")
    cov=$(grep -o 'cov: [0-9]*' "$build/$t.log" | tail -1 | cut -d' ' -f2)
    n_crash=$(find "$build/crashes/$t" -type f -newer "$build/$t.stamp" | wc -l) # this run's, not earlier ones
    [ $rc -eq 0 ] || { status=1; grep -m3 -E 'ERROR|SUMMARY|runtime error|deadly' "$build/$t.log" || true; }
    results="$results$(printf '%-15s %10s %8s %8s %s' "$t" "${runs:-?}" "${cov:-?}" "$n_crash" \
        "$([ $rc -eq 0 ] && echo ok || echo "FAIL (rc $rc, $build/$t.log)")")
"
done
printf '\n%-15s %10s %8s %8s %s\n' target runs edges crashes result
printf '%s' "$results"
exit $status
