"""A2-A3: how predictable each weight matrix is from its layer index (Ridge on polynomial and
trigonometric features), how consecutive weight changes correlate, the same statistics under two
null models, and the R²-perplexity paradox (predicted weights put into the model).

Every statistic here is a function of one component's Gram matrix G[a, b] = <W_a, W_b> over the
layers and of each layer's element mean: Ridge predictions are Ŷ = H Y with the n x n hat matrix H
(it does not depend on the weights), so residual norms, cosines and leave-one-layer-out residuals
(e_i = r_i / (1 - H_ii), exact for ridge) are quadratic forms in G. A component is therefore read
once, in column chunks accumulated in float64, and never stacked whole. The nulls are cheap too: a
shuffled layer order permutes G, and independent Gaussian layers with each layer's own mean and std
have a Gram matrix that is drawn exactly (one Wishart draw plus one normal per layer), which has the
same distribution as generating the matrices element by element.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from engine.core.codec import ABSENT, json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.data.eval_data import EvalProtocol
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import degradation_pct
from engine.experiments.context import RunContext
from engine.experiments.weights.vocabulary import (
    ComponentAnalysed,
    FitSummary,
    LayerFit,
    NullModel,
    ParadoxRow,
    ParadoxTrial,
    WeightsComponent,
    WeightsLayer,
    WeightsResult,
    WeightsSettings,
)
from engine.models.anatomy import LayerStack

WEIGHTS_UNIT = "analyses"  # each component's, then with --paradox the predicted weights put in the model
SUMMARY_KEYS = ("r2_in_sample", "r2_loo", "cosine_loo", "delta_corr_mean", "delta_corr_sd")  # WeightStats' fields




# --- features and the hat matrix ---------------------------------------------------------------
def index_features(n_layers: int, degree: int, frequencies: Sequence[float]) -> np.ndarray:
    """Columns x, x², ..., x^degree, sin(2πfx), cos(2πfx) of the normalised index x = l / (n-1)."""
    x = np.arange(n_layers) / max(n_layers - 1, 1)
    columns = [x**k for k in range(1, degree + 1)]
    for f in frequencies:
        columns += [np.sin(2 * np.pi * f * x), np.cos(2 * np.pi * f * x)]
    return np.stack(columns, axis=1)


def hat_matrix(features: np.ndarray, alpha: float) -> np.ndarray:
    """H with Ŷ = H Y for sklearn's Ridge (unpenalised intercept): fitting the identity as targets
    gives H itself, because the predictions are linear in the targets."""
    from sklearn.linear_model import Ridge

    n = len(features)
    hat: np.ndarray = Ridge(alpha=alpha, fit_intercept=True).fit(features, np.eye(n)).predict(features)
    return hat


# --- Gram matrices ------------------------------------------------------------------------------
@dataclass
class Gram:
    """Inner products between the flattened layers of one component, and each layer's element mean."""

    gram: np.ndarray  # (n, n) float64
    means: np.ndarray  # (n,)
    size: int  # elements per layer

    def permuted(self, order: np.ndarray) -> Gram:
        return Gram(self.gram[np.ix_(order, order)], self.means[order], self.size)

    def stds(self) -> np.ndarray:
        spread: np.ndarray = np.sqrt(np.maximum(np.diag(self.gram) / self.size - self.means**2, 0.0))
        return spread


def gram_of(tensors: Sequence[torch.Tensor], chunk: int = 1 << 14) -> Gram:
    """Reads the layers in column chunks (float64), so the extra memory is one chunk per layer."""
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise UserError(f"this component's shape differs across layers ({sorted(shapes)}); pick others")
    home = tensors[0].device  # layers of a split model sit on several GPUs (or offloaded on the host)
    flat = [t.detach().reshape(-1) for t in tensors]
    size = flat[0].numel()
    gram = np.zeros((len(flat), len(flat)))
    sums = np.zeros(len(flat))
    for start in range(0, size, chunk):
        block = torch.stack([f[start : start + chunk].to(home) for f in flat]).double()
        gram += (block @ block.T).cpu().numpy()
        sums += block.sum(dim=1).cpu().numpy()
    return Gram(gram, sums / size, size)


