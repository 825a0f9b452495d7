"""Small statistics shared by experiments: degradation, classes, bootstrap intervals, rank correlation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# Lower bounds of D% for each class, from the paper (A1): critical >= 100, important >= 30,
# minor >= 10, redundant below.
CLASS_BOUNDS = (("critical", 100.0), ("important", 30.0), ("minor", 10.0))
CLASSES = ("critical", "important", "minor", "redundant")


def degradation_pct(ppl: float, baseline: float) -> float:
    return 100.0 * (ppl - baseline) / baseline


def importance_class(degradation: float) -> str:
    for name, bound in CLASS_BOUNDS:
        if degradation >= bound:
            return name
    return "redundant"


def bootstrap_degradation(
    nll: np.ndarray, base_nll: np.ndarray, tokens: np.ndarray, n: int, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of D% when the evaluation texts are resampled with replacement.

    The same resample is applied to the ablated and the baseline scores (a paired bootstrap).
    """
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(tokens), size=(n, len(tokens)))
    tok = tokens[draws].sum(axis=1)
    log_ratio = (nll[draws].sum(axis=1) - base_nll[draws].sum(axis=1)) / tok
    values = 100.0 * np.expm1(np.minimum(log_ratio, 700.0))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def spearman(first: npt.ArrayLike | Sequence[float | None], second: npt.ArrayLike | Sequence[float | None]
             ) -> float | None:
    """Spearman rank correlation, or None when it is undefined (constant input, < 3 points); a None
    is a missing value, left out as a NaN is. The Pearson correlation of the average ranks, as
    scipy.stats.spearmanr defines it (tests/test_ablation.py holds them equal), without importing
    scipy.stats: 0.4 CPU-s of every run."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return None
    value = float(np.corrcoef(average_ranks(a[keep]), average_ranks(b[keep]))[0, 1])
    return value if math.isfinite(value) else None


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given the mean of the ranks they span (scipy.stats.rankdata's "average")."""
    _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[group]


def bootstrap_perplexity(nll: np.ndarray, tokens: np.ndarray, n: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the token-weighted perplexity when the texts are resampled."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(tokens), size=(n, len(tokens)))
    mean_nll = nll[draws].sum(axis=1) / np.maximum(tokens[draws].sum(axis=1), 1)
    low, high = np.percentile(np.exp(np.minimum(mean_nll, 700.0)), [2.5, 97.5])
    return float(low), float(high)
