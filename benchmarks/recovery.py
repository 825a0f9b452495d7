"""Recovery speed (A5): seconds per fine-tuning step, straightforward against prefix-cached.

The straightforward version runs every layer for each training batch and each evaluation; the
cached one starts both at the noised layer from cached inputs. Both runs use the same seeds, so
they must give the same losses and perplexities (checked). Steps after the first are timed, when
the training pool (one batch here) is already cached, as it is for most of a 200-step run.

    python benchmarks/recovery.py [--layers 3,15,27] [--steps 3] [--batch-size 2] [--eval-set paper]
"""

from __future__ import annotations

import argparse
import math

from engine.core.events import Result
from engine.experiments.recovery.run import run_recovery
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoverySettings
from engine.models.loading import load_model


def timed_run(loaded, layer: int, args: argparse.Namespace, prefix_cache: bool) -> tuple[float, list, list]:
    """Seconds per step after the first, train losses and eval perplexities of one run."""
    settings = RecoverySettings(
        layers=(layer,), steps=args.steps, batch_size=args.batch_size, block_size=args.block_size,
        train_blocks=args.batch_size, eval_set=args.eval_set, prefix_cache=prefix_cache,
    )
    points, losses = [], []
    for event in run_recovery(loaded.model, loaded.tokenizer, settings, model_name=loaded.name):
        if isinstance(event, RecoveryPoint) and event.step > 0:
            points.append(event)
        if isinstance(event, Result):
            losses = [loss for _, loss in event.data["layers"][0]["train_loss"]]
    seconds = (points[-1].t - points[0].t) / (len(points) - 1)
    return seconds, losses, [p.eval_ppl for p in points]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="3,15,27", help="a shallow, a middle and a deep layer")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is not timed)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--eval-set", default="paper", choices=["full", "paper"])
    args = parser.parse_args()
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    print(f"{loaded.describe()}; {args.steps} steps, batch {args.batch_size}x{args.block_size} tokens, "
          f"evaluation every step on the '{args.eval_set}' texts")
    ratios = []
    for layer in (int(x) for x in args.layers.split(",")):
        plain, plain_losses, plain_ppl = timed_run(loaded, layer, args, prefix_cache=False)
        cached, cached_losses, cached_ppl = timed_run(loaded, layer, args, prefix_cache=True)
        diff = max(max_rel_diff(cached_losses, plain_losses), max_rel_diff(cached_ppl, plain_ppl))
        same = "yes" if diff < 1e-3 and all(map(math.isfinite, cached_losses)) else "NO"
        ratios.append(plain / cached)
        print(f"layer {layer:2d}: straightforward {plain:7.2f} s/step, prefix cache {cached:7.2f} s/step, "
              f"x{plain / cached:.2f}; same losses and PPL: {same} (max rel diff {diff:.1e})")
    print(f"ratio recovery_prefix_cache: {sum(ratios) / len(ratios):.2f}")


if __name__ == "__main__":
    main()
