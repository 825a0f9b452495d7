"""LayerStack: one way to reach a causal LM's decoder layers and their weight matrices.

Each supported family maps its own module names onto canonical ones (q, k, v, o, gate, up, down).
Fused matrices are exposed as they are, under fused names: `qkv` (GPT-2 c_attn, NeoX
query_key_value, Phi-3 qkv_proj) and `gate_up` (Phi-3 gate_up_proj). GPT-2 stores its matrices
transposed (Conv1D, shape in x out); they are exposed as stored.

Below the layer, each family names its two blocks (`PARTS`): the module whose output is what the
attention block adds to the residual stream, and the MLP's (Gemma's post-norms, which scale the
block's output before the addition; OPT's `fc2`, its MLP having no module of its own). Parallel-
residual layers (Phi-1/Phi-2, GPT-NeoX with `use_parallel_residual`) add both terms to one residual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from engine.core.errors import UserError
from engine.models.families import (
    FAMILIES,
    PART_MATRICES,
    PARTS,
    check_matrix_names,
    check_parts,
    supported_families,
)

# The one observer of a forward, layer by layer (LayerStack.capture, Evaluator.build_cache, the
# meters): observe(batch, index, layer_input, layer_output); `batch` is what the forward is of (an
# engine.evaluation.perplexity.Batch, for its mask), None where the caller does not say.
LayerObserver = Callable[[Any, int, torch.Tensor, torch.Tensor], None]

# one block's term in the residual sum, seen in a forward: observe(batch, index, part, term)
PartObserver = Callable[[Any, int, str, torch.Tensor], None]


def _first(output: Any) -> torch.Tensor:
    first: torch.Tensor = output[0] if isinstance(output, tuple) else output
    return first


def _hidden_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden: torch.Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


def _weight(module: nn.Module) -> nn.Parameter:
    """A linear module's weight (nn.Module's attribute lookup types it as a tensor or a module)."""
    return cast(nn.Parameter, module.weight)


def _hooks(module: nn.Module) -> list[Any]:
    hook = getattr(module, "_hf_hook", None)
    return [part for part in getattr(hook, "hooks", (hook,)) if part is not None]


def _offloaded(module: nn.Module) -> torch.Tensor:
    """The weight accelerate keeps for an offloaded module (its hook refills it on each forward)."""
    for hook in _hooks(module):
        if getattr(hook, "weights_map", None) is not None:
            weight: torch.Tensor = hook.weights_map["weight"]
            return weight
    raise UserError("a layer's weights are neither loaded nor offloaded by accelerate; reload the model")


def host_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of these tensors in host memory, to be read there: a GPU's are queued (`non_blocking`)
    and waited for once per GPU, not once per tensor."""
    copies = {name: t.detach().to("cpu", copy=True, non_blocking=t.is_cuda) for name, t in tensors.items()}
    for device in dict.fromkeys(t.device for t in tensors.values() if t.is_cuda):
        torch.cuda.synchronize(device)
    return copies


def execution_device(module: nn.Module) -> torch.device:
    """Where a module computes: accelerate's hook knows it (the weights may be offloaded
    placeholders on `meta`), else the device of its first real parameter, else the CPU."""
    for part in _hooks(module):
        device = getattr(part, "execution_device", None)
        if device is not None:
            return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    for param in module.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")


