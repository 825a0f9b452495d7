"""Everything the session knows about one layer: its ablation row, its recovery runs."""

from __future__ import annotations

from dataclasses import fields

from rich.text import Text
from textual.widgets import Static

from tui.palette import class_style
from tui.state import SessionState, layer_class

_ROW_FIELDS = (
    ("ppl", "perplexity ablated", "{:,.2f}"),
    ("degradation_pct", "D % (vs baseline)", "{:+,.2f}"),
    ("ci_low", "95% CI low", "{:+,.2f}"),
    ("ci_high", "95% CI high", "{:+,.2f}"),
    ("block_influence", "Block Influence", "{:.4f}"),
    ("angular_distance", "angular distance", "{:.4f}"),
)


def layer_detail_text(state: SessionState, index: int | None) -> Text:
    if index is None:
        return Text("no layer selected", style="dim")
    text = Text()
    row = state.ablation.get(index)
    name = layer_class(row) if row else ""
    text.append(f"Layer {index}", style="bold")
    if row is not None and name:
        text.append(f"  {name}", style=class_style(name))
        if row.anti_within_noise:
            text.append("  (negative D within noise)", style="dim")
    text.append("\n")
    if row is None:
        text.append("ablation: not measured yet (press a to compute the map)\n", style="dim")
    else:
        method = state.ablation_map.method if state.ablation_map else ""
        base = state.ablation_baseline
        if base is not None:
            text.append(f"baseline perplexity {base:,.2f}  method {method}\n")
        for key, label, fmt in _ROW_FIELDS:
            value = getattr(row, key)
            if value is not None:
                text.append(f"{label:>20}  {fmt.format(value)}\n")
    runs = [run for run in state.recovery if run.layer == index]
    if not runs:
        text.append("recovery: no run on this layer yet (tab Recovery, key i)\n", style="dim")
    for run in runs:
        last = run.points[-1] if run.points else None
        reading = f" last step {last[0]:g}: ppl {last[1]:,.2f}" if last else ""
        text.append(f"recovery {run.label} lr={run.lr} {run.status}{reading}\n")
        shown = [] if run.summary is None else fields(run.summary)
        for key, value in ((f.name, getattr(run.summary, f.name)) for f in shown):
            if key != "layer" and isinstance(value, (int, float, str)):
                text.append(
                    f"{key:>20}  {value if not isinstance(value, float) else f'{value:.4g}'}\n", style="dim"
                )
    return text


class LayerDetail(Static):
    """The detail view beside (wide) or over (narrow) the layer map."""

    def show(self, state: SessionState, index: int | None) -> None:
        self.update(layer_detail_text(state, index))
