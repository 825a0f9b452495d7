"""The layer map: D % of every layer on a symmetric log axis with its bootstrap interval, the
classes in colour and hatch, anti-layers marked; with --part, the attention and MLP blocks side by
side below it; then each proxy (Block Influence, angular distance) against D % with its Spearman."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engine.core.codec import ABSENT
from engine.evaluation.statistics import CLASSES
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from figures import style

PROXIES = {"block_influence": "Block Influence", "angular_distance": "angular distance",
           "angular_last_token": "angular distance\n(last token)"}
D_LABEL = "D (%)"


def map_panel(ax: Axes, rows: Sequence[AblationRow], title: str) -> None:
    """One bar per row (layer or block) at its layer: D %, interval, class look; anti-layers starred."""
    drawn = [(row, d) for row in rows if style.finite(d := row.degradation_pct)]
    for row, d in drawn:
        look = style.ANTI_LOOK if row.anti else style.class_look(row.layer_class)
        ax.bar(row.layer, d, width=0.8, color=look.color, hatch=look.hatch, edgecolor="black", linewidth=0.4)
    values = [d for _, d in drawn]
    errors = style.interval_errors(values, [r.ci_low for r, _ in drawn], [r.ci_high for r, _ in drawn])
    if errors is not None:
        ax.errorbar([r.layer for r, _ in drawn], values, yerr=errors, fmt="none", ecolor="black", elinewidth=0.6)
    anti = [(row, d) for row, d in drawn if row.anti]
    if anti:
        ax.plot([r.layer for r, _ in anti], [d for _, d in anti], linestyle="none",
                marker=style.ANTI_LOOK.marker, color="black", markersize=5, label="anti-layer")
    style.d_axis(ax, values)
    ax.set_xlabel("layer")
    ax.set_ylabel(D_LABEL)
    ax.set_title(title)
    if len(rows) <= 16:
        ax.set_xticks([row.layer for row in rows])


def proxy_panel(ax: Axes, rows: Sequence[AblationRow], proxy: str, rho: float | None) -> None:
    """Each layer's proxy value against its D %, the class's colour and marker per point."""
    for name in CLASSES:
        points = [(getattr(r, proxy), r.degradation_pct) for r in rows
                  if r.layer_class == name and style.finite(r.degradation_pct) and style.finite(getattr(r, proxy))]
        if points:
            look = style.class_look(name)
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, color=look.color, marker=look.marker, edgecolor="black",
                       linewidth=0.3, s=14, label=name, zorder=3)
    style.d_axis(ax, [r.degradation_pct for r in rows])
    ax.set_xlabel(PROXIES[proxy])
    ax.set_ylabel(D_LABEL)
    ax.set_title(f"Spearman ρ = {rho:.2f}" if style.finite(rho) else "Spearman ρ: n/a", fontsize=6)


def proxies_of(rows: Sequence[AblationRow]) -> list[str]:
    """The proxies some layer has a value of."""
    return [p for p in PROXIES if any(style.finite(v) for r in rows if (v := getattr(r, p)) is not ABSENT)]


def draw(result: AblationMap) -> Figure:
    parts = [] if result.parts is ABSENT else result.parts
    proxies = proxies_of(result.layers)
    rows = 1 + bool(parts) + bool(proxies)
    fig = style.figure(height=1.55 * rows + 0.2)
    panels = fig.subfigures(rows, 1, squeeze=False)[:, 0] if rows > 1 else [fig]
    top = panels[0].subplots()
    partial = f", {text}" if (text := result.partial_text()) else ""  # a stopped run's map says so
    map_panel(top, result.layers, f"{result.model}: layer map ({result.method} ablation{partial})")
    drawn = [*result.layers, *parts]  # the blocks' bars take the same looks: one legend for both panels
    present = [name for name in CLASSES if any(r.layer_class == name and not r.anti for r in drawn)]
    style.class_legend(top, present, any(r.anti for r in drawn), loc="upper right", ncols=2)
    if parts:
        axes = panels[1].subplots(1, 2, sharey=True)
        for ax, part in zip(axes, ("attention", "mlp"), strict=True):
            map_panel(ax, [r for r in parts if r.part == part], "attention blocks" if part == "attention" else
                      "MLP blocks")
        axes[1].set_ylabel("")
    if proxies:
        axes = panels[-1].subplots(1, len(proxies), sharey=True, squeeze=False)[0]
        for ax, proxy in zip(axes, proxies, strict=True):
            proxy_panel(ax, result.layers, proxy, result.spearman.get(proxy))
        for ax in axes[1:]:
            ax.set_ylabel("")
    return fig
