"""toy-depth's fits: the depth law L(l) = c / l^a_l (+ L0) fitted to each (regime, temperature)
curve with a two-level bootstrap interval, the result document made from the curves, and one
result from the shares of a split run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.core.codec import from_doc, json_safe
from engine.evaluation import powerfit
from engine.experiments.toy_depth.vocabulary import ToyDepthCurve, ToyDepthResult, ToyDepthSettings, ToyDepthShare


def fit_depth_law(
    depths: list[int], losses: Sequence[Sequence[float | None]], floor: bool, bootstrap: int, seed: int
) -> dict[str, Any]:
    """Fits L(l) = c / l^a (+ L0) to every (depth, seed) loss; 95 % interval of a from a two-level
    bootstrap: depths drawn with replacement, then each drawn depth's seeds with replacement."""
    l_arr = np.repeat(np.asarray(depths, dtype=float), [len(v) for v in losses])
    y_arr = np.asarray([v for row in losses for v in row], dtype=float)
    ok = np.isfinite(y_arr) & (y_arr > 0)
    if len(set(l_arr[ok])) < (3 if floor else 2):
        return {"alpha_l": None, "c": None, "L0": None, "ci95": None, "bootstrap_valid": 0}
    x = np.log(l_arr)
    centre = np.array([x[ok].mean()])
    u = (x - centre[0])[:, None]
    y = np.where(ok, np.log(np.where(ok, y_arr, 1.0)), 0.0)
    rng = np.random.default_rng(seed)
    restarts = 32
    starts = powerfit.random_starts(rng, restarts, 1, y[ok], floor=floor)
    fit = powerfit.fit_batched(u, y, ok.astype(float), starts, floor=floor)
    best, _ = powerfit.best_per_group(fit, 1)
    nat = powerfit.to_natural(best, centre, floor=floor)
    doc: dict[str, Any] = {
        "alpha_l": float(nat["alpha"][0, 0]),
        "c": float(np.exp(nat["log_c"][0, 0])),
        "L0": float(nat["L0"][0]),
    }
    # two-level bootstrap as multiplicity weights over the points
    owner = np.repeat(np.arange(len(depths)), [len(v) for v in losses])
    weights = np.zeros((bootstrap, len(y)))
    for b in range(bootstrap):
        for dep in rng.integers(0, len(depths), len(depths)):
            members = np.flatnonzero(owner == dep)
            np.add.at(weights[b], rng.choice(members, len(members)), 1.0)
    weights *= ok
    distinct = np.array([len(set(l_arr[w > 0])) for w in weights])
    valid = weights[distinct >= (3 if floor else 2)]
    k = 4
    if len(valid) > 1:
        starts = powerfit.random_starts(rng, len(valid) * k, 1, y[ok], floor=floor).reshape(len(valid), k, -1)
        starts[:, 0] = best[0]
        boot = powerfit.fit_batched(u, y, np.repeat(valid, k, axis=0), starts.reshape(len(valid) * k, -1),
                                    floor=floor)
        theta, _ = powerfit.best_per_group(boot, len(valid))
        alphas = powerfit.to_natural(theta, centre, floor=floor)["alpha"][:, 0]
        low, high = np.percentile(alphas, [2.5, 97.5])
        doc["ci95"] = [float(low), float(high)]
        doc["se"] = float(np.std(alphas, ddof=1))
    else:
        doc["ci95"], doc["se"] = None, None
    doc["bootstrap_valid"] = int(len(valid))
    return doc


def group_fit(settings: ToyDepthSettings, losses: Sequence[Sequence[float | None]]) -> ToyDepthCurve:
    """One (regime, temperature) curve: the losses of every depth and the fitted law (a loss read back
    from a worker's share is None where it was not finite)."""
    depths = sorted(set(settings.student_depths))
    return ToyDepthCurve(
        depths=depths,
        loss=[float(np.mean(np.asarray(v))) for v in losses],
        loss_per_seed=[list(v) for v in losses],
        **fit_depth_law(depths, losses, settings.fit_floor, settings.bootstrap, settings.seed),
    )


def result_doc(settings: ToyDepthSettings, preset: str, by_temperature: dict[str, dict[str, ToyDepthCurve]],
               seconds: float) -> dict[str, Any]:
    """results/toy-depth.json from the fitted curves; `settings` as the run resolved them."""
    temperature = settings.temperatures[0]
    doc: dict[str, Any] = json_safe(ToyDepthResult(
        preset=preset or "custom",
        regimes=by_temperature[f"{temperature:g}"],
        temperature=temperature,
        by_temperature=by_temperature,
        fit="L = c / l^alpha_l + L0" if settings.fit_floor else "L = c / l^alpha_l",
        settings=settings,
        seconds=seconds,
    ))
    return doc


def fit_line(regime: str, temperature: float, fit: ToyDepthCurve) -> str:
    return f"{regime} T={temperature:g}: alpha_l={fit.alpha_l} ci95={fit.ci95}"


def fit_lines(doc: dict[str, Any]) -> list[str]:
    """The per-curve log lines of a serial run, from a result: a split run fits its curves only
    once every share is in, so it logs them then."""
    fits = ToyDepthResult.from_json(doc).by_temperature
    return [fit_line(regime, float(t), fit) for t in fits for regime, fit in fits[t].items()]


def merge_shards(docs: list[dict[str, Any]], settings: ToyDepthSettings) -> dict[str, Any]:
    """One result from the results of a split run (each over some groups of students): every
    curve fitted over all its depths, as a serial run fits it."""
    shares = [from_doc(ToyDepthShare, doc) for doc in docs]
    losses = {(regime, t, depth): value for share in shares for regime, t, depth, value in share.students}
    depths = sorted(set(settings.student_depths))
    by_temperature: dict[str, dict[str, Any]] = {}
    for regime in settings.regimes:
        for t in settings.temperatures:
            curve = [losses[regime, t, depth] for depth in depths]
            by_temperature.setdefault(f"{t:g}", {})[regime] = group_fit(settings, curve)
    return result_doc(shares[0].settings, settings.preset, by_temperature, max(share.seconds for share in shares))
