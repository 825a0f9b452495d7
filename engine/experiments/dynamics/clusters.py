"""dynamics' reductions: quartiles per layer, PCA and KMeans of the per-token angle profiles, the
clusters' rows with their typical tokens in context, and the summary of the core layers."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.errors import UserError
from engine.experiments.dynamics.profiles import Profiles
from engine.experiments.dynamics.vocabulary import (
    CLUSTER_K,
    DynamicsCore,
    DynamicsRow,
    PcaSample,
    Quartiles,
    TokenCluster,
)

SILHOUETTE_SAMPLE = 4000  # tokens the silhouette score is computed on (a random sample)
SILHOUETTE_WORKING_MB = 8  # scikit-learn's chunk size for the pairwise distances
SCATTER_POINTS = 300  # tokens kept with their PCA coordinates for the console's scatter
CORE = (0.25, 0.75)  # the "core" layers of the summary: the middle half of the stack


def quartiles(values: np.ndarray) -> Quartiles:
    """Median and quartiles over tokens, NaN (zero vectors) ignored; null where nothing is left."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Quartiles(median=None, q1=None, q3=None)
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return Quartiles(median=float(median), q1=float(q1), q3=float(q3))


def layer_rows(p: Profiles, lens_losses: list[float] | None) -> list[DynamicsRow]:
    n_layers = p.angle_state.shape[1]
    relative = p.relative_update()
    rows = []
    for index in range(n_layers):
        update = p.angle_update[:, index] if index < n_layers - 1 else np.array([])
        rows.append(DynamicsRow(
            layer=index,
            angle_state=quartiles(p.angle_state[:, index]),
            angle_update=quartiles(update),
            norm=quartiles(p.norm[:, index]),
            update_norm=quartiles(p.update_norm[:, index]),
            relative_update=quartiles(relative[:, index]),
            angle_final=quartiles(p.angle_final[:, index + 1]),
            progress=quartiles(p.progress[:, index + 1]),
            lens_loss=None if lens_losses is None else lens_losses[index],
        ))
    return rows


@dataclass
class Clustering:
    labels: np.ndarray  # cluster per token, 0 = the largest (bulk)
    k: int
    silhouette: dict[int, float]  # k -> silhouette score (empty when k was fixed)
    explained: list[float]
    coordinates: np.ndarray  # tokens x components
    centres: np.ndarray  # k x components


def silhouette(coords: np.ndarray, labels: np.ndarray, seed: int) -> float:
    """Silhouette on at most SILHOUETTE_SAMPLE tokens, distances computed in small chunks, so its
    memory stays a few MB however many tokens there are."""
    from sklearn import config_context
    from sklearn.metrics import silhouette_score

    sample = min(SILHOUETTE_SAMPLE, len(coords))
    with config_context(working_memory=SILHOUETTE_WORKING_MB):
        return float(silhouette_score(coords, labels, sample_size=sample, random_state=seed))


def cluster_profiles(matrix: np.ndarray, components: int, clusters: int = 0, seed: int = 0) -> Clustering:
    """PCA of the profiles, then KMeans in PCA space. k is fixed, or the one with the best
    silhouette over k = 2..6."""
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    matrix = np.where(np.isnan(matrix), np.nanmedian(matrix, axis=0), matrix)
    n = min(components, matrix.shape[0], matrix.shape[1])
    pca = PCA(n_components=n, random_state=seed)
    coords = pca.fit_transform(matrix)
    explained = [float(x) for x in pca.explained_variance_ratio_]

    def fit(k: int) -> KMeans:
        return KMeans(n_clusters=k, n_init=10, random_state=seed).fit(coords)

    scores: dict[int, float] = {}
    if clusters:
        if clusters > len(matrix):
            raise UserError(f"--clusters {clusters} is more than the {len(matrix)} tokens; lower it")
        best = fit(clusters)
    else:
        low, high = CLUSTER_K
        best = None
        for k in range(low, min(high, len(matrix) - 1) + 1):
            model = fit(k)
            if len(set(model.labels_)) < 2:
                continue
            scores[k] = silhouette(coords, model.labels_, seed)
            if best is None or scores[k] > scores[best.n_clusters]:
                best = model
        if best is None:
            best = fit(1)
    sizes = np.bincount(best.labels_, minlength=best.n_clusters)
    order = np.argsort(-sizes, kind="stable")
    relabel = np.empty_like(order)
    relabel[order] = np.arange(len(order))
    return Clustering(relabel[best.labels_], best.n_clusters, scores, explained, coords,
                      best.cluster_centers_[order])


