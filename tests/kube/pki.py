"""The control plane's credentials, made with ``cryptography`` as kubeadm makes them: one cluster
CA that signs the API server's serving certificate and every client's (the administrator, the
controller manager, the scheduler, each kubelet as ``system:node:NAME`` in ``system:nodes``), and
the key pair that signs ServiceAccount tokens. Files only; nothing leaves the test's directory."""

from __future__ import annotations

import datetime
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Credential:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


class ClusterCA:
    """The cluster's CA in ``directory`` (``ca.crt``, ``ca.key``), and what it signs there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=True, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        self.cert = directory / "ca.crt"
        self.key = directory / "ca.key"
        self.cert.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))
        self.key.write_bytes(_key_pem(self._key))
        self.key.chmod(0o600)

    def issue(self, name: str, common_name: str, *, groups: Sequence[str] = (),
              hosts: Sequence[str] = ()) -> Credential:
        """A client certificate for ``common_name`` in ``groups`` (the API server's user and
        groups); with ``hosts``, a serving certificate for those names and addresses."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                             *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups)])
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(self._certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + _VALIDITY)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False))
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        found = Credential(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        found.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        found.key.write_bytes(_key_pem(key))
        found.key.chmod(0o600)
        return found


def service_account_keys(directory: Path) -> Credential:
    """The ServiceAccount token signing key (``sa.key``) and its public half (``sa.pub``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    found = Credential(directory / "sa.pub", directory / "sa.key")
    found.key.write_bytes(_key_pem(key))
    found.key.chmod(0o600)
    found.cert.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return found


def kubeconfig(path: Path, server: str, ca: Path, credential: Credential, user: str) -> Path:
    """A kubeconfig for ``server`` as ``credential`` (JSON is YAML)."""
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kq",
        "clusters": [{"name": "kq", "cluster": {"server": server,
                                                "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(credential.cert),
                                          "client-key": str(credential.key)}}],
        "contexts": [{"name": "kq", "context": {"cluster": "kq", "user": user}}],
    }
    path.write_text(json.dumps(document, indent=1))
    path.chmod(0o600)
    return path
