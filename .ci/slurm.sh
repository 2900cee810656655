#!/usr/bin/env bash
# A one-host SLURM for the tests that need a real scheduler (tests/test_slurm.py): Debian's
# slurm-wlm and munge (installed where absent), a slurm.conf in a temporary folder with one node of
# this host's CPUs and two partitions, `train` and `urgent`, where a job in `urgent` preempts one in
# `train` (partition priority, PreemptMode=REQUEUE, GraceTime 60 s: SIGTERM, then the grace to save).
#
#   . .ci/slurm.sh start    # exports SLURM_CONF (empty, with the reason in TRISKELE_SLURM_SKIP, if it cannot start)
#   .ci/slurm.sh stop       # stops the daemons started here
set -uo pipefail

slurm_start() {
  export TRISKELE_SLURM_SKIP=""
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
        || TRISKELE_SLURM_SKIP="apt-get install slurm-wlm munge failed"
    else
      TRISKELE_SLURM_SKIP="slurm-wlm and munge are not installed and this user cannot install them"
    fi
  fi
  if [ -z "$TRISKELE_SLURM_SKIP" ]; then
    local dir host cpus memory
    dir=$(mktemp -d /tmp/triskele-slurm.XXXXXX)
    host=$(hostname)
    cpus=$(nproc)
    memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
    mkdir -p "$dir/state" "$dir/spool" /run/munge
    cat > "$dir/slurm.conf" <<EOF
ClusterName=triskele-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=30
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=train Nodes=ALL Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=60 MaxTime=INFINITE State=UP
PartitionName=urgent Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$dir/slurm.conf"
    pgrep -x munged >/dev/null || munged --force >/dev/null 2>&1 || TRISKELE_SLURM_SKIP="munged did not start"
    if [ -z "$TRISKELE_SLURM_SKIP" ]; then
      slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF" || TRISKELE_SLURM_SKIP="slurmctld or slurmd did not start"
    fi
    for _ in $(seq 30); do
      [ -n "$TRISKELE_SLURM_SKIP" ] && break
      sinfo -h -o %t 2>/dev/null | grep -q idle && break
      sleep 1
    done
    if [ -z "$TRISKELE_SLURM_SKIP" ] && ! sinfo -h -o %t 2>/dev/null | grep -q idle; then
      TRISKELE_SLURM_SKIP="the node did not come up idle within 30 s (see $dir/slurmctld.log)"
    fi
  fi
  if [ -n "$TRISKELE_SLURM_SKIP" ]; then
    echo "SLURM: not started: $TRISKELE_SLURM_SKIP" >&2
    export SLURM_CONF=""
  else
    echo "SLURM: $(sinfo -h -o '%P %t %N' | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"
  fi
}

slurm_stop() {
  [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ] || return 0
  scancel --full --signal=KILL --user="$(id -un)" 2>/dev/null || true
  local dir
  dir=$(dirname "$SLURM_CONF")
  for pid_file in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    if [ -f "$pid_file" ]; then kill "$(cat "$pid_file")" 2>/dev/null || true; fi
  done
  return 0
}

case "${1:-}" in
  start) slurm_start ;;
  stop) slurm_stop ;;
  *) echo "usage: .ci/slurm.sh start|stop" >&2 ;;
esac
