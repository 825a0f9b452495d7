"""Batched fits of a sum of power laws plus a floor, L = sum_k c_k / x_k^a_k + L0, in log space.

Many problems are solved at once: every restart, every bootstrap resample and every held-out split is
one row of a batch, and differs only in its start point and in per-point weights (a bootstrap resample
is a vector of multiplicities; a training split is a 0/1 mask). One Levenberg-Marquardt loop in numpy
then runs all rows together, so hundreds of restarts cost about as much as a few, with no processes.

Parametrisation (after Hoffmann et al. 2022): log L_pred = logsumexp(b_k - a_k u_k, E), where
u_k = log x_k - centre_k is the centred log feature. Centring keeps b_k (the log of term k at the
geometric-mean point) of order one, which conditions the problem far better than log c_k.
The residual is r = log L_pred - log L; the objective is sum w r^2 / 2 (least squares) or
sum w huber_delta(r) (Huber, solved by iteratively reweighted least squares inside the LM loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.events import CancelToken

ALPHA_MAX = 10.0
_NO_FLOOR = -1e3  # log L0 for a fit without a floor: exp(-1000) is exactly 0.0 in float64


@dataclass(frozen=True)
class BatchFit:
    """Results of a batched fit: one row per problem."""

    theta: np.ndarray  # (R, 2K+1): b_1..b_K, a_1..a_K, E
    objective: np.ndarray  # (R,)
    iterations: int


def n_params(k: int) -> int:
    return 2 * k + 1


def _logits(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The K log-terms and the log floor for every problem and point: (R, N, K+1)."""
    k = u.shape[1]
    z = theta[:, None, :k] - theta[:, None, k : 2 * k] * u[None, :, :]
    return np.concatenate([z, np.broadcast_to(theta[:, None, 2 * k : 2 * k + 1], z.shape[:2] + (1,))], axis=2)


