"""Checks the code's layout: import loops among the engine's modules and among the Python
package's modules, source files over the line limit and functions over theirs.

    python scripts/check_layout.py [--list]

Rust modules are the files of engine/src; a file imports another when it names it by a
`crate::`, `super::` or `self::` path (in `use` or in code; a path to an item re-exported by a
`mod.rs` counts as that `mod.rs`, whose `pub use` lines name the module defining it). Python
modules are the files of python/chunkfuse, imports at any level of a file included. Tests
(`#[cfg(test)] mod tests` at the end of a Rust file, the tests/ folder) are not counted.
Limits: FILE_LINES per file, FUNCTION_LINES per function. Known exceptions live in
scripts/layout_exceptions.txt, one per line with its reason; the check fails on any finding
not listed there, and on a listed one that no longer occurs (so the list only shrinks).
Exits 1 on failure, printing each finding. `--list` prints every finding, listed or not.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine" / "src"
PACKAGE = ROOT / "python" / "chunkfuse"
EXCEPTIONS = ROOT / "scripts" / "layout_exceptions.txt"
FILE_LINES = 600
FUNCTION_LINES = 120

_PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
_USE_GROUP = re.compile(
    r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}\s*;", re.S
)
_FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def _rust_body(path: Path) -> str:
    """The file's text before its test module, without comments."""
    text = path.read_text()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\b", text, re.M)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def _rust_module(path: Path) -> tuple[str, ...]:
    rel = path.relative_to(ENGINE).with_suffix("")
    parts = rel.parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def _rust_modules() -> dict[tuple[str, ...], Path]:
    modules = {}
    for path in sorted(ENGINE.rglob("*.rs")):
        if "bin" in path.relative_to(ENGINE).parts:
            continue
        modules[_rust_module(path)] = path
    return modules


def _resolve(segments: tuple[str, ...], modules: dict[tuple[str, ...], Path]) -> tuple[str, ...]:
    """The longest prefix of `segments` that is a module."""
    for n in range(len(segments), -1, -1):
        if segments[:n] in modules:
            return segments[:n]
    return ()


def _absolute(kind: str, rest: str, here: tuple[str, ...], is_mod: bool) -> tuple[str, ...]:
    segs = tuple(s for s in rest.split("::") if s)
    if kind == "crate":
        return segs
    # `self::` in a mod.rs names its children; in a file, its own inline items.
    base = here if (is_mod or kind == "self") else here[:-1]
    if kind == "super":
        base = base[:-1] if is_mod else base
    while segs and segs[0] == "super":
        base, segs = base[:-1], segs[1:]
    return base + segs


def rust_imports() -> dict[str, set[str]]:
    modules = _rust_modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        body = _rust_body(path)
        is_mod = path.name in ("mod.rs", "lib.rs")
        targets: set[tuple[str, ...]] = set()
        for m in _USE_GROUP.finditer(body):
            prefix = _absolute(m.group(1), m.group(2), mod, is_mod)
            for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", m.group(3))):
                name = item.split("::")[0].strip()
                if name and name != "self":
                    targets.add(_resolve(prefix + tuple(item.split("::")), modules))
                elif name == "self":
                    targets.add(_resolve(prefix, modules))
        for m in _PATH.finditer(body):
            targets.add(_resolve(_absolute(m.group(1), m.group(2), mod, is_mod), modules))
        if is_mod:
            # `pub use child::Item` names the child module.
            for m in re.finditer(r"pub use (\w+)::", body):
                targets.add(_resolve(mod + (m.group(1),), modules))
        name = "::".join(("crate", *mod))
        graph[name] = {"::".join(("crate", *t)) for t in targets if t != mod and t}
    return graph


def _python_module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_imports() -> dict[str, set[str]]:
    # The native module's stub (`_engine.pyi`) names a module too: importing it is not
    # importing the package.
    found = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]
    files = {_python_module(p): p for p in sorted(found)}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                # The longest prefix that is a module of the package.
                parts = name.split(".")
                for n in range(len(parts), 0, -1):
                    candidate = ".".join(parts[:n])
                    if candidate in files:
                        if candidate != mod:
                            targets.add(candidate)
                        break
        graph[mod] = targets
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _rust_functions(path: Path) -> Iterable[tuple[str, int]]:
    """Each function of the file outside its tests, with its length in lines."""
    lines = _rust_body(path).splitlines()
    i = 0
    while i < len(lines):
        m = _FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or "{" in lines[j]
            if ";" in lines[j] and not opened:
                break  # a declaration without a body
            if opened and depth <= 0:
                break
            j += 1
        if opened:
            yield m.group(1), j - i + 1
        i += 1


def _python_functions(path: Path) -> Iterable[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, (node.end_lineno or node.lineno) - node.lineno + 1


def findings() -> list[str]:
    out: list[str] = []
    for label, graph in (("rust", rust_imports()), ("python", python_imports())):
        for comp in loops(graph):
            out.append(f"loop {label}: {' <-> '.join(comp)}")
    sources = [p for p in ENGINE.rglob("*.rs")] + [p for p in PACKAGE.rglob("*.py")]
    for path in sorted(sources):
        rel = path.relative_to(ROOT)
        body = _rust_body(path) if path.suffix == ".rs" else path.read_text()
        n = body.count("\n") + 1
        if n > FILE_LINES:
            out.append(f"file {rel}: {n} lines")
        funcs = _rust_functions(path) if path.suffix == ".rs" else _python_functions(path)
        for name, length in funcs:
            if length > FUNCTION_LINES:
                out.append(f"function {rel}::{name}: {length} lines")
    return out


def _key(finding: str) -> str:
    """A finding without its count, so that a listed file or function may change size."""
    return re.sub(r": \d+ lines$", "", finding)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every finding")
    args = parser.parse_args()
    found = findings()
    if args.list:
        print("\n".join(found))
        return 0
    listed = {}
    for line in EXCEPTIONS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, reason = line.partition(" # ")
            listed[key.strip()] = reason.strip()
    keys = {_key(f): f for f in found}
    new = [f for k, f in keys.items() if k not in listed]
    gone = [k for k in listed if k not in keys]
    for f in new:
        print(f"new: {f}")
    for k in gone:
        print(f"fixed (remove it from {EXCEPTIONS.relative_to(ROOT)}): {k}")
    if new or gone:
        return 1
    print(f"layout: ok ({len(listed)} listed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
