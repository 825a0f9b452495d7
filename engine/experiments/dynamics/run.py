"""B1: hidden-state dynamics. For every token and layer l, the angle between the layer's input and
output theta(h_l, h_l+1), the angle between consecutive updates theta(dh_l, dh_l+1) with
dh_l = h_l+1 - h_l, and the norms; then PCA and clustering of the per-token angle profiles.

Streamed: one batch is run at a time and each layer's states are reduced to a few floats per token
inside a forward hook, keeping only the previous layer's update. What grows with the corpus is the
per-token profile matrix (tokens x layers floats, which PCA needs), never the hidden states.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.core.files import read_lines
from engine.data.text import clip_text, corpus, heldout_texts
from engine.evaluation.perplexity import Batch, token_nll, tokenize_batches
from engine.experiments.context import RunContext
from engine.experiments.dynamics.vocabulary import (
    CLUSTER_K,
    DynamicsCore,
    DynamicsLayer,
    DynamicsPca,
    DynamicsResult,
    DynamicsRow,
    DynamicsSettings,
    LensLosses,
    PcaSample,
    Quartiles,
    TokenCluster,
)
from engine.models.anatomy import LayerStack, execution_device

SILHOUETTE_SAMPLE = 4000  # tokens the silhouette score is computed on (a random sample)
SILHOUETTE_WORKING_MB = 8  # scikit-learn's chunk size for the pairwise distances
SCATTER_POINTS = 300  # tokens kept with their PCA coordinates for the console's scatter
CORE = (0.25, 0.75)  # the "core" layers of the summary: the middle half of the stack
# Where each family keeps its final norm, for the logit lens (the head is get_output_embeddings()).
FINAL_NORMS = {
    "llama": "model.norm", "mistral": "model.norm", "qwen2": "model.norm", "qwen3": "model.norm",
    "gemma2": "model.norm", "gemma3_text": "model.norm", "phi3": "model.norm", "phi": "model.final_layernorm",
    "gpt2": "transformer.ln_f", "gpt_neox": "gpt_neox.final_layer_norm",
}






# --- angles ----------------------------------------------------------------------------------------


def angle_degrees(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle between vectors along the last axis, in degrees; NaN where either is zero.

    2 atan2(|u - v|, |u + v|) for unit u, v: accurate near 0 and 180 degrees, where arccos of the
    cosine loses half the digits."""
    a, b = a.float(), b.float()
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    u, v = a / na, b / nb
    theta = 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1))
    theta = torch.rad2deg(theta)
    zero = (na.squeeze(-1) == 0) | (nb.squeeze(-1) == 0)
    return theta.masked_fill(zero, math.nan)


@dataclass
class Profiles:
    """Per-token arrays (tokens x layers, float32) and where each token came from."""

    angle_state: np.ndarray  # theta(h_l, h_l+1), layer l = 0..L-1
    angle_update: np.ndarray  # theta(dh_l, dh_l+1), l = 0..L-2
    norm: np.ndarray  # |h_l+1|, the output norm of layer l
    update_norm: np.ndarray  # |dh_l|
    embedding_norm: np.ndarray  # |h_0|, one per token
    where: np.ndarray  # (text index, position) per token, int64
    angle_final: np.ndarray  # theta(h_l, h_L), states l = 0..L (L+1 columns)
    progress: np.ndarray  # s_l = <h_l - h_0, h_L - h_0> / |h_L - h_0|^2, states l = 0..L

    @property
    def n_tokens(self) -> int:
        return len(self.where)

    def relative_update(self) -> np.ndarray:
        """|dh_l| / |h_l|: how much of the residual stream layer l rewrites."""
        inputs = np.concatenate([self.embedding_norm[:, None], self.norm[:, :-1]], axis=1)
        return self.update_norm / inputs

    def matrix(self, profile: str) -> np.ndarray:
        """The per-token angle profile PCA sees (degrees, not rescaled: all columns share a unit)."""
        parts = {"state": [self.angle_state], "update": [self.angle_update],
                 "both": [self.angle_state, self.angle_update]}[profile]
        return np.concatenate(parts, axis=1)


