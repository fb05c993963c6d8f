"""Certificates and SCRAM credentials of a secured local broker (``fx broker start --secure``).

Generated once, with ``cryptography``, under ``data_dir/security`` (mode 0700) and reused by
every later start of the same data dir:

    security/ca.crt                  the CA certificate clients trust (FX_KAFKA_CA_FILE), 0644
    security/ca.key                  the CA's private key, 0600
    security/server.pem              the broker's key, certificate and the CA (PEM keystore), 0600
    security/users/<name>.password   one SCRAM-SHA-512 user's password, 0600
    security/<name>.env              the exports that make a client that user, 0600
    security/<name>.properties       the same for Kafka's Java tools (``--command-config``), 0600

The server certificate names ``127.0.0.1`` and ``localhost`` (subject alternative names), so
clients check the host name as well as the chain. Keys are EC P-256.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from fx_kafka.security import ClientSecurity

__all__ = [
    "ADMIN_USER",
    "DEFAULT_USERS",
    "LocalSecrets",
    "check_user_name",
]

#: The broker's own principal (inter-broker and broker-to-controller) and the super user.
ADMIN_USER = "admin"
#: The users a secured local broker is formatted with: the admin, and one per role of
#: :mod:`fx_kafka.acl` (``fx acl apply`` grants each role its operations).
DEFAULT_USERS: tuple[str, ...] = (ADMIN_USER, "executor", "operator", "holder", "producer")
_USER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_user_name(name: str) -> str:
    """``name`` if usable as a SCRAM user (and in ``--add-scram``), else ``ValueError``."""
    if not _USER_RE.fullmatch(name):
        raise ValueError(f"invalid user name {name!r}: letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit, at most 64 characters")
    return name


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` created with mode 0600 (never readable by others, not even
    for a moment), atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


@dataclass(frozen=True)
class LocalSecrets:
    """The files of ``root`` (``data_dir/security``)."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def keystore(self) -> Path:
        return self.root / "server.pem"

    @property
    def users_dir(self) -> Path:
        return self.root / "users"

    def password_file(self, user: str) -> Path:
        return self.users_dir / f"{check_user_name(user)}.password"

    def env_file(self, user: str) -> Path:
        return self.root / f"{check_user_name(user)}.env"

    def exists(self) -> bool:
        return self.ca_cert.is_file() and self.keystore.is_file()

    def users(self) -> list[str]:
        """The users with a password here, sorted (the admin first)."""
        if not self.users_dir.is_dir():
            return []
        names = sorted(p.name[: -len(".password")] for p in self.users_dir.glob("*.password"))
        return sorted(names, key=lambda n: n != ADMIN_USER)

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    # -- generation ------------------------------------------------------------------------------
    def ensure(self, users: tuple[str, ...] | list[str] = DEFAULT_USERS) -> list[str]:
        """Create what is missing: the CA, the server certificate, and a password for each of
        ``users`` (and the admin). Existing files are kept as they are. Returns the users that
        got a new password (they need SCRAM credentials on the broker)."""
        _private_dir(self.root)
        _private_dir(self.users_dir)
        if not self.exists():
            self._make_certificates()
        created = []
        for user in dict.fromkeys((ADMIN_USER, *users)):
            path = self.password_file(user)
            if not path.exists():
                _write_private(path, (secrets.token_hex(24) + "\n").encode())
                created.append(user)
        return created

    def _make_certificates(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ninelives-fx local CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name).issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost"),
            ]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # the broker also presents it as a client (to its controller listener)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pkcs8 = serialization.PrivateFormat.PKCS8
        none = serialization.NoEncryption()
        pem = serialization.Encoding.PEM
        _write_private(self.ca_key, ca_key.private_bytes(pem, pkcs8, none))
        # Kafka's PEM keystore: an unencrypted PKCS#8 key, then the certificate chain
        _write_private(self.keystore, key.private_bytes(pem, pkcs8, none)
                       + cert.public_bytes(pem) + ca_cert.public_bytes(pem))
        tmp = self.ca_cert.with_name(f".ca.crt.{os.getpid()}.tmp")
        tmp.write_bytes(ca_cert.public_bytes(pem))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.ca_cert)

    # -- clients ---------------------------------------------------------------------------------
    def client_security(self, user: str) -> ClientSecurity:
        """SASL_SSL + SCRAM-SHA-512 as ``user``, checking the broker against this CA."""
        return ClientSecurity(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username=user,
                              password=self.password(user), ca_file=self.ca_cert)

    def write_env_files(self, bootstrap: str) -> None:
        """One ``<user>.env`` per user: ``export`` lines for a shell (``. security/admin.env``);
        the password is named by its file, never inlined."""
        for user in self.users():
            env = {"FX_KAFKA_BOOTSTRAP": bootstrap,
                   **self.client_security(user).to_env(password_file=self.password_file(user))}
            text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            _write_private(self.env_file(user), text.encode())

    def client_properties(self, user: str) -> Path:
        """``<user>.properties``: Java client settings (``kafka-topics --command-config``)."""
        return self.root / f"{check_user_name(user)}.properties"

    def write_client_properties(self) -> None:
        """One ``<user>.properties`` per user, for Kafka's own command-line tools."""
        for user in self.users():
            text = (
                "security.protocol=SASL_SSL\n"
                "sasl.mechanism=SCRAM-SHA-512\n"
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                f'required username="{user}" password="{self.password(user)}";\n'
                "ssl.truststore.type=PEM\n"
                f"ssl.truststore.location={self.ca_cert}\n"
            )
            _write_private(self.client_properties(user), text.encode())

    def scram_args(self, users: list[str] | None = None) -> list[str]:
        """``--add-scram`` arguments of ``StorageTool format`` for ``users`` (default: all)."""
        args: list[str] = []
        for user in users if users is not None else self.users():
            args += ["--add-scram",
                     f"SCRAM-SHA-512=[name={user},password={self.password(user)}]"]
        return args
