"""B1: hidden-state dynamics. For every token and layer l, the angle between the layer's input and
output theta(h_l, h_l+1), the angle between consecutive updates theta(dh_l, dh_l+1) with
dh_l = h_l+1 - h_l, and the norms; then PCA and clustering of the per-token angle profiles.

Streamed: one batch is run at a time and each layer's states are reduced to a few floats per token
inside a forward hook, keeping only the previous layer's update. What grows with the corpus is the
per-token profile matrix (tokens x layers floats, which PCA needs), never the hidden states.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Result
from engine.evaluation.perplexity import tokenize_batches
from engine.experiments.ablation.wavefront import close_after
from engine.experiments.context import RunContext
from engine.experiments.dynamics.clusters import (
    cluster_profiles,
    cluster_rows,
    core_summary,
    layer_rows,
    quartiles,
    scatter_sample,
)
from engine.experiments.dynamics.lens import make_lens
from engine.experiments.dynamics.profiles import Profiles, stream_profiles
from engine.experiments.dynamics.streamed import streamed_evaluator, streamed_profiles
from engine.experiments.dynamics.texts import dynamics_texts, select_texts
from engine.experiments.dynamics.vocabulary import (
    CLUSTER_K,
    DynamicsLayer,
    DynamicsPca,
    DynamicsResult,
    DynamicsSettings,
    LensLosses,
)
from engine.models.anatomy import LayerStack
from engine.models.streaming import LayerSource, StreamedModel


def run_dynamics(
    model: Any, tokenizer: Any, settings: DynamicsSettings, cancel: CancelToken | None = None, model_name: str = "",
    stream: LayerSource | None = None,
) -> Iterator[Event]:
    """The profiles, their layers' medians, PCA and clusters. With `stream` (a skeleton `model` and its
    layer source) the profiles come from one streamed pass (engine/experiments/dynamics/streamed.py),
    each weight read once: the same result."""
    settings.validate()
    started = time.perf_counter()
    all_texts, source = dynamics_texts(settings)
    texts = select_texts(tokenizer, all_texts, settings.max_tokens, settings.max_length)
    stack = LayerStack(model)
    n_layers = len(stack)
    lens = make_lens(model, n_layers, settings.lens) if settings.lens_on else None
    if stream is None:
        batches = tokenize_batches(tokenizer, texts, settings.eval_batch_size, settings.max_length,
                                   stack.input_device())
        passing: Iterator[Event | Profiles] = stream_profiles(model, batches, settings.include_first, lens, cancel)
    else:
        evaluator = streamed_evaluator(stream, tokenizer, texts, settings, cancel)
        batches = evaluator.batches
        passing = streamed_profiles(stream, evaluator, settings, lens)
    yield Message(f"{len(texts)} texts from {source}; first position "
                  f"{'included' if settings.include_first else 'excluded'}")
    profiles: Profiles | None = None
    for item in passing:
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
        for position, t in enumerate(batch.text_index):
            text_ids[int(t)] = ids[position][mask[position]].tolist()
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
        logit_lens=None if lens is None or lens_losses is None else LensLosses(  # both, or neither
            lens=settings.lens,
            loss=list(lens_losses),
            final_loss=lens_losses[-1],
            predicted_tokens=int(lens.count),
        ),
    )
    yield Result("dynamics", json_safe(doc))


def run(settings: DynamicsSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: the context's model."""
    loaded = context.needed_model("dynamics")
    stream = loaded.stream if isinstance(loaded, StreamedModel) else None
    events = run_dynamics(loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name, stream)
    yield from (events if stream is None else close_after(events, stream))
