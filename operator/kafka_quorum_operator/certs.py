"""X.509 for a quorum, with ``cryptography``: its CA, the certificates the CA signs, and why an
existing certificate must be issued again. Pure (the time is an argument), so that tests decide
renewals by the clock they choose.

Keys are ECDSA P-256: quick to generate (a pass may issue a certificate per node) and accepted by
every TLS stack the nodes and clients use.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Certificates start a little in the past: clocks of the nodes may lag the operator's.
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM."""

    certificate: bytes
    key: bytes


@dataclass(frozen=True)
class Wanted:
    """What a certificate must say: its subject common name (the principal the node maps to
    roles), its DNS names, and whether it may serve (nodes) or only be a client (the
    operator)."""

    common_name: str
    dns_names: tuple[str, ...] = ()
    server: bool = False


def new_ca(common_name: str, now: datetime.datetime, validity: datetime.timedelta) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(pem(certificate), _key_pem(key))


def issue(ca: KeyPair, wanted: Wanted, now: datetime.datetime,
          validity: datetime.timedelta) -> KeyPair:
    """A certificate signed by ``ca``, never valid beyond the CA itself."""
    ca_certificate = x509.load_pem_x509_certificate(ca.certificate)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if wanted.server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(wanted.common_name)).issuer_name(ca_certificate.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + validity, ca_certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=False, crl_sign=False,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_key.public_key()), critical=False)
    )
    if wanted.dns_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(name) for name in wanted.dns_names]), critical=False)
    return KeyPair(pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key))


def ca_renewal_reason(ca: KeyPair | None, now: datetime.datetime,
                      renew_before: datetime.timedelta) -> str | None:
    """Why the CA must be generated anew (None: keep it)."""
    if ca is None:
        return "missing"
    try:
        certificate = x509.load_pem_x509_certificate(ca.certificate)
        key = serialization.load_pem_private_key(ca.key, password=None)
    except ValueError as error:
        return f"unreadable: {error}"
    if certificate.public_key() != key.public_key():
        return "the key is not the certificate's"
    if certificate.not_valid_after_utc - now < renew_before:
        return f"expires {certificate.not_valid_after_utc.isoformat()}"
    return None


def renewal_reason(pair: KeyPair | None, ca_certificate: bytes, wanted: Wanted,
                   now: datetime.datetime, renew_before: datetime.timedelta) -> str | None:
    """Why a certificate must be issued again (None: keep it): missing or unreadable, a key
    that is not its own, not signed by the current CA, saying something else than wanted, or
    expiring within ``renew_before``."""
    if pair is None:
        return "missing"
    try:
        certificate = x509.load_pem_x509_certificate(pair.certificate)
        key = serialization.load_pem_private_key(pair.key, password=None)
        ca = x509.load_pem_x509_certificate(ca_certificate)
    except ValueError as error:
        return f"unreadable: {error}"
    if certificate.public_key() != key.public_key():
        return "the key is not the certificate's"
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "not signed by the current CA"
    if describe(certificate) != wanted:
        return f"names or usages changed (has {describe(certificate)})"
    if certificate.not_valid_after_utc - now < renew_before:
        return f"expires {certificate.not_valid_after_utc.isoformat()}"
    return None


def describe(certificate: x509.Certificate) -> Wanted:
    """What a certificate says, in the terms of ``Wanted``."""
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common_name = str(names[0].value) if names else ""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        dns_names = tuple(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    try:
        eku = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        server = ExtendedKeyUsageOID.SERVER_AUTH in eku
    except x509.ExtensionNotFound:
        server = False
    return Wanted(common_name, dns_names, server)


def not_after(certificate: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(certificate).not_valid_after_utc


def bundle(certificates: Sequence[bytes]) -> bytes:
    """PEM certificates, one after the other."""
    return b"".join(c if c.endswith(b"\n") else c + b"\n" for c in certificates)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
