"""lm-eval's simple_evaluate on a tiny model and the local everyday_sense task, with and without its
report of the machine (torch's collect_env: subprocesses that take seconds and no part in the
scores), as `run evaluate` and `prune --evaluate-tasks` call it once per model or cut.

    python benchmarks/lm_eval_calls.py [--limit 12] [--repeats 3]

The scores are checked equal; the last line is `ratio lm_eval_without_machine_report: X`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from lm_eval_tasks import write_task
    from tiny_models import byte_tokenizer, tiny_model

    from engine.evaluation.accuracy import without_machine_report

    torch.set_num_threads(1)
    folder = write_task(Path(tempfile.mkdtemp()) / "tasks")
    lm = HFLM(pretrained=tiny_model("llama"), tokenizer=byte_tokenizer(), batch_size=1)
    manager = TaskManager(include_path=str(folder), include_defaults=False)

    def once() -> tuple[float, dict]:
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(model=lm, tasks=["everyday_sense"], task_manager=manager, limit=args.limit)
        return time.perf_counter() - start, out["results"]

    plain, lean = [], []
    for _ in range(args.repeats):
        seconds, reference = once()
        plain.append(seconds)
        with without_machine_report():
            seconds, results = once()
        lean.append(seconds)
        assert results == reference, "the scores changed"
    a, b = statistics.median(plain), statistics.median(lean)
    print(f"simple_evaluate, {args.limit} items x 4 choices, tiny llama, 1 thread: "
          f"with the machine report {a:.2f} s, without {b:.2f} s (medians of {args.repeats})")
    print(f"ratio lm_eval_without_machine_report: {a / b:.2f}")


if __name__ == "__main__":
    main()
