"""The ablation map as `anatomy-tui run ablation` prints it (the console draws it on the Layers tab)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from engine.experiments.ablation.vocabulary import AblationMap, AblationProxyMap, AblationRow


def print_result(doc: dict[str, Any]) -> None:
    """The map with each cheap measure named by its definition: BI, the angular distance over all
    tokens (`ang all`) and of the last token (`ang last`, the field's), and Gromov et al.'s
    last-token block search (the best block of each length)."""
    if "ppl" not in (doc.get("layers") or [{}])[0]:
        print_proxies(AblationProxyMap.from_json(doc))
        return
    result = AblationMap.from_json(doc)
    last = all(isinstance(row.angular_last_token, float) for row in result.layers)
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  ({result.method})")
    for column in ("layer", "PPL", "D %", "95% CI", "class", "BI", "ang all", *(("ang last",) if last else ())):
        table.add_column(column, justify="right")
    for row in result.layers:
        ci = "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"
        label = row.layer_class + (" anti" if row.anti else " anti?" if row.anti_within_noise else "")
        table.add_row(str(row.layer), f"{row.ppl:.2f}", f"{row.degradation_pct:.1f}", ci, label,
                      f"{row.block_influence:.3f}", f"{row.angular_distance:.3f}",
                      *((f"{row.angular_last_token:.3f}",) if last else ()))
    Console().print(table)
    if result.parts:
        print_parts(result)
    rho = result.spearman
    shown = {"block_influence": "block influence", "angular_distance": "angular_all_tokens",
             "angular_last_token": "angular_last_token"}
    print("Spearman vs D: " + ", ".join(f"{shown.get(k, k)} {_rho(v)}" for k, v in rho.items()))
    if result.angular_block_best:
        blocks = [f"n={n}: layers {start}-{start + int(n) - 1} ({result.angular_blocks[n][start]:.3f})"
                  for n, start in result.angular_block_best.items() if int(n) < len(result.layers)][:8]
        print("angular_block_n (last token, Gromov et al.), the closest block of each length: " + "; ".join(blocks))


def print_proxies(result: AblationProxyMap) -> None:
    """`--proxies-only`: the cheap measures of every layer (and block), no perplexity but the baseline."""
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  (proxies only, one pass)")
    for column in ("layer", "block", "BI", "ang all", "ang last"):
        table.add_column(column, justify="right")
    for row in sorted([*result.layers, *(result.parts or ())], key=lambda r: (r.layer, r.part or "")):
        table.add_row(str(row.layer), row.part or "layer", f"{row.block_influence:.3f}", f"{row.angular_distance:.3f}",
                      f"{row.angular_last_token:.3f}")
    Console().print(table)


def print_parts(result: AblationMap) -> None:
    """`--part`: each layer's attention and MLP removed alone, beside the whole layer, then the
    blocks that matter most and least (with their intervals)."""
    blocks = {part: result.part_rows(part) for part in ("attention", "mlp")}
    shown = [part for part in blocks if blocks[part]]
    table = Table(title=f"below the layer ({result.method}): D % of each block removed alone")
    for column in ("layer", "layer D %", *(f"{part} {what}" for part in shown for what in ("D %", "95% CI", "BI"))):
        table.add_column(column, justify="right")
    whole = {row.layer: row for row in result.layers}
    for layer in sorted({row.layer for row in result.parts}):
        cells = [str(layer), f"{whole[layer].degradation_pct:.1f}" if layer in whole else ""]
        for part in shown:
            row = blocks[part].get(layer)
            if row is None:
                cells += ["", "", ""]
                continue
            label = " anti" if row.anti else " anti?" if row.anti_within_noise else ""
            cells += [f"{row.degradation_pct:.1f}{label}", _interval(row), f"{row.block_influence:.3f}"]
        table.add_row(*cells)
    Console().print(table)
    ranked = sorted(result.parts, key=lambda row: row.degradation_pct, reverse=True)
    describe = lambda row: f"{row.part} {row.layer} {row.degradation_pct:+.1f}% {_interval(row)}".rstrip()  # noqa: E731
    print("most important blocks: " + "; ".join(describe(row) for row in ranked[:3]))
    print("least important blocks: " + "; ".join(describe(row) for row in ranked[-3:][::-1]))


def _interval(row: AblationRow) -> str:
    return "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"


def _rho(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"
