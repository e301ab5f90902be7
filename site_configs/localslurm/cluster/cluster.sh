#!/usr/bin/env bash
# Local multi-node Slurm cluster on one Linux machine: one network namespace (own IP, veth on a bridge)
# and one UTS namespace (own hostname) per node, slurmctld and a private munged in the root namespace.
# Needs root, iproute2, util-linux (nsenter, unshare, flock), slurm-wlm and munge; no systemd.
#
# Usage: cluster.sh [--id N] [--nodes N] [--lab DIR] COMMAND [NODE]
#   start             bring the cluster up and wait until every node is idle; a cluster already up is
#                     left alone (exit 0), a half-up one is torn down and started cleanly; on failure
#                     everything it started is torn down again
#   stop              stop every daemon and job process of the cluster, remove namespaces, veths, bridge
#   status            print what runs; exit 0 when up, 1 when partly up, 3 when down
#   env               print the `export` lines clients need (SLURM_CONF, PATH with the sacct shim first,
#                     LOCALSLURM_*), whether or not the cluster runs
#   kill-node NODE    SIGKILL that node's slurmd only (its running job steps live on)
#   restart-node NODE stop that node's slurmd if it runs, start it again, wait until the node responds
# NODE is a node's number (1..N) or its name (c<id>n<number>).
#
# Options (flag, or the environment variable beside it):
#   --id N     LOCALSLURM_ID      cluster id 0-9 (default 0); namespaces everything machine-global:
#                                 node names c<id>n<k>, netns ccslurm-c<id>n<k>, veths ccv-c<id>n<k>,
#                                 bridge ccbr-c<id>, subnet 10.77.<id>.0/24, SlurmctldPort 16817+<id>
#   --nodes N  LOCALSLURM_NNODES  number of nodes 2-4 (default: as the lab's running cluster was
#                                 started, else 3)
#   --lab DIR  LOCALSLURM_LAB     the cluster's files: config, logs, state, munge (default
#                                 <repo>/.lab/slurm/c<id>)
#   LOCALSLURM_START_TIMEOUT      seconds `start` waits for each daemon and for idle nodes (default 30)
# A cluster id belongs to one lab directory while it runs (recorded under /run/commcamp-slurm);
# `start` or `stop` with an id that another lab's running cluster holds fails with exit code 75.
#
# A human uses it like this:
#   site_configs/localslurm/cluster/cluster.sh start
#   eval "$(site_configs/localslurm/cluster/cluster.sh env)"
#   sinfo; srun -N2 hostname; srun --mpi=pmix -N2 -n2 ./a.out
#   site_configs/localslurm/cluster/cluster.sh stop
# MPI across nodes: Open MPI with `srun --mpi=pmix`; MPICH with `srun --mpi=pmi2` and UCX_TLS=tcp,self
# (otherwise UCX uses shared memory between the "nodes").
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../../.." && pwd)
readonly SCRIPT_DIR REPO_ROOT
readonly SHIM_DIR=$SCRIPT_DIR/bin
readonly REGISTRY_DIR=/run/commcamp-slurm
readonly PARTITION=debug
readonly CPUS_PER_NODE=2
readonly EX_ID_IN_USE=75

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
die() { echo "cluster.sh: error: $*" >&2; exit 1; }
say() { echo "cluster.sh: $*"; }

# --- options -------------------------------------------------------------------------------------
CLUSTER_ID=${LOCALSLURM_ID:-0}
NNODES=${LOCALSLURM_NNODES:-}
LAB=${LOCALSLURM_LAB:-}
START_TIMEOUT=${LOCALSLURM_START_TIMEOUT:-30}
COMMAND=
NODE_ARG=
while (($#)); do
    case $1 in
        --id) CLUSTER_ID=${2:?--id needs a value}; shift 2 ;;
        --nodes) NNODES=${2:?--nodes needs a value}; shift 2 ;;
        --lab) LAB=${2:?--lab needs a value}; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "cluster.sh: unknown option $1" >&2; usage ;;
        *) if [[ -z $COMMAND ]]; then COMMAND=$1; elif [[ -z $NODE_ARG ]]; then NODE_ARG=$1
           else echo "cluster.sh: unexpected argument $1" >&2; usage; fi
           shift ;;
    esac
