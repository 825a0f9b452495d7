#!/usr/bin/env bash
# GPU check (issue 11): map, recovery and growth figures on the GPU, then console startup.
# Under 5 minutes on a T4-class card. Usage: benchmarks/gpu_check.sh [--device cuda:0] [--quick]
# Dry run on a machine without a GPU: benchmarks/gpu_check.sh --device cpu --quick
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, not an installed copy
# figures only: no progress bars (tqdm's, the hub's) and no library warnings between the lines
export TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
python3 benchmarks/gpu_check.py "$@"
echo "--- console startup (device auto: the GPU when there is one)"
if [[ " $* " == *" --quick "* ]]; then
  echo "startup: skipped in --quick"
else
  python3 benchmarks/startup.py | tail -n 4
fi
echo "gpu_check total: $(( $(date +%s) - started )) s"
