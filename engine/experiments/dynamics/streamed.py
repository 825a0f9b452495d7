"""dynamics of a model streamed from its checkpoint (engine/models/streaming.py): one pass over the
layers, each read once, every batch's states advancing through the layer on the device before the
next is read. Each layer's input and output feed the same measures the in-memory pass feeds
(`BatchMeter`, the plain logit lens), with the arguments the model's own forward hands each layer
(engine/experiments/ablation/wavefront.py `recorded_calls`), so the profiles are the in-memory ones.

What the pass holds besides the layer: every batch's running states and the L + 1 states of each
kept token that its trajectory (the angle to h_L, the progress) needs at the end; with the logit lens,
the final norm and the head the whole pass."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from engine.core.events import CancelToken, Event, Message
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.wavefront import recorded_calls, source_plan
from engine.experiments.dynamics.lens import LogitLens
from engine.experiments.dynamics.profiles import BatchMeter, Profiles, joined, keep_mask, on_host
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.models.memory import batch_widths, text_lengths
from engine.models.streaming import HEAD, INPUT, OUTER, LayerSource, PassProgress, layer_forward


def streamed_evaluator(stream: LayerSource, tokenizer: Any, texts: Sequence[str], settings: DynamicsSettings,
                       cancel: CancelToken | None) -> Evaluator:
    """The pass's batches (those `tokenize_batches` makes in memory) on the compute device, once its
    plan is known to fit the budget (one line if not, before any weight is read)."""
    widths = batch_widths(text_lengths(tokenizer, texts, settings.max_length), settings.eval_batch_size)
    source_plan(stream, widths, settings.branches(len(stream.stack)), settings.window()).check()
    stream.load(OUTER)
    stream.load(INPUT)
    return Evaluator(stream.model, tokenizer, texts, settings.eval_batch_size, settings.max_length, cancel=cancel)


def streamed_profiles(stream: LayerSource, evaluator: Evaluator, settings: DynamicsSettings,
                      lens: LogitLens | None) -> Iterator[Event | Profiles]:
    """Every batch through every layer, each layer read once; yields the plan, Progress per layer,
    then the Profiles the in-memory pass (`stream_profiles`) makes of the same batches."""
    stack, batches, n = evaluator.stack, evaluator.batches, len(evaluator.stack)
    widths = [(int(b.input_ids.shape[0]), int(b.input_ids.shape[1])) for b in batches]
    yield Message(source_plan(stream, widths, settings.branches(n), settings.window()).line())
    if lens is not None:
        stream.load(HEAD)  # the lens reads every layer through the head (a tied one is the embedding)
    states, calls = recorded_calls(evaluator)
    if lens is None or not stream.tied:
        stream.free(INPUT)
    meters = [BatchMeter(keep_mask(batch.attention_mask, settings.include_first)) for batch in batches]
    progress = PassProgress(stream, n)
    yield progress.at(0, 0)
    for j in range(n):
        if evaluator.cancel is not None:
            evaluator.cancel.check()
        stream.load(j)
        if j + 1 < n:
            stream.prefetch(j + 1)
        layer = stack.layers[j]
        with torch.no_grad():
            for b, batch in enumerate(batches):
                output = layer_forward(layer, states[b], calls[b][j])
                meters[b](j, states[b], output)
                if lens is not None:
                    lens.observe(batch, j, states[b], output)
                states[b] = output
        stream.note_states(sum(state.numel() * state.element_size() for state in states)
                           + sum(kept.numel() * kept.element_size() for meter in meters for kept in meter.states))
        stream.free(j)
        yield progress.at(j + 1, j + 1)
    yield joined([on_host(batch, meter) for batch, meter in zip(batches, meters, strict=True)])
