"""The publication figures (figures/): every registry row's sample draws, with the axes labels and
the number of series its result holds; classes read in greyscale (hatches and markers differ);
save_figure writes PNG (>= 150 dpi), SVG and PDF; the engine imports no matplotlib."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from engine import registry
from engine.atlas import table as A
from engine.core.codec import ABSENT, json_safe
from engine.core.errors import UserError
from engine.data.eval_data import EvalProtocol
from engine.evaluation.accuracy import TaskScore
from engine.experiments.ablation import vocabulary as ablation
from engine.experiments.prune import vocabulary as prune

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.report  # matplotlib: CI fails a skip (tests/required_skips.py)


@pytest.fixture
def figures() -> ModuleType:
    """figures/ (matplotlib), imported by the test that needs it: the module collects without it."""
    pytest.importorskip("matplotlib")
    import figures

    return figures


@pytest.fixture
def style(figures: ModuleType) -> ModuleType:
    from figures import style

    return style


def labels(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def bars(ax) -> list[Any]:
    """The bars drawn (by bar or barh; not the shaded spans)."""
    from matplotlib.container import BarContainer

    return [p for c in ax.containers if isinstance(c, BarContainer) for p in c]


def points(ax) -> list[Any]:
    """The scatter series drawn."""
    from matplotlib.collections import PathCollection

    return [c for c in ax.collections if isinstance(c, PathCollection)]


def drawn(fig: Any) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3]


def atlas_sample() -> A.AtlasDocument:
    rows = A.rows_of("tiny", A.MAIN, "s1", {"ablation": json_safe(ablation.sample())})
    other = dataclasses.replace(ablation.sample(), model="wider")
    rows += A.rows_of("wider", A.MAIN, "s2", {"ablation": json_safe(other)})
    return A.build("demo", ["tiny", "wider"], ["map", "proxies"], {}, {A.MAIN: {}}, rows)


PROTOCOL = EvalProtocol(dataset="builtin:full", config=None, split=None, revision=None, text_column=None,
                        protocol="texts", context=256, stride=None, windows=4, tokens=100)


def proxy_sample() -> ablation.AblationProxyMap:
    full = ablation.sample()
    rows: list[ablation.ProxyRow] = []
    for r in full.layers:
        assert r.block_influence is not None and r.angular_distance is not None  # the sample measures both
        rows.append(ablation.ProxyRow(layer=r.layer, block_influence=r.block_influence,
                                      angular_distance=r.angular_distance, angular_last_token=2 * r.angular_distance))
    return ablation.AblationProxyMap(model="tiny", baseline_ppl=20.0, eval_tokens=100, eval_texts=4, seconds=1.0,
                                     settings=full.settings, layers=rows, protocol=PROTOCOL,
                                     angular_blocks={}, angular_block_best={})


def with_accuracy() -> prune.PruneResult:
    """The prune sample with lm-eval scores on every cut (falling as layers go) and on the full model."""
    sample = prune.sample()

    def scores(acc: float) -> list[TaskScore]:
        return [TaskScore(task="tiny_qa", acc=acc, acc_stderr=0.05, acc_norm=None, acc_norm_stderr=None, samples=80,
                          metrics={})]

    curve = [dataclasses.replace(cut, accuracy=scores(0.6 - 0.05 * cut.removed)) for cut in sample.curve]
    return dataclasses.replace(sample, curve=curve, baseline_accuracy=scores(0.6))


def sample_of(name: str) -> Any:
    """The experiment's own sample (its vocabulary's `sample()`, through its registry row)."""
    return registry.experiment(name).sample()


def test_every_registry_row_draws_in_the_papers_widths(figures, style):
    """Its figure module and its panels are the contract's (tests/test_contract.py); here, that it
    draws something, a column or a page wide."""
    for entry in registry.EXPERIMENTS:
        fig = figures.figure_for(entry.sample())
        pixels = drawn(fig)
        assert (pixels < 200).any(axis=-1).mean() > 0.01, f"{entry.name}: nothing drawn"
        assert fig.get_figwidth() in (style.COLUMN, style.PAGE)


def test_ablation_map(figures, style):
    fig = figures.figure_for(ablation.sample())
    top, bi, angular = fig.axes
    assert (top.get_xlabel(), top.get_ylabel()) == ("layer", "D (%)")
    assert top.get_yscale() == "symlog"
    assert len(bars(top)) == 6  # one bar a layer
    assert "anti-layer" in labels(top) and {"critical", "important", "minor", "redundant"} <= set(labels(top))
    stars = [line for line in top.get_lines() if line.get_marker() == style.ANTI_LOOK.marker]
    assert len(stars) == 1 and list(stars[0].get_xdata()) == [4]  # layer 4 is the anti-layer
    assert len(top.containers) == 7  # six bars and the interval's error bars
    assert bi.get_xlabel() == "Block Influence" and angular.get_xlabel() == "angular distance"
    assert bi.get_title() == "Spearman ρ = 0.50"
    scatters = points(bi)
    assert sum(len(c.get_offsets()) for c in scatters) == 6 and len(scatters) == 4  # a series per class


def test_ablation_parts_side_by_side(figures):
    fig = figures.figure_for(ablation.sample_parts())
    titles = [ax.get_title() for ax in fig.axes]
    assert "attention blocks" in titles and "MLP blocks" in titles
    attention, mlp = (fig.axes[titles.index(t)] for t in ("attention blocks", "MLP blocks"))
    assert len(bars(attention)) == 6 and len(bars(mlp)) == 6
    assert attention.get_position().y0 == pytest.approx(mlp.get_position().y0)  # side by side


def test_classes_read_in_greyscale(figures, style):
    """Each class (and the anti-layer) differs in hatch and marker, not only in colour; the bars drawn
    carry their class's hatch, and the proxies' points their class's marker."""
    looks = [*style.CLASS_LOOK.values(), style.ANTI_LOOK]
    assert len({look.hatch for look in looks}) == len(looks)
    assert len({look.marker for look in looks}) == len(looks)
    fig = figures.figure_for(ablation.sample())
    top, bi, _ = fig.axes
    hatches = [bar.get_hatch() or "" for bar in bars(top)]
    expected = [style.ANTI_LOOK.hatch if r.anti else style.class_look(r.layer_class).hatch
                for r in ablation.sample().layers]
    assert hatches == expected
    markers = {c.get_label(): c.get_paths()[0] for c in points(bi)}
    assert len({tuple(map(tuple, p.vertices.round(3))) for p in markers.values()}) == len(markers)
    lines = [style.series(i) for i in range(8)]
    assert len({s["marker"] for s in lines}) == 8 and len({str(s["linestyle"]) for s in lines}) == 8


