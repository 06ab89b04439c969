"""Reads onto the GPU against the CPU engine on all cores, on one machine, in one process.

    python bench/gpu.py [--time 256] [--repeat 3] [--batches 20] [--out bench/GPU.md]
                        [--json FILE] [--quick] [--stage-time N]

Two ERA5-like float32 arrays of (time, 721, 1440), one chunk per time step (4.2 MB), zstd
level 3, written here by the engine: "smooth" (a smooth field with a little noise, packed to
1/8 K: zstd ratio ~4.4) and "noisy" (the field plus N(0, 3) noise, ratio ~1.3). For each,
best of `--repeat`, data in the page cache:

- CPU decode floor: `chunkfuse bench decode` (every chunk in memory decoded by libzstd on all
  cores, no IO), when the CLI is found (`CHUNKFUSE_BIN`, else target/release/chunkfuse);
- nvCOMP decode: the decode time of a whole-array device read, timed by CUDA events;
- whole array to host: `chunkfuse.read(url)` on all cores;
- whole array to the GPU: `chunkfuse.read(url, device="cuda")`, against the host read plus
  `torch.Tensor.cuda()`;
- training batches: `--batches` batches of 32 windows of 4 x 128 x 128 at random anchors,
  `read_windows(..., device="cuda")` handed to torch by DLPack, one read per batch and one
  per 5 batches (split into views, as a loader prefetching 5 batches would), against
  `read_windows` to host memory plus `.cuda()` the same two ways (the grouped speed-up is
  against the faster of those);
- nvCOMP's rate by the frames one call decodes;
- the window loader: `--batches` batches from `WindowLoader` on the host plus `.cuda()`
  against `WindowLoader(device="cuda")` (when xarray and zarr-python are installed);
- the zstd encode floor: `chunkfuse bench encode --device cuda` (every chunk encoded by
  libzstd level 3 on all cores, and by nvCOMP on the GPU, its frames decoded back);
- whole stages, `plans/era5-sum.json` (sum over time of `(x + 1) * 2`) and
  `plans/era5-anomaly.json` (x minus its time mean, written as sharded zstd), run with
  `device="cpu"` (all cores) and `device="cuda"`: in this process (the device already open)
  and as whole `chunkfuse run` processes (counting the device's opening), outputs compared;
  with `--stage-time N`, the sum plan again on arrays of N time steps;
- a fresh process's first device work, step by step (import, opening the device, the first
  read, the first and second sum).

Each run appends a section (the date, the GPU and the CPU count) to `--out`. --quick: tiny
arrays (8 x 73 x 144, one round, 2 batches of 8 windows of 2 x 16 x 16), report in a
temporary directory unless --out is given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: Batches one grouped device read takes.
GROUP = 5
RUNS_NOTE = "Each section is one run of `bench/gpu.py` on the machine it names."


def field(t: int, nlat: int, nlon: int, kind: str) -> np.ndarray:
    """Time step `t` of the `kind` ("smooth" or "noisy") array."""
    lat = np.radians(np.linspace(-90, 90, nlat, dtype=np.float32))[:, None]
    lon = np.radians(np.linspace(0, 360, nlon, endpoint=False, dtype=np.float32))[None, :]
    base = 250 + 40 * np.cos(lat) + 6 * np.sin(3 * lon + 0.1 * t) * np.cos(2 * lat)
    rng = np.random.default_rng([7, t])
    if kind == "smooth":
        # Packed to 1/8 K with a little noise, as GRIB-packed reanalysis values are.
        return (np.round((base + rng.normal(0, 0.3, size=(nlat, nlon))) * 8) / 8).astype(np.float32)
    return (base + rng.normal(0, 3, size=(nlat, nlon))).astype(np.float32)


def write_raw(path: Path, shape: tuple[int, int, int], kind: str) -> None:
    """An uncompressed Zarr v3 array, one chunk per time step."""
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(meta))
    for t in range(shape[0]):
        chunk = path / "c" / str(t) / "0" / "0"
        chunk.parent.mkdir(parents=True)
        chunk.write_bytes(field(t, shape[1], shape[2], kind).astype("<f4").tobytes())


def make(data: Path, shape: tuple[int, int, int], kind: str) -> str:
    """The zstd-3 `kind` array under `data`, written by the engine from a raw copy."""
    import chunkfuse

    raw, target = data / f"{kind}-raw.zarr", data / f"{kind}.zarr"
    write_raw(raw, shape, kind)
    plan = {
        "name": "compress",
        "arrays": [{"id": "x", "zarr": "${source}"}],
        "ops": [
            {
                "id": "out",
                "op": "write",
                "input": "x",
                "target": "${target}",
                "chunks": [1, -1, -1],
                "codec": {"name": "zstd", "level": 3},
            }
        ],
    }
    chunkfuse.run_plan(plan, {"source": str(raw), "target": str(target)})
    shutil.rmtree(raw)
    return str(target)


def stored_bytes(url: str) -> int:
    return sum(p.stat().st_size for p in Path(url).rglob("*") if p.is_file())


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The least wall time of `repeat` calls after one warm-up, and the fastest call's value."""
    fn()
    times: list[tuple[float, Any]] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        times.append((time.perf_counter() - t0, value))
    return min(times, key=lambda tv: tv[0])


