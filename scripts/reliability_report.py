"""Renders the tables of docs/reliability.md from what the harnesses recorded.

    python scripts/reliability_report.py [--kill bench/kill.jsonl] [--memory bench/memory.jsonl]
                                         [--faults bench/faults.jsonl] [--doc docs/reliability.md]

Each table sits between `<!-- BEGIN NAME -->` and `<!-- END NAME -->` in the document and is
replaced whole; the newest run of each (the lines of the last date and commit recorded) is
what it shows. `make reliability` runs the harnesses, then this.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def read_lines(path: Path, key: str | None = None) -> list[dict[str, Any]]:
    """The lines of the newest run recorded in `path` (those of its last `run` id); with
    `key`, for each value of that field, the lines of the newest run that has it (a harness
    run again for some entry points only)."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return []
    if key is None:
        last = lines[-1].get("run")
        return [r for r in lines if r.get("run") == last]
    newest = {r[key]: r.get("run") for r in lines}
    return [r for r in lines if r.get("run") == newest[r[key]]]


def kill_table(lines: list[dict[str, Any]]) -> str:
    by_entry: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in lines:
        by_entry[r["entry"]].append(r)
    out = [
        "| entry point | seeds | killed mid-run | left after the kill | chunks left (min–max) "
        "| rerun resumed | rerun exact | failures | seconds |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for entry, rs in by_entry.items():
        left = Counter(r["left"] for r in rs)
        chunks = [r["chunks_left"] for r in rs]
        resumed = [r for r in rs if r["rerun_resumed"]]
        can_resume = any(r["rerun_resumed"] is not None for r in rs)
        out.append(
            f"| {entry} | {len(rs)} | {sum(r['killed'] for r in rs)} "
            f"| {', '.join(f'{k} {n}' for k, n in sorted(left.items()))} "
            f"| {min(chunks)}–{max(chunks)} of {rs[0]['chunks_total']} "
            f"| {len(resumed) if can_resume else 'starts over'} "
            f"| {sum(r['exact'] for r in rs)} | {sum(bool(r['problem']) for r in rs)} "
            f"| {sum(r['seconds'] for r in rs):.0f} |"
        )
    return "\n".join(out)


def memory_table(lines: list[dict[str, Any]]) -> str:
    out = [
        "| op kind | case | stages | input MiB | budget MiB | baseline MiB | peak RSS MiB "
        "| limit MiB | within | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in lines:
        case = str(r["case"]).replace("|", "\\|")
        out.append(
            f"| {r['kind']} | {case} | {r['strategy']} | {r['input_mib']} "
            f"| {r['budget_mib']} | {r['baseline_mib']} | {r['peak_mib']} | {r['limit_mib']} "
            f"| {'yes' if r['within'] else '**no**'} | {r['seconds']} |"
        )
    return "\n".join(out)


def faults_table(lines: list[dict[str, Any]]) -> str:
    out = [
        "| storage | fault | operation | outcome | error (first line) | half-written | seconds |",
        "|---|---|---|---|---|---|---:|",
    ]
    for r in lines:
        error = (r.get("error") or "").splitlines()[0][:140] if r.get("error") else ""
        error = error.replace("|", "\\|")
        out.append(
            f"| {r['storage']} | {r['fault']} | {r['operation']} | {r['outcome']} | {error} "
            f"| {'**yes**' if r['half_written'] else 'no'} | {r['seconds']} |"
        )
    return "\n".join(out)


def provenance(lines: list[dict[str, Any]]) -> str:
    if not lines:
        return "_Not run yet._"
    runs = {r.get("run"): r for r in lines}
    return " ".join(
        f"Run `{r.get('run')}` on {r.get('date')}, commit {r.get('commit', '?')}, "
        f"{r.get('machine', '?')}."
        for r in runs.values()
    )


def replace_section(doc: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.DOTALL)
    if not pattern.search(doc):
        raise SystemExit(f"docs/reliability.md has no <!-- BEGIN {name} --> section")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill", type=Path, default=ROOT / "bench" / "kill.jsonl")
    parser.add_argument("--memory", type=Path, default=ROOT / "bench" / "memory.jsonl")
    parser.add_argument("--faults", type=Path, default=ROOT / "bench" / "faults.jsonl")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "reliability.md")
    args = parser.parse_args()
    doc = args.doc.read_text()
    for name, path, key, render in [
        ("kill-table", args.kill, "entry", kill_table),
        ("memory-table", args.memory, None, memory_table),
        ("faults-table", args.faults, None, faults_table),
    ]:
        lines = read_lines(path, key)
        body = provenance(lines) + ("\n\n" + render(lines) if lines else "")
        doc = replace_section(doc, name, body)
    args.doc.write_text(doc)


if __name__ == "__main__":
    main()
