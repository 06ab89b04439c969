"""Training data from Zarr: the order anchors are visited in (`order`). See docs/loader.md."""

from chunkfuse.loader.order import Batches, EpochOrder, Permutation, Shuffle, Split

__all__ = ["Batches", "EpochOrder", "Permutation", "Shuffle", "Split"]
