#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine without network or a Rust toolchain,
# from this checkout's build:
#
#     bash scripts/device_bundle.sh OUT_DIR [PYTHON_VERSION]
#
# OUT_DIR/bundle.tgz: the Python extension and the `chunkfuse` CLI (release builds, stripped)
# and nvCOMP's library (libnvcomp.so.6, from the nvidia-libnvcomp-cu13 wheel);
# OUT_DIR/wheels/: xarray, zarr-python, pandas and their pure dependencies for PYTHON_VERSION
# (default 3.12; numpy left out: the GPU machine's own is used). On the GPU machine:
#
#     mkdir -p /tmp/cf && tar xzf OUT_DIR/bundle.tgz -C /tmp/cf
#     cp /tmp/cf/_engine.abi3.so python/chunkfuse/
#     pip install --no-index --no-deps OUT_DIR/wheels/*.whl
#     export PYTHONPATH=$PWD/python:$PWD/tests CHUNKFUSE_NVCOMP=/tmp/cf/libnvcomp.so.6 \
#         CHUNKFUSE_BIN=/tmp/cf/chunkfuse
#     bash scripts/gpu_check.sh OUT
set -euo pipefail
out=${1:?usage: device_bundle.sh OUT_DIR [PYTHON_VERSION]}
py=${2:-3.12}
root=$(cd "$(dirname "$0")/.." && pwd)
pip=("$root/.venv/bin/python" -m pip)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
(cd "$root" && make develop && cargo build --release -p chunkfuse-engine)
cp "$root/python/chunkfuse/_engine.abi3.so" "$root/target/release/chunkfuse" "$work/"
strip --strip-unneeded "$work/_engine.abi3.so" "$work/chunkfuse"
"${pip[@]}" download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version "$py" nvidia-libnvcomp-cu13 -d "$work/nvcomp"
unzip -q -o "$work"/nvcomp/*.whl -d "$work/nvcomp/x"
cp "$(find "$work/nvcomp/x" -name 'libnvcomp.so.6' | head -n 1)" "$work/"
tar czf "$out/bundle.tgz" -C "$work" _engine.abi3.so chunkfuse libnvcomp.so.6
mkdir -p "$out/wheels"
"${pip[@]}" download -q --only-binary=:all: --python-version "$py" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 xarray zarr pandas -d "$out/wheels"
rm -f "$out"/wheels/numpy-*.whl
du -sh "$out/bundle.tgz" "$out/wheels"
