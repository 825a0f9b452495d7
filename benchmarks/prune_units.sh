#!/usr/bin/env bash
# Issue 28's pruning table on the embedded model (SmolLM2-135M, 30 layers), CPU float32: cuts removing
# 2, 4 and 6 layers' worth of parameters by whole layers (angular), by attention/MLP blocks (angular,
# --unit block), by a run of layers replaced by a linear map (ReplaceMe) and by the last layers healed
# (--heal last); perplexity on the built-in `paper` sentences, accuracy on the local choice task
# everyday_sense and exact match on the built-in generative task exact_facts (20 items each).
# Usage: benchmarks/prune_units.sh [OUT] [PART...]   PART: layers, blocks, last (default all three);
# then `python3 benchmarks/prune_table.py OUT` prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/prune_units}
shift || true
parts=${*:-layers blocks last}
mkdir -p "$out/tasks"
python3 - "$out/tasks" <<'PY'
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from lm_eval_tasks import write_task
write_task(Path(sys.argv[1]))
PY
common=(--eval-set paper --remove 2,4,6 --evaluate-tasks everyday_sense --include-path "$out/tasks" --limit 20
        --gen-tokens 0 --device cpu --dtype float32)
for part in $parts; do
  case $part in
    layers) python3 -m cli.main run prune "${common[@]}" --method angular --replace linear --train-blocks 64 \
              --json "$out/layers.json" ;;
    blocks) python3 -m cli.main run prune "${common[@]}" --method angular --unit block --json "$out/blocks.json" ;;
    last)   python3 -m cli.main run prune "${common[@]}" --method last --heal last --heal-steps 40 \
              --json "$out/last.json" ;;
  esac
done
