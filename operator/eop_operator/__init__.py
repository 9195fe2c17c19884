"""eop's control plane: the ExactlyOncePipeline API, rendering, and the kopf operator.

Layers, each importing only those to its left (docs/architecture.md maps them)::

    api (models, CRD) -> render (pure: pipeline -> objects) -> reconcile (pure decisions)
        -> kube (API I/O) -> health, metrics -> controller (kopf wiring, loops) -> cli

The data plane is imported only through its contract (``eop_spark.contract``:
spec models, run config, errors), its door for the health checks
(``eop_spark.operator_access``: the progress group read and refreshed, the
clusters asked) and, lazily, by ``eop run``, ``eop verify``, ``eop executor``
and ``eop checkpoint delete``; it never imports this package (the import
contracts in ``pyproject.toml`` hold both).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    #: The operator's version (the ``eop`` distribution's), recorded as ``status.renderedBy``.
    __version__ = _version("eop")
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0.0.0+unknown"

#: API group, version and kind of the custom resource.
GROUP = "exactlyonce.io"
#: The storage version: the one the API server keeps objects in, and the one the operator
#: reads and writes.  It stays ``v1alpha1`` while an operator that knows only ``v1alpha1`` may
#: be rolled back to (docs/api.md, "API versions").
VERSION = "v1alpha1"
#: Every served version, oldest first.  Their schemas are identical, so the API server converts
#: between them by changing ``apiVersion`` alone (conversion strategy ``None``).
VERSIONS = ("v1alpha1", "v1beta1")
KIND = "ExactlyOncePipeline"
PLURAL = "exactlyoncepipelines"
SINGULAR = "exactlyoncepipeline"
SHORT_NAMES = ("eop",)
API_VERSION = f"{GROUP}/{VERSION}"
#: The ``apiVersion`` of each served version.
API_VERSIONS = tuple(f"{GROUP}/{version}" for version in VERSIONS)
