#!/usr/bin/env bash
# Run here (in the repo root, venv active) before benchmarks/device_check.sh's call: copy the
# pure-Python packages the device machine's CUDA image lacks (transformer-lens and the
# imports it needs; the image has torch, transformers, numpy, pandas, pyarrow, ...) into
# .device_deps, which .gitignore lists and the call carries.
set -euo pipefail
SITE=$(python -c "import transformer_lens, os; print(os.path.dirname(os.path.dirname(transformer_lens.__file__)))")
rm -rf .device_deps && mkdir .device_deps
for pkg in transformer_lens datasets dill multiprocess fancy_einsum beartype typeguard; do
  cp -r "$SITE/$pkg" .device_deps/
  cp -r "$SITE"/"$pkg"-*.dist-info .device_deps/ 2>/dev/null || cp -r "$SITE"/"${pkg//_/-}"-*.dist-info .device_deps/ 2>/dev/null || true
done
find .device_deps -name __pycache__ -prune -exec rm -rf {} +
# .gitignore lists /.device_deps/
du -sh .device_deps