done
[[ -n $COMMAND ]] || usage
[[ $CLUSTER_ID =~ ^[0-9]$ ]] || die "cluster id must be one digit 0-9, got '$CLUSTER_ID'"
[[ $START_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "LOCALSLURM_START_TIMEOUT must be a positive integer, got '$START_TIMEOUT'"
LAB=$(realpath -m "${LAB:-$REPO_ROOT/.lab/slurm/c$CLUSTER_ID}")
# The path goes verbatim into slurm.conf and into munged's options.
[[ $LAB =~ ^/[A-Za-z0-9/._+-]+$ ]] || die "lab directory path may contain only letters, digits and / . _ + -: '$LAB'"
# Without --nodes, commands act on the cluster as the lab recorded it (start defaults to 3).
[[ -n $NNODES ]] || NNODES=$(sed -n 's/^NNODES=//p' "$LAB/cluster.env" 2>/dev/null || true)
NNODES=${NNODES:-3}
[[ $NNODES =~ ^[2-4]$ ]] || die "number of nodes must be 2, 3 or 4, got '$NNODES'"
readonly CLUSTER_ID NNODES LAB START_TIMEOUT

# --- names ---------------------------------------------------------------------------------------
readonly NODE_PREFIX=c${CLUSTER_ID}n
readonly NETNS_PREFIX=ccslurm-$NODE_PREFIX
readonly VETH_PREFIX=ccv-$NODE_PREFIX
readonly BRIDGE=ccbr-c$CLUSTER_ID
readonly SUBNET=10.77.$CLUSTER_ID
readonly CTLD_ADDR=$SUBNET.1
readonly CTLD_PORT=$((16817 + CLUSTER_ID))
readonly SLURM_CONF_PATH=$LAB/etc/slurm.conf
readonly MUNGE_DIR=$LAB/munge
readonly MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
readonly CLUSTER_RECORD=$LAB/cluster.env
export SLURM_CONF=$SLURM_CONF_PATH

node_name() { echo "$NODE_PREFIX$1"; }
netns_name() { echo "$NETNS_PREFIX$1"; }
veth_name() { echo "$VETH_PREFIX$1"; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }
slurmd_pidfile() { echo "$LAB/run/slurmd-$(node_name "$1").pid"; }
# hostlist FIRST LAST -> c0n[1-3] (Slurm's compressed form)
hostlist() { if (($1 == $2)); then node_name "$1"; else echo "${NODE_PREFIX}[$1-$2]"; fi; }
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# --- processes (daemons double-fork to PID 1, which reaps slowly: a zombie counts as gone) ----------
# (Builtins only, no forks: these run in loops over /proc.)
pid_in_file() { local pid; read -r pid 2>/dev/null <"$1" || return 1; [[ $pid =~ ^[0-9]+$ ]] && echo "$pid"; }
# alive PID NAME: the process exists, is not a zombie, and is NAME (guards against PID reuse)
alive() {
    local stat comm
    { read -r stat <"/proc/$1/stat" && read -r comm <"/proc/$1/comm"; } 2>/dev/null || return 1
    [[ $comm == "$2" ]] || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != [ZX] ]]
}
wait_gone() { # PID NAME SECONDS
    local deadline=$((SECONDS + $3))
    while alive "$1" "$2"; do ((SECONDS < deadline)) || return 1; sleep 0.1; done
}
stop_processes() { # NAME PID...: SIGTERM them all, then SIGKILL whichever lingers
    local name=$1 pid; shift
    for pid; do if alive "$pid" "$name"; then kill -TERM "$pid" 2>/dev/null || true; fi; done
    for pid; do
        wait_gone "$pid" "$name" 15 && continue
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" "$name" 5 || die "$name (pid $pid) survives SIGKILL"
    done
}
munged_pid() { pid_in_file "$MUNGE_DIR/munged.pid"; }
slurmctld_pid() { pid_in_file "$LAB/run/slurmctld.pid"; }
slurmd_pid() { pid_in_file "$(slurmd_pidfile "$1")"; }
munged_alive() { local pid; pid=$(munged_pid) && alive "$pid" munged; }
slurmctld_alive() { local pid; pid=$(slurmctld_pid) && alive "$pid" slurmctld; }
slurmd_alive() { local pid; pid=$(slurmd_pid "$1") && alive "$pid" slurmd; }
# Daemons of this lab that lost their PID file: their command lines name the lab's files.
lab_daemon_pids() {
    local dir comm args
    for dir in /proc/[0-9]*; do
        read -r comm 2>/dev/null <"$dir/comm" || continue
        case $comm in munged|slurmctld|slurmd) ;; *) continue ;; esac
        mapfile -d '' args 2>/dev/null <"$dir/cmdline" || continue
        [[ " ${args[*]} " == *" "*"$LAB/"* ]] && echo "${dir#/proc/}"
    done
    return 0
}

