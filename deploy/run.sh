#!/usr/bin/env bash
# Run the FedCorr app on a deployed federation, wait for it, and check that it really completed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
usage: deploy/run.sh --superlink HOST:PORT (--root-certificates CA_FILE | --insecure) --out DIR
                     [--timeout SECONDS] [--skip-results-check] [-- HYDRA_OVERRIDES...]

Submits this repository's app with `flwr run`, streams the ServerApp's log until the run ends, then
checks success twice, because `flwr run --stream` exits 0 even when the ServerApp fails:
  1. `flwr list --run-id ID --format json` reports the run "finished:completed";
  2. DIR/results.json says "complete": true.
Exit status 0 only when both hold; 1 when the run failed or timed out; 2 for bad arguments.

  --superlink HOST:PORT     the SuperLink (its Control API shares the port with the SuperNodes)
  --root-certificates FILE  the CA certificate (ca.crt) that signed the SuperLink's certificate
  --insecure                no TLS: only against `deploy/superlink.sh --insecure`
  --out DIR                 the run's out_dir, an absolute path ON THE SUPERLINK'S MACHINE: the ServerApp
                            runs there and writes results.json, rounds.csv and scene.npz into it
  --timeout SECONDS         stop the run (`flwr stop`) and fail when it takes longer (default 86400)
  --skip-results-check      when this machine cannot read DIR (running from a laptop): rely on the run
                            status alone and collect DIR/results.json from the SuperLink's machine
  HYDRA_OVERRIDES           the run's configuration, as for sim.py (default: the FedCorr defaults);
                            num_clients must equal the number of SuperNodes; no spaces or quotes in them

Example: deploy/run.sh --superlink 10.0.0.5:8000 --root-certificates certs/ca.crt --out /srv/fedcorr/run1 \
             -- experiment=smoke num_clients=3 strategy.t1=1 client.device=cuda
The overrides are checked here first, so a bad value fails before anything is submitted.
EOF
}

superlink="" ca="" insecure=0 out="" timeout_s=86400 check_results=1
overrides=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --superlink) require_value "$@"; superlink="$2"; shift 2 ;;
        --root-certificates) require_value "$@"; ca="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --out) require_value "$@"; out="$2"; shift 2 ;;
        --timeout) require_value "$@"; timeout_s="$2"; shift 2 ;;
        --skip-results-check) check_results=0; shift ;;
        --) shift; overrides=("$@"); break ;;
        *) die "unknown argument $1 (see --help; Hydra overrides go after --)" ;;
    esac
done
[[ -n "$superlink" ]] || die "--superlink HOST:PORT is required"
check_address "$superlink"
if ((insecure)); then
    [[ -z "$ca" ]] || die "--insecure excludes --root-certificates: TLS is either on or off"
else
    [[ -n "$ca" ]] || die "--root-certificates CA_FILE is required (TLS); --insecure only against an insecure SuperLink"
    require_file "--root-certificates" "$ca"
fi
[[ -n "$out" ]] || die "--out DIR is required: the run's out_dir on the SuperLink's machine"
[[ "$out" == /* ]] || die "--out '$out' is not absolute: the ServerApp runs in another directory (and maybe on another machine)"
[[ "$timeout_s" =~ ^[0-9]+$ ]] && ((timeout_s >= 1)) || die "--timeout '$timeout_s' is invalid: allowed is a whole number of seconds >= 1"
for override in "${overrides[@]}"; do
    [[ "$override" != out_dir=* ]] || die "give the output directory with --out, not as the override $override"
done
overrides+=("out_dir=$out")

use_project_env
check_overrides "${overrides[@]}"

# A private Flower configuration with one connection: the user's ~/.flwr stays untouched.
flwr_home="$(mktemp -d)"
trap 'rm -rf "$flwr_home"' EXIT
export FLWR_HOME="$flwr_home"
write_connection "$flwr_home" "$superlink" "$ca"

# json_field FIELD: FIELD of the JSON document on stdin (runs[0].FIELD for `flwr list` output);
# empty when the document is not what a successful `flwr` call prints.
json_field() {
    "$PYTHON" -c '
import json, sys
try:
    doc = json.load(sys.stdin)
    print((doc["runs"][0] if "runs" in doc else doc).get(sys.argv[1], ""))
except (ValueError, LookupError, AttributeError):
    print("")' "$1"
}

deadline=$((SECONDS + timeout_s))
submitted="$(flwr run "$REPO_DIR" "$CONNECTION_NAME" --run-config "overrides=\"${overrides[*]}\"" --format json)" || {
    echo "$submitted" >&2
    echo "error: flwr run could not submit the run to $superlink" >&2
    exit 1
}
run_id="$(json_field run-id <<<"$submitted")"
[[ "$run_id" =~ ^[0-9]+$ ]] || { echo "$submitted" >&2; echo "error: flwr run returned no run id" >&2; exit 1; }
echo "submitted run $run_id to $superlink; out_dir $out (on the SuperLink's machine)"

# The log stream ends when the run does; a dropped connection only ends the stream, so the status
# is polled until the run is finished either way.
remaining=$((deadline - SECONDS))
timeout "$((remaining > 0 ? remaining : 1))" flwr log "$run_id" "$CONNECTION_NAME" --stream || true
status=""
while ((SECONDS < deadline)); do
    listing="$(flwr list "$CONNECTION_NAME" --run-id "$run_id" --format json)" || listing=""
    [[ -z "$listing" ]] || status="$(json_field status <<<"$listing")"
    [[ "$status" != finished* ]] || break
    sleep 2
done
if [[ "$status" != finished* ]]; then
    echo "error: run $run_id is still '${status:-unknown}' after --timeout $timeout_s s; stopping it" >&2
    flwr stop "$run_id" "$CONNECTION_NAME" >/dev/null 2>&1 || true
    exit 1
fi
if [[ "$status" != "finished:completed" ]]; then
    details="$(json_field status-details <<<"$listing")"
    echo "error: run $run_id ended '$status': $details" >&2
    exit 1
fi
echo "run $run_id: $status"

if ((!check_results)); then
    echo "results: $out/results.json on the SuperLink's machine (not checked here: --skip-results-check)"
    exit 0
fi
"$PYTHON" - "$out/results.json" <<'EOF' || exit 1
import json
import sys

path = sys.argv[1]
try:
    with open(path) as handle:
        payload = json.load(handle)
except (OSError, ValueError) as err:
    sys.exit(f"error: the run completed but {path} is unreadable ({err}); is --out a directory on this machine?")
if payload.get("complete") is not True:
    sys.exit(f"error: {path} says complete={payload.get('complete')!r} after {len(payload.get('rounds', []))} round(s)")
summary = payload["summary"]
acc = {key: "-" if summary[key] is None else f"{summary[key]:.4f}" for key in ("best_acc", "final_acc")}
print(f"results: {path}: {len(payload['rounds'])} rounds, best acc {acc['best_acc']}, final acc {acc['final_acc']}, "
      f"comm cost {summary['comm_cost']}, wall {summary['wall_s']:.0f} s")
EOF
