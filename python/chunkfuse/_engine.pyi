__version__: str

def version() -> str: ...
def run_plan(
    plan_json: str,
    params: dict[str, str] = ...,
    max_mem: int | None = ...,
    threads: int = ...,
    work_dir: str | None = ...,
) -> str: ...
