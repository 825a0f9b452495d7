"""Half-precision layer map against float32, on the CPU (issue 18: the auto dtype on a T4).

    python benchmarks/half_precision_map.py [--eval-set full|paper] [--threads auto|1|2] [--budget-min 15]

The layer-importance map (neighbour mean, the default evaluation set) of the embedded SmolLM2-135M in
float32, float16 and bfloat16, and for each half precision: the baseline perplexity's relative
difference from float32, the largest relative perplexity difference over the layers, the Spearman of
D % against float32's, the layers whose class (critical / important / minor / redundant) changes, and
any inf/NaN perplexity. D % differences are also given over the layers below 100 % (the ones
a class boundary can cut: critical layers' D runs to 1e5 %), beside the float32 map's own sampling
noise there (the median half-width of its 95 % bootstrap interval, 1000 resamples of the texts).
The CPU runs half precision slowly, so it first times a float16 map of layers
0 and 29 with one and with two torch threads, keeps the faster, and estimates a full map from it
(layer l costs about the last layer's time plus (29 - l) / 29 of the extra the first layer takes:
the prefix cache); when a full map would take longer than --budget-min minutes per dtype it measures
an evenly spaced subset of the layers, and says so.

This measures the CPU's half-precision arithmetic; a GPU's kernels may round differently
(`benchmarks/gpu_check.sh` compares the maps on a card). The agreement lines are followed by one
decision line: the auto dtype on a CUDA card without native bfloat16 (T4, compute capability 7.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPEARMAN_MIN = 0.99  # the map's layer order must survive
PPL_REL_MAX = 1e-2  # largest relative perplexity difference over the layers (and the baseline)
BOOTSTRAP = 1000  # resamples of the float32 map: its own noise, the scale a dtype's difference is read against
HALF = ("float16", "bfloat16")
PROBE_LAYERS = (0, 29)  # the dearest layer (a full forward) and the cheapest (the last layer and the head)


def timed_map(loaded, settings) -> tuple[dict, float, float, dict[int, float]]:
    """The map's result, its seconds, the baseline pass's seconds and each layer's seconds."""
    from engine.core.events import Result
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationProxies, LayerAblated

    started = time.perf_counter()
    mark, base_s, per_layer, doc = started, math.nan, {}, None
    for event in run_ablation(loaded.model, loaded.tokenizer, settings, model_name=loaded.name):
        now = time.perf_counter()
        if isinstance(event, AblationProxies):
            base_s, mark = now - mark, now
        elif isinstance(event, LayerAblated):
            per_layer[event.layer], mark = now - mark, now
        elif isinstance(event, Result):
            doc = event.data
    assert doc is not None
    return doc, time.perf_counter() - started, base_s, per_layer


def load(dtype: str):
    from engine.models.loading import load_model

    return load_model("smollm2-135m", device="cpu", dtype=dtype)


def estimate(base_s: float, first_s: float, last_s: float, layers: list[int], n: int) -> float:
    """Seconds of a map of these layers, from the probe's baseline, first and last layer times."""
    return base_s + sum(last_s + (first_s - last_s) * (n - 1 - layer) / (n - 1) for layer in layers)


def spaced(n: int, k: int) -> list[int]:
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [n - 1]


