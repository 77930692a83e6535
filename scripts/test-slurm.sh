#!/usr/bin/env bash
# Slurm launch test: starts a throw-away one-node Slurm cluster on 127.0.0.1 and checks that gpt-train
#   1. under `srun -n 4 --mpi=pmix` (PMIx direct launch, no OMPI_* variables) gives the same per-step
#      losses as under `mpirun -np 4` (ZeRO-3, a tiny model, 10 steps);
#   2. in an sbatch job whose batch script forwards SIGUSR1 to srun's tasks, checkpoints after the
#      signal and exits 0, and the resubmitted job (`--resume auto`) finishes with the same losses
#      (the final one included) as an uninterrupted run. (The job is submitted again rather than
#      requeued as scripts/slurm/*.sbatch do: Slurm holds a requeued job back for about 2 minutes.)
#   3. runs the shipped templates as a user submits them (scripts/slurm/cpu, single-node and multi-node.sbatch,
#      sized down on the sbatch command line; the GPU ones on 4 GPUs Slurm counts, training on the CPU):
#      each finishes with section 1's final loss, multi-node as hybrid (2 replicas x 2-rank zero3); and
#      single-node.sbatch signalled mid-run checkpoints, requeues itself (scontrol requeue, then made eligible
#      at once with scontrol update StartTime=now) and resumes to the uninterrupted run's every loss.
# It installs munge and Slurm from Debian/Ubuntu packages when missing (munge slurmctld slurmd
# slurm-client libpmix-dev; about 10 s), runs munged, slurmctld and slurmd in the foreground (-D) in
# the background of this script with their own key, socket, config (SLURM_CONF), state, spool and
# logs under a temporary directory, no cgroups (proctrack/linuxproc, task/none), MpiDefault=pmix,
# and a node that claims 8 CPUs (SlurmdParameters=config_overrides) and 4 GPUs (gres.conf: character devices
# that are /dev/null, made with mknod). On exit it cancels its jobs,
# stops the daemons it started by PID and removes the directory. Prints PASS/FAIL per check and
# exits non-zero on any failure. Needs root (slurmd runs the jobs). About 40 s on 2 cores once installed.
#
# Environment:
#   GPT_TRAIN           the binary (default $BUILD_DIR/gpt-train, BUILD_DIR default build, relative
#                       to the repository root)
#   TEST_SLURM_TEXT     text to train on (default ../shared/data/tinyshakespeare.txt; if absent,
#                       the `fortunes` package's file, then README.md)
#   TEST_SLURM_STEPS    steps of the signal/resume run (default 1500; it is signalled after 20)
#   TEST_SLURM_PORT     slurmctld's port, slurmd's is the next one (default: a free pair from 26817)
#   TEST_SLURM_KEEP=1   keep the temporary directory (logs, runs) for a look afterwards
#
# Notes on Debian's Slurm (22.05 in bookworm): the PMIx plugin (mpi_pmix.so, mpi_pmix_v4.so) comes
# with slurm-wlm-basic-plugins (a dependency of slurmd). It dlopen()s the unversioned
# /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so, which only libpmix-dev ships (libopenmpi-dev pulls
# it in; it is installed here explicitly); without it the plugin logs "pmi/pmix: can not load PMIx
# library". The PMIx there (4.2) is the one Debian's OpenMPI 4.1 uses, so srun can launch its ranks.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)

log() { echo "test-slurm: $*"; }
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
die() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root: slurmd runs the jobs and the daemons run as root (run it with sudo)"

