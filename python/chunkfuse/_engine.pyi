"""Type stubs of the engine's Python module (pyo3); `make lint` checks them against the built
module with mypy's stubtest."""

import os
from collections.abc import Callable, Sequence
from typing import Any, final

__all__ = [
    "version",
    "run_plan",
    "explain_plan",
    "parse_bytes",
    "interrupt_calls",
    "device_info",
    "array_info",
    "run_chunk_function",
    "ArrayReader",
    "ChunkCache",
    "DeviceArray",
    "PooledBuffer",
    "feistel_permute",
    "decode_cf",
    "Job",
    "set_io",
    "io_mode",
    "set_io_timeouts",
    "__version__",
]

__version__: str

def version() -> str: ...
def run_plan(
    plan_json: str,
    params: dict[str, str] = ...,
    max_mem: int | None = ...,
    threads: int = ...,
    work_dir: str | None = ...,
    progress: Callable[[int, int], None] | None = ...,
    resume: bool = ...,
    device: str = ...,
) -> str: ...
def explain_plan(
    plan_json: str,
    params: dict[str, str] = ...,
    max_mem: int | None = ...,
    threads: int = ...,
    device: str = ...,
) -> str: ...
def parse_bytes(text: str) -> int: ...
def interrupt_calls() -> None: ...
def device_info(device: str) -> str: ...
def array_info(url: str) -> dict[str, Any]: ...
def run_chunk_function(
    name: str,
    inputs: Sequence[str],
    target: str,
    out_dtype: str,
    tasks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int]]]]],
    function: Callable[[int, list[bytearray]], bytes],
    max_mem: int | None = ...,
    threads: int = ...,
    work_dir: str | None = ...,
    progress: Callable[[int, int], None] | None = ...,
) -> str: ...

@final
class ArrayReader:
    def __new__(cls, url: str) -> ArrayReader: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def url(self) -> str: ...
    def read_into(
        self,
        starts: list[list[int]],
        shape: list[int],
        out: Any,
        threads: int = ...,
        cache: ChunkCache | None = ...,
    ) -> None: ...
    def read_device(
        self,
        starts: list[list[int]],
        shape: list[int],
        out_shape: list[int],
        threads: int = ...,
    ) -> DeviceArray: ...
    def count_missing(
        self,
        shape: list[int],
        starts: list[list[int]],
        out: Any,
        missing: float | None = ...,
        threads: int = ...,
    ) -> None: ...

@final
class DeviceArray:
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def stats(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = ...,
        max_version: Any = ...,
        dl_device: tuple[int, int] | None = ...,
        copy: bool | None = ...,
    ) -> Any: ...
    def copy_to_host(self, out: Any) -> None: ...
    def numpy(self) -> Any: ...

def feistel_permute(
    size: int, keys: list[int], positions: Any, out: Any, inverse: bool = ...
) -> None: ...

@final
class PooledBuffer:
    def __new__(cls, nbytes: int) -> PooledBuffer: ...
    def __len__(self) -> int: ...

@final
class ChunkCache:
    def __new__(cls, max_bytes: int) -> ChunkCache: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def entries(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    def clear(self) -> None: ...

@final
class Job:
    @staticmethod
    def prepare(
        plan_json: str,
        params: dict[str, str] = ...,
        max_mem: int | None = ...,
        threads: int = ...,
        work_dir: str | os.PathLike[str] | None = ...,
        device: str = ...,
        spread: int = ...,
    ) -> Job: ...
    @staticmethod
    def attach(
        plan_json: str,
        params: dict[str, str] = ...,
        max_mem: int | None = ...,
        threads: int = ...,
        work_dir: str | os.PathLike[str] | None = ...,
        device: str = ...,
        spread: int = ...,
    ) -> Job: ...
    def stage_count(self) -> int: ...
    def cut(self, stage: int, want: int) -> str: ...
    def run_batch(
        self, stage: int, start: int, end: int, cut: list[tuple[int, int]] | None = None
    ) -> str: ...
    def run_merge(self, stage: int, part: int, batches: list[tuple[int, int]]) -> str: ...
    def finish(self) -> str: ...

def set_io(mode: str) -> None: ...
def io_mode() -> str: ...
def set_io_timeouts(
    connect: float | None = ..., request: float | None = ..., retry: float | None = ...
) -> float: ...
def decode_cf(
    raw: Any,
    stored: str,
    out: Any,
    decoded: str,
    scale: float | None = ...,
    offset: float | None = ...,
    fill: float | None = ...,
    threads: int = ...,
) -> None: ...
