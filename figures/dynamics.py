"""Hidden-state dynamics: the median angles by layer (between a layer's input and output, between
consecutive updates, to the final state) with their interquartile bands, and the sampled tokens'
trajectory profiles in the first two PCA components, one colour and marker per cluster."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.experiments.dynamics.vocabulary import DynamicsResult, Quartiles
from figures import style

ANGLES = {"angle_state": "θ(h_l, h_l+1)", "angle_update": "θ(Δh_l, Δh_l+1)", "angle_final": "θ(h_l+1, h_L)"}


def draw(result: DynamicsResult) -> Figure:
    fig = style.figure(height=1.9)
    angles, pca = fig.subplots(1, 2)
    for index, (field, label) in enumerate(ANGLES.items()):
        rows = [(row.layer, q) for row in result.layers if isinstance(q := getattr(row, field), Quartiles)
                and style.finite(q.median)]
        if not rows:
            continue
        look = style.series(index)
        layers = [layer for layer, _ in rows]
        angles.plot(layers, [q.median for _, q in rows], label=label, **look)
        bands = [(layer, q.q1, q.q3) for layer, q in rows if style.finite(q.q1) and style.finite(q.q3)]
        if bands:
            x, low, high = zip(*bands, strict=True)
            angles.fill_between(x, low, high, color=look["color"], alpha=0.18, linewidth=0)
    core = result.core.layers
    if core:
        angles.axvspan(min(core), max(core), color="0.9", zorder=0, linewidth=0, label="core layers")
    angles.set_xlabel("layer")
    angles.set_ylabel("angle (degrees)")
    angles.set_title(f"{result.model}: angles by layer")
    angles.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28))
    sample = result.pca.sample
    if sample is None or not sample.pc1:
        style.nothing(pca, "no token sample in this result (before anatomy-tui 0.3)")
    else:
        by_label = {c.label: c for c in result.pca.clusters}
        for index, number in enumerate(sorted(set(sample.label))):
            points = [(x, y) for x, y, lab in zip(sample.pc1, sample.pc2, sample.label, strict=True) if lab == number]
            cluster = by_label.get(number)
            name = f"cluster {number}" + (" (bulk)" if cluster and cluster.bulk else "")
            look = style.series(index)
            pca.scatter(*zip(*points, strict=True), color=look["color"], marker=look["marker"], s=8,
                        edgecolor="black", linewidth=0.2, label=name)
        explained = result.pca.explained
        pca.set_xlabel(f"PC1 ({explained[0]:.0%})" if explained else "PC1")
        pca.set_ylabel(f"PC2 ({explained[1]:.0%})" if len(explained) > 1 else "PC2")
        pca.set_title(f"token profiles ({result.pca.profile})")
        pca.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28))
    return fig
