"""The depth family (paper B on the user's own data): the members' final held-out losses against
depth (seeds as points) with the fitted L = c_l / l^a_l + L0, the band of the curves whose a_l lies in
its bootstrap interval, and a_l beside paper B's and the toy's; the members' curves (a line per
member); and the anatomy against depth (share of redundant layers, mean angle, neighbour
similarity), each depth's mean with its 95 % interval over the members."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from engine.experiments.depth_family.vocabulary import AnatomyRow, DepthFamilyResult, DepthFit, Member
from figures import style

BAND_EXPONENTS = 41  # exponents drawn across a_l's interval for its band
# each anatomy summary, its axis label, and the range it can take (a t interval of two members can pass it)
ANATOMY = (("redundant_share", "share of redundant layers", (0.0, 1.0)),
           ("mean_angle", "mean angle (degrees)", (0.0, 180.0)),
           ("neighbour_similarity", "neighbour similarity", (-1.0, 1.0)))
OTHER_CELL = "0.6"  # members outside the fitted width and budget


def depth_axis(ax: Axes, depths: Sequence[int]) -> None:
    """A log depth axis ticked at the family's depths."""
    style.log_axis(ax, "x")
    shown = sorted(set(depths))
    if shown:
        ax.set_xticks(shown, [str(d) for d in shown])
        ax.xaxis.set_minor_locator(NullLocator())


def refit(fit: DepthFit, alpha: float) -> tuple[float, float]:
    """(c_l, L0) of the least-squares curve through the fitted points with a_l held at `alpha` (the
    law is linear in them for a fixed exponent)."""
    depths, losses = np.asarray(fit.depths, dtype=float), np.asarray(fit.losses, dtype=float)
    design = np.column_stack([depths**-alpha, np.ones_like(depths)])
    (c_l, floor), *_ = np.linalg.lstsq(design, losses, rcond=None)
    return float(c_l), float(floor)


