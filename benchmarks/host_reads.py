"""Host reads of prune's healing and of recovery on two GPUs, against the straightforward way (issue 31).

    python3 benchmarks/host_reads.py

The two-device harness (tests/virtual_devices.py) runs each experiment on the tiny llama split over a
virtual cuda:0 and cuda:1 and counts every read that waits for a GPU and every upload. Each run happens
twice: the straightforward way (training forwards without an attention mask, so transformers reads the
position ids back at every forward to look for packed sequences; the trained layers' snapshots and the
kept healed weights copied to the host one parameter at a time; LoRA's adapter saved from the GPUs one
tensor at a time) and as shipped (`blocks_forward`, copies queued with `non_blocking`, `host_copies`).
Both runs must give the same result document; the ratio of their reads is printed. The counts are
tests/test_two_devices.py's budgets (the prune runs there also run float16 and an offloaded embedding).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def straightforward(patch) -> None:
    """The reads as they were: mask-less forwards, a blocking copy per parameter and per adapter tensor."""
    import engine.experiments.prune.healing as prune
    import engine.experiments.recovery.sweep as recovery
    from engine.models.anatomy import LayerStack

    for module in (prune, recovery):
        patch.setattr(module, "blocks_forward", lambda model, ids: model(input_ids=ids, use_cache=False))
    copies = LayerStack.copies
    patch.setattr(LayerStack, "copies", lambda self, indices, host=False, queued=False: copies(self, indices, host))
    patch.setattr(prune, "host_copies", lambda tensors: {name: t.detach().to("cpu", copy=True)
                                                         for name, t in tensors.items()})


def counted(run, plain: bool):
    """run(model) on the tiny llama split over two virtual GPUs: its result less its clocks, the mode."""
    import pytest
    import torch
    from test_two_devices import SPLIT, without_times
    from tiny_models import tiny_model
    from virtual_devices import place, two_gpus

    with pytest.MonkeyPatch.context() as patch:
        if plain:
            straightforward(patch)
        torch.set_num_threads(1)
        with two_gpus(patch) as mode:
            doc = run(place(tiny_model("llama", seed=3), SPLIT))
    return without_times(doc), mode


def main() -> None:
    from test_two_devices import recovery_settings, result
    from tiny_models import EVAL, TRAIN, byte_tokenizer

    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.experiments.recovery.run import run_recovery
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    tokenizer = byte_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        evaluation, train = Path(tmp, "eval.txt"), Path(tmp, "train.txt")
        evaluation.write_text("\n".join(EVAL), encoding="utf-8")
        train.write_text(TRAIN, encoding="utf-8")
        exports = iter(range(100))

        def prune(heal: str):
            def run(model):
                settings = PruneSettings(eval_file=str(evaluation), train_file=str(train), remove=(1, 2),
                                         heal_steps=2, heal=heal, export=str(Path(tmp, f"export{next(exports)}")),
                                         export_count=1)
                loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
                doc = result(experiment("prune").run(settings, RunContext(model=loaded)))
                doc["exported"] = doc["settings"]["export"] = None
                return doc
            return run

        settings = recovery_settings((str(evaluation), str(train)))
        runs = {"prune, adjacent healing, export": prune("adjacent"), "prune, LoRA healing, export": prune("lora"),
                "recovery, 2 layers x 3 steps": lambda model: result(run_recovery(model, tokenizer, settings))}
        print(f"{'run (tiny llama on two virtual GPUs)':40} {'reads before':>12} {'reads now':>10} {'ratio':>7} "
              f"{'uploads before':>15} {'uploads now':>12}")
        for name, run in runs.items():
            (before, old), (now, new) = counted(run, plain=True), counted(run, plain=False)
            assert now == before, f"{name}: the result changed"
            print(f"{name:40} {old.reads:>12} {new.reads:>10} {old.reads / new.reads:>6.1f}x "
                  f"{old.uploads:>15} {new.uploads:>12}")


if __name__ == "__main__":
    main()
