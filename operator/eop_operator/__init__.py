"""eop's control plane: the ExactlyOncePipeline API, rendering, and the kopf operator.

Layers, each importing only those to its left (docs/architecture.md maps them)::

    api (models, CRD) -> render (pure: pipeline -> objects) -> reconcile (pure decisions)
        -> kube (API I/O) -> health, metrics -> controller (kopf wiring, loops) -> cli

The data plane (``eop_spark``) is imported for its spec models and, lazily,
by ``eop run``; it never imports this package.
"""

#: API group, version and kind of the custom resource.
GROUP = "exactlyonce.io"
VERSION = "v1alpha1"
KIND = "ExactlyOncePipeline"
PLURAL = "exactlyoncepipelines"
SINGULAR = "exactlyoncepipeline"
SHORT_NAMES = ("eop",)
API_VERSION = f"{GROUP}/{VERSION}"
