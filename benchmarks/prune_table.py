"""The table of benchmarks/prune_units.sh: for each cut (whole layers, blocks, a linear replacement,
the last layers healed) and each count, the parameters removed, the perplexity and lm-eval's scores.

    python3 benchmarks/prune_table.py [OUT]   (OUT: the folder prune_units.sh wrote; default /tmp/prune_units)

Reads OUT/layers.json (angular and angular+linear), OUT/blocks.json (angular, --unit block) and
OUT/last.json (last, --heal last): whichever have finished. A row of a healed run shows the healed
cut's perplexity and accuracy. A result written before `removed_params` existed gets n times the
mean layer's parameters (what a layer cut removes), counted on the embedded model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = (("layers.json", "angular", "layers (angular)"), ("blocks.json", "angular", "blocks (angular, --unit block)"),
        ("layers.json", "angular+linear", "linear replacement (angular+linear)"),
        ("last.json", "last", "last + healing (--heal last)"))


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.codec import from_doc  # noqa: E402
from engine.experiments.prune.vocabulary import PruneCut  # noqa: E402
from tui.views.prune import cut_text  # noqa: E402


def per_layer() -> float:
    """The embedded model's mean decoder layer, in parameters."""
    from engine.models.loading import load_model
    from engine.models.pruning import layer_params

    sizes = layer_params(load_model("smollm2-135m", device="cpu", dtype="float32").model)
    return sum(sizes) / len(sizes)


def scores(rows: list[dict] | None) -> tuple[str, str]:
    """everyday_sense acc (acc_norm) and exact_facts EM, in percent."""
    by = {row["task"]: row for row in rows or ()}
    choice, gen = by.get("everyday_sense"), by.get("exact_facts")
    return (f"{100 * choice['acc']:.0f} ({100 * choice['acc_norm']:.0f})" if choice else "-",
            f"{100 * gen['exact_match']:.0f}" if gen else "-")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/prune_units")
    docs = {name: json.loads((out / name).read_text()) for name in {r[0] for r in ROWS} if (out / name).exists()}
    if not docs:
        raise SystemExit(f"nothing in {out}: run benchmarks/prune_units.sh {out} first")
    layer = per_layer() if any("removed_params" not in p for doc in docs.values() for p in doc["curve"]) else None
    base = next(iter(docs.values()))
    choice, gen = scores(base.get("baseline_accuracy"))
    print(f"baseline: PPL {base['baseline_ppl']:.2f}, everyday_sense {choice}, exact_facts EM {gen}\n")
    print("| cut | n | removed | parameters (M) | PPL | everyday_sense % acc (norm) | exact_facts % EM |")
    print("|---|---|---|---|---|---|---|")
    for name, method, label in ROWS:
        for point in (p for p in docs.get(name, {}).get("curve", []) if p["method"] == method):
            params = point.get("removed_params", point["removed"] * (layer or 0))
            healed = point["healed_ppl"] is not None
            ppl = (f"{point['ppl']:.1f} -> {point['healed_ppl']:.1f}" if healed else f"{point['ppl']:.1f}")
            acc, em = scores(point.get("healed_accuracy") if healed else point.get("accuracy"))
            if healed:
                before = scores(point.get("accuracy"))
                acc, em = f"{before[0]} -> {acc}", f"{before[1]} -> {em}"
            where = cut_text(from_doc(PruneCut, point))
            print(f"| {label} | {point['removed']} | {where} | {params / 1e6:.2f} | {ppl} | {acc} | {em} |")
    missing = [name for name in {r[0] for r in ROWS} if name not in docs]
    if missing:
        print(f"\nnot finished: {', '.join(sorted(missing))}")


if __name__ == "__main__":
    main()