def scatter_sample(c: Clustering, seed: int, size: int = SCATTER_POINTS) -> PcaSample:
    """At most `size` tokens, drawn without replacement by `seed` and kept in reading order, with
    their first two PCA coordinates (the second 0 when PCA kept one) and clusters: enough to see the
    clusters, small enough for the result file."""
    n = len(c.labels)
    picked = np.sort(np.random.default_rng(seed).choice(n, size=min(size, n), replace=False))
    coords = c.coordinates[picked]
    second = coords[:, 1] if coords.shape[1] > 1 else np.zeros(len(picked))
    return PcaSample(token=picked.tolist(), pc1=coords[:, 0].tolist(), pc2=second.tolist(),
                     label=c.labels[picked].tolist())


def token_in_context(tokenizer: Any, ids: Sequence[int], position: int, before: int = 8, after: int = 3) -> str:
    """'...context [[token]] context...' with the token at `position` marked."""
    left = tokenizer.decode(ids[max(0, position - before) : position])
    token = tokenizer.decode(ids[position : position + 1])
    right = tokenizer.decode(ids[position + 1 : position + 1 + after])
    return " ".join(f"{left}[[{token}]]{right}".split())


def cluster_rows(
    p: Profiles, c: Clustering, tokenizer: Any, text_ids: dict[int, list[int]], examples: int
) -> list[TokenCluster]:
    """One row per cluster, largest first: size, fraction, median profile, most typical tokens."""
    rows = []
    for label in range(c.k):
        members = np.flatnonzero(c.labels == label)
        distance = np.linalg.norm(c.coordinates[members] - c.centres[label], axis=1)
        typical = members[np.argsort(distance, kind="stable")[:examples]]
        words = Counter(
            tokenizer.decode([text_ids[int(t)][int(pos)]]) for t, pos in p.where[members]
        )
        positions = p.where[members, 1]
        rows.append(TokenCluster(
            label=label,
            bulk=label == 0,
            size=int(len(members)),
            fraction=float(len(members) / p.n_tokens),
            median_position=float(np.median(positions)),
            top_tokens=[[word, count] for word, count in words.most_common(5)],
            angle_state_median=[float(x) for x in np.nanmedian(p.angle_state[members], axis=0)],
            angle_update_median=[float(x) for x in np.nanmedian(p.angle_update[members], axis=0)]
            if p.angle_update.shape[1] else [],
            examples=[
                token_in_context(tokenizer, text_ids[int(t)], int(pos)) for t, pos in p.where[typical]
            ],
        ))
    return rows


def core_summary(p: Profiles) -> DynamicsCore:
    """Medians over the middle half of the layers: the numbers behind 'updates near 90 degrees'."""
    n = p.angle_state.shape[1]
    low, high = int(n * CORE[0]), max(int(n * CORE[0]) + 1, int(math.ceil(n * CORE[1])))
    update = p.angle_update[:, low : min(high, p.angle_update.shape[1])]
    return DynamicsCore(
        layers=[low, high - 1],
        angle_update_median=quartiles(update.ravel()).median,
        angle_state_median=quartiles(p.angle_state[:, low:high].ravel()).median,
        relative_update_median=quartiles(p.relative_update()[:, low:high].ravel()).median,
    )