def profiles_from_states(states: Sequence[torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """All per-token quantities from the L+1 residual states of one batch ([B, S, H] each),
    for the positions where `keep` is true. The all-at-once reference the stream must match."""
    meter = _BatchMeter(keep)
    for index in range(len(states) - 1):
        meter(index, states[index], states[index + 1])
    return meter.finish()


class _BatchMeter:
    """Reduces one batch layer by layer; holds only the previous layer's update."""

    def __init__(self, keep: torch.Tensor) -> None:
        self.keep = keep.bool()
        self.previous: torch.Tensor | None = None
        self.state: list[torch.Tensor] = []
        self.update: list[torch.Tensor] = []
        self.norm: list[torch.Tensor] = []
        self.update_norm: list[torch.Tensor] = []
        self.embedding_norm: torch.Tensor | None = None
        self.states: list[torch.Tensor] = []  # h_0 .. h_L of the kept tokens, for trajectory()

    def __call__(self, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        if index != len(self.state):
            raise RuntimeError(f"layer {index} seen out of order")
        keep = self.keep.to(layer_output.device)  # a dispatched model's layers sit on several GPUs
        x, y = layer_input[keep].float(), layer_output[keep].float()
        delta = y - x
        if index == 0:
            self.embedding_norm = x.norm(dim=-1)
            self.states.append(x)
        self.states.append(y)
        self.state.append(angle_degrees(x, y))
        self.norm.append(y.norm(dim=-1))
        self.update_norm.append(delta.norm(dim=-1))
        if self.previous is not None:
            self.update.append(angle_degrees(self.previous.to(delta.device), delta))
        self.previous = delta

    def finish(self) -> dict[str, torch.Tensor]:
        n = int(self.keep.sum())
        device = self.keep.device

        def joined(values: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack([v.to(device) for v in values], dim=1)

        return {
            "angle_state": joined(self.state),
            "angle_update": joined(self.update) if self.update else torch.zeros((n, 0)),
            "norm": joined(self.norm),
            "update_norm": joined(self.update_norm),
            "embedding_norm": self.embedding_norm,
            **trajectory(self.states),
        }


def trajectory(states: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Where each state h_0..h_L ([N, H] each) sits on the way from h_0 to the final state h_L:
    the angle theta(h_l, h_L) and the progress s_l = <h_l - h_0, h_L - h_0> / |h_L - h_0|^2 (paper B's
    scripts). Both [N, L+1]; s_0 = 0 and s_L = 1 exactly (NaN where h_L = h_0), theta(h_L, h_L) = 0."""
    final = states[-1]
    states = [h.to(final.device) for h in states]  # a split model's layers sit on several GPUs
    start = states[0]
    span = final - start
    scale = (span * span).sum(dim=-1)
    progress = [((h - start) * span).sum(dim=-1) / scale for h in states]
    return {
        "angle_final": torch.stack([angle_degrees(h, final) for h in states], dim=1),
        "progress": torch.stack(progress, dim=1),
    }


# --- logit lens ------------------------------------------------------------------------------------


class LogitLens:
    """Next-token loss of every layer's output read through the model's own final norm and head.

    Supported where the path from the last layer to the logits is only norm -> head (plus Gemma's
    logit softcap); the last layer's loss then equals the model's own loss, which the tests check."""

    def __init__(self, model, n_layers: int) -> None:
        model_type = model.config.model_type
        if model_type not in FINAL_NORMS:
            raise UserError(f"the logit lens is not supported for {model_type!r} (its final norm and head "
                            f"are not a plain norm -> head); run without --logit-lens")
        self.norm = model.get_submodule(FINAL_NORMS[model_type])
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.nll: list[torch.Tensor | None] = [None] * n_layers  # float64 sums on the head's device
        self.count = 0.0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each part runs where it lives (the head is often on the last GPU of a dispatched model)."""
        normed = self.norm(hidden.to(execution_device(self.norm)))
        logits = self.head(normed.to(execution_device(self.head)))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def attached(self) -> contextlib.AbstractContextManager:
        """Hooks this lens needs during a forward (none for the plain lens)."""
        return contextlib.nullcontext()

    def observe(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Reads layer `index`'s output."""
        self._score(batch, index, layer_output)

    def _score(self, batch: Batch, index: int, hidden: torch.Tensor) -> None:
        """One row at a time, so the logits held are [S, vocab], not [B, S, vocab]; the sums stay on
        the device (no host read per row and layer)."""
        for row in range(hidden.shape[0]):
            logits = self.logits(hidden[row : row + 1])
            ids, mask = batch.input_ids[row : row + 1], batch.attention_mask[row : row + 1]
            value = token_nll(logits, ids, mask).sum().double()
            self.nll[index] = value if self.nll[index] is None else self.nll[index] + value
        if index == 0:
            self.count += float(batch.attention_mask[:, 1:].sum())

    def losses(self) -> list[float]:
        """One host copy of every layer's sum."""
        if self.nll[0] is None:
            return [0.0] * len(self.nll)
        sums = torch.stack([value.to(self.nll[0].device) for value in self.nll]).cpu().numpy()
        return [float(x) for x in sums / max(self.count, 1.0)]


class LastBlockLens(LogitLens):
    """Paper B's lens: layer l's input h_l passed through the LAST decoder block, then the final
    norm and head. The last layer's entry is the model's own loss, and layer l's equals the loss of
    the model with layers l..L-2 skipped (the last block then receives h_l), which the tests check.

    The last block is re-run with the exact arguments the model gave it in this forward (masks,
    rotary tables), recorded by a pre-hook, so every family's attention set-up is reproduced."""

    def __init__(self, model, n_layers: int) -> None:
        super().__init__(model, n_layers)
        self.block = LayerStack(model).layers[-1]
        self.n_layers = n_layers
        self.inputs: list[torch.Tensor] = []
        self.call: tuple[tuple, dict] | None = None

    def attached(self) -> contextlib.AbstractContextManager:
        def record(module, args, kwargs):
            self.call = (args, kwargs)

        return self.block.register_forward_pre_hook(record, with_kwargs=True)

    def observe(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Holds the layer inputs of this batch; once the last layer has run, scores them all."""
        self.inputs.append(layer_input)
        if index < self.n_layers - 1:
            return
        assert self.call is not None, "the last block's arguments were not recorded"
        args, kwargs = self.call
        for layer, hidden in enumerate(self.inputs):
            # .forward, not the module call: the capture hooks on this block must not fire again
            if args:
                out = self.block.forward(hidden, *args[1:], **kwargs)
            else:
                out = self.block.forward(**{**kwargs, "hidden_states": hidden})
            self._score(batch, layer, out[0] if isinstance(out, tuple) else out)
        self.inputs, self.call = [], None


def make_lens(model, n_layers: int, kind: str) -> LogitLens:
    return LastBlockLens(model, n_layers) if kind == "last-block" else LogitLens(model, n_layers)


# --- streaming -------------------------------------------------------------------------------------


def select_texts(tokenizer, texts: Sequence[str], max_tokens: int, max_length: int) -> list[str]:
    """Texts in order until their tokens (each cut at max_length) reach max_tokens; at least one."""
    chosen, total = [], 0
    for text in texts:
        text = clip_text(tokenizer, text, max_length)  # a line of 60 MB: never tokenized whole to be truncated
        n = len(tokenizer(text, truncation=True, max_length=max_length)["input_ids"])
        if chosen and total + n > max_tokens:
            break
        chosen.append(text)
        total += n
    return chosen


def keep_mask(attention_mask: torch.Tensor, include_first: bool) -> torch.Tensor:
    """Real tokens only (right padding); without include_first, position 0 of every row is dropped."""
    keep = attention_mask.bool().clone()
    if not include_first:
        keep[:, 0] = False
    return keep


def stream_profiles(
    model, batches: Sequence[Batch], include_first: bool, lens: LogitLens | None = None,
    cancel: CancelToken | None = None,
) -> Iterator[Progress | Profiles]:
    """Runs the batches one at a time through the model with hooks; yields Progress, then Profiles."""
    stack = LayerStack(model)
    parts: dict[str, list[np.ndarray]] = {}
    where: list[np.ndarray] = []
    for b, batch in enumerate(batches):
        if cancel is not None:
            cancel.check()
        keep = keep_mask(batch.attention_mask, include_first)
        meter = _BatchMeter(keep)

        def observe(batch, index, layer_input, layer_output, meter=meter):
            meter(index, layer_input, layer_output)
            if lens is not None:
                lens.observe(batch, index, layer_input, layer_output)

        with torch.no_grad(), stack.capture(observe, batch), (lens.attached() if lens else contextlib.nullcontext()):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                  logits_to_keep=1)
        for name, value in meter.finish().items():
            parts.setdefault(name, []).append(value.cpu().numpy().astype(np.float32))
        rows, positions = torch.nonzero(keep.cpu(), as_tuple=True)
        where.append(np.stack([batch.text_index[rows.numpy()], positions.numpy()], axis=1))
        yield Progress(b + 1, len(batches), "dynamics")
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    yield Profiles(where=np.concatenate(where).astype(np.int64), **joined)


# --- reduction, PCA and clusters -------------------------------------------------------------------


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


def token_in_context(tokenizer, ids: Sequence[int], position: int, before: int = 8, after: int = 3) -> str:
    """'...context [[token]] context...' with the token at `position` marked."""
    left = tokenizer.decode(ids[max(0, position - before) : position])
    token = tokenizer.decode(ids[position : position + 1])
    right = tokenizer.decode(ids[position + 1 : position + 1 + after])
    return " ".join(f"{left}[[{token}]]{right}".split())


def cluster_rows(
    p: Profiles, c: Clustering, tokenizer, text_ids: dict[int, list[int]], examples: int
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


# --- the experiment --------------------------------------------------------------------------------


def dynamics_texts(settings: DynamicsSettings) -> tuple[list[str], str]:
    if settings.text_file:
        return read_lines(settings.text_file, "text file"), str(settings.text_file)
    held = corpus()
    return heldout_texts(held), f"held-out part of {held.source}"


def run_dynamics(
    model, tokenizer, settings: DynamicsSettings, cancel: CancelToken | None = None, model_name: str = ""
) -> Iterator[Event]:
    settings.validate()
    started = time.perf_counter()
    all_texts, source = dynamics_texts(settings)
    texts = select_texts(tokenizer, all_texts, settings.max_tokens, settings.max_length)
    stack = LayerStack(model)
    batches = tokenize_batches(tokenizer, texts, settings.eval_batch_size, settings.max_length, stack.input_device())
    n_layers = len(stack)
    lens = make_lens(model, n_layers, settings.lens) if settings.lens_on else None
    yield Message(f"{len(texts)} texts from {source}; first position "
                  f"{'included' if settings.include_first else 'excluded'}")
    profiles: Profiles | None = None
    for item in stream_profiles(model, batches, settings.include_first, lens, cancel):
        if isinstance(item, Profiles):
            profiles = item
        else:
            yield item
    assert profiles is not None
    if profiles.n_tokens < 3:
        raise UserError(f"only {profiles.n_tokens} tokens to analyse; give more text or raise --max-tokens")
    lens_losses = lens.losses() if lens is not None else None
    layers = layer_rows(profiles, lens_losses)
    for row in layers:
        yield DynamicsLayer(row.layer, n_layers, row.angle_state.median, row.angle_update.median,
                            row.norm.median)
    if cancel is not None:
        cancel.check()
    yield Message("PCA and clustering of the per-token angle profiles")
    clustering = cluster_profiles(profiles.matrix(settings.profile), settings.components, settings.clusters,
                                  settings.seed)
    text_ids = {}
    for batch in batches:  # one host copy of a batch's ids and mask, not one per text
        ids, mask = batch.input_ids.cpu().numpy(), batch.attention_mask.cpu().numpy().astype(bool)
        for row, t in enumerate(batch.text_index):
            text_ids[int(t)] = ids[row][mask[row]].tolist()
    clusters = cluster_rows(profiles, clustering, tokenizer, text_ids, settings.examples)
    doc = DynamicsResult(
        model=model_name,
        tokens=profiles.n_tokens,
        texts=len(texts),
        text_source=source,
        first_token="included" if settings.include_first else "excluded",
        n_layers=n_layers,
        seconds=time.perf_counter() - started,
        settings=settings,
        embedding_norm=quartiles(profiles.embedding_norm),
        core=core_summary(profiles),
        layers=layers,
        pca=DynamicsPca(
            profile=settings.profile,
            explained=clustering.explained,
            k=clustering.k,
            k_choice="fixed by --clusters" if settings.clusters else
            f"best silhouette over k={CLUSTER_K[0]}..{CLUSTER_K[1]} (KMeans in PCA space)",
            silhouette={str(k): s for k, s in clustering.silhouette.items()},
            bulk_fraction=clusters[0].fraction,
            clusters=clusters,
            sample=scatter_sample(clustering, settings.seed),
        ),
        logit_lens=None if lens_losses is None else LensLosses(
            lens=settings.lens,
            loss=lens_losses,
            final_loss=lens_losses[-1],
            predicted_tokens=int(lens.count),
        ),
    )
    yield Result("dynamics", json_safe(doc))


def run(settings: DynamicsSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: the context's model."""
    loaded = context.model
    yield from run_dynamics(loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name)
