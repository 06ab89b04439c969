"""The window loader in PyTorch's DataLoader: with 0 or 2 worker processes, under fork, spawn
and forkserver, persistent or not, it yields the batches of one process, in order, over two
epochs, as tensors holding the same values; a run resumed from a saved state mid-epoch with
another number of workers yields the same rest."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chunkfuse.loader import Split, WindowLoader
from test_loader_windows import make_loader, stores  # noqa: F401  (the module's fixture)

torch = pytest.importorskip("torch")
from chunkfuse.loader.torch_data import WindowDataset  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def build(paths: tuple[Path, Path], split: Split) -> WindowLoader:
    return make_loader(paths, split=split)


def dataset(paths: tuple[Path, Path]) -> WindowDataset:
    return WindowDataset(functools.partial(build, paths))


def stream(loader: Any, epochs: int = 1, every_epoch: Any = None) -> list[dict[str, Any]]:
    out = []
    for e in range(epochs):
        if every_epoch is not None:
            every_epoch(e)
        out.extend(loader)
    return out


def assert_same(got: list[dict[str, Any]], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g["epoch"], g["step"]) == (w.epoch, w.step)
        np.testing.assert_array_equal(g["ids"].numpy(), w.ids)
        np.testing.assert_array_equal(g["data"]["era5"]["sp"].numpy(), w.data["era5"]["sp"])
        np.testing.assert_array_equal(g["data"]["coarse"]["tp"].numpy(), w.data["coarse"]["tp"])


@pytest.mark.parametrize(
    "workers,method,persistent",
    [(0, None, False), (2, "fork", True), (2, "spawn", False), (2, "forkserver", True)],
)
def test_dataloader_yields_the_batches_of_one_process(
    stores: tuple[Path, Path],  # noqa: F811
    workers: int,
    method: str | None,
    persistent: bool,
) -> None:
    plain = make_loader(stores)
    want = stream(plain, 2)
    data = dataset(stores)
    loader = DataLoader(
        data,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=method,
        persistent_workers=persistent,
    )
    # Without persistent workers each epoch's workers start from the dataset's state.
    reset = None if persistent or workers == 0 else data.set_epoch
    assert_same(stream(loader, 2, reset), want)


def test_a_run_resumed_mid_epoch_with_other_workers_yields_the_same_rest(
    stores: tuple[Path, Path],  # noqa: F811
) -> None:
    want = stream(make_loader(stores))
    first = DataLoader(dataset(stores), batch_size=None, num_workers=2)
    taken = []
    for sample in first:
        taken.append(sample)
        if len(taken) == 3:
            break
    last = taken[-1]
    state = {"epoch": last["epoch"], "step": last["step"] + 1}
    resumed = dataset(stores)
    resumed.load_state_dict(state)
    rest = list(DataLoader(resumed, batch_size=None, num_workers=3))
    assert_same(taken + rest, want)


def test_batches_are_read_into_the_arrays_allocate_makes(
    stores: tuple[Path, Path],  # noqa: F811
) -> None:
    made: list[np.ndarray] = []

    def allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        made.append(np.empty(shape, dtype=dtype))
        return made[-1]

    got = make_loader(stores, allocate=allocate).batch(0, 1)
    want = make_loader(stores).batch(0, 1)
    arrays = [a for source in got.data.values() for a in source.values()]
    assert len(made) == len(arrays) == 3
    for a in arrays:
        assert any(a is m for m in made)
    for name, variables in want.data.items():
        for var, values in variables.items():
            np.testing.assert_array_equal(got.data[name][var], values)
    with pytest.raises(ValueError, match="writable C-contiguous numpy array"):
        make_loader(stores, allocate=lambda shape, dtype: np.empty(3, dtype)).batch(0, 0)


def test_batch_arrays_go_to_torch_and_dlpack_without_a_copy(
    stores: tuple[Path, Path],  # noqa: F811
) -> None:
    from chunkfuse.loader.torch_data import to_torch

    batch = make_loader(stores).batch(0, 0)
    sp = batch.data["era5"]["sp"]
    assert to_torch(batch)["data"]["era5"]["sp"].data_ptr() == sp.ctypes.data
    # numpy arrays export DLPack: JAX (jax.numpy.from_dlpack) and CuPy take them the same way.
    assert torch.from_dlpack(sp).data_ptr() == sp.ctypes.data


def test_pinned_batches_need_cuda(stores: tuple[Path, Path]) -> None:  # noqa: F811
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs a CUDA device"):
            make_loader(stores, pin_memory=True)
        return
    from chunkfuse.loader.torch_data import to_torch

    batch = make_loader(stores, pin_memory=True).batch(0, 0)
    tensor = to_torch(batch)["data"]["era5"]["sp"]
    assert tensor.is_pinned()
    np.testing.assert_array_equal(
        tensor.numpy(), make_loader(stores).batch(0, 0).data["era5"]["sp"]
    )
