#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests of meshtrain under srun/sbatch
# (tests/slurm_test.sh): Debian's slurm-wlm and munge, started without systemd —
# munged as user munge, slurmctld and slurmd as root on localhost, one node "localhost"
# offering 4 CPUs whatever the machine has (SlurmdParameters=config_overrides), so 4 tasks
# run on 2 cores. In a container Slurm 22.05's slurmd needs cgroup/v1 named in cgroup.conf
# while it tracks processes by /proc (proctrack/linuxproc) and binds none (task/none).
#
#   scripts/slurm_local.sh          install when needed, start (or find running), wait until idle
#   scripts/slurm_local.sh --stop   stop the daemons
# Needs root. Exits 2 (and says why) where the cluster cannot be started.
set -euo pipefail
CONF=/etc/slurm
if [ "${1:-}" = "--stop" ]; then
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x munged 2>/dev/null || true
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "slurm_local: needs root"; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null || { echo "slurm_local: apt-get install failed"; exit 2; }
fi
mkdir -p "$CONF" /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge
cat > "$CONF/slurm.conf" <<'EOF'
ClusterName=meshtrain
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
NodeName=localhost CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
printf 'CgroupPlugin=cgroup/v1\n' > "$CONF/cgroup.conf"
chown munge:munge /run/munge
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged || { echo "slurm_local: munged did not start"; exit 2; }
fi
pgrep -x slurmctld >/dev/null || slurmctld || { echo "slurm_local: slurmctld did not start (see /var/log/slurm/slurmctld.log)"; exit 2; }
pgrep -x slurmd >/dev/null || slurmd || { echo "slurm_local: slurmd did not start (see /var/log/slurm/slurmd.log)"; exit 2; }
for _ in $(seq 1 100); do
  state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
  case $state in
    idle|mix|alloc) echo "slurm_local: node localhost $state"; exit 0 ;;
    down*|drain*) scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
  esac
  sleep 0.2
done
echo "slurm_local: the node never became idle (state '$state'; /var/log/slurm/slurmd.log)"
exit 2