# --- network -------------------------------------------------------------------------------------
existing_netns() { ip netns list | awk -v p="$NETNS_PREFIX" 'index($1, p) == 1 {print $1}'; }
existing_veths() { ip -o link show type veth | awk -F': ' -v p="$VETH_PREFIX" '{sub(/@.*/, "", $2)} index($2, p) == 1 {print $2}'; }
bridge_exists() { ip link show dev "$BRIDGE" >/dev/null 2>&1; }
netns_exists() { [[ -e /run/netns/$(netns_name "$1") ]]; }

net_up() {
    local conflict i ns veth
    conflict=$(ip -o -4 addr show | awk -v b="$BRIDGE" -v s="$SUBNET." '$2 != b && index($4, s) == 1 {print $2 " " $4}')
    [[ -z $conflict ]] || die "subnet $SUBNET.0/24 is already used on this host ($conflict); choose another --id"
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= NNODES; i++)); do
        ns=$(netns_name "$i"); veth=$(veth_name "$i")
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

# Kill everything left inside the nodes' namespaces (slurmstepd, job processes), then remove the network.
net_down() {
    local ns pids pid veth
    for ns in $(existing_netns); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
        for pid in $pids; do wait_gone "$pid" "$(cat "/proc/$pid/comm" 2>/dev/null || echo gone)" 5 ||
            die "process $pid in namespace $ns survives SIGKILL"; done
        ip netns del "$ns"
    done
    for veth in $(existing_veths); do ip link del "$veth" 2>/dev/null || true; done
    if bridge_exists; then ip link del "$BRIDGE"; fi
}

# --- lab record, registry and lock ---------------------------------------------------------------
recorded() { # KEY -> value from the lab's cluster.env, empty if none
    [[ -f $CLUSTER_RECORD ]] || return 0
    sed -n "s/^$1=//p" "$CLUSTER_RECORD"
}
check_lab_owner() {
    local id; id=$(recorded ID)
    [[ -z $id || $id == "$CLUSTER_ID" ]] ||
        die "lab directory $LAB belongs to cluster id $id, not $CLUSTER_ID; use --id $id or another --lab"
}
# Serialise commands that change this cluster id's machine-global resources. The daemons must not
# inherit the lock's descriptor: they start with {lock_fd}>&-.
take_lock() {
    mkdir -p "$REGISTRY_DIR"
    exec {lock_fd}>"$REGISTRY_DIR/c$CLUSTER_ID.lock"
    flock -w 120 "$lock_fd" || die "another cluster.sh command for cluster id $CLUSTER_ID holds $REGISTRY_DIR/c$CLUSTER_ID.lock"
}
# Refuse (exit 75) when another lab's running cluster holds this id: its network has our names.
check_id_free() {
    local owner pid
    owner=$(cat "$REGISTRY_DIR/c$CLUSTER_ID.lab" 2>/dev/null || true)
    [[ -n $owner && $owner != "$LAB" ]] || return 0
    pid=$(pid_in_file "$owner/run/slurmctld.pid" || true)
    if bridge_exists || { [[ -n $pid ]] && alive "$pid" slurmctld; }; then
        echo "cluster.sh: error: cluster id $CLUSTER_ID is in use by the cluster in $owner; choose" \
            "another --id, or stop that one: cluster.sh --id $CLUSTER_ID --lab $owner stop" >&2
        exit $EX_ID_IN_USE
    fi
}
claim_id() {
    local owner_file=$REGISTRY_DIR/c$CLUSTER_ID.lab
    check_id_free
    echo "$LAB" >"$owner_file.tmp" && mv "$owner_file.tmp" "$owner_file"
}
release_id() {
    local owner_file=$REGISTRY_DIR/c$CLUSTER_ID.lab
    [[ $(cat "$owner_file" 2>/dev/null) != "$LAB" ]] || rm -f "$owner_file"
}

