"""A model larger than memory, read piece by piece: the skeleton built without weights (parameters on
`meta`, buffers such as the rotary tables real) and its embeddings, each decoder layer and its head
materialized from the checkpoint's safetensors files when they are needed, then freed.

Every tensor is read with safetensors' `safe_open` (memory-mapped, one tensor at a time, never the
whole file), renamed as `from_pretrained` renames it (transformers' own conversion table for the
model class: `rename_source_key`), cast to the run's dtype and moved to the compute device. A reader
thread reads the next group while the current one computes (into pinned memory on CUDA). The source
counts the bytes it reads, the decoder layers and the bytes it holds (read ahead too), and the branch
states its run reports, so a streamed run can show it read each weight once and kept to its plan
(engine/models/memory.py `StreamPlan`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from engine.core.errors import UserError
from engine.core.events import Progress
from engine.models.anatomy import LayerStack
from engine.models.loading import LoadedModel
from engine.models.sources import MODEL_WEIGHTS

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from engine.models.placement import Placement

# the groups besides the layers: the input embedding, the output head, and every other weight outside
# the layers (final norm, position embeddings: small, held the whole run)
INPUT, HEAD, OUTER = "input", "head", "outer"
Group = int | str  # a decoder layer's index, INPUT, HEAD or OUTER


def release_host_memory() -> None:
    """glibc keeps freed buffers of a layer's size in its arenas; malloc_trim hands them back to the
    system, so the resident memory follows the window, not the largest layer ever read."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Checkpoint key -> the safetensors file holding it (one file, or a sharded index's)."""
    index = folder / MODEL_WEIGHTS[1]
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {key: folder / name for key, name in weight_map.items()}
    single = folder / MODEL_WEIGHTS[0]
    if not single.is_file():
        raise UserError(f"{folder} has no {MODEL_WEIGHTS[0]} or {MODEL_WEIGHTS[1]}; streaming reads safetensors only")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def skeleton_model(config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """The model of this config without weights: parameters on `meta`, buffers (rotary tables, Gemma's
    embedding scale) computed as a real load computes them, in eval mode."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # as from_pretrained ties them: the head is the embedding's parameter
    model.eval()
    model.requires_grad_(False)
    return cast("PreTrainedModel", model)


@dataclass(frozen=True)
class Slot:
    """Where one checkpoint tensor goes: the model's parameter names sharing it (tied weights) and
    the dtype it is cast to."""

    names: tuple[str, ...]
    file: Path
    key: str
    dtype: torch.dtype


class LayerSource:
    """A checkpoint read into a skeleton group by group (`load`, `free`), the next group read ahead
    in a thread (`prefetch`). `bytes_read`, `reads` (per checkpoint key), `peak_layers` (decoder
    layers held at once), `peak_bytes` (weights held or read ahead at once) and `peak_states` (the
    largest branch states its run held, `note_states`) say what it did; `max_memory` is the budget
    its plan keeps to (--max-memory's text)."""

    def __init__(self, model: PreTrainedModel, folder: Path, dtype: torch.dtype, device: torch.device,
                 max_memory: str | None = None) -> None:
        self.model, self.folder, self.dtype, self.device = model, folder, dtype, torch.device(device)
        self.max_memory = max_memory
        self.stack = LayerStack(model)
        self.slots: dict[Group, list[Slot]] = {}
        self._map_checkpoint(checkpoint_files(folder))
        self.bytes_read = 0
        self.reads: Counter[str] = Counter()
        self.held: set[Group] = set()
        self.peak_layers = 0
        self.held_bytes = self.peak_bytes = self.peak_states = 0
        self.read_seconds = 0.0
        self._pending: dict[Group, Future[Any]] = {}
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layer-reader")
        self._lock = threading.Lock()
        for buffer_owner in model.modules():  # buffers (rotary tables) go where the layers compute
            for name, buffer in list(buffer_owner._buffers.items()):
                if buffer is not None:
                    buffer_owner._buffers[name] = buffer.to(self.device)

    # --- which checkpoint tensor fills which parameter ---------------------------------------------
    def _map_checkpoint(self, files: dict[str, Path]) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(self.model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        aliases: dict[int, list[str]] = {}
        params: dict[str, nn.Parameter] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
            params[name] = param
        meta_state = self.model.state_dict()
        keep_fp32 = tuple(getattr(self.model, "_keep_in_fp32_modules", None) or ())
        filled: set[str] = set()
        layers = self.stack.spec.layers + "."
        head = self._names_in(self.model.get_output_embeddings())
        embedding = self._names_in(self.model.get_input_embeddings())
        for key, file in files.items():
            target, converted = rename_source_key(key, renamings, converters, self.model.base_model_prefix, meta_state)
            if converted is not None:
                raise UserError(f"{self.folder}: its checkpoint needs weight conversions ({converted}) the "
                                "streamed map does not apply yet; run without --stream")
            if target not in params:
                continue  # from_pretrained ignores such keys too (unexpected keys)
            names = tuple(aliases[id(params[target])])
            if filled.intersection(names):
                continue  # a tied head stored twice: the embedding's copy fills both
            dtype = torch.float32 if any(part in target for part in keep_fp32) else self.dtype
            group = self._group_of(target, layers, head, embedding)
            self.slots.setdefault(group, []).append(Slot(names, file, key, dtype))
            filled.update(names)
        missing = [name for name in params if name not in filled]
        if missing:
            raise UserError(f"{self.folder}: its checkpoint lacks {missing[0]} ({len(missing)} missing); "
                            "copy or download the model again")

    def _names_in(self, module: nn.Module) -> set[str]:
        """The model's names of this module's parameters."""
        path = next(name for name, found in self.model.named_modules() if found is module)
        return {name for name, _ in module.named_parameters(prefix=path)}

    @staticmethod
    def _group_of(name: str, layers: str, head: set[str], embedding: set[str]) -> Group:
        if name.startswith(layers):
            return int(name[len(layers):].split(".", 1)[0])
        return INPUT if name in embedding else HEAD if name in head else OUTER

    @property
    def tied(self) -> bool:
        """The head's weight is the input embedding's (read once, with the input group)."""
        return HEAD not in self.slots

    def checkpoint_bytes(self) -> int:
        """The bytes of every tensor the map reads: what a read-once run reads."""
        from safetensors import safe_open

        total = 0
        for file in dict.fromkeys(slot.file for slots in self.slots.values() for slot in slots):
            with safe_open(str(file), framework="pt") as handle:
                keys = {slot.key for slots in self.slots.values() for slot in slots if slot.file == file}
                for key in keys:
                    part = handle.get_slice(key)
                    total += _numel(part.get_shape()) * _dtype_size(part.get_dtype())
        return total

    def group_bytes(self, group: Group) -> int:
        """Bytes a group takes in the run's dtype, from the skeleton's shapes."""
        return sum(_numel(self.model.get_parameter(slot.names[0]).shape) * (torch.finfo(slot.dtype).bits // 8)
                   for slot in self.slots.get(group, ()))

    # --- reading, materializing, freeing -------------------------------------------------------------
    def prefetch(self, group: Group) -> None:
        """Starts reading `group` in the reader thread (no-op if it is read, held or absent)."""
        if group in self.slots and group not in self.held and group not in self._pending:
            self._hold(self.group_bytes(group))
            self._pending[group] = self._reader.submit(self._read, group)

    def ready(self, group: Group, timeout: float) -> bool:
        """Whether `group` is held or read, after waiting at most `timeout` seconds for its read."""
        pending = self._pending.get(group)
        if pending is None:
            return True
        with contextlib.suppress(TimeoutError):
            pending.exception(timeout)
        return pending.done()

    def _hold(self, size: int) -> None:
        self.held_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def note_states(self, size: int) -> None:
        """The bytes of branch states the run holds now (the peak is kept)."""
        self.peak_states = max(self.peak_states, size)

    def _read(self, group: Group) -> list[tuple[Slot, torch.Tensor]]:
        from safetensors import safe_open

        began = time.perf_counter()
        found = []
        by_file: dict[Path, list[Slot]] = {}
        for slot in self.slots[group]:
            by_file.setdefault(slot.file, []).append(slot)
        for file, slots in by_file.items():
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for slot in slots:
                    stored = handle.get_tensor(slot.key)
                    size = stored.numel() * stored.element_size()
                    # own memory, not pages of the file's mapping; on a GPU pinned for the queued copy, cast
                    # straight into it (one host copy, not a cast copy and then its pinned copy)
                    tensor = torch.empty(stored.shape, dtype=slot.dtype, pin_memory=self.device.type == "cuda")
                    tensor.copy_(stored)
                    del stored
                    found.append((slot, tensor))
                    with self._lock:
                        self.bytes_read += size
                        self.reads[slot.key] += 1
        with self._lock:
            self.read_seconds += time.perf_counter() - began
        return found

    def load(self, group: Group) -> None:
        """`group`'s weights into the skeleton on the compute device (read now unless prefetched)."""
        if group in self.held or group not in self.slots:
            return
        self.prefetch(group)
        for slot, tensor in self._pending.pop(group).result():
            value = nn.Parameter(tensor.to(self.device, non_blocking=True), requires_grad=False)
            for name in slot.names:
                self._set(name, value)
        self.held.add(group)
        self.peak_layers = max(self.peak_layers, sum(isinstance(g, int) for g in self.held))

    def free(self, group: Group) -> None:
        """`group`'s weights back to `meta` placeholders, their memory handed back."""
        if group not in self.held:
            return
        for slot in self.slots[group]:
            param = self.model.get_parameter(slot.names[0])
            empty = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"), requires_grad=False)
            for name in slot.names:
                self._set(name, empty)
        self.held.discard(group)
        self.held_bytes -= self.group_bytes(group)
        release_host_memory()

    def _set(self, name: str, value: nn.Parameter) -> None:
        owner, _, leaf = name.rpartition(".")
        self.model.get_submodule(owner)._parameters[leaf] = value

    @contextlib.contextmanager
    def without_input(self) -> Iterator[None]:
        """The model's forward with its input embedding answering zeros of the right shape: where the
        decoder layers are replaced (`LayerStack.starting_at`), the masks, rotary tables, final norm
        and head still run through the model's own code without the embedding's weights."""
        embedding = self.model.get_input_embeddings()
        hidden = self.model.config.get_text_config().hidden_size

        def zeros(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            return torch.zeros((*input_ids.shape, hidden), dtype=self.dtype, device=input_ids.device)

        embedding.forward = zeros
        try:
            yield
        finally:
            del embedding.forward

    def close(self) -> None:
        self._reader.shutdown(wait=True, cancel_futures=True)
        for group in list(self.held):
            self.free(group)


def layer_forward(layer: nn.Module, hidden: torch.Tensor, call: tuple[tuple[Any, ...], dict[str, Any]]) -> torch.Tensor:
    """A decoder layer run on `hidden` with the other arguments the model's own forward handed it
    (`call`: recorded, engine/experiments/ablation/wavefront.py `recorded_calls`); its hidden output."""
    args, kwargs = call
    output = layer(hidden, *args, **kwargs)
    return cast(torch.Tensor, output[0] if isinstance(output, tuple) else output)


def _numel(shape: Any) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


_SAFETENSORS_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _dtype_size(name: str) -> int:
    return _SAFETENSORS_SIZES[name]


@dataclass
class StreamedModel(LoadedModel):
    """A loaded model whose weights stay in the checkpoint: `model` is the skeleton, `stream` the
    source that reads it group by group (engine/experiments/ablation/wavefront.py maps it)."""

    stream: LayerSource | None = None


def open_streamed(name: str, device: str = "auto", dtype: str = "auto", report: Any = lambda _: None,
                  trust_remote_code: bool = False, max_memory: str | None = None,
                  placement: Placement | None = None) -> StreamedModel:
    """The model `name` (a folder, a GGUF file through its dequantized cache, a hub id through its
    downloaded files) as a skeleton and its layer source, kept to the budget `max_memory` (--max-memory's
    text; None: the memory free); no weight is read yet. `placement`: the memory plan's, taken as it is
    (as `load_model` takes it); None: decided here."""
    from transformers import AutoConfig, AutoTokenizer

    from engine.models.gguf_cache import dequantized_folder, gguf_config_source
    from engine.models.loading import model_placement
    from engine.models.placement import Flags, resolve_placement
    from engine.models.sources import resolve

    source = resolve(name, report)
    flags = Flags(device, dtype)
    device_name = (placement or resolve_placement(flags)).device
    location = source.location
    if source.kind == "gguf":
        where, gguf_kwargs = gguf_config_source(Path(location))
        config = AutoConfig.from_pretrained(where, **gguf_kwargs)
        LayerStack.check_family(config.model_type)
        placement = placement or model_placement(flags, config)
        location = str(dequantized_folder(Path(location), report, placement.dtype))
    elif source.kind == "hub":
        from huggingface_hub import snapshot_download

        location = snapshot_download(location, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
    config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    LayerStack.check_family(config.model_type)
    placement = placement or model_placement(flags, config, trust_remote_code)
    dtype_name = placement.dtype
    torch_dtype = getattr(torch, dtype_name)
    model = skeleton_model(config, torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    stream = LayerSource(model, Path(location), torch_dtype, torch.device(device_name), max_memory)
    stack = stream.stack
    return StreamedModel(model, tokenizer, source.display, location, device_name, dtype_name, stack.family,
                         len(stack), ["stream"] * len(stack), placement=placement, stream=stream)


def _size(size: float) -> str:
    return f"{size / 1e9:.3f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


@dataclass
class PassProgress:
    """A streamed pass's progress, the one wording every streamed run uses: `streaming layer j of L
    (bytes read, GB/s)`, the rates measured from the pass's start (a resumed pass starts past 0)."""

    stream: LayerSource
    n: int
    start: int = 0
    began: float = 0.0
    read_before: int = 0

    def __post_init__(self) -> None:
        self.began, self.read_before = time.perf_counter(), self.stream.bytes_read

    def at(self, reading: int, done: int) -> Progress:
        """`reading`: the layer being read (from 0); `done`: the layers passed."""
        seconds = time.perf_counter() - self.began
        rate = (self.stream.bytes_read - self.read_before) / max(seconds, 1e-9) / 1e9
        return Progress(done, self.n, f"streaming layer {min(reading + 1, self.n)} of {self.n} "
                        f"({_size(self.stream.bytes_read)} read, {rate:.3g} GB/s)", phase="streaming", unit="layers",
                        rate=(done - self.start) / seconds if seconds > 0 and done > self.start else None)
