"""The loss decomposition of paper B: L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 over training runs.

Fitted in log space with many random restarts (the landscape is multi-modal), least squares or Huber;
bootstrap intervals and held-out error come from the same batched solver, every resample or split
being one more row of the batch (see engine/evaluation/powerfit.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.evaluation import powerfit
from engine.experiments.context import RunContext
from engine.experiments.scaling_fit.runs import Runs, load_runs
from engine.experiments.scaling_fit.vocabulary import (
    TERMS,
    DepthPoints,
    FitBootstrap,
    FitRestarts,
    FitStage,
    PaperFit,
    ProfilePoint,
    ScalingFitResult,
    ScalingFitSettings,
    ScalingProfile,
)

PARAM_KEYS = ("alpha_m", "alpha_l", "alpha_D", "c_m", "c_l", "c_D", "L0")
# Paper B's notebook: features in its units (width, 100 x layers, tokens in millions), the start
# (ln c_m, ln c_l, ln c_D, a_m, a_l, a_D, L0) and Adam's learning rate for each of those parameters.
PAPER_UNITS = np.array([1.0, 100.0, 1e-6])
PAPER_START = np.array([math.log(200.0), math.log(200.0), math.log(10.0), 1.0, 1.0, 0.33, 1.69])
PAPER_LR = np.array([0.005, 0.005, 0.005, 0.0005, 0.0005, 0.0005, 0.005])
PAPER_LOSS_SCALE = 100.0  # the notebook minimises 100 x the mean squared log residual
# a_l values at which the least-squares fit is profiled (the others refitted at each)
PROFILE_ALPHA_L = tuple(float(v) for v in np.round(np.linspace(0.5, 3.0, 26), 3))
PROFILE_RESTARTS = 16
CHI2_1_95 = 3.841458820694124  # 95 % quantile of chi-square with one degree of freedom










def exclude_highest(runs: Runs, k: int) -> Runs:
    """Drops the k runs with the highest loss (the paper drops 40 early, unconverged runs), and every
    run tied with the k-th highest: which of equal losses to keep would otherwise depend on the file's
    row order. The reconstructed Chinchilla losses take about 99 distinct values, so k = 40 drops 42
    runs; dropping the ties is what reproduces the paper's printed fit (a_m 0.977, a_D 0.299, L0 1.750)."""
    if k < 0:
        raise UserError("--exclude-highest must be 0 or more")
    if k == 0:
        keep = np.arange(len(runs.loss))
    elif k >= len(runs.loss):
        keep = np.arange(0)
    else:
        keep = np.flatnonzero(runs.loss < np.sort(runs.loss)[::-1][k - 1])
    r = runs
    return Runs(r.width[keep], r.depth[keep], r.tokens[keep], r.loss[keep], r.source, r.n_rows, r.dropped)


def named_params(theta: np.ndarray, centre: np.ndarray) -> list[dict[str, float]]:
    """Rows of theta -> {alpha_m, ..., c_m, ..., L0} in natural units."""
    nat = powerfit.to_natural(theta, centre)
    out = []
    for i in range(nat["alpha"].shape[0]):
        doc = {f"alpha_{t}": float(nat["alpha"][i, j]) for j, t in enumerate(TERMS)}
        doc.update({f"c_{t}": float(np.exp(nat["log_c"][i, j])) for j, t in enumerate(TERMS)})
        doc["L0"] = float(nat["L0"][i])
        out.append(doc)
    return out


