#!/usr/bin/env bash
# The whole deployment on this machine: certificates, a SuperLink with TLS and SuperNode
# authentication, 3 (or --nodes N) SuperNodes as separate processes, one run of the app (or, with
# --no-run, the federation kept up for runs of your own), every process stopped.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NUM_NODES=3
# FedCorr's three stages on digits in about two minutes on 2 CPU cores: 3 stage-1 rounds of one
# client, 1 finetuning round and 1 usual-training round of 2 clients.
SMOKE_OVERRIDES=(experiment=smoke strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=1 strategy.frac2=0.67)

usage() {
    cat <<EOF
usage: deploy/local_federation.sh [--nodes N] [--out DIR] [--keep | --work-dir DIR] [--data-files]
                                  [--database] [--timeout SECONDS] [--no-run] [--ground-truth-diagnostics]
                                  [-- HYDRA_OVERRIDES...]

Rehearses a real deployment on localhost and exits 0 only when the run completed:
  1. a CA, a SuperLink certificate and N SuperNode key pairs (deploy/make_certs.sh, make_node_keys.sh)
  2. a SuperLink with TLS and SuperNode authentication on free ports (deploy/superlink.sh)
  3. the N public keys registered with it (deploy/register_nodes.sh)
  4. N SuperNodes, separate processes, each with its own state directory (deploy/supernode.sh)
  5. one run through them, checked by run status and results.json (deploy/run.sh)
Every process it started (and their children) is stopped by pid on exit, also on failure or Ctrl-C.

  --nodes N        how many SuperNodes (clients) to start (default $NUM_NODES)
  --out DIR        the run's out_dir (default: inside the work directory, so gone without --keep)
  --keep           keep the temporary work directory (certificates, keys, logs, pids, node state)
  --work-dir DIR   use DIR (created, kept) as the work directory instead of a temporary one
  --data-files     give each SuperNode its own local data file (python export.py) instead of a
                   partition id of the simulation scene: the real-deployment path
  --database       keep the SuperLink's state in WORK/superlink.db (superlink.sh --database), so a
                   SuperLink restarted on it still knows the registered nodes and the runs
  --timeout S      fail when the run takes longer than S seconds (default 900)
  --no-run         skip step 5: keep the federation up until Ctrl-C (or SIGTERM) and submit runs
                   yourself with deploy/run.sh (the line "federation ready: ..." gives the command)
  --ground-truth-diagnostics
                   start every SuperNode with it (supernode.sh): a run with ground_truth=true then gets
                   the nodes' ground-truth counts, as in a simulation (without it: null with a reason)
  HYDRA_OVERRIDES  the run's configuration instead of the default FedCorr smoke setting
                   (${SMOKE_OVERRIDES[*]}); num_clients is always N
Logs: WORK/logs/{superlink,supernode_<k>}.log; pids: WORK/pids/{superlink,supernode_<k>}.pid;
certificates WORK/certs, node keys WORK/keys/node_<k>, node state WORK/state/node_<k>.
EOF
}

out="" keep=0 work="" data_files=0 timeout_s=900 run=1 database=0
overrides=() node_options=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --nodes) require_value "$@"; NUM_NODES="$2"; shift 2 ;;
        --out) require_value "$@"; out="$(absolute "$2")"; shift 2 ;;
        --keep) keep=1; shift ;;
        --work-dir) require_value "$@"; work="$(absolute "$2")"; shift 2 ;;
        --data-files) data_files=1; shift ;;
        --database) database=1; shift ;;
        --timeout) require_value "$@"; timeout_s="$2"; shift 2 ;;
        --no-run) run=0; shift ;;
        --ground-truth-diagnostics) node_options=(--ground-truth-diagnostics); shift ;;
        --) shift; overrides=("$@"); break ;;
        *) die "unknown argument $1 (see --help; Hydra overrides go after --)" ;;
    esac
