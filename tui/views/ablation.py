"""The ablation map as `anatomy-tui run ablation` prints it (the console draws it on the Layers tab)."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from engine.experiments.ablation.vocabulary import AblationMap, AblationProxyMap, AblationRow
from tui.views._tables import WholeConsole


def print_result(doc: dict[str, Any]) -> None:
    """The map with each cheap measure named by its definition: BI, the angular distance over all
    tokens (`ang all`) and of the last token (`ang last`, the field's), and Gromov et al.'s
    last-token block search (the best block of each length)."""
    if "ppl" not in (doc.get("layers") or [{}])[0]:
        print_proxies(AblationProxyMap.from_json(doc))
        return
    result = AblationMap.from_json(doc)
    if result.partial is True:  # a stopped run's map: the layers it finished, each as a full run has it
        print(f"{result.partial_text()} (the run stopped before its last layer; --resume completes it)")
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
    WholeConsole().print(table)
    if result.parts:
        print_parts(result)
    print(_spearman_line(result))
    if result.angular_block_best:
        print(_blocks_line(result))


SHOWN = {"block_influence": "block influence", "angular_distance": "angular_all_tokens",
         "angular_last_token": "angular_last_token"}  # fmt: skip


def _spearman_line(result: AblationMap) -> str:
    """How each cheap measure ranks the layers against the ablation, and why where it cannot say."""
    rho, n = result.spearman, len(result.layers)
    if n < 3 and rho and all(value is None for value in rho.values()):
        return f"Spearman vs D: undefined: {_count(n)} ablated, and a rank correlation needs at least 3"
    return "Spearman vs D: " + ", ".join(f"{SHOWN.get(k, k)} {_rho(v, result, k)}" for k, v in rho.items())


def _rho(value: float | None, result: AblationMap, measure: str) -> str:
    if value is not None:
        return f"{value:.3f}"
    pairs = [(getattr(row, measure, None), row.degradation_pct) for row in result.layers]
    pairs = [(x, d) for x, d in pairs if _finite(x) and _finite(d)]
    if len(pairs) < 3:
        why = f"{_count(len(pairs))} with a value, and it needs at least 3"
    elif len({d for _, d in pairs}) == 1:
        why = "D % is the same on every layer"
    elif len({x for x, _ in pairs}) == 1:
        why = f"{SHOWN.get(measure, measure)} is the same on every layer"
    else:
        why = "not a number"
    return f"undefined ({why})"


def _blocks_line(result: AblationMap) -> str:
    """Gromov et al.'s block search, the closest block of each length (shorter than the model): over
    the whole model for a whole map; for a map of some layers (--layers), among the blocks made of
    the layers it ablated, so it names no other layer."""
    depth = len(result.angular_blocks.get("1", ()))
    ablated = {row.layer for row in result.layers}
    whole = ablated >= set(range(depth))
    blocks = []
    for n, values in result.angular_blocks.items():
        length = int(n)
        if length >= depth:
            continue
        if whole:
            start = result.angular_block_best[n]
        else:
            inside = [first for first, value in enumerate(values)
                      if _finite(value) and all(first + i in ablated for i in range(length))]  # fmt: skip
            if not inside:
                continue
            start = min(inside, key=lambda first: values[first])
        blocks.append(f"n={n}: layers {start}-{start + length - 1} ({values[start]:.3f})")
    where = "" if whole else f" among the layers ablated ({', '.join(map(str, sorted(ablated)))})"
    return f"angular_block_n (last token, Gromov et al.), the closest block of each length{where}: " + \
        "; ".join(blocks[:8])


def _count(n: int) -> str:
    return f"{n} layer" + ("" if n == 1 else "s")


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def print_proxies(result: AblationProxyMap) -> None:
    """`--proxies-only`: the cheap measures of every layer (and block), no perplexity but the baseline."""
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  (proxies only, one pass)")
    for column in ("layer", "block", "BI", "ang all", "ang last"):
        table.add_column(column, justify="right")
    for row in sorted([*result.layers, *(result.parts or ())], key=lambda r: (r.layer, r.part or "")):
        table.add_row(str(row.layer), row.part or "layer", f"{row.block_influence:.3f}", f"{row.angular_distance:.3f}",
                      f"{row.angular_last_token:.3f}")
    WholeConsole().print(table)


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
    WholeConsole().print(table)
    ranked = sorted(result.parts, key=_degradation, reverse=True)
    describe = lambda row: f"{row.part} {row.layer} {row.degradation_pct:+.1f}% {_interval(row)}".rstrip()  # noqa: E731
    print("most important blocks: " + "; ".join(describe(row) for row in ranked[:3]))
    print("least important blocks: " + "; ".join(describe(row) for row in ranked[-3:][::-1]))


def _interval(row: AblationRow) -> str:
    return "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"


def _degradation(row: AblationRow) -> float:
    """A saved map's row's degradation (only a live row, from `LayerAblated`, may lack it)."""
    assert row.degradation_pct is not None  # the saved map writes every row's degradation
    return row.degradation_pct
