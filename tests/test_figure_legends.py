"""Every colour a figure fills a bar with has its legend entry, and a partial map's figure says it is
partial (issue 43: the report's block figure drew grey bars of a class its legend left out)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine import registry

pytestmark = pytest.mark.report


@pytest.fixture(scope="module")
def figures() -> Any:
    pytest.importorskip("matplotlib")
    import figures

    return figures


def bar_colours(fig: Any) -> set[str]:
    """The fill colour of every bar drawn (ax.bar, ax.barh) on any axes of the figure."""
    from matplotlib.colors import to_hex
    from matplotlib.container import BarContainer

    return {to_hex(patch.get_facecolor()) for ax in fig.get_axes() for container in ax.containers
            if isinstance(container, BarContainer) for patch in container.patches}


def legend_colours(fig: Any) -> set[str]:
    """The colour of every legend entry of the figure (its subfigures' and axes' legends too)."""
    from matplotlib.colors import to_hex

    legends = [*fig.legends, *(legend for sub in fig.subfigs for legend in sub.legends),
               *(ax.get_legend() for ax in fig.get_axes() if ax.get_legend() is not None)]
    found = set()
    for legend in legends:
        for handle in legend.legend_handles:
            getter = getattr(handle, "get_facecolor", None) or handle.get_color
            found.add(to_hex(getter()))
    return found


def unexplained(fig: Any) -> set[str]:
    return bar_colours(fig) - legend_colours(fig)


@pytest.mark.parametrize("name", [entry.name for entry in registry.EXPERIMENTS])
def test_every_bar_colour_of_each_sample_figure_is_in_a_legend(name, figures):
    assert not unexplained(figures.figure_for(registry.experiment(name).contract().sample()))


def test_blocks_of_a_class_no_layer_has_are_in_the_legend(figures):
    """The blocks panel: redundant (grey) and anti blocks under layers that are all critical."""
    from engine.experiments.ablation.vocabulary import sample_parts

    sample = sample_parts()
    layers = [dataclasses.replace(row, layer_class="critical", anti=False) for row in sample.layers]
    fig = figures.figure_for(dataclasses.replace(sample, layers=layers))
    assert {"#bbbbbb", "#009e73"} <= bar_colours(fig)  # grey redundant blocks and a green anti block drawn
    assert not unexplained(fig)


def growth_sample() -> Any:
    return registry.experiment("growth").contract().sample()


def test_growth_without_a_redundant_layer_explains_the_uniform_arm(figures):
    """The uniform arm's layers have no class: their look is in the legend, never an unnamed grey."""
    sample = growth_sample()
    fig = figures.figure_for(dataclasses.replace(sample, profile=["C"] * len(sample.profile)))
    assert not unexplained(fig)


def test_growth_final_losses_have_a_legend(figures):
    from engine.core.codec import ABSENT

    sample = growth_sample()
    old = dataclasses.replace(sample, arms={name: dataclasses.replace(arm, curve=ABSENT)
                                            for name, arm in sample.arms.items()})
    assert not unexplained(figures.figure_for(old))


def test_a_partial_maps_title_says_partial(figures):
    from engine.experiments.ablation.vocabulary import sample as map_sample

    sample = map_sample()
    partial = dataclasses.replace(sample, layers=sample.layers[:2], partial=True,
                                  angular_blocks={"1": [0.5] * 6})  # the model's 6 layers, 2 of them measured
    titles = [ax.get_title() for ax in figures.figure_for(partial).get_axes()]
    assert any("partial: 2 of 6 layers" in title for title in titles), titles
    assert not any("partial" in ax.get_title() for ax in figures.figure_for(sample).get_axes())