def cli_bench(what: str, url: str, *extra: str) -> dict[str, Any] | None:
    """`chunkfuse bench WHAT URL ...` on all cores, when the CLI is found; a failure's message
    as `{"error": ...}`."""
    binary = os.environ.get("CHUNKFUSE_BIN") or str(ROOT / "target" / "release" / "chunkfuse")
    if not os.path.exists(binary):
        return None
    done = subprocess.run(
        [binary, "bench", what, url, *extra, "--json"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)


def loader_line(kind: str, m: dict[str, Any]) -> str:
    """The report's line on the window loader's batches, host + `.cuda()` against
    `device="cuda"`."""
    if "skipped" in m:
        return f"- {kind}, window loader: not measured: {m['skipped']}"
    n = m["batches"]
    return (
        f"- {kind}, window loader, {n} batches: host + .cuda() {n / m['host_s']:.1f} batches/s, "
        f'device="cuda" ({GROUP} per read) {n / m["device_s"]:.1f} batches/s, '
        f"{m['host_s'] / m['device_s']:.2f}x; batches equal."
    )


def encode_line(kind: str, e: dict[str, Any]) -> str:
    """The report's line on `bench encode --device cuda` of one array."""
    if "error" in e:
        return f"- {kind}, zstd encode of every chunk: failed: {e['error']}"
    gb = e["decoded_bytes"] / 1e9
    line = (
        f"- {kind}, zstd encode of every chunk ({e['chunks']}): libzstd level {e['level']} on "
        f"{e['threads']} threads {gb / e['cpu_seconds']:.1f} GB/s (ratio "
        f"{e['decoded_bytes'] / e['cpu_compressed_bytes']:.2f})"
    )
    d = e.get("device")
    if d:
        line += (
            f"; nvCOMP {gb / d['encode_seconds']:.1f} GB/s (ratio "
            f"{e['decoded_bytes'] / d['compressed_bytes']:.2f}; "
            f"{e['cpu_seconds'] / d['encode_seconds']:.2f}x libzstd's rate; upload "
            f"{d['upload_seconds']:.3f} s apart), "
            f"{d['frames_verified']} of {e['chunks']} frames decode back, "
            f"{d['frames_with_content_size']} record their size"
        )
    return line + "."


def measure(
    url: str,
    shape: tuple[int, ...],
    repeat: int,
    batches: int,
    window: tuple[int, ...],
    per_batch: int,
) -> dict[str, Any]:
    import chunkfuse
    import torch

    nbytes = int(np.prod(shape)) * 4
    out: dict[str, Any] = {"decoded_gb": nbytes / 1e9, "ratio": nbytes / stored_bytes(url)}
    floor = cli_bench("decode", url)
    if floor and "error" not in floor:
        out["cpu_decode_gbs"] = floor["decoded_bytes"] / 1e9 / floor["decode_seconds"]
    encode = cli_bench("encode", url, "--device", "cuda")
    if encode:
        out["encode"] = encode
    sync = torch.cuda.synchronize
    out["host_read_s"], _ = best(lambda: chunkfuse.read(url), repeat)
    out["device_read_s"], dev = best(lambda: chunkfuse.read(url, device="cuda"), repeat)
    stats = dev.stats
    out["device_stats"] = stats
    if stats["decode_seconds"] > 0:
        out["nvcomp_decode_gbs"] = stats["device_decoded_bytes"] / 1e9 / stats["decode_seconds"]
    np.testing.assert_array_equal(dev.numpy(), chunkfuse.read(url))
    # nvCOMP's rate by the frames one call decodes (its work is per frame).
    by_frames = {}
    for n in sorted({max(shape[0] // 16, 1), max(shape[0] // 4, 1), shape[0]}):
        _, part = best(lambda n=n: chunkfuse.read(url, np.s_[:n], device="cuda"), repeat)
        s = part.stats
        by_frames[n] = s["device_decoded_bytes"] / 1e9 / max(s["decode_seconds"], 1e-9)
    out["nvcomp_gbs_by_frames"] = by_frames

    def host_to_gpu() -> None:
        torch.from_numpy(chunkfuse.read(url)).cuda()
        sync()

    out["host_read_to_gpu_s"], _ = best(host_to_gpu, repeat)
    reader = chunkfuse.ArrayReader(url)
    rng = np.random.default_rng(0)
    highs = np.array(shape) - np.array(window) + 1
    anchors = [rng.integers(0, highs, size=(per_batch, len(shape))) for _ in range(batches)]

    def cpu_batches() -> None:
        for a in anchors:
            torch.from_numpy(chunkfuse.read_windows(reader, a, window)).cuda()
        sync()

    def gpu_batches() -> None:
        for a in anchors:
            torch.from_dlpack(chunkfuse.read_windows(reader, a, window, device="cuda"))
        sync()

    def cpu_batches_grouped() -> None:
        for g in range(0, len(anchors), GROUP):
            group = np.concatenate(anchors[g : g + GROUP])
            got = torch.from_numpy(chunkfuse.read_windows(reader, group, window)).cuda()
            list(torch.split(got, per_batch))
        sync()

    def gpu_batches_grouped() -> None:
        # GROUP batches' windows in one read (as a loader prefetching GROUP batches would),
        # each batch a view of it.
        for g in range(0, len(anchors), GROUP):
            group = np.concatenate(anchors[g : g + GROUP])
            got = torch.from_dlpack(chunkfuse.read_windows(reader, group, window, device="cuda"))
            list(torch.split(got, per_batch))
        sync()

    check = chunkfuse.read_windows(reader, anchors[0], window, device="cuda").numpy()
    np.testing.assert_array_equal(check, chunkfuse.read_windows(reader, anchors[0], window))
    out["batches_cpu_s"], _ = best(cpu_batches, repeat)
    out["batches_gpu_s"], _ = best(gpu_batches, repeat)
    out["batches_cpu_grouped_s"], _ = best(cpu_batches_grouped, repeat)
    out["batches_grouped_s"], _ = best(gpu_batches_grouped, repeat)
    out["batch_samples"] = batches * per_batch
    return out


def measure_loader(
    url: str, repeat: int, batches: int, window: tuple[int, ...], per_batch: int
) -> dict[str, Any]:
    """`batches` batches of the window loader over the array: on the host, each variable's
    tensor copied with `.cuda()`, against `device="cuda"` (GROUP batches per device read);
    batches compared. Needs xarray and zarr-python (`{"skipped": why}` without them)."""
    try:
        from chunkfuse.loader import Source, WindowLoader
    except ImportError as e:
        return {"skipped": f"the loader needs xarray and zarr-python ({e})"}
    import torch

    dims = ["dim_0", "dim_1", "dim_2"]

    def loader(**kw: Any) -> Any:
        source = Source("x", url, None, dict(zip(dims, window, strict=True)))
        return WindowLoader([source], dims, per_batch, seed=1, prefetch=GROUP, **kw)

    def run(device: str) -> list[Any]:
        made = loader(device=device, group=GROUP) if device == "cuda" else loader()
        got = []
        for b, _ in zip(made, range(batches), strict=False):
            t = next(iter(b.data["x"].values()))
            got.append(t if device == "cuda" else torch.from_numpy(t).cuda())
        torch.cuda.synchronize()
        return got

    host_s, host = best(lambda: run("cpu"), repeat)
    device_s, dev = best(lambda: run("cuda"), repeat)
    for h, d in zip(host, dev, strict=True):
        assert torch.equal(h, d), "device batches differ from the host loader's"
    return {"host_s": host_s, "device_s": device_s, "batches": len(host)}


def cli_run(plan: Path, params: dict[str, str], device: str, repeat: int) -> float | None:
    """The least wall time of `repeat` whole `chunkfuse run` processes (after one warm-up)."""
    binary = os.environ.get("CHUNKFUSE_BIN") or str(ROOT / "target" / "release" / "chunkfuse")
    if not os.path.exists(binary):
        return None
    args = [binary, "run", str(plan), "--device", device, "--fresh", "--json"]
    for k, v in params.items():
        args += ["--param", f"{k}={v}"]

    def once() -> None:
        subprocess.run(args, capture_output=True, text=True, check=True)

    return best(once, repeat)[0]


#: What a fresh process spends opening the device, step by step (argv: array, plan, target).
OPENING = """
import json, sys, time
t = [time.perf_counter()]
import chunkfuse
t.append(time.perf_counter())
chunkfuse.device_info("cuda")
t.append(time.perf_counter())
chunkfuse.read(sys.argv[1], (slice(0, 1),), device="cuda")
t.append(time.perf_counter())
params = {"source": sys.argv[1], "target": sys.argv[3]}
for _ in range(2):
    chunkfuse.run_plan(json.loads(sys.argv[2]), params, device="cuda", resume=False)
    t.append(time.perf_counter())
steps = ["import", "open the device", "first read (nvCOMP loaded)", "first sum", "second sum"]
print(json.dumps({k: b - a for k, a, b in zip(steps, t, t[1:])}))
"""


def measure_opening(url: str, tmp: Path) -> dict[str, float]:
    """Seconds a fresh process spends on each step of its first device work."""
    plan = (ROOT / "plans" / "era5-sum.json").read_text()
    args = [sys.executable, "-c", OPENING, url, plan, str(tmp / "opening-sum.zarr")]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_stages(
    url: str, tmp: Path, repeat: int, plans: tuple[str, ...] = ("era5-sum", "era5-anomaly")
) -> dict[str, Any]:
    """`plans` on all CPU cores and on the GPU; outputs compared."""
    import chunkfuse

    out: dict[str, Any] = {}
    for name in plans:
        path = ROOT / "plans" / f"{name}.json"
        plan = json.loads(path.read_text())
        r: dict[str, Any] = {}
        values = {}
        for device in ("cpu", "cuda"):
            params = {"source": url, "target": str(tmp / f"{name}-{device}.zarr")}
            r[f"{device}_s"], summary = best(
                lambda pl=plan, p=params, d=device: chunkfuse.run_plan(
                    pl, p, device=d, resume=False
                ),
                repeat,
            )
            r[f"{device}_stages"] = [
                (s["label"], s["device"], s["device_note"], s["seconds"]) for s in summary["stages"]
            ]
            r[f"{device}_process_s"] = cli_run(path, params, device, repeat)
            values[device] = chunkfuse.read(params["target"])
        np.testing.assert_allclose(values["cuda"], values["cpu"], rtol=1e-5, atol=1e-4)
        out[name] = r
        print(name, json.dumps(r), flush=True)
    return out


def report(
    results: dict[str, Any],
    machine: str,
    args: argparse.Namespace,
    big: dict[str, Any] | None = None,
    opening: dict[str, float] | None = None,
) -> str:
    lines = [
        f"## Device reads and stages, {dt.date.today().isoformat()}, {machine}",
        "",
        f"`python bench/gpu.py --time {args.time} --repeat {args.repeat} --batches "
        f"{args.batches}`: best of {args.repeat}, one process, page cache warm. Arrays of "
        f"({args.time}, {args.lat}, {args.lon}) float32, one zstd-3 chunk per time step.",
        "",
        "| array | ratio | CPU decode floor | nvCOMP decode | whole array to host | "
        "to GPU: host read + .cuda() | to GPU: device read | speed-up | batches/s CPU + "
        f".cuda() | batches/s device | speed-up | batches/s, {GROUP} per read: CPU + .cuda() | "
        "device | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in results.items():
        if "ratio" not in r:
            continue
        gb = r["decoded_gb"]
        floor = f"{r['cpu_decode_gbs']:.1f} GB/s" if "cpu_decode_gbs" in r else "n/a"
        nv = f"{r['nvcomp_decode_gbs']:.1f} GB/s" if "nvcomp_decode_gbs" in r else "n/a"
        n = r["batch_samples"] / 32 if args.per_batch == 32 else r["batch_samples"] / args.per_batch
        lines.append(
            f"| {kind} | {r['ratio']:.2f} | {floor} | {nv} | {r['host_read_s']:.3f} s "
            f"({gb / r['host_read_s']:.1f} GB/s) | {r['host_read_to_gpu_s']:.3f} s | "
            f"{r['device_read_s']:.3f} s ({gb / r['device_read_s']:.1f} GB/s) | "
            f"{r['host_read_to_gpu_s'] / r['device_read_s']:.2f}x | "
            f"{n / r['batches_cpu_s']:.1f} | {n / r['batches_gpu_s']:.1f} | "
            f"{r['batches_cpu_s'] / r['batches_gpu_s']:.2f}x | "
            f"{n / r['batches_cpu_grouped_s']:.1f} | {n / r['batches_grouped_s']:.1f} | "
            f"{min(r['batches_cpu_s'], r['batches_cpu_grouped_s']) / r['batches_grouped_s']:.2f}x |"
        )
    lines.append("")
    for kind, r in results.items():
        s = r["device_stats"]
        lines.append(
            f"- {kind}, device read of the whole array: {s['chunks']} chunks, "
            f"{s['device_decoded']} decoded by nvCOMP; waiting for storage "
            f"{s['wait_seconds']:.3f} s, device batches {s['device_seconds']:.3f} s (copies "
            f"{s['upload_seconds']:.3f} s, nvCOMP {s['decode_seconds']:.3f} s, placing "
            f"{s['place_seconds']:.3f} s), of {s['seconds']:.3f} s. nvCOMP by frames per "
            "call: "
            + ", ".join(f"{n}: {g:.1f} GB/s" for n, g in r["nvcomp_gbs_by_frames"].items())
            + "."
        )
        if "encode" in r:
            lines.append(encode_line(kind, r["encode"]))
        if "loader" in r:
            lines.append(loader_line(kind, r["loader"]))
    stage_rows = [
        (kind, name, st) for kind, r in results.items() for name, st in r.get("stages", {}).items()
    ] + [(kind, name, st) for kind, r in (big or {}).items() for name, st in r.items()]
    if stage_rows:
        lines += [
            "",
            "Whole stages, CPU engine on all cores against the GPU run (in this process with the "
            "device open; whole `chunkfuse run` processes, counting the device's opening):",
            "",
            "| array | plan | CPU | GPU | speed-up | CPU process | GPU process | speed-up | "
            "GPU run's stages |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for kind, name, st in stage_rows:
            cp, gp = st["cpu_process_s"], st["cuda_process_s"]
            procs = f"{cp:.3f} s | {gp:.3f} s | {cp / gp:.2f}x" if cp and gp else "n/a | n/a | n/a"
            placed = "; ".join(
                f"{label}: {dev} {secs:.3f} s" + (f" ({note})" if note else "")
                for label, dev, note, secs in st["cuda_stages"]
            )
            lines.append(
                f"| {kind} | {name} | {st['cpu_s']:.3f} s | {st['cuda_s']:.3f} s | "
                f"{st['cpu_s'] / st['cuda_s']:.2f}x | {procs} | {placed} |"
            )
    if opening:
        lines += [
            "",
            "A fresh process's first device work (smooth array): "
            + ", ".join(f"{k} {v:.3f} s" for k, v in opening.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=int, default=256)
    ap.add_argument("--lat", type=int, default=721)
    ap.add_argument("--lon", type=int, default=1440)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--per-batch", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--stage-time",
        type=int,
        default=0,
        help="also time the sum plan on arrays of this many time steps (0: not)",
    )
    args = ap.parse_args(argv)
    window: tuple[int, ...] = (4, 128, 128)
    if args.quick:
        args.time, args.lat, args.lon, args.repeat, args.batches = 8, 73, 144, 1, 2
        args.per_batch, window = 8, (2, 16, 16)
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 1
    machine = f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    shape = (args.time, args.lat, args.lon)
    results: dict[str, Any] = {}
    opening: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="chunkfuse-gpu-bench-") as tmp:
        for kind in ("smooth", "noisy"):
            url = make(Path(tmp), shape, kind)
            results[kind] = measure(url, shape, args.repeat, args.batches, window, args.per_batch)
            results[kind]["stages"] = measure_stages(url, Path(tmp), args.repeat)
            results[kind]["loader"] = measure_loader(
                url, args.repeat, args.batches, window, args.per_batch
            )
            if kind == "smooth":
                opening = measure_opening(url, Path(tmp))
                print("opening", json.dumps(opening), flush=True)
            shutil.rmtree(url)
        big: dict[str, Any] = {}
        if args.stage_time:
            for kind in ("smooth", "noisy"):
                data = Path(tmp) / "big"
                url = make(data, (args.stage_time, args.lat, args.lon), kind)
                label = f"{kind}, {args.stage_time} steps"
                big[label] = measure_stages(url, data, args.repeat, ("era5-sum",))
                shutil.rmtree(data)
            print(kind, json.dumps(results[kind]), flush=True)
    text = report(results, machine, args, big, opening)
    print(text)
    if args.json:
        figures = {"machine": machine, "results": results, "big": big, "opening": opening}
        args.json.write_text(json.dumps(figures, indent=1))
    out = args.out or (None if args.quick else ROOT / "bench" / "GPU.md")
    if out:
        head = "" if out.exists() else f"# GPU runs\n\n{RUNS_NOTE}\n\n"
        with out.open("a") as f:
            f.write(head + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