# --- configuration -------------------------------------------------------------------------------
render() { # TEMPLATE OUTPUT KEY=VALUE...: replace @KEY@, write atomically
    local text pair key
    text=$(<"$1")
    for pair in "${@:3}"; do key=${pair%%=*}; text=${text//@$key@/${pair#*=}}; done
    [[ $text != *@[A-Z_]*@* ]] || die "unfilled placeholder in $2: $(grep -o '@[A-Z_]*@' <<<"$text" | head -1)"
    printf '%s\n' "$text" >"$2.tmp" && mv "$2.tmp" "$2"
}
write_config() {
    local i node_lines='' leaf1_last=$(((NNODES + 1) / 2))
    for ((i = 1; i <= NNODES; i++)); do
        node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS_PER_NODE State=UNKNOWN"$'\n'
    done
    mkdir -p "$LAB/etc"
    render "$SCRIPT_DIR/slurm.conf.in" "$SLURM_CONF_PATH" \
        "CLUSTER_NAME=commcamp$CLUSTER_ID" "CTLD_HOST=$(hostname -s)" "CTLD_ADDR=$CTLD_ADDR" \
        "CTLD_PORT=$CTLD_PORT" "LAB=$LAB" "NODE_LINES=${node_lines%$'\n'}" "PARTITION=$PARTITION" \
        "NODELIST=$(hostlist 1 "$NNODES")"
    render "$SCRIPT_DIR/topology.conf.in" "$LAB/etc/topology.conf" \
        "SWITCH_LINES=SwitchName=leaf1 Nodes=$(hostlist 1 "$leaf1_last")
SwitchName=leaf2 Nodes=$(hostlist $((leaf1_last + 1)) "$NNODES")
SwitchName=top Switches=leaf[1-2]"
}

# --- daemons -------------------------------------------------------------------------------------
wait_for() { # DESCRIPTION COMMAND...: poll until COMMAND succeeds or START_TIMEOUT passes
    local what=$1 deadline=$((SECONDS + START_TIMEOUT)); shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what: not ready after ${START_TIMEOUT}s"
        sleep 0.1
    done
}
munge_works() { munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET"; }
start_munge() {
    mkdir -p "$MUNGE_DIR"
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    chown -R munge:munge "$MUNGE_DIR"
    chmod 0755 "$MUNGE_DIR"
    chmod 0400 "$MUNGE_DIR/munge.key"
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --log-file="$MUNGE_DIR/munged.log" --pid-file="$MUNGE_DIR/munged.pid" \
        --seed-file="$MUNGE_DIR/munged.seed" {lock_fd}>&-
    wait_for "munged ($MUNGE_SOCKET)" munge_works
}
ctld_answers() { slurmctld_alive && timeout 10 scontrol ping | grep -q 'is UP'; }
check_ctld_port_free() {
    [[ -z $(ss -Hltn "sport = :$CTLD_PORT") ]] ||
        die "TCP port $CTLD_PORT (SlurmctldPort of cluster id $CLUSTER_ID) is already in use; choose another --id"
}
start_slurmctld() {
    # -c: start from empty state deliberately (the state directory was just wiped).
    slurmctld -c -f "$SLURM_CONF_PATH" {lock_fd}>&-
    wait_for "slurmctld" ctld_answers
}
launch_slurmd() { # NODE_NUMBER (returns once slurmd has daemonized; start_slurmd also waits for it)
    local node; node=$(node_name "$1")
    rm -f "$(slurmd_pidfile "$1")"
    mkdir -p "$LAB/state/$node" "$LAB/tmp/$node"
    # nsenter --net, not `ip netns exec`: that remounts /sys and slurmd then finds no cgroup filesystem.
    # shellcheck disable=SC2016  # $1 and $2 belong to the inner sh
    nsenter --net="/run/netns/$(netns_name "$1")" unshare --uts \
        sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$node" "$SLURM_CONF_PATH" {lock_fd}>&-
}
start_slurmd() { launch_slurmd "$1"; wait_for "slurmd of $(node_name "$1")" slurmd_alive "$1"; }
node_states() { timeout 15 sinfo -h -N -p "$PARTITION" -o '%N %t'; }
# A responding node that can run jobs: no state flag (*, ~, #, !, %, $, @, ^, -) and not down/drained.
healthy_state() { [[ $1 =~ ^(idle|mix|alloc|comp)$ ]]; }
all_nodes_idle() { [[ $(node_states | awk '$2 == "idle"' | wc -l) -eq $NNODES ]]; }
node_responds() { healthy_state "$(timeout 15 sinfo -h -n "$(node_name "$1")" -o '%t')"; }

log_tails() {
    local log
    for log in "$MUNGE_DIR/munged.log" "$LAB"/log/*.log; do
        [[ -s $log ]] || continue
        echo "--- last lines of $log" >&2
        tail -n 12 "$log" >&2
    done
}

# --- whole-cluster state -------------------------------------------------------------------------
# up: everything runs and every node can take jobs; down: nothing of it exists; partial: anything else
cluster_health() {
    local i anything=0 everything=1 line
    munged_alive && anything=1 || everything=0
    slurmctld_alive && anything=1 || everything=0
    for ((i = 1; i <= NNODES; i++)); do
        slurmd_alive "$i" && anything=1 || everything=0
        netns_exists "$i" || everything=0
    done
    [[ -n $(existing_netns) || -n $(existing_veths) || -n $(lab_daemon_pids) ]] && anything=1
    bridge_exists && anything=1 || everything=0
    [[ $(recorded NNODES) == "$NNODES" ]] || everything=0
    if ((everything)); then
        local states; states=$(node_states 2>/dev/null) || everything=0
        [[ $(wc -l <<<"$states") -eq $NNODES ]] || everything=0
        while read -r _ line; do healthy_state "$line" || everything=0; done <<<"$states"
    fi
    if ((everything)); then echo up; elif ((anything)); then echo partial; else echo down; fi
}

stop_all() {
    local pid pidfile slurmd_pids=() stray
    for pidfile in "$LAB"/run/slurmd-*.pid; do
        if pid=$(pid_in_file "$pidfile"); then slurmd_pids+=("$pid"); fi
    done
    stop_processes slurmd "${slurmd_pids[@]}"
    if pid=$(slurmctld_pid); then stop_processes slurmctld "$pid"; fi
    for pid in $(lab_daemon_pids); do
        stray=$(cat "/proc/$pid/comm" 2>/dev/null) && stop_processes "$stray" "$pid"
    done
    net_down
    if pid=$(munged_pid); then stop_processes munged "$pid"; fi
    rm -f "$LAB"/run/*.pid "$MUNGE_DIR/munged.pid"
}

# --- commands ------------------------------------------------------------------------------------
preflight() {
    local cmd
    (($(id -u) == 0)) || die "needs root (network namespaces, daemons as root)"
    for cmd in ip nsenter unshare flock runuser ss munge unmunge /usr/sbin/munged slurmctld slurmd sinfo scontrol; do
        command -v "$cmd" >/dev/null || die "command '$cmd' not found (Debian packages: iproute2 util-linux munge slurm-wlm)"
    done
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist (Debian package munge)"
    ip netns list >/dev/null || die "'ip netns' does not work here"
}

STARTING=0
on_start_exit() {
    local rc=$?
    ((STARTING && rc != 0)) || return 0
    log_tails
    echo "cluster.sh: start failed; tearing down what it started" >&2
    set +e
    stop_all
    release_id
    exit "$rc"
}

cmd_start() {
    preflight
    check_lab_owner
    take_lock
    claim_id
    local health t0=$SECONDS i
    health=$(cluster_health)
    case $health in
        up) say "cluster $CLUSTER_ID is already up ($NNODES nodes, lab $LAB)"; return 0 ;;
        partial) say "cluster $CLUSTER_ID is partly up; stopping it to start cleanly"; stop_all ;;
    esac
    check_ctld_port_free
    STARTING=1
    trap on_start_exit EXIT
    trap 'exit 130' INT TERM
    # Fresh state every time: stale job records, PID files or pmix directories must not leak in.
    # The previous run's logs stay in log.prev for a post-mortem.
    mkdir -p "$LAB"
    rm -rf "$LAB/state" "$LAB/tmp" "$LAB/run" "$LAB/log.prev" "$MUNGE_DIR"
    if [[ -d $LAB/log ]]; then mv "$LAB/log" "$LAB/log.prev"; fi
    mkdir -p "$LAB/state/ctld" "$LAB/run" "$LAB/log" "$LAB/tmp"
    printf 'ID=%s\nNNODES=%s\n' "$CLUSTER_ID" "$NNODES" >"$CLUSTER_RECORD.tmp" && mv "$CLUSTER_RECORD.tmp" "$CLUSTER_RECORD"
    write_config
    start_munge
    net_up
    start_slurmctld
    for ((i = 1; i <= NNODES; i++)); do launch_slurmd "$i"; done
    wait_for "all $NNODES nodes idle ($(node_states 2>/dev/null | tr '\n' ' '))" all_nodes_idle
    STARTING=0
    trap - EXIT INT TERM
    say "cluster $CLUSTER_ID up in $((SECONDS - t0))s: $(hostlist 1 "$NNODES") idle, partition $PARTITION, lab $LAB"
}

cmd_stop() {
    check_lab_owner
    take_lock
    check_id_free
    if [[ $(cluster_health) == down ]]; then
        say "cluster $CLUSTER_ID is not running"
    else
        stop_all
        say "cluster $CLUSTER_ID stopped"
    fi
    release_id
}

cmd_status() {
    local health i pid state
    health=$(cluster_health)
    echo "cluster $CLUSTER_ID: $health (lab $LAB, $NNODES nodes, bridge $BRIDGE $CTLD_ADDR, port $CTLD_PORT)"
    process_line() { # LABEL PID_OR_EMPTY NAME
        if [[ -n $2 ]] && alive "$2" "$3"; then state="running, pid $2"; else state="not running"; fi
        printf '  %-16s %s\n' "$1" "$state"
    }
    process_line munged "$(munged_pid || true)" munged
    process_line slurmctld "$(slurmctld_pid || true)" slurmctld
    for ((i = 1; i <= NNODES; i++)); do
        process_line "slurmd $(node_name "$i")" "$(slurmd_pid "$i" || true)" slurmd
    done
    if slurmctld_alive; then node_states | sed 's/^/  sinfo: /' || true; fi
    case $health in up) return 0 ;; partial) return 1 ;; *) return 3 ;; esac
}

cmd_env() {
    local path_rest='' dir dirs i nodes='' netns='' veths='' addrs=''
    IFS=: read -r -a dirs <<<"${PATH:-}"
    for dir in "${dirs[@]}"; do [[ -z $dir || $dir == "$SHIM_DIR" ]] || path_rest+=:$dir; done
    for ((i = 1; i <= NNODES; i++)); do
        nodes+=" $(node_name "$i")"; netns+=" $(netns_name "$i")"
        veths+=" $(veth_name "$i")"; addrs+=" $(node_addr "$i")"
    done
    printf 'export %s=%s\n' \
        SLURM_CONF "$(quote "$SLURM_CONF_PATH")" \
        PATH "$(quote "$SHIM_DIR$path_rest")" \
        LOCALSLURM_ID "$CLUSTER_ID" \
        LOCALSLURM_LAB "$(quote "$LAB")" \
        LOCALSLURM_NNODES "$NNODES" \
        LOCALSLURM_PARTITION "$PARTITION" \
        LOCALSLURM_NODELIST "$(quote "$(hostlist 1 "$NNODES")")" \
        LOCALSLURM_NODES "$(quote "${nodes# }")" \
        LOCALSLURM_NODE_ADDRS "$(quote "${addrs# }")" \
        LOCALSLURM_NETNS "$(quote "${netns# }")" \
        LOCALSLURM_VETHS "$(quote "${veths# }")" \
        LOCALSLURM_BRIDGE "$BRIDGE" \
        LOCALSLURM_CTLD_ADDR "$CTLD_ADDR" \
        LOCALSLURM_CTLD_PORT "$CTLD_PORT"
}

node_number() { # NODE_ARG -> 1..NNODES
    local n=$NODE_ARG
    [[ -n $n ]] || die "$COMMAND needs a node: its number 1-$NNODES or its name $(node_name 1)..$(node_name "$NNODES")"
    n=${n#"$NODE_PREFIX"}
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > NNODES)); then
        die "no node '$NODE_ARG' in cluster $CLUSTER_ID (nodes $(hostlist 1 "$NNODES"))"
    fi
    echo "$n"
}

cmd_kill_node() {
    local n pid; n=$(node_number)
    take_lock
    if ! pid=$(slurmd_pid "$n") || ! alive "$pid" slurmd; then die "slurmd of $(node_name "$n") is not running"; fi
    kill -KILL "$pid"
    wait_gone "$pid" slurmd 5 || die "slurmd of $(node_name "$n") (pid $pid) survives SIGKILL"
    say "killed slurmd of $(node_name "$n") (pid $pid)"
}

cmd_restart_node() {
    local n pid; n=$(node_number)
    take_lock
    if ! slurmctld_alive || ! netns_exists "$n"; then die "cluster $CLUSTER_ID is not up (run start)"; fi
    if pid=$(slurmd_pid "$n"); then stop_processes slurmd "$pid"; fi
    start_slurmd "$n"
    wait_for "$(node_name "$n") responding" node_responds "$n"
    say "restarted slurmd of $(node_name "$n") (pid $(slurmd_pid "$n")), state $(timeout 15 sinfo -h -n "$(node_name "$n")" -o '%t')"
}

case $COMMAND in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    kill-node) cmd_kill_node ;;
    restart-node) cmd_restart_node ;;
    *) echo "cluster.sh: unknown command '$COMMAND'" >&2; usage ;;
esac
