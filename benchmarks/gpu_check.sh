#!/usr/bin/env bash
# GPU check (issue 18): runs the experiments as users do (`anatomy-tui run ...`, each its own process,
# memory plan and model load included) and prints one `PASS|FAIL <figure>: <value> (<bound>)` line per
# figure, `INFO` lines for the card, `SKIP` for what the device cannot give, and a `SUMMARY` line.
# Exit code 1 when a figure failed. Under 10 minutes on one card with the embedded model.
#   benchmarks/gpu_check.sh [--device cuda:0] [--quick] [--model smollm2-135m|FOLDER] [--timeout 600]
# Dry run without a GPU (GPU-only figures print SKIP): benchmarks/gpu_check.sh --device cpu --quick
# The figures and their bounds: benchmarks/gpu_check.py; how runs are measured: benchmarks/gpu_probe.py;
# its last entry, the streamed map of a model twice a budget (issue 42): benchmarks/streamed_gpu.py.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, not an installed copy
# verdict lines only: no progress bars (tqdm's, the hub's), no library warnings or logs between them
export TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error PYTHONWARNINGS=ignore
exec python3 "$here/benchmarks/gpu_check.py" "$@"
