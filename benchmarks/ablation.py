"""Ablation map on the embedded model: a full forward per layer against the prefix cache.

    python benchmarks/ablation.py [--eval-set full|paper]

Also times the cold load of the default model (GGUF dequantized into an empty cache) and the
cached load (safetensors). The last line is `ratio ablation_prefix_cache: X`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed_load(cache: str) -> tuple[float, object]:
    from engine.models.loading import load_model

    os.environ["ANATOMY_TUI_CACHE"] = cache
    start = time.perf_counter()
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    return time.perf_counter() - start, loaded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"])
    args = parser.parse_args()

    import torch
    import transformers  # noqa: F401  (import time is not load time)

    from engine.core.events import Result
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    with tempfile.TemporaryDirectory() as cache:
        cold, _ = timed_load(cache)
        cached, loaded = timed_load(cache)
    print(f"load cold (GGUF dequantize + cache write): {cold:.1f} s")
    print(f"load cached (safetensors): {cached:.2f} s")
    print(f"torch threads: {torch.get_num_threads()}")

    def run(prefix_cache: bool) -> tuple[float, dict]:
        settings = AblationSettings(eval_set=args.eval_set, prefix_cache=prefix_cache)
        start = time.perf_counter()
        events = list(run_ablation(loaded.model, loaded.tokenizer, settings, model_name=loaded.name))
        assert isinstance(events[-1], Result)
        return time.perf_counter() - start, events[-1].data

    plain_s, plain = run(prefix_cache=False)
    cached_s, fast = run(prefix_cache=True)
    worst = max(
        abs(a["ppl"] - b["ppl"]) / b["ppl"] for a, b in zip(fast["layers"], plain["layers"], strict=True)
    )
    assert worst < 1e-5, f"prefix cache changed a perplexity by {worst:.2e} (relative)"
    print(f"eval tokens: {fast['eval_tokens']} ({args.eval_set}); same perplexities (max rel diff {worst:.1e})")
    print(f"straightforward (full forward per layer): {plain_s:.1f} s")
    print(f"prefix cache: {cached_s:.1f} s")
    print(f"ratio ablation_prefix_cache: {plain_s / cached_s:.2f}")


if __name__ == "__main__":
    main()
