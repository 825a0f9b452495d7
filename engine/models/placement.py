"""Where a run's model goes and in what precision, decided once: `resolve_placement(options,
hardware)` gives one frozen `Placement` (device, dtype and why, device map, memory budgets) that
the memory plan, the loader, the console's jobs, the cluster and the report all read.

The hardware is read in one place too (`Hardware.read`), so a test, or the cluster's nodes
(engine/cluster/resources.py `cluster_hardware`), can stand in a `Hardware` of their own. The two rules,
`device_rule` and `dtype_rule`, are the only copies of what `--device auto` and `--dtype auto`
mean (docs/gpus.md). Torch-free at import: torch is read only by `Hardware.read`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine.core.errors import UserError

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEVICE_MAPS = ("auto", "balanced", "sequential")
HALF_UNSAFE = ("gemma2", "gemma3_text", "gemma3")  # activations overflow float16
_DEVICE_NAME = re.compile(r"cuda(:\d+)?")
_MEMORY_SIZE = re.compile(r"^\d+(\.\d+)?\s*(GiB|MiB|KiB|GB|MB|KB)$", re.IGNORECASE)
FLOAT32_OVERHEAD = 1.3  # float32 weights x this must fit in the free memory of a GPU without tensor cores

# float16 against float32: the embedded model's layer map, all 30 layers, on the CPU (`benchmarks/
# half_precision_map.py`, BENCHMARKS.md): what lets auto pick float16 where bfloat16 is not native
FLOAT16_MAP_AGREEMENT = ("the float16 layer map agrees with float32's within 1e-2 (measured on the CPU: Spearman "
                         "of D % 1.000, largest relative perplexity difference 6.4e-3, no class changes)")


@dataclass(frozen=True)
class Hardware:
    """What the machine a run goes to has: whether CUDA works, how many GPUs, each GPU's compute
    capability and memory (bytes), and the host's memory. `local`: this machine, whose free GPU
    memory is read when the dtype rule needs it; a cluster's (not local) counts a GPU's whole memory."""

    cuda: bool
    gpus: int = 0
    capabilities: tuple[tuple[int, int], ...] = ()
    gpu_memory: tuple[int, ...] = ()
    host_memory: int = 0
    local: bool = True

    @classmethod
    def read(cls) -> Hardware:
        """This machine, as torch sees it now (CUDA_VISIBLE_DEVICES applied): the one place it is read."""
        import torch

        cuda = torch.cuda.is_available()
        gpus = torch.cuda.device_count()
        indices = range(gpus) if cuda else range(0)
        capabilities = tuple((int(major), int(minor))
                             for major, minor in map(torch.cuda.get_device_capability, indices))
        return cls(cuda, gpus, capabilities, (), _host_memory())

    def capability(self, device: str) -> tuple[int, int] | None:
        """The compute capability of `device` ('cuda' is GPU 0); None when it is not known."""
        index = device_index(device)
        return self.capabilities[index] if index < len(self.capabilities) else None

    def free_bytes(self, device: str) -> int | None:
        """Memory a model may take on `device`: free now on this machine, a whole GPU on a cluster's
        (None when its nodes could not say)."""
        index = device_index(device)
        if not self.local:
            return self.gpu_memory[index] if index < len(self.gpu_memory) else None
        from engine.models.device_memory import gpu_free

        return gpu_free(index)


CPU_ONLY = Hardware(cuda=False)  # a machine without a GPU (tests, and what a CUDA-less torch reads)


@dataclass(frozen=True)
class Flags:
    """Placement flags given as values (a run that trains its own model, a test): what
    `resolve_placement` reads of engine.models.options.ModelOptions."""

    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    max_memory: str | None = None


def choose_device(requested: str) -> str:
    """`device_rule` on this machine: the device a `--device` names, or its one-line refusal."""
    return device_rule(requested, Hardware.read())


def _host_memory() -> int:
    import os

    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def device_index(device: str) -> int:
    """The GPU index of 'cuda:N' (bare 'cuda' is GPU 0)."""
    return int(device.split(":")[1]) if ":" in device else 0


def device_rule(requested: str, hardware: Hardware) -> str:
    """`--device`: auto is the GPU when CUDA works, else the CPU; cuda and cuda:N must exist."""
    if requested == "auto":
        return "cuda" if hardware.cuda else "cpu"
    if requested == "cpu":
        return "cpu"
    if not _DEVICE_NAME.fullmatch(requested):
        raise UserError(f"--device {requested!r} not understood; use auto, cpu, cuda or cuda:N (N = 0, 1, ...)")
    if not hardware.cuda:
        raise UserError(f"--device {requested}: no CUDA GPU is visible here; use --device cpu")
    if device_index(requested) >= hardware.gpus:
        raise UserError(f"--device {requested}: only {hardware.gpus} GPU(s); pick another index")
    return requested


def dtype_rule(requested: str, device: str, hardware: Hardware, n_params: int | None = None,
               model_type: str = "") -> tuple[str, str]:
    """The dtype a run loads in and why, in a few words. auto: float32 on the CPU; bfloat16 where
    the GPU runs it natively (compute capability 8.0+, Ampere and later); float16 on Volta and
    Turing (7.x: float16 tensor cores, no native bfloat16; a T4 is 7.5), whose layer map agrees
    with float32's (`FLOAT16_MAP_AGREEMENT`), but never for Gemma 2/3, whose activations overflow
    it (float32, or one line saying the model does not fit); on older GPUs (no tensor cores)
    float32, float16 only when float32 would not fit."""
    if requested != "auto":
        if requested not in DTYPE_NAMES:
            raise UserError(f"--dtype {requested!r} not understood; use auto, float32, bfloat16 or float16")
        return requested, f"--dtype {requested}"
    if device == "cpu":
        return "float32", "auto, the CPU"
    known = hardware.capability(device)
    if known is None:  # a cluster whose nodes could not say (no NVML): the precision that runs anywhere
        return "float32", "auto, the GPU's compute capability is not known"
    major, minor = known
    capability = f"compute capability {major}.{minor}"
    if major >= 8:
        return "bfloat16", f"auto, native bfloat16 on {capability}"
    gemma = model_type in HALF_UNSAFE
    if major >= 7 and not gemma:
        return "float16", f"auto, no native bfloat16 on {capability}; {FLOAT16_MAP_AGREEMENT}"
    if n_params is not None:
        free = hardware.free_bytes(device)
        if free is not None and n_params * 4 * FLOAT32_OVERHEAD > free:
            if gemma:
                raise UserError(
                    f"this Gemma model needs about {n_params * 4 * FLOAT32_OVERHEAD / 1e9:.1f} GB in float32 but "
                    f"{device} has {free / 1e9:.1f} GB free, and float16 overflows Gemma; use --device cpu, a GPU "
                    "with bfloat16 (Ampere or later), or --dtype bfloat16 (emulated here, slow)"
                )
            return "float16", f"auto, float32 would not fit in {free / 1e9:.1f} GB free on {capability}"
    if gemma:
        return "float32", f"auto, no native bfloat16 on {capability} and float16 overflows Gemma 2/3"
    return "float32", f"auto, no native bfloat16 and no float16 tensor cores on {capability}"


def dtype_warnings(dtype: str, device: str, hardware: Hardware, model_type: str = "") -> list[str]:
    """Lines to show before a run whose precision is slow or unsafe on this device."""
    found = []
    capability = hardware.capability(device) or (0, 0)
    if device.startswith("cuda") and dtype == "bfloat16" and capability < (8, 0):
        found.append(f"--dtype bfloat16 on {device} (compute capability {'.'.join(map(str, capability))}): "
                     "no native bfloat16 before Ampere, it is emulated and slow; float16 or float32 run natively")
    if dtype == "float16" and model_type in HALF_UNSAFE:
        found.append("--dtype float16 on Gemma 2/3: its activations overflow float16 (inf/NaN perplexities); "
                     "prefer bfloat16 or float32")
    return found

SHORT_RUN_SECONDS = 150.0  # on the CPU, a training run sized `auto` trains a layer about this long


def training_budget_seconds(device: str) -> float | None:
    """The rule for training runs sized `auto` (recovery's `--steps auto`): on the CPU about 2.5
    minutes a layer, so a curve shows in minutes (the paper's 200 steps take hours there); None on
    an accelerator, which runs the paper's settings. The one place this is decided."""
    return SHORT_RUN_SECONDS if device.split(":")[0] == "cpu" else None



class PlacementOptions(Protocol):
    """The flags a placement is resolved from (engine.models.options.ModelOptions has them)."""

    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device_map(self) -> str | None: ...
    @property
    def max_memory(self) -> str | None: ...


@dataclass(frozen=True)
class Placement:
    """The run's placement and precision: `device` where the model goes (its first layer, with
    `device_map`), `dtype` and `why` it was chosen, accelerate's `device_map` strategy and the
    `budgets` each device may take (--max-memory), and whether the GPU's TF32 matmuls are on the
    table (`tf32_capable`: Ampere and later)."""

    device: str
    dtype: str
    why: str
    device_map: str | None = None
    budgets: tuple[tuple[int | str, str], ...] = ()
    tf32_capable: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def max_memory(self) -> dict[int | str, str] | None:
        """The budgets as accelerate's `max_memory` takes them, None when none were given."""
        return dict(self.budgets) or None

    def load_kwargs(self, location: str, offload_root: Path) -> dict[str, Any]:
        """`from_pretrained`'s placement arguments: accelerate's map (offloaded weights under
        `offload_root`, a folder per model), else the one device."""
        if self.device_map is None:
            return {"device_map": self.device}
        digest = hashlib.sha256(location.encode()).hexdigest()[:16]
        kwargs: dict[str, Any] = {"device_map": self.device_map, "offload_folder": str(offload_root / digest)}
        if self.budgets:
            kwargs["max_memory"] = self.max_memory()
        return kwargs


def resolve_placement(options: PlacementOptions, hardware: Hardware | None = None, n_params: int | None = None,
                      model_type: str = "") -> Placement:
    """The options' device, dtype, device map and budgets resolved against `hardware` (this
    machine's when None); `n_params` and `model_type` as the dtype rule needs them."""
    hardware = Hardware.read() if hardware is None else hardware
    device = device_rule(options.device, hardware)
    check_device_map(options.device_map)
    limits = parse_max_memory(options.max_memory)
    if options.device_map is None and limits is not None:
        raise UserError("--max-memory only applies with --device-map auto, balanced or sequential")
    for key in limits or {}:
        if isinstance(key, int) and key >= hardware.gpus:
            raise UserError(f"--max-memory names GPU {key}, but only {hardware.gpus} GPU(s) are visible here")
    dtype, why = dtype_rule(options.dtype, device, hardware, n_params, model_type)
    return Placement(device, dtype, why, options.device_map, tuple((limits or {}).items()),
                     device.startswith("cuda") and (hardware.capability(device) or (0, 0)) >= (8, 0))


def check_device_map(device_map: str | None) -> str | None:
    if device_map is not None and device_map not in DEVICE_MAPS:
        raise UserError(f"--device-map {device_map!r} not understood; use {', '.join(DEVICE_MAPS)}")
    return device_map


def parse_max_memory(text: str | None) -> dict[int | str, str] | None:
    """'0=14GiB,1=14GiB,cpu=30GiB' -> {0: '14GiB', 1: '14GiB', 'cpu': '30GiB'}, as accelerate takes it."""
    if text is None or not text.strip():
        return None
    limits: dict[int | str, str] = {}
    for part in text.split(","):
        key, sep, size = (piece.strip() for piece in part.partition("="))
        if not sep or not key or not size:
            raise UserError(f"--max-memory entry {part.strip()!r} needs DEVICE=SIZE, e.g. 0=14GiB or cpu=30GiB")
        if not (key.isdigit() or key in ("cpu", "mps")):
            raise UserError(f"--max-memory device {key!r} not understood; use a GPU index (0, 1, ...) or cpu")
        if not _MEMORY_SIZE.match(size):
            raise UserError(f"--max-memory size {size!r} not understood; write it like 14GiB, 500MiB or 30GB")
        device: int | str = int(key) if key.isdigit() else key
        if device in limits:
            raise UserError(f"--max-memory names device {key} twice; give each device once")
        limits[device] = size.replace(" ", "")
    return limits


def layer_runs(layer_devices: Sequence[str]) -> list[dict[str, Any]]:
    """Consecutive layers on the same device as runs: [{"device": "cuda:0", "layers": [0, 15]}, ...]."""
    runs: list[dict[str, Any]] = []
    for index, device in enumerate(layer_devices):
        if runs and runs[-1]["device"] == device:
            runs[-1]["layers"][1] = index
        else:
            runs.append({"device": device, "layers": [index, index]})
    return runs


def placement_text(layer_devices: Sequence[str]) -> str:
    """One line for a status bar: 'layers 0-15 cuda:0, 16-31 cuda:1'."""
    parts = [f"{low}-{high} {run['device']}" if low != high else f"{low} {run['device']}"
             for run in layer_runs(layer_devices) for low, high in [run["layers"]]]
    return "layers " + ", ".join(parts) if parts else ""


def planned_layer_devices(meta: Any, placement: Placement) -> list[str]:
    """Where each layer of `meta` (the model on the meta device) will live once loaded with this
    placement's device map and budgets: 'cuda:N', 'cpu' or 'disk'. The map is computed as
    `from_pretrained` computes it (transformers' own `_get_device_map`, on the same meta model in
    the run's dtype), before any weight is read."""
    import torch
    from transformers.integrations.accelerate import _get_device_map

    from engine.models.anatomy import LayerStack

    meta = meta.to(getattr(torch, placement.dtype))
    meta.hf_device_map = _get_device_map(meta, placement.device_map, placement.max_memory(), None)
    return list(LayerStack(meta).layer_devices())

