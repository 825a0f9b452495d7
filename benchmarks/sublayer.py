"""The map below the layer (`run ablation --part both`): each block evaluated from its layer's
input through the prefix cache, against the straightforward full forward per block.

    python benchmarks/sublayer.py [--model tiny|smollm2-135m] [--eval-set paper|full] [--method skip]

Both runs map the whole layers and each layer's attention and MLP (3 units a layer); checks the
perplexities are the same, prints what the sublayer map costs beside the layer map, and
`ratio sublayer_prefix_cache: X` (straightforward seconds over prefix-cached ones) last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxies import load  # noqa: E402  (this folder's sibling: the same models)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m", help="tiny, or a model name/folder (default: embedded)")
    parser.add_argument("--eval-set", default="paper", choices=["full", "paper"])
    parser.add_argument("--method", default="skip", choices=["mean", "skip", "zero"])
    args = parser.parse_args()

    import torch

    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.anatomy import LayerStack

    model, tokenizer, label = load(args.model)
    stack = LayerStack(model)
    computed = [0]  # decoder layers actually computed (their MLP runs; a cached or passed-through layer's does not)
    for index in range(len(stack)):
        stack.part_module(index, "mlp").register_forward_pre_hook(lambda *_: computed.__setitem__(0, computed[0] + 1))

    def run(part: str, prefix_cache: bool, **extra) -> tuple[float, dict]:
        settings = AblationSettings(eval_set=args.eval_set, part=part, method=args.method, prefix_cache=prefix_cache,
                                    **extra)
        start = time.perf_counter()
        events = list(run_ablation(model, tokenizer, settings, model_name=label))
        return time.perf_counter() - start, events[-1].data

    run("layer", True, proxies_only=True)  # warm-up (first-call costs), untimed
    counts = []
    computed[0] = 0
    layer_s, _ = run("layer", True)
    counts.append(computed[0])
    plain_s, plain = run("both", False)
    counts.append(computed[0] - sum(counts))
    cached_s, fast = run("both", True)
    counts.append(computed[0] - sum(counts))
    rows = list(zip(fast["layers"] + fast["parts"], plain["layers"] + plain["parts"], strict=True))
    worst = max(abs(a["ppl"] - b["ppl"]) / b["ppl"] for a, b in rows)
    assert worst < 1e-5, f"prefix cache changed a perplexity by {worst:.2e} (relative)"
    print(f"model: {label}; torch threads {torch.get_num_threads()}; eval tokens {fast['eval_tokens']} "
          f"({args.eval_set}); {len(fast['layers'])} layers, {len(fast['parts'])} blocks ({args.method})")
    print(f"same perplexities (max rel diff {worst:.1e})")
    print(f"layer map, prefix cache: {layer_s:.1f} s")
    print(f"--part both, straightforward (a full forward per layer and per block): {plain_s:.1f} s")
    print(f"--part both, prefix cache (each unit from its layer's input): {cached_s:.1f} s "
          f"({cached_s / layer_s:.2f}x the layer map; the blocks alone {(cached_s - layer_s) / layer_s:.2f}x)")
    print(f"decoder-layer forwards (batches x layers computed): layer map {counts[0]}, --part both straightforward "
          f"{counts[1]}, with the prefix cache {counts[2]} ({counts[1] / counts[2]:.2f}x fewer; "
          f"{counts[2] / counts[0]:.2f}x the layer map's)")
    print(f"ratio sublayer_prefix_cache: {plain_s / cached_s:.2f}")


if __name__ == "__main__":
    main()
