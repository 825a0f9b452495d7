"""Recovery on the CPU: how soon the first trained point comes, and the whole run, with the default
schedule (--eval-texts auto: a fixed subset at the steps between the first and the last;
--eval-every auto) against evaluating every text at every step (--eval-every 1 --eval-texts all,
the behaviour before issue 29). Both runs draw the same noise and batches, so their step-0 and last
points must agree bit for bit (checked); only the points between differ (subset against all).

    python benchmarks/first_point.py [--model smollm2-135m] [--layer 15] [--steps 4] [--eval-set full]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from engine.core.events import Progress
from engine.experiments.recovery.run import run_recovery
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoverySettings


def load(name: str):
    if name == "tiny":
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_models import byte_tokenizer, tiny_model

        return tiny_model("llama"), byte_tokenizer(), "tiny"
    from engine.models.loading import load_model

    loaded = load_model(name, device="cpu", dtype="float32")
    return loaded.model, loaded.tokenizer, loaded.name


def timed(model, tokenizer, settings: RecoverySettings) -> dict[str, Any]:
    """Seconds to the first event, to step 0's point, to the first trained point, and in all; the points."""
    began = time.perf_counter()
    marks: dict[str, float] = {}
    points = []
    for event in run_recovery(model, tokenizer, settings):
        now = time.perf_counter() - began
        marks.setdefault("first event", now)
        if isinstance(event, Progress) and event.phase == "baseline":
            marks.setdefault("baseline progress", now)
        if isinstance(event, RecoveryPoint):
            points.append(event)
            marks.setdefault("step 0 point" if event.step == 0 else "first trained point", now)
    marks["whole run"] = time.perf_counter() - began
    return {"marks": marks, "points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or tiny")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"])
    args = parser.parse_args()
    model, tokenizer, name = load(args.model)
    base = dict(layers=(args.layer,), steps=args.steps, eval_set=args.eval_set, train_blocks=8)
    old = timed(model, tokenizer, RecoverySettings(**base, eval_every=1, eval_texts=10**6))
    new = timed(model, tokenizer, RecoverySettings(**base))
    old_points, new_points = old["points"], new["points"]
    same_ends = (old_points[0].eval_ppl, old_points[-1].eval_ppl) == (new_points[0].eval_ppl, new_points[-1].eval_ppl)
    print(f"{name} on the CPU, layer {args.layer}, {args.steps} steps, the '{args.eval_set}' texts; "
          f"points at steps {[p.step for p in new_points]} on {[p.texts for p in new_points]} texts (default) "
          f"against {[p.step for p in old_points]} on all; step 0 and the last step the same: "
          f"{'yes' if same_ends else 'NO'}")
    for mark in ("first event", "baseline progress", "step 0 point", "first trained point", "whole run"):
        a, b = old["marks"][mark], new["marks"][mark]
        print(f"{mark:>20}: every text every step {a:8.2f} s, default {b:8.2f} s")
    first = old["marks"]["first trained point"] / new["marks"]["first trained point"]
    whole = old["marks"]["whole run"] / new["marks"]["whole run"]
    print(f"ratio recovery_first_trained_point: {first:.2f}")
    print(f"ratio recovery_whole_run: {whole:.2f}")


if __name__ == "__main__":
    main()
