"""The loss-decomposition fit: recovery of known parameters, the optimal-shape algebra, the solver
against scipy, input errors, the CLI, and (where present) the Chinchilla data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import minimize

from engine import powerfit
from engine.errors import UserError
from engine.events import Result
from engine.experiments.scaling_fit import (
    Runs,
    ScalingFitSettings,
    default_csv,
    exclude_highest,
    load_runs,
    optimal_shape,
    run_scaling_fit,
)

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
    assert isinstance(events[-1], Result)
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
    assert doc["objective"] == "huber"
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
    from tui.cli import main

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


def test_chinchilla_data_gives_a_finite_depth_exponent() -> None:
    path = default_csv()
    if not path.is_file():
        pytest.skip(f"Chinchilla data not found at {path} (../shared/data relative to the repository root)")
    settings = ScalingFitSettings(restarts=64, bootstrap=0, heldout_splits=0)
    runs = load_runs(path, settings)
    assert runs.n_rows == 245
    doc = fit(runs, settings)
    assert doc["n_points"] == 205
    assert math.isfinite(doc["params"]["alpha_l"]) and 0.3 < doc["params"]["alpha_l"] < 3.0
    assert doc["params"]["L0"] < runs.loss.min()
