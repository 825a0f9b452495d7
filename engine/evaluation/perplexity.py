"""Token-weighted perplexity over a set of texts or a dataset's token windows, and the prefix cache.

The prefix cache keeps, from one full forward, the input of every layer (one copy of the hidden
states per layer). An experiment that changes layer l and nothing below it then evaluates "from
layer l on": layers below l are not run again.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.core.errors import UserError
from engine.core.events import CancelToken, Pace, Progress
from engine.data.eval_data import EvalProtocol, EvalSource, Windows
from engine.data.text import NO_TOKENS
from engine.models.anatomy import LayerObserver, LayerStack
from engine.models.oom import out_of_memory_guard

OOM_ADVICE = "a smaller --eval-batch-size or --max-length, or --dtype float16"

Around = Callable[[], contextlib.AbstractContextManager[object]]  # a block entered around each batch's forward


def _nothing_around() -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


class _CacheDone(Exception):
    """Stops a forward of `Evaluator.caching_up_to` once its deepest layer input is kept."""


@dataclass
class TextScores:
    """Per-text summed negative log-likelihood and predicted-token counts."""

    nll: np.ndarray
    tokens: np.ndarray

    @property
    def perplexity(self) -> float:
        return perplexity_of(self.nll, self.tokens)

    def of(self, chosen: np.ndarray) -> TextScores:
        """The scores of these texts alone (a subset's, from the scores of all)."""
        nll, tokens = np.zeros_like(self.nll), np.zeros_like(self.tokens)
        nll[chosen], tokens[chosen] = self.nll[chosen], self.tokens[chosen]
        return TextScores(nll, tokens)


def perplexity_of(nll: np.ndarray, tokens: np.ndarray) -> float:
    total = float(np.sum(tokens))
    if total <= 0:
        raise UserError(NO_TOKENS)
    value = float(np.sum(nll)) / total
    return math.exp(value) if value < 700 else math.inf


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    text_index: np.ndarray  # which texts (or windows) these rows are
    scored: torch.Tensor | None = None  # [rows, width - 1]: which next-token targets count (None: every real one)

    @property
    def target_mask(self) -> torch.Tensor:
        return self.attention_mask[:, 1:] if self.scored is None else self.scored


def tokenize_batches(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int, device: torch.device | str
                     ) -> list[Batch]:
    """Right-padded batches of similar-length texts (sorted by length to waste little padding)."""
    encoded = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            ids[r, : len(encoded[i])] = torch.tensor(encoded[i])
            mask[r, : len(encoded[i])] = 1
        batches.append(Batch(ids.to(device), mask.to(device), rows))
    return batches


def window_batches(windows: Windows, batch_size: int, pad: int, device: torch.device | str) -> list[Batch]:
    """Right-padded batches of token windows in their order; each row scores only its last
    `windows.scored[i]` targets (all but the first token of a papers' window, the new tokens of a
    sliding one)."""
    batches = []
    for start in range(0, len(windows.rows), batch_size):
        rows = np.arange(start, min(start + batch_size, len(windows.rows)))
        width = max(len(windows.rows[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        scored = torch.zeros((len(rows), width - 1), dtype=torch.long)
        for r, i in enumerate(rows):
            length = len(windows.rows[i])
            ids[r, :length] = torch.tensor(windows.rows[i])
            mask[r, :length] = 1
            scored[r, length - 1 - windows.scored[i] : length - 1] = 1
        batches.append(Batch(ids.to(device), mask.to(device), rows, scored.to(device)))
    return batches


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk: int | None = None,
    scored: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row summed NLL of next-token prediction, padding masked (and with `scored`, [rows,
    width - 1], only the targets it marks: a sliding window's new tokens). The softmax runs in float32,
    `chunk` tokens at a time (default: 64 MB of float32 logits), so a 128k vocabulary never needs a
    float32 copy of every logit at once."""
    from engine.models.memory import softmax_chunk_tokens

    rows, width, vocab = logits.shape
    flat = logits[:, :-1].reshape(-1, vocab)
    targets = input_ids[:, 1:].reshape(-1).to(logits.device)  # the head may sit on another GPU than the ids
    step = chunk or softmax_chunk_tokens(vocab)
    losses = torch.cat([
        F.cross_entropy(flat[i : i + step].float(), targets[i : i + step], reduction="none")
        for i in range(0, flat.shape[0], step)
    ]) if flat.shape[0] else flat.new_zeros(0, dtype=torch.float32)  # fmt: skip
    keep = attention_mask[:, 1:] if scored is None else scored
    return masked(losses.view(rows, width - 1), keep).sum(dim=1)


def masked(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`values` at real tokens, 0 at padding. A `where`, not a product with the mask: a non-finite
    value at a pad position (a float16 logit past its range) times 0 is NaN, and would spoil the sum."""
    return torch.where(attention_mask.to(values.device, torch.bool), values, 0)


Scoring = Generator[Progress, None, TextScores]  # a pass that says how far it got, batch by batch


def drained(scoring: Scoring) -> TextScores:
    """The scores of a pass whose progress nobody follows."""
    while True:
        try:
            next(scoring)
        except StopIteration as done:
            scores: TextScores = done.value
            return scores


def spread(count: int, n: int) -> list[int]:
    """`count` of the indices 0..n-1, evenly spread over them, the first and last included (all of
    them when count >= n): a fixed subset that samples every part of an ordered set."""
    if count >= n:
        return list(range(n))
    if count == 1:
        return [0]
    return sorted({round(i * (n - 1) / (count - 1)) for i in range(count)})


class Evaluator:
    """Perplexity of one model on fixed texts or token windows (an engine.data.eval_data.EvalSource),
    with an optional prefix cache. A text or a window is one unit of the per-unit scores (what the
    bootstrap resamples). With a `cancel` token, every pass checks it before each forward, so a
    cancel waits for one batch at most."""

    def __init__(self, model: Any, tokenizer: Any, texts: Sequence[str] | EvalSource, batch_size: int = 8,
                 max_length: int = 256, cache_on_host: bool = False, cancel: CancelToken | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cancel = cancel
        self.cache_on_host = cache_on_host  # the prefix cache in host memory (engine.models.memory.place_prefix_cache)
        self.stack = LayerStack(model)
        self.source = texts if isinstance(texts, EvalSource) else EvalSource(tuple(texts), None, "texts")
        self.batch_size = batch_size
        self.max_length = max_length
        device = self.stack.input_device()
        if self.source.windows is not None:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            self.batches = window_batches(self.source.windows, batch_size, pad, device)
            self.n_texts = len(self.source.windows.rows)
        else:
            assert self.source.texts is not None  # an EvalSource holds windows or texts
            self.batches = tokenize_batches(tokenizer, self.source.texts, batch_size, max_length, device)
            self.n_texts = len(self.source.texts)
        self.tokens = np.zeros(self.n_texts)
        for batch in self.batches:
            self.tokens[batch.text_index] = batch.target_mask.sum(dim=1).cpu().numpy()
        if not self.tokens.sum():
            raise UserError(NO_TOKENS)
        self.chosen = np.arange(self.n_texts)  # which texts it scores (a subset's fewer)
        self._layer_inputs: list[list[torch.Tensor]] | None = None
        self._layer_devices: list[torch.device] = []  # where each layer's input is computed

    @classmethod
    def for_settings(cls, model: Any, tokenizer: Any, settings: Any, source: EvalSource | None = None,
                     cancel: CancelToken | None = None) -> Evaluator:
        """The evaluator an experiment's settings ask for (its evaluation-text group, unless a
        `source` is given), its batch sized by the free memory when the settings leave it auto."""
        from engine.models.memory import loaded_cache_on_host, loaded_eval_batch

        if source is None:
            source = settings.eval_source(tokenizer)
        batch_size = loaded_eval_batch(model, tokenizer, source, settings)
        return cls(model, tokenizer, source, batch_size, settings.max_length,
                   loaded_cache_on_host(model, tokenizer, source, settings, batch_size), cancel)

    def subset(self, count: int) -> Evaluator:
        """An evaluator of about `count` of these texts (or windows): whole batches of this one,
        spread over them (`spread`; the batches go from the shortest texts to the longest), sharing
        its prefix cache as built so far and its cancel token; itself when they cover every batch.
        Its scores are those this evaluator gets for the same texts, bit for bit (the same batches),
        so its baseline is `TextScores.of(baseline, subset.chosen)`."""
        wanted = -(-count // self.batch_size)
        if wanted >= len(self.batches):
            return self
        keep = spread(wanted, len(self.batches))
        part = copy.copy(self)
        part.batches = [self.batches[b] for b in keep]
        if self._layer_inputs is not None:
            part._layer_inputs = [self._layer_inputs[b] for b in keep]
        part.chosen = np.concatenate([batch.text_index for batch in part.batches])
        part.n_texts = len(part.chosen)
        part.tokens = np.zeros_like(self.tokens)
        part.tokens[part.chosen] = self.tokens[part.chosen]
        return part

    def _check(self) -> None:
        if self.cancel is not None:
            self.cancel.check()

    @property
    def protocol(self) -> EvalProtocol:
        """How this evaluator measures (recorded in every result beside its perplexity)."""
        return self.source.protocol_with(self.max_length, self.n_tokens)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.sum())

    def _forward_nll(self, batch: Batch) -> torch.Tensor:
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        return token_nll(logits, batch.input_ids, batch.attention_mask, scored=batch.scored)

    def scores(self, start_layer: int = 0, around: Around = _nothing_around) -> TextScores:
        """Per-text NLL; with start_layer > 0 the layers below it come from the prefix cache.
        `around()` is entered around each batch's forward (engine/core/turns.py: a turn on a shared
        model, and the change the caller makes to it for that turn)."""
        return drained(self.scoring(start_layer, around=around))

    def scoring(self, start_layer: int = 0, phase: str = "evaluation", around: Around = _nothing_around,
                states: Sequence[torch.Tensor] | None = None) -> Scoring:
        """`scores` as a pass that yields its Progress after each batch (`phase`, in texts) and
        returns the scores: `scores = yield from evaluator.scoring(layer)`. `states`: each batch's
        input of `start_layer` given (a streamed map's branches), not the prefix cache's."""
        if start_layer > 0 and self._layer_inputs is None and states is None:
            yield from self.building(phase=phase, around=around)
        pace = Pace(phase, self.n_texts, "texts")
        yield pace.at(0)
        per_batch = []
        with out_of_memory_guard("perplexity evaluation", OOM_ADVICE):
            for b, batch in enumerate(self.batches):
                self._check()
                hidden: torch.Tensor | None = None
                if states is not None:
                    hidden = states[b]
                elif start_layer > 0:
                    assert self._layer_inputs is not None  # built above when it was not
                    hidden = self._layer_inputs[b][start_layer]
                if hidden is not None and self.cache_on_host and states is None:  # one batch's layer back to its device
                    hidden = hidden.to(self._layer_devices[start_layer], non_blocking=True)
                with torch.no_grad(), around(), self.stack.starting_at(start_layer, hidden):
                    per_batch.append(self._forward_nll(batch))
                yield pace.at(self._texts_through(b))
        return TextScores(self._gather(per_batch), self.tokens.copy())

    def _texts_through(self, b: int) -> int:
        """How many texts batches 0..b hold."""
        return sum(len(batch.text_index) for batch in self.batches[: b + 1])

    def _gather(self, per_batch: list[torch.Tensor]) -> np.ndarray:
        """Per-text NLL from the batches' device tensors, copied to the host once (one sync); a
        subset's texts at their places among all (the others 0, as are their tokens)."""
        nll = np.zeros(len(self.tokens))
        values = torch.cat(per_batch).double().cpu().numpy()
        nll[np.concatenate([batch.text_index for batch in self.batches])] = values
        return nll

    def perplexity(self, start_layer: int = 0) -> float:
        return self.scores(start_layer).perplexity

    def build_cache(self, observe: LayerObserver | None = None, keep: bool = True,
                    around: Around = _nothing_around) -> TextScores:
        """One full forward per batch keeping each layer's input; returns the baseline scores.

        `observe(batch, index, layer_input, layer_output)` (engine.models.anatomy.LayerObserver, as for
        LayerStack.capture) sees every layer on the way, so cheap per-layer statistics (Block
        Influence) come from the same pass. With `keep` False the pass keeps nothing (the proxies
        alone: no cache in memory). `around()` is entered around each batch's forward, as in `scores`.
        """
        return drained(self.building(observe, keep, around=around))

    def building(self, observe: LayerObserver | None = None, keep: bool = True, phase: str = "baseline",
                 around: Around = _nothing_around) -> Scoring:
        """`build_cache` as a pass that yields its Progress after each batch (`phase`, in texts)."""
        with out_of_memory_guard("building the prefix cache", OOM_ADVICE):
            per_batch = yield from self._build_cache(observe, keep, phase, around)
        return TextScores(self._gather(per_batch), self.tokens.copy())

    def caching_up_to(self, layer: int, phase: str = "prefix") -> Generator[Progress, None, None]:
        """The prefix cache of layers 0..`layer` alone, each forward stopped once `layer`'s input is
        kept (no layer above, no logits, no scores): for a run that knows its baseline already and
        starts no deeper than `layer`. The inputs are those a full pass keeps, bit for bit."""
        with out_of_memory_guard("building the prefix cache", OOM_ADVICE):
            yield from self._build_cache(None, True, phase, _nothing_around, upto=layer)

    def _build_cache(self, observe: LayerObserver | None, keep: bool, phase: str, around: Around,
                     upto: int | None = None) -> Generator[Progress, None, list[torch.Tensor]]:
        inputs: list[list[torch.Tensor]] = []
        per_batch = []
        pace = Pace(phase, self.n_texts, "texts")
        yield pace.at(0)
        for b, batch in enumerate(self.batches):
            self._check()
            per_layer: list[torch.Tensor] = []

            def hold(batch: Any, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor,
                     per_layer: list[torch.Tensor] = per_layer) -> None:
                if len(self._layer_devices) == index:
                    self._layer_devices.append(layer_input.device)
                if keep:
                    per_layer.append(layer_input.detach().to("cpu") if self.cache_on_host else layer_input.detach())
                if observe is not None:
                    observe(batch, index, layer_input, layer_output)
                if index == upto:
                    raise _CacheDone

            with torch.no_grad(), around(), self.stack.capture(hold, batch), contextlib.suppress(_CacheDone):
                per_batch.append(self._forward_nll(batch))
            inputs.append(per_layer)
            yield pace.at(self._texts_through(b))
        self._layer_inputs = inputs if keep else None
        return per_batch

    def drop_cache(self) -> None:
        self._layer_inputs = None
