from collections.abc import Callable

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
) -> str: ...
