#!/usr/bin/env bash
# A certificate authority and a SuperLink TLS certificate signed by it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
usage: deploy/make_certs.sh OUT_DIR [--server-host NAME_OR_IP ...] [--days N] [--backend auto|openssl|python]

Writes into OUT_DIR (which must not hold these files yet):
  ca.crt      the CA certificate: copy it to every SuperNode machine and to where you run `flwr`
  ca.key      the CA's private key: keep it off the network, it can sign certificates for anyone
  server.crt  the SuperLink's certificate, valid for localhost, 127.0.0.1, ::1 and every --server-host
  server.key  the SuperLink's private key: only the SuperLink machine needs it

  --server-host H  a DNS name or IP address SuperNodes and `flwr` use to reach the SuperLink (repeatable)
  --days N         validity of both certificates in days (default 365)
  --backend B      openssl: the openssl command; python: deploy/certs.py (the project's Python and the
                   `cryptography` package flwr depends on); auto (default): openssl when installed
Keys are ECDSA on NIST P-384; private keys are written with mode 600.
EOF
}

out_dir="" backend="auto" days=365
hosts=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --server-host) require_value "$@"; hosts+=("$2"); shift 2 ;;
        --days) require_value "$@"; days="$2"; shift 2 ;;
        --backend) require_value "$@"; backend="$2"; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [[ -z "$out_dir" ]] || die "one OUT_DIR only (got '$out_dir' and '$1')"; out_dir="$1"; shift ;;
    esac
done
[[ -n "$out_dir" ]] || { usage >&2; die "OUT_DIR is missing"; }
[[ "$days" =~ ^[0-9]+$ ]] && ((days >= 1)) || die "--days '$days' is invalid: allowed is a whole number >= 1"
for host in "${hosts[@]}"; do
    [[ "$host" =~ ^[A-Za-z0-9.:-]+$ ]] || die "--server-host '$host' is invalid: allowed is a DNS name or an IP address"
done
case "$backend" in
    auto) if command -v openssl >/dev/null; then backend=openssl; else backend=python; fi ;;
    openssl) command -v openssl >/dev/null || die "--backend openssl: the openssl command is not installed (use --backend python)" ;;
    python) ;;
    *) die "--backend '$backend' is invalid: allowed are auto, openssl, python" ;;
esac

if [[ "$backend" == python ]]; then
    use_project_env
    args=(tls "$out_dir" --days "$days")
    for host in "${hosts[@]}"; do args+=(--host "$host"); done
    exec "$PYTHON" "$DEPLOY_DIR/certs.py" "${args[@]}"
fi

mkdir -p "$out_dir"
for name in ca.crt ca.key server.crt server.key; do
    [[ ! -e "$out_dir/$name" ]] || die "$out_dir already holds $name; choose an empty directory or delete it first"
done

# subjectAltName: the loopback names (the SuperLink's own ServerApp connects over loopback) plus
# every given host, as an IP entry when it parses as an address, else as a DNS entry.
san="DNS:localhost,IP:127.0.0.1,IP:::1"
for host in "${hosts[@]}"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san+=",IP:$host"; else san+=",DNS:$host"; fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077  # the private keys are never readable by others, not even for a moment
openssl ecparam -name secp384r1 -genkey -noout -out "$work/ca.key"
openssl req -x509 -new -key "$work/ca.key" -sha256 -days "$days" -subj "/O=fedcorr-flower/CN=fedcorr-flower CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$work/ca.crt"
openssl ecparam -name secp384r1 -genkey -noout -out "$work/server.key"
openssl req -new -key "$work/server.key" -subj "/O=fedcorr-flower/CN=fedcorr-flower SuperLink" -out "$work/server.csr"
printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$san" >"$work/server.ext"
# OpenSSL 3 reports a successful signature on stderr: keep it quiet unless signing fails.
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -sha256 \
    -days "$days" -extfile "$work/server.ext" -out "$work/server.crt" 2>"$work/sign.log" \
    || { cat "$work/sign.log" >&2; die "openssl could not sign the SuperLink certificate"; }
# PKCS#8, the same key encoding the python backend writes.
for key in ca server; do
    openssl pkcs8 -topk8 -nocrypt -in "$work/$key.key" -out "$work/$key.pk8"
    mv "$work/$key.pk8" "$work/$key.key"
done
chmod 644 "$work/ca.crt" "$work/server.crt"
for name in ca.crt ca.key server.crt server.key; do
    mv "$work/$name" "$out_dir/$name"
    echo "wrote $out_dir/$name"
done
