"""prune's depth law (exploratory): the `ppl` curve's loss against remaining depth l fitted to
c / l^a + L0, with a bootstrap interval on the exponent."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.evaluation.depth_law import fit_depth
from engine.evaluation.perplexity import TextScores
from engine.experiments.prune.vocabulary import CHINCHILLA_A_L, DepthLaw


def depth_law(n_layers: int, points: Sequence[tuple[int, TextScores]], resamples: int,
              seed: int) -> DepthLaw | None:
    """The `ppl` curve's loss (ln PPL) against remaining depth, fitted; ci95 from refits on
    bootstrap resamples of the evaluation texts. Exploratory: a pruned trained model is not a model
    trained at that depth."""
    depths = np.array([n_layers - removed_ for removed_, _ in points], dtype=float)
    nll = np.stack([scores.nll for _, scores in points])
    tokens = points[0][1].tokens
    losses = nll.sum(axis=1) / tokens.sum()
    if len(points) < 4 or not np.all(np.isfinite(losses)):
        return None
    fit = fit_depth(depths, losses)
    best = {key: float(value[0]) for key, value in fit.items()}
    ci = None
    if resamples:
        draws = np.random.default_rng(seed).integers(0, len(tokens), size=(resamples, len(tokens)))
        values = np.concatenate([  # in chunks: the grid search holds resamples x grid x points
            fit_depth(depths, nll[:, chunk].sum(axis=2).T / tokens[chunk].sum(axis=1)[:, None])["a"]
            for chunk in np.array_split(draws, max(1, resamples // 100))])
        ci = [float(v) for v in np.percentile(values, [2.5, 97.5])]
    return DepthLaw(
        **best, ci95=ci, points=len(depths), depths=depths.tolist(),
        label="exploratory: loss (ln PPL) of the ppl criterion's cuts against remaining depth l, "
              "fitted to c / l^a + L0; a pruned trained model is not a model trained at depth l",
        chinchilla=CHINCHILLA_A_L,
    )
