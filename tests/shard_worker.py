"""A sharded ablation of the tiny llama, run as torchrun's workers by tests/test_distributed.py.

Usage: shard_worker.py OUT.json [die]. Rank 0 writes the merged result and the kinds of the
events it saw to OUT.json; with `die`, rank 1 kills itself halfway through its share."""

from __future__ import annotations

import json
import os
import signal
import sys

from tiny_models import byte_tokenizer, tiny_model

from engine.core.events import Progress, Result
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings, LayerAblated
from engine.models.distributed import Workers, world_from_env
from engine.registry import experiment

SETTINGS = AblationSettings(method="mean", eval_set="paper", eval_batch_size=4, bootstrap=50)


def main() -> None:
    out, die = sys.argv[1], sys.argv[2:] == ["die"]
    world = world_from_env()
    assert world is not None, "run me under torch.distributed.run"
    model, tokenizer = tiny_model("llama", seed=3), byte_tokenizer()
    split = experiment("ablation").shard_plan(SETTINGS, 4)

    def run_shard(layers: list[int]):
        for event in run_ablation(model, tokenizer, split.restrict(layers)):
            if die and world.rank == 1 and isinstance(event, LayerAblated):
                os.kill(os.getpid(), signal.SIGKILL)
            yield event

    with Workers(world) as workers:
        events = list(workers.sweep(run_shard, split.items, split.merge))
    if world.is_main:
        result = events[-1]
        assert isinstance(result, Result)  # a sweep ends with its result
        with open(out, "w", encoding="utf-8") as file:
            json.dump({"kinds": [e.kind for e in events], "result": result.data,
                       "last_progress": [[e.done, e.total] for e in events if isinstance(e, Progress)][-1]}, file)


if __name__ == "__main__":
    main()
