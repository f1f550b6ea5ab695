#!/usr/bin/env bash
# Register SuperNodes' public keys with a SuperLink that runs with SuperNode authentication.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF_USAGE'
usage: deploy/register_nodes.sh --superlink HOST:PORT --root-certificates CA_FILE PUBLIC_KEY...

Registers each public key (node_<k>.pub from deploy/make_node_keys.sh, or any ECDSA NIST-curve key in
OpenSSH format) through the SuperLink's Control API (`flwr supernode register`). Only SuperNodes
whose key is registered may connect; each key gets a node id, printed as "node_id KEY_FILE".
Register before starting the SuperNodes. The SuperLink forgets registrations when it restarts unless
it runs with --database; a key cannot be registered twice (`flwr supernode list` shows the nodes).
EOF_USAGE
}

superlink="" ca=""
keys=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --superlink) require_value "$@"; superlink="$2"; shift 2 ;;
        --root-certificates) require_value "$@"; ca="$2"; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) keys+=("$1"); shift ;;
    esac
done
[[ -n "$superlink" ]] || die "--superlink HOST:PORT is required"
check_address "$superlink"
[[ -n "$ca" ]] || die "--root-certificates CA_FILE is required: node authentication needs TLS"
require_file "--root-certificates" "$ca"
((${#keys[@]} > 0)) || die "give at least one PUBLIC_KEY file"
for key in "${keys[@]}"; do
    require_file "public key" "$key"
    [[ "$key" == *.pub ]] || die "public key $key does not end in .pub: is it the private key? Only the public key leaves a node"
done

use_project_env
flwr_home="$(mktemp -d)"
trap 'rm -rf "$flwr_home"' EXIT
export FLWR_HOME="$flwr_home"
write_connection "$flwr_home" "$superlink" "$ca"
# `flwr ... --format json` exits 0 even when the SuperLink refuses; its JSON tells.
for key in "${keys[@]}"; do
    flwr supernode register "$key" "$CONNECTION_NAME" --format json | "$PYTHON" -c '
import json, sys
key = sys.argv[1]
try:
    reply = json.load(sys.stdin)
except ValueError:
    sys.exit(f"error: could not register {key}: flwr gave no JSON answer")
if not reply.get("success"):
    sys.exit("error: could not register " + key + ": " + str(reply.get("error-message", reply)))
print(reply["node-id"], key)' "$key" || exit 1
done
