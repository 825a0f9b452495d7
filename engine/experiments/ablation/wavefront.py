"""The ablation map of a model streamed from its checkpoint (engine/models/streaming.py), each weight
read once: the two loops of the in-memory map swapped. Every branch of the map (the clean pass, and
one per ablated unit: a layer, or with --part a block) advances through the decoder layer that is on
the device before the next layer is read. A unit's branch forks from the clean pass at its layer's
input (the prefix cache's fork, generalized), so each branch runs the layer forwards the in-memory
map runs, with the same arguments: those the model's own forward hands each layer (masks, rotary
tables, a family's per-layer differences), recorded once per batch from that forward. The head and
the loss run per branch at the end, through the model's own forward (`LayerStack.starting_at`).

The neighbour mean holds three layers (the ablated one and its neighbours), skip and zero one; the
reader thread reads the next layer meanwhile. All branch states stay where the layers compute. The
plan (engine/models/memory.py `StreamPlan`) is checked against the budget before any weight is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message
from engine.evaluation.perplexity import Batch, Evaluator, TextScores, drained
from engine.experiments.ablation.meters import InfluenceMeter
from engine.experiments.ablation.vocabulary import LayerProxies
from engine.experiments.ablation.vocabulary import reach_of as reach_of
from engine.models.anatomy import LayerStack
from engine.models.memory import FIXED_EVAL_BATCH, ModelShape, StreamPlan, batch_widths, plan_stream, text_lengths
from engine.models.streaming import HEAD, INPUT, OUTER, LayerSource, PassProgress

Unit = tuple[int, str | None]
Call = tuple[tuple[Any, ...], dict[str, Any]]  # a decoder layer's arguments besides its input
Removal = Callable[[int, str | None], Any]  # (layer, part) -> the context that removes that unit


def unit_name(unit: Unit) -> str:
    """A unit as the checkpoint keys it and the log names it: `12`, or `12:attention` for a block."""
    index, part = unit
    return str(index) if part is None else f"{index}:{part}"


class _Recorded(Exception):
    """Stops the recording forward at the last decoder layer: nothing after it is needed."""


def source_plan(stream: LayerSource, widths: Sequence[tuple[int, int]], branches: int, window: int) -> StreamPlan:
    """The streamed map's plan from its source: the skeleton's layer sizes, the checkpoint's bytes."""
    return plan_stream(ModelShape.from_numbers(stream.model.config), str(stream.dtype).removeprefix("torch."),
                       str(stream.device), widths, branches, window,
                       max(stream.group_bytes(i) for i in range(len(stream.stack))),
                       sum(stream.group_bytes(group) for group in (INPUT, HEAD, OUTER)), stream.checkpoint_bytes(),
                       stream.max_memory)


def streamed_evaluator(stream: LayerSource, tokenizer: Any, settings: Any, cancel: CancelToken | None) -> Evaluator:
    """The map's evaluator over the skeleton, its batches on the compute device (the input group is
    read first: the batches go where the embedding runs), once the plan is known to fit its budget
    (one line if not, before any weight is read). The batch is the in-memory map's on the CPU
    (`FIXED_EVAL_BATCH` unless given), so both maps pad alike."""
    batch = settings.eval_batch_size or FIXED_EVAL_BATCH
    texts = settings.eval_source(tokenizer)
    widths = batch_widths(text_lengths(tokenizer, texts, settings.max_length), batch)
    source_plan(stream, widths, settings.branches(len(stream.stack)), settings.window()).check()
    stream.load(OUTER)
    stream.load(INPUT)
    return Evaluator(stream.model, tokenizer, texts, batch, settings.max_length, cancel=cancel)


def recorded_calls(evaluator: Evaluator) -> tuple[list[torch.Tensor], list[list[Call]]]:
    """Per batch, the first layer's input (the embedding's output, as the model makes it) and the
    arguments the model's own forward hands each decoder layer, from that forward run with every
    layer passing its input through."""
    stack = evaluator.stack
    firsts: list[torch.Tensor] = []
    calls: list[list[Call]] = []
    for batch in evaluator.batches:
        seen: list[Call] = []

        def record(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], seen: list[Call] = seen) -> None:
            hidden = args[0] if args else kwargs.pop("hidden_states")
            if not seen:
                firsts.append(hidden)
            seen.append((tuple(args[1:]), dict(kwargs)))
            if len(seen) == len(stack):
                raise _Recorded

        hooks = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in stack.layers]
        try:
            with torch.no_grad(), stack.skipped(range(len(stack))):
                evaluator.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        except _Recorded:
            pass
        finally:
            for hook in hooks:
                hook.remove()
        calls.append(seen)
    return firsts, calls


