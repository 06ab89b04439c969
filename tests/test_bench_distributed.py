"""bench/distributed.py --quick runs on tiny arrays, and writes its section of RESULTS.md with
every row measured and checked, in place of an older copy of that section and beside the
others."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SECTION = "## Distributed: 2-worker LocalCluster"
DATA_SETS = ("noisy", "quantized")
OPS = ("sum", "mean", "anomaly", "rechunk")
TOOLS = ("chunkfuse distributed", "chunkfuse local, 2 threads", "Dask", "Cubed DaskExecutor")


def test_quick_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = f"# results\n\nintro\n\n{SECTION}\n\nan older run\n\n## Next section\n\nkept\n"
    (out / "RESULTS.md").write_text(before)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "distributed.py"), "--quick"]
        + ["--data", str(tmp_path / "data"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert not list(tmp.iterdir()), "left in the temporary directory"
    text = (out / "RESULTS.md").read_text()
    assert text.startswith("# results\n\nintro\n")
    assert text.count(SECTION) == 1
    assert "an older run" not in text
    assert text.rstrip().endswith("## Next section\n\nkept")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    number = r"\d+\.\d+"
    sizes = r"(\d+(?: / \d+)?)"  # MiB of each process
    for data in DATA_SETS:
        for op in OPS:
            for tool in TOOLS:
                row = re.search(
                    rf"^\| {data} \| {op} \| {re.escape(tool)} \| ({number})[^|]* \| {number} \|"
                    rf" [^|]+ \| {sizes} \| {sizes} \| ok( \(by its anomaly\))? \|",
                    section,
                    re.MULTILINE,
                )
                assert row, f"no measured, checked row for {data} {op} {tool}:\n{section}"
                assert float(row.group(1)) > 0
                peaks = [int(p) for p in row.group(2).split(" / ")]
                starts = [int(p) for p in row.group(3).split(" / ")]
                # The cluster's rows have a peak per worker; the local engine's, the driver's.
                assert len(peaks) == len(starts) == (1 if tool == TOOLS[1] else 2)
                assert all(0 < s <= p for s, p in zip(starts, peaks, strict=True))
    assert re.search(rf"Per-batch overhead: .* \(\d+ batches .*{number} ms", section)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "distributed.png").stat().st_size > 0
        assert "![distributed](distributed.png)" in section
    else:
        assert "matplotlib is not installed" in section
