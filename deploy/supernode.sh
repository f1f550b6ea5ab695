#!/usr/bin/env bash
# Start a Flower SuperNode that holds one client of the federation, in the foreground.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
usage: deploy/supernode.sh --superlink HOST:PORT --root-certificates CA_FILE --auth-key KEY_FILE
                           (--data-path FILE | --partition-id K) [--state-dir DIR] [--port PORT]
                           [--ground-truth-diagnostics]
       deploy/supernode.sh --superlink HOST:PORT --insecure (--data-path FILE | --partition-id K) ...

Runs flower-supernode in the foreground (it replaces this script's process, so its pid is this
script's pid). It connects to the SuperLink, retrying until the SuperLink is up, and runs the
project's ClientApp for every message of every run.

  --superlink HOST:PORT      the SuperLink's address, as in its certificate (deploy/make_certs.sh --server-host)
  --root-certificates FILE   the CA certificate (ca.crt) that signed the SuperLink's certificate
  --auth-key FILE            this node's private key (node_<k> from deploy/make_node_keys.sh); its public
                             key must be registered with the SuperLink (deploy/register_nodes.sh)
  --insecure                 no TLS, no authentication: only against `deploy/superlink.sh --insecure`
  --data-path FILE           this node's own data file (`python export.py ...` writes them): a real
                             deployment, the data never leaves this machine
  --partition-id K           replay client K of the simulation scene in the run's out_dir/scene.npz
                             instead: only where that path is readable (the SuperLink's machine or a
                             shared disk), for rehearsals
  --state-dir DIR            where the node keeps its corrected labels, so a restarted SuperNode goes on
                             with them (default: the ClientApp's own choice)
  --port PORT                port of this SuperNode's local Runtime API on 127.0.0.1 (default 9094); give
                             every SuperNode on one machine its own
  --ground-truth-diagnostics let the node answer a run with ground truth (ground_truth=true) with counts of
                             its labels against the true labels its data holds (FedCorr's and FedDiv's
                             diagnostics, e.g. FedCorr's M x M confusion counts); without it the node config
                             says ground-truth-diagnostics=false and the node sends none

The device the client trains on is not a node option: it is the run's `client.device` (auto uses
CUDA when present; pin a GPU per SuperNode with CUDA_VISIBLE_DEVICES).
EOF
}

# A node-config value goes into a TOML string inside a space-separated list; these would break it.
check_config_path() {
    [[ "$2" != *'"'* && "$2" != *'\'* && "$2" != *"'"* ]] || die "$1 '$2' is invalid: quotes and backslashes are not allowed in it"
}

superlink="" ca="" key="" insecure=0 data_path="" partition_id="" state_dir="" port=9094 diagnostics=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --superlink) require_value "$@"; superlink="$2"; shift 2 ;;
        --root-certificates) require_value "$@"; ca="$2"; shift 2 ;;
        --auth-key) require_value "$@"; key="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --data-path) require_value "$@"; data_path="$2"; shift 2 ;;
        --partition-id) require_value "$@"; partition_id="$2"; shift 2 ;;
        --state-dir) require_value "$@"; state_dir="$2"; shift 2 ;;
        --port) require_value "$@"; port="$2"; shift 2 ;;
        --ground-truth-diagnostics) diagnostics=true; shift ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ -n "$superlink" ]] || die "--superlink HOST:PORT is required"
check_address "$superlink"
check_port "$port"
if ((insecure)); then
    [[ -z "$ca" && -z "$key" ]] || die "--insecure excludes --root-certificates and --auth-key: TLS is either on or off"
    security=(--insecure)
else
    [[ -n "$ca" ]] || die "--root-certificates CA_FILE is required (TLS); --insecure only against an insecure SuperLink"
    [[ -n "$key" ]] || die "--auth-key KEY_FILE is required: the SuperLink accepts registered SuperNodes only"
    require_file "--root-certificates" "$ca"
    require_file "--auth-key" "$key"
    security=(--root-certificates "$(absolute "$ca")" --auth-supernode-private-key "$(absolute "$key")")
fi

# The ClientApp runs in another working directory: every path in the node config is absolute.
if [[ -n "$data_path" && -n "$partition_id" ]]; then
    die "give --data-path or --partition-id, not both: a data file carries its own partition id"
elif [[ -n "$data_path" ]]; then
    require_file "--data-path" "$data_path"
    data_path="$(absolute "$data_path")"
    check_config_path --data-path "$data_path"
    node_config="data-path=\"$data_path\""
elif [[ -n "$partition_id" ]]; then
    [[ "$partition_id" =~ ^[0-9]+$ ]] || die "--partition-id '$partition_id' is invalid: allowed is a whole number >= 0"
    node_config="partition-id=$partition_id"
else
    die "give --data-path FILE (this node's data) or --partition-id K (a client of the simulation scene)"
fi
if [[ -n "$state_dir" ]]; then
    state_dir="$(absolute "$state_dir")"
    check_config_path --state-dir "$state_dir"
    mkdir -p "$state_dir"
    node_config+=" state-dir=\"$state_dir\""
fi
# Always explicit: a deployed node sends ground-truth counts only where its operator says so.
node_config+=" ground-truth-diagnostics=$diagnostics"

use_project_env
exec flower-supernode "${security[@]}" --superlink "$superlink" --port "$port" --node-config "$node_config"
