"""TLS certificates and SuperNode authentication keys for a Flower deployment, in pure Python.

``deploy/make_certs.sh`` uses this when ``openssl`` is missing (fresh Debian images often lack it);
``deploy/make_node_keys.sh`` always does, because flower-supernode reads its key in the OpenSSH
format, which openssl cannot write. ``cryptography`` is a dependency of flwr, so it is always there.

    python deploy/certs.py tls OUT_DIR [--host NAME_OR_IP ...] [--days N]
        -> OUT_DIR/ca.crt, ca.key, server.crt, server.key (SANs: localhost, 127.0.0.1, ::1 and the hosts)
    python deploy/certs.py node-keys OUT_DIR N
        -> OUT_DIR/node_<k> (private, OpenSSH) and node_<k>.pub (OpenSSH), ECDSA on NIST P-384, k = 0..N-1
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Every certificate is valid for these besides the given hosts: the SuperLink's own ServerApp
# process reaches the SuperLink over loopback, with the same certificate.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_HOST_PATTERN = re.compile(r"^[A-Za-z0-9.:-]+$")
CA_FILES = ("ca.crt", "ca.key")
SERVER_FILES = ("server.crt", "server.key")


def node_key_names(count: int) -> list[str]:
    """``node_0``, ``node_1``, ...: the private-key file names; the public keys add ``.pub``."""
    return [f"node_{k}" for k in range(count)]


def check_host(host: str) -> str:
    """A DNS name or an IP address that can go into a subjectAltName; ValueError otherwise."""
    if not host or not _HOST_PATTERN.match(host):
        raise ValueError(f"server host {host!r} is invalid: allowed is a DNS name or an IP address "
                         "(letters, digits, '.', '-' and ':' only)")
    return host


def _subject_alt_name(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*LOCAL_HOSTS, *hosts]):  # ordered, without duplicates
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedcorr-flower"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: Path, data: bytes, private: bool) -> None:
    # Private keys are created owner-only from the start, never readable for a moment by others.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    with os.fdopen(os.open(path, flags, 0o600 if private else 0o644), "wb") as handle:
        handle.write(data)


def _refuse_existing(out_dir: Path, names: list[str]) -> None:
    existing = [name for name in names if (out_dir / name).exists()]
    if existing:
        raise FileExistsError(f"{out_dir} already holds {', '.join(existing)}; "
                              "choose an empty directory or delete them first")


def _certificate(subject: x509.Name, issuer: x509.Name, public_key, signing_key, days: int,
                 extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # clock skew
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(start + datetime.timedelta(days=days)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


def write_tls(out_dir: Path, hosts: list[str], days: int = 365) -> list[Path]:
    """A CA and a SuperLink certificate signed by it, for ``hosts`` plus the local names."""
    hosts = [check_host(host) for host in hosts]
    if days < 1:
        raise ValueError(f"--days {days} is invalid: allowed is 1 or more")
    out_dir.mkdir(parents=True, exist_ok=True)
    _refuse_existing(out_dir, [*CA_FILES, *SERVER_FILES])
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("fedcorr-flower CA")
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, days, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                       encipher_only=False, decipher_only=False), True),
    ])
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = _certificate(_name("fedcorr-flower SuperLink"), ca_name, server_key.public_key(), ca_key, days, [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (_subject_alt_name(hosts), False),
    ])
    pem_key = {"encoding": serialization.Encoding.PEM, "format": serialization.PrivateFormat.PKCS8,
               "encryption_algorithm": serialization.NoEncryption()}
    files = [
        ("ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM), False),
        ("ca.key", ca_key.private_bytes(**pem_key), True),
        ("server.crt", server_cert.public_bytes(serialization.Encoding.PEM), False),
        ("server.key", server_key.private_bytes(**pem_key), True),
    ]
    for name, data, private in files:
        _write(out_dir / name, data, private)
    return [out_dir / name for name, _, _ in files]


def write_node_keys(out_dir: Path, count: int) -> list[Path]:
    """``count`` SuperNode key pairs: ECDSA P-384, private key and public key in OpenSSH format, as
    flower-supernode --auth-supernode-private-key and `flwr supernode register` read them."""
    if count < 1:
        raise ValueError(f"number of node keys {count} is invalid: allowed is 1 or more")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = node_key_names(count)
    _refuse_existing(out_dir, [file for name in names for file in (name, f"{name}.pub")])
    written = []
    for name in names:
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write(out_dir / name, private, True)
        _write(out_dir / f"{name}.pub", public + f" fedcorr-{name}\n".encode(), False)
        written += [out_dir / name, out_dir / f"{name}.pub"]
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tls = commands.add_parser("tls", help="a CA and a SuperLink certificate")
    tls.add_argument("out_dir", type=Path)
    tls.add_argument("--host", action="append", default=[], help="a name or IP address of the SuperLink")
    tls.add_argument("--days", type=int, default=365, help="validity of both certificates (default 365)")
    keys = commands.add_parser("node-keys", help="SuperNode authentication key pairs")
    keys.add_argument("out_dir", type=Path)
    keys.add_argument("count", type=int)
    return parser


def main(argv: list[str]) -> int:
    """The command line: write what ``argv`` asks for and list the files; 2 on a refused request."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "tls":
            paths = write_tls(args.out_dir, args.host, args.days)
        else:
            paths = write_node_keys(args.out_dir, args.count)
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
