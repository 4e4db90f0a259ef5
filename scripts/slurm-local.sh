#!/usr/bin/env bash
# A private SLURM on this machine (munged + slurmctld + slurmd, its own config, ports, munge key
# and socket under one state directory; nothing in /etc is touched), for testing `runner: srun`
# and `sweep --submit`. Needs root and Debian's slurm-wlm and munge.
#
#   scripts/slurm-local.sh start [DIR]       # idempotent; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop [DIR]        # idempotent: daemons, namespaces, bridge
#   scripts/slurm-local.sh check             # exit 0 if it can run here, else 77 and the reason
#   scripts/slurm-local.sh node-down NAME [DIR]  # a node fails: link cut, all its processes killed
#   scripts/slurm-local.sh node-up NAME [DIR]    # the node comes back and returns to service
#
# ULYSSES_SLURM_NODES=1 (default): one node "localhost" on 127.0.0.1. ULYSSES_SLURM_NODES=N > 1:
# nodes n1..nN, each slurmd in its own network namespace (a veth pair on a bridge, address
# SUBNET.(1+i)), its own hostname (UTS namespace) and its own /etc/hosts (mount namespace) naming
# every node; slurmctld listens on the bridge's address SUBNET.1 ("ctl"). A job's tasks run in
# their node's namespaces: `hostname` prints n2 on n2, and a task reaches its own node's ranks on
# 127.0.0.1 or on its address, the other nodes on theirs. The DIR, the node count and the network
# names of a running cluster are kept in DIR/cluster.env for stop, node-down and node-up.
#
# ULYSSES_SLURM_CPUS CPUs per node (default 4: overcommits a 2-core machine on purpose,
# SlurmdParameters=config_overrides), one partition "debug". ULYSSES_SLURM_CTLD_PORT /
# _SLURMD_PORT (16817 / 16818), ULYSSES_SLURM_SUBNET (the first three octets of a /24, default
# 10.217.0) and ULYSSES_SLURM_NET (prefix of the bridge, veth and namespace names, default uls)
# let two clusters run side by side. slurmctld notices a failed node 15-30 s after node-down
# (SlurmdTimeout and MessageTimeout are 5 s on a multi-node cluster): it marks the node DOWN,
# removes it from the jobs that hold it (those submitted with --no-kill run on without it; the
# others are cancelled) and the steps on it end with srun's "Node failure on NAME".
# Exit 77 = cannot run here (not root, packages missing, network namespaces not permitted):
# ctest's SKIP_RETURN_CODE.
set -euo pipefail
action=${1:-start}
case "$action" in
  node-down|node-up)
    node_arg=${2:?usage: $0 $action NAME [DIR]}
    dir=${3:-${ULYSSES_SLURM_DIR:-/tmp/ulysses-slurm}} ;;
  *) dir=${2:-${ULYSSES_SLURM_DIR:-/tmp/ulysses-slurm}} ;;
esac
nodes=${ULYSSES_SLURM_NODES:-1}
cpus=${ULYSSES_SLURM_CPUS:-4}
ctld_port=${ULYSSES_SLURM_CTLD_PORT:-16817}
slurmd_port=${ULYSSES_SLURM_SLURMD_PORT:-16818}
subnet=${ULYSSES_SLURM_SUBNET:-10.217.0}
net=${ULYSSES_SLURM_NET:-uls}

skip() { echo "slurm-local: cannot run here: $*" >&2; exit 77; }
die() { echo "slurm-local: $*" >&2; exit 1; }

# What a running cluster was started with: stop / node-down / node-up act on that, not on the
# environment of the caller.
load_cluster() {
  if [ -f "$dir/cluster.env" ]; then
    # shellcheck disable=SC1091
    . "$dir/cluster.env"
  fi
}

