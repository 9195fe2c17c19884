"""Shared pytest configuration: the real-component fixtures live in tests/plugins."""

pytest_plugins = [
    "tests.plugins.kafka",
    "tests.plugins.kube",
]
