# Common tasks. Every target installs what it needs (idempotent, cached in ~/.cache/eop).
SHELL := /bin/bash
PY := .venv/bin/python
CRD := exactlyoncepipelines.exactlyonce.io.yaml

.PHONY: demo setup deps deps-demo crds lint test test-unit test-fast test-e2e test-nodes cluster-up cluster-down clean

# cluster-up/cluster-down: 1 is the single-node cluster on loopback; more is the multi-node
# cluster on a pod network (`make cluster-up NODES=3`).
NODES ?= 1

## setup: create .venv and install eop with every extra (the dev environment)
setup: .venv/.installed
.venv/.installed: pyproject.toml
	bash devenv/setup.sh
	touch $@

## deps: setup + the real components the tests start: Kubernetes binaries, Kafka, Spark jars (the
## Kafka and S3A connectors), the images, the ecosystem's tools (kstatus, promtool, a PromQL
## parser, lua5.4) and SeaweedFS (the S3 server of the s3 tests). All run side by side, the venv's
## installation too (only the jars wait for it): the Go builds share the cores, and the downloads
## (modules, wheels, jars, packages) overlap the compiling.
deps:
	$(MAKE) --no-print-directory -j5 setup build-kube build-tools fetch-jars build-images

## deps-demo: setup + only what `make demo` starts: the one-node cluster's binaries and helm
## (no kube-proxy or CoreDNS), the Kafka broker, Spark's Kafka connector (for `eop verify` at the
## end) and the images (which fetch their own jars)
deps-demo:
	$(MAKE) --no-print-directory -j4 setup build-kube-cluster fetch-jars-demo build-images

# The pieces of deps and deps-demo, each one script (idempotent, a no-op when cached).
.PHONY: build-kube build-kube-cluster build-tools fetch-jars fetch-jars-demo build-images
build-kube:
	bash devenv/build-kube.sh
build-kube-cluster:
	bash devenv/build-kube.sh cluster
build-tools:
	bash devenv/build-tools.sh
# The jars Spark provides are left out, as the venv's pyspark lists them: after setup.
fetch-jars: setup
	bash devenv/fetch-jars.sh >/dev/null
fetch-jars-demo: setup
	bash devenv/fetch-jars.sh kafka spark >/dev/null
build-images:
	bash devenv/images.sh all >/dev/null

## crds: regenerate crds/, charts/eop/crds/ and docs/api.md from the pydantic models
crds: setup
	.venv/bin/eop crd > crds/$(CRD)
	mkdir -p charts/eop/crds && cp crds/$(CRD) charts/eop/crds/$(CRD)
	$(PY) -c 'from eop_operator.api.reference import api_reference; print(api_reference())' > docs/api.md

## lint: ruff, mypy and the import contracts (pyproject.toml, docs/architecture.md)
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check operator spark_apps devenv tests bench demo
	.venv/bin/mypy
	.venv/bin/lint-imports

## demo: the main job: local cluster, Kafka, the chart, two pipelines, disruptions, verification
demo: deps-demo
	$(PY) -m demo.run

## test: the whole suite (unit, real Kafka + Spark, real control plane and clusters) in two lanes
## side by side (tests/lanes.py); what CI runs
test: deps
	$(PY) -m tests.lanes

## test-unit: seconds, no external components
test-unit: setup
	$(PY) -m pytest -m "not kafka and not spark and not kube and not e2e and not nodes and not ecosystem and not s3"

## test-fast: every test under ~15 s but the local clusters' (no slow, e2e or nodes marker)
test-fast: deps
	$(PY) -m tests.lanes -m "not slow and not e2e and not nodes"

## cluster-up: the local cluster with real kubelets, plus the images (docs/local-cluster.md);
## NODES=3: three nodes on a pod network with kube-proxy and CoreDNS
cluster-up: deps
	$(PY) -m devenv.cluster up --nodes $(NODES)

## cluster-down: stop it (data kept; `$(PY) -m devenv.cluster down --purge` deletes it)
cluster-down:
	$(PY) -m devenv.cluster down --nodes $(NODES)

## test-e2e: end-to-end tests on the local cluster (starts it if needed)
test-e2e: deps
	$(PY) -m pytest -m e2e tests/e2e

## test-nodes: the multi-node cluster's tier (starts a 3-node cluster if needed)
test-nodes: deps
	$(PY) -m pytest -m nodes tests/e2e/test_nodes.py

clean:
	rm -rf .eop .pytest_cache .mypy_cache .ruff_cache
