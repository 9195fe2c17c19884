"""The operator's pod policy: which identity and node-level access a pipeline's pods may ask for.

Whoever may create an ExactlyOncePipeline may create a restricted pod through the operator, as
the pipeline's own ServiceAccount, and nothing more (docs/security.md). The image and the
extra volumes of the allowed types are theirs to choose; another ServiceAccount, the node's
network and the node's filesystem are not, unless the operator's settings allow them
(``eop operator --allow-service-account``, ``--allow-host-network``,
``--allow-host-path-volumes``; the chart's ``pipelinePolicy`` values). A refusal names the field
and comes before any driver runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eop_operator.api.load import InvalidPipeline
from eop_operator.api.models import ExactlyOncePipeline

#: The Spark setting naming the executors' ServiceAccount (``spec.spark.conf``).
EXECUTOR_SERVICE_ACCOUNT_CONF = "spark.kubernetes.authenticate.executor.serviceAccountName"


@dataclass(frozen=True)
class PodPolicy:
    """What the operator lets pipelines ask of the node; everything refused by default."""

    allow_host_network: bool = False
    allow_host_path_volumes: bool = False
    #: ServiceAccounts a pipeline may name (``spec.serviceAccountName``, the executors'); by
    #: default none: a driver runs as the account eop creates for it, or the namespace default.
    service_accounts: frozenset[str] = field(default_factory=frozenset)


class PodPolicyRefused(InvalidPipeline):
    """The pipeline asks for node access the operator's pod policy refuses; names each field."""


def _service_account_refusals(pipeline: ExactlyOncePipeline, policy: PodPolicy) -> list[str]:
    named = [
        ("spec.serviceAccountName", pipeline.spec.service_account_name),
        (
            f"spec.spark.conf[{EXECUTOR_SERVICE_ACCOUNT_CONF}]",
            pipeline.spec.spark.conf.get(EXECUTOR_SERVICE_ACCOUNT_CONF),
        ),
    ]
    return [
        f"{path}: this operator does not run pipelines as ServiceAccount {account!r} (leave it "
        "unset: the driver runs as the account eop makes for it; an account is allowed by "
        f"`eop operator --allow-service-account {account}`, chart value "
        "pipelinePolicy.serviceAccounts)"
        for path, account in named
        if account and account not in policy.service_accounts
    ]


def check_pod_policy(pipeline: ExactlyOncePipeline, policy: PodPolicy) -> None:
    """Raise :class:`PodPolicyRefused` naming every field the policy refuses."""
    refused = _service_account_refusals(pipeline, policy)
    driver = pipeline.spec.driver
    if driver.host_network and not policy.allow_host_network:
        refused.append(
            "spec.driver.hostNetwork: this operator does not run pipelines on the node's network "
            "(allowed by `eop operator --allow-host-network`, chart value "
            "pipelinePolicy.allowHostNetwork)"
        )
    if not policy.allow_host_path_volumes:
        refused += [
            f"spec.driver.volumes[{index}].hostPath: this operator does not mount the node's "
            "files into pipelines (allowed by `eop operator --allow-host-path-volumes`, chart "
            "value pipelinePolicy.allowHostPathVolumes)"
            for index, volume in enumerate(driver.volumes)
            if "hostPath" in volume
        ]
    if refused:
        raise PodPolicyRefused("; ".join(refused))
