"""The depth family in the notebook API: its members as the tidy frame, and its other parts by name
(`to_pandas(result, "fit")`, `"anatomy_by_depth"`, `"members.curve"`, `"members.anatomy.map"`), each
with the sample's numbers worked out by hand; an unknown part is one line listing the real ones; its
figure through `plot`."""

from __future__ import annotations

import pytest

from anatomy_tui import InputError, plot, to_pandas
from anatomy_tui.results import typed
from engine.core.codec import json_safe
from engine.experiments.depth_family.vocabulary import sample


@pytest.fixture(scope="module")
def family():
    return typed("depth-family", "depth-family", json_safe(sample()))


def test_the_members_are_the_tidy_frame(family):
    frame = family.to_pandas()
    assert len(frame) == 8 and sorted(set(frame["depth"])) == [1, 2, 4, 8]
    seed0 = frame[frame["seed"] == 0].set_index("depth")["heldout_loss"]
    assert seed0.to_dict() == pytest.approx({d: 2.0 + 1.5 / d**1.1 * 0.99 for d in (1, 2, 4, 8)})
    assert set(frame["alpha_l"]) == {1.1}


def test_the_fit_is_one_row_and_the_anatomy_a_row_per_depth(family):
    fit = to_pandas(family, "fit")
    assert len(fit) == 1
    row = fit.iloc[0]
    assert (row["alpha_l"], row["c_l"], row["L0"], row["ci95"]) == (1.1, 1.5, 2.0, (0.9, 1.35))
    anatomy = family.to_pandas("anatomy_by_depth")
    assert anatomy["depth"].tolist() == [1, 2, 4, 8]
    assert anatomy["redundant_share"].tolist() == pytest.approx([0.0, 0.0, 0.25, 0.625])  # max(0, (d - 3) / d)
    assert family.to_pandas("fit.references")["name"].tolist()[0] == "paper B (Chinchilla runs)"


def test_each_points_row_carries_its_member(family):
    curves = family.to_pandas("members.curve")
    assert len(curves) == 8 * 3  # the sample: its first, middle and last step of each member
    first = curves[(curves["depth"] == 1) & (curves["seed"] == 0)]
    loss = 2.0 + 1.5 * 0.99
    steps = sample().members[0].steps
    assert first["step"].tolist() == [0, steps // 2, steps]
    assert first["heldout_loss"].tolist() == pytest.approx([loss + 2.1 / (1 + s / 20) for s in (0, steps // 2, steps)])
    maps = family.to_pandas("members.anatomy.map")
    assert len(maps) == 2 * (1 + 2 + 4 + 8)  # a row per layer of every member
    deepest = maps[(maps["depth"] == 8) & (maps["seed"] == 1)]
    assert deepest["layer"].tolist() == list(range(8))
    assert deepest["layer_class"].tolist() == ["critical", "important", "minor"] + ["redundant"] * 5


def test_an_unknown_part_is_one_line_naming_the_real_ones(family):
    with pytest.raises(InputError) as caught:
        family.to_pandas("members.name")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("depth-family has no table 'members.name'")
    assert "anatomy_by_depth" in message and "members.curve" in message
    with pytest.raises(InputError, match="not events"):
        to_pandas([], "fit")


def test_plot_draws_the_familys_figure(family):
    pytest.importorskip("matplotlib")
    assert [ax.get_ylabel() for ax in plot(family).axes] == [
        "held-out loss", "held-out loss", "share of redundant layers", "mean angle (degrees)", "neighbour similarity"]
