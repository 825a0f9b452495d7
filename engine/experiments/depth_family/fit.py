"""The family's fits: its CSV in scaling-fit's format, the depth term L = c_l / l^a_l + L0 at one
width and token budget (engine/evaluation/depth_law.py's grid fit) with a two-level bootstrap, the
leave-one-depth-out error and the profile over a_l, and scaling-fit's full law where widths or
budgets vary (its own code, run on the CSV).

The bootstrap draws the depths with replacement, then each drawn depth's members (its seeds) with
replacement, as toy-depth's does; draws with fewer than three distinct depths are left out (no
exponent is defined by two points and a floor). `weakly_identified`: the a_l whose objective lies
within 0.3 % of the best span more than WEAK_SPAN (paper B's own test: the Chinchilla objectives are
within 0.3 % from 1.0 to 1.4), or the bootstrap interval is wider than WEAK_CI or has no draws."""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.core.codec import from_doc
from engine.core.errors import UserError
from engine.core.events import Result
from engine.disk.atomic import atomic_write_bytes
from engine.evaluation.depth_law import depth_profile, fit_depth
from engine.experiments.depth_family.vocabulary import (
    FLAT_WITHIN,
    DepthFit,
    FullLaw,
    LooPoint,
    Member,
    ProfilePoint,
    references,
)
from engine.experiments.scaling_fit.run import run_scaling_fit
from engine.experiments.scaling_fit.runs import load_runs
from engine.experiments.scaling_fit.vocabulary import ScalingFitResult, ScalingFitSettings

COLUMNS = ("loss", "d_model", "n_layers", "num_tokens", "seed", "params", "member")  # scaling-fit's first four
MIN_DEPTHS = 3
WEAK_SPAN = 0.2
WEAK_CI = 1.0
PROFILE_EVERY = 10  # the result keeps every tenth a of the grid (0.05 apart)
BOOTSTRAP_SEED = 0
CHUNK = 100  # bootstrap draws fitted at once (the grid holds draws x grid x points)


def csv_text(members: Sequence[Member]) -> str:
    """The members' final held-out losses as scaling-fit reads them (`run scaling-fit --csv`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for m in members:
        writer.writerow([repr(m.heldout_loss), m.width, m.depth, m.tokens, m.seed, m.params, m.name])
    return out.getvalue()


def write_csv(path: Path, members: Sequence[Member]) -> None:
    atomic_write_bytes(path, csv_text(members).encode())


def fitted_cell(members: Sequence[Member]) -> tuple[int, int]:
    """The (width, tokens) cell the depth term is fitted in: the one with the most depths (ties: the
    largest budget, then the widest)."""
    cells = {(m.width, m.tokens) for m in members}
    return max(cells, key=lambda cell: (len({m.depth for m in members if (m.width, m.tokens) == cell}),
                                        cell[1], cell[0]))


def _draws(depths: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicity weights (count, points) of the two-level bootstrap, draws under MIN_DEPTHS distinct
    depths dropped."""
    levels = np.unique(depths)
    weights = np.zeros((count, len(depths)))
    for row in weights:
        for level in rng.choice(levels, len(levels)):
            points = np.flatnonzero(depths == level)
            np.add.at(row, rng.choice(points, len(points)), 1.0)
    distinct = np.array([len(np.unique(depths[row > 0])) for row in weights])
    kept: np.ndarray = weights[distinct >= MIN_DEPTHS]
    return kept


def depth_fit(depths_in: Sequence[int], losses_in: Sequence[float], bootstrap: int, width: int, tokens: int
              ) -> DepthFit | None:
    """L = c_l / l^a_l + L0 fitted to these members (one point each); None below three depths."""
    depths = np.asarray(depths_in, dtype=float)
    losses = np.asarray(losses_in, dtype=float)
    if len(np.unique(depths)) < MIN_DEPTHS:
        return None
    best = {key: float(value[0]) for key, value in fit_depth(depths, losses).items()}
    ci, valid = None, 0
    if bootstrap:
        weights = _draws(depths, bootstrap, np.random.default_rng(BOOTSTRAP_SEED))
        valid = len(weights)
        if valid:
            alphas = np.concatenate([fit_depth(depths, np.broadcast_to(losses, chunk.shape), chunk)["a"]
                                     for chunk in np.array_split(weights, max(1, valid // CHUNK))])
            ci = [float(v) for v in np.percentile(alphas, [2.5, 97.5])]
    loo = _leave_one_depth_out(depths, losses)
    errors = [p.error for p in loo if p.error is not None]
    grid, objective = depth_profile(depths, losses)
    flat = grid[objective <= objective.min() * (1 + FLAT_WITHIN) + 1e-15]
    flat_range = [float(flat.min()), float(flat.max())]
    weak = (flat_range[1] - flat_range[0] > WEAK_SPAN or ci is None or ci[1] - ci[0] > WEAK_CI)
    return DepthFit(
        width=width, tokens=tokens, depths=[int(d) for d in depths], losses=[float(v) for v in losses],
        alpha_l=best["a"], c_l=best["c"], L0=best["L0"], ci95=ci, bootstrap_valid=valid, loo=loo,
        loo_rmse=float(np.sqrt(np.mean(np.square(errors)))) if errors else None,
        profile=[ProfilePoint(float(a), float(v)) for a, v in zip(grid[::PROFILE_EVERY], objective[::PROFILE_EVERY],
                                                                  strict=True)],
        flat_range=flat_range, weakly_identified=bool(weak), references=references())


def _leave_one_depth_out(depths: np.ndarray, losses: np.ndarray) -> list[LooPoint]:
    """Each depth's mean loss against the prediction of the fit to the other depths (None where fewer
    than three depths are left)."""
    points = []
    for level in np.unique(depths):
        out = depths == level
        measured = float(losses[out].mean())
        if len(np.unique(depths[~out])) < MIN_DEPTHS:
            points.append(LooPoint(int(level), measured, None, None))
            continue
        fit = fit_depth(depths[~out], losses[~out])
        predicted = float(fit["c"][0] / level ** fit["a"][0] + fit["L0"][0])
        points.append(LooPoint(int(level), measured, predicted, predicted - measured))
    return points


def family_fit(members: Sequence[Member], bootstrap: int) -> DepthFit | None:
    """The depth term in the cell with the most depths."""
    if not members:
        return None
    width, tokens = fitted_cell(members)
    cell = [m for m in members if (m.width, m.tokens) == (width, tokens)]
    return depth_fit([m.depth for m in cell], [m.heldout_loss for m in cell], bootstrap, width, tokens)


def full_law(members: Sequence[Member], bootstrap: int) -> tuple[FullLaw | None, str]:
    """scaling-fit's full law fitted to the family's CSV where widths or budgets vary; else (None, why)."""
    if len({m.width for m in members}) < 2 and len({m.tokens for m in members}) < 2:
        return None, "one width and one token budget: the depth term alone"
    with tempfile.TemporaryDirectory() as temporary:
        path = Path(temporary) / "family.csv"
        write_csv(path, members)
        settings = ScalingFitSettings(csv=str(path), exclude_highest=0, bootstrap=bootstrap)
        try:
            found = [item for item in run_scaling_fit(load_runs(path, settings), settings)
                     if isinstance(item, Result)]
        except UserError as exc:
            return None, f"the full law was not fitted: {exc}"
    doc = from_doc(ScalingFitResult, found[-1].data)
    return FullLaw(params=doc.params, ci95=doc.ci95, objective=doc.objective, n_points=doc.n_points), \
        "scaling-fit's full law on the family's CSV"
