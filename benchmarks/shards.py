"""The embedded model's ablation map split over worker processes (engine/models/distributed.py).

    python benchmarks/shards.py [--eval-set full|paper] [--workers 2]

1 worker x 1 thread (a serial run in this process) against N workers x 1 thread started through
torch.distributed.run (gloo on the CPU), the same map checked row by row. Times are from the model
loaded to the merged result; each worker loads the model and builds its own prefix cache, which the
split does not share out. The last line is `ratio ablation_shards_N: X`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def settings(eval_set: str):
    from engine.experiments.ablation.vocabulary import AblationSettings

    return AblationSettings(eval_set=eval_set)


def worker(out: str, eval_set: str) -> None:
    """One of the N workers (under torch.distributed.run); rank 0 writes the merged map and its time."""
    import torch
    import torch.distributed as dist

    from engine.experiments.ablation.rankings import merge_shards
    from engine.experiments.ablation.run import run_ablation
    from engine.models.distributed import Workers, world_from_env
    from engine.models.loading import load_model

    world = world_from_env()
    assert world is not None, "run under torch.distributed.run"
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    chosen = settings(eval_set)
    with Workers(world) as workers:
        torch.set_num_threads(1)
        dist.barrier()
        start = time.perf_counter()
        events = list(workers.sweep(
            lambda layers: run_ablation(loaded.model, loaded.tokenizer, replace(chosen, layers=tuple(layers)),
                                        model_name=loaded.name),
            range(loaded.n_layers), lambda docs: merge_shards(docs, chosen)))
        if world.is_main:
            seconds = time.perf_counter() - start
            Path(out).write_text(json.dumps({"seconds": seconds, "result": events[-1].data}), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.eval_set)
        return

    import torch

    from engine.core.events import Result
    from engine.experiments.ablation.run import run_ablation
    from engine.models.distributed import launch
    from engine.models.loading import load_model

    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    torch.set_num_threads(1)
    start = time.perf_counter()
    events = list(run_ablation(loaded.model, loaded.tokenizer, settings(args.eval_set), model_name=loaded.name))
    serial_s = time.perf_counter() - start
    assert isinstance(events[-1], Result)
    serial = json.loads(json.dumps(events[-1].data))

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "sharded.json"
        started = time.perf_counter()
        code = launch([sys.executable, __file__, "--worker", str(out), "--eval-set", args.eval_set], args.workers)
        launched_s = time.perf_counter() - started
        assert code == 0, "a worker failed"
        sharded = json.loads(out.read_text(encoding="utf-8"))
    rows = zip(sharded["result"]["layers"], serial["layers"], strict=True)
    worst = max(abs(a["ppl"] - b["ppl"]) / b["ppl"] for a, b in rows)
    assert worst < 1e-9, f"the split map differs from the serial one by {worst:.2e} (relative)"
    print(f"eval tokens: {serial['eval_tokens']} ({args.eval_set}); {loaded.n_layers} layers; "
          f"same map (max rel diff {worst:.1e})")
    print(f"1 worker x 1 thread: {serial_s:.1f} s")
    print(f"{args.workers} workers x 1 thread: {sharded['seconds']:.1f} s "
          f"({launched_s:.1f} s with process start and model loads)")
    print(f"ratio ablation_shards_{args.workers}: {serial_s / sharded['seconds']:.2f}")


if __name__ == "__main__":
    main()
