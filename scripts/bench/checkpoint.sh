#!/usr/bin/env bash
# Checkpoint save and load speed against the disk: the GPT-2 124M shape (12 layers, 12 heads, 768 wide, block
# 1024, vocab 50257) under zero3 at NP = 2 ranks, each rank writing its own shard (fp32 master weights and
# AdamW's two moments: 12 bytes per parameter, about 0.75 GB per rank).
#
#   scripts/bench/checkpoint.sh            # about 1.5 minutes on 2 cores
#
# Measured, side by side:
#   disk      sequential write rate of the checkpoint's file system: dd of 1 GiB with conv=fsync
#   save      one synchronous checkpoint after step 1 (write + fsync + rename of every shard, the manifest,
#             `latest`): MB/s per rank (its shard / the save's wall time) and for all ranks together
#   load      --resume from that checkpoint: each rank reads and checks (CRC-32C) its slices. The files were
#             just written, so this is mostly the page cache; it shows the reader's own cost
#   async     checkpoint.async: true, two steps with a save after each; how long the training loop was blocked
#             at the second save (the copy to host memory, into a buffer allocated and touched at start-up)
#             against the synchronous save's wall time
# Targets: save (all ranks) >= 0.7x the disk rate; async blocking no longer than the copy (by construction
# the loop only waits for the copy, or for a previous save still being written).
#
# Environment: NP (2), BUILD_DIR (build), DATA (../shared/data/tinyshakespeare.txt), DIR (a directory on the
# disk to measure; default: a temp dir under /tmp), KEEP=1 keeps it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$ROOT/scripts/bench/common.sh"
BUILD=${BUILD_DIR:-$ROOT/build}
NP=${NP:-2}
DATA=${DATA:-$ROOT/../shared/data/tinyshakespeare.txt}
command -v mpirun >/dev/null || { echo "mpirun (OpenMPI) not found" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

GPT=$BUILD/gpt-train
if [[ ! -x $GPT ]]; then
  [[ -f $BUILD/CMakeCache.txt ]] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j1 --target gpt-train >/dev/null
fi
bench_log "gpt-train: $GPT (built $(date -r "$GPT" '+%F %T'))"
TMP=${DIR:-$(mktemp -d /tmp/gpt-ckpt-bench.XXXXXX)}
mkdir -p "$TMP"
[[ ${KEEP:-0} == 1 ]] && bench_log "keeping $TMP" || trap 'rm -rf "$TMP"' EXIT

# --- the disk ---------------------------------------------------------------------------------------------------
bench_log "disk: dd 1 GiB with fsync into $TMP"
disk=$(dd if=/dev/zero of="$TMP/dd.bin" bs=1M count=1024 conv=fsync 2>&1 | tail -1)
rm -f "$TMP/dd.bin"
disk_s=$(sed -E 's/.* copied, ([0-9.]+) s.*/\1/' <<<"$disk")
disk_mbs=$(awk -v s="$disk_s" 'BEGIN { printf "%.0f", 1073741824 / s / 1e6 }')

# --- runs ---------------------------------------------------------------------------------------------------
bench_prepare "$GPT" "$DATA" "$TMP/data"
bench_config "$TMP/124m.yaml" checkpoint "$TMP/run" "$TMP/data" 1 12 12 768 1024 1 50257 1 "$NP"
cat >>"$TMP/124m.yaml" <<EOF
parallel:
  strategy: zero3
checkpoint:
  every: 1
EOF
run() {  # run NAME ARGS...: mpirun -np NP, rank 0's log in $TMP/NAME.log
  local name=$1
  shift
  bench_log "$name: mpirun -np $NP gpt-train train $*"
  mpirun -np "$NP" --oversubscribe "$GPT" train -c "$TMP/124m.yaml" "$@" >"$TMP/$name.log" 2>&1 ||
    { tail -20 "$TMP/$name.log"; exit 1; }
}
run save
ck=$TMP/run/checkpoints/step_00000001
save_s=$(grep -oE 'checkpoint step 1 saved to .* in [0-9.]+ s' "$TMP/save.log" | grep -oE '[0-9.]+ s$' | cut -d' ' -f1)
rank_bytes=$(stat -c %s "$ck/shard_00000.bin")
total_bytes=$(cat "$ck"/shard_*.bin | wc -c)
run load --set run.out_dir="$TMP/run_load" --resume "$ck"
load_line=$(grep -oE 'read [0-9.]+ MiB of shards in [0-9.]+ s' "$TMP/load.log")
load_mib=$(awk '{print $2}' <<<"$load_line")
load_s=$(awk '{print $7}' <<<"$load_line")
run async --set run.out_dir="$TMP/run_async" --set checkpoint.async=true --set training.steps=2
async_line=$(grep -oE 'training blocked [0-9.]+ s \([0-9.]+ s waiting' "$TMP/async.log" | tail -1)
blocked_s=$(awk '{print $3}' <<<"$async_line")
waited_s=$(awk '{print $5}' <<<"$async_line" | tr -d '(')
written_s=$(grep -oE 'written in the background in [0-9.]+ s' "$TMP/async.log" | tail -1 | awk '{print $6}')

# --- report ---------------------------------------------------------------------------------------------------
awk -v np="$NP" -v disk="$disk_mbs" -v rb="$rank_bytes" -v tb="$total_bytes" -v ss="$save_s" \
  -v lm="$load_mib" -v ls="$load_s" -v bs="$blocked_s" -v ws="$waited_s" -v wr="$written_s" 'BEGIN {
  save_rank = rb / ss / 1e6; save_all = tb / ss / 1e6; load_rank = lm * 1048576 / ls / 1e6
  printf "\ncheckpoint benchmark: GPT-2 124M shape, zero3, %d ranks, %.0f MB per rank (%.0f MB in all)\n", np, rb / 1e6, tb / 1e6
  printf "  %-34s %10s %12s\n", "", "MB/s", "vs disk"
  printf "  %-34s %10.0f %12s\n", "disk (dd 1 GiB, fsync)", disk, "1.00x"
  printf "  %-34s %10.0f %11.2fx\n", "save, per rank (" ss " s)", save_rank, save_rank / disk
  printf "  %-34s %10.0f %11.2fx   target >= 0.70x: %s\n", "save, all ranks together", save_all, save_all / disk, (save_all >= 0.7 * disk ? "PASS" : "FAIL")
  printf "  %-34s %10.0f %12s\n", "load, per rank (" ls " s, page cache)", load_rank, "-"
  printf "  async save: training blocked %.3f s vs %.2f s for the synchronous save; written in the background in %.2f s\n", bs, ss, wr
  printf "    of the %.3f s: %.3f s waiting for a previous save, %.3f s copying %.0f MB to host memory (%.1f GB/s)\n", bs, ws, bs - ws, rb / 1e6, rb / (bs - ws) / 1e9
  printf "  target: blocked no longer than the copy: %s\n", (ws < 0.001 ? "PASS" : "FAIL (waited for a previous save)")
}'
