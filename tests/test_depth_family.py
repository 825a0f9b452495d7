"""The depth family (engine/experiments/depth_family/): the recipe's schedule, a member's resumed
training against an uninterrupted one, a killed family resumed, the depth fit on synthetic families
of known exponent, the CSV read by scaling-fit, the anatomy's intervals, and the one-line refusals
before any training."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.core.errors import UserError
from engine.core.events import Cancelled, CancelToken, Result
from engine.experiments.depth_family.anatomy import anatomy_by_depth
from engine.experiments.depth_family.fit import csv_text, depth_fit, write_csv
from engine.experiments.depth_family.members import learning_rate, member_config, train_member
from engine.experiments.depth_family.run import run_family
from engine.experiments.depth_family.text import family_text
from engine.experiments.depth_family.vocabulary import (
    DepthFamilyResult,
    DepthFamilySettings,
    MemberDone,
    MemberSpec,
    MemberStep,
    sample,
)

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("layer", "depth", "model", "token", "the", "of", "a", "residual", "stream", "angle", "loss", "fit")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small text, one line a paragraph (every tenth held out)."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)) + "\n")
    return path


def micro(corpus: Path, **changes: Any) -> DepthFamilySettings:
    """Three depths of a 16-wide family, 12 steps a member: seconds on a CPU."""
    base = DepthFamilySettings(depths=(1, 2, 3), widths=(16,), tokens=(4 * 16 * 12,), seeds=(0,), heads=2,
                               context=16, batch_size=4, eval_every=4, eval_windows=4, anatomy_texts=4,
                               checkpoint_every=5, bootstrap=50, corpus=str(corpus), device="cpu", dtype="float32")
    return dataclasses.replace(base, **changes)


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_zero():
    # 100 steps, 10 % warm-up, peak 1: worked out by hand
    assert learning_rate(0, 100, 1.0, 0.1) == pytest.approx(0.1)
    assert learning_rate(9, 100, 1.0, 0.1) == pytest.approx(1.0)
    assert learning_rate(10, 100, 1.0, 0.1) == pytest.approx(1.0)  # the cosine's top
    assert learning_rate(55, 100, 1.0, 0.1) == pytest.approx(0.5)  # halfway through the decay
    assert learning_rate(100, 100, 1.0, 0.1) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(0, 100, 2.0, 0.0) == pytest.approx(2.0)  # no warm-up


def test_the_grid_trains_every_cell_and_seed_once():
    settings = DepthFamilySettings(depths=(4, 1, 2), widths=(32, 16), tokens=(100,), seeds=(0, 1))
    names = [m.name for m in settings.members()]
    assert len(names) == len(set(names)) == 3 * 2 * 2
    assert names[0] == "l1-w16-t100-s0"


def test_a_resumed_member_ends_where_an_uninterrupted_one_ends(corpus: Path, tmp_path: Path):
    settings = micro(corpus)
    text = family_text(settings)
    spec = MemberSpec(depth=2, width=16, tokens=settings.tokens[0], seed=3)
    config = member_config(settings, spec, text.vocab_size, None)

    def finished(events: Any) -> Any:
        while True:
            try:
                next(events)
            except StopIteration as stop:
                return stop.value

    straight = finished(train_member(spec, settings, text, config))
    token, folder = CancelToken(), tmp_path / spec.name
    folder.mkdir()
    with pytest.raises(Cancelled):
        for event in train_member(spec, settings, text, config, token, folder):
            if isinstance(event, MemberStep) and event.step == 8:
                token.cancel()  # killed at step 8: the last checkpoint is step 5's
    resumed = finished(train_member(spec, settings, text, config, None, folder, resume=True))
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.curve == straight.curve and resumed.heldout_loss == straight.heldout_loss


def _numbers(result: Any) -> dict[str, Any]:
    assert isinstance(result, Result)
    doc = DepthFamilyResult.from_json(result.data)
    assert doc.fit is not None
    return {"losses": [(m.name, m.heldout_loss, m.curve) for m in doc.members], "a": doc.fit.alpha_l,
            "maps": [m.anatomy for m in doc.members]}


def test_a_killed_family_resumes_with_its_finished_members_kept(corpus: Path, tmp_path: Path):
    settings = micro(corpus)
    straight = [e for e in run_family(settings) if isinstance(e, Result)][-1]
    folder, token = tmp_path / "family", CancelToken()
    events: list[Any] = []
    with pytest.raises(Cancelled):
        for event in run_family(settings, token, folder):
            events.append(event)
            if isinstance(event, MemberDone):
                token.cancel()
    partial = DepthFamilyResult.from_json(next(e for e in events if isinstance(e, Result)).data)
    assert partial.partial is True and [m.depth for m in partial.members] == [1]
    again = list(run_family(settings, None, folder, resume=True))
    retrained = {e.member for e in again if isinstance(e, MemberStep)}
    assert retrained == {"l2-w16-t768-s0", "l3-w16-t768-s0"}  # the finished member was restored
    assert _numbers(again[-1]) == _numbers(straight)
    with pytest.raises(UserError, match="resume with the same settings"):
        list(run_family(dataclasses.replace(settings, lr=1e-3), None, folder, resume=True))
    rows = (folder / "family.csv").read_text().splitlines()
    assert rows[0].startswith("loss,d_model,n_layers,num_tokens") and len(rows) == 4


def test_the_family_csv_is_what_scaling_fit_reads(tmp_path: Path):
    from engine.experiments.scaling_fit.runs import load_runs
    from engine.experiments.scaling_fit.vocabulary import ScalingFitSettings

    members = sample().members
    write_csv(tmp_path / "family.csv", members)
    runs = load_runs(tmp_path / "family.csv", ScalingFitSettings())  # scaling-fit's default columns
    assert runs.loss.tolist() == [m.heldout_loss for m in members]
    assert runs.depth.tolist() == [m.depth for m in members] and runs.width.tolist() == [64.0] * 8
    assert csv_text(members).count("\n") == 9


@pytest.mark.parametrize("alpha", [1.0, 3.0])
def test_a_synthetic_family_recovers_its_exponent_within_the_interval(alpha: float):
    rng = np.random.default_rng(7)
    depths = np.repeat([1, 2, 4, 8, 16], 3)  # three seeds a depth
    losses = 2.0 + 1.5 / depths**alpha * (1 + 0.01 * rng.standard_normal(len(depths)))
    fit = depth_fit(depths.tolist(), losses.tolist(), 1000, 64, 1000)
    assert fit is not None and fit.ci95 is not None
    assert fit.ci95[0] <= alpha <= fit.ci95[1] and fit.ci95[1] - fit.ci95[0] < 0.3
    assert fit.alpha_l == pytest.approx(alpha, abs=0.1) and fit.L0 == pytest.approx(2.0, abs=0.02)
    assert not fit.weakly_identified
    assert [p.depth for p in fit.loo] == [1, 2, 4, 8, 16] and fit.loo_rmse is not None and fit.loo_rmse < 0.05
    assert [r.alpha_l for r in fit.references] == [1.2, 1.0, 3.0]


def test_an_exact_law_predicts_each_left_out_depth():
    depths = [2, 3, 4, 6, 8]
    fit = depth_fit(depths, [1.0 + 4.0 / d**1.5 for d in depths], 0, 64, 1000)
    assert fit is not None and fit.alpha_l == pytest.approx(1.5)
    inner = [p for p in fit.loo if p.depth in (3, 4, 6)]  # interior depths: interpolated
    assert all(p.error is not None and abs(p.error) < 1e-3 for p in inner)
    assert fit.flat_range[0] <= 1.5 <= fit.flat_range[1]
    assert fit.ci95 is None and fit.weakly_identified  # no bootstrap: no interval to trust


def test_a_flat_family_is_reported_weakly_identified():
    rng = np.random.default_rng(0)
    depths = np.repeat([1, 2, 4, 8], 2)
    losses = 3.0 + 0.02 * rng.standard_normal(len(depths))  # depth does nothing
    fit = depth_fit(depths.tolist(), losses.tolist(), 200, 64, 1000)
    assert fit is not None and fit.weakly_identified
    assert depth_fit([1, 2, 1, 2], [3.0, 2.0, 3.1, 2.1], 10, 64, 1000) is None  # two depths: no exponent


def test_anatomy_by_depth_has_student_t_intervals_over_members():
    members = sample().members  # depths 1, 2, 4, 8, two seeds each
    rows = {row.depth: row for row in anatomy_by_depth(members)}
    anatomies = [m.anatomy for m in members if m.depth == 8]
    assert all(a is not None for a in anatomies)
    angles = [a.mean_angle for a in anatomies if a is not None]
    assert angles[0] == angles[1]  # the sample's two seeds share their angles: a zero-width interval
    assert rows[8].mean_angle_ci == pytest.approx([angles[0], angles[0]])
    # layers 3..7 of the depth-8 sample are redundant: 5 of 8; no consecutive pair at depth 1
    assert rows[8].redundant_share == pytest.approx(5 / 8) and rows[1].neighbour_similarity is None
    # two values 0.2 and 0.4: mean 0.3, sd 0.1414, t(0.975, 1) = 12.706: half-width 1.2706
    from engine.experiments.depth_family.anatomy import mean_interval

    mean, ci = mean_interval([0.2, 0.4], (-10.0, 10.0))
    assert mean == pytest.approx(0.3) and ci == pytest.approx([0.3 - 1.2706, 0.3 + 1.2706], abs=1e-3)
    # a share's interval stays within [0, 1]: the same half-width cut at the bounds
    assert mean_interval([0.2, 0.4], (0.0, 1.0))[1] == pytest.approx([0.0, 1.0])


def test_each_member_gets_its_map_and_angles(corpus: Path):
    result = [e for e in run_family(micro(corpus, depths=(1, 2, 4))) if isinstance(e, Result)][-1]
    doc = DepthFamilyResult.from_json(result.data)
    for member in doc.members:
        anatomy = member.anatomy
        assert anatomy is not None and [row.layer for row in anatomy.map] == list(range(member.depth))
        assert len(anatomy.angle_state) == member.depth and len(anatomy.angle_update) == member.depth - 1
        assert all(0 < (a or 0) < 180 for a in anatomy.angle_state)
        assert anatomy.redundant_share == sum(r.layer_class == "redundant" for r in anatomy.map) / member.depth
        assert math.isfinite(anatomy.baseline_ppl) and anatomy.baseline_ppl == pytest.approx(
            math.exp(member.heldout_loss), rel=0.05)  # the same held-out windows, a subset of them
    assert [row.depth for row in doc.anatomy_by_depth] == [1, 2, 4]
    assert doc.recipe.optimizer.startswith("AdamW") and "cosine" in doc.recipe.schedule


def _run_cli(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "run", "depth-family", *args], cwd=ROOT, text=True,
                          capture_output=True, env={"ANATOMY_TUI_HOME": str(home), "PATH": "/usr/bin:/bin"},
                          timeout=300)


def test_fewer_than_three_depths_is_one_line(tmp_path: Path):
    done = _run_cli(["--depths", "1,2", "--session", "s"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "anatomy-tui: error: --depths needs at least three different depths to fit an exponent (got 1,2); "
        "e.g. --depths 1,2,4,8"]


def test_a_corpus_too_small_is_one_line_before_any_training(tmp_path: Path):
    small = tmp_path / "small.txt"
    small.write_text("\n".join(f"line {i} of a short text" for i in range(30)) + "\n")
    done = _run_cli(["--corpus", str(small), "--session", "s", "--tokens", "1000"], tmp_path / "home")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "held-out text" in errors[0] and "--eval-windows" in errors[0]
    assert "Traceback" not in done.stderr and "members 1/" not in done.stderr


def test_a_budget_over_the_training_text_and_a_plan_over_max_hours_are_refused(corpus: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(UserError, match="fewer than the largest --tokens 1000000"):
        next(e for e in run_family(micro(corpus, tokens=(1_000_000,))) if isinstance(e, MemberStep))
    with pytest.raises(UserError, match="over --max-hours"):
        next(e for e in run_family(micro(corpus, max_hours=1e-9)) if isinstance(e, MemberStep))
    import engine.experiments.depth_family.members as members

    monkeypatch.setattr(members, "free_memory", lambda device: 10_000)
    with pytest.raises(UserError, match="member l1-w16-t768-s0 needs about"):
        next(e for e in run_family(micro(corpus)) if isinstance(e, MemberStep))


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_a_model_s_config_and_tokenizer_make_the_family(corpus: Path, tmp_path: Path, family: str):
    """--model: its architecture resized to each member (head size, key-value heads and the per-layer
    pattern follow the width and depth), its tokenizer for every member."""
    from tiny_models import save_tiny

    folder = save_tiny(tmp_path / family, family)
    settings = micro(corpus, base_model=str(folder), depths=(1, 2, 3), anatomy=False, bootstrap=0)
    last = list(run_family(settings))[-1]
    assert isinstance(last, Result)
    doc = DepthFamilyResult.from_json(last.data)
    assert doc.recipe.architecture == {"qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}[family]
    assert doc.recipe.tokenizer == f"{folder}'s tokenizer" and [m.depth for m in doc.members] == [1, 2, 3]
    assert all(math.isfinite(m.heldout_loss) for m in doc.members)
    assert doc.members[0].params < doc.members[1].params < doc.members[2].params


def test_the_full_law_is_fitted_where_widths_and_budgets_vary():
    from engine.experiments.depth_family.fit import full_law

    template = sample().members[0]
    grid = [(m, depth, d) for m in (32, 64, 128) for depth in (1, 2, 4, 8) for d in (1e5, 1e6)]
    members = [dataclasses.replace(template, width=m, depth=depth, tokens=int(d), name=f"l{depth}-w{m}-t{int(d)}",
                                   heldout_loss=4.0 / m**0.5 + 2.0 / depth**0.8 + 50.0 / d**0.3 + 1.5)
               for m, depth, d in grid]
    law, note = full_law(members, 0)
    assert law is not None and law.n_points == 24 and "scaling-fit" in note
    assert law.params["alpha_l"] == pytest.approx(0.8, abs=0.02)
    assert law.params["alpha_m"] == pytest.approx(0.5, abs=0.02)
    assert full_law(sample().members, 0) == (None, "one width and one token budget: the depth term alone")
