# tests/gpu/jobs.sh, sourced (after B is set to the build folder) by the GPU scripts that
# launch whole jobs with mpirun and judge how they end: the shared models' folder (SHARED:
# TPINFER_SHARED, ./.gpu-shared, ./shared or ../shared), the binary T, a scratch folder W
# removed at exit, the environment every rank needs (pass: mpirun's -x flags) and
# record CHECK RESULT DETAIL for the table that print_table prints last.
root=$(pwd)
SHARED=${TPINFER_SHARED:-$( [ -d .gpu-shared/models ] && echo "$root/.gpu-shared" ||
                          { [ -d shared/models ] && echo "$root/shared" || echo "$root/../shared"; })}
T=$B/tpinfer
W=$(mktemp -d "/tmp/$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$W"' EXIT
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=(-x NCCL_NVLS_ENABLE)
[ -n "${LD_LIBRARY_PATH:-}" ] && pass+=(-x LD_LIBRARY_PATH)
results=()
record() { results+=("| $1 | $2 | $3 |"); echo "== $1: $2 ($3)"; }
# the table; exits non-zero where a check failed
print_table() {
    echo "| check | result | detail |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${results[@]}"
    ! printf '%s\n' "${results[@]}" | grep -q "| FAIL |"
}
