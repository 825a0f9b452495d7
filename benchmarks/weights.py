"""Weight statistics on the embedded model: the streamed Gram-matrix version (engine) against the
straightforward one (stack each component in float64, sklearn Ridge fit plus one refit per left-out
layer, deltas and independent Gaussian layers materialised), same statistics, same null draws.

Memory: a thread samples the process RSS (psutil) every 2 ms; "peak extra" is the highest RSS seen
during a version minus the RSS just before it (model loaded, libraries imported). tracemalloc would
not see torch's allocations, RSS does. Run: python benchmarks/weights.py [--draws N] [--components q,gate]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # a loaded machine makes multi-threaded BLAS spin

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402

from engine.experiments.weights.run import Analysis, gram_of, independent_gram, index_features
from engine.experiments.weights.vocabulary import WeightsSettings
from engine.models.anatomy import LayerStack  # noqa: E402
from engine.models.loading import load_model  # noqa: E402


class PeakRss:
    """Highest RSS above the starting RSS while the block runs, in MB."""

    def __enter__(self) -> PeakRss:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def streamed(stack: LayerStack, names, settings: WeightsSettings) -> dict[str, float]:
    analysis = Analysis(len(stack), settings)
    rng = np.random.default_rng(0)
    out = {}
    for name in names:
        g = gram_of([stack.matrices(i)[name] for i in range(len(stack))])
        values = analysis.summary(g)[0]
        analysis.null([g.permuted(rng.permutation(len(stack))) for _ in range(settings.null_draws)])
        analysis.null([independent_gram(g.means, g.stds(), g.size, rng) for _ in range(settings.null_draws)])
        out[name] = values["r2_loo"]
    return out


def _plain_stats(y: np.ndarray, features: np.ndarray, rows: np.ndarray, alpha: float) -> tuple[float, float]:
    """R² LOO and mean delta correlation by refitting sklearn's Ridge once per left-out layer."""
    sub, x = y[rows], features[rows]
    loo = np.empty_like(sub)
    for i in range(len(rows)):
        keep = np.arange(len(rows)) != i
        loo[i] = Ridge(alpha=alpha).fit(x[keep], sub[keep]).predict(x[i : i + 1])[0]
    Ridge(alpha=alpha).fit(x, sub).predict(x)  # the in-sample fit
    r2_loo = 1 - ((sub - loo) ** 2).sum() / ((sub - sub.mean(axis=0)) ** 2).sum()
    deltas = np.diff(y, axis=0)
    corr = [np.corrcoef(deltas[i], deltas[i + 1])[0, 1] for i in range(len(deltas) - 1)]
    return float(r2_loo), float(np.mean(corr))


def straightforward(stack: LayerStack, names, settings: WeightsSettings) -> dict[str, float]:
    n = len(stack)
    features = index_features(n, settings.degree, settings.frequencies)
    rows = np.arange(settings.first_layer, n)
    rng = np.random.default_rng(0)
    out = {}
    for name in names:
        y = np.stack([stack.matrices(i)[name].detach().double().reshape(-1).numpy() for i in range(n)])
        out[name] = _plain_stats(y, features, rows, settings.alpha)[0]
        means, stds = y.mean(axis=1), y.std(axis=1)
        for _ in range(settings.null_draws):
            _plain_stats(y[rng.permutation(n)], features, rows, settings.alpha)
            fake = means[:, None] + stds[:, None] * rng.standard_normal(y.shape)
            _plain_stats(fake, features, rows, settings.alpha)
            del fake
        del y
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=1, help="draws of each null (default 1)")
    parser.add_argument("--components", default="", help="comma list (default all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    stack = LayerStack(loaded.model)
    names = tuple(args.components.split(",")) if args.components else stack.matrix_names
    settings = WeightsSettings(null_draws=args.draws)
    stacked_mb = max(
        len(stack) * stack.matrices(0)[name].numel() * 4 / 2**20 for name in names
    )
    # The cached model may be memory-mapped: touch every weight first so that paging the model in is
    # not counted as memory the statistics use. Then a warm-up for imports and first-call costs.
    touched = sum(float(p.detach().double().sum()) for p in loaded.model.parameters())
    streamed(stack, names[:1], settings)

    with PeakRss() as fast_mem:
        started = time.perf_counter()
        fast = streamed(stack, names, settings)
        fast_s = time.perf_counter() - started
    with PeakRss() as plain_mem:
        started = time.perf_counter()
        plain = straightforward(stack, names, settings)
        plain_s = time.perf_counter() - started

    worst = max(abs(fast[k] - plain[k]) for k in names)
    print(f"components {','.join(names)}; null draws {args.draws}; largest component stacked in float32: "
          f"{stacked_mb:.0f} MB (two copies: {2 * stacked_mb:.0f} MB)")
    print(f"streamed Gram:   {fast_s:7.2f} s   peak extra RSS {fast_mem.extra_mb:8.1f} MB")
    print(f"straightforward: {plain_s:7.2f} s   peak extra RSS {plain_mem.extra_mb:8.1f} MB")
    print(f"largest |R² LOO difference| between the two: {worst:.2e} (weight checksum {touched:.3f})")
    memory_ratio = plain_mem.extra_mb / max(fast_mem.extra_mb, 0.1)
    print(f"speed ratio {plain_s / fast_s:.1f}x; memory ratio {memory_ratio:.1f}x")
    print(f"peak_mb weights: {fast_mem.extra_mb:.1f}")


if __name__ == "__main__":
    main()