def test_recovery_curves_and_thresholds(figures):
    fig = figures.figure_for(sample_of("recovery"))
    curves, difficulty = fig.axes
    assert labels(curves) == ["layer 1", "layer 3"]
    assert curves.get_ylabel() == "PPL / baseline" and curves.get_yscale() == "log"
    flat = sorted(line.get_ydata()[0] for line in curves.get_lines() if len(set(line.get_ydata())) == 1)
    assert flat == [1.1, 1.5, 2.0]
    assert curves.get_lines()[0].get_ydata()[0] == pytest.approx(4.0)  # 80 / 20
    assert [b.get_height() for b in bars(difficulty)] == [40.0, 10.0]
    # a layer that never got below 1.1x has the budget as its bar: a lower bound, and said so
    notes = [t.get_text() for t in difficulty.texts]
    reached = [row.steps_to.get("1.1") is not None for row in sample_of("recovery").layers]
    assert len(notes) == reached.count(False) and all("not reached" in note for note in notes)


def test_growth_phases_and_widths(figures):
    sample = sample_of("growth")
    fig = figures.figure_for(sample)
    grown, flat, losses = fig.axes
    shaded = [p for p in grown.patches if p not in bars(grown)]
    assert [(p.get_x(), p.get_width()) for p in shaded] == [(0, 10), (10, 10), (20, 10)]  # the three phases
    layer_bars = bars(grown)
    assert len(layer_bars) == sum(len(p["layers"]) for p in sample.phases)  # 2 + 4 + 6
    thickness = {round(b.get_y() + b.get_height() / 2): b.get_height() for b in layer_bars}
    widest = max(sample.widths.growth)
    for layer, width in enumerate(sample.widths.growth):
        assert thickness[layer] == pytest.approx(0.85 * width / widest)  # drawn as wide as its FFN
    assert len(bars(flat)) == 6 and flat.get_xlabel() == "optimizer step"
    assert labels(losses) == ["growth_100", "uniform_100"] and losses.get_ylabel() == "validation loss"
    curves = [line for line in losses.get_lines() if len(line.get_xdata()) > 1]
    assert [list(line.get_xdata()) for line in curves] == [[10, 20, 30]] * 2
    assert [list(line.get_ydata()) for line in curves] == [[2.2, 1.6, 1.2], [2.5, 1.9, 1.5]]
    assert losses.get_shared_x_axes().joined(losses, grown)  # the loss under the phase that made it


