"""Local development environment: real Kafka, a real Kubernetes control plane, images.

Everything here fetches or builds real components from public registries into
a cache outside the repository (``$EOP_CACHE``, default ``~/.cache/eop``),
keyed by version.  Tests, benchmarks and the demo start them from here.
"""