def compare(doc: dict, reference: dict) -> dict:
    from engine.evaluation.statistics import spearman

    rows = {row["layer"]: row for row in doc["layers"]}
    ref = {row["layer"]: row for row in reference["layers"]}
    layers = sorted(ref)
    ppl = [rows[i]["ppl"] for i in layers]
    bad = [i for i in layers if not math.isfinite(rows[i]["ppl"])]
    base = doc["baseline_ppl"]
    rel = [abs(rows[i]["ppl"] - ref[i]["ppl"]) / ref[i]["ppl"] for i in layers if math.isfinite(rows[i]["ppl"])]
    worst = max(rel, default=math.nan)
    worst_layer = max((i for i in layers if math.isfinite(rows[i]["ppl"])),
                      key=lambda i: abs(rows[i]["ppl"] - ref[i]["ppl"]) / ref[i]["ppl"], default=None)
    d_gap = max((abs(rows[i]["degradation_pct"] - ref[i]["degradation_pct"]) for i in layers
                 if math.isfinite(rows[i]["degradation_pct"])), default=math.nan)
    below = [i for i in layers if ref[i]["degradation_pct"] < 100]  # where a class boundary can fall
    d_gap_below = max((abs(rows[i]["degradation_pct"] - ref[i]["degradation_pct"]) for i in below
                       if math.isfinite(rows[i]["degradation_pct"])), default=math.nan)
    changed = [i for i in layers if rows[i]["layer_class"] != ref[i]["layer_class"]]
    return {
        "baseline_rel": abs(base - reference["baseline_ppl"]) / reference["baseline_ppl"] if math.isfinite(base)
        else math.nan,
        "baseline_finite": math.isfinite(base),
        "worst_rel": worst,
        "worst_layer": worst_layer,
        "d_gap_pp": d_gap,
        "d_gap_below_100_pp": d_gap_below,
        "layers_below_100": len(below),
        "median_rel": statistics.median(rel) if rel else math.nan,
        "spearman": spearman([rows[i]["degradation_pct"] for i in layers],
                             [ref[i]["degradation_pct"] for i in layers]),
        "class_changes": changed,
        "nonfinite_layers": bad,
        "finite": math.isfinite(base) and all(math.isfinite(p) for p in ppl),
    }


