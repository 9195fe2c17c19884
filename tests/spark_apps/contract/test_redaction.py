"""Secret values kept out of messages, in every form they travel in: plain, base64 (whole or
inside a longer base64 text), URL-encoded and JSON-escaped; and the runner's termination
message (which the operator copies into status and events) redacted with its mounted Secrets."""

from __future__ import annotations

import base64
import json
import urllib.parse
from pathlib import Path

import pytest

from eop_spark.contract.errors import PipelineFailed
from eop_spark.contract.redaction import Redactor
from eop_spark.runtime.runner import report_failure, secret_redactor
from tests.spark_apps.kafka.test_client_config import make_config, secret_dir

SECRET = 'p@ss w/rd+"Ω"&=?'


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "carried",
    [
        SECRET,
        b64(SECRET),  # a Secret's data, a token
        b64(SECRET).rstrip("="),
        base64.urlsafe_b64encode(SECRET.encode()).decode(),
        b64(f"alice:{SECRET}"),  # HTTP Basic: the value inside a longer base64 text
        b64(f"x{SECRET}yz"),  # ... at each of the three alignments
        b64(f"xy{SECRET}z"),
        urllib.parse.quote(SECRET, safe=""),  # a URL's user info or query
        urllib.parse.quote_plus(SECRET),
        json.dumps(SECRET)[1:-1],  # echoed in JSON
        json.dumps(SECRET, ensure_ascii=False)[1:-1],
        json.dumps(json.dumps({"password": SECRET}))[1:-1],  # JSON inside a JSON string
    ],
)
def test_every_common_encoding_of_a_secret_is_redacted(carried: str) -> None:
    message = f"SASL authentication failed: {carried} (broker k:9093)"
    redacted = Redactor((SECRET,)).redact(message)
    assert "***" in redacted
    assert redacted.startswith("SASL authentication failed: ")
    assert redacted.endswith(" (broker k:9093)")
    for leftover in ("ss w", "ss%20w", "ss+w", "w/rd", "w%2Frd"):
        assert leftover not in redacted, redacted
    # What remains of the encoded text gives no more than a character or two of the value.
    assert len(redacted) < len(message) - len(SECRET) // 2


def test_short_values_and_other_text_are_left_alone() -> None:
    redactor = Redactor(("abc", "hunter2-password"))
    assert redactor.redact("abc is not a secret") == "abc is not a secret"
    assert redactor.redact(f"hello {b64('hello world')}") == f"hello {b64('hello world')}"


def test_the_runners_termination_message_names_no_mounted_secret_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "kafka-pw-0123456789"
    source = secret_dir(tmp_path / "source", **{"sasl.password": password})
    config = make_config(sourceSecretDir=str(source))
    log = tmp_path / "termination-log"
    monkeypatch.setenv("EOP_TERMINATION_LOG", str(log))
    jaas = f'username="app" password="{password}"'
    error = PipelineFailed(f"auth failed with {json.dumps(jaas)} and {b64('app:' + password)}")
    report_failure(error, secret_redactor(config))
    line = log.read_text()
    assert "auth failed with" in line
    assert password not in line and b64("app:" + password)[4:20] not in line
    assert line.count("***") == 2
