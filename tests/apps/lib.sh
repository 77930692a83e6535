# Shared set-up of the end-to-end shell tests (source it after setting gpt_train): a temporary $work
# directory removed on exit, mpirun's settings for root and oversubscribed cores, and
#   check DESCRIPTION COMMAND...   runs COMMAND, prints "ok: ..." or "FAIL: ..." (then $fail is 1);
#   prepare_data LINES TEXT MOD    $work/data prepared from LINES lines "TEXT <line % MOD>".
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail=0
check() {
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
prepare_data() {
  local i
  for i in $(seq "$1"); do echo "$2 $((i % $3))"; done > "$work/corpus.txt"
  "$gpt_train" prepare --input "$work/corpus.txt" --out "$work/data" > /dev/null 2>&1 ||
    { echo "FAIL: gpt-train prepare"; exit 1; }
}
