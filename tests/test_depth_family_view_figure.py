"""The depth family's figure (figures/depth_family.py), drawn from its vocabulary's sample: the members
as points, the fitted curve inside its band, a_l beside paper B's in the legend, a line per member,
each depth's anatomy with its interval, and a legend entry for every colour drawn."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pytest

from engine.experiments.depth_family.vocabulary import DepthFamilyResult, sample

pytestmark = pytest.mark.report


@pytest.fixture(scope="module")
def figures() -> Any:
    pytest.importorskip("matplotlib")
    import figures

    return figures


def offsets(ax: Any, label: str) -> list[tuple[float, float]]:
    """The points of the marks labelled `label` (drawn without a line)."""
    found = [line for line in ax.get_lines() if line.get_label() == label]
    assert len(found) == 1 and found[0].get_linestyle() == "None", [line.get_label() for line in ax.get_lines()]
    return list(zip(*found[0].get_data(), strict=True))


def legend_texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_loss_panel_has_each_seeds_members_the_fit_and_paper_b(figures):
    result = sample()
    loss = figures.figure_for(result).axes[0]
    # the sample: depths 1, 2, 4, 8 and seeds 0, 1; a member's loss 2 + 1.5 / l^1.1, x0.99 (seed 0), x1.01 (seed 1)
    for seed, factor in ((0, 0.99), (1, 1.01)):
        assert offsets(loss, f"seed {seed}") == pytest.approx([(d, 2.0 + 1.5 / d**1.1 * factor) for d in (1, 2, 4, 8)])
    assert len(offsets(loss, "left out, predicted (RMSE 0.02)")) == 4
    texts = legend_texts(loss)
    assert "fit: a_l = 1.10 [0.90, 1.35]" in texts
    assert "paper B (Chinchilla runs): a_l = 1.2 ± 0.3" in texts
    assert {"toy: ensemble averaging: a_l = 1", "toy: smooth dynamics: a_l = 3"} <= set(texts)


def test_the_band_contains_the_fitted_curve_and_spans_the_interval(figures):
    loss = figures.figure_for(sample()).axes[0]
    (curve,) = [line for line in loss.get_lines() if line.get_label().startswith("fit:")]
    x, y = curve.get_data()
    assert y == pytest.approx(1.5 / x**1.1 + 2.0)  # the sample's c_l, a_l, L0
    (band,) = [c for c in loss.collections if c.get_label() == "a_l in its 95 % interval"]
    bounds: dict[float, list[float]] = defaultdict(list)
    for vx, vy in band.get_paths()[0].vertices:
        bounds[round(float(vx), 9)].append(float(vy))
    for xi, yi in zip(x, y, strict=True):
        column = bounds[round(float(xi), 9)]
        assert min(column) - 1e-12 <= yi <= max(column) + 1e-12
    assert max(max(v) - min(v) for v in bounds.values()) > 0.005  # a band, not the curve alone


def test_a_line_per_member_and_the_anatomy_per_depth_with_intervals(figures):
    result = sample()
    fig = figures.figure_for(result)
    curves = fig.axes[1]
    held = [line for line in curves.get_lines() if line.get_marker() == "."]
    assert len(held) == len(result.members) == 8
    assert len(curves.get_lines()) == 2 * 8  # each member's held-out line and its faint training line
    first = result.members[0]
    assert [tuple(p) for p in zip(*held[0].get_data(), strict=True)] == [
        (p.step, p.heldout_loss) for p in first.curve]
    for ax, depths in zip(fig.axes[2:], ((1, 2, 4, 8), (1, 2, 4, 8), (2, 4, 8)), strict=True):
        (bars,) = ax.containers  # the errorbar of each depth's mean
        line = bars.lines[0]
        assert tuple(line.get_xdata()) == depths
        assert len(bars.lines[2][0].get_segments()) == len(depths)  # an interval at each depth
    redundant = fig.axes[2].containers[0].lines[0].get_ydata()
    assert list(redundant) == pytest.approx([0.0, 0.0, 0.25, 0.625])  # max(0, (d - 3) / d)


def colours(value: Any) -> set[str]:
    """Each colour of a colour or an array of them, as hex; a fully transparent one left out."""
    from matplotlib.colors import to_hex, to_rgba_array

    return {to_hex(c, keep_alpha=False) for c in to_rgba_array(value) if c[3] > 0}


def test_every_colour_drawn_has_a_legend_entry(figures):
    fig = figures.figure_for(sample())
    drawn, explained = set(), set()
    for ax in fig.axes:
        for line in ax.get_lines():
            drawn |= colours(line.get_color())
        for collection in ax.collections:
            drawn |= colours(collection.get_facecolor()) | colours(collection.get_edgecolor())
    for ax in fig.axes:
        legend = ax.get_legend()
        for handle in legend.legend_handles if legend is not None else ():
            for getter in ("get_color", "get_facecolor", "get_edgecolor"):
                if hasattr(handle, getter):
                    explained |= colours(getattr(handle, getter)())
    assert drawn - explained == set()


def test_a_family_without_a_fit_or_anatomy_still_draws_its_members(figures):
    members = [dataclasses.replace(m, anatomy=None) for m in sample().members[:2]]
    bare: DepthFamilyResult = dataclasses.replace(sample(), members=members, fit=None, anatomy_by_depth=[],
                                                  partial=True)
    fig = figures.figure_for(bare)
    assert fig.axes[0].get_title() == "no exponent fitted (fewer than three depths finished)"
    assert "partial" in fig._suptitle.get_text()
    assert len([line for line in fig.axes[1].get_lines() if line.get_marker() == "."]) == 2
    assert all(not ax.containers for ax in fig.axes[2:])


def test_an_interval_past_what_a_share_can_take_is_drawn_within_it(figures):
    """Two members' t interval of a share can run from -0.96 to 2.21 (a real CPU family's depth 4):
    the bar stops at 0 and 1."""
    rows = [dataclasses.replace(row, redundant_share=0.625, redundant_share_ci=[-0.96, 2.21])
            for row in sample().anatomy_by_depth]
    fig = figures.figure_for(dataclasses.replace(sample(), anatomy_by_depth=rows))
    (bars,) = fig.axes[2].containers
    spans = [segment[:, 1] for segment in bars.lines[2][0].get_segments()]
    assert [(min(s), max(s)) for s in spans] == [(0.0, 1.0)] * 4
