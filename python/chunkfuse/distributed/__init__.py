"""Running chunkfuse jobs on the distributed engines users already operate.

A job's stages run one after another; each stage is cut into batches of its tasks, and a
runtime (dask.distributed, Lithops, or threads of this process) runs the batches on its
workers. A batch is a pure function of the plan, the options, the stage and its task range:
it reads its inputs from shared storage, writes whole chunks there, and returns a small
summary. A reduction whose output chunks are split across batches writes partial states,
merged in a fixed order once the stage's batches are done. See docs/distributed.md.
"""

from chunkfuse.distributed.batch import (
    BatchFailed,
    BatchMemoryError,
    BatchOSError,
    BatchSpec,
    BatchValueError,
    run_batch,
)
from chunkfuse.distributed.coordinator import ClusterTooSmall, DistributedRun, run_distributed
from chunkfuse.distributed.runtime import LocalRuntime, Runtime, WorkerShape

__all__ = [
    "BatchFailed",
    "BatchMemoryError",
    "BatchOSError",
    "BatchSpec",
    "BatchValueError",
    "ClusterTooSmall",
    "DistributedRun",
    "LocalRuntime",
    "Runtime",
    "WorkerShape",
    "run_batch",
    "run_distributed",
]


def __getattr__(name: str) -> object:
    # The runtimes import their engines (distributed, lithops) only when asked for.
    if name == "DaskRuntime":
        from chunkfuse.distributed.dask_runtime import DaskRuntime

        return DaskRuntime
    if name == "LithopsRuntime":
        from chunkfuse.distributed.lithops_runtime import LithopsRuntime

        return LithopsRuntime
    raise AttributeError(name)