def independent_gram(means: np.ndarray, stds: np.ndarray, size: int, rng: np.random.Generator) -> Gram:
    """An exact draw of the Gram matrix of layers Y_a = mean_a + std_a * z_a, z_a ~ N(0, I_size)
    independent. Split each z_a along the all-ones direction u: z_a·u ~ N(0, 1) and the rest's Gram
    matrix is Wishart(size - 1, I), independent of it."""
    from scipy.stats import wishart

    n = len(means)
    if size <= n:
        raise UserError(f"a component of {size} elements is too small for the independent null ({n} layers)")
    s = rng.standard_normal(n)
    w = np.atleast_2d(wishart(df=size - 1, scale=np.eye(n)).rvs(random_state=rng))
    zz = np.outer(s, s) + w
    zsum = math.sqrt(size) * s
    gram = (
        size * np.outer(means, means)
        + np.outer(means, stds * zsum)
        + np.outer(stds * zsum, means)
        + np.outer(stds, stds) * zz
    )
    return Gram(gram, means + stds * zsum / size, size)


# --- statistics ---------------------------------------------------------------------------------
@dataclass
class Fit:
    """Per-layer Ridge results over the fitted rows (in-sample and leave-one-layer-out)."""

    rows: np.ndarray
    r2_in_sample: float
    r2_loo: float
    layer_r2_in: np.ndarray
    layer_r2_loo: np.ndarray
    layer_cos_in: np.ndarray
    layer_cos_loo: np.ndarray


def ridge_fit(g: Gram, hat: np.ndarray, rows: np.ndarray) -> Fit:
    """R² = 1 - Σ residual² / Σ ||W_l - mean over fitted layers||² (the multi-output regression R²,
    variance-weighted), in-sample and with each layer predicted by a fit that never saw it."""
    gram = g.gram[np.ix_(rows, rows)]
    k = len(rows)
    resid = np.eye(k) - hat
    res_sq = np.einsum("ij,jk,ik->i", resid, gram, resid)  # ||W_i - Ŵ_i||²
    own = np.diag(gram)
    pred_dot = (hat * gram).sum(axis=1)  # <Ŵ_i, W_i> (gram symmetric)
    pred_sq = np.einsum("ij,jk,ik->i", hat, gram, hat)
    lever = 1.0 - np.diag(hat)
    loo_res_sq = res_sq / lever**2
    loo_dot = own - (own - pred_dot) / lever  # Ŵ_loo = W - r / (1 - H_ii)
    loo_sq = own - 2 * (own - pred_dot) / lever + loo_res_sq
    center = np.eye(k) - 1.0 / k
    total = np.einsum("ij,jk,ik->i", center, gram, center)
    return Fit(
        rows=rows,
        r2_in_sample=float(1 - res_sq.sum() / total.sum()),
        r2_loo=float(1 - loo_res_sq.sum() / total.sum()),
        layer_r2_in=1 - res_sq / total,
        layer_r2_loo=1 - loo_res_sq / total,
        layer_cos_in=pred_dot / np.sqrt(pred_sq * own),
        layer_cos_loo=loo_dot / np.sqrt(np.maximum(loo_sq, 0.0) * own),
    )


def delta_correlations(g: Gram) -> np.ndarray:
    """Pearson r over elements of Δ_l = W_{l+1} - W_l and Δ_{l+1}, for l = 0 .. n-3."""
    n = len(g.means)
    diff = np.eye(n, k=1)[: n - 1] - np.eye(n)[: n - 1]
    cov = diff @ g.gram @ diff.T - g.size * np.outer(diff @ g.means, diff @ g.means)
    var = np.diag(cov)
    return np.array([cov[i, i + 1] / math.sqrt(var[i] * var[i + 1]) for i in range(n - 2)])


class Analysis:
    """The fixed parts of the analysis (features, hat matrices) applied to any Gram matrix."""

    def __init__(self, n_layers: int, settings: WeightsSettings) -> None:
        features = index_features(n_layers, settings.degree, settings.frequencies)
        self.predicted = np.arange(settings.first_layer, n_layers)
        self.every = np.arange(n_layers)
        self.hat_predicted = hat_matrix(features[self.predicted], settings.alpha)
        self.hat_every = hat_matrix(features, settings.alpha)

    def summary(self, g: Gram) -> tuple[dict[str, float], Fit, np.ndarray]:
        fit = ridge_fit(g, self.hat_predicted, self.predicted)
        deltas = delta_correlations(g)
        values = {
            "r2_in_sample": fit.r2_in_sample,
            "r2_loo": fit.r2_loo,
            "cosine_loo": float(np.mean(fit.layer_cos_loo)),
            "delta_corr_mean": float(np.mean(deltas)),
            "delta_corr_sd": float(np.std(deltas, ddof=1)) if len(deltas) > 1 else 0.0,
        }
        return values, fit, deltas

    def null(self, draws: list[Gram]) -> NullModel:
        """Mean of each statistic over the null draws, with its [min, max] range."""
        values = [self.summary(g)[0] for g in draws]
        return NullModel(
            **{key: float(np.mean([v[key] for v in values])) for key in SUMMARY_KEYS},
            range={k: [min(v[k] for v in values), max(v[k] for v in values)] for k in SUMMARY_KEYS},
            draws=len(values),
        )