def band(fit: DepthFit, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The envelope of the fitted curve and of the curves of the law (c_l, L0 >= 0, as the fit
    holds them) refitted at each a_l of its 95 % interval; None without an interval."""
    if fit.ci95 is None or not all(style.finite(v) for v in fit.ci95):
        return None
    curves = [fit.c_l / grid**fit.alpha_l + fit.L0]
    for alpha in np.linspace(fit.ci95[0], fit.ci95[1], BAND_EXPONENTS):
        c_l, floor = refit(fit, float(alpha))
        if c_l >= 0 and floor >= 0:
            curves.append(c_l / grid**alpha + floor)
    stacked = np.vstack(curves)
    return stacked.min(axis=0), stacked.max(axis=0)


def fit_label(fit: DepthFit) -> str:
    bounds = f" [{fit.ci95[0]:.2f}, {fit.ci95[1]:.2f}]" if fit.ci95 else ""
    weak = ", weakly identified" if fit.weakly_identified else ""
    return f"fit: a_l = {fit.alpha_l:.2f}{bounds}{weak}"


def reference_handles(fit: DepthFit) -> list[Line2D]:
    """Legend entries, no mark, that set paper B's and the toy's a_l beside the measured one."""
    labels = [f"{ref.name}: a_l = {ref.alpha_l:g}" + (f" ± {(ref.interval[1] - ref.interval[0]) / 2:g}"
                                                       if ref.interval else "") for ref in fit.references]
    return [Line2D([], [], linestyle="none", marker="", label=label) for label in labels]


def loss_panel(ax: Axes, result: DepthFamilyResult) -> None:
    """Each member's final held-out loss at its depth (a marker per seed), the fit, its band, and the
    leave-one-depth-out predictions."""
    fit = result.fit
    cell = (fit.width, fit.tokens) if fit is not None else None
    seeds = list(dict.fromkeys(m.seed for m in result.members))
    for index, seed in enumerate(seeds):
        points = [(m.depth, m.heldout_loss) for m in result.members
                  if m.seed == seed and (m.width, m.tokens) == cell and style.finite(m.heldout_loss)]
        if points:
            ax.plot(*zip(*points, strict=True), linestyle="none", color="black",
                    marker=style.MARKERS[index % len(style.MARKERS)], zorder=3, label=f"seed {seed}")
    other = [(m.depth, m.heldout_loss) for m in result.members
             if (m.width, m.tokens) != cell and style.finite(m.heldout_loss)]
    if other:
        ax.plot(*zip(*other, strict=True), linestyle="none", color=OTHER_CELL, markerfacecolor="none", marker="o",
                label="other widths or budgets")
    handles: list[Line2D] = []
    if fit is not None and fit.depths:
        grid = np.geomspace(min(fit.depths), max(fit.depths), 100)
        spread = band(fit, grid)
        if spread is not None:
            ax.fill_between(grid, *spread, color=style.PALETTE[0], alpha=0.2, linewidth=0,
                            label="a_l in its 95 % interval")
        ax.plot(grid, fit.c_l / grid**fit.alpha_l + fit.L0, color=style.PALETTE[0], label=fit_label(fit))
        loo = [(p.depth, p.predicted) for p in fit.loo if style.finite(p.predicted)]
        if loo:
            rmse = f" (RMSE {fit.loo_rmse:.3g})" if style.finite(fit.loo_rmse) else ""
            ax.plot(*zip(*loo, strict=True), linestyle="none", color=style.PALETTE[1], markerfacecolor="none",
                    marker="D", zorder=4, label=f"left out, predicted{rmse}")
        handles = reference_handles(fit)
    ax.set_title(f"width {fit.width}, {fit.tokens:,} tokens" if fit is not None
                 else "no exponent fitted (fewer than three depths finished)")
    depth_axis(ax, [m.depth for m in result.members])
    ax.set_xlabel("depth l (layers)")
    ax.set_ylabel("held-out loss")
    drawn, labels = ax.get_legend_handles_labels()
    ax.legend(handles=[*drawn, *handles], labels=[*labels, *(h.get_label() for h in handles)], loc="best",
              fontsize=5)


def depth_colours(members: Sequence[Member]) -> dict[int, str]:
    """A colour per depth, shallowest first."""
    return {depth: style.PALETTE[i % len(style.PALETTE)] for i, depth in enumerate(sorted({m.depth for m in members}))}


def curves_panel(ax: Axes, members: Sequence[Member]) -> None:
    """A held-out line per member (coloured by depth, dashed by seed) over its training steps; its
    training loss faint in the same colour."""
    colours = depth_colours(members)
    seeds = list(dict.fromkeys(m.seed for m in members))
    for member in members:
        colour, dash = colours[member.depth], style.series(seeds.index(member.seed))["linestyle"]
        train = [(p.step, p.train_loss) for p in member.curve if style.finite(p.train_loss)]
        held = [(p.step, p.heldout_loss) for p in member.curve if style.finite(p.heldout_loss)]
        if train:
            ax.plot(*zip(*train, strict=True), color=colour, linewidth=0.3, alpha=0.2)
        if held:
            ax.plot(*zip(*held, strict=True), color=colour, linestyle=dash, marker=".", markersize=2)
    handles = [Line2D([], [], color=colour, label=f"l = {depth}") for depth, colour in colours.items()]
    handles += [Line2D([], [], color="black", linestyle=style.series(i)["linestyle"], label=f"seed {seed}")
                for i, seed in enumerate(seeds)] if len(seeds) > 1 else []
    handles.append(Line2D([], [], color="black", linewidth=0.6, alpha=0.4, label="training loss (faint)"))
    ax.legend(handles=handles, loc="upper right", fontsize=5, ncols=2)
    ax.set_title(f"members' curves ({len(members)})")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out loss")


def anatomy_panel(ax: Axes, rows: Sequence[AnatomyRow], members: Sequence[Member], key: str, label: str,
                  bounds: tuple[float, float], legend: bool) -> None:
    """Each member's value (small points) and each depth's mean with its 95 % interval, drawn within
    the range the quantity can take."""
    points = [(m.depth, v) for m in members if m.anatomy is not None and style.finite(v := getattr(m.anatomy, key))]
    if points:
        ax.plot(*zip(*points, strict=True), linestyle="none", color="0.55", marker=".", label="members")
    means = [(row.depth, v, getattr(row, f"{key}_ci")) for row in rows if style.finite(v := getattr(row, key))]
    if means:
        depths, values, cis = zip(*means, strict=True)
        low, high = bounds
        errors = style.interval_errors(values, [max(c[0], low) if c else None for c in cis],
                                       [min(c[1], high) if c else None for c in cis])
        ax.errorbar(depths, values, yerr=errors, color=style.PALETTE[0], marker="o", markersize=3)
    if not points and not means:
        style.nothing(ax, "no anatomy in this result (--no-anatomy)")
    else:
        depth_axis(ax, [m.depth for m in members] or [row.depth for row in rows])
        if legend:  # the errorbar's entry as a plain line (its own handle has no single colour)
            mean = Line2D([], [], color=style.PALETTE[0], marker="o", markersize=3, label="mean, 95 % interval")
            ax.legend(handles=[*ax.get_legend_handles_labels()[0], mean], loc="best", fontsize=5)
    ax.set_xlabel("depth l (layers)")
    ax.set_ylabel(label)


def draw(result: DepthFamilyResult) -> Figure:
    fig = style.figure(height=4.2, width=style.PAGE)
    grid = fig.add_gridspec(2, 6)
    loss_panel(fig.add_subplot(grid[0, :3]), result)
    curves_panel(fig.add_subplot(grid[0, 3:]), result.members)
    for index, (key, label, bounds) in enumerate(ANATOMY):
        anatomy_panel(fig.add_subplot(grid[1, 2 * index:2 * index + 2]), result.anatomy_by_depth, result.members,
                      key, label, bounds, legend=index == 0)
    partial = " (partial: a stopped run's finished members)" if result.partial is True else ""
    fig.suptitle(f"depth family: {len(result.members)} members{partial}", fontsize=7)
    return fig
