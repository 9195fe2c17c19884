"""The operator's Kubernetes client: TLS settings from kopf's connection info."""

from __future__ import annotations

import base64
import ssl
import subprocess
import tempfile
from pathlib import Path

import kopf
import pytest

from eop_operator.kube.client import _ssl_context


@pytest.fixture
def client_pem(tmp_path: Path) -> tuple[bytes, bytes]:
    """A self-signed client certificate and its key, as PEM."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=eop-test", "-keyout", "key.pem", "-out", "cert.pem",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )  # fmt: skip
    return (tmp_path / "cert.pem").read_bytes(), (tmp_path / "key.pem").read_bytes()


def info(certificate: bytes, key: bytes) -> kopf.ConnectionInfo:
    """Connection info with the client certificate inline, as a kubeconfig's *-data fields."""
    return kopf.ConnectionInfo(
        server="https://127.0.0.1:6443",
        certificate_data=base64.b64encode(certificate),
        private_key_data=base64.b64encode(key),
    )


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory Python's tempfile uses, empty and private to the test."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def test_inline_client_key_leaves_no_file_behind(
    client_pem: tuple[bytes, bytes], temp_dir: Path
) -> None:
    certificate, key = client_pem
    context = _ssl_context(info(certificate, key))
    assert isinstance(context, ssl.SSLContext)
    assert list(temp_dir.iterdir()) == []


def test_mismatched_client_key_is_refused_and_leaves_no_file_behind(
    client_pem: tuple[bytes, bytes], tmp_path: Path, temp_dir: Path
) -> None:
    certificate, _ = client_pem
    subprocess.run(
        ["openssl", "genrsa", "-out", "other.pem", "2048"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    with pytest.raises(ssl.SSLError):
        _ssl_context(info(certificate, (tmp_path / "other.pem").read_bytes()))
    assert list(temp_dir.iterdir()) == []
