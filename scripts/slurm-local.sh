#!/usr/bin/env bash
# A private single-node SLURM on this machine (munged + slurmctld + slurmd on localhost, its own
# config, ports, munge key and socket under one state directory; nothing in /etc is touched), for
# testing `runner: srun` and `sweep --submit`. Needs root and Debian's slurm-wlm and munge.
#
#   scripts/slurm-local.sh start [DIR]   # idempotent; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop [DIR]
#   scripts/slurm-local.sh check         # exit 0 if it can run here, else 77 and the reason
#
# One node "localhost" with ULYSSES_SLURM_CPUS CPUs (default 4: overcommits a 2-core machine
# on purpose, SlurmdParameters=config_overrides) and one partition "debug". Exit 77 = cannot run
# here (not root, packages missing): ctest's SKIP_RETURN_CODE.
set -euo pipefail
action=${1:-start}
dir=${2:-${ULYSSES_SLURM_DIR:-/tmp/ulysses-slurm}}
cpus=${ULYSSES_SLURM_CPUS:-4}
ctld_port=${ULYSSES_SLURM_CTLD_PORT:-16817}
slurmd_port=${ULYSSES_SLURM_SLURMD_PORT:-16818}

skip() { echo "slurm-local: cannot run here: $*" >&2; exit 77; }

check() {
  [ "$(id -u)" = 0 ] || skip "needs root (slurmd runs tasks as their owner)"
  for tool in munged mungekey slurmctld slurmd srun sbatch squeue scancel scontrol; do
    command -v "$tool" > /dev/null || [ -x "/usr/sbin/$tool" ] ||
      skip "$tool missing (apt-get install slurm-wlm munge)"
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }

stop() {
  for daemon in slurmd slurmctld munged; do
    local pidfile="$dir/$daemon.pid"
    if pid_alive "$pidfile"; then
      local pid
      pid=$(cat "$pidfile")
      kill "$pid" 2> /dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2> /dev/null || true
    fi
    rm -f "$pidfile"
  done
}

write_config() {
  mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" > /dev/null
  chmod 400 "$dir/munge/munge.key"
  cat > "$dir/slurm.conf.new" << EOF
# Written by scripts/slurm-local.sh: a private single-node cluster for tests.
ClusterName=ulysses-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
SchedulerType=sched/builtin
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$dir/slurm.conf.new" "$dir/slurm.conf"
}

wait_idle() {
  export SLURM_CONF="$dir/slurm.conf"
  for _ in $(seq 100); do
    local state
    state=$(sinfo --noheader --nodes=localhost --format=%t 2> /dev/null || true)
    case "$state" in
      idle*|mix*|alloc*) return 0 ;;
      down*|drain*) scontrol update nodename=localhost state=resume > /dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  echo "slurm-local: node did not become idle; logs in $dir/log" >&2
  tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  exit 1
}

start() {
  check
  if pid_alive "$dir/munged.pid" && pid_alive "$dir/slurmctld.pid" && pid_alive "$dir/slurmd.pid"; then
    wait_idle
    echo "export SLURM_CONF=$dir/slurm.conf"
    return 0
  fi
  stop
  write_config
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i
  slurmd -f "$SLURM_CONF" -N localhost
  wait_idle
  echo "export SLURM_CONF=$dir/slurm.conf"
}

case "$action" in
  start) start ;;
  stop) stop ;;
  check) check ;;
  *) echo "usage: $0 start|stop|check [DIR]" >&2; exit 2 ;;
esac
