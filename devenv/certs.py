"""Test certificates for the dev broker's TLS listeners, made with Debian's ``openssl`` CLI.

:func:`make_certs` writes PEM files into a directory:

* ``ca.crt``/``ca.key``: the CA that signs the broker's and the clients' certificates;
* ``broker.pem``: the broker's key and certificate (SAN ``127.0.0.1`` and ``localhost``),
  as Kafka's PEM keystore takes them in one file (``ssl.keystore.location``);
* ``user.crt``/``user.key``: a client certificate of that CA (CN ``eop-user``);
* ``expired.crt``/``expired.key``: a client certificate of that CA that has expired;
* ``other-ca.crt``, ``other.crt``/``other.key``: a second CA and a client certificate of it.

Keys are unencrypted PKCS#8 (``BEGIN PRIVATE KEY``), as Strimzi writes ``user.key`` and as the
Java clients' PEM keystore (``ssl.keystore.key``) reads it.  :func:`strimzi_user_secret`
returns a Secret's keys in Strimzi's ``KafkaUser`` shape; :func:`strimzi_user_secret_data`
the same as bytes, with the real binary PKCS#12 ``user.p12`` Strimzi writes beside them.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Days the CAs and the valid certificates last (tests make new ones per session).
VALID_DAYS = 30
#: ``user.password`` of :func:`strimzi_user_secret`: the password of ``user.p12``.
STRIMZI_P12_PASSWORD = "not-read-by-eop"


class CertificateError(RuntimeError):
    """openssl failed."""


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )
    if proc.returncode != 0:
        raise CertificateError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
        "-keyout", f"{name}.key", "-out", f"{name}.crt",
        "-subj", f"/CN=eop test {name}", "-days", str(VALID_DAYS),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def _signed(directory: Path, name: str, ca: str, cn: str, days: int, ext: str) -> None:
    """``name.key`` and ``name.crt`` signed by ``ca``; ``days`` < 0 makes it expired."""
    _openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
        cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-sha256", "-in", f"{name}.csr",
        "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", str(days), "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.csr").unlink()
    (directory / f"{name}.ext").unlink()


_CLIENT_EXT = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
_SERVER_EXT = (
    "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
)


@dataclass(frozen=True)
class Certs:
    """The PEM files :func:`make_certs` wrote."""

    directory: Path

    def path(self, name: str) -> Path:
        """The file ``name`` (e.g. ``"ca.crt"``)."""
        return self.directory / name

    def text(self, name: str) -> str:
        """The content of the file ``name``."""
        return self.path(name).read_text()


def make_certs(directory: Path | str) -> Certs:
    """Make the CA, broker and client certificates in ``directory`` (kept if already made)."""
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if (root / "complete").exists():
        return Certs(root)
    _ca(root, "ca")
    _ca(root, "other-ca")
    _signed(root, "broker", "ca", "localhost", VALID_DAYS, _SERVER_EXT)
    (root / "broker.pem").write_text(
        (root / "broker.key").read_text() + (root / "broker.crt").read_text()
    )
    _signed(root, "user", "ca", "eop-user", VALID_DAYS, _CLIENT_EXT)
    _signed(root, "expired", "ca", "eop-expired", -1, _CLIENT_EXT)
    _signed(root, "other", "other-ca", "eop-other", VALID_DAYS, _CLIENT_EXT)
    for key in root.glob("*.key"):
        key.chmod(0o600)
    (root / "complete").write_text("")
    return Certs(root)


def strimzi_user_secret(certs: Certs, *, ca: str = "ca", user: str = "user") -> dict[str, str]:
    """A Secret's keys as Strimzi's ``KafkaUser`` (TLS) writes them, with the CA to trust.

    ``ca``: whose certificate is ``ca.crt``; ``user``: whose certificate and key are
    ``user.crt``/``user.key``.  ``user.p12``/``user.password`` are there too (unused by eop).
    """
    return {
        "ca.crt": certs.text(f"{ca}.crt"),
        "user.crt": certs.text(f"{user}.crt"),
        "user.key": certs.text(f"{user}.key"),
        "user.p12": "not read by eop",
        "user.password": STRIMZI_P12_PASSWORD,
    }


def strimzi_user_secret_data(
    certs: Certs, *, ca: str = "ca", user: str = "user"
) -> dict[str, bytes]:
    """:func:`strimzi_user_secret` as a Secret's data holds it (bytes), ``user.p12`` a real one.

    ``user.p12`` is a binary PKCS#12 archive of the user's key and certificate and the CA
    (``openssl pkcs12 -export``, password ``user.password``), as Strimzi writes it; it is
    not UTF-8 text.  Made on first use in the certificates' directory.
    """
    p12 = certs.path(f"{user}-{ca}.p12")
    if not p12.exists():
        _openssl(
            "pkcs12", "-export", "-in", f"{user}.crt", "-inkey", f"{user}.key",
            "-certfile", f"{ca}.crt", "-name", user, "-out", p12.name,
            "-passout", f"pass:{STRIMZI_P12_PASSWORD}",
            cwd=certs.directory,
        )  # fmt: skip
    data = {
        key: value.encode() for key, value in strimzi_user_secret(certs, ca=ca, user=user).items()
    }
    data["user.p12"] = p12.read_bytes()
    return data
