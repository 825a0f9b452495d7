"""Everything the session knows about one layer: its ablation row, its recovery runs."""

from __future__ import annotations

from dataclasses import fields

from rich.text import Text
from textual.widgets import Static

from tui.palette import class_style
from tui.state import SessionState, job_progress, layer_class, layer_list

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
    running = running_map_text(state, index)
    if running:
        text.append(running)
    elif row is None:
        text.append("ablation: not measured yet (press a to compute the map)\n", style="dim")
    if row is not None:
        method = state.ablation_map.method if state.ablation_map else ""
        base = state.ablation_baseline
        if base is not None:
            text.append(f"baseline perplexity {base:,.2f}  method {method}\n")
        for key, label, fmt in _ROW_FIELDS:
            value = getattr(row, key)
            if value is not None:
                text.append(f"{label:>20}  {fmt.format(value)}\n")
    if row is None or row.block_influence is None:  # a live row's (or no row's) proxies, as the map's row shows them
        for label, value in zip(("Block Influence", "angular distance"), state.proxy(index), strict=True):
            if value is not None:
                text.append(f"{label:>20}  {value:.4f}\n")
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


def running_map_text(state: SessionState, index: int) -> str:
    """What a running map says of itself and of layer `index`: its progress (`ablation: running,
    layers 12/30`), the layers measured already, and for a streamed map its wavefront; "" when no
    map runs."""
    job = state.map_job()
    if job is None:
        return ""
    lines = [f"ablation: {'cancelling' if job.cancelling else 'running, ' + (job_progress(job) or 'starting')}"]
    measured = sorted(set(state.ablation) - state.previous)
    lines.append(f"measured: layers {layer_list(measured)} ({len(measured)} of {state.n_layers or '?'})" if measured
                 else "measured: no layer yet")
    front = state.wavefront()
    if front is not None:
        lines.append(f"wavefront at layer {front}: Block Influence and angle known below it, perplexities at the end")
    if index in state.passed and index not in measured:
        lines.append("this layer: passed, its perplexity comes at the end")
    elif index in state.previous:
        lines.append("this layer: the previous map's row below, until the running map measures it again")
    elif index not in state.ablation:
        lines.append("this layer: not measured yet, the running map reaches it")
    return "".join(f"{line}\n" for line in lines)


class LayerDetail(Static):
    """The detail view beside (wide) or over (narrow) the layer map."""

    def show(self, state: SessionState, index: int | None) -> None:
        self.update(layer_detail_text(state, index))
