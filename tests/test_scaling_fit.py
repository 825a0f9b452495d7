"""The loss-decomposition fit: recovery of known parameters, the optimal-shape algebra, the solver
against scipy, input errors, the CLI, and the Chinchilla data shipped in the package."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from tui_fixtures import round_trips

from engine.core.codec import from_doc
from engine.core.errors import UserError
from engine.core.events import Result
from engine.evaluation import powerfit
from engine.experiments.scaling_fit.run import (
    exclude_highest,
    optimal_shape,
    profile_interval,
    run_scaling_fit,
)
from engine.experiments.scaling_fit.runs import Runs, load_runs
from engine.experiments.scaling_fit.vocabulary import DepthPoints, ScalingFitSettings, default_csv

TRUE = {"alpha_m": 0.9, "alpha_l": 1.3, "alpha_D": 0.3, "c_m": 300.0, "c_l": 6.0, "c_D": 700.0, "L0": 1.7}
FAST = ScalingFitSettings(exclude_highest=0, restarts=64, bootstrap=40, bootstrap_restarts=4,
                          heldout_splits=4)


def synthetic_runs(noise: float, seed: int = 0, n: int = 160) -> Runs:
    rng = np.random.default_rng(seed)
    m = np.exp(rng.uniform(np.log(256), np.log(8192), n))
    depth = np.round(np.exp(rng.uniform(np.log(4), np.log(96), n)))
    d = np.exp(rng.uniform(np.log(1e8), np.log(1e11), n))
    loss = (TRUE["c_m"] / m ** TRUE["alpha_m"] + TRUE["c_l"] / depth ** TRUE["alpha_l"]
            + TRUE["c_D"] / d ** TRUE["alpha_D"] + TRUE["L0"])
    loss = loss * np.exp(rng.normal(0.0, noise, n))
    return Runs(m, depth, d, loss, source="synthetic", n_rows=n)


def fit(runs: Runs, settings: ScalingFitSettings = FAST) -> dict:
    events = list(run_scaling_fit(runs, settings))
    assert isinstance(events[-1], Result) and round_trips("scaling-fit", events[-1].data)  # from ScalingFitResult
    return events[-1].data


def test_recovers_known_parameters_without_noise() -> None:
    doc = fit(synthetic_runs(noise=0.0))
    for key in ("alpha_m", "alpha_l", "alpha_D"):
        assert doc["params"][key] == pytest.approx(TRUE[key], abs=2e-3)
    for key in ("c_m", "c_l", "c_D", "L0"):
        assert doc["params"][key] == pytest.approx(TRUE[key], rel=1e-2)
    assert doc["heldout_rmse"] < 1e-4


def test_recovers_known_parameters_with_noise_and_intervals_cover_them() -> None:
    doc = fit(synthetic_runs(noise=0.003, seed=1))
    assert doc["n_points"] == 160
    for key in ("alpha_m", "alpha_l", "alpha_D"):
        assert doc["params"][key] == pytest.approx(TRUE[key], abs=0.15)
        low, high = doc["ci95"][key]
        assert low <= doc["params"][key] <= high
    assert doc["params"]["L0"] == pytest.approx(TRUE["L0"], rel=0.03)
    assert abs(doc["params"]["alpha_l"] - TRUE["alpha_l"]) < 4 * doc["se"]["alpha_l"]
    assert 0.0 < doc["heldout_rmse"] < 0.05


def test_huber_resists_outliers() -> None:
    runs = synthetic_runs(noise=0.0, seed=2)
    loss = runs.loss.copy()
    loss[::20] *= 1.3  # 8 gross outliers
    bad = Runs(runs.width, runs.depth, runs.tokens, loss, "synthetic", runs.n_rows)
    settings = ScalingFitSettings(exclude_highest=0, restarts=64, bootstrap=0, heldout_splits=0,
                                  huber_delta=1e-3)
    doc = fit(bad, settings)
    assert doc["loss_function"] == "huber"
    assert doc["params"]["alpha_l"] == pytest.approx(TRUE["alpha_l"], abs=0.05)
    assert doc["params"]["L0"] == pytest.approx(TRUE["L0"], rel=0.02)


def test_batched_solver_matches_scipy_on_each_start() -> None:
    runs = synthetic_runs(noise=0.01, seed=3, n=80)
    x = np.log(np.stack([runs.width, runs.depth, runs.tokens], axis=1))
    u, y = x - x.mean(axis=0), np.log(runs.loss)
    starts = powerfit.random_starts(np.random.default_rng(0), 6, 3, y)
    batch = powerfit.fit_batched(u, y, np.ones(len(y)), starts)

    def f(theta: np.ndarray) -> float:
        return float(powerfit.objective(theta[None], u, y, np.ones((1, len(y))), None)[0])

    best_scipy = min(
        minimize(f, s, method="L-BFGS-B", bounds=[(None, None)] * 3 + [(0, 10)] * 3 + [(None, None)],
                 options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-10}).fun
        for s in starts
    )
    assert batch.objective.min() == pytest.approx(best_scipy, rel=1e-4)


def test_exclude_highest_drops_the_largest_losses_and_keeps_order() -> None:
    runs = Runs(np.arange(1.0, 6.0), np.ones(5), np.ones(5), np.array([3.0, 9.0, 1.0, 7.0, 2.0]))
    kept = exclude_highest(runs, 2)
    assert kept.loss.tolist() == [3.0, 1.0, 2.0]
    assert kept.width.tolist() == [1.0, 3.0, 5.0]
    tied = Runs(np.arange(1.0, 6.0), np.ones(5), np.ones(5), np.array([3.0, 9.0, 3.0, 7.0, 2.0]))
    assert exclude_highest(tied, 3).loss.tolist() == [2.0]  # both 3.0s go: row order must not decide
    assert exclude_highest(tied, 0).loss.tolist() == tied.loss.tolist()
    assert exclude_highest(tied, 5).loss.tolist() == []
    with pytest.raises(UserError):
        exclude_highest(runs, -1)


def test_optimal_shape_satisfies_the_budget_and_the_stationarity_condition() -> None:
    shape = optimal_shape(TRUE, (1e9, 1e10))
    assert shape["width_depth_exponent"] == pytest.approx(TRUE["alpha_l"] / TRUE["alpha_m"])
    for row in shape["table"]:
        assert 12 * row["depth"] * row["width"] ** 2 == pytest.approx(row["N"], rel=1e-9)
        # brute force along the constraint: the table's depth minimises the width+depth terms
        depths = row["depth"] * np.exp(np.linspace(-1, 1, 2001))
        widths = np.sqrt(row["N"] / (12 * depths))
        terms = TRUE["c_m"] / widths ** TRUE["alpha_m"] + TRUE["c_l"] / depths ** TRUE["alpha_l"]
        assert depths[terms.argmin()] == pytest.approx(row["depth"], rel=2e-3)


def test_load_runs_reports_missing_columns_and_drops_bad_rows(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("loss,d_model,n_layers,num_tokens\n2.5,512,8,1e9\nnan,512,8,1e9\n2.4,-1,8,1e9\n")
    runs = load_runs(path, ScalingFitSettings())
    assert runs.n_rows == 3 and runs.loss.tolist() == [2.5]
    with pytest.raises(UserError, match="--depth-col"):
        load_runs(path, ScalingFitSettings(depth_column="layers"))
    with pytest.raises(UserError, match="--csv"):
        load_runs(tmp_path / "absent.csv", ScalingFitSettings())


def test_cli_writes_the_documented_json(tmp_path, monkeypatch) -> None:
    from cli.main import main

    monkeypatch.setenv("ANATOMY_TUI_HOME", str(tmp_path / "home"))
    runs = synthetic_runs(noise=0.002, seed=4, n=60)
    csv = tmp_path / "runs.csv"
    lines = ["L,width,depth,tokens"] + [
        f"{a},{b},{c},{d}" for a, b, c, d in zip(runs.loss, runs.width, runs.depth, runs.tokens, strict=True)
    ]
    csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "fit.json"
    code = main(["run", "scaling-fit", "--csv", str(csv), "--loss-col", "L", "--width-col", "width",
                 "--depth-col", "depth", "--tokens-col", "tokens", "--exclude-highest", "5",
                 "--restarts", "32", "--bootstrap", "10", "--heldout-splits", "2", "--session", "fit",
                 "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["n_points"] == 55 and doc["n_excluded"] == 5
    assert set(doc["params"]) == set(doc["ci95"]) == set(TRUE)
    assert all(len(v) == 2 for v in doc["ci95"].values())
    assert isinstance(doc["heldout_rmse"], float)
    assert (tmp_path / "home" / "fit" / "results" / "scaling-fit.json").exists()


def test_the_chinchilla_data_ships_in_the_package_and_loads_without_the_workspace(tmp_path) -> None:
    """The default CSV lies inside the engine package, is declared as package data, and a copy of
    the package alone (no repository, no ../shared/data next to it) reads all 245 runs."""
    import engine

    package = Path(engine.__file__).parent
    relative = default_csv().relative_to(package).as_posix()
    declared = re.search(r"^engine = \[(.*)\]$", (package.parent / "pyproject.toml").read_text(), re.M)
    assert declared is not None
    globs = json.loads(f"[{declared.group(1)}]")  # [tool.setuptools.package-data]'s engine line
    assert any(fnmatch.fnmatch(relative, g) for g in globs)
    assert any(fnmatch.fnmatch("data/chinchilla/README.md", g) for g in globs)  # its source, named
    shutil.copytree(package, tmp_path / "site" / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("from engine.experiments.scaling_fit.runs import load_runs; "
            "from engine.experiments.scaling_fit.vocabulary import ScalingFitSettings; "
            "p = ScalingFitSettings().csv_path(); print(p); print(load_runs(p, ScalingFitSettings()).n_rows)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0].startswith(str(tmp_path / "site" / "engine")) and out[1] == "245"


def test_chinchilla_data_gives_a_finite_depth_exponent() -> None:
    path = default_csv()
    settings = ScalingFitSettings(restarts=64, bootstrap=0, heldout_splits=0)
    runs = load_runs(path, settings)
    assert runs.n_rows == 245
    doc = fit(runs, settings)
    assert doc["n_points"] == 203  # the 40 highest losses and the 2 runs tied with the 40th
    assert math.isfinite(doc["params"]["alpha_l"]) and 0.3 < doc["params"]["alpha_l"] < 3.0
    assert doc["params"]["L0"] < runs.loss.min()


def _msle(params: dict, runs: Runs) -> float:
    """The mean squared log residual, written out again from the formula."""
    total = 0.0
    for m, depth, d, loss in zip(runs.width, runs.depth, runs.tokens, runs.loss, strict=True):
        pred = (params["c_m"] * m ** -params["alpha_m"] + params["c_l"] * depth ** -params["alpha_l"]
                + params["c_D"] * d ** -params["alpha_D"] + params["L0"])
        total += (math.log(pred) - math.log(loss)) ** 2
    return total / len(runs.loss)


def test_objective_is_the_same_quantity_in_every_mode() -> None:
    runs = synthetic_runs(noise=0.003, seed=5, n=80)
    modes = {
        "lm": ScalingFitSettings(exclude_highest=0, restarts=32, bootstrap=0, heldout_splits=0),
        "huber": ScalingFitSettings(exclude_highest=0, restarts=32, bootstrap=0, heldout_splits=0, huber_delta=1e-3),
        "paper": ScalingFitSettings(exclude_highest=0, optimizer="paper", steps=3000),
    }
    docs = {name: fit(runs, settings) for name, settings in modes.items()}
    for doc in docs.values():
        assert doc["objective"] == pytest.approx(_msle(doc["params"], runs), rel=1e-9)
    # least squares minimises exactly this quantity: no other mode can beat it
    assert docs["lm"]["objective"] <= min(docs["huber"]["objective"], docs["paper"]["objective"])
    assert docs["paper"]["optimizer"] == "paper" and docs["paper"]["paper"]["steps"] == 3000
    header = ["source", "columns", "n_rows", "n_excluded", "n_points", "optimizer", "loss_function", "huber_delta",
              "params", "objective", "depth_points"]
    footer = ["optimal_shape", "settings", "seconds"]
    assert list(docs["paper"]) == [*header, "paper", *footer]  # each optimizer's document, in the order it had
    assert list(docs["lm"]) == [*header, "profile", "alpha_l_profile_ci95", "ci95", "se", "train_rmse",
                                "train_rmse_log", "restarts", "bootstrap", "heldout_rmse", "heldout_rmse_log",
                                "heldout_splits", "heldout_n_test", *footer]
    last = docs["paper"]["paper"]["trajectory"][-1]
    assert last["step"] == 3000 and last["alpha_l"] == docs["paper"]["params"]["alpha_l"]


def test_alpha_l_profile_bottoms_out_at_the_free_fit_and_its_interval_covers_it() -> None:
    runs = synthetic_runs(noise=0.003, seed=1)
    doc = fit(runs, ScalingFitSettings(exclude_highest=0, restarts=64, bootstrap=0, heldout_splits=0))
    profile = doc["profile"]["alpha_l"]
    assert len(profile) >= 20
    assert [p["alpha_l"] for p in profile] == sorted(p["alpha_l"] for p in profile)
    assert profile[0]["alpha_l"] <= 0.5 and profile[-1]["alpha_l"] >= 3.0
    objectives = [p["objective"] for p in profile]
    # refitting with a_l held at the free estimate gives back the free fit; nowhere is it lower
    assert min(objectives) == pytest.approx(doc["objective"], rel=1e-6)
    assert all(o >= doc["objective"] * (1 - 1e-9) for o in objectives)
    low, high = doc["alpha_l_profile_ci95"]
    assert low is not None and high is not None
    assert low < doc["params"]["alpha_l"] < high


def test_profile_interval_solves_the_likelihood_ratio_condition() -> None:
    n, best = 100, 2e-4
    grid = np.round(np.linspace(0.5, 2.0, 16), 3)
    # n ln(obj / best) = 3.84 ((a - 1.2) / 0.3)^2: the interval is exactly 1.2 -+ 0.3
    profile = [{"alpha_l": float(a), "objective": best * math.exp(3.841458820694124 * ((a - 1.2) / 0.3) ** 2 / n)}
               for a in grid]
    low, high = profile_interval(profile, best, n)
    assert low == pytest.approx(0.9, abs=1e-9) and high == pytest.approx(1.5, abs=1e-9)
    flat = [{"alpha_l": float(a), "objective": best * (1 + 1e-4 * a)} for a in grid]
    assert profile_interval(flat, best, n) == [None, None]  # never rejected inside the profiled range


def test_paper_optimizer_reproduces_the_notebooks_alpha_l_on_chinchilla() -> None:
    path = default_csv()
    runs = load_runs(path, ScalingFitSettings())
    doc = fit(runs, ScalingFitSettings(optimizer="paper"))
    assert doc["n_points"] == 203 and doc["paper"]["steps"] == 50000
    assert doc["params"]["alpha_l"] == pytest.approx(1.20, abs=0.01)
    assert doc["params"]["alpha_m"] == pytest.approx(0.977, abs=0.01)
    assert doc["params"]["L0"] == pytest.approx(1.750, abs=0.01)


def test_cli_optimizer_paper_and_a_bad_optimizer(tmp_path, monkeypatch, capsys) -> None:
    from cli.main import main

    monkeypatch.setenv("ANATOMY_TUI_HOME", str(tmp_path / "home"))
    runs = synthetic_runs(noise=0.002, seed=4, n=60)
    csv = tmp_path / "runs.csv"
    csv.write_text("loss,d_model,n_layers,num_tokens\n" + "".join(
        f"{a},{b},{c},{d}\n" for a, b, c, d in zip(runs.loss, runs.width, runs.depth, runs.tokens, strict=True)))
    out = tmp_path / "fit.json"
    assert main(["run", "scaling-fit", "--csv", str(csv), "--exclude-highest", "0", "--optimizer", "paper",
                 "--steps", "500", "--session", "fit", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["optimizer"] == "paper" and doc["settings"]["steps"] == 500
    assert "alpha_l" in capsys.readouterr().out
    assert main(["run", "scaling-fit", "--csv", str(csv), "--optimizer", "adam", "--session", "bad"]) == 2
    assert "--optimizer adam" in capsys.readouterr().err


def test_depth_points_are_the_runs_fitted_and_their_depth_part_follows_the_fitted_depth_term() -> None:
    """The plot's points: the runs left after --exclude-highest, in order; loss minus the fitted width,
    token and floor terms is, without noise, the fitted depth term c_l / l^a_l itself."""
    runs = synthetic_runs(noise=0.0)
    doc = json.loads(json.dumps(fit(runs, dataclasses.replace(FAST, exclude_highest=10, bootstrap=0,
                                                              heldout_splits=0))))
    points = from_doc(DepthPoints, doc["depth_points"])
    kept = exclude_highest(runs, 10)
    assert points.depth == kept.depth.tolist() and points.loss == kept.loss.tolist()
    p = doc["params"]
    for depth, part in points.depth_part():
        assert part == pytest.approx(p["c_l"] / depth ** p["alpha_l"], rel=1e-3, abs=1e-6)
    assert [part for _, part in points.depth_part()] == pytest.approx(
        [TRUE["c_l"] / d ** TRUE["alpha_l"] for d in kept.depth], rel=2e-2)
