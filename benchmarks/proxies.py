"""Proxies at the price of one pass: `run ablation --proxies-only` against the full map it equals.

    python benchmarks/proxies.py [--model tiny|smollm2-135m] [--part layer|both] [--eval-set paper|full]

Both give every layer's (with --part both, every block's) Block Influence and angular distances
(all tokens, last token); the full map also ablates each unit. Checks that the proxies are equal,
and prints `ratio proxies_only: X` (the full map's seconds over the proxies-only run's) last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load(name: str):
    """(model, tokenizer, label): the tests' tiny Llama (8 layers here), or a model anatomy-tui loads."""
    if name == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        import torch
        from tiny_models import TINY_CONFIGS, byte_tokenizer
        from transformers import AutoModelForCausalLM

        config = TINY_CONFIGS["llama"]()
        config.num_hidden_layers = 8
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval().requires_grad_(False)
        return model, byte_tokenizer(), "tiny llama (8 layers, hidden 32)"
    from engine.models.loading import load_model

    loaded = load_model(name, device="cpu", dtype="float32")
    return loaded.model, loaded.tokenizer, loaded.name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m", help="tiny, or a model name/folder (default: embedded)")
    parser.add_argument("--part", default="both", choices=["layer", "attention", "mlp", "both"])
    parser.add_argument("--eval-set", default="paper", choices=["full", "paper"])
    parser.add_argument("--method", default="skip", choices=["mean", "skip", "zero"])
    args = parser.parse_args()

    import torch

    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    model, tokenizer, label = load(args.model)

    def run(**extra) -> tuple[float, dict]:
        settings = AblationSettings(eval_set=args.eval_set, part=args.part, method=args.method, **extra)
        start = time.perf_counter()
        events = list(run_ablation(model, tokenizer, settings, model_name=label))
        return time.perf_counter() - start, events[-1].data

    run(proxies_only=True)  # warm-up (first-call costs), untimed
    only_s, only = run(proxies_only=True)
    full_s, full = run()
    keys = ("block_influence", "angular_distance", "angular_last_token")
    pairs = list(zip(only["layers"], full["layers"], strict=True))
    pairs += list(zip(only.get("parts", []), full.get("parts", []), strict=True))
    worst = max(abs(a[k] - b[k]) for a, b in pairs for k in keys)
    assert worst == 0.0, f"proxies differ by {worst:.2e}"
    units = len(full["layers"]) + len(full.get("parts", []))
    print(f"model: {label}; torch threads {torch.get_num_threads()}; eval tokens {full['eval_tokens']} "
          f"({args.eval_set}); --part {args.part}: {len(pairs)} proxy rows, {units} ablated units ({args.method})")
    print("same proxies (max abs diff 0.0)")
    print(f"full map (first pass + one evaluation per unit): {full_s:.2f} s")
    print(f"--proxies-only (one pass): {only_s:.2f} s")
    print(f"ratio proxies_only: {full_s / only_s:.1f}")


if __name__ == "__main__":
    main()
