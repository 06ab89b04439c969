"""The docs stay true to the tree: every file path docs/architecture.md names exists, every
relative link in README.md and docs/ points at a file that exists, and the README stays a
three-minute read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_every_path_the_architecture_names_exists() -> None:
    text = (ROOT / "docs/architecture.md").read_text()
    paths = set(re.findall(r"`((?:engine|python|tests|scripts|docs|bench|plans)/[\w./-]*)`", text))
    assert len(paths) > 10, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


@pytest.mark.parametrize("doc", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_point_at_files(doc: Path) -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
    missing = [link for link in links if "://" not in link and not (doc.parent / link).exists()]
    assert not missing, missing


def test_the_readme_is_a_three_minute_read() -> None:
    assert (ROOT / "README.md").stat().st_size < 8 * 1024
