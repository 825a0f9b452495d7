"""The Analyses views drawn from result documents: every plot's legend in the colour its curve is
drawn in, and each view's plot and summary present (or the line that says how to fill it)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from rich.color import Color as RichColor
from rich.console import Console
from textual.color import Color
from tui_fixtures import (
    SCALING,
    analyses_session,
    dynamics_doc,
    prune_doc,
    scaling_fit_doc,
)

from engine.experiments.dynamics.vocabulary import DynamicsResult
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.scaling_fit.vocabulary import ScalingFitResult
from engine.registry import experiment
from sessions.store import SessionStore
from tui.app import AnatomyApp
from tui.screens import console_panes
from tui.views import analyses, decoded, dynamics, prune, toy_depth, view
from tui.views.dynamics import scatter_curves
from tui.views.scaling_fit import depth_curves
from tui.widgets import curve_plot
from tui.widgets.curve_plot import Curve, CurvePlot, colour_code
from tui.widgets.result_view import _summarised

ANSI = re.compile(r"\x1b\[38;5;(\d+)m")


def drawn_codes(plot: CurvePlot) -> set[int]:
    plot.plt.plotsize(30, 8)
    return {int(code) for code in ANSI.findall(plot.plt.build())}


def every_colour() -> set[curve_plot.PlotColour]:
    """The colours the console hands plotext, wherever they are named."""
    return {*curve_plot.REFERENCE_COLOURS, *console_panes.CURVE_COLOURS, *console_panes.ARM_COLOURS.values(),
            *prune.METHOD_COLOURS.values(), *toy_depth.REGIME_COLOURS,
            *toy_depth.FIT_COLOURS, *dynamics.CLUSTER_COLOURS}  # fmt: skip


@pytest.mark.parametrize("colour", sorted(every_colour(), key=str))
def test_the_legend_shows_a_curve_in_the_colour_plotext_draws_it(colour) -> None:
    empty = CurvePlot()
    empty.draw([Curve("x", [(0.0, 0.0)], "black")])  # the axes alone (black is the axes' colour)
    plot = CurvePlot()
    plot.draw([Curve("c", [(0.0, 0.0), (1.0, 1.0)], colour)])
    (drawn,) = drawn_codes(plot) - drawn_codes(empty)
    (legend,) = re.findall(r"\[([^\]/]+)\]━━", str(plot.border_subtitle))
    assert legend == Color.from_rich_color(RichColor.from_ansi(drawn)).css


def test_a_colour_plotext_does_not_know_is_refused() -> None:
    """plotext has no "yellow": it drew such a curve in its next theme colour (blue) under a yellow legend."""
    with pytest.raises(ValueError, match="yellow"):
        colour_code("yellow")
    with pytest.raises(ValueError):
        CurvePlot().draw([Curve("c", [(0.0, 1.0)], "yellow")])


# --- the views ------------------------------------------------------------------------------------


def text_of(renderable) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_depth_curves_are_the_runs_depth_part_and_the_fitted_depth_term() -> None:
    doc = scaling_fit_doc()
    runs, line = depth_curves(ScalingFitResult.from_json(doc))
    assert runs.scatter and [x for x, _ in runs.points] == doc["depth_points"]["depth"]
    for (depth, part), loss, rest in zip(runs.points, doc["depth_points"]["loss"], doc["depth_points"]["rest"],
                                         strict=True):
        assert part == pytest.approx(loss - rest)
        assert part == pytest.approx(SCALING["c_l"] / depth ** SCALING["alpha_l"], rel=0.021)
    assert line.points[0][0] == 2.0 and line.points[-1][0] == pytest.approx(48.0)
    assert all(y == pytest.approx(2.0 / x**0.3) for x, y in line.points) and "a_l = 0.3" in line.label


def test_scatter_curves_colour_each_cluster_and_name_its_size() -> None:
    curves = scatter_curves(DynamicsResult.from_json(dynamics_doc()))
    assert [c.label for c in curves] == ["bulk (900 tokens)", "cluster 1 (100 tokens)"]
    assert [len(c.points) for c in curves] == [30, 10] and len({c.colour for c in curves}) == 2
    assert all(c.scatter for c in curves) and (6.0, 3.0) in curves[1].points


@pytest.mark.parametrize("name, module", analyses(), ids=[name for name, _ in analyses()])
def test_every_analysis_has_a_summary_not_the_raw_tree(name: str, module) -> None:
    """Every analysis draws its experiment's sample (the vocabulary's, from the registry row) as a
    table: a new experiment is covered without this file changing."""
    text = text_of(module.summary(experiment(name).sample(), "CMD"))
    assert "{'" not in text and "CMD" not in text  # a table, not the document; nothing missing


def view_of(name: str) -> ModuleType:
    """Experiment `name`'s analysis view, which it has."""
    module = view(name)
    assert module is not None, name
    return module


