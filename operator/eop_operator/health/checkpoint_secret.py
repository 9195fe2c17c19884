"""The keys of the checkpoint's Secret (``spec.checkpoint.secretRef``), before a driver starts.

The driver, its executors and the checkpoint's deletion Job get the object store's
credentials as environment variables from that Secret (``render.pods``): the kubelet
refuses to start a container whose required key is missing, an empty key is no
credential to the AWS SDK, and any other key is never read.  The API server never
sees a Secret's keys, so the operator looks at them first.

Only the key names and whether a value is empty are looked at: the values are never
decoded, and never reach a message.
"""

from __future__ import annotations

from collections.abc import Mapping

from eop_operator.api.models import (
    CHECKPOINT_SECRET_KEYS,
    CHECKPOINT_SECRET_OPTIONAL_KEYS,
    ExactlyOncePipeline,
)
from eop_operator.health.progress import ProgressUnavailable, SecretRefused, secret_data
from eop_operator.kube.client import KubeClient

#: The field that names the Secret.
FIELD = "spec.checkpoint.secretRef"
#: Unread keys a refusal names at most (a Secret shared with other uses may hold many).
MAX_NAMED = 5


def _are(keys: list[str], what: str) -> str:
    """``keys`` (at most :data:`MAX_NAMED` of them by name) said to be ``what``."""
    if len(keys) == 1:
        return f"{keys[0]} is {what}"
    shown = ", ".join(keys[:MAX_NAMED])
    more = f" and {len(keys) - MAX_NAMED} more" if len(keys) > MAX_NAMED else ""
    return f"{shown}{more} are {what}"


def checkpoint_secret_refusal(secret: str, data: Mapping[str, str]) -> str | None:
    """Why the keys of Secret ``secret`` make no credentials for the object store, or None.

    ``data``: the Secret's keys and their values as the API server holds them (only
    whether a value is empty is looked at).  Refused: a required key missing or
    empty (``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` go together), and a
    key no pod reads.
    """
    missing = [k for k in CHECKPOINT_SECRET_KEYS if k not in data]
    empty = [k for k in CHECKPOINT_SECRET_KEYS if k in data and not data[k]]
    unread = sorted(set(data) - {*CHECKPOINT_SECRET_KEYS, *CHECKPOINT_SECRET_OPTIONAL_KEYS})
    found = []
    if missing:
        found.append(_are(missing, "missing"))
    if empty:
        found.append(_are(empty, "empty"))
    if unread:
        found.append(_are(unread, "read by nothing"))
    if not found:
        return None
    required = " and ".join(CHECKPOINT_SECRET_KEYS)
    optional = " and ".join(CHECKPOINT_SECRET_OPTIONAL_KEYS)
    return (
        f"{FIELD} (Secret {secret}): {'; '.join(found)}. Its keys are {required} (and "
        f"{optional} for temporary keys), the AWS SDK's environment variables; other S3A "
        "settings (endpoint, region) go in spec.checkpoint.options as fs.s3a.*"
    )


async def check_checkpoint_secret(client: KubeClient, pipeline: ExactlyOncePipeline) -> None:
    """Raise :class:`SecretRefused` if the checkpoint's Secret makes no credentials.

    Raises :class:`ProgressUnavailable` (naming the field) when the Secret does not
    exist or cannot be read; nothing when the pipeline names no such Secret.
    """
    ref = pipeline.spec.checkpoint.secret_ref
    if ref is None:
        return
    try:
        data = await secret_data(client, pipeline.metadata.namespace, ref.name)
    except ProgressUnavailable as exc:
        raise ProgressUnavailable(f"{FIELD}: {exc}") from None
    refusal = checkpoint_secret_refusal(ref.name, data)
    if refusal is not None:
        raise SecretRefused(refusal)