def test_growth_of_an_older_result_shows_the_final_losses(figures):
    sample = sample_of("growth")
    old = dataclasses.replace(sample, arms={name: dataclasses.replace(arm, curve=ABSENT)
                                            for name, arm in sample.arms.items()})
    losses = figures.figure_for(old).axes[2]
    assert [b.get_height() for b in bars(losses)] == [1.2, 1.5]


def test_dynamics_angles_and_pca(figures):
    fig = figures.figure_for(sample_of("dynamics"))
    angles, pca = fig.axes
    assert len(labels(angles)) == 4 and labels(angles)[-1] == "core layers"  # three angles, the core shaded
    assert angles.get_ylabel() == "angle (degrees)"
    assert pca.get_xlabel() == "PC1 (60%)" and pca.get_ylabel() == "PC2 (20%)"
    assert labels(pca) == ["cluster 0 (bulk)", "cluster 1"]
    assert [len(c.get_offsets()) for c in pca.collections] == [30, 10]


def test_scaling_fit_with_interval_and_data(figures):
    fig = figures.figure_for(sample_of("scaling-fit"))
    depth, profile = fig.axes
    assert depth.get_xlabel() == "depth l (layers)" and depth.get_xscale() == "log"
    assert len(depth.collections[0].get_offsets()) == 8
    assert any("a_l 95 % [0.22, 0.41]" in label for label in labels(depth))
    assert profile.get_xlabel() == "a_l (held)" and len(profile.get_lines()[0].get_xdata()) == 21


def test_toy_depth_regimes(figures):
    fig = figures.figure_for(sample_of("toy-depth"))
    (ax,) = fig.axes
    assert labels(ax) == ["compositional: a_l = 0.90 [0.80, 1.00]", "ensemble: a_l = 0.40 [0.30, 0.50]"]
    assert ax.get_xlabel() == "student depth l" and ax.get_xscale() == ax.get_yscale() == "log"


def test_prune_curves_one_line_per_criterion(figures):
    fig = figures.figure_for(sample_of("prune"))
    assert len(fig.axes) == 1
    (ax,) = fig.axes
    assert labels(ax) == ["angular", "bi", "ppl"] and ax.get_ylabel() == "perplexity"
    assert ax.get_xlabel() == "layers removed"
    assert [list(line.get_xdata()) for line in ax.get_lines()[:3]] == [[0, 1, 2, 3, 4]] * 3  # the full model at 0


def test_prune_accuracy_panel(figures):
    fig = figures.figure_for(with_accuracy())
    ppl, accuracy = (ax for ax in fig.axes if ax.get_ylabel())
    assert accuracy.get_ylabel() == "mean accuracy" and labels(ppl) == ["angular", "bi", "ppl"]
    line = accuracy.get_lines()[0]
    assert list(line.get_ydata()) == pytest.approx([0.6, 0.55, 0.5, 0.45, 0.4])


def test_weights_and_the_nulls(figures):
    fig = figures.figure_for(sample_of("weights"))
    r2, delta, paradox = fig.axes
    assert labels(r2) == ["model", "shuffled null", "independent null"]
    assert len(bars(r2)) == 6  # two matrices x three
    assert delta.get_ylabel() == "corr(ΔW_l, ΔW_l+1)" and len(bars(delta)) == 6
    assert list(paradox.get_lines()[0].get_xdata()) == [1, 3]


