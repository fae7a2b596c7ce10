#!/usr/bin/env bash
# A real single-node SLURM cluster on localhost, for CI and by hand (as root, no systemd).
#   bash .ci/slurm-cluster.sh start   # install (Debian packages), configure, start, wait until idle
#   bash .ci/slurm-cluster.sh stop    # stop every daemon this script started, by PID
# Facts this relies on: without slurmdbd `sacct` fails, so the Snakemake SLURM plugin must use
# `slurm-status-command: squeue`; the config must live in /etc/slurm (job steps drop SLURM_CONF);
# EnforcePartLimits=ALL turns an impossible request into an error instead of a job pending forever.
set -euo pipefail
STATE=/run/melt-slurm
mkdir -p "$STATE"

start() {
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    timeout -s KILL 600 apt-get update -qq
    timeout -s KILL 900 apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  fi
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  [[ -s /etc/munge/munge.key ]] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- munged --force
  pgrep -n munged > "$STATE/munged.pid"

  local node cpus mem
  node=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  mkdir -p /etc/slurm
  cat > /etc/slurm/slurm.conf <<EOF
ClusterName=melt-ci
SlurmctldHost=${node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
EnforcePartLimits=ALL
JobRequeue=1
KillWait=2                 # SIGKILL 2 s after SIGTERM: a requeued job really stops (submitit ignores SIGTERM)
MpiDefault=none
NodeName=${node} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  slurmctld
  slurmd
  for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then
      echo "slurm: node ${node} idle (${cpus} CPUs, ${mem} MB)"
      return 0
    fi
    sleep 1
  done
  echo "slurm: the node did not become idle; see /var/log/slurm/" >&2
  tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
  return 1
}

stop() {
  for daemon in slurmd slurmctld munged; do
    if [[ -s "$STATE/$daemon.pid" ]]; then
      kill "$(cat "$STATE/$daemon.pid")" 2>/dev/null || true
      rm -f "$STATE/$daemon.pid"
    fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