def optimal_shape(params: dict[str, float], budgets: tuple[float, ...]) -> dict[str, Any]:
    """Width and depth that minimise c_m/m^a_m + c_l/l^a_l at a fixed budget N = 12 l m^2.

    Setting the derivative along the constraint to zero gives a_m T_m = 2 a_l T_l, so
    m = K l^(a_l/a_m) with K = (a_m c_m / (2 a_l c_l))^(1/a_m); then l ~ N^(1/(1+2 a_l/a_m)).
    """
    am, al, cm, cl = params["alpha_m"], params["alpha_l"], params["c_m"], params["c_l"]
    if am <= 0 or al <= 0:
        return {"width_depth_exponent": None, "note": "an exponent is 0: no interior optimum"}
    q = al / am
    log_k = (math.log(am * cm) - math.log(2 * al * cl)) / am
    table = []
    for n in budgets:
        log_l = (math.log(n / 12.0) - 2 * log_k) / (1 + 2 * q)
        log_m = log_k + q * log_l
        table.append({
            "N": n,
            "depth": math.exp(log_l),
            "width": math.exp(log_m),
            "width_over_depth": math.exp(log_m - log_l),
        })
    return {
        "param_formula": "N = 12 * depth * width^2",
        "width_depth_exponent": q,
        "prefactor": math.exp(log_k),
        "depth_budget_exponent": 1 / (1 + 2 * q),
        "width_budget_exponent": q / (1 + 2 * q),
        "table": table,
    }


def _data_header(data: Runs, settings: ScalingFitSettings, n_excluded: int, n_points: int, optimizer: str
                 ) -> dict[str, Any]:
    """What every fit's document (`ScalingFitResult`) starts with: which runs it fitted and how."""
    return {
        "source": data.source,
        "columns": {"loss": settings.loss_column, "width": settings.width_column,
                    "depth": settings.depth_column, "tokens": settings.tokens_column},
        "n_rows": data.n_rows,
        "n_excluded": n_excluded,
        "n_points": n_points,
        "optimizer": optimizer,
    }


def run_scaling_fit(
    runs: Runs, settings: ScalingFitSettings, cancel: CancelToken | None = None
) -> Iterator[Event]:
    """Fits the decomposition, then bootstrap intervals and held-out error; ends with the Result."""
    started = time.perf_counter()
    settings.validate()
    data = exclude_highest(runs, settings.exclude_highest)
    n = len(data.loss)
    p = powerfit.n_params(len(TERMS))
    if n < p + 2:
        raise UserError(
            f"only {n} runs left after --exclude-highest {settings.exclude_highest}; need at least {p + 2}"
        )
    x = np.log(np.stack([data.width, data.depth, data.tokens], axis=1))
    centre = x.mean(axis=0)
    u, y = x - centre, np.log(data.loss)
    rng = np.random.default_rng(settings.seed)
    delta = settings.huber_delta
    n_excluded = len(runs.loss) - n
    if runs.dropped:
        yield Message(f"{data.n_rows - len(runs.loss)} rows of {data.source} are not usable runs and were left "
                      f"out: {runs.dropped_text()} (--strict refuses such a file)", level="warning")
    yield Message(f"fitting {n} runs ({data.n_rows} read, {n_excluded} highest losses dropped)")
    if settings.optimizer == "paper":
        yield from _run_paper(data, x, y, settings, n_excluded, started, cancel)
        return

    # 1. the fit itself: many random restarts in one batch
    yield Progress(0, 3, "restarts", unit="stages")
    fit = powerfit.fit_batched(u, y, np.ones(n), powerfit.random_starts(rng, settings.restarts, 3, y),
                               delta=delta, cancel=cancel)
    best_theta, best_obj = powerfit.best_per_group(fit, 1)
    best = named_params(best_theta, centre)[0]
    near = int(np.sum(fit.objective <= best_obj[0] * (1 + 1e-3) + 1e-12))
    resid = powerfit.log_predict(best_theta, u)[0] - y
    yield FitStage(stage="fit", values=best, seconds=time.perf_counter() - started)
    yield Message(f"best of {settings.restarts} restarts: alpha_l={best['alpha_l']:.3f}, "
                  f"{near} restarts reach it")

    # 2. bootstrap: resample runs with replacement (multiplicity weights), restart from the optimum + random
    yield Progress(1, 3, "bootstrap", unit="stages")
    t0 = time.perf_counter()
    boot_params, boot_valid = _bootstrap(u, y, centre, best_theta, settings, rng, cancel)
    boot_seconds = time.perf_counter() - t0
    ci95, se = _intervals(boot_params)
    yield FitStage(stage="bootstrap", values={k: v for k, v in se.items() if v is not None},
                   seconds=boot_seconds)

    # 3. held-out error over random splits
    yield Progress(2, 3, "held-out splits", unit="stages")
    heldout = _heldout(u, y, best_theta, settings, rng, cancel)
    objective = mean_squared_log_residual(best, data)
    profile, profile_ci = None, None
    if delta is None:
        profile = profile_alpha_l(u, y, best_theta, rng, cancel)
        profile_ci = profile_interval(profile, objective, n)
    yield Progress(3, 3, "done", unit="stages")

    shape = optimal_shape(best, settings.budgets)
    ratios = [b["alpha_l"] / b["alpha_m"] for b in boot_params if b["alpha_m"] > 0]
    shape["width_depth_exponent_ci95"] = _percentiles(ratios)
    doc = ScalingFitResult(
        **_data_header(data, settings, n_excluded, n, "lm"),
        loss_function="huber" if delta is not None else "least_squares",
        huber_delta=delta,
        params={**best},  # as the result declares it: a value may be undefined
        objective=objective,
        depth_points=depth_points(best, data),
        profile=ScalingProfile(alpha_l=None if profile is None else [ProfilePoint(**point) for point in profile]),
        alpha_l_profile_ci95=profile_ci,
        ci95=ci95,
        se=se,
        train_rmse=float(np.sqrt(np.mean((data.loss * (np.exp(resid) - 1)) ** 2))),
        train_rmse_log=float(np.sqrt(np.mean(resid**2))),
        restarts=FitRestarts(n=settings.restarts, reaching_best=near, best_objective=float(best_obj[0])),
        bootstrap=FitBootstrap(n=settings.bootstrap, n_valid=boot_valid, restarts=settings.bootstrap_restarts,
                               seconds=boot_seconds),
        **heldout,
        optimal_shape=shape,
        settings=settings,
        seconds=time.perf_counter() - started,
    )
    yield Result(name="scaling-fit", data=json_safe(doc))


