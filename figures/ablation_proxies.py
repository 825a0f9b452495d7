"""The proxies alone (`ablation --proxies-only`): Block Influence and the angular distances of
every layer, by layer."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.experiments.ablation.vocabulary import AblationProxyMap
from figures import style
from figures.ablation import PROXIES


def draw(result: AblationProxyMap) -> Figure:
    fig = style.figure(height=1.9)
    ax = fig.subplots()
    for index, proxy in enumerate(PROXIES):
        points = [(row.layer, v) for row in result.layers if style.finite(v := getattr(row, proxy))]
        if points:
            ax.plot(*zip(*points, strict=True), label=PROXIES[proxy], **style.series(index))
    ax.set_xlabel("layer")
    ax.set_ylabel("proxy value")
    ax.set_title(f"{result.model}: layer proxies")
    ax.legend(loc="best")
    return fig
