"""Fixtures borrowed from other tiers: the lifecycle tier's operator and pipelines (the test
plays the kubelet) and the chart tier's helm."""

from tests.charts.test_chart import helm
from tests.integration.test_lifecycle import crd, operator, pipeline

__all__ = ["crd", "helm", "operator", "pipeline"]
