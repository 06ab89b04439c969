"""bench/loader.py --quick runs on tiny arrays and writes its section of RESULTS.md with a
measured row for every tool and data set, in place of an older copy and beside the others, and
leaves nothing in the temporary directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SECTION = "## Training loader"


def test_quick_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "RESULTS.md").write_text(f"# results\n\n{SECTION}\n\nold\n\n## Next\n\nkept\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "loader.py"), "--quick"]
        + ["--data", str(tmp_path / "data"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert not list(tmp.iterdir()), "left in the temporary directory"
    text = (out / "RESULTS.md").read_text()
    assert text.count(SECTION) == 1 and "\nold\n" not in text
    assert text.rstrip().endswith("## Next\n\nkept")
    tools = ["chunkfuse WindowLoader", "chunkfuse in DataLoader, 2 workers", "zarr-python loop"]
    tools += ["xbatcher \\+ Dask \\+ DataLoader, 2 workers", "decode floor \\(touched chunks\\)"]
    assert re.search(r"commit [0-9a-f]{7,}\+?", text), text[:600]
    assert "![training loader](loader.png)" in text and (out / "loader.png").stat().st_size > 0
    for data in ("noisy", "quantized", "noisy, sharded", "quantized, sharded"):
        for tool in tools:
            row = re.search(rf"^\| {data} \| {tool} \| (\d+) \(", text, re.MULTILINE)
            assert row and int(row.group(1)) > 0, f"no measured row for {data} {tool}:\n{text}"