def depth_points(params: dict[str, float], runs: Runs) -> DepthPoints:
    """The fitted runs against depth, for the plot of loss against depth beside the fitted depth
    term: each run's loss and the fit's other terms (width, tokens, L0) at that run."""
    rest = (params["c_m"] / runs.width ** params["alpha_m"] + params["c_D"] / runs.tokens ** params["alpha_D"]
            + params["L0"])
    return DepthPoints(depth=runs.depth.tolist(), loss=runs.loss.tolist(), rest=rest.tolist())


def mean_squared_log_residual(params: dict[str, float], runs: Runs) -> float:
    """mean((log L_pred - log L)^2) over the runs, in natural units: the one objective every optimizer
    reports, so fits made differently can be compared on the same runs."""
    pred = (params["c_m"] / runs.width ** params["alpha_m"] + params["c_l"] / runs.depth ** params["alpha_l"]
            + params["c_D"] / runs.tokens ** params["alpha_D"] + params["L0"])
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(pred) - np.log(runs.loss)
    return float(np.mean(r**2)) if np.all(np.isfinite(r)) else math.inf


def profile_alpha_l(u: np.ndarray, y: np.ndarray, best_theta: np.ndarray, rng: np.random.Generator,
                    cancel: CancelToken | None = None) -> list[dict[str, float]]:
    """The least-squares profile of a_l: at each value (PROFILE_ALPHA_L and the free estimate) a_l is
    held fixed and the other parameters refitted from the optimum and random starts. A flat profile
    means the runs barely pin a_l down."""
    k = len(TERMS)
    slot = k + TERMS.index("l")
    values = sorted(set(PROFILE_ALPHA_L) | {float(best_theta[0, slot])})
    g, per = len(values), PROFILE_RESTARTS
    starts = _starts_around(best_theta, g, per, y, rng).reshape(g, per, -1)
    starts[:, :, slot] = np.asarray(values)[:, None]
    fixed = np.zeros(powerfit.n_params(k), dtype=bool)
    fixed[slot] = True
    fit = powerfit.fit_batched(u, y, np.ones(len(y)), starts.reshape(g * per, -1), fixed=fixed, cancel=cancel)
    _, obj = powerfit.best_per_group(fit, g)
    return [{"alpha_l": a, "objective": float(2.0 * o / len(y))} for a, o in zip(values, obj, strict=True)]


