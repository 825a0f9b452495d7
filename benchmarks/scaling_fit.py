"""Multi-restart loss-decomposition fit: one batched Levenberg-Marquardt run over every restart
against the straightforward loop of scipy.optimize.minimize (L-BFGS-B) per restart, same starts,
same objective; checks that both reach the same optimum. Also times the default 200-resample
bootstrap. Data: the Chinchilla runs shipped in the package, else synthetic runs.

    python benchmarks/scaling_fit.py [--restarts 64]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import minimize

from engine.core.events import Result
from engine.evaluation import powerfit
from engine.experiments.scaling_fit.run import Runs, exclude_highest, load_runs, run_scaling_fit
from engine.experiments.scaling_fit.vocabulary import ScalingFitSettings, default_csv


def data() -> tuple[Runs, str]:
    if default_csv().is_file():
        return load_runs(default_csv(), ScalingFitSettings()), "chinchilla"
    rng = np.random.default_rng(0)
    n = 245
    ranges = ((256, 8192), (4, 96), (1e8, 1e11))
    m, depth, d = (np.exp(rng.uniform(np.log(a), np.log(b), n)) for a, b in ranges)
    loss = (300 / m**0.9 + 6 / depth**1.3 + 700 / d**0.3 + 1.7) * np.exp(rng.normal(0, 0.01, n))
    return Runs(m, depth, d, loss, "synthetic", n), "synthetic"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--restarts", type=int, default=64)
    args = parser.parse_args()
    runs, name = data()
    kept = exclude_highest(runs, ScalingFitSettings().exclude_highest)
    x = np.log(np.stack([kept.width, kept.depth, kept.tokens], axis=1))
    u, y = x - x.mean(axis=0), np.log(kept.loss)
    w = np.ones(len(y))
    starts = powerfit.random_starts(np.random.default_rng(0), args.restarts, 3, y)
    bounds = [(None, None)] * 3 + [(0.0, powerfit.ALPHA_MAX)] * 3 + [(None, None)]

    def f(theta: np.ndarray) -> float:
        return float(powerfit.objective(theta[None], u, y, w[None], None)[0])

    t0 = time.perf_counter()
    loop = [minimize(f, s, method="L-BFGS-B", bounds=bounds, options={"maxiter": 5000}).fun for s in starts]
    t_loop = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = powerfit.fit_batched(u, y, w, starts)
    t_batch = time.perf_counter() - t0
    best_loop, best_batch = min(loop), float(batch.objective.min())
    same = abs(best_loop - best_batch) <= 1e-4 * best_loop
    print(f"data: {name}, {len(y)} runs, {args.restarts} restarts")
    print(f"loop of scipy L-BFGS-B: {t_loop:.2f} s, best objective {best_loop:.8g}")
    print(f"batched LM (numpy):     {t_batch:.2f} s, best objective {best_batch:.8g}, "
          f"{batch.iterations} iterations")
    print(f"same optimum (rel 1e-4): {same}; batched reaches the best in "
          f"{int(np.sum(batch.objective <= best_batch * (1 + 1e-3)))} of {args.restarts} restarts, loop in "
          f"{int(np.sum(np.asarray(loop) <= best_batch * (1 + 1e-3)))}")
    t0 = time.perf_counter()
    result = [e for e in run_scaling_fit(runs, ScalingFitSettings()) if isinstance(e, Result)][0]
    print(f"full default fit (512 restarts, 200 bootstrap resamples x 8 starts, 20 splits): "
          f"{time.perf_counter() - t0:.1f} s, of which bootstrap {result.data['bootstrap']['seconds']:.1f} s")
    if not same:
        raise SystemExit("the two optimisers disagree on the optimum")
    print(f"ratio scaling_fit_vectorised: {t_loop / t_batch:.1f}")


if __name__ == "__main__":
    main()
