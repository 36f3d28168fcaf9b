#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm system test (tests/test_slurm.py) and for trying the job
# scripts by hand: Debian's slurm-wlm and munge, a munged, a slurmctld and a slurmd of its own, all under one folder.
#
#   bash scripts/slurm/ci_cluster.sh start DIR [--install]   write DIR/slurm.conf, start the three daemons, wait until
#                                                            the node is idle; print the line that points the Slurm
#                                                            commands at it: export SLURM_CONF=DIR/slurm.conf
#   bash scripts/slurm/ci_cluster.sh stop DIR                stop the daemons started in DIR
#
# --install: apt-get installs slurm-wlm and munge where a command is missing (as root, else through sudo).
#
# Nothing outside DIR is touched: munged has its own key, socket, log and seed in DIR (slurm.conf's AuthInfo names
# the socket), slurmctld and slurmd their own state, spool, pid and log files. The daemons run as the user who starts
# them (SlurmUser, SlurmdUser), and so do the jobs: no root (but for --install), no system account, no systemd.
# slurm.conf uses no cgroup plugin, which a container rarely permits (ProctrackType=proctrack/linuxproc,
# TaskPlugin=task/none, JobAcctGatherType=jobacct_gather/none), no accounting database, and the node's real CPUs and
# memory as `slurmd -C` reads them. A job's final state is kept in DIR/jobcomp.log (jobcomp/filetxt) and by slurmctld
# for a day (MinJobAge), so `scontrol show job` reads it after the job ends. SLURM_CTLD_PORT and SLURM_D_PORT choose
# the ports (default 6817 and 6818).
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"  # the daemons live there, off a plain user's PATH

usage() { echo "usage: $0 start DIR [--install] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
dir=$2
install=${3:-}

stop() {
  local name pid
  for name in slurmd slurmctld munged; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$dir/$name.pid"
  done
}

fail() {  # the reason, then each log's end: what a failed start needs to say
  echo "ci_cluster: $*" >&2
  for log in "$dir"/munged.log "$dir"/slurmctld.log "$dir"/slurmd.log; do
    [ -s "$log" ] && { echo "--- $log (last lines)" >&2; tail -n 15 "$log" >&2; }
  done
  stop
  exit 1
}

case $action in
  stop) [ -d "$dir" ] || { echo "ci_cluster: no folder $dir" >&2; exit 2; }; stop; exit 0 ;;
  start) ;;
  *) usage ;;
esac
[ -z "$install" ] || [ "$install" = --install ] || usage

missing=()
for cmd in munged slurmctld slurmd sbatch; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$install" = --install ] || { echo "ci_cluster: not installed: ${missing[*]} (apt-get install slurm-wlm munge," \
                                       "or pass --install)" >&2; exit 1; }
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq slurm-wlm munge >/dev/null
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
stop  # a cluster left in DIR by an earlier start
# munged refuses a key that others could read and a folder that others could write; Slurm's commands, run by any
# user, read slurm.conf and reach munged's socket, so the folders stay readable
chmod 755 "$dir"
mkdir -p -m 755 "$dir/munge" "$dir/state" "$dir/spool"
[ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none;
                                   chmod 400 "$dir/munge/munge.key"; }
socket="$dir/munge/munge.socket"
munged --force --socket="$socket" --key-file="$dir/munge/munge.key" --log-file="$dir/munged.log" \
       --pid-file="$dir/munged.pid" --seed-file="$dir/munge/munged.seed" \
  || fail "munged did not start"

host=$(hostname -s)
node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=... RealMemory=...: this machine as slurmd sees it
cat > "$dir/slurm.conf" <<EOF
ClusterName=attnlab
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${SLURM_CTLD_PORT:-6817}
SlurmdPort=${SLURM_D_PORT:-6818}
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
MinJobAge=86400
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=120 State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 1
done
fail "node $host is not idle after 60 s (sinfo says: ${state:-nothing})"
