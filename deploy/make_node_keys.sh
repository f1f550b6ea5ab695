#!/usr/bin/env bash
# SuperNode authentication key pairs (ECDSA P-384, OpenSSH format).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF_USAGE'
usage: deploy/make_node_keys.sh OUT_DIR N

Writes N key pairs into OUT_DIR (which must not hold them yet), k = 0..N-1:
  node_<k>      the private key of SuperNode k (mode 600): it stays on that node's machine and is
                given to deploy/supernode.sh --auth-key
  node_<k>.pub  its public key: the SuperLink's operator registers it (deploy/register_nodes.sh)
Keys are ECDSA on NIST P-384 in OpenSSH format, as flower-supernode and `flwr supernode register`
read them. On a node's own machine, `ssh-keygen -t ecdsa -b 384 -N "" -f node_key` makes an
equivalent pair without this project.
EOF_USAGE
}

[[ "${1:-}" == -h || "${1:-}" == --help ]] && { usage; exit 0; }
[[ $# -eq 2 ]] || { usage >&2; die "expected OUT_DIR and N, got $# argument(s)"; }
[[ "$2" =~ ^[0-9]+$ ]] && (($2 >= 1)) || die "N '$2' is invalid: allowed is a whole number >= 1"
use_project_env
exec "$PYTHON" "$DEPLOY_DIR/certs.py" node-keys "$1" "$2"
