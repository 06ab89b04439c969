"""The kill harness (scripts/kill_harness.py) on two seeds per entry point: every write that
chunkfuse does, SIGKILLed at a random point, leaves whole chunks and a visibly unfinished
target, and its rerun equals a clean run bit for bit. `make kill` runs 20 seeds per entry
point and records them for docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "scripts" / "kill_harness.py"
sys.path.insert(0, str(ROOT / "scripts"))

import kill_harness  # noqa: E402


@pytest.mark.parametrize("entry", kill_harness.ENTRIES)
def test_killed_writes_leave_whole_chunks_and_rerun_exactly(entry: str, tmp_path: Path) -> None:
    out = tmp_path / "kill.jsonl"
    run = subprocess.run(
        [sys.executable, str(HARNESS), "--entry", entry, "--seeds", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert run.returncode == 0, run.stderr[-3000:] + "\n".join(map(str, lines))
    assert [r["seed"] for r in lines] == [0, 1]
    for r in lines:
        assert r["exact"] and not r["problem"], r
        assert r["left"] in {"absent", "marked", "not begun", "complete"}, r
        if r["left"] == "not begun":
            assert entry in kill_harness.PRE_CREATED, r


def _tree(files: dict[str, bytes], root: Path) -> dict[str, Path]:
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return kill_harness.files(root)


ARRAY = json.dumps({"node_type": "array"}).encode()
MARKED = json.dumps(
    {"node_type": "array", "attributes": {"chunkfuse": {"incomplete": True, "job": "j"}}}
).encode()


def test_the_checks_catch_a_partial_chunk_and_an_unmarked_partial_target(tmp_path: Path) -> None:
    """The harness's own checks fail on what they must catch (so a pass means something)."""
    clean = _tree({"zarr.json": ARRAY, "c/0": b"whole", "c/1": b"chunk"}, tmp_path / "clean")
    cut = _tree({"zarr.json": MARKED, "c/0": b"who"}, tmp_path / "cut")
    assert kill_harness.left_by_kill(cut, clean)[0] == "bad"
    unmarked = _tree({"zarr.json": ARRAY, "c/0": b"whole"}, tmp_path / "unmarked")
    assert kill_harness.left_by_kill(unmarked, clean)[0] == "bad"
    marked = _tree(
        {"zarr.json": MARKED, "c/0": b"whole", "c/.partial-1": b"x", "c/1.0a1b.partial": b""},
        tmp_path / "m",
    )
    assert kill_harness.left_by_kill(marked, clean) == ("marked", "")
    empty = _tree({"zarr.json": ARRAY}, tmp_path / "empty")
    assert kill_harness.left_by_kill(empty, clean) == ("not begun", "")
    assert kill_harness.same_tree(marked, clean) != ""
    assert kill_harness.same_tree(clean, clean) == ""
