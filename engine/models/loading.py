"""Loading a model for experiments: `load_model` resolves its name (engine/models/sources.py),
reads its config, resolves its placement and precision once (engine/models/placement.py), reads
a GGUF through its dequantized cache (engine/models/gguf_cache.py), and loads the weights
straight onto the device; what it loaded is a `LoadedModel`, its `Placement` with it.
"""

from __future__ import annotations

import struct
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.models.gguf_cache import dequantized_folder, gguf_config_source, headers_read_once
from engine.models.load_progress import WEIGHTS_LOOP, LoadProgress
from engine.models.placement import (
    Flags,
    Hardware,
    Placement,
    PlacementOptions,
    dtype_warnings,
    layer_runs,
    resolve_placement,
)
from engine.models.precision import enable_tf32, set_deterministic
from engine.models.sources import (
    DEFAULT_MODEL,
    MODEL_WEIGHTS,
    ModelSource,
    Report,
    cache_home,
    damaged_safetensors,
    quiet,
    resolve,
)


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
    placement: Placement | None = None  # the placement it was loaded by (device, dtype and why, budgets)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "device": self.device,
            "dtype": self.dtype_name,
            "dtype_reason": self.placement.why if self.placement is not None else "",
            "tf32": self.tf32,
            "deterministic": self.deterministic,
            "family": self.family,
            "n_layers": self.n_layers,
            "device_map": self.device_map,
            "placement": layer_runs(self.layer_devices),
        }


def model_placement(requested: PlacementOptions, config: Any, trust_remote_code: bool = False,
                    hardware: Hardware | None = None) -> Placement:
    """`resolve_placement` for a model of this config, given the exact parameter count (that of
    the `meta_model`, the count the memory plan weighs, so the plan and the load decide alike).
    Counted only for `--dtype auto` (a given dtype needs no count)."""
    params = parameter_count(meta_model(config, trust_remote_code)) if requested.dtype == "auto" else None
    return resolve_placement(requested, hardware, params, config.model_type)


def meta_model(config: Any, trust_remote_code: bool = False) -> Any:
    """The model of this config built on the meta device: every parameter's shape, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def parameter_count(model: Any) -> int:
    """A model's parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())


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
    report: Report = quiet,
    device_map: str | None = None,
    max_memory: str | None = None,
    deterministic: bool = True,
    tf32: bool = True,
    placement: Placement | None = None,
) -> LoadedModel:
    """Loads a causal LM for experiments (eval mode, gradients off) and checks its family.

    `device_map` (auto, balanced, sequential) spreads the layers over every visible GPU, then the
    CPU and the disk, through accelerate; `max_memory` ('0=14GiB,1=14GiB,cpu=30GiB') caps each.
    `deterministic` and `tf32` set up torch for the run on a GPU (`set_deterministic`, `enable_tf32`).
    `placement`: decided before the load (the run's memory plan, `MemoryPlan.placement`), used as it is,
    so the device, dtype and why the plan printed are the load's; None: decided here."""
    progress = LoadProgress(report)
    with progress.running():
        return _load(name, progress, device, dtype, trust_remote_code, device_map, max_memory, deterministic,
                     tf32, placement)


def _load(name: str, progress: LoadProgress, device: str, dtype: str, trust_remote_code: bool,
          device_map: str | None, max_memory: str | None, deterministic: bool, tf32: bool,
          placement: Placement | None) -> LoadedModel:
    """`load_model`, each step said through `progress` as it begins."""
    source = resolve(name, progress)  # a name that is no model refused before the imports
    progress.step("importing torch and transformers")
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from engine.models.anatomy import LayerStack
    from engine.models.bounds import check_sizes, check_tokenizer_files, hub_folder
    from engine.models.oom import is_out_of_memory, release_memory

    report: Report = progress
    location = source.location
    hardware = Hardware.read()
    flags = Flags(device, dtype, device_map, max_memory)
    early = placement or resolve_placement(flags, hardware)  # the device and budgets refused before any file is read
    set_deterministic(early.device, deterministic)  # before the first cuBLAS call
    # the first config read imports transformers' code for the model's family too (a second or more)
    progress.step(f"reading {source.display}'s config and transformers' code for it")
    try:
        if source.kind == "gguf":  # the GGUF's config chooses the dtype before dequantizing
            gguf = Path(location)
            where, gguf_kwargs = gguf_config_source(gguf)
            if gguf_kwargs:  # no dequantized copy yet: its header is parsed (seconds: the whole token list)
                progress.step(f"reading {gguf.name}'s header")
            with headers_read_once():  # the header parsed here is the dequantization's too
                config = AutoConfig.from_pretrained(where, **gguf_kwargs)
                check_sizes(config.to_dict(), source.display)  # before the dequantization builds the model
                LayerStack.check_family(config.model_type)
                placement = placement or model_placement(flags, config, hardware=hardware)
                location = str(dequantized_folder(gguf, progress, placement.dtype))
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
        placement = placement or model_placement(flags, config, trust_remote_code, hardware)
        for line in dtype_warnings(placement.dtype, placement.device, hardware, config.model_type):
            report("warning: " + line)
        # straight onto the device, tensor by tensor: no full copy in host RAM first
        progress.step(f"reading the weights of {source.display} onto {placement.device} in {placement.dtype}")
        with progress.counting(WEIGHTS_LOOP):
            model = AutoModelForCausalLM.from_pretrained(
                location, dtype=getattr(torch, placement.dtype), trust_remote_code=trust_remote_code,
                use_safetensors=True, **placement.load_kwargs(location, cache_home() / "offload"),
            )
        progress.step(f"reading {source.display}'s tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, struct.error, SafetensorError,
            StrictDataclassError) as exc:  # struct: bad GGUF
        if is_out_of_memory(exc):
            traceback.clear_frames(exc.__traceback__)
            release_memory()
            raise UserError(
                f"out of memory loading {source.display} on {early.device}; try --dtype float16 "
                "(bfloat16 on Ampere and later) or --device cpu"
            ) from None
        raise friendly_load_error(exc, source) from exc
    tf32_on = enable_tf32(placement, tf32)
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    stack = LayerStack(model)
    device_name = str(stack.input_device()) if placement.device_map is not None else placement.device
    return LoadedModel(model, tokenizer, source.display, location, device_name, placement.dtype, stack.family,
                       len(stack), stack.layer_devices(), device_map, tf32_on, deterministic, placement)
