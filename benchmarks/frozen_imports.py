"""The CPU of one small run's whole process: torch and transformers imported with the garbage
collector as usual, against imported with it off and then frozen (engine/core/frozen_imports.py),
as every `anatomy-tui run`, shard worker and cluster task now does (issue 31).

    python3 benchmarks/frozen_imports.py [--repeats 3]

Both ways run the same command, a map of the tiny llama (tests/tiny_models.py) on four texts, each
its own process: `python -m cli.main run ...` (frozen), and `main([...])` called from Python, which
imports as usual. They alternate; the median CPU (user + system, the process and its children) of
each and their ratio are printed. On the embedded model the same seconds are saved, on a longer run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
AS_USUAL = "import sys; from cli.main import main; sys.exit(main(sys.argv[1:]))"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(command: list[str], env: dict[str, str]) -> float:
    before = children_cpu()
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return children_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    from tiny_models import EVAL, save_tiny

    with tempfile.TemporaryDirectory() as work:
        model = save_tiny(Path(work) / "tiny")
        texts = Path(work) / "eval.txt"
        texts.write_text("\n".join(EVAL[:4]), encoding="utf-8")
        env = {**os.environ, "ANATOMY_TUI_HOME": str(Path(work) / "sessions"), "PYTHONPATH": str(ROOT)}
        flags = ["run", "ablation", "--model", str(model), "--device", "cpu", "--eval-file", str(texts)]
        usual, frozen = [], []
        for _ in range(repeats):
            usual.append(process_cpu([sys.executable, "-c", AS_USUAL, *flags], env))
            frozen.append(process_cpu([sys.executable, "-m", "cli.main", *flags], env))
    before, after = statistics.median(usual), statistics.median(frozen)
    print(f"a tiny map's process: {before:.2f} CPU-s with the collector as usual, {after:.2f} with the imports "
          f"frozen ({before / after:.2f}x; {before - after:.2f} CPU-s saved a process)")


if __name__ == "__main__":
    main()
