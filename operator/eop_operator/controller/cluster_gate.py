"""The operator's last door before a driver starts: what the Secrets and the clusters say.

Before a lifecycle step renders a pipeline, :meth:`ClusterGate.admit` asks
whether the keys of the checkpoint's Secret make the object store's credentials
(``health.checkpoint_secret``), then (``health.clusters``, through the runner's
own code) whether the Kafka Secrets hold a key eop owns, whether the source
reads the sink topic on the same cluster, and whether
``sink.kafka.transactionTimeout`` exceeds the sink brokers' maximum.  A refusal
is a :class:`ClusterRefusal`: the lifecycle refuses the pipeline (``Degraded``,
naming the field, and an event) and creates nothing for it.

Cheap, and never in the way:

* one answer per spec generation; a refusal is asked again after
  :data:`RECHECK_REFUSED_S` (a Secret or a broker setting may be fixed
  without a spec change);
* every request bounded (``health.clusters``), at most :data:`CHECKS_AT_ONCE`
  checks in flight, each in a worker thread: other pipelines' steps go on;
* a cluster or Secret that cannot be asked does not hold the driver back (the
  runner asks again as it starts, and fails naming what it cannot reach; the
  kubelet does not start a pod whose Secret is missing): a
  ``ClusterCheckDeferred`` event says so, once per generation, and the
  question is asked again with back-off (:data:`RETRY_FIRST_S` doubling up to
  :data:`RETRY_MAX_S`).  A Normal event: an operator kept from the brokers
  (a network policy) is no fault of the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

from eop_operator.api.load import InvalidPipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.controller.context import Context
from eop_operator.health.checkpoint_secret import check_checkpoint_secret
from eop_operator.health.clusters import ask_clusters
from eop_operator.health.progress import (
    KafkaAccess,
    ProgressUnavailable,
    SecretRefused,
    kafka_access,
)
from eop_operator.kube.events import post_event
from eop_operator.kube.observed import PipelineKey
from eop_spark.contract.errors import ConfigError, EopError

#: Seconds until a refusal is asked again (what the user fixes outside the spec).
RECHECK_REFUSED_S = 60.0
#: Seconds until a check that could not ask is tried again, doubled each time.
RETRY_FIRST_S = 10.0
#: The longest wait between two tries of a check that could not ask.
RETRY_MAX_S = 300.0
#: Checks in flight at once (each holds a worker thread for up to a few timeouts).
CHECKS_AT_ONCE = 2

log = logging.getLogger(__name__)


class ClusterRefusal(InvalidPipeline):
    """The Kafka clusters or a Secret refuse a field of the spec; the message names it."""


@dataclass(frozen=True)
class Answer:
    """What one check of a spec generation found."""

    #: The pipeline's uid and generation the answer is about.
    generation: tuple[str | None, int | None]
    #: Why the spec cannot run (names the field); None: nothing refused.
    refusal: str | None
    #: Why the check could not ask (a cluster or Secret out of reach); None: it asked.
    unavailable: str | None
    #: When to ask again (event-loop time).
    again_at: float
    #: Checks of this generation in a row that could not ask.
    misses: int = 0


def next_answer(
    previous: Answer | None,
    generation: tuple[str | None, int | None],
    *,
    refusal: str | None,
    unavailable: str | None,
    now: float,
) -> Answer:
    """The answer after one check: a refusal stands until a check that asked clears it."""
    same = previous is not None and previous.generation == generation
    if unavailable is None:
        again = now + RECHECK_REFUSED_S if refusal is not None else math.inf
        return Answer(generation, refusal, None, again)
    misses = previous.misses + 1 if same and previous is not None else 1
    wait = min(RETRY_FIRST_S * 2 ** (misses - 1), RETRY_MAX_S)
    kept = previous.refusal if same and previous is not None else None
    return Answer(generation, kept, unavailable, now + wait, misses)


class ClusterGate:
    """Remembers each pipeline's answer per spec generation; asks again when due."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.answers: dict[PipelineKey, Answer] = {}
        self._turns: asyncio.Semaphore | None = None

    def forget(self, key: PipelineKey) -> None:
        """Drop the answer of a pipeline that is gone (not while it is going: a step may
        still read it as it was, and would ask again)."""
        self.answers.pop(key, None)

    async def admit(self, body: dict[str, Any], pipeline: ExactlyOncePipeline) -> None:
        """Raise :class:`ClusterRefusal` if the clusters or Secrets refuse this spec.

        A suspended pipeline starts no driver: it is asked once it resumes.
        """
        if pipeline.spec.suspend:
            return
        meta = pipeline.metadata
        key, generation = (meta.namespace, meta.name), (meta.uid, meta.generation)
        now = asyncio.get_running_loop().time()
        answer = self.answers.get(key)
        if answer is None or answer.generation != generation or now >= answer.again_at:
            answer = await self._ask(body, pipeline, answer)
        if answer.refusal is not None:
            raise ClusterRefusal(answer.refusal)

    async def _ask(
        self, body: dict[str, Any], pipeline: ExactlyOncePipeline, previous: Answer | None
    ) -> Answer:
        if self._turns is None:  # made in the operator's event loop, at the first check
            self._turns = asyncio.Semaphore(CHECKS_AT_ONCE)
        refusal = unavailable = None
        access = KafkaAccess({}, {})
        async with self._turns:
            try:
                await check_checkpoint_secret(self.context.client, pipeline)
                access = await kafka_access(self.context.client, pipeline)
                await asyncio.to_thread(ask_clusters, access, pipeline)
            except SecretRefused as exc:
                refusal = str(exc)
            except ProgressUnavailable as exc:
                unavailable = str(exc)
            except ConfigError as exc:
                refusal = access.redact(exc.message)
            except EopError as exc:
                unavailable = access.redact(exc.message)
            except Exception as exc:  # a client setting confluent-kafka refuses, a bug
                unavailable = access.redact(f"{type(exc).__name__}: {exc}")
        meta = pipeline.metadata
        now = asyncio.get_running_loop().time()
        answer = next_answer(
            previous,
            (meta.uid, meta.generation),
            refusal=refusal,
            unavailable=unavailable,
            now=now,
        )
        self.answers[(meta.namespace, meta.name)] = answer
        if unavailable is not None and answer.misses == 1:
            log.info("cannot check %s/%s: %s", meta.namespace, meta.name, unavailable)
            await post_event(
                self.context.client,
                body,
                type="Normal",
                reason="ClusterCheckDeferred",
                message=f"cannot check the spec against its Secrets and Kafka clusters yet "
                f"(tried again with back-off; the driver is not held back): {unavailable}",
            )
        return answer
