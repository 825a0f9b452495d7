"""GPU check: the figures issue 11 asks for, measured on the card it runs on (never guessed).

For the embedded model: the layer map's time in float32, float16 and bfloat16 and its agreement
with the CPU float32 map; a 20-step recovery of layer 17 in each dtype; the tiny growth preset's
tokens/s on the device against the CPU. `benchmarks/gpu_check.sh` runs this, then the console
startup benchmark. `--device cpu --quick` is the dry run that checks the script itself: the paper
texts, three layers of the map, two recovery steps of layer 28 on short blocks, eight growth steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import torch

from engine.events import Result
from engine.experiments.ablation import AblationSettings, run_ablation
from engine.experiments.growth.experiment import preset_settings, run_growth
from engine.experiments.recovery import RecoverySettings, run_recovery
from engine.memory import ModelShape, free_memory, loaded_eval_batch, model_bytes
from engine.models import load_model
from engine.statistics import spearman
from engine.text import eval_texts
from engine.training import synchronize

DTYPES = ("float32", "float16", "bfloat16")
QUICK_LAYERS = (10, 20, 29)  # late layers: the map from the prefix cache stays cheap on a CPU


def result_of(events) -> dict:
    return next(e for e in events if isinstance(e, Result)).data


def layer_map(device: str, dtype: str, settings: AblationSettings) -> tuple[dict, float, int, int]:
    """The map's result, seconds, weight bytes and the evaluation batch it ran with (auto: sized by
    the free memory, as the evaluator sizes it)."""
    loaded = load_model("smollm2-135m", device=device, dtype=dtype)
    batch = loaded_eval_batch(loaded.model, loaded.tokenizer, eval_texts(None, settings.eval_set), settings)
    synchronize(device)
    started = time.perf_counter()
    doc = result_of(run_ablation(loaded.model, loaded.tokenizer, settings, model_name="smollm2-135m"))
    synchronize(device)
    seconds = time.perf_counter() - started
    held = model_bytes(loaded.model)
    del loaded
    return doc, seconds, held, batch


def agreement(doc: dict, reference: dict) -> str:
    ours = [row["degradation_pct"] for row in doc["layers"]]
    theirs = [row["degradation_pct"] for row in reference["layers"]]
    ppl = [row["ppl"] for row in doc["layers"]]
    ref_ppl = [row["ppl"] for row in reference["layers"]]
    worst = max((abs(a - b) / b for a, b in zip(ppl, ref_ppl, strict=True) if math.isfinite(a)), default=math.nan)
    rho = spearman(ours, theirs)
    rank = "undefined" if rho is None else f"{rho:.4f}"
    return (f"baseline ppl {doc['baseline_ppl']:.3f} vs {reference['baseline_ppl']:.3f}, "
            f"Spearman of D% {rank}, largest relative ppl difference {worst:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="the dry run: paper set, 3 map layers, 2 recovery "
                        "steps, 8 growth steps")
    args = parser.parse_args()
    device = args.device
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    print(f"device: {device} ({name}), torch {torch.__version__}, free memory {free_memory(device) / 1e9:.1f} GB")
    from transformers import AutoConfig

    from engine.models import dequantized_folder, embedded_gguf

    shape = ModelShape.from_config(AutoConfig.from_pretrained(dequantized_folder(embedded_gguf())))
    print(f"embedded model: {shape.params:,} parameters, {shape.n_layers} layers")

    ablation = AblationSettings(eval_set="paper", layers=QUICK_LAYERS) if args.quick else AblationSettings()
    started = time.perf_counter()
    reference = result_of(run_ablation(*_cpu_model(), ablation, model_name="smollm2-135m"))
    print(f"map cpu float32: {time.perf_counter() - started:.1f} s (the reference)")
    for dtype in DTYPES:
        doc, seconds, held, batch = layer_map(device, dtype, ablation)
        print(f"map {device} {dtype}: {seconds:.1f} s, weights {held / 1e6:.0f} MB, evaluation batches of {batch}; "
              f"{agreement(doc, reference)}")

    steps, layer = (2, 28) if args.quick else (20, 17)
    recovery = RecoverySettings(layers=(layer,), steps=steps, eval_every=max(1, steps // 4), eval_set="paper")
    if args.quick:
        recovery = dataclasses.replace(recovery, batch_size=1, block_size=32, train_blocks=2)
    for dtype in DTYPES:
        loaded = load_model("smollm2-135m", device=device, dtype=dtype)
        started = time.perf_counter()
        doc = result_of(run_recovery(loaded.model, loaded.tokenizer, recovery, model_name="smollm2-135m"))
        synchronize(device)
        row = doc["layers"][0]
        curve = ", ".join(f"{step}:{ppl:.2f}" for step, ppl in row["curve"])
        print(f"recovery {device} {dtype} layer {layer}, {steps} steps: {time.perf_counter() - started:.1f} s, "
              f"status {row['status']}, baseline {doc['baseline_ppl']:.2f}, curve {curve}")
        del loaded

    growth_steps = 8 if args.quick else 100
    rates = {}
    for where, dtype in (("cpu", "float32"), (device, "float32"), (device, "float16"), (device, "bfloat16")):
        if (where, dtype) in rates:
            continue
        settings = preset_settings("tiny", steps=growth_steps, arms=("uniform_100",), checkpoint_every=0,
                                   eval_every=growth_steps, gen_tokens=4, device=where, dtype=dtype)
        if where != "cpu":
            settings = dataclasses.replace(settings, threads=0)
        doc = result_of(run_growth(settings))
        rates[(where, dtype)] = doc["arms"]["uniform_100"]["tokens_per_s"]
        print(f"growth tiny {where} {dtype}: {rates[(where, dtype)]:,.0f} tokens/s "
              f"({rates[(where, dtype)] / rates[('cpu', 'float32')]:.1f}x the CPU), "
              f"val loss {doc['arms']['uniform_100']['mean']:.3f}")
    best = max(rate for (where, _), rate in rates.items() if where == device)
    print(f"ratio growth_device_vs_cpu: {best / rates[('cpu', 'float32')]:.1f}")


def _cpu_model() -> tuple:
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    return loaded.model, loaded.tokenizer


if __name__ == "__main__":
    main()
