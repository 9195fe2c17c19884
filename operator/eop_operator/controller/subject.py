"""One pipeline as a lifecycle step reads it: parsed once, its identity resolved once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eop_operator.api.load import load_stored
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity, resolve_identity
from eop_operator.reconcile.upgrade import spec_to_run


@dataclass(frozen=True, kw_only=True)
class Subject:
    """One pipeline as a step reads it: parsed once, its identity resolved once."""

    body: dict[str, Any]
    #: The user's pipeline.
    pipeline: ExactlyOncePipeline
    identity: Identity
    #: What runs: the user's pipeline, or its last stable spec after a rollback.
    run: ExactlyOncePipeline
    running_stable: bool
    #: Fields of the stored object this operator does not know (written for a newer one).
    ignored: tuple[str, ...] = ()
    #: Rules the unchanged spec breaks, which it passed when it was accepted.
    ratcheted: tuple[str, ...] = ()

    @classmethod
    def read(cls, body: dict[str, Any]) -> Subject:
        """Parse a pipeline body; raises ``InvalidPipeline`` or ``IdentityChanged``."""
        loaded = load_stored(body)
        pipeline = loaded.value
        identity = resolve_identity(pipeline)
        run, running_stable = spec_to_run(pipeline)
        return cls(
            body=body,
            pipeline=pipeline,
            identity=identity,
            run=run,
            running_stable=running_stable,
            ignored=loaded.ignored,
            ratcheted=loaded.ratcheted,
        )
