"""The perplexity of a cut (layers removed) of a model streamed from its checkpoint
(engine/models/streaming.py): each kept layer read once, the removed ones never, every batch's
states advancing through the layer on the device before the next kept layer is read. The layers
get the arguments the cut model's own forward hands them (engine/models/pruning.py `removed` on the
skeleton: its masks, Gemma's per-layer kinds of the kept layers), recorded once per batch
(engine/experiments/ablation/wavefront.py `recorded_calls`); the final norm, the head and the loss
run through the model's own forward (`Evaluator.scoring` from the last layer), so the scores are
those of the cut in memory.

lm-eval's loglikelihood tasks do not stream yet (its requests would be the branches): `evaluate`
loads the whole model and refuses one beyond its budget."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import torch

from engine.core.events import CancelToken, Event, Progress
from engine.data.eval_data import EvalSource
from engine.evaluation.perplexity import Evaluator, TextScores
from engine.experiments.ablation.wavefront import recorded_calls, source_plan
from engine.models.memory import batch_widths, text_lengths
from engine.models.pruning import removed
from engine.models.streaming import HEAD, INPUT, OUTER, LayerSource, layer_forward


def cut_scores(stream: LayerSource, tokenizer: Any, texts: Sequence[str] | EvalSource, layers: Sequence[int],
               batch_size: int = 8, max_length: int = 256,
               cancel: CancelToken | None = None) -> Generator[Event, None, TextScores]:
    """Per-text scores of the model without `layers` (0-based), streamed: yields Progress per kept
    layer, returns the scores. One line before any weight is read when the budget cannot hold the
    pass (a window of one layer, one set of every text's states)."""
    model = stream.model
    widths = batch_widths(text_lengths(tokenizer, texts, max_length), batch_size)
    source_plan(stream, widths, 1, 1).check()
    stream.load(OUTER)
    stream.load(INPUT)
    whole = Evaluator(model, tokenizer, texts, batch_size, max_length, cancel=cancel)  # the head's, at the end
    with removed(model, layers) as kept:  # the cut's own arguments for each kept layer
        states, calls = recorded_calls(Evaluator(model, tokenizer, texts, batch_size, max_length))
    if not stream.tied:
        stream.free(INPUT)
    stack = stream.stack
    yield Progress(0, len(kept), "streaming the cut", phase="streaming", unit="layers")
    for k, j in enumerate(kept):
        if cancel is not None:
            cancel.check()
        stream.load(j)
        if k + 1 < len(kept):
            stream.prefetch(kept[k + 1])
        with torch.no_grad():
            for b, hidden in enumerate(states):
                states[b] = layer_forward(stack.layers[j], hidden, calls[b][k])
        stream.note_states(sum(state.numel() * state.element_size() for state in states))
        stream.free(j)
        yield Progress(k + 1, len(kept), "streaming the cut", phase="streaming", unit="layers")
    stream.load(HEAD)
    with stream.without_input():  # every layer skipped: the final norm, the head and the loss
        return (yield from whole.scoring(len(stack), states=states))