class LayerStack:
    """The decoder layers of a loaded model, in order, with their canonical weight matrices."""

    def __init__(self, model: nn.Module) -> None:
        model_type = getattr(model.config, "model_type", "?")
        self.check_family(model_type)
        self.model = cast("PreTrainedModel", model)  # a Hugging Face model: its config and embeddings
        self.model_type = model_type
        self.spec = FAMILIES[model_type]
        self.layers = cast(nn.ModuleList, model.get_submodule(self.spec.layers))
        self.matrix_names: tuple[str, ...] = tuple(name for name, _ in self.spec.matrices)

    @staticmethod
    def check_family(model_type: str) -> None:
        if model_type not in FAMILIES:
            raise UserError(
                f"model family {model_type!r} is not supported; supported: {supported_families()}"
            )

    @property
    def family(self) -> str:
        return self.spec.label

    def __len__(self) -> int:
        return len(self.layers)

    def check_index(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise UserError(f"layer {index} is out of range; this model has layers 0 to {len(self) - 1}")
        return index

    def matrices(self, index: int) -> dict[str, nn.Parameter]:
        """Canonical name -> the weight Parameter of that matrix in layer `index`."""
        layer = self.layers[self.check_index(index)]
        return {name: _weight(layer.get_submodule(path)) for name, path in self.spec.matrices}

    def readable_matrices(self, index: int) -> dict[str, torch.Tensor]:
        """The layer's matrices as values to read: an offloaded layer's parameters are `meta`
        placeholders, so its values come from accelerate's store (CPU memory or a file on disk)."""
        layer = self.layers[self.check_index(index)]
        found = {}
        for name, path in self.spec.matrices:
            module = layer.get_submodule(path)
            weight = _weight(module)
            found[name] = (weight if weight.device.type != "meta" else _offloaded(module)).detach()
        return found

    def check_matrix_names(self, names: Sequence[str]) -> tuple[str, ...]:
        return check_matrix_names(self.model_type, names)

    # --- below the layer: the attention and MLP blocks ------------------------------------------
    @property
    def parallel_residual(self) -> bool:
        """Attention and MLP read the same input and add their terms to one residual (Phi-1/2, GPT-NeoX)."""
        if self.model_type == "phi":
            return True
        return self.model_type == "gpt_neox" and bool(getattr(self.model.config, "use_parallel_residual", True))

    def part_module(self, index: int, part: str) -> nn.Module:
        """The module whose output is the block's term in layer `index`'s residual sum."""
        check_parts(self.model_type)
        assert self.spec.parts is not None  # check_parts refuses a family without them
        path = self.spec.parts[PARTS.index(part)]
        return self.layers[self.check_index(index)].get_submodule(path)

    def part_matrices(self, index: int, part: str) -> dict[str, nn.Parameter]:
        """The block's weight matrices (attention: q, k, v, qkv, o; MLP: gate, up, gate_up, down)."""
        return {name: p for name, p in self.matrices(index).items() if name in PART_MATRICES[part]}

    def part_params(self, index: int, part: str) -> int:
        """Parameters of the block: its matrices' weights and biases (the norms are the layer's)."""
        layer = self.layers[self.check_index(index)]
        return sum(p.numel() for name, path in self.spec.matrices if name in PART_MATRICES[part]
                   for p in layer.get_submodule(path).parameters())

    def part_output(self, index: int, part: str) -> nn.Module:
        """The block's output projection (attention's o, the MLP's down): zeroed, weight and bias,
        the block adds exactly nothing to the residual, in any family's own forward."""
        name = "o" if part == "attention" else "down"
        return self.layers[self.check_index(index)].get_submodule(dict(self.spec.matrices)[name])

    @contextlib.contextmanager
    def part_skipped(self, index: int, part: str) -> Iterator[None]:
        """The block adds nothing to the residual (its term is zero, so the stream passes by): the
        field's removal of an attention or MLP block. A parallel layer keeps the other term."""

        def zero(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            return (torch.zeros_like(output[0]), *output[1:]) if isinstance(output, tuple) else torch.zeros_like(output)

        with self.part_module(index, part).register_forward_hook(zero):
            yield

    def capture_parts(self, observe: PartObserver, batch: Any = None) -> contextlib.ExitStack[bool | None]:
        """Calls observe(batch, index, part, term) with every block's term in the next forwards (before
        the layer's own observer sees the layer: `capture` hooks fire after)."""
        stack = contextlib.ExitStack()
        for index in range(len(self)):
            for part in PARTS:

                def hook(module: nn.Module, args: tuple[Any, ...], output: Any, index: int = index,
                         part: str = part) -> None:
                    observe(batch, index, part, _first(output))

                stack.enter_context(self.part_module(index, part).register_forward_hook(hook))
        return stack

    # --- changing weights and restoring them exactly --------------------------------------------
    # --- where layers live (accelerate's device_map) ---------------------------------------------
    def is_offloaded(self, index: int) -> bool:
        """True when accelerate keeps this layer's weights off the device (CPU or disk offload): its
        parameters are placeholders on `meta`, refilled from `weights_map` on every forward."""
        layer = self.layers[self.check_index(index)]
        if any(getattr(hook, "offload", False) for module in layer.modules() for hook in _hooks(module)):
            return True
        return any(p.device.type == "meta" for p in layer.parameters())

    def check_editable(self, indices: Sequence[int]) -> None:
        """In-place weight edits on an offloaded layer would be lost at its next forward: refuse."""
        for index in indices:
            if self.is_offloaded(index):
                raise UserError(
                    f"layer {index} is offloaded; weight edits need it on a GPU: "
                    "raise --max-memory or drop --device-map"
                )

    def layer_devices(self) -> list[str]:
        """Where each layer lives: 'cuda:0', 'cpu', or 'disk' (offloaded), from the model's
        hf_device_map when accelerate placed it, else from the layer's own weights."""
        device_map = getattr(self.model, "hf_device_map", None) or {}
        found = []
        for index, layer in enumerate(self.layers):
            name = f"{self.spec.layers}.{index}"
            owners = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
            if owners:
                placed = device_map[max(owners, key=len)]
                found.append(f"cuda:{placed}" if isinstance(placed, int) else str(placed))
            else:
                found.append(str(next(layer.parameters()).device))
        return found

    def input_device(self) -> torch.device:
        """Where input ids and masks go: where the embedding runs."""
        return execution_device(self.model.get_input_embeddings())

    def copies(self, indices: Sequence[int], host: bool = False,
               queued: bool = False) -> dict[int, dict[str, torch.Tensor]]:
        """Copies of every parameter of these layers, by the layer's own names
        (`self_attn.q_proj.weight`, `input_layernorm.weight`), where they are or, with `host`, on the CPU.
        With `queued`, a GPU's copies to the host are queued (`non_blocking`: into pinned memory,
        without waiting for the GPU) and may be used only to be copied back to their GPU (on its
        stream, after them) until a `torch.cuda.synchronize()`."""
        return {i: {name: p.detach().to("cpu" if host else p.device, copy=True, non_blocking=queued and p.is_cuda)
                    for name, p in self.layers[self.check_index(i)].named_parameters()} for i in indices}

    @contextlib.contextmanager
    def preserved(self, indices: Sequence[int], host: bool = False) -> Iterator[None]:
        """Restores every parameter of these layers bit for bit on exit, whatever happened inside
        (training changes norms too). The originals are kept where the layers are, or with `host` in
        CPU memory: no second copy on the GPU, for one transfer each way, queued (the host waits for
        neither: the copies back follow the copies out on each GPU's stream)."""
        self.check_editable(indices)
        saved = self.copies(indices, host, queued=True)
        try:
            yield
        finally:
            self._put(saved)

    @contextlib.contextmanager
    def holding(self, weights: dict[int, dict[str, torch.Tensor]]) -> Iterator[None]:
        """These layers take the given tensors (e.g. a recovered layer, a healed one) for the block,
        then the originals come back bit for bit. Tensors are named as in `matrices` (q, k, ...) or
        by the layer's own parameter names, as `copies` names them."""
        with self.preserved(list(weights)):
            self._put(weights)
            yield

    def _put(self, weights: dict[int, dict[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for index, tensors in weights.items():
                matrices = self.matrices(index)
                for name, tensor in tensors.items():
                    param = matrices[name] if name in matrices else self.layers[index].get_parameter(name)
                    param.copy_(tensor)

    @contextlib.contextmanager
    def skipped(self, indices: Sequence[int]) -> Iterator[None]:
        """These layers pass their input through unchanged (the `skip` ablation)."""

        def identity(*args: Any, **kwargs: Any) -> torch.Tensor:
            return _hidden_of(args, kwargs)

        with self._forwards_replaced({self.check_index(i): identity for i in indices}):
            yield

    @contextlib.contextmanager
    def _forwards_replaced(self, replacements: dict[int, Any]) -> Iterator[None]:
        """Whatever `forward` a layer instance had (accelerate's hook wrapper on a dispatched
        model) comes back afterwards; a layer without one gets its class's forward again."""
        saved = {index: self.layers[index].__dict__.get("forward") for index in replacements}
        for index, forward in replacements.items():
            self.layers[index].forward = forward
        try:
            yield
        finally:
            for index, forward in saved.items():
                if forward is None:
                    del self.layers[index].forward
                else:
                    self.layers[index].forward = forward

    @contextlib.contextmanager
    def starting_at(self, start: int, hidden: torch.Tensor | None) -> Iterator[None]:
        """The next forward skips layers below `start`: layer start-1 returns `hidden` (the
        cached input of layer `start`) and the others return at once. Embedding, masks, rotary
        tables, final norm and head still run through the model's own code, so the result equals
        a full forward for every family (Gemma's embedding scaling and logit softcap included).
        At start 0 nothing is skipped and `hidden` may be None."""
        if start == 0:
            yield
            return
        assert hidden is not None, "starting past layer 0 needs that layer's input"

        def passthrough(*args: Any, **kwargs: Any) -> torch.Tensor:
            return _hidden_of(args, kwargs)

        def cached(*args: Any, **kwargs: Any) -> torch.Tensor:
            return hidden

        replacements = {i: passthrough for i in range(start - 1)}
        replacements[start - 1] = cached
        with self._forwards_replaced(replacements):
            yield

    def capture(self, observe: LayerObserver, batch: Any = None) -> contextlib.ExitStack[bool | None]:
        """Calls observe(batch, index, layer_input, layer_output) for every layer in the next
        forwards, `batch` being what the caller says they are of (None: it says nothing). The input
        is handed over on the output's device (they differ where a dispatched model crosses from
        one GPU to the next)."""
        stack = contextlib.ExitStack()
        for index, layer in enumerate(self.layers):

            def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor,
                     index: int = index) -> None:
                observe(batch, index, _hidden_of(args, kwargs).to(output.device), output)

            stack.enter_context(layer.register_forward_hook(hook, with_kwargs=True))
        return stack