gpt=${GPT_TRAIN:-${BUILD_DIR:-build}/gpt-train}
[[ $gpt = /* ]] || gpt="$repo/$gpt"
[ -x "$gpt" ] || die "gpt-train binary '$gpt' not found: build it first (scripts/setup.sh) or set GPT_TRAIN"

text=${TEST_SLURM_TEXT:-../shared/data/tinyshakespeare.txt}
if [ ! -f "$text" ]; then
  for alt in /usr/share/games/fortunes/fortunes README.md; do
    [ -f "$alt" ] && { log "$text not found, training on $alt"; text=$alt; break; }
  done
fi
[[ $text = /* ]] || text="$repo/$text"
steps=${TEST_SLURM_STEPS:-1500}

# --- packages --------------------------------------------------------------------------------------
packages=(munge slurmctld slurmd slurm-client libpmix-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  # Under systemd the packages' services would start with /etc/slurm/slurm.conf, which does not exist:
  # their units have ConditionPathExists on it, so nothing of the system's is started. Ours use other ports.
  if ! out=$(apt-get update -qq 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1); then
    tail -n 20 <<< "$out"
    die "apt-get install ${missing[*]} failed"
  fi
fi
for b in munged mungekey munge slurmctld slurmd srun sbatch scancel scontrol sinfo mpirun; do
  command -v "$b" > /dev/null || die "$b not found after installing ${packages[*]} (and openmpi-bin)"
done
pmix_plugin=""
for f in /usr/lib/*/slurm-wlm/mpi_pmix*.so /usr/lib*/slurm/mpi_pmix*.so; do
  [ -f "$f" ] && { pmix_plugin=$f; break; }
done
[ -n "$pmix_plugin" ] ||
  die "Slurm's PMIx plugin (mpi_pmix*.so) is missing: on Debian/Ubuntu it is in slurm-wlm-basic-plugins"
log "Slurm $(slurmctld -V | awk '{print $2}'), PMIx plugin $pmix_plugin"

# --- the cluster -----------------------------------------------------------------------------------
# Run from inside a Slurm job (a CI runner on Slurm) the outer job's variables would steer our clients.
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done

tmp=$(mktemp -d /tmp/gpt-slurm.XXXXXX)
chmod 711 "$tmp"  # munged wants every directory above its socket searchable
pids=()           # daemons started here, in start order
child=""          # the srun or mpirun being waited for
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  ((rc == 130 || rc == 143)) && echo "FAIL: interrupted (signal $((rc - 128))); cleaning up"
  if [ -n "$child" ]; then  # interrupted: timeout passes the TERM on to srun (which cancels its step) or mpirun
    kill -TERM "$child" 2> /dev/null
    for _ in $(seq 100); do kill -0 "$child" 2> /dev/null || break; sleep 0.1; done
  fi
  if [ -S "$tmp/munge/munge.socket" ] && ((${#pids[@]} > 1)); then
    local jobs
    jobs=$(timeout 10 squeue -h -o %i 2> /dev/null)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086 # one job ID a word
      timeout 10 scancel --full $jobs 2> /dev/null
      for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %i 2> /dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill -TERM "$p" 2> /dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null
    wait "$p" 2> /dev/null
  done
  # A task that outlived its job (slurmstepd detaches from slurmd): only ours, named by this directory.
  for p in $(pgrep -f -- "$tmp/" 2> /dev/null); do [ "$p" != $$ ] && kill -KILL "$p" 2> /dev/null; done
  if [ "${TEST_SLURM_KEEP:-0}" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Long commands run in the background and are waited for: bash acts on a signal only once a foreground
# command has ended (and drops a SIGINT that did not kill it), while `wait` returns at once.
run_child() {
  "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  return "$rc"
}
nap() {
  sleep "$1" &
  wait $!
}

show_logs() {  # show_logs FILE...: the last lines of each, for a failure
  local f
  for f in "$@"; do
    [ -f "$f" ] || continue
    echo "---- tail of $f"
    tail -n 25 "$f"
  done
}
bail() {  # a step the rest depends on failed
  fail "$1"
  show_logs "$tmp"/log/*.log
  echo "FAILED: $fails check(s)"
  exit 1
}

mkdir -p "$tmp"/{munge,etc,state,spool,log,tmp,runs}
chmod 711 "$tmp/munge"

# munge: its own key and socket.
mungekey --create --keyfile="$tmp/munge/munge.key" || bail "mungekey"
sock=$tmp/munge/munge.socket
munged --foreground --force --socket="$sock" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" --log-file="$tmp/log/munged.log" \
  > "$tmp/log/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do munge -n -S "$sock" 2> /dev/null | unmunge -S "$sock" > /dev/null 2>&1 && break; nap 0.1; done
munge -n -S "$sock" 2> /dev/null | unmunge -S "$sock" > /dev/null 2>&1 || bail "munged did not come up"

port_free() { ! (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
port=${TEST_SLURM_PORT:-26817}
if [ -z "${TEST_SLURM_PORT:-}" ]; then
  while ! { port_free "$port" && port_free $((port + 1)); }; do port=$((port + 2)); done
fi

host=$(hostname -s)
export SLURM_CONF=$tmp/etc/slurm.conf
cat > "$SLURM_CONF" << EOF
# One node on 127.0.0.1, written by scripts/test-slurm.sh.
ClusterName=gpttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
TmpFS=$tmp/tmp
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=600
SlurmctldDebug=info
SlurmdDebug=info
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=8192 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=30 State=UP
EOF
# Four GPUs for the GPU templates' --gpus-per-node: Slurm counts a gpu only with a device file, so these are
# character devices that are /dev/null (1,3); nothing runs on them (the jobs train on the CPU).
mkdir -p "$tmp/dev"
for i in 0 1 2 3; do
  mknod "$tmp/dev/gpu$i" c 1 3 2> /dev/null && continue
  # Without CAP_MKNOD (some containers): plain files, which slurmd counts too, logging that they are not devices.
  ((i == 0)) && log "mknod not permitted: the fake GPUs are plain files"
  touch "$tmp/dev/gpu$i"
done
echo "NodeName=$host Name=gpu File=$tmp/dev/gpu[0-3]" > "$tmp/etc/gres.conf"
slurmctld -D -f "$SLURM_CONF" > "$tmp/log/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" > "$tmp/log/slurmd.log" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -n "$host" -o %t 2> /dev/null)
  [ "$state" = idle ] && break
  nap 0.2
done
[ "$state" = idle ] || bail "the node did not come up idle within 30 s (state '$state')"
log "cluster up in $tmp: node $host, 8 CPUs, partition debug, ports $port/$((port + 1))"

# --- data and config -------------------------------------------------------------------------------
"$gpt" prepare --input "$text" --out "$tmp/data" > "$tmp/log/prepare.log" 2>&1 ||
  { show_logs "$tmp/log/prepare.log"; bail "gpt-train prepare --input $text"; }
cfg=$tmp/tiny.yaml
cat > "$cfg" << EOF
run:
  name: slurm-test
  out_dir: $tmp/runs/default
  seed: 1337
  threads: 1
model:
  n_layer: 2
  n_head: 2
  n_embd: 32
  block_size: 32
  dropout: 0.0
data:
  train: $tmp/data/train.bin
  val: $tmp/data/val.bin
training:
  steps: 10
  micro_batch_size: 2
  global_batch_sequences: 8
  warmup_steps: 1
  eval_interval: 0
  eval_batches: 1
logging:
  log_interval: 100
EOF
export OMP_NUM_THREADS=1

losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,}]*\).*/\1 \2/p' "$1" 2> /dev/null; }
same_losses() {  # same_losses WHAT A.jsonl B.jsonl STEPS: every step's loss equal, STEPS of them
  local what=$1 a=$2 b=$3 n=$4 la lb
  la=$(losses "$a")
  lb=$(losses "$b")
  if [ "$(wc -l <<< "$la")" -ne "$n" ] || [ "$(wc -l <<< "$lb")" -ne "$n" ]; then
    fail "$what: expected $n steps, got $(grep -c . <<< "$la") and $(grep -c . <<< "$lb")"
  elif [ "$la" != "$lb" ]; then
    fail "$what: losses differ"
    diff <(echo "$la") <(echo "$lb") | head -10
  else
    pass "$what ($n steps, final loss $(tail -1 <<< "$la" | cut -d' ' -f2))"
  fi
}

# --- 1. srun --mpi=pmix vs mpirun ------------------------------------------------------------------
run1=(train -c "$cfg" --set parallel.strategy=zero3)
if run_child timeout -k 5 90 srun -p debug -n 4 --mpi=pmix -t 5 -J srun-zero3 "$gpt" "${run1[@]}" \
  --set run.out_dir="$tmp/runs/srun" > "$tmp/log/srun.log" 2>&1; then
  if grep -q "over 4 rank(s)" "$tmp/log/srun.log"; then
    pass "srun -n 4 --mpi=pmix: 4 ranks from PMIx, zero3, exit 0"
  else
    fail "srun -n 4 --mpi=pmix: the ranks did not form one world of 4"
    show_logs "$tmp/log/srun.log"
  fi
else
  fail "srun -n 4 --mpi=pmix gpt-train train (exit $?)"
  show_logs "$tmp/log/srun.log" "$tmp/log/slurmd.log"
fi
if run_child env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 90 mpirun -np 4 --oversubscribe \
  "$gpt" "${run1[@]}" --set run.out_dir="$tmp/runs/mpirun" > "$tmp/log/mpirun.log" 2>&1; then
  pass "mpirun -np 4: exit 0"
else
  fail "mpirun -np 4 gpt-train train (exit $?)"
  show_logs "$tmp/log/mpirun.log"
fi
same_losses "srun and mpirun per-step losses equal" "$tmp/runs/srun/metrics.jsonl" "$tmp/runs/mpirun/metrics.jsonl" 10

# --- 2. sbatch, SIGUSR1, checkpoint, resubmit, resume -----------------------------------------------
run2_sets=(--set parallel.strategy=zero3 --set training.steps="$steps" --set checkpoint.every=1000
  --set logging.log_interval=100)
run2=(train -c "$cfg" --resume auto "${run2_sets[@]}")
sig_dir=$tmp/runs/signal
job=$tmp/resume.sbatch
srun_cmd=$(printf 'srun --mpi=pmix -n 2 %q' "$gpt" && printf ' %q' "${run2[@]}" --set run.out_dir="$sig_dir")
cat > "$job" << EOF
#!/bin/bash
#SBATCH --job-name=gpt-resume
#SBATCH --ntasks=2
#SBATCH --time=5
#SBATCH --output=$tmp/log/job-%j.log
# SIGUSR1 to this shell (scancel --signal=USR1 --batch, or --signal=B:USR1@T) goes on to the tasks,
# which checkpoint after the current step and exit 0.
woken=0
trap 'woken=1; echo "batch: SIGUSR1, forwarding it to srun (\$pid)"; kill -USR1 \$pid' USR1
$srun_cmd &
pid=\$!
wait \$pid
rc=\$?
while ((woken)); do woken=0; wait \$pid; rc=\$?; done  # the trap ends a wait early: wait again
echo "batch: srun exited \$rc"
exit \$rc
EOF

job_state() { timeout 10 scontrol show job -o "$1" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_exit() { timeout 10 scontrol show job -o "$1" 2> /dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2; }
wait_job() {  # wait_job ID SECONDS: until it has ended; prints its final state
  local s="" i
  for ((i = 0; i < $2 * 5; i++)); do
    s=$(job_state "$1")
    case $s in PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | RESIZING | "") ;; *) break ;; esac
    nap 0.2
  done
  echo "$s"
}

# signal_after_20_steps JID METRICS [WHAT]: once METRICS has 20 steps (60 s at most, less if the job ends first),
# SIGUSR1 to the job's batch shell; returns 0 when it was sent, else a FAIL (prefixed by WHAT) says why.
signal_after_20_steps() {
  local jid=$1 metrics=$2 what=${3:+$3: } n=0 i
  for ((i = 0; i < 1200; i++)); do
    n=$(grep -c '"loss"' "$metrics" 2> /dev/null)
    ((n >= 20)) && break
    if ((i % 20 == 19)); then  # now and then: has it ended without?
      case $(job_state "$jid") in PENDING | CONFIGURING | RUNNING | "") ;; *) break ;; esac
    fi
    nap 0.05
  done
  if ((n < 20)); then
    fail "${what}job $jid did not log 20 steps (state $(job_state "$jid"))"
    return 1
  fi
  timeout 10 scancel --signal=USR1 --batch "$jid" && return 0
  fail "${what}scancel --signal=USR1 --batch $jid"
  return 1
}

# The uninterrupted reference, same config, another out_dir.
run_child timeout -k 5 120 srun -p debug -n 2 --mpi=pmix -t 5 -J reference "$gpt" "${run2[@]}" \
  --set run.out_dir="$tmp/runs/reference" > "$tmp/log/reference.log" 2>&1 ||
  { fail "the uninterrupted reference run (srun -n 2, exit $?)"; show_logs "$tmp/log/reference.log"; }

jid=$(timeout 30 sbatch --parsable "$job") || bail "sbatch $job"
jid=${jid%%;*}
signal_after_20_steps "$jid" "$sig_dir/metrics.jsonl"
st=$(wait_job "$jid" 90)
jlog=$tmp/log/job-$jid.log
ck_step=$(losses "$sig_dir/metrics.jsonl" | tail -1 | cut -d' ' -f1)
signalled=0
ck_dir=$(printf '%s/checkpoints/step_%08d' "$sig_dir" "${ck_step:-0}")
if [ "$st" = COMPLETED ] && [ "$(job_exit "$jid")" = 0:0 ] && grep -q "checkpoint saved after signal" "$jlog" &&
  [ -n "$ck_step" ] && ((ck_step < steps)) && [ -d "$ck_dir" ]; then
  pass "sbatch job $jid: SIGUSR1 forwarded by the batch script, checkpoint $(basename "$ck_dir") saved, exit 0"
  signalled=1
else
  fail "sbatch job $jid after SIGUSR1: state ${st:-?}, exit $(job_exit "$jid"), last step ${ck_step:-none}/$steps, $ck_dir $([ -d "$ck_dir" ] && echo exists || echo missing)"
  grep -q "checkpoint saved after signal" "$jlog" 2> /dev/null || echo "  (no 'checkpoint saved after signal' in $jlog)"
  show_logs "$jlog"
fi

if ((!signalled)); then
  fail "resubmit and resume: not tried, there is no checkpoint saved after the signal"
  show_logs "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log"
  echo "FAILED: $fails check(s)"
  exit 1
fi
jid2=$(timeout 30 sbatch --parsable "$job") || bail "sbatch $job (resubmission)"
jid2=${jid2%%;*}
st=$(wait_job "$jid2" 120)
jlog2=$tmp/log/job-$jid2.log
if [ "$st" = COMPLETED ] && [ "$(job_exit "$jid2")" = 0:0 ] && grep -q "resumed from $ck_dir " "$jlog2"; then
  pass "resubmitted job $jid2: resumed from $(basename "$ck_dir") (--resume auto) and finished, exit 0"
else
  fail "resubmitted job $jid2: state ${st:-?}, exit $(job_exit "$jid2")$(grep -q "resumed from $ck_dir " "$jlog2" 2> /dev/null || echo ", did not log 'resumed from $ck_dir'")"
  show_logs "$jlog2"
fi
final=$(losses "$sig_dir/metrics.jsonl" | tail -1)
ref_final=$(losses "$tmp/runs/reference/metrics.jsonl" | tail -1)
if [ -n "$final" ] && [ "$final" = "$ref_final" ] && [ "${final%% *}" = "$steps" ]; then
  pass "final loss after signal + resume equals the uninterrupted run's (step $steps, loss ${final#* })"
else
  fail "final loss after signal + resume '${final:-none}' vs uninterrupted '${ref_final:-none}' (step loss)"
fi
same_losses "every step's loss after signal + resume equals the uninterrupted run's" \
  "$sig_dir/metrics.jsonl" "$tmp/runs/reference/metrics.jsonl" "$steps"

# --- 3. the shipped templates: scripts/slurm/*.sbatch -----------------------------------------------
# Each as a user submits it (its #SBATCH lines, srun --mpi=pmix, the SIGUSR1 trap and requeue), sized down on
# the sbatch command line to this node: 8 CPUs, 4 GPUs that Slurm counts but that have no devices, so the GPU
# templates train on the CPU (the --set run.device=cpu passed after the script overrides their run.device=cuda).
# The tiny config, 10 steps: the final loss as the srun run of section 1 (same global batch, other world sizes
# and strategies: within 1e-4).
ref_loss=$(losses "$tmp/runs/srun/metrics.jsonl" | tail -1 | cut -d' ' -f2)
close_to_ref() { awk -v a="$1" -v b="$ref_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-4 * (b < 0 ? -b : b)) }'; }
template_job() {  # template_job NAME LOG [sbatch options...] -- [gpt-train train options...]: prints the job id
  local name=$1 out=$2
  shift 2
  local opts=()
  while (($#)) && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  # -t 30 (the partition's limit): the templates' --signal=B:USR1@120 must not come during a run here.
  (cd "$repo" && CONFIG=$cfg GPT_TRAIN=$gpt timeout 30 sbatch --parsable -p debug -t 30 --output="$out" \
    "${opts[@]}" "scripts/slurm/$name.sbatch" "$@") | cut -d';' -f1
}
declare -A tpl_args=()  # single-node.sbatch as shipped: the tiny config sets no strategy, so auto picks (ddp here)
declare -A tpl_opts=(
  [cpu]="--ntasks=2 --cpus-per-task=2 --mem-per-cpu=100M"
  [single-node]="--gpus-per-node=2 --ntasks-per-node=2 --cpus-per-task=1"
  [multi-node]="--nodes=1 --gpus-per-node=4 --ntasks-per-node=4 --cpus-per-task=1"
)
declare -A tpl_ranks=([cpu]=2 [single-node]=2 [multi-node]=4)
# What the rank 0 log says of the strategy (cpu.sbatch's STRATEGY default; multi-node with SHARD_GROUP=2).
declare -A tpl_label=([cpu]="strategy zero1" [single-node]="parallel.strategy auto chose ddp"
  [multi-node]="hybrid (2 replicas x 2-rank zero3 shard groups)")
for t in cpu single-node multi-node; do
  out=$tmp/log/tpl-$t.log
  shard_group=""
  [ "$t" = multi-node ] && shard_group=2
  # shellcheck disable=SC2086 # the options a word each
  jid=$(SHARD_GROUP=$shard_group template_job "$t" "$out" ${tpl_opts[$t]} -- --set run.device=cpu ${tpl_args[$t]:-} \
    --set run.out_dir="$tmp/runs/tpl-$t" --set logging.log_interval=100)
  [ -n "$jid" ] || { fail "sbatch scripts/slurm/$t.sbatch ${tpl_opts[$t]}"; continue; }
  st=$(wait_job "$jid" 120)
  final=$(losses "$tmp/runs/tpl-$t/metrics.jsonl" | tail -1)
  if [ "$st" = COMPLETED ] && [ "$(job_exit "$jid")" = 0:0 ] && grep -q "over ${tpl_ranks[$t]} rank(s)" "$out" &&
    [ "${final%% *}" = 10 ] && close_to_ref "${final#* }"; then
    pass "scripts/slurm/$t.sbatch (${tpl_opts[$t]}): ${tpl_ranks[$t]} ranks, 10 steps, final loss ${final#* } (srun zero3: $ref_loss)"
  else
    fail "scripts/slurm/$t.sbatch (${tpl_opts[$t]}): state ${st:-?}, exit $(job_exit "$jid"), last step/loss '${final:-none}' vs $ref_loss"
    show_logs "$out"
  fi
  if ! grep -qF "${tpl_label[$t]}" "$out"; then
    fail "scripts/slurm/$t.sbatch: no '${tpl_label[$t]}' in its log"
    show_logs "$out"
  fi
done

# single-node.sbatch's own requeue: SIGUSR1 to the batch shell, the ranks checkpoint and exit 0, the script
# requeues the job (scontrol requeue), which Slurm holds back (about 2 minutes; made eligible at once here with
# scontrol update StartTime=now), and the second run resumes (--resume auto) to the end: every step's loss as the
# uninterrupted reference of section 2 (the same run config).
out=$tmp/log/tpl-requeue.log
rq_dir=$tmp/runs/tpl-requeue
# shellcheck disable=SC2086 # the options a word each
jid=$(template_job single-node "$out" ${tpl_opts[single-node]} -- --set run.device=cpu "${run2_sets[@]}" \
  --set run.out_dir="$rq_dir")
if [ -z "$jid" ]; then
  fail "sbatch scripts/slurm/single-node.sbatch (requeue run)"
else
  signalled=0
  signal_after_20_steps "$jid" "$rq_dir/metrics.jsonl" "scripts/slurm/single-node.sbatch (requeue run)" && signalled=1
  restarted=0
  for ((i = 0; signalled && i < 300; i++)); do  # until the script has requeued it (60 s at most)
    info=$(timeout 10 scontrol show job -o "$jid" 2> /dev/null)
    if grep -q 'Restarts=[1-9]' <<< "$info" && grep -q 'JobState=PENDING' <<< "$info"; then
      timeout 10 scontrol update JobId="$jid" StartTime=now && restarted=1
      break
    fi
    nap 0.2
  done
  ((signalled)) || timeout 10 scancel "$jid"
  st=$(wait_job "$jid" 120)
  if ((restarted)) && [ "$st" = COMPLETED ] && [ "$(job_exit "$jid")" = 0:0 ] &&
    grep -q "SIGUSR1: forwarding it to the ranks" "$out" && grep -q "(restart 1)" "$out" && grep -q "resumed from" "$out"; then
    pass "scripts/slurm/single-node.sbatch: SIGUSR1, checkpoint, requeued by the script, resumed, exit 0"
  else
    fail "scripts/slurm/single-node.sbatch requeue: signalled $signalled, requeued $restarted, state ${st:-?}, exit $(job_exit "$jid")"
    show_logs "$out"
  fi
  same_losses "every step's loss after the template's requeue equals the uninterrupted run's" \
    "$rq_dir/metrics.jsonl" "$tmp/runs/reference/metrics.jsonl" "$steps"
fi

if ((fails)); then
  show_logs "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log"
  echo "FAILED: $fails check(s)"
  exit 1
fi
echo "test-slurm: all checks passed"