def profile_interval(profile: list[dict[str, float]], objective: float, n: int) -> list[float | None]:
    """The likelihood-ratio 95 % interval of a_l: with Gaussian log residuals of unknown variance,
    -2 log LR = n ln(obj(a_l) / obj_min), below 3.84 inside. Linear interpolation between profile
    points; None on a side where the profile stays below 3.84 up to the end of the profiled range."""
    a = np.array([p["alpha_l"] for p in profile])
    objectives = np.array([p["objective"] for p in profile])
    stat = n * np.log(objectives / min(objective, float(objectives.min())))
    i = int(np.argmin(stat))
    bounds: list[float | None] = []
    for side in (range(i, 0, -1), range(i, len(a) - 1)):
        bound = None
        for j in side:
            nxt = j - 1 if side.step < 0 else j + 1
            if stat[nxt] > CHI2_1_95:
                t = (CHI2_1_95 - stat[j]) / (stat[nxt] - stat[j])
                bound = float(a[j] + t * (a[nxt] - a[j]))
                break
        bounds.append(bound)
    return bounds


def _run_paper(data: Runs, x: np.ndarray, y: np.ndarray, settings: ScalingFitSettings, n_excluded: int,
               started: float, cancel: CancelToken | None) -> Iterator[Event]:
    """Paper B's notebook procedure: Adam from its fixed start for `steps` steps, features in its
    units. Its answer depends on `steps` (the objective is nearly flat along a_l), so snapshots along
    the way are reported too."""
    yield Progress(0, 1, f"Adam, {settings.steps} steps", unit="fits")
    record = tuple(sorted({s for s in (1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000)
                           if s < settings.steps} | {settings.steps}))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        fit = powerfit.fit_adam(x + np.log(PAPER_UNITS), y, PAPER_START, PAPER_LR, settings.steps,
                                record=record, scale=PAPER_LOSS_SCALE, cancel=cancel)
    if not np.all(np.isfinite(fit.params)):
        raise UserError("the paper's Adam procedure diverged on these runs (a prediction went negative); "
                        "use --optimizer lm")
    k = len(TERMS)

    def natural(p: np.ndarray) -> dict[str, float]:
        # c (x s)^-a = (c s^-a) x^-a: coefficients back in the CSV's own units
        doc = {f"alpha_{t}": float(p[k + j]) for j, t in enumerate(TERMS)}
        doc.update({f"c_{t}": float(np.exp(p[j] - p[k + j] * math.log(PAPER_UNITS[j]))) for j, t in enumerate(TERMS)})
        doc["L0"] = float(p[2 * k])
        return doc

    best = natural(fit.params)
    objective = mean_squared_log_residual(best, data)
    trajectory: list[dict[str, float | None]] = []
    for step, p in fit.snapshots:
        doc = natural(p)
        trajectory.append({"step": step, **{key: doc[key] for key in ("alpha_m", "alpha_l", "alpha_D", "L0")},
                           "objective": mean_squared_log_residual(doc, data)})
    yield FitStage(stage="fit", values=best, seconds=time.perf_counter() - started)
    yield Progress(1, 1, "done", unit="fits")
    result = ScalingFitResult(
        **_data_header(data, settings, n_excluded, len(y), "paper"),
        loss_function="least_squares",
        huber_delta=None,
        params={**best},  # as the result declares it: a value may be undefined
        objective=objective,
        depth_points=depth_points(best, data),
        paper=PaperFit(
            steps=settings.steps,
            units={"width": 1.0, "depth": float(PAPER_UNITS[1]), "tokens": float(PAPER_UNITS[2])},
            log_c={f"c_{t}": float(fit.params[j]) for j, t in enumerate(TERMS)},
            loss=PAPER_LOSS_SCALE * objective,
            trajectory=trajectory,
        ),
        optimal_shape=optimal_shape(best, settings.budgets),
        settings=settings,
        seconds=time.perf_counter() - started,
    )
    yield Result(name="scaling-fit", data=json_safe(result))


