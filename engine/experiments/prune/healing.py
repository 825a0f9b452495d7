"""prune's healing: the cut model fine-tuned on training text (the layers next to each cut, the LM
head and the last kept layers, or LoRA adapters on every layer through `peft`, merged afterwards),
and the weights a healed or replaced cut changed, held for its evaluation and export and put back
bit for bit."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError
from engine.core.events import CancelToken
from engine.experiments.prune.vocabulary import HEAD_AND_LAST, PruneSettings
from engine.models.anatomy import LayerStack, execution_device, host_copies
from engine.models.pruning import Cut, cut_layers, is_block_cut, split_cut
from engine.training.trainer import (
    FINE_TUNE_ADVICE,
    FINE_TUNE_SCALE,
    Trainer,
    blocks_forward,
    next_token_loss,
    seeded_batches,
)


def neighbours_of_cuts(n_layers: int, layers: Sequence[int]) -> tuple[int, ...]:
    """Original indices of the kept layers right before and after each run of removed layers."""
    cut = set(layers)
    found = {i for c in cut for i in (c - 1, c + 1) if 0 <= i < n_layers and i not in cut}
    return tuple(sorted(found))


def last_kept(n_layers: int, layers: Sequence[int], count: int = HEAD_AND_LAST) -> tuple[int, ...]:
    """Original indices of the last `count` kept layers (--heal last trains them with the LM head)."""
    return tuple(i for i in range(n_layers) if i not in set(layers))[-count:]


@dataclasses.dataclass
class CutWeights:
    """What a healed or replaced cut changed, for its export: layers' tensors by the layers' own
    names ({original index: {name: tensor}}), and the LM head's weight (--heal last). A healed cut's
    are host copies queued from the GPU (`LayerStack.copies(queued=True)`): only ever copied back."""

    layers: dict[int, dict[str, torch.Tensor]]
    head: torch.Tensor | None = None


@contextlib.contextmanager
def holding(model: Any, weights: CutWeights | None) -> Iterator[None]:
    """The model with these weights for the block, its own put back bit for bit afterwards."""
    if weights is None:
        yield
        return
    with LayerStack(model).holding(weights.layers), head_preserved(model, weights.head is not None):
        if weights.head is not None:
            with torch.no_grad():
                model.get_output_embeddings().weight.copy_(weights.head)
        yield


@contextlib.contextmanager
def head_preserved(model: Any, active: bool = True) -> Iterator[None]:
    """The LM head's weight restored exactly on exit (tied to the input embedding: that too, the same tensor)."""
    if not active:
        yield
        return
    weight = model.get_output_embeddings().weight
    saved = weight.detach().to("cpu", copy=True, non_blocking=weight.is_cuda)  # queued: only copied back
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


class Healer:
    """Fine-tunes a cut model on the training half of the corpus (the split recovery uses)."""

    def __init__(self, model: Any, tokenizer: Any, settings: PruneSettings) -> None:
        self.model = model
        self.settings = settings
        self.stack = LayerStack(model)  # every layer, numbered as in the uncut model (a cut keeps the modules)
        self.dtype = model.dtype
        blocks, self.source = settings.training_blocks(tokenizer)  # --calib-dataset's windows, or the corpus
        self.blocks = blocks.to(self.stack.input_device())

    @contextlib.contextmanager
    def healed(self, cut: Cut, cancel: CancelToken | None, keep: bool = False,
               adapter: Path | None = None) -> Iterator[CutWeights | None]:
        """Inside `cut_removed(model, cut)`: the cut model fine-tuned for the block, then restored
        exactly (an offloaded layer it would train is refused first). With `keep`, yields the
        trained weights (CutWeights: layers by original index, queued to the CPU; the LM head with
        --heal last) for export; else None. With `adapter`, LoRA healing also saves its adapter there
        (PEFT's format, before it is merged). --heal last (Reassessing Layer Pruning) trains the LM
        head and the last three kept layers, nothing else. A block cut's adjacent healing trains
        the kept layers holding a removed block and the layers next to them."""
        heal = self.settings.heal
        n = len(self.stack)
        touched = cut_layers(cut)
        whole = split_cut(cut)[0] if is_block_cut(cut) else touched  # the layers that are gone
        trained = (tuple(sorted({i for i in touched if i not in whole} | set(neighbours_of_cuts(n, touched))))
                   if heal == "adjacent" else last_kept(n, whole) if heal == "last"
                   else tuple(i for i in range(n) if i not in whole))
        with self.stack.preserved(trained, host=heal == "lora"), head_preserved(self.model, heal == "last"):
            if heal == "lora":  # LoRA: the whole model's layers
                self._lora(trained[0], cancel, adapter)
            else:
                params = [p for i in trained for p in self.stack.layers[i].parameters()]
                if heal == "last":
                    params.append(self.model.get_output_embeddings().weight)
                self._train(params, trained[0], cancel)
            if not keep:
                yield None
            else:
                head = self.model.get_output_embeddings().weight if heal == "last" else None
                yield CutWeights(self.stack.copies(trained, host=True, queued=True),
                                 None if head is None else head.detach().to("cpu", copy=True,
                                                                            non_blocking=head.is_cuda))

    def _train(self, params: list[torch.nn.Parameter], layer: int, cancel: CancelToken | None) -> None:
        """`heal_steps` steps on the seeded batches; a non-finite loss ends the healing there."""
        settings = self.settings
        batches = seeded_batches(len(self.blocks), settings.batch_size, torch.Generator().manual_seed(settings.seed))
        with Trainer(params, execution_device(self.stack.layers[layer]), self.dtype, lr=settings.lr,
                     init_scale=FINE_TUNE_SCALE, what="prune healing", advice=FINE_TUNE_ADVICE) as trainer:
            for _ in range(settings.heal_steps):
                if cancel is not None:
                    cancel.check()
                ids = self.blocks[next(batches)]
                with trainer.forward():
                    loss = next_token_loss(blocks_forward(self.model, ids).logits, ids)
                if not math.isfinite(float(loss.detach())):
                    break
                trainer.step(loss)

    def _lora(self, layer: int, cancel: CancelToken | None, adapter: Path | None = None) -> None:
        """LoRA on every matrix of every kept layer, trained, saved to `adapter` (when given), then
        merged into the weights. The adapter's module names are the cut model's (layers renumbered
        from 0), so it loads onto the pruned base: it names no base model (the original is not it, and
        AutoPeftModel would load the original under it)."""
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise UserError("--heal lora needs peft: pip install 'peft>=0.10'") from None

        targets = sorted({path.rsplit(".", 1)[-1] for _, path in self.stack.spec.matrices})
        config = LoraConfig(r=self.settings.lora_rank, lora_alpha=2 * self.settings.lora_rank, lora_dropout=0.0,
                            target_modules=targets, bias="none")
        with torch.random.fork_rng(devices=[]):  # the adapters' initialisation seeded too: the same cut heals alike
            torch.manual_seed(self.settings.seed)
            peft_model = get_peft_model(self.model, config)
        try:
            self._train([p for name, p in peft_model.named_parameters() if "lora_" in name], layer, cancel)
            if adapter is not None:
                peft_model.peft_config["default"].base_model_name_or_path = ""  # not None: peft fills that in
                lora = {name: p for name, p in peft_model.state_dict().items() if "lora_" in name}
                peft_model.save_pretrained(str(adapter), state_dict=host_copies(lora))
        finally:
            peft_model.merge_and_unload()
