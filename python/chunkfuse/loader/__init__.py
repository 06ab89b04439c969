"""Training data from Zarr: windows of several sources around anchors, aligned by coordinate
labels, in an order that is a pure function of (seed, epoch, step). See docs/loader.md."""

from chunkfuse.loader.order import Batches, EpochOrder, Permutation, Shuffle, Split
from chunkfuse.loader.sources import Source, SourceError, Window
from chunkfuse.loader.windows import Anchors, Batch, WindowLoader

__all__ = [
    "Anchors",
    "Batch",
    "Batches",
    "EpochOrder",
    "Permutation",
    "Shuffle",
    "Source",
    "SourceError",
    "Split",
    "Window",
    "WindowLoader",
]
