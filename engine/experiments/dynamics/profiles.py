"""dynamics' per-token profiles: for every kept token and layer, the angles between a layer's input
and output and between consecutive updates, the norms, and the way from h_0 to h_L; reduced inside
a forward hook, one batch at a time (`stream_profiles`), never holding the hidden states."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.core.events import CancelToken, Progress
from engine.evaluation.perplexity import Batch
from engine.experiments.dynamics.lens import LogitLens
from engine.models.anatomy import LayerStack


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
        ratio: np.ndarray = self.update_norm / inputs
        return ratio

    def matrix(self, profile: str) -> np.ndarray:
        """The per-token angle profile PCA sees (degrees, not rescaled: all columns share a unit)."""
        parts = {"state": [self.angle_state], "update": [self.angle_update],
                 "both": [self.angle_state, self.angle_update]}[profile]
        return np.concatenate(parts, axis=1)


def profiles_from_states(states: Sequence[torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """All per-token quantities from the L+1 residual states of one batch ([B, S, H] each),
    for the positions where `keep` is true. The all-at-once reference the stream must match."""
    meter = BatchMeter(keep)
    for index in range(len(states) - 1):
        meter(index, states[index], states[index + 1])
    return meter.finish()


class BatchMeter:
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
            self.states.append(layer_input[keep])
        self.states.append(layer_output[keep])  # in the run's dtype: trajectory() computes in float32
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

        found = {
            "angle_state": joined(self.state),
            "angle_update": joined(self.update) if self.update else torch.zeros((n, 0)),
            "norm": joined(self.norm),
            "update_norm": joined(self.update_norm),
        }
        assert self.embedding_norm is not None  # set at layer 0, which a pass sees first (joined fails on none)
        return {**found, "embedding_norm": self.embedding_norm, **trajectory(self.states)}


def trajectory(states: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Where each state h_0..h_L ([N, H] each) sits on the way from h_0 to the final state h_L:
    the angle theta(h_l, h_L) and the progress s_l = <h_l - h_0, h_L - h_0> / |h_L - h_0|^2 (paper B's
    scripts). Both [N, L+1]; s_0 = 0 and s_L = 1 exactly (NaN where h_L = h_0), theta(h_L, h_L) = 0."""
    final = states[-1].float()
    states = [h.to(final.device).float() for h in states]  # a split model's layers sit on several GPUs
    start = states[0]
    span = final - start
    scale = (span * span).sum(dim=-1)
    progress = [((h - start) * span).sum(dim=-1) / scale for h in states]
    return {
        "angle_final": torch.stack([angle_degrees(h, final) for h in states], dim=1),
        "progress": torch.stack(progress, dim=1),
    }


def keep_mask(attention_mask: torch.Tensor, include_first: bool) -> torch.Tensor:
    """Real tokens only (right padding); without include_first, position 0 of every row is dropped."""
    keep = attention_mask.bool().clone()
    if not include_first:
        keep[:, 0] = False
    return keep


def stream_profiles(
    model: Any, batches: Sequence[Batch], include_first: bool, lens: LogitLens | None = None,
    cancel: CancelToken | None = None,
) -> Iterator[Progress | Profiles]:
    """Runs the batches one at a time through the model with hooks; yields Progress, then Profiles."""
    stack = LayerStack(model)
    found: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
    for b, batch in enumerate(batches):
        if cancel is not None:
            cancel.check()
        keep = keep_mask(batch.attention_mask, include_first)
        meter = BatchMeter(keep)

        def observe(batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor,
                    meter: BatchMeter = meter) -> None:
            meter(index, layer_input, layer_output)
            if lens is not None:
                lens.observe(batch, index, layer_input, layer_output)

        with torch.no_grad(), stack.capture(observe, batch), (lens.attached() if lens else contextlib.nullcontext()):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                  logits_to_keep=1)
        found.append(on_host(batch, meter))
        yield Progress(b + 1, len(batches), "dynamics", unit="batches")
    yield joined(found)


def on_host(batch: Batch, meter: BatchMeter) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One batch's finished per-token arrays on the host, and where each token came from."""
    values = {name: value.cpu().numpy().astype(np.float32) for name, value in meter.finish().items()}
    rows, positions = torch.nonzero(meter.keep.cpu(), as_tuple=True)
    return values, np.stack([batch.text_index[rows.numpy()], positions.numpy()], axis=1)


def joined(found: Sequence[tuple[dict[str, np.ndarray], np.ndarray]]) -> Profiles:
    """The batches' arrays (`on_host`, in batch order) as one Profiles."""
    values = {name: np.concatenate([part[name] for part, _ in found]) for name in found[0][0]}
    return Profiles(where=np.concatenate([where for _, where in found]).astype(np.int64), **values)
