"""ReplaceMe (Shopkhoev et al., NeurIPS 2025; code mts-ai/ReplaceMe): a run of n consecutive layers
removed and replaced by one linear map T, estimated from calibration activations and folded into
the MLP output projection (`down_proj`) of the layer before the cut, so the pruned model keeps a
standard architecture and needs no training.

With the cut block the layers s .. s+n-1 (original indices), as ReplaceMe's `lstsq.py` gathers them
(`hidden_states[1:]`: the outputs of the layers):
- M: the MLP output of layer s-1 (what its output projection adds to the residual stream),
- h_s: the input of layer s (the output of layer s-1, M included),
- h_e: the input of layer s+n (the output of the block's last layer).
After the cut the stream after layer s-1 is h_s; folding T into the projection makes it
h_s - M + M T, so T is fitted to M T ~ Y with Y = h_e - h_s + M:
- `linear` (ReplaceMe's `lstsq`, alpha 0): T = (X^T X)^-1 X^T Y over every calibration token,
  accumulated in float64 (solved by least squares, which also takes a singular X^T X),
- `linear-cosine` (ReplaceMe's `cosine_dist`, solver adam, accurate False): T from the identity,
  Adam (lr 1e-4, batches of 1024 tokens, 10 epochs, shuffled) on the cosine distance between M T
  and Y, as the paper's code does.
The fold: an nn.Linear projection y = a W^T + b becomes W' = T^T W, b' = T^T b (GPT-2's Conv1D,
y = a W + b: W' = W T, b' = b T). The block must have a layer before it (s >= 1) and must not reach
the last layer (its output is normed by the final norm in the hidden states the paper reads, and
nothing follows it to fold into). Families whose MLP output is normed before the residual add
(Gemma 2/3's post-feedforward norm) cannot take the fold: refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from engine.core.errors import UserError
from engine.core.events import CancelToken
from engine.experiments.prune.vocabulary import REPLACEMENTS, check_run  # noqa: F401  (re-exported)
from engine.models.anatomy import LayerStack, execution_device
from engine.training.trainer import blocks_forward

COSINE_LR, COSINE_BATCH, COSINE_EPOCHS = 1e-4, 1024, 10  # ReplaceMe's adam_method


def admissible(n_layers: int, start: int, count: int) -> bool:
    return start >= 1 and start + count <= n_layers - 1


def output_projection(stack: LayerStack, index: int) -> nn.Module:
    """The module whose output is the MLP's contribution to the residual stream (down_proj, c_proj,
    dense_4h_to_h, fc2)."""
    path = dict(stack.spec.matrices)["down"]
    return stack.layers[index].get_submodule(path)


def check_foldable(model: nn.Module) -> None:
    stack = LayerStack(model)
    layer = stack.layers[0]
    if any(hasattr(layer, name) for name in ("post_feedforward_layernorm", "post_mlp_layernorm")):
        raise UserError(f"--replace linear: {stack.model_type} norms each MLP's output before the residual "
                        "add, so a linear map cannot be folded into its output projection; use a plain cut")


class _Enough(Exception):
    """Raised at the input of layer start+count: the forward has given all it needs."""


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden: torch.Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


@dataclass
class Activations:
    """What ReplaceMe regresses, per real token: X = M, Y = h_e - h_s + M (float64 sums for least
    squares; the rows themselves, float32 on the CPU, for the cosine fit)."""

    xtx: torch.Tensor
    xty: torch.Tensor
    tokens: int
    x: list[torch.Tensor]
    y: list[torch.Tensor]


def gather(model: nn.Module, blocks: torch.Tensor, start: int, count: int, batch_size: int,
           keep_rows: bool = False, cancel: CancelToken | None = None) -> Activations:
    """One pass over the calibration `blocks` (token ids [B, T]) with hooks on the projection of
    layer start-1 and the inputs of layers start and start+count; each forward stops there."""
    stack = LayerStack(model)
    found: dict[str, torch.Tensor] = {}
    d: int = stack.model.config.hidden_size

    def keep(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any = None) -> None:
            value = output if name == "m" else _hidden(args, kwargs)
            found[name] = (value[0] if isinstance(value, tuple) else value).detach()
            if name == "e":
                raise _Enough  # the layers after the block and the logits are not needed
        return hook

    handles = [output_projection(stack, start - 1).register_forward_hook(keep("m"), with_kwargs=True),
               stack.layers[start].register_forward_pre_hook(keep("s"), with_kwargs=True),
               stack.layers[start + count].register_forward_pre_hook(keep("e"), with_kwargs=True)]
    xtx = torch.zeros(d, d, dtype=torch.float64)
    xty = torch.zeros(d, d, dtype=torch.float64)
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    tokens = 0
    device = stack.input_device()
    try:
        with torch.no_grad():
            for first in range(0, len(blocks), batch_size):
                if cancel is not None:
                    cancel.check()
                ids = blocks[first:first + batch_size].to(device)
                try:
                    blocks_forward(model, ids)
                except _Enough:
                    pass
                m = found["m"].reshape(-1, d).to("cpu", torch.float64)
                y = (found["e"].reshape(-1, d).to("cpu", torch.float64)
                     - found["s"].reshape(-1, d).to("cpu", torch.float64) + m)
                xtx += m.T @ m
                xty += m.T @ y
                tokens += m.shape[0]
                if keep_rows:
                    xs.append(m.float())
                    ys.append(y.float())
    finally:
        for handle in handles:
            handle.remove()
    return Activations(xtx, xty, tokens, xs, ys)


def least_squares(xtx: torch.Tensor, xty: torch.Tensor) -> torch.Tensor:
    """T minimising ||X T - Y||: the normal equations (X^T X) T = X^T Y, in float64."""
    solution: torch.Tensor = torch.linalg.lstsq(xtx, xty, driver="gelsd").solution
    return solution


def cosine_fit(x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """ReplaceMe's cosine estimator: T from the identity, Adam on 1 - cos(x T, y) averaged over tokens."""
    d = x.shape[1]
    generator = torch.Generator().manual_seed(seed)
    weight = nn.Parameter(torch.eye(d))
    optimizer = torch.optim.Adam([weight], lr=COSINE_LR)
    with torch.enable_grad():
        for _ in range(COSINE_EPOCHS):
            for batch in torch.randperm(len(x), generator=generator).split(COSINE_BATCH):
                optimizer.zero_grad()
                loss = 1 - nn.functional.cosine_similarity(x[batch] @ weight, y[batch], dim=1).mean()
                loss.backward()
                optimizer.step()
    return weight.detach().double()


