#!/usr/bin/env bash
# The session behind this example report: the embedded SmolLM2-135M on a CPU (2 cores: about an hour,
# most of it the recovery), then its report. Run from the repository's root.
set -euo pipefail
A="python3 -m cli.main run"
$A ablation --session example --eval-set paper --bootstrap 200
$A recovery --session example --layers 3 --steps 40 --eval-every 10 --eval-set paper
$A growth --session example --preset tiny
$A prune --session example --method angular --remove 2,4 --eval-set paper
$A dynamics --session example
python3 -m cli.main report example --out docs/example-report
