"""The perplexity of a cut (layers removed) of a model streamed from its checkpoint
(engine/models/streaming.py): each kept layer read once, the removed ones never, every batch's
states advancing through the layer on the device before the next kept layer is read. The layers
get the arguments the cut model's own forward hands them (engine/models/pruning.py `removed` on the
skeleton: its masks, Gemma's per-layer kinds of the kept layers), recorded once per batch
(engine/experiments/ablation/wavefront.py `recorded_calls`); the final norm, the head and the loss
run through the model's own forward (`Evaluator.scoring` from the last layer), so the scores are
those of the cut in memory.

`run evaluate --stream` (`streamed_run`) scores the original and the cut this way, a pass each;
lm-eval's loglikelihood tasks do not stream yet (its requests would be the branches): with them
`evaluate` loads the whole model and refuses one beyond its budget."""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.data.eval_data import EvalSource
from engine.data.text import eval_texts
from engine.evaluation.accuracy import PROMPTS, LmEvalProtocol
from engine.evaluation.perplexity import Evaluator, TextScores
from engine.experiments.ablation.wavefront import close_after, recorded_calls, source_plan
from engine.experiments.context import RunContext
from engine.experiments.evaluate.vocabulary import EvaluatedModel, EvaluateResult, EvaluateSettings, ModelEvaluated
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.session_models import pruned_layers
from engine.models.memory import batch_widths, text_lengths
from engine.models.pruning import check_removal, removed
from engine.models.streaming import HEAD, INPUT, OUTER, Group, LayerSource, StreamedModel, layer_forward

MAX_LENGTH = 256  # tokens per built-in text, as the memory plan counts them (engine/models/memory.py plan_run)


def cut_scores(stream: LayerSource, tokenizer: Any, texts: Sequence[str] | EvalSource, layers: Sequence[int],
               batch_size: int = 8, max_length: int = 256,
               cancel: CancelToken | None = None) -> Generator[Event, None, TextScores]:
    """Per-text scores of the model without `layers` (0-based), streamed: yields the plan (its bytes
    those of the kept layers and of what is not held yet: embedding, head) and Progress per kept
    layer, returns the scores. One line before any weight is read when the budget cannot hold the
    pass (a window of one layer, one set of every text's states)."""
    model = stream.model
    widths = batch_widths(text_lengths(tokenizer, texts, max_length), batch_size)
    kept_layers = sorted(set(range(len(stream.stack))) - set(layers))
    groups: list[Group] = [*kept_layers, INPUT, OUTER, HEAD]
    unread = [group for group in groups if group not in stream.held]
    plan = dataclasses.replace(source_plan(stream, widths, 1, 1), layers=len(kept_layers),
                               read_bytes=stored_bytes(stream, unread))
    plan.check()
    yield Message(plan.line())
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


def stored_bytes(stream: LayerSource, groups: Iterable[Group]) -> int:
    """The checkpoint bytes of `groups`' tensors as stored (each file's header, `data_offsets`): what
    reading them reads."""
    wanted = [slot for group in groups for slot in stream.slots.get(group, ())]
    total = 0
    for file in dict.fromkeys(slot.file for slot in wanted):
        header = _header(file)
        for slot in wanted:
            if slot.file == file:
                start, end = header[slot.key]["data_offsets"]
                total += int(end) - int(start)
    return total


def _header(file: Path) -> dict[str, Any]:
    """A safetensors file's header: 8 bytes of its length, then its JSON (the format's own layout)."""
    with file.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        found: dict[str, Any] = json.loads(handle.read(size))
    return found


def streamed_run(settings: EvaluateSettings, context: RunContext, loaded: StreamedModel) -> Iterator[Event]:
    """`run evaluate --stream` (or a model only streaming fits): each variant's perplexity (the original,
    the cut) on the built-in texts, a streamed pass each; no lm-eval task, no generation check."""
    stream = loaded.stream
    assert stream is not None  # a StreamedModel from open_streamed
    yield from close_after(_streamed_rows(settings, context, loaded, stream), stream)


def _streamed_rows(settings: EvaluateSettings, context: RunContext, loaded: StreamedModel,
                   stream: LayerSource) -> Iterator[Event]:
    if not settings.stream:  # the plan chose streaming: the model does not fit
        raise UserError("evaluate's lm-eval tasks load the whole model, which does not fit here; --stream without "
                        "--tasks scores its perplexity (and the cut's) reading it layer by layer")
    settings.check_streamed()
    started = time.perf_counter()
    texts = eval_texts(None, "full")
    n = loaded.n_layers
    rows: list[EvaluatedModel] = []
    for index, (variant, cut) in enumerate(zip(settings.variants, settings.cuts(), strict=True)):
        context.cancel.check()
        yield Progress(index, len(settings.variants), f"evaluate: {variant}", phase="evaluation", unit="models")
        layers = cut or (pruned_layers(context.input(PruneResult)) if variant == "pruned" else ())
        if variant == "pruned" and not layers:
            raise UserError("variant pruned: no prune result with a layer cut in this session; give --remove LAYERS")
        layers = check_removal(n, layers)
        began = time.perf_counter()
        scores = yield from cut_scores(stream, loaded.tokenizer, texts, layers, settings.batch_size, MAX_LENGTH,
                                       context.cancel)
        named = ",".join(map(str, layers))
        label, description = ((variant, f"{loaded.name}, {n} layers") if variant == "original" else
                              (f"pruned -{named}", f"layers {named} removed, streamed"))
        row = EvaluatedModel(variant=variant, label=label, description=description, n_layers=n - len(set(layers)),
                             scores=[], generation=None, seconds=time.perf_counter() - began,
                             perplexity=scores.perplexity)
        rows.append(row)
        yield ModelEvaluated(row.variant, row.label, [], None)
        yield Message(f"{label}: perplexity {scores.perplexity:.4f} on {len(texts)} built-in texts, streamed "
                      f"({stream.bytes_read:,} bytes read in all)")
    yield Progress(len(rows), len(rows), "evaluate", phase="evaluation", unit="models")
    protocol = LmEvalProtocol(tasks=[], batch_size=settings.batch_size, limit=None, num_fewshot=None,
                              include_path=None, lm_eval_version="", n_shot={}, task_versions={})
    doc = EvaluateResult(model=loaded.name, protocol=protocol, prompts=list(PROMPTS), gen_tokens=0, models=rows,
                         settings=settings, seconds=time.perf_counter() - started)
    yield Result("evaluate", json_safe(doc))
