#!/usr/bin/env bash
# Start a Flower SuperLink: TLS and SuperNode authentication on, in the foreground.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
usage: deploy/superlink.sh --certs DIR [--host ADDR] [--port PORT] [--database FILE]
       deploy/superlink.sh --insecure [--host ADDR] [--port PORT] [--database FILE]

Runs flower-superlink in the foreground (it replaces this script's process, so its pid is this
script's pid). One port serves everything: SuperNodes (Fleet API), `flwr` (Control API) and the
ServerApp the SuperLink starts for each run (Runtime API).

  --certs DIR      ca.crt, server.crt and server.key from deploy/make_certs.sh: TLS on every API, and
                   SuperNode authentication (only SuperNodes whose public key was registered with
                   deploy/register_nodes.sh may connect)
  --insecure       no TLS and no SuperNode authentication: local experiments only, never on a network
  --host ADDR      address to listen on (default 0.0.0.0: every interface; 127.0.0.1: this machine only)
  --port PORT      port to listen on (default 8000, Flower's default); open it in the firewall
  --database FILE  keep the SuperLink's state (registered nodes, runs) in this SQLite file, so a
                   restarted SuperLink still knows them (default: in memory, lost on exit)

The ServerApp runs in a subprocess of the SuperLink on this machine, so a run's out_dir (results.json,
rounds.csv, scene.npz) is written here. App dependencies are not installed at run time: the project's
environment (FEDCORR_PYTHON, default .venv/bin/python) must already hold them. Flower installs each
run's app under $FLWR_HOME (default ~/.flwr).
EOF
}

certs="" insecure=0 host="0.0.0.0" port=8000 database=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --certs) require_value "$@"; certs="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --host) require_value "$@"; host="$2"; shift 2 ;;
        --port) require_value "$@"; port="$2"; shift 2 ;;
        --database) require_value "$@"; database="$2"; shift 2 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
check_port "$port"
[[ "$host" =~ ^[A-Za-z0-9.:-]+$ ]] || die "--host '$host' is invalid: allowed is an IP address or a host name"
if ((insecure)); then
    [[ -z "$certs" ]] || die "--certs and --insecure exclude each other: TLS is either on or off"
    security=(--insecure)
else
    [[ -n "$certs" ]] || die "--certs DIR is required (TLS); --insecure turns TLS off for local experiments only"
    for name in ca.crt server.crt server.key; do require_file "certificate file" "$certs/$name"; done
    certs="$(cd "$certs" && pwd)"
    security=(--ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/server.crt" --ssl-keyfile "$certs/server.key"
        --enable-supernode-auth)
fi
extra=()
[[ -z "$database" ]] || extra+=(--database "$(absolute "$database")")

use_project_env
exec flower-superlink "${security[@]}" --host "$host" --port "$port" --disable-runtime-dependency-installation \
    "${extra[@]}"
