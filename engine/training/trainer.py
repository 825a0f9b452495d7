"""Training, written once for every experiment that trains: recovery's noised layer, prune's healing
(the layers next to a cut, or LoRA adapters), growth's arms and toy-depth's students.

`Trainer` runs AdamW right in every precision. A float32 parameter is updated in place. A
half-precision one never is: AdamW updates a float32 master copy (in float16 its eps of 1e-8 rounds
to 0 and the update becomes m/0; in bfloat16 updates below the weights' spacing are lost), and the
master, rounded to the parameter's dtype, is written back after every step. Forwards run under
autocast in the run's dtype; float16 losses are scaled by a GradScaler, so that small gradients do
not flush to zero. A step reads nothing back to the host (on a GPU that waits for the queued work)
except GradScaler's overflow check in float16; reading the loss is the caller's choice.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from engine.core.errors import UserError
from engine.evaluation.perplexity import token_nll
from engine.models.oom import out_of_memory_guard

HALF = (torch.float16, torch.bfloat16)
FINE_TUNE_SCALE = 2.0**12  # first float16 loss scale for a trained model: low enough not to skip its first steps
FINE_TUNE_ADVICE = "a smaller --batch-size or --block-size, or --dtype float16"


class Trainer:
    """AdamW on `params`, right in every precision (see the module's doc). A context manager:
    inside, the parameters require grad; on exit their flags are back and their gradients gone.

    `device` is where the parameters compute (`anatomy.execution_device` of their module, never a
    placeholder's `meta`), `dtype` the forward's precision. `what` and `advice` make the one-line
    error of an out-of-memory step ("out of memory in <what>; try <advice>"). `clip` bounds the
    norm of the (unscaled) gradients; other keywords go to AdamW."""

    def __init__(self, params: Sequence[nn.Parameter], device: torch.device, dtype: torch.dtype, *, lr: float,
                 what: str, advice: str, init_scale: float = 2.0**16, clip: float | None = None,
                 **adamw: Any) -> None:
        if any(p.device.type == "meta" for p in params):
            raise UserError(f"{what}: its weights are offloaded (accelerate refills them at every forward, so "
                            "nothing would train); raise --max-memory or drop --device-map")
        self.params = list(params)
        self.device, self.dtype = device, dtype
        self.what, self.advice, self.clip = what, advice, clip
        self.master = [nn.Parameter(p.detach().float().clone()) if p.dtype in HALF else p for p in self.params]
        self._halves = [(m, p) for m, p in zip(self.master, self.params, strict=True) if m is not p]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, **adamw)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=dtype == torch.float16)
        self._flags: list[bool] = []

    def __enter__(self) -> Trainer:
        self._flags = [p.requires_grad for p in self.params]
        for param in self.params:
            param.requires_grad_(True)
        return self

    def __exit__(self, *exc: object) -> None:
        for param, flag in zip(self.params, self._flags, strict=True):
            param.requires_grad_(flag)
            param.grad = None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The forward's precision: autocast to a half dtype; float32 runs as it is."""
        if self.dtype not in HALF:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Around a training forward: gradients on, the run's precision, out of memory in one line."""
        with out_of_memory_guard(self.what, self.advice), torch.enable_grad(), self.autocast():
            yield

    def step(self, loss: torch.Tensor, lr: float | None = None) -> None:
        """One optimizer step from this loss, at learning rate `lr` from now on when given (a float16
        step whose scaled gradients overflowed is skipped and the scale lowered, as GradScaler does)."""
        with out_of_memory_guard(self.what, self.advice):
            if lr is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            for master, param in self._halves:
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None
            if self.clip is not None:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.master, self.clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            with torch.no_grad():
                for master, param in self._halves:
                    param.copy_(master)


def seeded_batches(pool: int, size: int, generator: torch.Generator) -> Iterator[list[int]]:
    """The rows of each step's batch from a pool of `pool` blocks, `size` at a time, cycling through
    one order drawn from `generator` now (not at the first batch: the caller may draw more after)."""
    order = torch.randperm(pool, generator=generator).tolist()
    return ([order[(first + i) % pool] for i in range(size)] for first in itertools.count(0, size))


def blocks_forward(model: nn.Module, ids: torch.Tensor) -> Any:
    """`model` run on whole blocks of token ids (no padding), with their all-ones attention mask made
    where the ids are. Given no mask and no cache, transformers reads the position ids back to the
    host at every forward (`find_packed_sequence_indices`, its test for packed sequences: a wait for
    the GPU's queue); with the mask, eager attention builds its causal mask without one (SDPA's
    still reads once, to see whether the mask pads). The numbers are the same either way."""
    return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss of whole blocks of token ids (no padding)."""
    mask = torch.ones_like(ids)
    return token_nll(logits, ids, mask).sum() / mask[:, 1:].sum()


def synchronize(device: str | torch.device) -> None:
    """Waits for queued GPU work, so a timing covers the work and not only its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Seconds of a device's work from `start` to `stop`, waiting for it once, at the stop: CUDA
    events on a GPU (the queued work is timed, not its launch), the clock on the CPU (its work is
    done when a call returns)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._began: Any = None

    def _mark(self) -> Any:
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def start(self) -> None:
        self._began = self._mark()

    def stop(self) -> float:
        end = self._mark()
        if self.device.type != "cuda":
            return float(end - self._began)
        end.synchronize()
        return float(self._began.elapsed_time(end)) / 1000
