"""A `WindowLoader` as a PyTorch `IterableDataset`: each DataLoader worker process builds its
own loader for its share of the batches (`Split(worker, workers)`), so `DataLoader(dataset,
batch_size=None, num_workers=K)` yields the batches one process would, in the same order,
under fork, spawn and forkserver, with or without persistent workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from chunkfuse.loader.order import Split
from chunkfuse.loader.windows import Batch, WindowLoader

#: What the dataset yields: {"data": {source: {variable: tensor}}, "anchors": {dim: tensor},
#: "ids": tensor, "epoch": int, "step": int}. Time labels are int64 nanoseconds since 1970.
Sample = dict[str, Any]


def to_torch(batch: Batch) -> Sample:
    """The batch's arrays as tensors sharing their memory (times as int64 nanoseconds); a
    device loader's are torch CUDA tensors already."""
    anchors = {}
    for dim, labels in batch.anchors.items():
        if np.issubdtype(labels.dtype, np.datetime64):
            labels = labels.astype("datetime64[ns]").astype(np.int64)
        anchors[dim] = torch.from_numpy(np.ascontiguousarray(labels))
    return {
        "data": {
            name: {
                v: a if isinstance(a, torch.Tensor) else torch.from_numpy(a)
                for v, a in arrays.items()
            }
            for name, arrays in batch.data.items()
        },
        "anchors": anchors,
        "ids": torch.from_numpy(batch.ids),
        "epoch": batch.epoch,
        "step": batch.step,
    }


class WindowDataset(IterableDataset[Sample]):
    """Batches of the loader `build(split)` makes (call it with the `Split` given; build
    sources inside it, so each worker process opens its own), for `DataLoader(...,
    batch_size=None)`. One iteration is the rest of an epoch from the state: the first
    epoch from `load_state_dict` (or 0), each next iteration the next epoch (persistent
    workers keep counting; otherwise call `set_epoch` before each)."""

    def __init__(
        self, build: Callable[[Split], WindowLoader], *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__()
        self.build = build
        self.rank, self.world = rank, world
        self._state: dict[str, int] = {"epoch": 0, "step": 0}
        self._loader: WindowLoader | None = None
        self._applied: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes build their own loader (its sources, threads and lock stay here).
        state = dict(self.__dict__)
        state["_loader"] = None
        state["_applied"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """Starts the next iteration at the beginning of epoch `epoch`."""
        self.load_state_dict({"epoch": epoch, "step": 0})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Starts the next iteration at (epoch, step): from a `Sample`, the state to resume
        after it is {"epoch": sample["epoch"], "step": sample["step"] + 1}."""
        self._state = {"epoch": int(state["epoch"]), "step": int(state["step"])}

    def state_dict(self) -> dict[str, int]:
        """Where the next iteration starts (see `load_state_dict`)."""
        return dict(self._state)

    def __iter__(self) -> Iterator[Sample]:
        info = get_worker_info()
        split = Split(
            self.rank,
            self.world,
            info.id if info is not None else 0,
            info.num_workers if info is not None else 1,
        )
        if self._loader is None or self._loader.batches.split != split:
            self._loader = self.build(split)
            self._applied = None
        loader = self._loader
        if self._applied != self._state:
            # A state set since the last iteration (in a persistent worker, the one the
            # dataset was sent with); otherwise the loader goes on to its next epoch.
            loader.load_state_dict({**loader.state_dict(), **self._state})
            self._applied = dict(self._state)
        for batch in loader:
            yield to_torch(batch)