done
[[ "$NUM_NODES" =~ ^[0-9]+$ ]] && ((NUM_NODES >= 1 && NUM_NODES <= 64)) \
    || die "--nodes '$NUM_NODES' is invalid: allowed is a whole number in 1..64"
((${#overrides[@]} > 0)) || overrides=("${SMOKE_OVERRIDES[@]}")
for override in "${overrides[@]}"; do
    [[ "$override" != num_clients=* || "$override" == "num_clients=$NUM_NODES" ]] \
        || die "$override: this script starts $NUM_NODES SuperNodes, so num_clients is $NUM_NODES"
done
overrides+=("num_clients=$NUM_NODES")
use_project_env
check_overrides "${overrides[@]}" "out_dir=${out:-/tmp}"

if [[ -n "$work" ]]; then
    keep=1
    mkdir -p "$work"
    [[ -z "$(ls -A "$work")" ]] || die "--work-dir $work is not empty"
else
    work="$(mktemp -d -t fedcorr-federation.XXXXXX)"
fi
out="${out:-$work/out}"
mkdir -p "$work"/{logs,pids,home,state}

# Every process started here carries this marker in its environment, and so do the processes Flower
# starts below them (SuperExec, ServerApp, ClientApps). The cleanup stops exactly the processes that
# carry it and their descendants: also orphans of a crashed parent, never a process that merely
# reuses the pid of one of ours that ended. This script's own helpers do not carry it.
MARKER="FEDCORR_FEDERATION=$work"
services=()  # what must keep running: the SuperLink and the SuperNodes

# start NAME COMMAND...: run COMMAND in the background, logging to WORK/logs/NAME.log.
start() {
    local name="$1"
    shift
    env "$MARKER" FLWR_HOME="$work/home/$name" "$@" >"$work/logs/$name.log" 2>&1 &
    services+=("$!")
    echo "$!" >"$work/pids/$name.pid"
}

# in_foreground COMMAND...: run COMMAND to its end as one of our processes; in the background and
# waited for, so a TERM or Ctrl-C sent to this script is handled at once, not after COMMAND ends.
in_foreground() {
    env "$MARKER" "$@" &
    wait "$!"
}

# our_pids: the processes carrying the marker and all their descendants.
our_pids() {
    local -A children=()
    local queue=() stat line pid ppid
    for stat in /proc/[0-9]*/stat; do
        { read -r line <"$stat"; } 2>/dev/null || continue  # the process is gone already
        pid="${stat#/proc/}"
        pid="${pid%/stat}"
        read -r _ ppid _ <<<"${line##*) }"
        children[$ppid]+=" $pid"
        if grep -qzxF "$MARKER" "/proc/$pid/environ" 2>/dev/null; then
            queue+=("$pid")
        fi
    done
    while ((${#queue[@]} > 0)); do
        pid="${queue[0]}"
        queue=("${queue[@]:1}")
        echo "$pid"
        # shellcheck disable=SC2206
        queue+=(${children[$pid]:-})
    done
}

# running PID: the process exists and is not a zombie.
running() {
    local line
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    [[ "${line##*) }" != Z* ]]
}

# Stop all our processes: TERM (Flower shuts down cleanly, SuperNodes sign off), KILL after 15 s.
stop_all() {
    local pids=() pid
    mapfile -t pids < <(our_pids | sort -u)
    ((${#pids[@]} > 0)) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 150); do
        local alive=()
        for pid in "${pids[@]}"; do ! running "$pid" || alive+=("$pid"); done
        ((${#alive[@]} > 0)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do ! running "$pid" || kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    if ((rc != 0)); then
        for log in "$work"/logs/*.log; do
            [[ -s "$log" ]] || continue
            echo "---- last lines of $log ----" >&2
            tail -n 15 "$log" >&2
        done
    fi
    if ((keep)); then
        echo "work directory kept: $work"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_ports N: N distinct TCP ports nobody listens on right now.
free_ports() {
    "$PYTHON" -c '
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))' "$1"
}

# wait_until SECONDS WHAT CHECK...: poll CHECK every second; fail naming WHAT after SECONDS.
wait_until() {
    local limit="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@"; do
        for pid in "${services[@]}"; do
            running "$pid" || die "a process died while waiting for $what (pid $pid, see the logs below)"
        done
        ((SECONDS < deadline)) || die "$what did not happen within $limit s"
        sleep 1
    done
}

# nodes_online N: `flwr supernode list` shows at least N online SuperNodes.
nodes_online() {
    FLWR_HOME="$work/home/cli" flwr supernode list "$CONNECTION_NAME" --format json 2>/dev/null | "$PYTHON" -c '
import json, sys
try:
    reply = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
online = [node for node in reply.get("nodes", []) if node["status"] == "online"]
sys.exit(0 if reply.get("success") and len(online) >= int(sys.argv[1]) else 1)' "$1"
}

read -r link_port node_ports <<<"$(free_ports $((NUM_NODES + 1)))"
read -r -a node_ports <<<"$node_ports"
address="127.0.0.1:$link_port"
echo "work directory $work; SuperLink on $address"

bash "$DEPLOY_DIR/make_certs.sh" "$work/certs" >/dev/null
bash "$DEPLOY_DIR/make_node_keys.sh" "$work/keys" "$NUM_NODES" >/dev/null
write_connection "$work/home/cli" "$address" "$work/certs/ca.crt"

link_state=()
((!database)) || link_state=(--database "$work/superlink.db")
start superlink bash "$DEPLOY_DIR/superlink.sh" --certs "$work/certs" --host 127.0.0.1 --port "$link_port" \
    "${link_state[@]}"
wait_until 60 "the SuperLink answering on $address" nodes_online 0
in_foreground bash "$DEPLOY_DIR/register_nodes.sh" --superlink "$address" --root-certificates "$work/certs/ca.crt" \
    "$work"/keys/node_*.pub

if ((data_files)); then
    echo "exporting one data file per client to $out/clients"
    in_foreground env -C "$REPO_DIR" "$PYTHON" export.py "${overrides[@]}" "out_dir=$out" \
        >"$work/logs/export.log" 2>&1 || die "python export.py failed (see its log below)"
fi
# The SuperNodes share this machine's cores: each one's ClientApp processes get cores / N torch threads
# (OMP_NUM_THREADS, unless set already), where torch would take every core and N nodes' threads would
# spin waiting on one another. A node on a machine of its own keeps torch's default.
node_threads=${OMP_NUM_THREADS:-$(( $(nproc) > NUM_NODES ? $(nproc) / NUM_NODES : 1 ))}
for ((k = 0; k < NUM_NODES; k++)); do
    if ((data_files)); then data=(--data-path "$out/clients/client_$k.npz"); else data=(--partition-id "$k"); fi
    start "supernode_$k" OMP_NUM_THREADS="$node_threads" bash "$DEPLOY_DIR/supernode.sh" --superlink "$address" \
        --root-certificates "$work/certs/ca.crt" --auth-key "$work/keys/node_$k" "${data[@]}" \
        --state-dir "$work/state/node_$k" --port "${node_ports[$k]}" "${node_options[@]}"
done
wait_until $((60 + 6 * NUM_NODES)) "$NUM_NODES SuperNodes online" nodes_online "$NUM_NODES"
if ((!run)); then
    echo "$NUM_NODES SuperNodes online; not starting a run (--no-run)"
    echo "federation ready: bash $DEPLOY_DIR/run.sh --superlink $address --root-certificates $work/certs/ca.crt" \
        "--out $out -- ${overrides[*]}"
    echo "stop it with Ctrl-C or: kill $$"
    while :; do
        sleep 1 &
        wait "$!"
    done
fi
echo "$NUM_NODES SuperNodes online; starting the run"

in_foreground bash "$DEPLOY_DIR/run.sh" --superlink "$address" --root-certificates "$work/certs/ca.crt" \
    --out "$out" --timeout "$timeout_s" -- "${overrides[@]}"
