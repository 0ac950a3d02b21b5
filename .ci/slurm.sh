#!/usr/bin/env bash
# A one-node Slurm on 127.0.0.1 for the end-to-end tests: munged + slurmctld + slurmd, with an
# oci.conf written by `ocistage runtime oci-conf --runtime runc` (so ocistage must be installed).
#
# Runs as root on Debian 12. Idempotent: running it again stops the daemons it started before
# (by their pid files), rewrites the configuration and starts them again. Waits until `sinfo`
# shows the node idle. Logs: /var/log/slurm/, /var/log/munge/.
set -euo pipefail
exec </dev/null

export DEBIAN_FRONTEND=noninteractive
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

CONF_DIR=/etc/slurm
SPOOL=/var/spool
LOG_DIR=/var/log/slurm
RUN_DIR=/run/ocistage-slurm
NODE="$(hostname -s)"
OCISTAGE="${OCISTAGE:-$(command -v ocistage || true)}"

say() { printf '==> %s\n' "$*"; }
die() { printf 'slurm.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
[ -n "$OCISTAGE" ] || die "ocistage is not installed (pip install -e .)"

install_packages() {
    local pkg missing=()
    for pkg in slurm-wlm slurm-client munge; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' \
            || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing ${missing[*]}"
        apt-get update -q
        apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}"
    fi
}

# stop PIDFILE: stop the daemon recorded there (only that process), wait until it is gone.
stop() {
    local pidfile=$1 pid
    [ -f "$pidfile" ] || return 0
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

write_munge_key() {
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
}

write_slurm_conf() {
    local mem
    mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
    install -d -m 0755 "$CONF_DIR" "$LOG_DIR" "$RUN_DIR"
    install -d -m 0700 "$SPOOL/slurmctld"
    install -d -m 0755 "$SPOOL/slurmd"
    cat >"$CONF_DIR/slurm.conf" <<EOF
# one-node cluster for ocistage's end-to-end tests (written by .ci/slurm.sh)
ClusterName=ocistage
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$SPOOL/slurmctld
SlurmdSpoolDir=$SPOOL/slurmd
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
KillWait=5
MinJobAge=30
Waittime=0
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    "$OCISTAGE" runtime oci-conf --runtime runc >"$CONF_DIR/oci.conf.new"
    "$OCISTAGE" runtime oci-conf --check "$CONF_DIR/oci.conf.new"
    mv "$CONF_DIR/oci.conf.new" "$CONF_DIR/oci.conf"
}

start_daemons() {
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    for _ in $(seq 1 50); do
        munge -n </dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n </dev/null | unmunge >/dev/null || die "munged does not answer"
    # -c: start from a clean state (no jobs of an earlier run); -i: ignore stale state errors
    slurmctld -c -i
    slurmd -c
}

wait_idle() {
    local state=""
    for _ in $(seq 1 120); do
        state="$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null || true)"
        case "$state" in
            idle*) say "node $NODE is $state"; return 0 ;;
            down*|drain*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    tail -n 30 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 || true
    die "node $NODE did not become idle (last state: ${state:-none})"
}

install_packages
say "stopping earlier daemons"
stop "$RUN_DIR/slurmd.pid"
stop "$RUN_DIR/slurmctld.pid"
stop /run/munge/munged.pid
say "configuring"
write_munge_key
write_slurm_conf
say "starting munged, slurmctld, slurmd"
start_daemons
wait_idle
say "Slurm $(scontrol --version | awk '{print $2}') up; oci.conf:"
grep -v '^#' "$CONF_DIR/oci.conf"
