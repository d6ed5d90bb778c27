#!/usr/bin/env bash
# GPU path of trainstore (issue 30 item 4) on a GPU machine, in under 5 minutes:
# the GPU tests; benchmarks/disk_pattern.py (trainstore's write pattern without its CPU work
# vs one sequential write + fsync: is time to durable the disk's?); benchmarks/gpu_dtensor.py
# (FSDP2-style DTensor shards staged from the GPU); benchmarks/gpu_bench.py
# (CUDA staging vs DCP async_save vs torch.save, restore to the GPU, a small GPT training
# while saves run, the loader to the GPU). Its default methods are the time-to-durable
# diagnosis: trainstore, trainstore_raw, trainstore_bytegroup, dcp_pinned, torch_save.
#
#   benchmarks/gpu.sh [OUT_DIR]        # default: $OUT, else bench-out/gpu
#
# Uses the machine's own python3 + torch with src/ on PYTHONPATH (no virtualenv). Missing
# hard dependencies come as wheels in .whl/ (ignored by git; ~20 MB), installed offline into a
# temporary folder first. Made on a machine with network access, for the GPU machine's Python:
#   echo /.whl/ >>.git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl obstore==0.12.1 blake3==1.0.11 blosc2==4.15.0 \
#       zstandard==0.25.0 ndindex==1.10.1
# (the H200 image already has numpy, pyarrow, filelock, typer, rich, prometheus-client,
# lazy-loader, msgpack, httpx, pytest, pytest-timeout.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench-out/gpu}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ts-site .whl/*.whl \
        || { echo "offline install of .whl/ failed"; exit 1; }
    export PYTHONPATH=/tmp/ts-site${PYTHONPATH:+:$PYTHONPATH}
fi
# trainstore is not installed there: its entry points (the save backends) come from a
# dist-info folder written beside src/ on the path
SITE=/tmp/ts-meta
mkdir -p "$SITE/trainstore-0+src.dist-info"
printf 'Metadata-Version: 2.1\nName: trainstore\nVersion: 0+src\n' >"$SITE/trainstore-0+src.dist-info/METADATA"
"$PY" - "$SITE/trainstore-0+src.dist-info/entry_points.txt" <<'PY' || exit 1
import sys, tomllib
eps = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]
with open(sys.argv[1], "w") as f:
    for group, items in eps.items():
        f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()))
PY
export PYTHONPATH=$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv \
    | tee "$OUT_DIR/gpu.txt"
"$PY" -c "import torch, trainstore.checkpoint.backend as b; b.backend_class('single')
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
    | tee -a "$OUT_DIR/gpu.txt" || exit 1
echo "== GPU tests"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -p no:randomly tests/checkpoint/test_staging_cuda.py tests/dcp/test_dcp_staging.py \
    tests/data/test_loader_device.py 2>&1 | tee "$OUT_DIR/tests.txt"
echo "== disk: trainstore's write pattern without CPU work vs one sequential write + fsync"
timeout 60 "$PY" benchmarks/disk_pattern.py --gib 1 --rounds 2 --json "$OUT_DIR/disk.json" 2>&1 | tee "$OUT_DIR/disk.txt"
echo "== DTensor shards: trainstore's side-stream copy vs torch's state-dict copy (FSDP2 staging)"
timeout 60 "$PY" benchmarks/gpu_dtensor.py --gib 4 --out "$OUT_DIR/dtensor.json" 2>&1 | tee "$OUT_DIR/dtensor.txt"
echo "== benchmark"
timeout 290 "$PY" benchmarks/gpu_bench.py --out "$OUT_DIR/gpu_bench.json" --budget "${GPU_BENCH_BUDGET:-200}" "${@:2}" \
    2>&1 | tee "$OUT_DIR/bench.txt"
