"""Peak memory of `run dynamics` for 1x and 4x the tokens, streamed against the straightforward
version that keeps every layer's hidden states for the whole corpus before reducing them.

Method: each measurement runs in a fresh child process (so no allocator cache carries over). The
child loads the model, runs one 4-token forward (the weights are memory-mapped: this pages them in),
tokenizes the texts and imports scikit-learn (library code is not what is measured), then resets the
kernel's peak-RSS counter (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0) and runs the experiment;
the figure is VmHWM (peak resident memory during the run) minus VmRSS just before it, i.e. what the
experiment itself added.
The children run with MALLOC_MMAP_THRESHOLD_=131072: glibc otherwise raises its mmap threshold
after the first large free, so later freed tensor blocks stay in the heap and RSS creeps up with the
number of batches even though nothing is kept (measured: streamed +97 MB at 1x, +205 MB at 4x with
the default; +63 MB and +66 MB with the fixed threshold). `--default-malloc` shows that behaviour.

The texts are held-out paragraphs joined to at least 256 tokens each (cut at 256), so every batch
is 8 x 256 and the 4x run has exactly four times the batches of the 1x run.

    python benchmarks/dynamics.py [--tokens 2048] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAX_LENGTH = 256
MMAP_THRESHOLD = 128 * 1024  # bytes: tensor-sized blocks are mmapped and go back to the OS when freed


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def straightforward(model, batches, settings) -> int:
    """Keeps h_0..h_L of every kept token for the whole corpus, then reduces and clusters."""
    import numpy as np
    import torch

    from engine.experiments.dynamics.clusters import cluster_profiles
    from engine.experiments.dynamics.profiles import Profiles, keep_mask, profiles_from_states
    from engine.models.anatomy import LayerStack

    stack = LayerStack(model)
    states: list[list[torch.Tensor]] = [[] for _ in range(len(stack) + 1)]
    for batch in batches:
        keep = keep_mask(batch.attention_mask, settings.include_first)

        def observe(_batch, index, layer_input, layer_output, keep=keep):
            states[index].append(layer_input[keep].float().clone())
            if index == len(stack) - 1:
                states[index + 1].append(layer_output[keep].float().clone())

        with torch.no_grad(), stack.capture(observe):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                  logits_to_keep=1)
    whole = [torch.cat(s).unsqueeze(0) for s in states]
    reduced = profiles_from_states(whole, torch.ones(whole[0].shape[:2], dtype=torch.bool))
    arrays = {k: v.numpy() for k, v in reduced.items()}
    n = whole[0].shape[1]
    profiles = Profiles(where=np.zeros((n, 2), dtype=np.int64), **arrays)
    cluster_profiles(profiles.matrix(settings.profile), settings.components, settings.clusters, settings.seed)
    return n


def full_length_texts(tokenizer, paragraphs: list[str], length: int) -> list[str]:
    """Held-out paragraphs joined until each text has at least `length` tokens, so that every
    batch has the same shape (batch size x length) and 4x the tokens is exactly 4x the batches."""
    texts, current = [], []
    for paragraph in paragraphs:
        current.append(paragraph)
        if len(tokenizer(" ".join(current))["input_ids"]) >= length:
            texts.append(" ".join(current))
            current = []
    return texts


def child(mode: str, tokens: int, model_name: str) -> None:
    import torch

    from engine.core.events import Result
    from engine.evaluation.perplexity import tokenize_batches
    from engine.experiments.dynamics.run import dynamics_texts, run_dynamics, select_texts
    from engine.experiments.dynamics.vocabulary import DynamicsSettings
    from engine.models.loading import load_model

    loaded = load_model(model_name, device="cpu", dtype="float32")
    text_file = Path(tempfile.mkdtemp()) / "full_length.txt"
    lines = full_length_texts(loaded.tokenizer, dynamics_texts(DynamicsSettings())[0], MAX_LENGTH)
    text_file.write_text("\n".join(lines), encoding="utf-8")
    settings = DynamicsSettings(text_file=str(text_file), max_tokens=tokens, max_length=MAX_LENGTH)
    texts = select_texts(loaded.tokenizer, dynamics_texts(settings)[0], tokens, settings.max_length)
    if len(texts) * MAX_LENGTH < tokens:
        raise SystemExit(f"the held-out corpus has fewer than {tokens} tokens in full-length texts")
    batches = tokenize_batches(loaded.tokenizer, texts, settings.eval_batch_size, settings.max_length, "cpu")
    with torch.no_grad():  # touch every weight page (the cache is memory-mapped) before measuring
        loaded.model(input_ids=batches[0].input_ids[:1, :4], logits_to_keep=1)
    import sklearn.cluster  # noqa: F401  (loaded before measuring: code is not data)
    import sklearn.decomposition  # noqa: F401
    import sklearn.metrics  # noqa: F401

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    started = time.perf_counter()
    kept = None
    if mode == "streamed":
        for event in run_dynamics(loaded.model, loaded.tokenizer, settings):
            if isinstance(event, Result):
                kept = event.data["tokens"]
    else:
        kept = straightforward(loaded.model, batches, settings)
    peak = _status_kb("VmHWM")
    print(json.dumps({"mode": mode, "tokens": kept, "peak_mb": (peak - before) / 1024,
                      "seconds": time.perf_counter() - started}))


def measure(mode: str, tokens: int, model_name: str, default_malloc: bool) -> dict:
    env = dict(os.environ)
    if not default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--tokens", str(tokens), "--model", model_name],
        check=True, capture_output=True, text=True, env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048,
                        help="the 1x token budget, a multiple of 8 x 256 (4x is four times it)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's dynamic mmap threshold on (counts heap the allocator keeps)")
    parser.add_argument("--child", default=None, choices=["streamed", "straightforward"],
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tokens, args.model)
        return
    results = {}
    for mode in ("streamed", "straightforward"):
        for factor in (1, 4):
            r = measure(mode, args.tokens * factor, args.model, args.default_malloc)
            results[mode, factor] = r
            print(f"{mode:16s} {factor}x: {r['tokens']:6d} tokens  peak +{r['peak_mb']:8.1f} MB  "
                  f"{r['seconds']:6.1f} s", flush=True)
    sf = results["straightforward", 4]["peak_mb"] / results["straightforward", 1]["peak_mb"]
    print(f"straightforward 4x/1x peak ratio: {sf:.2f}")
    ratio = results["streamed", 4]["peak_mb"] / results["streamed", 1]["peak_mb"]
    print(f"ratio dynamics_memory_4x_over_1x: {ratio:.2f}")


if __name__ == "__main__":
    main()
