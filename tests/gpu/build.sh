# tests/gpu/build.sh, sourced from the repository root by the GPU scripts: the environment for
# the -dev packages that machine lacks (gathered here into .gpu-deps/ by ../shared/tools/gpu-deps)
# and gpu_build TARGET...: autoreconf, configure --with-cuda into build-gpu/ (once; a warm
# machine keeps it) and make the targets, logs in $OUTDIR; B is the build folder. Exits on a
# failed build, with the logs' tails. GPU_PREBUILT=DIR: the targets built already in DIR.
# record CHECK RESULT adds a row to the table that print_results prints last.
root=$(pwd)
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$lib/pkgconfig LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NCCL_NVLS_ENABLE=0
B=$root/build-gpu
if [ -n "${GPU_PREBUILT:-}" ]; then
    # a build made elsewhere with --with-cuda for this machine's CUDA, NCCL and MPI (its
    # folder, relative to the repository root): device time is not spent compiling
    B=$root/$GPU_PREBUILT
    gpu_build() {
        local t
        for t in "$@"; do [ -x "$B/$t" ] || { echo "GPU_PREBUILT=$GPU_PREBUILT has no $t"; exit 1; }; done
    }
else
gpu_build() {
    ( set -e
      autoreconf -fi >/dev/null 2>&1
      mkdir -p "$B" && cd "$B"
      [ -f Makefile ] || ../configure -q --with-cuda CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib" >"$OUTDIR/configure.log" 2>&1
      make -j16 "$@" >"$OUTDIR/build.log" 2>&1
    ) || { tail -30 "$OUTDIR/build.log" "$OUTDIR/configure.log" 2>/dev/null; echo "build failed"; exit 1; }
}
fi
results=()
record() { results+=("| $1 | $2 |"); echo "== $1: $2"; }
# ops_check GROUP [TIMEOUT] [WHAT=PATTERN ...]: tests/check_backend_ops' GROUP (CK_RUN_CASE) into
# $OUTDIR/ops-GROUP.log, recorded as PASS with, for each WHAT, the count of log lines matching
# its PATTERN, or FAIL with the first lines that say why
ops_check() {
    local group=$1 limit=400 log=$OUTDIR/ops-$1.log detail= p
    shift
    case ${1:-} in [0-9]*) limit=$1; shift ;; esac
    if CK_FORK=no CK_RUN_CASE=$group timeout "$limit" "$B/tests/check_backend_ops" >"$log" 2>&1; then
        for p in "$@"; do detail+="${detail:+, }$(grep -c -- "${p#*=}" "$log") ${p%%=*}"; done
        record "check_backend_ops $group" "PASS${detail:+ ($detail)}"
    else
        record "check_backend_ops $group" "FAIL: $(grep -m2 -E 'Failure|Error|error|FAIL' "$log" | tr '|' '/' | cut -c1-200)"
    fi
}
# log_tail FILE [N]: FILE's last N lines (2) as one table cell
log_tail() { tail -"${2:-2}" "$1" 2>/dev/null | tr '|\n' '/ ' | cut -c1-200; }
# ab_lines AB_OUT PATTERN RUN...: from bench/ab_decode.sh's logs (AB_OUT/ab-logs.tar.gz), each
# line of the runs named (ab-K: the K-th variant) that matches PATTERN (grep -o), recorded
# under its run and model
ab_lines() {
    local dir=$1 pattern=$2 run log l
    shift 2
    local tmp
    tmp=$(mktemp -d) # outside $OUT: the logs are in the tarball already
    tar -C "$tmp" -xzf "$dir/ab-logs.tar.gz" "$@" 2>/dev/null
    for run in "$@"; do
        for log in "$tmp/$run"/llama-*.log; do
            [ -f "$log" ] || continue
            while IFS= read -r l; do record "$run $(basename "$log" .log)" "$l"; done < <(grep -o -- "$pattern" "$log")
        done
    done
    rm -rf "$tmp"
}
# matmul_rows VAR=VALUE...: bench/gpu_matmul under each setting, its one-row rows recorded
# (FAIL with its last lines where it fails); logs matmul-K.log, K the setting's place (the
# device tool returns no file with '=' in its name)
matmul_rows() {
    local v l i=0
    for v in "$@"; do
        i=$((i + 1))
        env "$v" timeout 60 "$B/bench/gpu_matmul" >"$OUTDIR/matmul-$i.log" 2>&1 ||
            record "gpu_matmul $v" "FAIL: $(log_tail "$OUTDIR/matmul-$i.log")"
        while IFS= read -r l; do record "gpu_matmul $v" "$l"; done < <(grep -E "^\| [a-z_+]+ \| 1 \|" "$OUTDIR/matmul-$i.log")
    done
}
# ab_rows LABEL LOG: each row of bench/ab_decode.sh's comparison table in LOG (not its header,
# not the per-operation tables after it), recorded under LABEL; FAIL with LOG's last lines
# where it holds no row (ab_decode.sh cut by its timeout prints no table)
ab_rows() {
    local line in_table=0 rows=0
    if [ -f "$2" ]; then
        while IFS= read -r line; do
            case $line in
            "| variant |"*) in_table=1 ;;
            "| ---"*) ;;
            "| "*) [ $in_table = 0 ] || { record "$1" "$line"; rows=$((rows + 1)); } ;;
            *) [ $in_table = 0 ] || break ;;
            esac
        done <"$2"
    fi
    [ $rows -gt 0 ] || record "$1" "FAIL: no rows in $2: $(log_tail "$2")"
    return 0
}
print_results() { printf '\n| check | result |\n| --- | --- |\n'; printf '%s\n' "${results[@]}"; }
