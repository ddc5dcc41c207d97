#!/bin/sh
# fuzz_replay.sh: every libFuzzer target of tests/fuzz/ replays its seeds and the inputs
# that once crashed it (tests/fuzz/regressions/TARGET/), so what fuzzing found stays fixed.
# Under CI's sanitizer build a read out of bounds or a leak fails it; in any build an
# abort (a broken round trip, a stream that disagrees with the whole decode) does.
. "$top_srcdir/tests/lib.sh"
# these programs never start MPI, so leaks are theirs: check them (lib.sh turns it off)
export ASAN_OPTIONS="${ASAN_OPTIONS}:detect_leaks=1"
fz="$top_srcdir/tests/fuzz"
total=0
for t in chat_template chat_context tokenizer tokenizer_json requests safetensors model_config shard_index resume tool_calls json_prefix json_schema; do
    prog="$top_builddir/tests/fuzz/replay_$t"
    [ -x "$prog" ] || fail "$prog is not built"
    set --
    for d in "$fz/seeds/$t" "$fz/regressions/$t"; do [ -d "$d" ] && set -- "$@" "$d"; done
    [ $# -gt 0 ] || fail "tests/fuzz has no seeds for $t"
    if [ "$t" = tokenizer ]; then
        for name in gpt2 mistral-7b-v0.1; do
            dir="$TPINFER_SHARED/tokenizers/$name"
            [ -d "$dir" ] || { echo "$t: $dir is absent, not replayed"; continue; }
            # GPT-2's byte-level BPE is lossless: every valid text must decode back as it was
            roundtrip=$([ $name = gpt2 ] && echo 1 || echo)
            out=$(TPINFER_FUZZ_TOKENIZER=$dir TPINFER_FUZZ_ROUNDTRIP=$roundtrip "$prog" "$@" 2>&1) ||
                fail "$t ($name): $out"
            case $out in *"replayed 0 inputs"*) fail "$t ($name): nothing replayed" ;; esac
            echo "$t ($name): $out"
        done
        continue
    fi
    out=$("$prog" "$@" 2>&1) || fail "$t: $out"
    case $out in *"replayed 0 inputs"*) fail "$t: nothing replayed (tests/fuzz/seeds/$t is empty)" ;; esac
    echo "$t: $out"
    total=$((total + 1))
done
[ $total -eq 11 ] || fail "only $total of the 11 targets that need no shared files replayed"
echo "PASS"