def agrees(figures: dict) -> bool:
    rho = figures["spearman"]
    return (figures["finite"] and rho is not None and rho >= SPEARMAN_MIN
            and figures["worst_rel"] <= PPL_REL_MAX and figures["baseline_rel"] <= PPL_REL_MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"])
    parser.add_argument("--threads", default="auto", choices=["auto", "1", "2"],
                        help="torch threads for the maps (auto: the faster of 1 and 2 on the float16 probe)")
    parser.add_argument("--budget-min", type=float, default=15.0, help="most minutes a half-precision map may take")
    parser.add_argument("--layers", default=None, help="comma-separated layers instead of all / the budget's subset")
    parser.add_argument("--json", default=None, help="write the three maps and the figures here")
    args = parser.parse_args()

    import torch

    from engine.experiments.ablation.vocabulary import AblationSettings

    total_started = time.perf_counter()
    print(f"torch {torch.__version__}, cpu, {torch.get_num_threads()} threads available; "
          f"evaluation set {args.eval_set}")
    probe_settings = AblationSettings(eval_set=args.eval_set, layers=PROBE_LAYERS)
    loaded = load("float16")
    n = loaded.n_layers
    candidates = [1, 2] if args.threads == "auto" else [int(args.threads)]
    probes = {}
    for threads in candidates:
        torch.set_num_threads(threads)
        _, seconds, base_s, per_layer = timed_map(loaded, probe_settings)
        probes[threads] = (seconds, base_s, per_layer)
        print(f"probe float16 layers {PROBE_LAYERS[0]},{PROBE_LAYERS[1]}, {threads} thread(s): {seconds:.1f} s "
              f"(baseline pass {base_s:.1f} s, layer 0 {per_layer[0]:.1f} s, layer {n - 1} {per_layer[n - 1]:.1f} s)")
    threads = min(probes, key=lambda t: probes[t][0])
    _, base_s, per_layer = probes[threads]
    torch.set_num_threads(threads)
    budget = args.budget_min * 60
    full = estimate(base_s, per_layer[0], per_layer[n - 1], list(range(n)), n)
    if args.layers:
        layers = sorted({int(x) for x in args.layers.split(",")})
        scope = f"layers {','.join(map(str, layers))} (--layers)"
    elif full <= budget:
        layers = list(range(n))
        scope = f"all {n} layers"
    else:
        fits = [k for k in range(3, n + 1)
                if estimate(base_s, per_layer[0], per_layer[n - 1], spaced(n, k), n) <= budget]
        k = max(fits, default=3)
        layers = spaced(n, k)
        scope = (f"SUBSET of {len(layers)} evenly spaced layers {','.join(map(str, layers))} (a full float16 map "
                 f"would take about {full / 60:.0f} min > {args.budget_min:g} min)")
    print(f"using {threads} thread(s); full float16 map estimated {full / 60:.1f} min; measuring {scope}")
    del loaded

    settings = AblationSettings(eval_set=args.eval_set, layers=None if len(layers) == n else tuple(layers))
    maps, figures = {}, {}
    for dtype in ("float32", *HALF):
        loaded = load(dtype)  # the bootstrap adds intervals to the float32 map, no perplexity changes
        doc, seconds, _, _ = timed_map(
            loaded, dataclasses.replace(settings, bootstrap=BOOTSTRAP) if dtype == "float32" else settings)
        del loaded
        maps[dtype] = doc
        print(f"map cpu {dtype}: {seconds:.1f} s, {len(doc['layers'])} layers, {doc['eval_tokens']} tokens, "
              f"baseline ppl {doc['baseline_ppl']:.4f}", flush=True)
    reference = maps["float32"]
    halves = [(row["ci_high"] - row["ci_low"]) / 2 for row in reference["layers"] if row["degradation_pct"] < 100]
    noise = statistics.median(halves) if halves else math.nan
    print(f"float32 map's own noise: median 95 % interval half-width of D {noise:.2f} points over the "
          f"{len(halves)} layers below 100 % (bootstrap {BOOTSTRAP} over {reference['eval_texts']} texts)")
    for dtype in HALF:
        f = figures[dtype] = compare(maps[dtype], reference)
        rho = "undefined" if f["spearman"] is None else f"{f['spearman']:.4f}"
        changes = f"{len(f['class_changes'])} {f['class_changes']}" if f["class_changes"] else "0"
        broken = ("baseline " if not f["baseline_finite"] else "") + str(f["nonfinite_layers"])
        print(f"{dtype} vs float32: baseline ppl rel diff {f['baseline_rel']:.2e}; largest rel ppl diff "
              f"{f['worst_rel']:.2e} (layer {f['worst_layer']}), median {f['median_rel']:.1e}; largest |D % diff| "
              f"{f['d_gap_pp']:.2f} points, {f['d_gap_below_100_pp']:.2f} on the {f['layers_below_100']} layers "
              f"below 100 %; "
              f"Spearman of D % {rho}; class changes {changes}; inf/NaN {'none' if f['finite'] else broken}")
    if args.json:
        Path(args.json).write_text(json.dumps({"scope": scope, "threads": threads, "maps": maps,
                                               "figures": figures}, indent=1, default=str))
    print(f"total: {time.perf_counter() - total_started:.0f} s; CPU half-precision arithmetic, not a GPU's kernels "
          f"(benchmarks/gpu_check.sh checks a card)" + ("" if len(layers) == n else f"; {scope}"))
    for dtype in HALF:
        f = figures[dtype]
        rho = math.nan if f["spearman"] is None else f["spearman"]
        print(f"agreement {dtype}: spearman {rho:.4f}, max_rel_ppl {f['worst_rel']:.2e}, "
              f"max_d_diff_below_100 {f['d_gap_below_100_pp']:.2f} (noise {noise:.2f}), "
              f"class_changes {len(f['class_changes'])}, nonfinite {len(f['nonfinite_layers'])}")
    fp16 = figures["float16"]
    verdict = "float16" if agrees(fp16) else "float32"
    print(f"decision auto dtype on CUDA without native bfloat16 (T4): {verdict} "
          f"(float16 {'agrees' if verdict == 'float16' else 'does not agree'}: Spearman >= {SPEARMAN_MIN}, "
          f"largest rel ppl diff <= {PPL_REL_MAX:.0e}, no inf/NaN)")


if __name__ == "__main__":
    main()
