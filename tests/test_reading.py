"""chunkfuse.read / read_windows / ArrayReader against zarr-python reading the same arrays:
whole arrays, basic selections, many windows, sharded arrays (small windows read inner
chunks alone), fill values, Zarr v2, and bad requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
import zarr.codecs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def make(path: Path, data: np.ndarray, **kwargs: Any) -> zarr.Array:
    return zarr.create_array(str(path), data=data, **kwargs)


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("reading")
    rng = np.random.default_rng(1)
    data = rng.standard_normal((9, 37, 50)).astype("float32")
    ints = rng.integers(-1000, 1000, (9, 37, 50)).astype("int16")
    out = {}
    out["plain"] = (root / "plain.zarr", data)
    make(root / "plain.zarr", data, chunks=(2, 10, 16))
    out["sharded"] = (root / "sharded.zarr", data)
    make(root / "sharded.zarr", data, chunks=(1, 5, 5), shards=(3, 20, 25))
    out["sharded-start"] = (root / "sharded-start.zarr", ints)
    z = zarr.create_array(
        str(root / "sharded-start.zarr"),
        shape=ints.shape,
        dtype=ints.dtype,
        chunks=(1, 5, 5),
        shards=(3, 20, 25),
        serializer=zarr.codecs.ShardingCodec(
            chunk_shape=(1, 5, 5),
            codecs=[zarr.codecs.BytesCodec(), zarr.codecs.GzipCodec(level=1)],
            index_location="start",
        ),
        fill_value=7,
    )
    z[:] = ints
    # Mostly fill: inner chunks and whole shards are missing.
    sparse = np.full((9, 37, 50), 2.5, dtype="float64")
    sparse[4, 3:8, 3:9] = np.arange(30).reshape(5, 6)
    out["sparse"] = (root / "sparse.zarr", sparse)
    make(root / "sparse.zarr", sparse, chunks=(1, 5, 5), shards=(3, 20, 25), fill_value=2.5)
    return out


@pytest.mark.parametrize("name", ["plain", "sharded", "sharded-start", "sparse"])
def test_whole_arrays_and_selections_match_zarr(
    name: str, arrays: dict[str, tuple[Path, np.ndarray]]
) -> None:
    path, data = arrays[name]
    np.testing.assert_array_equal(chunkfuse.read(path), data)
    for sel in [
        (slice(1, 4), slice(2, 9), slice(3, 11)),
        (4,),
        (Ellipsis, -1),
        (slice(None, None, 2), 3, slice(40, 5, -3)),
        (slice(5, 5), slice(None), 0),
    ]:
        got = chunkfuse.read(path, sel)
        np.testing.assert_array_equal(got, data[sel])
        assert got.shape == data[sel].shape


@given(st.data())
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_windows_match_numpy(arrays: dict[str, tuple[Path, np.ndarray]], data: Any) -> None:
    name = data.draw(st.sampled_from(["plain", "sharded", "sharded-start", "sparse"]))
    path, values = arrays[name]
    size = [data.draw(st.integers(1, n)) for n in values.shape]
    n = data.draw(st.integers(1, 6))
    starts = np.array(
        [
            [data.draw(st.integers(0, dim - s)) for dim, s in zip(values.shape, size, strict=True)]
            for _ in range(n)
        ]
    )
    reader = chunkfuse.ArrayReader(str(path))
    got = chunkfuse.read_windows(reader, starts, size, threads=data.draw(st.integers(0, 3)))
    assert got.shape == (n, *size) and got.dtype == values.dtype
    for w, s in zip(got, starts, strict=True):
        sel = tuple(slice(a, a + k) for a, k in zip(s, size, strict=True))
        np.testing.assert_array_equal(w, values[sel])


#: One cache shared by every example of the property test below, so reads find chunks that
#: earlier reads (of this array and others) left there, whole or as a prefix.
SHARED_CACHE = chunkfuse.ChunkCache(64 << 10)


@given(st.data())
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_windows_read_through_a_cache_match_numpy(
    arrays: dict[str, tuple[Path, np.ndarray]], data: Any
) -> None:
    name = data.draw(st.sampled_from(["plain", "sharded", "sharded-start", "sparse"]))
    path, values = arrays[name]
    size = [data.draw(st.integers(1, n)) for n in values.shape]
    starts = np.array(
        [
            [data.draw(st.integers(0, dim - s)) for dim, s in zip(values.shape, size, strict=True)]
            for _ in range(data.draw(st.integers(1, 4)))
        ]
    )
    got = chunkfuse.read_windows(path, starts, size, cache=SHARED_CACHE)
    for w, s in zip(got, starts, strict=True):
        sel = tuple(slice(a, a + k) for a, k in zip(s, size, strict=True))
        np.testing.assert_array_equal(w, values[sel])
    assert SHARED_CACHE.bytes <= SHARED_CACHE.max_bytes


def test_a_cache_counts_hits_and_pickles_empty(
    arrays: dict[str, tuple[Path, np.ndarray]],
) -> None:
    import pickle

    path, values = arrays["plain"]
    cache = chunkfuse.ChunkCache(1 << 20)
    reader = chunkfuse.ArrayReader(str(path))
    for _ in range(2):
        got = chunkfuse.read_windows(reader, [[0, 0, 0]], (2, 10, 16), cache=cache)
        np.testing.assert_array_equal(got[0], values[:2, :10, :16])
    assert (cache.hits, cache.misses, cache.entries) == (1, 1, 1)
    assert cache.bytes >= 2 * 10 * 16 * 4
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.max_bytes, copy.bytes, copy.hits) == (1 << 20, 0, 0)
    cache.clear()
    assert (cache.hits, cache.misses, cache.entries, cache.bytes) == (0, 0, 0, 0)
    assert "max_bytes=1048576" in repr(cache)
    with pytest.raises(ValueError, match="ChunkCache: max_bytes must be a byte count .* got -1"):
        chunkfuse.ChunkCache(-1)


def test_zarr_v2_reads(tmp_path: Path) -> None:
    data = np.arange(5 * 6 * 7, dtype="float64").reshape(5, 6, 7)
    zarr.create_array(str(tmp_path / "v2.zarr"), data=data, chunks=(2, 3, 4), zarr_format=2)
    np.testing.assert_array_equal(chunkfuse.read(tmp_path / "v2.zarr"), data)


def test_reader_describes_the_array(arrays: dict[str, tuple[Path, np.ndarray]]) -> None:
    path, data = arrays["sharded-start"]
    r = chunkfuse.ArrayReader(str(path))
    assert r.dtype == "int16" and tuple(r.shape) == data.shape and str(path) in r.url


def test_bad_requests_say_what_is_wrong(
    arrays: dict[str, tuple[Path, np.ndarray]], tmp_path: Path
) -> None:
    path, _ = arrays["plain"]
    with pytest.raises(ValueError, match="window 1.*axis 2: .* go past the array"):
        chunkfuse.read_windows(path, [[0, 0, 0], [0, 0, 45]], (1, 1, 10))
    with pytest.raises(ValueError, match="3 axes"):
        chunkfuse.read_windows(path, [[0, 0]], (1, 1))
    with pytest.raises(ValueError, match="non-negative"):
        chunkfuse.read_windows(path, [[0, -1, 0]], (1, 1, 1))
    with pytest.raises(IndexError, match="out of bounds"):
        chunkfuse.read(path, (9,))
    with pytest.raises(IndexError, match="basic selections"):
        chunkfuse.read(path, ([1, 2],))
    with pytest.raises(OSError, match="nothing.zarr"):
        chunkfuse.read(tmp_path / "nothing.zarr")
    bad = tmp_path / "bad.zarr"
    zarr.create_array(str(bad), data=np.ones((4, 4), "float32"), chunks=(2, 2))
    (bad / "c" / "1" / "1").write_bytes(b"not zstd")
    with pytest.raises(RuntimeError, match=r"c/1/1"):
        chunkfuse.read(bad)


def test_corrupt_shard_index_is_named(tmp_path: Path) -> None:
    data = np.ones((4, 8), "float32")
    zarr.create_array(str(tmp_path / "s.zarr"), data=data, chunks=(2, 2), shards=(4, 8))
    shard = tmp_path / "s.zarr" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF  # inside the index: the crc32c no longer matches
    shard.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"c/0/0.*shard index checksum"):
        chunkfuse.read_windows(tmp_path / "s.zarr", [[0, 0]], (1, 1))


def test_reads_into_a_reused_out_array(arrays: dict[str, tuple[Path, np.ndarray]]) -> None:
    path, data = arrays["sharded"]
    out = np.full(data.shape, -1, dtype=data.dtype)
    assert chunkfuse.read(path, out=out) is out
    np.testing.assert_array_equal(out, data)
    box = np.empty((2, 5, 6), dtype=data.dtype)
    assert chunkfuse.read(path, (slice(1, 3), slice(4, 9), slice(0, 6)), out=box) is box
    np.testing.assert_array_equal(box, data[1:3, 4:9, 0:6])
    crops = np.empty((2, 3, 4, 5), dtype=data.dtype)
    got = chunkfuse.read_windows(path, [[0, 0, 0], [5, 30, 40]], (3, 4, 5), out=crops)
    assert got.base is crops or got is crops
    np.testing.assert_array_equal(crops[1], data[5:8, 30:34, 40:45])
    with pytest.raises(ValueError, match="float32"):
        chunkfuse.read(path, out=np.empty(data.shape, "float64"))
    with pytest.raises(ValueError, match="elements"):
        chunkfuse.read(path, out=np.empty(3, data.dtype))
    with pytest.raises(ValueError, match="steps"):
        chunkfuse.read(path, (slice(None, None, 2),), out=np.empty(5, data.dtype))
