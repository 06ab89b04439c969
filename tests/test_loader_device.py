"""Window loader batches on the GPU (`device="cuda"`): each source's windows of `group`
batches read onto the device in one read, CF-decoded there, split into torch CUDA tensors;
the same batches in the same order as the host loader's, and a state saved mid-group resumes
with the same next batch. Without a GPU: `device="cuda"` fails when the loader is made,
naming why, and `device="auto"` gives the host loader's batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
from chunkfuse.loader import WindowLoader
from test_loader_windows import make_loader, stores  # noqa: F401 (a fixture)

GPU = chunkfuse.device_info("auto").startswith("cuda")


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


needs_gpu = pytest.mark.skipif(not (GPU and _torch_cuda()), reason="no GPU with torch CUDA")


def _host(a: Any) -> np.ndarray:
    return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)


def _same_batch(got: Any, want: Any) -> None:
    assert (got.epoch, got.step) == (want.epoch, want.step)
    np.testing.assert_array_equal(got.ids, want.ids)
    for dim, labels in want.anchors.items():
        np.testing.assert_array_equal(got.anchors[dim], labels)
    assert set(got.data) == set(want.data)
    for name, arrays in want.data.items():
        for v, a in arrays.items():
            np.testing.assert_array_equal(_host(got.data[name][v]), a, err_msg=f"{name}.{v}")


def test_bad_devices_and_groups_are_refused(stores: tuple[Path, Path]) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        make_loader(stores, device="tpu")
    for group in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="group must be an int of at least 1"):
            make_loader(stores, group=group)


@pytest.mark.skipif(GPU, reason="this machine has a usable GPU")
def test_without_a_gpu_cuda_fails_when_made_and_auto_reads_on_the_host(
    stores: tuple[Path, Path],  # noqa: F811
) -> None:
    with pytest.raises(RuntimeError, match="device 'cuda' is not available: "):
        make_loader(stores, device="cuda")
    auto, host = make_loader(stores, device="auto"), make_loader(stores)
    assert not auto.on_gpu
    for got, want in zip(auto, host, strict=True):
        _same_batch(got, want)
        assert isinstance(got.data["era5"]["t2m"], np.ndarray)


@needs_gpu
def test_device_batches_equal_the_host_loader_s(stores: tuple[Path, Path]) -> None:  # noqa: F811
    import torch

    for group, prefetch in [(3, 2), (1, 0), (64, 4)]:
        device = make_loader(stores, device="cuda", group=group, prefetch=prefetch)
        host = make_loader(stores)
        n = 0
        for got, want in zip(device, host, strict=True):
            t2m = got.data["era5"]["t2m"]
            assert isinstance(t2m, torch.Tensor) and t2m.is_cuda, type(t2m)
            assert t2m.dtype == torch.float32  # packed int16, decoded on the device
            _same_batch(got, want)
            n += 1
        assert n == len(host) and device.state_dict()["epoch"] == 1


@needs_gpu
def test_a_state_saved_mid_group_resumes_with_the_same_next_batch(
    stores: tuple[Path, Path],  # noqa: F811
) -> None:
    first = make_loader(stores, device="cuda", group=3)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    want = next(it)
    resumed: WindowLoader = make_loader(stores, device="cuda", group=3)
    resumed.load_state_dict(state)
    _same_batch(next(iter(resumed)), want)
    from chunkfuse.loader.torch_data import to_torch

    sample = to_torch(want)
    assert sample["data"]["era5"]["t2m"].is_cuda
