"""scripts/check_layout.py: it finds import loops and oversized files and functions, and the
tree has none beyond its listed exceptions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "scripts/check_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layout"] = module
    spec.loader.exec_module(module)
    return module


def test_loops_are_the_cycles_of_more_than_one_module() -> None:
    check = _script()
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e", "d"}}
    assert check.loops(graph) == [["a", "b", "c"]]
    assert check.loops({"a": {"b"}, "b": set()}) == []


def test_rust_imports_see_use_paths_groups_and_paths_in_code() -> None:
    graph = _script().rust_imports()
    # `use super::{fft, fuse, ...}` in optimize/stages.rs, `use crate::physical::fused::{...}`
    # in optimize/joins.rs, `crate::plan::graph` paths in code.
    assert "crate::optimize::fuse" in graph["crate::optimize::stages"]
    assert "crate::physical::fused" in graph["crate::optimize::joins"]
    assert "crate::plan::graph" in graph["crate::optimize::joins"]
    assert "crate::error" in graph["crate::run"]


def test_python_imports_resolve_relative_and_absolute_names() -> None:
    graph = _script().python_imports()
    assert "chunkfuse.dask.symbols" in graph["chunkfuse.dask.joins"]
    assert "chunkfuse.common.symbols" in graph["chunkfuse.dask.joins"]
    # The native module (its stub `_engine.pyi`) is a module, not the package facade.
    assert graph["chunkfuse.iomode"] == {"chunkfuse._engine"}


def test_the_tree_has_no_finding_beyond_the_listed_exceptions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _script()
    monkeypatch.setattr(sys, "argv", ["check_layout.py"])
    assert check.main() == 0, capsys.readouterr().out
