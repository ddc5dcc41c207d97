#!/bin/sh
# Bad flags: one line from rank 0 naming the flag, exit 2 on every rank, nobody left
# waiting; --help and --version exit 0. --errors naming the output (by any spelling) is a
# usage error, as are --errors and --status-file "-" ("-" is standard output for --output); a
# --chat-template that cannot be read or parsed is named, and one that renders a line's
# messages as nothing is that line's error, as is a guided line on a model without an end token;
# --backend auto where CUDA_VISIBLE_DEVICES hides every GPU warns that it runs
# on the CPU (in a build with CUDA; --backend cpu does not warn).
. "$top_srcdir/tests/lib.sh"

"$TPINFER" --help >"$TMP/help" || fail "--help exited $?"
grep -q -- "--tensor-parallel-size, --tp N" "$TMP/help" || fail "--help lacks --tp"
grep -q "(default: 1)" "$TMP/help" || fail "--help shows no defaults"
"$TPINFER" --version | grep -q "^tpinfer [0-9]" || fail "--version"

expect_fail 2 "--tp: '2x' is not allowed" "$TPINFER" --model m --dry-run --tp 2x
expect_fail 2 "--tp: '0' is not allowed" "$TPINFER" --model m --dry-run --tp 0
expect_fail 2 "--max-num-seqs: '99999999999999999999' is not allowed" \
    "$TPINFER" --model m --dry-run --max-num-seqs 99999999999999999999
expect_fail 2 "unknown option '--bogus'" "$TPINFER" --model m --bogus
expect_fail 2 "needs a value" "$TPINFER" --model
expect_fail 2 "--model is required" "$TPINFER" --dry-run
expect_fail 2 "--input is required" "$TPINFER" --model m
expect_fail 2 "--gpu-memory-utilization: '2' is not allowed" "$TPINFER" --model m --dry-run --gpu-memory-utilization 2
expect_fail 2 "--dtype: 'fp8'" "$TPINFER" --model m --dry-run --dtype fp8

# Under mpirun: every rank exits 2, only rank 0 speaks.
expect_fail 2 "--pp: '-1' is not allowed" mpi 3 "$TPINFER" --model m --dry-run --pp -1
n=$(grep -c "is not allowed" "$TMP/err")
[ "$n" -eq 1 ] || fail "expected one error line from 3 ranks, got $n"
mpi 2 "$TPINFER" --help >"$TMP/help2" || fail "--help under mpirun"
[ "$(grep -c '^Usage:' "$TMP/help2")" -eq 1 ] || fail "--help printed by more than rank 0"

# A world that the grid cannot use is a usage error, said once.
expect_fail 2 "start a multiple of 2 ranks" mpi 3 "$TPINFER" --model m --dry-run --tp 2
[ "$(grep -c 'multiple of 2' "$TMP/err")" -eq 1 ] || fail "grid error said more than once"
expect_fail 2 "needs 4 ranks but 2 were started" mpi 2 "$TPINFER" --model m --dry-run --tp 2 --pp 2

[ "$PYTHON3" != no ] || exit 0 # the rest runs a generated model
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/m" || fail "gen_tiny_model.py"
printf 'Once upon a time\n' >"$TMP/p.txt"
expect_fail 2 "the errors file and the output are both $TMP/o.jsonl; give two files" "$TPINFER" --model "$TMP/m" \
    --input "$TMP/p.txt" --output "$TMP/o.jsonl" --errors "$TMP/o.jsonl"
expect_fail 2 "are the same file; give two files" "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" \
    --output "$TMP/o.jsonl" --errors "$TMP/./o.jsonl"
# the manifest beside the output is replaced at each update: not the errors file, not the input
expect_fail 2 "the errors file $TMP/o.jsonl.manifest.json is the output's manifest" "$TPINFER" --model "$TMP/m" \
    --input "$TMP/p.txt" --output "$TMP/o.jsonl" --errors "$TMP/o.jsonl.manifest.json"
cp "$TMP/p.txt" "$TMP/o.jsonl.manifest.json"
expect_fail 2 "the input file $TMP/./o.jsonl.manifest.json is the output's manifest" "$TPINFER" --model "$TMP/m" \
    --input "$TMP/./o.jsonl.manifest.json" --output "$TMP/o.jsonl"
cmp -s "$TMP/p.txt" "$TMP/o.jsonl.manifest.json" || fail "a refused run changed the input named like the manifest"
rm -f "$TMP/o.jsonl.manifest.json"
[ -e "$TMP/o.jsonl" ] && fail "a refused run left an output behind"
# the output may not be the input (by any spelling, even with --overwrite), nor a directory;
# --resume does not read back a pipe
for flag in "" --overwrite; do
    expect_fail 2 "--output $TMP/./p.txt is the input file $TMP/p.txt (the same file); writing it would destroy the input" \
        "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --output "$TMP/./p.txt" $flag
done
[ "$(cat "$TMP/p.txt")" = "Once upon a time" ] || fail "a refused run changed the input named as the output"
mkdir "$TMP/outdir"
expect_fail 2 "--output $TMP/outdir is a directory; give a file name" "$TPINFER" --model "$TMP/m" \
    --input "$TMP/p.txt" --output "$TMP/outdir"
mkfifo "$TMP/outfifo"
expect_fail 2 "cannot --resume into $TMP/outfifo: not a regular file" "$TPINFER" --model "$TMP/m" \
    --input "$TMP/p.txt" --output "$TMP/outfifo" --resume