validate() {
  case "$nodes" in ''|*[!0-9]*|0) die "ULYSSES_SLURM_NODES: '$nodes' is not a node count >= 1" ;; esac
  [ "$nodes" -le 200 ] || die "ULYSSES_SLURM_NODES: $nodes nodes, at most 200 fit in one /24"
  case "$cpus" in ''|*[!0-9]*|0) die "ULYSSES_SLURM_CPUS: '$cpus' is not a CPU count >= 1" ;; esac
  [[ "$subnet" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    die "ULYSSES_SLURM_SUBNET: '$subnet' is not three octets such as 10.217.0"
  [[ "$net" =~ ^[a-z][a-z0-9]{0,5}$ ]] ||
    die "ULYSSES_SLURM_NET: '$net' is not 1-6 lower-case letters and digits, a letter first"
}

check() {
  [ "$(id -u)" = 0 ] || skip "needs root (slurmd runs tasks as their owner)"
  for tool in munged mungekey slurmctld slurmd srun sbatch squeue scancel scontrol; do
    command -v "$tool" > /dev/null || [ -x "/usr/sbin/$tool" ] ||
      skip "$tool missing (apt-get install slurm-wlm munge)"
  done
  if [ "$nodes" -gt 1 ]; then
    for tool in ip nsenter unshare mount hostname; do
      command -v "$tool" > /dev/null || skip "$tool missing (iproute2, util-linux)"
    done
    local probe="$net-p$(($$ % 100000))"  # an interface name: at most 15 characters
    ip netns add "$probe" 2> /dev/null || skip "ip netns not permitted (a container without CAP_SYS_ADMIN / CAP_NET_ADMIN?)"
    local ok=1
    ip link add "$probe" type veth peer name eth0 netns "$probe" 2> /dev/null || ok=0
    ip link del "$probe" 2> /dev/null || true
    ip netns del "$probe" 2> /dev/null || true
    [ "$ok" = 1 ] || skip "veth pairs into a network namespace not permitted"
  fi
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }

kill_pid() {  # PID: TERM, up to 5 s, then KILL
  kill "$1" 2> /dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2> /dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2> /dev/null || true
}

stop_pidfile() {
  if pid_alive "$1"; then kill_pid "$(cat "$1")"; fi
  rm -f "$1"
}

stop_pidfiles() {  # FILE...: TERM to all at once, up to 5 s for all, then KILL
  local pids=() file
  for file in "$@"; do
    if pid_alive "$file"; then pids+=("$(cat "$file")"); fi
  done
  if [ "${#pids[@]}" -gt 0 ]; then
    kill "${pids[@]}" 2> /dev/null || true
    local pid alive
    for _ in $(seq 50); do
      alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2> /dev/null && alive=1; done
      [ "$alive" = 1 ] || break
      sleep 0.1
    done
    kill -9 "${pids[@]}" 2> /dev/null || true
  fi
  rm -f "$@"
}

node_names() {
  if [ "$nodes" -gt 1 ]; then seq -f 'n%g' 1 "$nodes"; else echo localhost; fi
}
node_index() {  # NAME -> i for n<i> of this cluster, or fails
  local i=${1#n}
  case "$1" in n[1-9]*) ;; *) return 1 ;; esac
  case "$i" in *[!0-9]*) return 1 ;; esac
  [ "$i" -ge 1 ] && [ "$i" -le "$nodes" ]
}
node_addr() { echo "$subnet.$((1 + ${1#n}))"; }
netns_of() { echo "$net-$1"; }

# Every process whose network namespace is the node's (slurmd, slurmstepd, the step's tasks):
# SIGKILL, as a power loss would; then the pid file.
kill_node_processes() {
  local ns
  ns=$(netns_of "$1")
  ip netns list 2> /dev/null | grep -q "^$ns\b" || { rm -f "$dir/slurmd-$1.pid"; return 0; }
  for _ in 1 2 3; do  # slurmstepd may fork while we kill
    local pids
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -9 $pids 2> /dev/null || true
    sleep 0.2
  done
  rm -f "$dir/slurmd-$1.pid"
}

# The nodes of a multi-node cluster: their slurmd, every process left on them, their namespaces,
# veth pairs and the bridge (what exists of them).
teardown_nodes() {
  local pidfiles=() node
  for node in $(node_names); do pidfiles+=("$dir/slurmd-$node.pid"); done
  stop_pidfiles "${pidfiles[@]}"
  for node in $(node_names); do kill_node_processes "$node"; done
  for node in $(node_names); do
    ip link del "$(netns_of "$node")" 2> /dev/null || true
    ip netns del "$(netns_of "$node")" 2> /dev/null || true
  done
  ip link del "$net-br" 2> /dev/null || true
}

stop() {
  load_cluster
  if [ "$nodes" -gt 1 ]; then
    teardown_nodes
    stop_pidfiles "$dir/slurmctld.pid" "$dir/munged.pid"
  else
    for daemon in slurmd slurmctld munged; do stop_pidfile "$dir/$daemon.pid"; done
  fi
  rm -f "$dir/cluster.env"
}

write_config() {
  mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" > /dev/null
  chmod 400 "$dir/munge/munge.key"
  local ctld_host="localhost(127.0.0.1)" spool="$dir/spool" slurmd_pid="$dir/slurmd.pid"
  local slurmd_log="$dir/log/slurmd.log" timeouts=""
  if [ "$nodes" -gt 1 ]; then
    ctld_host="localhost($subnet.1)"
    spool="$dir/spool/%n"
    slurmd_pid="$dir/slurmd-%n.pid"
    slurmd_log="$dir/log/slurmd-%n.log"
    # A failed node is DOWN 15-30 s after it failed (slurmctld's pings, then SlurmdTimeout).
    timeouts="SlurmdTimeout=5 MessageTimeout=5"
  fi
  {
    cat << EOF
# Written by scripts/slurm-local.sh: a private $nodes-node cluster for tests.
ClusterName=ulysses-test
SlurmctldHost=$ctld_host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$slurmd_log
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
EOF
    for line in $timeouts; do echo "$line"; done
    if [ "$nodes" -gt 1 ]; then
      for node in $(node_names); do
        echo "NodeName=$node NodeAddr=$(node_addr "$node") NodeHostname=$node CPUs=$cpus State=UNKNOWN"
      done
      echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    else
      echo "NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
      echo "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    fi
  } > "$dir/slurm.conf.new"
  mv "$dir/slurm.conf.new" "$dir/slurm.conf"
  if [ "$nodes" -gt 1 ]; then
    mkdir -p "$dir/spool"
    {
      echo "127.0.0.1 localhost"
      echo "::1 localhost ip6-localhost ip6-loopback"
      echo "$subnet.1 ctl"
      for node in $(node_names); do echo "$(node_addr "$node") $node"; done
    } > "$dir/hosts"
    for node in $(node_names); do mkdir -p "$dir/spool/$node"; done
  fi
  printf 'nodes=%s\nnet=%s\nsubnet=%s\n' "$nodes" "$net" "$subnet" > "$dir/cluster.env"
}