def log_predict(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    """log L_pred for every problem and point: theta (R, 2K+1), u (N, K) -> (R, N)."""
    z = _logits(theta, u)
    top = z.max(axis=2, keepdims=True)
    predicted: np.ndarray = (top + np.log(np.exp(z - top).sum(axis=2, keepdims=True)))[..., 0]
    return predicted


def rho(r: np.ndarray, delta: float | None) -> np.ndarray:
    """Per-point loss: r^2/2, or Huber with threshold delta."""
    squares: np.ndarray = 0.5 * r * r
    if delta is None:
        return squares
    a = np.abs(r)
    huber: np.ndarray = np.where(a <= delta, squares, delta * (a - 0.5 * delta))
    return huber


def objective(
    theta: np.ndarray, u: np.ndarray, y: np.ndarray, w: np.ndarray, delta: float | None
) -> np.ndarray:
    """sum_i w_i rho(r_i) for every problem: (R,)."""
    total: np.ndarray = (w * rho(log_predict(theta, u) - y, delta)).sum(axis=1)
    return total


def _jacobian(theta: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log L_pred (R, N) and its Jacobian (R, N, 2K+1)."""
    k = u.shape[1]
    z = _logits(theta, u)
    top = z.max(axis=2, keepdims=True)
    e = np.exp(z - top)
    s = e.sum(axis=2, keepdims=True)
    p = e / s
    pred = (top + np.log(s))[..., 0]
    jac = np.concatenate([p[..., :k], -p[..., :k] * u[None, :, :], p[..., k:]], axis=2)
    return pred, jac


def _clip(theta: np.ndarray, k: int, floor: bool) -> np.ndarray:
    theta = theta.copy()
    theta[:, k : 2 * k] = np.clip(theta[:, k : 2 * k], 0.0, ALPHA_MAX)
    if not floor:
        theta[:, 2 * k] = _NO_FLOOR
    return theta


def fit_batched(
    u: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    theta0: np.ndarray,
    delta: float | None = None,
    floor: bool = True,
    max_iter: int = 300,
    tol: float = 1e-12,
    cancel: CancelToken | None = None,
    fixed: np.ndarray | None = None,
) -> BatchFit:
    """Minimises sum_i w_i rho(r_i) for every row of theta0 at once (Levenberg-Marquardt).

    u: (N, K) centred log features; y: (N,) log losses; weights: (N,) or (R, N); theta0: (R, 2K+1).
    Exponents are kept in [0, ALPHA_MAX] by projection; with floor=False, L0 is fixed at 0.
    `fixed` (a boolean mask over the 2K+1 parameters) holds those at their start values (profiles).
    """
    k = u.shape[1]
    p = n_params(k)
    r_count = theta0.shape[0]
    w = np.broadcast_to(weights, (r_count, u.shape[0])).astype(float)
    free = np.ones(p, dtype=bool)
    free[2 * k] = floor
    if fixed is not None:
        free &= ~np.asarray(fixed, dtype=bool)
    theta = _clip(np.asarray(theta0, dtype=float), k, floor)
    f = objective(theta, u, y, w, delta)
    lam = np.full(r_count, 1e-3)
    active = np.ones(r_count, dtype=bool)
    eye = np.eye(p)
    iterations = 0
    while iterations < max_iter and active.any():
        if cancel is not None:
            cancel.check()
        iterations += 1
        idx = np.flatnonzero(active)
        th, ww = theta[idx], w[idx]
        pred, jac = _jacobian(th, u)
        jac = jac * free
        r = pred - y
        omega = np.ones_like(r) if delta is None else np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300))
        a = np.einsum("rni,rn,rnj->rij", jac, ww * omega, jac)
        g = np.einsum("rni,rn->ri", jac, ww * omega * r)
        diag = np.einsum("rii->ri", a)
        damp = lam[idx, None] * (diag + 1e-9) + (~free) * 1.0
        step = -np.linalg.solve(a + damp[:, :, None] * eye, g[..., None])[..., 0]
        trial = _clip(th + step * free, k, floor)
        f_trial = objective(trial, u, y, ww, delta)
        better = f_trial < f[idx]
        gain = np.where(better, f[idx] - f_trial, 0.0)
        theta[idx[better]] = trial[better]
        f[idx[better]] = f_trial[better]
        lam[idx] = np.where(better, np.maximum(lam[idx] / 3.0, 1e-12), lam[idx] * 4.0)
        done = (better & (gain <= tol * np.maximum(f[idx], 1e-300))) | (lam[idx] > 1e10)
        active[idx[done]] = False
    return BatchFit(theta=theta, objective=f, iterations=iterations)


def random_starts(rng: np.random.Generator, n: int, k: int, y: np.ndarray, floor: bool = True) -> np.ndarray:
    """Start points spread over plausible scales: each term a fraction of the median loss at the
    centre, exponents in (0.05, 2.5), the floor a fraction of the smallest loss."""
    theta = np.empty((n, n_params(k)))
    theta[:, :k] = np.median(y) + rng.uniform(-5.0, 0.0, size=(n, k))
    theta[:, k : 2 * k] = rng.uniform(0.05, 2.5, size=(n, k))
    theta[:, 2 * k] = (y.min() + np.log(rng.uniform(0.05, 0.95, size=n))) if floor else _NO_FLOOR
    return theta


def to_natural(theta: np.ndarray, centre: np.ndarray, floor: bool = True) -> dict[str, np.ndarray]:
    """b, a, E -> c_k = exp(b_k + a_k centre_k), a_k, L0 = exp(E); arrays over rows of theta."""
    theta = np.atleast_2d(theta)
    k = centre.shape[0]
    alpha = theta[:, k : 2 * k]
    return {
        "alpha": alpha,
        "log_c": theta[:, :k] + alpha * centre[None, :],
        "L0": np.exp(theta[:, 2 * k]) if floor else np.zeros(theta.shape[0]),
    }


def best_per_group(fit: BatchFit, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows are laid out group-major (groups x restarts): the best theta and objective of each group."""
    obj = fit.objective.reshape(groups, -1)
    obj = np.where(np.isfinite(obj), obj, np.inf)
    pick = obj.argmin(axis=1)
    theta = fit.theta.reshape(groups, obj.shape[1], -1)[np.arange(groups), pick]
    return theta, obj[np.arange(groups), pick]


@dataclass(frozen=True)
class AdamFit:
    """A plain Adam descent: the final parameters and snapshots at the recorded steps."""

    params: np.ndarray  # (2K+1,): log c_1..c_K, a_1..a_K, L0, in the units of the features given
    snapshots: tuple[tuple[int, np.ndarray], ...]  # (step, params) at each recorded step


def fit_adam(
    x: np.ndarray,
    y: np.ndarray,
    start: np.ndarray,
    lr: np.ndarray,
    steps: int,
    record: tuple[int, ...] = (),
    scale: float = 100.0,
    dtype: type = np.float32,
    cancel: CancelToken | None = None,
) -> AdamFit:
    """Minimises scale * mean((log L_pred - y)^2), L_pred = sum_k exp(log c_k) x_k^-a_k + L0, by Adam.

    The parametrisation (log c_k, a_k, L0 with x the raw log features), the per-parameter learning
    rates `lr` and torch's Adam (betas 0.9/0.999, eps 1e-8, bias-corrected) are those of paper B's
    notebook, so the result depends on `steps` exactly as that procedure does. The arithmetic is in
    `dtype`, float32 by default as in torch: along the nearly flat valley of a_l even the rounding
    moves the answer (at 50,000 steps on Chinchilla a_l is 1.202 in float32, 1.196 in float64).
    x: (N, K) logs of the features; y: (N,) log losses; start and lr: (2K+1,)."""
    k = x.shape[1]
    x, y = np.asarray(x, dtype=dtype), np.asarray(y, dtype=dtype)
    p: np.ndarray = np.asarray(start, dtype=dtype).copy()
    lr = np.asarray(lr, dtype=dtype)
    m1, m2 = np.zeros_like(p), np.zeros_like(p)
    b1, b2, eps = dtype(0.9), dtype(0.999), dtype(1e-8)
    n = len(y)
    g_scale = dtype(2.0 * scale / n)
    wanted = set(record)
    snapshots = []
    for t in range(1, steps + 1):
        if cancel is not None and t % 1000 == 0:
            cancel.check()
        terms = np.exp(p[:k] - p[k : 2 * k] * x)
        pred = terms.sum(axis=1) + p[2 * k]
        g_pred = g_scale * (np.log(pred) - y) / pred
        g_terms = g_pred[:, None] * terms
        grad = np.concatenate([g_terms.sum(axis=0), -(g_terms * x).sum(axis=0), g_pred.sum(keepdims=True)])
        m1 = b1 * m1 + (1 - b1) * grad
        m2 = b2 * m2 + (1 - b2) * grad * grad
        p = p - lr * (m1 / dtype(1 - 0.9**t)) / (np.sqrt(m2 / dtype(1 - 0.999**t)) + eps)
        if t in wanted:
            snapshots.append((t, p.astype(float)))
    return AdamFit(params=p.astype(float), snapshots=tuple(snapshots))
