# Shared helpers of the deploy/ scripts; sourced, never run.
# shellcheck shell=bash

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$DEPLOY_DIR")"
# The project's environment: its Python runs certs.py, and its bin/ holds flwr, flower-superlink,
# flower-supernode and flower-superexec (which Flower starts by name, so it must be on PATH).
PYTHON="${FEDCORR_PYTHON:-$REPO_DIR/.venv/bin/python}"
# The connection name the deploy scripts write into their private Flower configuration.
CONNECTION_NAME="fedcorr"

die() {
    echo "error: $*" >&2
    exit 2
}

# Make the project's environment usable: its binaries first on PATH; Flower's telemetry and update
# check off unless the caller set them (both phone home; offline, the update check only adds delay).
use_project_env() {
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON: run 'bash scripts/setup.sh' first, or set FEDCORR_PYTHON to the project's interpreter"
    local bin_dir
    bin_dir="$(dirname "$PYTHON")"
    for tool in flwr flower-superlink flower-supernode flower-superexec; do
        [[ -x "$bin_dir/$tool" ]] || die "$bin_dir/$tool is missing: the environment of $PYTHON does not have flwr installed"
    done
    export PATH="$bin_dir:$PATH"
    export FLWR_TELEMETRY_ENABLED="${FLWR_TELEMETRY_ENABLED:-0}"
    export FLWR_DISABLE_UPDATE_CHECK="${FLWR_DISABLE_UPDATE_CHECK:-1}"
}

# require_value OPTION VALUE: an option that takes a value got one.
require_value() {
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

# require_file WHAT PATH: an input file exists.
require_file() {
    [[ -f "$2" ]] || die "$1 $2 does not exist"
}

# check_address HOST:PORT: what --superlink takes (IPv6 hosts in brackets).
check_address() {
    [[ "$1" =~ ^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$ ]] \
        || die "SuperLink address '$1' is invalid: allowed is HOST:PORT, e.g. 10.0.0.5:8000 or superlink.example.org:8000"
    local port="${BASH_REMATCH[2]}"
    ((port >= 1 && port <= 65535)) || die "port $port in '$1' is outside 1..65535"
}

# check_port VALUE
check_port() {
    [[ "$1" =~ ^[0-9]{1,5}$ ]] && (($1 >= 1 && $1 <= 65535)) || die "port '$1' is invalid: allowed is 1..65535"
}

# absolute PATH: PATH made absolute against the current directory (it need not exist).
absolute() {
    if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi
}

# check_overrides OVERRIDE...: the checks sim.py makes on a run's Hydra overrides (a typo or a value
# out of range fails here, before anything starts), and the limits of Flower's run config.
check_overrides() {
    local override
    for override in "$@"; do
        [[ "$override" =~ ^[^[:space:]\"\'\\]+$ ]] \
            || die "override '$override' is invalid here: spaces, quotes and backslashes cannot travel in Flower's run config"
    done
    (cd "$REPO_DIR" && "$PYTHON" -c '
import sys
from common.errors import ConfigError
from server.config import load_run
from settings.compose import compose_config
try:
    load_run(compose_config(sys.argv[1:]))
except ConfigError as err:
    sys.exit(f"error: {err}")
' "$@") || exit 2
}

# toml_string VALUE: VALUE as a TOML basic string.
toml_string() {
    local value="${1//\\/\\\\}"
    printf '"%s"' "${value//\"/\\\"}"
}

# write_connection FLWR_HOME ADDRESS CA_FILE|"": a Flower configuration holding one SuperLink connection,
# the default, so `flwr` commands run with FLWR_HOME=FLWR_HOME reach ADDRESS (TLS checked against
# CA_FILE; an empty CA_FILE means --insecure). A private FLWR_HOME leaves the user's ~/.flwr alone.
write_connection() {
    local home="$1" address="$2" ca="$3"
    mkdir -p "$home"
    {
        echo "[superlink]"
        echo "default = \"$CONNECTION_NAME\""
        echo
        echo "[superlink.$CONNECTION_NAME]"
        echo "address = $(toml_string "$address")"
        if [[ -n "$ca" ]]; then
            echo "root-certificates = $(toml_string "$(absolute "$ca")")"
        else
            echo "insecure = true"
        fi
    } >"$home/config.toml"
}