# The bridge in this namespace, then one namespace per node with its veth end, its address and lo.
network_up() {
  ip link add name "$net-br" type bridge
  ip addr add "$subnet.1/24" dev "$net-br"
  ip link set "$net-br" up
  for node in $(node_names); do
    local ns
    ns=$(netns_of "$node")
    ip netns add "$ns"
    ip link add "$ns" type veth peer name eth0 netns "$ns"
    ip link set "$ns" master "$net-br" up
    ip -n "$ns" addr add "$(node_addr "$node")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

# slurmd for NODE inside its network namespace, with its own hostname and /etc/hosts (private
# UTS and mount namespaces that the daemon, its slurmstepd and the tasks keep; nsenter, not
# `ip netns exec`, which remounts /sys without the cgroup file system slurmd needs).
start_node() {
  nsenter --net="/run/netns/$(netns_of "$1")" unshare --uts --mount --propagation private \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -f "$3" -N "$2"' \
    slurmd-start "$dir/hosts" "$1" "$dir/slurm.conf" ||
    die "slurmd on $1 did not start; its log: $dir/log/slurmd-$1.log"
}

node_state() { sinfo --noheader --nodes="$1" --format=%t 2> /dev/null || true; }

wait_idle() {  # NODE...
  export SLURM_CONF="$dir/slurm.conf"
  for node in "$@"; do
    local up=0
    for _ in $(seq 150); do
      case "$(node_state "$node")" in
        idle*|mix*|alloc*) up=1; break ;;
        down*|drain*) scontrol update nodename="$node" state=resume > /dev/null 2>&1 || true ;;
      esac
      sleep 0.2
    done
    if [ "$up" = 0 ]; then
      echo "slurm-local: node $node did not become idle; logs in $dir/log" >&2
      tail -5 "$dir/log/slurmctld.log" "$dir"/log/slurmd*.log >&2 || true
      exit 1
    fi
  done
}

running() {
  [ -f "$dir/cluster.env" ] || return 1
  local want_nodes=$nodes want_net=$net want_subnet=$subnet
  (
    load_cluster
    [ "$nodes" = "$want_nodes" ] && [ "$net" = "$want_net" ] && [ "$subnet" = "$want_subnet" ] ||
      exit 1
    pid_alive "$dir/munged.pid" && pid_alive "$dir/slurmctld.pid" || exit 1
    if [ "$nodes" -gt 1 ]; then
      for node in $(node_names); do pid_alive "$dir/slurmd-$node.pid" || exit 1; done
    else
      pid_alive "$dir/slurmd.pid" || exit 1
    fi
  )
}

start() {
  validate
  check
  if running; then
    # shellcheck disable=SC2046
    wait_idle $(node_names)
    echo "export SLURM_CONF=$dir/slurm.conf"
    return 0
  fi
  ( nodes=1; stop )  # whatever an earlier run left, single- or multi-node (stop reads cluster.env)
  [ "$nodes" -le 1 ] || teardown_nodes  # and what a run killed before it wrote cluster.env left
  write_config
  [ "$nodes" -le 1 ] || network_up
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i
  if [ "$nodes" -gt 1 ]; then
    for node in $(node_names); do start_node "$node"; done
  else
    slurmd -f "$SLURM_CONF" -N localhost
  fi
  # shellcheck disable=SC2046
  wait_idle $(node_names)
  echo "export SLURM_CONF=$dir/slurm.conf"
}

node_action() {
  [ -f "$dir/cluster.env" ] || die "$action: no cluster running in $dir"
  load_cluster
  [ "$nodes" -gt 1 ] || die "$action: needs a cluster of several nodes (ULYSSES_SLURM_NODES > 1)"
  node_index "$node_arg" || die "$action: '$node_arg' is not a node of this cluster (n1..n$nodes)"
  local ns
  ns=$(netns_of "$node_arg")
  if [ "$action" = node-down ]; then
    ip link set "$ns" down
    kill_node_processes "$node_arg"
    echo "slurm-local: $node_arg is down (link cut, processes killed)"
  else
    pid_alive "$dir/slurmd-$node_arg.pid" && die "node-up: $node_arg is up already"
    ip link set "$ns" up
    start_node "$node_arg"
    wait_idle "$node_arg"
    echo "slurm-local: $node_arg is back"
  fi
}

case "$action" in
  start) start ;;
  stop) stop ;;
  check) validate; check ;;
  node-down|node-up) node_action ;;
  *) echo "usage: $0 start|stop|check [DIR] | node-down|node-up NAME [DIR]" >&2; exit 2 ;;
esac