def null_range(null: NullModel, key: str) -> tuple[float, float]:
    """A null's [min, max] of one statistic, as `Analysis.null` computed it from its draws (never None:
    None stands for a missing value only in a result read back)."""
    low, high = null.range[key]
    assert low is not None and high is not None
    return low, high


def reading(real: float, shuffled: NullModel, independent: NullModel, key: str) -> str:
    """One line: where the real value sits against the two nulls' ranges."""
    low, high = null_range(independent, key)
    if low <= real <= high:
        return "indistinguishable from independent layers"
    s_low, s_high = null_range(shuffled, key)
    if s_low <= real <= s_high:
        return "indistinguishable from a shuffled layer order (depth order adds nothing)"
    side = "above" if real > max(high, s_high) else "below" if real < min(low, s_low) else "between"
    return f"{side} both nulls (independent [{low:.3g}, {high:.3g}], shuffled [{s_low:.3g}, {s_high:.3g}])"


# --- the paradox --------------------------------------------------------------------------------
def predicted_weights(
    tensors: Sequence[torch.Tensor], hat: np.ndarray, rows: np.ndarray, targets: Sequence[int], loo: bool
) -> dict[int, torch.Tensor]:
    """Ridge predictions Ŵ_t = Σ_j H[t, j] W_j (or the leave-one-out ones) for the target layers.

    One layer at a time: the sum runs in float32 on the target layer's device (a half-precision
    sum of ~30 terms would round at every one; the other layers may sit on other GPUs) and is cast
    once to the weights' dtype, then kept in host memory, so the device never holds more than one
    prediction beside the model."""
    position = {int(layer): i for i, layer in enumerate(rows)}
    out = {}
    for layer in targets:
        i, home = position[layer], tensors[layer].device
        pred = cast(torch.Tensor, sum(float(hat[i, j]) * tensors[int(r)].detach().to(home).float()
                                      for j, r in enumerate(rows)))  # rows: never empty
        if loo:
            own = tensors[layer].detach().float()
            pred = own - (own - pred) / (1.0 - float(hat[i, i]))
        out[layer] = pred.to("cpu", tensors[layer].dtype)
        del pred
    return out


def _fit_doc(fit: Fit, position: int) -> LayerFit:
    return LayerFit(
        r2_in_sample=fit.layer_r2_in[position],
        r2_loo=fit.layer_r2_loo[position],
        cosine_in_sample=fit.layer_cos_in[position],
        cosine_loo=fit.layer_cos_loo[position],
    )


def run_weights(
    model: Any, tokenizer: Any, settings: WeightsSettings, cancel: CancelToken | None = None, model_name: str = ""
) -> Iterator[Event]:
    settings.validate()
    started = time.perf_counter()
    stack = LayerStack(model)
    names = settings.validate_for(len(stack), stack.model_type)
    n = len(stack)
    analysis = Analysis(n, settings)
    rng = np.random.default_rng(settings.seed)
    components: dict[str, WeightsComponent] = {}
    fits: dict[str, Fit] = {}
    steps = len(names) + (1 if settings.paradox else 0)
    yield Progress(0, steps, "weights", unit=WEIGHTS_UNIT)
    for step, name in enumerate(names):
        if cancel is not None:
            cancel.check()
        tensors = [stack.readable_matrices(i)[name] for i in range(n)]
        g = gram_of(tensors, settings.chunk)
        values, fit, deltas = analysis.summary(g)
        every = ridge_fit(g, analysis.hat_every, analysis.every)
        shuffled = analysis.null([g.permuted(rng.permutation(n)) for _ in range(settings.null_draws)])
        means, stds = g.means, g.stds()
        independent = analysis.null(
            [independent_gram(means, stds, g.size, rng) for _ in range(settings.null_draws)]
        )
        per_layer = []
        for layer in range(n):
            in_predicted = layer >= settings.first_layer
            per_layer.append(WeightsLayer(
                layer=layer,
                predicted=_fit_doc(fit, layer - settings.first_layer) if in_predicted else None,
                all_layers=_fit_doc(every, layer),
                delta_corr=deltas[layer] if layer < n - 2 else None,
                mean=means[layer],
                std=stds[layer],
            ))
        components[name] = WeightsComponent(
            **values,
            shape=list(tensors[0].shape),
            all_layers=FitSummary(
                r2_in_sample=every.r2_in_sample,
                r2_loo=every.r2_loo,
                cosine_loo=float(np.mean(every.layer_cos_loo)),
            ),
            null_shuffled=shuffled,
            null_independent=independent,
            reading={key: reading(values[key], shuffled, independent, key) for key in SUMMARY_KEYS},
            per_layer=per_layer,
        )
        fits[name] = fit
        null_delta = independent.delta_corr_mean
        assert null_delta is not None  # the mean over the null's draws (null): a float
        yield ComponentAnalysed(name, fit.r2_in_sample, fit.r2_loo, values["delta_corr_mean"], null_delta)
        yield Progress(step + 1, steps, "weights", unit=WEIGHTS_UNIT)

    rows: list[ParadoxRow] = []
    baseline, protocol = None, ABSENT
    if settings.paradox:
        yield Message("paradox: putting predicted weights into the model")
        rows, baseline, protocol = yield from _paradox(model, tokenizer, stack, names, fits, analysis, settings, cancel)
        yield Progress(steps, steps, "weights", unit=WEIGHTS_UNIT)
    doc = WeightsResult(
        model=model_name,
        family=stack.family,
        n_layers=n,
        predicted_layers=[settings.first_layer, n - 1],
        settings=settings,
        components=components,
        paradox=rows,
        baseline_ppl=baseline,
        seconds=time.perf_counter() - started,
        protocol=protocol,
    )
    yield Result("weights", json_safe(doc))