class Wavefront:
    """One streamed pass of the map: `run()` advances every branch layer by layer (yielding its
    progress, returning the baseline's scores), then `score(unit)` gives a unit's scores."""

    def __init__(self, evaluator: Evaluator, stream: LayerSource, units: Sequence[Unit], removal: Removal,
                 reach: int, checkpoint: StreamCheckpoint | None = None) -> None:
        self.evaluator, self.stream, self.removal, self.reach = evaluator, stream, removal, reach
        self.checkpoint = checkpoint
        self.units = list(units)
        self.stack: LayerStack = evaluator.stack
        self.forks: dict[int, list[Unit]] = {}
        for unit in units:
            self.forks.setdefault(unit[0], []).append(unit)
        self.branches: dict[Unit, list[torch.Tensor]] = {}
        self.clean: list[torch.Tensor] = []

    def plan(self, batches: Sequence[Batch]) -> StreamPlan:
        """What the run will hold and read, from its batches as tokenized."""
        return source_plan(self.stream, [(int(b.input_ids.shape[0]), int(b.input_ids.shape[1])) for b in batches],
                           1 + len(self.units), 2 * self.reach + 1)

    def run(self, meter: InfluenceMeter, part_meter: Any) -> Generator[Event, None, TextScores]:
        """Every branch through every layer; the baseline's scores (the clean branch's) at the end.
        `meter` (and `part_meter`, with --part) see each layer's clean input and output as the
        in-memory map's first pass shows them."""
        stream, stack, evaluator = self.stream, self.stack, self.evaluator
        n = len(stack)
        yield Message(self.plan(evaluator.batches).line())
        firsts, calls = recorded_calls(evaluator)
        if not stream.tied:
            stream.free(INPUT)
        self.clean = firsts
        start = 0
        restored = None if self.checkpoint is None else \
            self.checkpoint.restore(self.units, meter, part_meter, evaluator.batches[0].input_ids.device)
        if restored is not None:
            start, self.clean, self.branches = restored
            left = f"layers {start} to {n - 1} to read" if start < n else "no layer left to read"
            yield Message(f"resuming the streamed map after layer {start - 1} (its checkpoint): {left}")
            for j in range(start):  # the layers passed before the checkpoint: their proxies, as if passed now
                yield LayerProxies(j, n, *meter.layer_means(j))
        progress = PassProgress(stream, len(self.stack), start)
        yield progress.at(start, start)
        for j in range(start, n):
            if evaluator.cancel is not None:
                evaluator.cancel.check()
            window = range(max(0, j - self.reach), min(n, j + self.reach + 1))
            for index in window:
                stream.prefetch(index)
                while not stream.ready(index, 1.0):  # a slow read says its bytes every second
                    yield progress.at(j, j)
                stream.load(index)
            stream.prefetch(j + self.reach + 1 if j + self.reach + 1 < n else HEAD)
            with torch.no_grad():
                self._advance(j, calls, meter, part_meter)
            stream.note_states(sum(state.numel() * state.element_size()
                                   for states in (self.clean, *self.branches.values()) for state in states))
            stream.free(j - self.reach)
            if self.checkpoint is not None and ((j + 1) % self.checkpoint.every == 0 or j + 1 == n):
                self.checkpoint.save(j + 1, self.clean, self.branches, meter, part_meter)
            seconds = time.perf_counter() - progress.began
            if j == start:
                yield Message(f"layer {j} read and run in {seconds:.2f} s: about {seconds * (n - j):.0f} s for "
                              f"the {n - j} layers")
            yield LayerProxies(j, n, *meter.layer_means(j))  # the console shows them as the wavefront passes
            yield progress.at(j, j + 1)
        for index in range(n):
            stream.free(index)
        stream.load(HEAD)
        return self._scores(self.clean)

    def _advance(self, j: int, calls: list[list[Call]], meter: Callable[..., None], part_meter: Any) -> None:
        """Layer j, for the branches forked below it, then the units of layer j (forked from the
        clean input), then the clean branch with its meters."""
        layer = self.stack.layers[j]

        def forward(hidden: torch.Tensor, b: int) -> torch.Tensor:
            args, kwargs = calls[b][j]
            output = layer(hidden, *args, **kwargs)
            hidden_out: torch.Tensor = output[0] if isinstance(output, tuple) else output
            return hidden_out

        for states in self.branches.values():  # in place: one batch's old state freed as its new one is made
            for b, hidden in enumerate(states):
                states[b] = forward(hidden, b)
        for index, part in self.forks.get(j, ()):
            with self.removal(index, part):
                self.branches[(index, part)] = [forward(hidden, b) for b, hidden in enumerate(self.clean)]
        capture = self.stack.capture_parts(part_meter.term) if part_meter is not None else contextlib.nullcontext()
        with capture:
            for b, (batch, hidden) in enumerate(zip(self.evaluator.batches, list(self.clean), strict=True)):
                output = forward(hidden, b)
                meter(batch, j, hidden.to(output.device), output)
                if part_meter is not None:
                    part_meter(batch, j, hidden.to(output.device), output)
                self.clean[b] = output

    def score(self, index: int, part: str | None) -> TextScores:
        """A unit's scores from its branch's last state (the branch freed)."""
        return self._scores(self.branches.pop((index, part)))

    def _scores(self, states: list[torch.Tensor]) -> TextScores:
        with self.stream.without_input():
            return drained(self.evaluator.scoring(len(self.stack), states=states))