def _starts_around(best_theta: np.ndarray, groups: int, per_group: int, y: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Per group: the full-data optimum first, then random starts; laid out group-major."""
    starts = powerfit.random_starts(rng, groups * per_group, 3, y).reshape(groups, per_group, -1)
    starts[:, 0] = best_theta[0]
    return starts.reshape(groups * per_group, -1)


def _bootstrap(u: np.ndarray, y: np.ndarray, centre: np.ndarray, best_theta: np.ndarray,
               settings: ScalingFitSettings, rng: np.random.Generator,
               cancel: CancelToken | None) -> tuple[list[dict[str, float]], int]:
    """Each resample is a row of multiplicities over the runs; all resamples are solved in one batch."""
    b, k = settings.bootstrap, max(settings.bootstrap_restarts, 1)
    if b == 0:
        return [], 0
    n = len(y)
    counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(b)]).astype(float)
    fit = powerfit.fit_batched(u, y, np.repeat(counts, k, axis=0), _starts_around(best_theta, b, k, y, rng),
                               delta=settings.huber_delta, cancel=cancel)
    theta, obj = powerfit.best_per_group(fit, b)
    ok = np.isfinite(obj)
    return named_params(theta[ok], centre), int(ok.sum())


def _heldout(u: np.ndarray, y: np.ndarray, best_theta: np.ndarray, settings: ScalingFitSettings,
             rng: np.random.Generator, cancel: CancelToken | None) -> dict[str, Any]:
    """Fits on a random (1 - fraction) of the runs, scores the rest; pooled over splits."""
    s, k, n = settings.heldout_splits, max(settings.bootstrap_restarts, 1), len(y)
    n_test = max(1, int(round(settings.heldout_fraction * n)))
    if s == 0:
        return {"heldout_rmse": None, "heldout_rmse_log": None, "heldout_splits": 0, "heldout_n_test": n_test}
    test = np.zeros((s, n), dtype=bool)
    for i in range(s):
        test[i, rng.choice(n, n_test, replace=False)] = True
    fit = powerfit.fit_batched(u, y, np.repeat((~test).astype(float), k, axis=0),
                               _starts_around(best_theta, s, k, y, rng), delta=settings.huber_delta,
                               cancel=cancel)
    theta, _ = powerfit.best_per_group(fit, s)
    err_log = (powerfit.log_predict(theta, u) - y)[test]
    err = np.exp(y)[np.nonzero(test)[1]] * (np.exp(err_log) - 1)
    return {
        "heldout_rmse": float(np.sqrt(np.mean(err**2))),
        "heldout_rmse_log": float(np.sqrt(np.mean(err_log**2))),
        "heldout_splits": s,
        "heldout_n_test": n_test,
    }


def _percentiles(values: list[float]) -> list[float] | None:
    if len(values) < 2:
        return None
    low, high = np.percentile(np.asarray(values), [2.5, 97.5])
    return [float(low), float(high)]


def _intervals(rows: list[dict[str, float]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Percentile 95 % intervals and standard errors of each parameter over bootstrap fits."""
    ci95 = {key: _percentiles([r[key] for r in rows]) for key in PARAM_KEYS}
    se = {k: (float(np.std([r[k] for r in rows], ddof=1)) if len(rows) > 1 else None) for k in PARAM_KEYS}
    return ci95, se


def run(settings: ScalingFitSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: the fit of the settings' CSV."""
    yield from run_scaling_fit(load_runs(settings.csv_path(), settings), settings, context.cancel)
