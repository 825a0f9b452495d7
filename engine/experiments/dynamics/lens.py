"""dynamics' logit lens: each layer's next-token loss read through the model's own final norm and
head (`--lens plain`), or through the last decoder block first (`--lens last-block`, paper B's)."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch

from engine.core.errors import UserError
from engine.evaluation.perplexity import Batch, token_nll
from engine.models.anatomy import LayerStack, execution_device

# Where each family keeps its final norm, for the logit lens (the head is get_output_embeddings()).
FINAL_NORMS = {
    "llama": "model.norm", "mistral": "model.norm", "qwen2": "model.norm", "qwen3": "model.norm",
    "gemma2": "model.norm", "gemma3_text": "model.norm", "phi3": "model.norm", "phi": "model.final_layernorm",
    "gpt2": "transformer.ln_f", "gpt_neox": "gpt_neox.final_layer_norm",
}


class LogitLens:
    """Next-token loss of every layer's output read through the model's own final norm and head.

    Supported where the path from the last layer to the logits is only norm -> head (plus Gemma's
    logit softcap); the last layer's loss then equals the model's own loss, which the tests check."""

    def __init__(self, model: Any, n_layers: int) -> None:
        model_type = model.config.model_type
        if model_type not in FINAL_NORMS:
            raise UserError(f"the logit lens is not supported for {model_type!r} (its final norm and head "
                            f"are not a plain norm -> head); run without --logit-lens")
        self.norm = model.get_submodule(FINAL_NORMS[model_type])
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.nll: list[torch.Tensor | None] = [None] * n_layers  # float64 sums on the head's device
        self.count = 0.0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each part runs where it lives (the head is often on the last GPU of a dispatched model)."""
        normed = self.norm(hidden.to(execution_device(self.norm)))
        logits: torch.Tensor = self.head(normed.to(execution_device(self.head)))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def attached(self) -> contextlib.AbstractContextManager[object]:
        """Hooks this lens needs during a forward (none for the plain lens)."""
        return contextlib.nullcontext()

    def observe(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Reads layer `index`'s output."""
        self._score(batch, index, layer_output)

    def _score(self, batch: Batch, index: int, hidden: torch.Tensor) -> None:
        """One row at a time, so the logits held are [S, vocab], not [B, S, vocab]; the sums stay on
        the device (no host read per row and layer)."""
        for row in range(hidden.shape[0]):
            logits = self.logits(hidden[row : row + 1])
            ids, mask = batch.input_ids[row : row + 1], batch.attention_mask[row : row + 1]
            value = token_nll(logits, ids, mask).sum().double()
            held = self.nll[index]
            self.nll[index] = value if held is None else held + value
        if index == 0:
            self.count += float(batch.attention_mask[:, 1:].sum())

    def losses(self) -> list[float]:
        """One host copy of every layer's sum."""
        first = self.nll[0]
        if first is None:
            return [0.0] * len(self.nll)
        every = cast(list[torch.Tensor], self.nll)  # every layer is scored in the batch the first is
        sums = torch.stack([value.to(first.device) for value in every]).cpu().numpy()
        return [float(x) for x in sums / max(self.count, 1.0)]


class LastBlockLens(LogitLens):
    """Paper B's lens: layer l's input h_l passed through the LAST decoder block, then the final
    norm and head. The last layer's entry is the model's own loss, and layer l's equals the loss of
    the model with layers l..L-2 skipped (the last block then receives h_l), which the tests check.

    The last block is re-run with the exact arguments the model gave it in this forward (masks,
    rotary tables), recorded by a pre-hook, so every family's attention set-up is reproduced."""

    def __init__(self, model: Any, n_layers: int) -> None:
        super().__init__(model, n_layers)
        self.block = LayerStack(model).layers[-1]
        self.n_layers = n_layers
        self.inputs: list[torch.Tensor] = []
        self.call: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def attached(self) -> contextlib.AbstractContextManager[object]:
        def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.call = (args, kwargs)

        return self.block.register_forward_pre_hook(record, with_kwargs=True)

    def observe(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Holds the layer inputs of this batch; once the last layer has run, scores them all."""
        self.inputs.append(layer_input)
        if index < self.n_layers - 1:
            return
        assert self.call is not None, "the last block's arguments were not recorded"
        args, kwargs = self.call
        for layer, hidden in enumerate(self.inputs):
            # .forward, not the module call: the capture hooks on this block must not fire again
            if args:
                out = self.block.forward(hidden, *args[1:], **kwargs)
            else:
                out = self.block.forward(**{**kwargs, "hidden_states": hidden})
            self._score(batch, layer, out[0] if isinstance(out, tuple) else out)
        self.inputs, self.call = [], None


def make_lens(model: Any, n_layers: int, kind: str) -> LogitLens:
    return LastBlockLens(model, n_layers) if kind == "last-block" else LogitLens(model, n_layers)
