"""chunkfuse as a Cubed executor: `arr.compute(executor=RustExecutor())`."""

from chunkfuse.cubed.executor import ExecutionStats, RustExecutor

__all__ = ["ExecutionStats", "RustExecutor"]
