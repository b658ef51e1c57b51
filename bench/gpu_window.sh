#!/usr/bin/env bash
# The one command of a lent GPU window (#36; docs/performance.md, "The prepared suite for the next GPU window"):
# the device tool's `run` with `.whl` carried (made here by `make gpu-wheels`) and a timeout of 600 s:
#
#     bash bench/gpu_window.sh            (BUDGET=500 PARTS=lora-8b,long-8b to choose)
#
# It installs the carried wheels beside the machine's own torch (no package index there), runs the GPU suite with
# its results JSON written into $OUT after each part (a cut run keeps what it measured), and copies nothing else.
# The suite's budget, 500 s, leaves the install and the command's 600 s limit their share.
set -u
cd "$(dirname "$0")/.."
[ -d .whl ] || { echo "no .whl folder: run 'make gpu-wheels' here and carry .whl"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 3
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_HOME=/tmp/ftune-hf FTUNE_BENCH_WHEELS="$PWD/.whl"
OUT="${OUT:-$PWD/bench/results}"
mkdir -p "$OUT"
python3 -c "import torch, transformers, peft, trl, datasets, pyarrow, ftune; print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', \
'| transformers', transformers.__version__, '| peft', peft.__version__, '| trl', trl.__version__, '| datasets', \
datasets.__version__, '| pyarrow', pyarrow.__version__)" || exit 4
exec python3 bench/gpu_suite.py --budget "${BUDGET:-500}" --out "$OUT/gpu-$(date +%Y-%m-%d).json" \
    ${PARTS:+--parts "$PARTS"}