def test_evaluate_bars(figures):
    sample = sample_of("evaluate")
    fig = figures.figure_for(sample)
    scores, generation = fig.axes
    assert labels(scores) == [m.label for m in sample.models]
    assert [t.get_text() for t in scores.get_xticklabels()] == ["everyday_sense", "tiny_qa"]
    assert len(bars(scores)) == 2 * len(sample.models) and scores.get_ylabel() == "accuracy"
    assert len(bars(generation)) == len([m for m in sample.models if m.generation is not None]) == 2


def test_manipulate_strategies(figures):
    fig = figures.figure_for(sample_of("manipulate"))
    (ax,) = fig.axes
    assert labels(ax) == ["scale", "svd", "zero", "mean"]
    assert [b.get_width() for b in bars(ax)] == [2.5, 11.0, 40.0, -1.5]
    assert ax.get_xlabel() == "D (%)" and ax.get_xscale() == "symlog"
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "scale α=0.5 · L3"


def test_proxies_only_map(figures):
    fig = figures.figure_for(proxy_sample())
    (ax,) = fig.axes
    assert labels(ax) == ["Block Influence", "angular distance", "angular distance\n(last token)"]


def test_atlas_profiles_on_relative_depth(figures):
    fig = figures.figure_for(atlas_sample())
    criteria = ["d_pct", "block_influence", "angular_distance"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["D (%)", "Block Influence", "angular distance"][: len(criteria)]
    for ax in fig.axes:
        assert ax.get_xlabel() == "relative depth" and labels(ax) == ["tiny", "wider"]
        assert max(ax.get_lines()[0].get_xdata()) == pytest.approx(1.0)


def test_save_figure_writes_each_format(tmp_path, figures):
    from PIL import Image

    paths = figures.save_figure(ablation.sample(), tmp_path / "map.v1")
    assert [p.name for p in paths] == ["map.v1.png", "map.v1.svg", "map.v1.pdf"]
    image = Image.open(paths[0])
    assert image.info["dpi"][0] >= 150 and image.width >= 150 * 3
    assert paths[1].read_text().lstrip().startswith("<?xml") and paths[2].read_bytes().startswith(b"%PDF")
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_input_is_one_line(tmp_path, figures):
    with pytest.raises(UserError, match="unknown figure format gif"):
        figures.save_figure(ablation.sample(), tmp_path / "x", ("png", "gif"))
    with pytest.raises(UserError, match="no figure for a dict"):
        figures.figure_for({"name": "ablation"})


def test_a_figure_draws_without_a_display_and_the_engine_imports_no_matplotlib(figures):
    code = ("import sys, engine.registry, engine.atlas.table; assert 'matplotlib' not in sys.modules; "
            "import figures; from matplotlib.backends.backend_agg import FigureCanvasAgg; "
            "fig = figures.figure_for(engine.registry.BY_NAME['prune'].sample()); "
            "assert isinstance(fig.canvas, FigureCanvasAgg) and 'matplotlib.pyplot' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_a_notebook_shows_the_figure_as_png(figures):
    assert figures.figure_for(sample_of("toy-depth"))._repr_png_().startswith(b"\x89PNG")


def test_svg_keeps_text_as_text(tmp_path, figures):
    (svg,) = figures.save_figure(sample_of("recovery"), tmp_path / "recovery", ("svg",))
    assert "fine-tuning step" in svg.read_text()


BASELINES = Path(__file__).parent / "baseline_images"
STABLE = ("ablation", "recovery", "growth", "prune")  # drawn from fixed samples: the same pixels every run


@pytest.mark.parametrize("name", STABLE)
def test_a_figure_looks_as_its_baseline_image(name, tmp_path, figures, style):
    """The pixels, not only the artists: a change of style, layout or colour shows here. After an
    intended change, `ANATOMY_TUI_NEW_BASELINES=1 pytest tests/test_figures.py -k baseline` rewrites
    them (look at the new images before committing)."""
    import matplotlib
    from matplotlib.testing.compare import compare_images

    drawn_now = tmp_path / f"{name}.png"
    with matplotlib.rc_context(style.RC):
        figures.figure_for(sample_of(name)).savefig(drawn_now, dpi=100)
    baseline = BASELINES / f"{name}.png"
    if os.environ.get("ANATOMY_TUI_NEW_BASELINES"):
        BASELINES.mkdir(exist_ok=True)
        shutil.copyfile(drawn_now, baseline)
    assert compare_images(str(baseline), str(drawn_now), tol=2.0) is None
