"""How soon a cancelled layer map stops: the cancel token is checked before every forward (issue
29), against the check between layers that came before it, whose wait is the rest of the layer in
hand (up to one layer's whole evaluation). A timer thread cancels the map at several moments; the
latency is from `cancel()` to the map's generator raising `Cancelled`. The per-layer time of an
uncancelled sweep gives the old wait: half a layer on average, a whole layer at worst.

    python benchmarks/cancel_latency.py [--model smollm2-135m] [--eval-set full] [--at 4,7.5,11]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from engine.core.events import Cancelled, CancelToken
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings, LayerAblated
from engine.models.loading import load_model


def cancelled_after(model, tokenizer, settings: AblationSettings, delay: float) -> tuple[float, int]:
    """(seconds from cancel() to the stop, layers finished before it)."""
    token = CancelToken()
    asked: list[float] = []

    def cancel() -> None:
        asked.append(time.perf_counter())
        token.cancel()

    timer = threading.Timer(delay, cancel)
    layers = 0
    timer.start()
    try:
        for event in run_ablation(model, tokenizer, settings, cancel=token):
            layers += isinstance(event, LayerAblated)
    except Cancelled:
        return time.perf_counter() - asked[0], layers
    finally:
        timer.cancel()
    raise SystemExit(f"the map ended before the cancel at {delay} s: ask for an earlier --at")


def per_layer_seconds(model, tokenizer, settings: AblationSettings, layers: int) -> list[float]:
    """Each layer's evaluation time in a sweep of the first `layers` layers, uncancelled."""
    marks = [time.perf_counter()]
    sweep = AblationSettings(**{**settings.to_dict(), "layers": tuple(range(layers))})
    for event in run_ablation(model, tokenizer, sweep):
        if isinstance(event, LayerAblated):
            marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks[1:], marks[2:], strict=False)]  # the first includes the baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--eval-set", default="full")
    parser.add_argument("--at", default="4,7.5,11", help="seconds after the start to cancel, one run each")
    args = parser.parse_args()
    loaded = load_model(args.model, device="cpu", dtype="float32")
    settings = AblationSettings(eval_set=args.eval_set, bootstrap=0)
    latencies = []
    for delay in (float(x) for x in args.at.split(",")):
        latency, layers = cancelled_after(loaded.model, loaded.tokenizer, settings, delay)
        latencies.append(latency)
        print(f"cancel at {delay:5.1f} s: stopped {latency * 1000:7.1f} ms later ({layers} layers finished)")
    layer_times = per_layer_seconds(loaded.model, loaded.tokenizer, settings, 6)
    per_layer = statistics.median(layer_times)
    print(f"one layer's evaluation (median of {len(layer_times)}): {per_layer:.2f} s; "
          f"the check between layers waited {per_layer / 2:.2f} s on average, {per_layer:.2f} s at worst")
    print(f"cancel latency, per-forward check: median {statistics.median(latencies) * 1000:.1f} ms, "
          f"worst {max(latencies) * 1000:.1f} ms")
    print(f"ratio cancel_latency: {per_layer / 2 / statistics.median(latencies):.1f}")


if __name__ == "__main__":
    main()