def paradox_order(fits: dict[str, Fit], settings: WeightsSettings) -> list[int]:
    """The replacement order: the user's, or the best-predicted layers first (mean R² over components
    of the prediction being used), the case most favourable to the regression."""
    if settings.paradox_layers:
        return list(dict.fromkeys(settings.paradox_layers))
    fit = next(iter(fits.values()))
    attr = "layer_r2_in" if settings.paradox_prediction == "in_sample" else "layer_r2_loo"
    score = np.mean([getattr(f, attr) for f in fits.values()], axis=0)
    return [int(fit.rows[i]) for i in np.argsort(-score, kind="stable")]


def _paradox(model: Any, tokenizer: Any, stack: LayerStack, names: tuple[str, ...], fits: dict[str, Fit],
             analysis: Analysis, settings: WeightsSettings, cancel: CancelToken | None
             ) -> Generator[Event, None, tuple[list[ParadoxRow], float, EvalProtocol]]:
    evaluator = Evaluator.for_settings(model, tokenizer, settings, cancel=cancel)
    baseline = evaluator.build_cache().perplexity
    order = paradox_order(fits, settings)
    counts = sorted({len(order) if c == 0 else min(c, len(order)) for c in settings.paradox_counts})
    loo = settings.paradox_prediction == "loo"
    rows = []
    for count in counts:
        if cancel is not None:
            cancel.check()
        layers = sorted(order[:count])
        with stack.preserved(layers, host=True):  # the originals in host memory, not beside the model
            for name in names:  # one component at a time: components do not feed each other's predictions
                tensors = [stack.readable_matrices(i)[name] for i in range(len(stack))]
                predicted = predicted_weights(tensors, analysis.hat_predicted, analysis.predicted, layers,
                                              loo)
                with torch.no_grad():
                    for layer, weight in predicted.items():
                        tensors[layer].copy_(weight)
                del predicted
            ppl = evaluator.perplexity(min(layers))
        positions = [layer - settings.first_layer for layer in layers]
        r2_in = float(np.mean([fits[c].layer_r2_in[positions] for c in names]))
        r2_loo = float(np.mean([fits[c].layer_r2_loo[positions] for c in names]))
        cos_attr = "layer_cos_loo" if loo else "layer_cos_in"
        rows.append(ParadoxRow(
            layers_replaced=layers,
            ppl=ppl,
            degradation_pct=degradation_pct(ppl, baseline),
            r2_in_sample_mean=r2_in,
            r2_loo_mean=r2_loo,
            cosine_mean=float(np.mean([getattr(fits[c], cos_attr)[positions] for c in names])),
            prediction=settings.paradox_prediction,
        ))
        yield ParadoxTrial(tuple(layers), ppl, baseline, r2_in, r2_loo)
    return rows, baseline, evaluator.protocol


def run(settings: WeightsSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: the context's model."""
    loaded = context.needed_model("weights")
    yield from run_weights(loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name)
