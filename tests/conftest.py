"""Shared pytest configuration: the real-component fixtures live in tests/plugins."""

from pathlib import Path

# Each plugin starts its component only when a test asks for its fixture.
pytest_plugins = [
    f"tests.plugins.{path.stem}"
    for path in sorted(Path(__file__).with_name("plugins").glob("*.py"))
    if path.stem != "__init__"
]
