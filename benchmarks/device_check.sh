#!/usr/bin/env bash
# Issues 26 and 38's GPU checks in one call on the device machine (its CUDA image has torch, not
# transformer-lens, wandb or tensorboard): install sinkscope from this tree and the packages the
# image lacks from .device_deps (made here first by benchmarks/device_deps.sh), then run
# device_check.py. The call: command "bash benchmarks/device_check.sh", carry [".device_deps"],
# timeout_s 540: with the machine's start it fits a 15-minute lease (the stages share BUDGET_S,
# 480 s by default). Figures land in $OUT/device_check.json, rewritten after each stage (and one
# log per stage).
set -uo pipefail
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/.device_deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
LOGS=${OUT:-device-check-out}
mkdir -p "$LOGS"
if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$LOGS/pip-install.log" 2>&1; then
  tail -5 "$LOGS/pip-install.log"; echo "device_check: installing sinkscope failed ($LOGS/pip-install.log)" >&2; exit 2
fi
BIN=$(dirname "$(command -v "$PY")")
export PATH="$BIN:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, sinkscope.toy.train; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$PY" benchmarks/device_check.py --out "${OUT:-device-check-out}" --budget-s "${BUDGET_S:-480}" "$@"
