# tests/lib.sh: shared helpers of the shell tests (sourced). Automake's test protocol:
# exit 0 pass, 77 skip, anything else fail.
set -u
: "${top_builddir:=$(pwd)}"
: "${top_srcdir:=$(pwd)}"
: "${TPINFER_SHARED:=$top_srcdir/../shared}"
TPINFER="$top_builddir/tpinfer"
# Open MPI's plugins leave allocations that LeakSanitizer reports from unloaded modules,
# where no suppression can name them: the end-to-end tests (all MPI programs) check
# memory errors, the unit tests also leaks. A refused huge allocation must return NULL
# (as malloc does), not abort, so the out-of-memory messages can be tested.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:allocator_may_return_null=1"
MODELS="$TPINFER_SHARED/models"

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

need_shared() {
    [ -d "$MODELS" ] || skip "$MODELS is absent (set TPINFER_SHARED to the shared/ folder)"
}

# mpirun with what a 2-core CI machine run as root needs, for MPI_TIMEOUT seconds at most (120),
# then killed (Open MPI 4.1's mpirun was seen to hang, ignoring SIGTERM, after a killed rank).
mpi() {
    [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ] || skip "mpirun not found"
    local np=$1; shift
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
        timeout -k 10 "${MPI_TIMEOUT:-120}" "$MPIRUN" --oversubscribe -np "$np" "$@"
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpinfer-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# completions FILE [tokens]: an output file's lines without their creation times and prefix-cache
# counts (which follow the scheduling: --max-num-seqs, overlap, resume), sorted (two runs' lines
# compare whatever order they finished in); with "tokens" also without logprob values (runs whose
# sums may round differently: GPU products of other algorithms)
completions() {
    if [ "${2:-}" = tokens ]; then
        sed -e 's/"created":[0-9]*,//' -e 's/"logprob":[^,}]*//g' "$1"
    else
        cat "$1"
    fi | sed -e 's/"created":[0-9]*,//' -e 's/,"prompt_tokens_details":{"cached_tokens":[0-9]*}//' | sort
}

# ab_backend BACKEND: for a test of a knob's two settings, the backend (cpu, or cuda in float32
# from tests/gpu/run.sh) in $backend and its flags in $flags; ab_output FILE is what of an
# output the two settings must share: every byte on the CPU, the tokens on a GPU (products
# of other algorithms round otherwise)
ab_backend() { backend=$1; flags=; [ "$backend" = cpu ] || flags="--dtype float32"; }
ab_output() { if [ "$backend" = cpu ]; then completions "$1"; else completions "$1" tokens; fi; }

# run_lines NAME LINE...: tpinfer on the model $m (CPU backend, plus $lines_flags) over the
# JSONL lines, its output in $TMP/NAME.jsonl; a failed run fails the test. run_lines_with_errors
# wants the exit status 4 instead: some lines are error records, the others ran.
run_lines_exit() {
    local rl_want=$1 rl_name=$2 rl_rc=0; shift 2
    printf '%s\n' "$@" >"$TMP/$rl_name.in"
    "$TPINFER" --model "$m" --backend cpu ${lines_flags:-} --input "$TMP/$rl_name.in" --output "$TMP/$rl_name.jsonl" \
        2>"$TMP/$rl_name.err" || rl_rc=$?
    [ "$rl_rc" -eq "$rl_want" ] || { cat "$TMP/$rl_name.err"; fail "run $rl_name: exit $rl_rc, wanted $rl_want"; }
}
run_lines() { run_lines_exit 0 "$@"; }

# both_samplers NAME [WANT_RC]: $TMP/NAME.in through tpinfer ($m, the CPU backend) twice, with
# the backend's sample op and with the host sampler (TPINFER_SAMPLE_ON_HOST=1), into
# $TMP/NAME-0.jsonl and $TMP/NAME-1.jsonl: each exits WANT_RC (default 0), and both write
# the same lines.
both_samplers() {
    local bs_name=$1 bs_want=${2:-0} bs_path bs_rc
    for bs_path in 0 1; do
        bs_rc=0
        TPINFER_SAMPLE_ON_HOST=$bs_path "$TPINFER" --model "$m" --backend cpu --input "$TMP/$bs_name.in" \
            --output "$TMP/$bs_name-$bs_path.jsonl" 2>"$TMP/$bs_name-$bs_path.err" || bs_rc=$?
        [ "$bs_rc" -eq "$bs_want" ] || { cat "$TMP/$bs_name-$bs_path.err"; fail "$bs_name: exit $bs_rc (host sampler $bs_path), wanted $bs_want"; }
    done
    cmp -s "$TMP/$bs_name-0.jsonl" "$TMP/$bs_name-1.jsonl" ||
        { diff "$TMP/$bs_name-0.jsonl" "$TMP/$bs_name-1.jsonl" | head -4; fail "$bs_name: the sample op and the host sampler differ"; }
}
run_lines_with_errors() { run_lines_exit 4 "$@"; }

# expect_fail CODE NEEDLE CMD...: CMD exits CODE and its stderr contains NEEDLE.
expect_fail() {
    local code=$1 needle=$2; shift 2
    local rc=0
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq "$code" ] || { cat "$TMP/err" >&2; fail "'$*' exited $rc, wanted $code"; }
    grep -qF -- "$needle" "$TMP/err" || { cat "$TMP/err" >&2; fail "'$*': stderr lacks '$needle'"; }
}