# "-" is standard output for --output (no file named "-"), as leaving it out; --errors and
# --status-file need files; --resume has nothing to resume on standard output
(cd "$TMP" && "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --output - --max-tokens 2 >"$TMP/dash.out" 2>"$TMP/err") ||
    { cat "$TMP/err"; fail "--output -"; }
[ -e "$TMP/-" ] && fail "--output - wrote a file named '-'"
"$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --max-tokens 2 >"$TMP/stdout.out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "a run to standard output"; }
[ "$(completions "$TMP/dash.out")" = "$(completions "$TMP/stdout.out")" ] && [ -s "$TMP/dash.out" ] ||
    fail "--output - and no --output differ: $(cat "$TMP/dash.out") / $(cat "$TMP/stdout.out")"
expect_fail 2 "--errors needs a file's path, not '-'" "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --errors -
expect_fail 2 "--status-file needs a file's path, not '-'" "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" \
    --status-file -
expect_fail 2 "--resume needs --output FILE" "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --output - --resume
# a --chat-template that cannot be read or parsed: the message names the option and the file,
# in a run and in --tokenize
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%' >"$TMP/bad.jinja"
for mode in "" --tokenize; do
    expect_fail 1 "--chat-template $TMP/bad.jinja: chat template: line 1: unclosed tag" "$TPINFER" $mode \
        --model "$TMP/m" --input "$TMP/p.txt" --chat-template "$TMP/bad.jinja"
    expect_fail 1 "--chat-template $TMP/none.jinja: cannot open" "$TPINFER" $mode --model "$TMP/m" \
        --input "$TMP/p.txt" --chat-template "$TMP/none.jinja"
done
# a chat template that renders a line's messages as nothing: that line's error record, the
# others run
printf '{%% if false %%}x{%% endif %%}' >"$TMP/empty.jinja"
printf '%s\n' '{"id":"c","messages":[{"role":"user","content":"hi"}]}' '{"id":"p","prompt":"hi"}' >"$TMP/chat.jsonl"
"$TPINFER" --model "$TMP/m" --input "$TMP/chat.jsonl" --output "$TMP/chat.out" --max-tokens 2 \
    --chat-template "$TMP/empty.jinja" 2>"$TMP/err"
[ $? = 4 ] || { cat "$TMP/err"; fail "an empty rendering: exit status not 4 (some requests failed)"; }
grep -q '"id":"c",.*"code":"invalid_request","message":"line 1: the chat template (--chat-template '"$TMP"'/empty.jinja) renders these messages as no text"' "$TMP/chat.out" ||
    fail "an empty rendering: no error record naming the template: $(cat "$TMP/chat.out")"
grep -q '"id":"p",.*"finish_reason":"length"' "$TMP/chat.out" || fail "the prompt beside an empty rendering did not run"
# a model that names no end-of-sequence token (none in config.json, generation_config.json or
# tokenizer_config.json): a guided line, which can only end at that token, is that line's
# error record; the other line runs
mkdir "$TMP/noeos"
for f in "$TMP"/m/*; do ln -s "$f" "$TMP/noeos/"; done
"$PYTHON3" - "$TMP/noeos" <<'PY' || fail "writing the model without an end token"
import json, os, sys
for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
    path = os.path.join(sys.argv[1], name)
    d = json.load(open(path))
    d = {k: v for k, v in d.items() if "eos" not in k}
    os.remove(path)  # the link to the original
    json.dump(d, open(path, "w"))
PY
printf '%s\n' '{"id":"g","prompt":"hi","guided_choice":["a","b"]}' '{"id":"p","prompt":"hi"}' >"$TMP/noeos.jsonl"
"$TPINFER" --model "$TMP/noeos" --input "$TMP/noeos.jsonl" --output "$TMP/noeos.out" --max-tokens 2 2>"$TMP/err"
[ $? = 4 ] || { cat "$TMP/err"; fail "a guided line on a model without an end token: exit status not 4"; }
grep -q '"id":"g",.*"code":"invalid_request","message":"line 1: guided_choice needs the model'"'"'s end-of-sequence token to end the text, and noeos names none' "$TMP/noeos.out" ||
    fail "a guided line on a model without an end token: $(cat "$TMP/noeos.out")"
grep -q '"id":"p",.*"finish_reason":"length"' "$TMP/noeos.out" || fail "the line beside the refused guided one did not run"
CUDA_VISIBLE_DEVICES= "$TPINFER" --model "$TMP/m" --input "$TMP/p.txt" --output "$TMP/a.jsonl" --max-tokens 2 \
    2>"$TMP/err" || { cat "$TMP/err"; fail "a run with CUDA_VISIBLE_DEVICES empty"; }
if grep -q "define HAVE_CUDA 1" "$top_builddir/config.h"; then
    grep -q 'rank 0 sees no GPU (CUDA_VISIBLE_DEVICES=""): running on the CPU backend' "$TMP/err" ||
        { cat "$TMP/err"; fail "no warning that the run fell back to the CPU"; }
else
    grep -q "sees no GPU" "$TMP/err" && fail "a build without CUDA warned of GPUs"
fi
CUDA_VISIBLE_DEVICES= "$TPINFER" --model "$TMP/m" --backend cpu --input "$TMP/p.txt" --output "$TMP/b.jsonl" \
    --max-tokens 2 2>"$TMP/err" || { cat "$TMP/err"; fail "--backend cpu with CUDA_VISIBLE_DEVICES empty"; }
grep -q "sees no GPU" "$TMP/err" && fail "--backend cpu warned of GPUs"
exit 0
