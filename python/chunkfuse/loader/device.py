"""Where a window loader's batches go: the host, or the GPU as torch CUDA tensors."""

from __future__ import annotations

import chunkfuse._engine as _engine
from chunkfuse.reading import _on_device


def on_gpu(device: str) -> bool:
    """Whether batches go to the GPU: ``cpu`` no; ``cuda`` yes, failing now, naming why,
    without a usable GPU or without PyTorch with CUDA (device batches are torch CUDA
    tensors); ``auto`` when both are there."""
    if not _on_device(device):  # refuses an unknown device; auto without a GPU: no
        return False
    if device.lower() == "auto":
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())
    _engine.device_info("cuda")  # raises, naming why, without a usable GPU
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            "device='cuda' batches are torch CUDA tensors, and PyTorch is not installed"
        ) from e
    if not torch.cuda.is_available():
        raise RuntimeError(
            "device='cuda' batches are torch CUDA tensors, and torch.cuda.is_available() is "
            "False here"
        )
    return True
