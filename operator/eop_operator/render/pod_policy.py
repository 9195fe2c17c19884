"""The operator's pod policy: which node-level access a pipeline's driver pod may ask for.

Whoever may create an ExactlyOncePipeline may create a pod through the operator
(docs/security.md). The image, the ServiceAccount (of the pipeline's own namespace)
and the extra volumes are theirs to choose, as with any pod they could create; the
node's network and the node's filesystem are not, unless the operator's settings allow
them (``eop operator --allow-host-network``, ``--allow-host-path-volumes``; the chart's
``pipelinePolicy`` values). A refusal names the field and comes before any driver runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from eop_operator.api.load import InvalidPipeline
from eop_operator.api.models import ExactlyOncePipeline


@dataclass(frozen=True)
class PodPolicy:
    """What the operator lets pipelines ask of the node; everything refused by default."""

    allow_host_network: bool = False
    allow_host_path_volumes: bool = False


class PodPolicyRefused(InvalidPipeline):
    """The pipeline asks for node access the operator's pod policy refuses; names each field."""


def check_pod_policy(pipeline: ExactlyOncePipeline, policy: PodPolicy) -> None:
    """Raise :class:`PodPolicyRefused` naming every field the policy refuses."""
    refused = []
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