class StreamCheckpoint:
    """The wavefront's state every `every` layers (and after the last): each branch's state, the
    clean one's, the meters' sums, and the next layer, in one safetensors file written atomically
    (a killed run resumes from the last one it finished), keyed by the sweep's key (model, dtype,
    device, settings) so it never continues another map."""

    def __init__(self, path: Path, key: dict[str, Any], resume: bool, every: int = 4) -> None:
        self.path, self.key, self.resume, self.every = path, json.dumps(key, sort_keys=True), resume, every
        if not resume:
            self.path.unlink(missing_ok=True)  # a fresh run forgets an older run's state

    def save(self, next_layer: int, clean: list[torch.Tensor], branches: dict[Unit, list[torch.Tensor]],
             meter: Any, part_meter: Any) -> None:
        from safetensors.torch import save_file

        tensors = {f"clean.{b}": state for b, state in enumerate(clean)}
        for unit, states in branches.items():
            tensors.update({f"branch.{unit_name(unit)}.{b}": state for b, state in enumerate(states)})
        tensors.update({f"sums.{i}": value for i, value in meter.sums.items()})
        for i, rows in meter.last.items():
            tensors.update({f"last.{i}.{k}": value for k, value in enumerate(rows)})
        if part_meter is not None:
            tensors.update({f"parts.{unit_name(key)}": value for key, value in part_meter.sums.items()})
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        save_file({name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}, staging,
                  metadata={"key": self.key, "next": str(next_layer)})
        os.replace(staging, self.path)

    def restore(self, units: Sequence[Unit], meter: Any, part_meter: Any,
                device: torch.device) -> tuple[int, list[torch.Tensor], dict[Unit, list[torch.Tensor]]] | None:
        """(next layer, clean states, branch states) of the last checkpoint on `device`, the meters
        refilled; None without one (or one of another map, or one lacking a branch this run needs:
        the units forked below its layer)."""
        if not self.resume or not self.path.is_file() or self.path.is_symlink():
            return None
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(self.path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                if metadata.get("key") != self.key:
                    return None
                saved = {name: handle.get_tensor(name) for name in handle.keys()}
            next_layer = int(metadata["next"])
        except (OSError, SafetensorError, KeyError, ValueError) as exc:
            raise UserError(f"{self.path} is damaged ({exc}); run without --resume to start over") from exc

        def series(prefix: str) -> list[torch.Tensor]:
            count = sum(name.startswith(prefix) and name[len(prefix):].isdigit() for name in saved)
            return [saved[f"{prefix}{b}"].to(device) for b in range(count)]

        clean = series("clean.")
        branches = {unit: series(f"branch.{unit_name(unit)}.") for unit in units if unit[0] < next_layer}
        if any(len(states) != len(clean) for states in branches.values()):
            return None
        meter.sums = {int(name[5:]): value.to(device) for name, value in saved.items() if name.startswith("sums.")}
        meter.last = {}
        last = sorted((tuple(map(int, name.split(".")[1:])), name) for name in saved if name.startswith("last."))
        for (layer, _), name in last:
            meter.last.setdefault(layer, []).append(saved[name].to(device))
        if part_meter is not None:
            part_meter.sums = {(int(name[6:].split(":")[0]), name.split(":")[1]): value.to(device)
                               for name, value in saved.items() if name.startswith("parts.")}
        return next_layer, clean, branches


def close_after(events: Iterator[Event], stream: LayerSource) -> Iterator[Event]:
    """The events of a streamed run, the source closed (its reader stopped, its layers freed) however it ends."""
    try:
        yield from events
    finally:
        stream.close()
