#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one go, on a GPU machine where chunkfuse imports:
#
#     bash scripts/gpu_check.sh [OUT_DIR]
#
# The device tests (CHUNKFUSE_REQUIRE_GPU=1: a GPU that cannot be used fails them instead of
# skipping; no conftest, so zarr-python and Dask need not be installed), then bench/gpu.py
# (its section appended to OUT_DIR/GPU.md, its figures in OUT_DIR/gpu.json; GPU_BENCH_ARGS
# adds arguments). Exits non-zero when either fails.
set -u
out=${1:-.}
nvidia-smi -L
echo "cpu cores: $(nproc)"
# The device loader's tests need xarray and zarr-python (install them from wheels where the
# machine has no network: pip install --no-index --no-deps WHEELS/*.whl).
loader_tests=""
if python3 -c "import xarray, zarr, pandas" 2>/dev/null; then
    loader_tests="tests/test_loader_device.py"
else
    echo "xarray, zarr or pandas missing: tests/test_loader_device.py not run"
fi
# shellcheck disable=SC2086
CHUNKFUSE_REQUIRE_GPU=1 python3 -m pytest -q --noconftest -p no:cacheprovider \
    tests/test_device.py tests/test_device_read.py tests/test_device_reduce.py $loader_tests
tests=$?
# shellcheck disable=SC2086
python3 bench/gpu.py --out "$out/GPU.md" --json "$out/gpu.json" ${GPU_BENCH_ARGS:-}
bench=$?
echo "tests exit $tests, bench exit $bench"
exit $((tests || bench))