def estimate(model: nn.Module, blocks: torch.Tensor, start: int, count: int, how: str, batch_size: int,
             seed: int = 0, cancel: CancelToken | None = None) -> torch.Tensor:
    """The map T (float64, hidden x hidden) replacing layers start .. start+count-1."""
    n = len(LayerStack(model))
    if not admissible(n, start, count):
        raise UserError(f"--replace {how}: layers {start}-{start + count - 1} need a layer before them and must "
                        f"not reach the last layer ({n - 1})")
    found = gather(model, blocks, start, count, batch_size, keep_rows=how == "linear-cosine", cancel=cancel)
    if how == "linear":
        return least_squares(found.xtx, found.xty)
    return cosine_fit(torch.cat(found.x), torch.cat(found.y), seed)


def folded(model: nn.Module, before: int, transform: torch.Tensor) -> dict[int, dict[str, torch.Tensor]]:
    """The projection of layer `before` with T folded in, as `LayerStack.holding` takes it (the
    layer's own parameter names), in the parameters' dtype."""
    stack = LayerStack(model)
    path = dict(stack.spec.matrices)["down"]
    module = output_projection(stack, before)
    t = transform.to(torch.float64)
    held = cast(torch.Tensor, module.weight)
    weight = held.detach().to("cpu", torch.float64)
    conv1d = type(module).__name__ == "Conv1D"  # GPT-2 stores (in, out)
    new = {f"{path}.weight": (weight @ t if conv1d else t.T @ weight)}
    bias: torch.Tensor | None = getattr(module, "bias", None)
    if bias is not None:
        new[f"{path}.bias"] = bias.detach().to("cpu", torch.float64) @ t
    device = execution_device(module)
    return {before: {name: tensor.to(device, held.dtype) for name, tensor in new.items()}}


def block_start(layers: Sequence[int]) -> int:
    return min(layers)