def summary_of(name: str) -> str:
    """The Analyses summary of experiment `name`'s sample, as text."""
    return text_of(view_of(name).summary(experiment(name).sample(), "CMD"))


def test_the_scaling_fit_summary_gives_the_depth_exponent_with_both_intervals() -> None:
    text = summary_of("scaling-fit")
    assert all(part in text for part in ["depth l", "0.300", "[0.220, 0.410]", "[0.240, 0.370]"]), text


def test_the_toy_depth_summary_gives_each_regimes_exponent_and_depths() -> None:
    text = summary_of("toy-depth")
    assert all(part in text for part in ["compositional", "0.90", "[0.80, 1.00]", "l=16"]), text


def test_the_prune_summary_gives_the_cuts_the_depth_law_and_the_agreement() -> None:
    text = summary_of("prune")
    assert all(part in text for part in ["101.25 (0-3)", "a = 1.10 [0.70, 1.60]", "bi 0.80"]), text


def test_the_dynamics_summary_names_the_bulk_and_its_examples() -> None:
    text = summary_of("dynamics")
    assert all(part in text for part in ["bulk", "900", "of [the] city"]), text


def test_the_weights_summary_sets_each_fit_beside_its_nulls() -> None:
    text = summary_of("weights")
    assert all(part in text for part in ["attn.q", "0.900 / 0.700 / 0.300", "0.600 / 0.300 / -0.100"]), text


def test_the_manipulate_summary_gives_each_strategy_and_its_sample() -> None:
    text = summary_of("manipulate")
    assert all(part in text for part in ["svd", "+11.0", "The capital of France is Paris (zero)"]), text


def test_the_evaluate_summary_sets_variants_side_by_side_with_their_errors() -> None:
    text = summary_of("evaluate")
    assert all(part in text for part in ["pruned -2,3", "45.0 ± 5.6 / 40.0 (-15.0)", "25 % / 40 %",
                                         "batch size 1"]), text


def test_results_written_before_the_plot_data_say_which_command_fills_them() -> None:
    old_dynamics = dynamics_doc()
    del old_dynamics["pca"]["sample"]
    for name, doc in (("scaling-fit", scaling_fit_doc(with_points=False)), ("dynamics", old_dynamics)):
        result = experiment(name).result_class.from_json(doc)
        text = text_of(view_of(name).summary(result, "anatomy-tui run X --session s"))
        assert "run:  anatomy-tui run X --session s" in text


def test_a_result_that_does_not_fit_its_class_is_a_tree_and_no_plot() -> None:
    """A damaged result (or one of another version) reads as none for the plots and as the raw tree
    in the summary's place, never as a traceback in the console."""
    damaged = {"model": "tiny", "curve": [{"method": "bi"}]}
    assert decoded(PruneResult, damaged) is None and decoded(PruneResult, None) is None
    assert _summarised(damaged, "CMD", prune.summary, PruneResult) is None
    assert decoded(PruneResult, prune_doc()) == PruneResult.from_json(prune_doc())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_analyses_pane_draws_each_view_and_hides_what_a_result_cannot_fill(isolated_home) -> None:
    session = analyses_session(SessionStore())
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        screen = app.screen
        for plot in ("#scaling-depth-plot", "#scaling-plot", "#cluster-plot", "#toy-plot", "#prune-plot"):
            assert screen.query_one(plot).display, plot
        assert "fit c_l/l^a_l" in str(screen.query_one("#scaling-depth-plot").border_subtitle)
        session.save_result("scaling-fit", scaling_fit_doc(with_points=False))
        old = dynamics_doc()
        del old["pca"]["sample"]
        session.save_result("dynamics", old)
        for name in ("scaling-fit", "dynamics"):
            saved = session.load_result(name)
            assert saved is not None
            app.state.set_result(name, saved)
        app.redraw({"results"})
        await pilot.pause()
        assert not screen.query_one("#scaling-depth-plot").display and screen.query_one("#scaling-plot").display
        assert not screen.query_one("#cluster-plot").display and screen.query_one("#angle-plot").display


@pytest.mark.anyio
async def test_the_two_scaling_plots_stand_side_by_side_when_wide_and_stack_when_narrow(isolated_home) -> None:
    analyses_session(SessionStore())
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        depth, profile = app.screen.query_one("#scaling-depth-plot"), app.screen.query_one("#scaling-plot")
        assert depth.region.y == profile.region.y and depth.region.right <= profile.region.x
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert depth.region.x == profile.region.x and depth.region.bottom <= profile.region.y
        assert profile.region.width > 70  # each at the pane's full width
