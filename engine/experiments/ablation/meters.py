"""The cheap measures of the map's one pass: Block Influence and the angular distances of every
layer (`InfluenceMeter`) and of every attention and MLP block (`PartMeter`), accumulated on the
layers' own devices while the prefix cache is built (prune's criteria read them too)."""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.evaluation.perplexity import Batch, masked
from engine.models.anatomy import LayerStack


class PartMeter:
    """Block Influence and the angular distances (all tokens, and each text's last token) of every
    attention and MLP block: between the residual stream before the block's addition and after it.
    Sequential layers: attention from the layer's input h to h + a, the MLP from h + a to the
    layer's output; parallel ones (GPT-NeoX): each block from h to h plus its own term. The blocks'
    terms come from `LayerStack.capture_parts` (`term`), the layer's input and output from the
    layer observer (the call), in the same forward."""

    def __init__(self, stack: LayerStack, parts: tuple[str, ...]) -> None:
        self.parts = parts
        self.parallel = stack.parallel_residual
        self.terms: dict[tuple[int, str], torch.Tensor] = {}
        self.sums: dict[tuple[int, str], torch.Tensor] = {}  # (influence, angular, tokens, last angular, rows)

    def term(self, batch: Batch | None, index: int, part: str, term: torch.Tensor) -> None:
        self.terms[(index, part)] = term

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        attention = self.terms.pop((index, "attention")).reshape(layer_input.shape).to(layer_input.device)
        mlp = self.terms.pop((index, "mlp")).reshape(layer_input.shape).to(layer_input.device)
        middle = layer_input + attention  # as the layer adds it (OPT's fc2 term comes flat: reshaped)
        pairs = {"attention": (layer_input, middle),
                 "mlp": (layer_input, layer_input + mlp) if self.parallel else (middle, layer_output)}
        for part in self.parts:
            self._add(batch, (index, part), *pairs[part])

    def _add(self, batch: Batch, key: tuple[int, str], before: torch.Tensor, after: torch.Tensor) -> None:
        after = after.to(before.device)
        cos = torch.nn.functional.cosine_similarity(before.float(), after.float(), dim=-1).clamp(-1.0, 1.0)
        mask = batch.attention_mask.to(cos.device)
        last = mask.sum(dim=1) - 1
        rows = torch.arange(len(last), device=cos.device)
        unit = [torch.nn.functional.normalize(x[rows, last].double(), dim=-1) for x in (before, after)]
        last_cos = (unit[0] * unit[1]).sum(dim=-1).clamp(-1.0, 1.0)
        values = torch.stack([
            masked(1 - cos, mask).sum().double(), masked(torch.arccos(cos) / math.pi, mask).sum().double(),
            mask.sum().double(), (torch.arccos(last_cos) / math.pi).sum(), last_cos.new_tensor(len(last)),
        ])  # fmt: skip
        self.sums[key] = self.sums[key] + values if key in self.sums else values

    def means(self) -> dict[tuple[int, str], tuple[float, float, float]]:
        """(layer, part) -> (Block Influence, angular all tokens, angular last token)."""
        found = {}
        for key, sums in self.sums.items():
            influence, angular, tokens, last, rows = sums.cpu().tolist()
            found[key] = (influence / tokens, angular / tokens, last / rows)
        return found


class InfluenceMeter:
    """Block Influence (1 - cos(h_in, h_out)) and angular distance (arccos(cos) / pi) per layer,
    averaged over real tokens (`angular_all_tokens`), accumulated while the prefix cache is built;
    and each text's (window's) last-token hidden state at every layer's input, for the field's
    last-token definitions (`last_token_blocks`: Gromov et al., PruneMe, short-transformers)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.sums: dict[int, torch.Tensor] = {}  # layer -> (influence, angular, count), on that layer's device
        self.last: dict[int, list[torch.Tensor]] = {}  # layer (n_layers: the last one's output) -> [rows, hidden]

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Accumulates on the layer's own device (the layers of a split model sit on several GPUs):
        no host sync inside the forward's per-layer hooks."""
        cos = torch.nn.functional.cosine_similarity(layer_input.float(), layer_output.float(), dim=-1)
        cos = cos.clamp(-1.0, 1.0)
        mask = batch.attention_mask
        values = torch.stack([masked(1 - cos, mask).sum(), masked(torch.arccos(cos) / math.pi, mask).sum(),
                              mask.to(cos.device).sum()]).double()
        self.sums[index] = self.sums[index] + values if index in self.sums else values
        last = mask.to(layer_input.device).sum(dim=1) - 1  # right padding: each row's last real token
        rows = torch.arange(len(last), device=layer_input.device)
        self.last.setdefault(index, []).append(layer_input[rows, last].detach().float())
        if index == self.n_layers - 1:
            output = layer_output[rows, last.to(layer_output.device)]
            self.last.setdefault(index + 1, []).append(output.detach().float())

    def last_token_blocks(self) -> dict[int, np.ndarray]:
        """n -> the angular distance arccos(cos(h_l, h_{l+n})) / pi between the last token's input
        of layer l and of layer l + n (the last layer's output for l + n = depth), averaged over
        texts (windows), for l = 0 .. depth - n: Gromov et al.'s block measure; n = 1 is each
        layer's own last-token angular distance."""
        if not self.last:
            return {}
        home = self.last[0][0].device
        states = torch.stack([torch.cat([t.to(home) for t in self.last[i]]) for i in range(self.n_layers + 1)])
        unit = torch.nn.functional.normalize(states.double(), dim=-1)  # [depth + 1, rows, hidden]; float64: arccos
        # near cos = 1 turns float32's rounding into angles of 1e-4
        blocks = {}
        for n in range(1, self.n_layers + 1):
            cos = (unit[:-n] * unit[n:]).sum(dim=-1).clamp(-1.0, 1.0)
            blocks[n] = (torch.arccos(cos) / math.pi).mean(dim=1).cpu().numpy()
        return blocks

    def layer_means(self, index: int) -> tuple[float, float]:
        """(Block Influence, angular distance) of layer `index` once every batch has passed it: a
        streamed map's live proxies (one host copy per layer)."""
        influence, angular, count = self.sums[index].tolist()
        return influence / count, angular / count

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """One host copy at the end, after gathering the sums on one device."""
        if not self.sums:
            return np.full(self.n_layers, np.nan), np.full(self.n_layers, np.nan)
        home = self.sums[min(self.sums)].device
        sums = torch.stack([self.sums[i].to(home) for i in range(self.n_layers)], dim=1).cpu().numpy()
        return sums[0] / sums[2], sums[1] / sums[2]
