"""The Python package: `import chunkfuse` works and reports the engine's version."""

from __future__ import annotations

import importlib
import tomllib

from conftest import REPO


def test_import_and_version() -> None:
    chunkfuse = importlib.import_module("chunkfuse")
    engine = importlib.import_module("chunkfuse._engine")
    version = engine.version()
    assert isinstance(version, str) and version, version
    assert chunkfuse.__version__ == version


def test_version_matches_workspace() -> None:
    """The engine reports the workspace version from Cargo.toml."""
    engine = importlib.import_module("chunkfuse._engine")
    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())
    assert engine.version().startswith(cargo["workspace"]["package"]["version"])
