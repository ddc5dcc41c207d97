# bench/tree_commit.sh (sourced by bench/gpu_decode.sh and tests/gpu/run.sh): tree_commit ROOT
# prints the commit a benchmark or test run reports: BENCH_COMMIT, else the commit `git
# archive` wrote into ROOT/bench/tree-commit (export-subst: a tree copied without its .git,
# where git would name the surrounding checkout's commit), else ROOT's checkout commit
# (+dirty with local changes), else ?.
tree_commit() {
    local root=$1 archived c
    archived=$(cat "$root/bench/tree-commit" 2>/dev/null)
    if [ -n "${BENCH_COMMIT:-}" ]; then
        echo "$BENCH_COMMIT"
    elif [ -n "$archived" ] && [ "${archived#\$}" = "$archived" ]; then
        echo "$archived"
    elif c=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
        [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && c="$c+dirty"
        echo "$c"
    else
        echo "?"
    fi
}
