"""The depth term of paper B's law, L = c / l^a + L0 (c, L0 >= 0), fitted on a grid of exponents:
prune's exploratory curve of cut models and the depth family's trained members.

For a fixed a the model is linear in (c, L0), so each a on a fine grid is solved in closed form and
the best a kept: exact up to the grid, and a thousand bootstrap refits cost one array operation
(powerfit's iterative fit is built for many more parameters). The same grid gives the profile of
the objective over a (c and L0 refitted at each a), which shows how well a is identified."""

from __future__ import annotations

import numpy as np

A_GRID = np.linspace(0.01, 10.0, 1999)  # exponents tried; powerfit's bound, 0.005 apart


def _grid(depths: np.ndarray, losses: np.ndarray, weights: np.ndarray | None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c, L0, weighted SSE), each (R, G): the least-squares (c, L0) of every row at every a of the grid."""
    y = np.atleast_2d(losses)
    w = np.ones_like(y) if weights is None else np.atleast_2d(weights).astype(float)
    x = depths[None, :] ** -A_GRID[:, None]  # (G, N)
    total = w.sum(axis=1)  # (R,)
    xm = np.einsum("rn,gn->rg", w, x) / total[:, None]
    ym = (w * y).sum(axis=1) / total
    centred = x[None] - xm[:, :, None]  # (R, G, N)
    c = np.einsum("rgn,rn->rg", centred * w[:, None, :], y) / (w[:, None, :] * centred**2).sum(axis=2)
    floor = ym[:, None] - c * xm
    through_zero = floor < 0  # L0 would be negative: fit with L0 = 0
    c = np.where(through_zero, np.einsum("rn,gn->rg", w * y, x) / np.einsum("rn,gn->rg", w, x**2), c)
    floor = np.where(through_zero, 0.0, floor)
    flat = c < 0  # loss falls with depth removed: no depth term
    c, floor = np.where(flat, 0.0, c), np.where(flat, ym[:, None], floor)
    sse = (w[:, None, :] * (c[:, :, None] * x[None] + floor[:, :, None] - y[:, None, :]) ** 2).sum(axis=2)
    return c, floor, sse


def fit_depth(depths: np.ndarray, losses: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Least-squares fits of L = c / l^a + L0 (c, L0 >= 0), one per row of `losses` (R, N);
    `weights` (R, N): each point's multiplicity (a bootstrap draw), ones when None."""
    c, floor, sse = _grid(depths, losses, weights)
    best = sse.argmin(axis=1)
    rows = np.arange(c.shape[0])
    return {"a": A_GRID[best], "c": c[rows, best], "L0": floor[rows, best]}


def depth_profile(depths: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grid of a and the mean squared residual at each a (c and L0 refitted there)."""
    _, _, sse = _grid(depths, np.asarray(losses, dtype=float)[None, :], None)
    return A_GRID, sse[0] / len(depths)
