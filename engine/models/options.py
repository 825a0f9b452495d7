"""Which model a run loads and where: the model flags of every command, declared once as settings.

Torch-free, so the CLI derives `--model`, `--device`, `--dtype` and `--trust-remote-code` from
these fields before anything heavy is imported, and a job file can record them as data.
`--device-map` and `--max-memory` spread a model that does not fit one GPU over several (accelerate);
`--max-memory` is a streamed map's budget too (engine/models/memory.py `StreamPlan`).
`--deterministic` and `--tf32` say how torch runs on a GPU; jobs and shard workers get them as flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.core.settings import Settings, setting
from engine.core.untrusted import NO_CONTROL, has_control
from engine.models.placement import DEVICE_MAPS, DTYPE_NAMES

DTYPES = ("auto", *DTYPE_NAMES)

TRAIN_DEVICE_HELP = "where to train: auto (the GPU when there is one), cpu, cuda or cuda:N"  # growth, toy-depth


DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"  # engine.models.placement.device_rule's names (cuda:N: N a GPU's index)


def device_setting(help: str = "auto, cpu, cuda or cuda:N") -> Any:
    """The one declaration of `--device` (a model's, and growth's and toy-depth's, which train models
    of their own): auto, cpu, cuda or cuda:N, resolved by engine.models.placement.device_rule; any other
    name is refused with the settings, before anything is read (the GPU count: `check_device`).
    `help` says what the device is for."""
    return setting("auto", help, pattern=DEVICE_PATTERN, rule="auto, cpu, cuda or cuda:N (N = 0, 1, ...)")


PLAIN_NAME = "a name or path without control characters (newlines, escapes, bidi marks)"


def plain_name(text: str) -> str:
    """A name as typed (`--model`, the API's `load_model`), refused with its flag's one line when it
    holds a control character, before the spaces around it are cut: it goes into the session's
    manifest and onto terminals."""
    if has_control(text):
        raise ValueError(PLAIN_NAME)
    return text.strip()


def check_device(device: str) -> None:
    """A CUDA device that this machine has: one line for `cuda` without a GPU or `cuda:N` past the
    last one, before any model file is read (imports torch only for a CUDA name)."""
    if device.startswith("cuda"):
        from engine.models.placement import choose_device

        choose_device(device)


def dtype_setting(help: str) -> Any:
    """The one declaration of `--dtype`: auto or one of DTYPES; `help` says what runs in it."""
    return setting("auto", help, choices=DTYPES)


@dataclass(frozen=True)
class ModelOptions(Settings):
    """The model of a run; `trust_remote_code` is never read back from a session's files."""

    model: str = setting("smollm2-135m",
                         "smollm2-135m (embedded default), a local HF folder, a .gguf file, or a hub id",
                         pattern=NO_CONTROL, rule=PLAIN_NAME, parse=plain_name)
    device: str = device_setting()
    dtype: str = dtype_setting("weights' precision")
    trust_remote_code: bool = setting(False, "allow a hub model's own code (off by default)")
    device_map: str | None = setting(None, "spread the layers over every visible GPU, then CPU and disk "
                                     "(accelerate)", choices=DEVICE_MAPS, none_word="none")
    max_memory: str | None = setting(None, "with --device-map, or a streamed run (ablation, dynamics): memory each "
                                     "device may take, e.g. 0=14GiB,1=14GiB,cpu=30GiB", none_word="none")
    deterministic: bool = setting(True, "on a GPU, deterministic kernels (torch.use_deterministic_algorithms), so "
                                  "resumes and shards give the serial run's bits; off: faster, equal within "
                                  "floating-point noise")
    tf32: bool = setting(True, "float32 matmuls as TensorFloat-32 on Ampere and later GPUs (faster, 10-bit "
                         "mantissa inputs)")

    def check(self) -> None:
        """The budgets' syntax; whether they apply (a device map, or a run that streams) is the plan's
        word (engine/models/memory.py plan_run, engine/models/placement.py resolve_placement)."""
        from engine.models.placement import parse_max_memory

        parse_max_memory(self.max_memory)

    def load(self, report: Callable[[str], None] = lambda _: None, placement: Any = None) -> Any:
        """The loaded model (engine.models.loading.LoadedModel); imports torch. `placement`: the memory
        plan's (engine.models.placement.Placement), which the load takes as it is."""
        from engine.models.loading import load_model

        return load_model(self.model, device=self.device, dtype=self.dtype,
                          trust_remote_code=self.trust_remote_code, report=report,
                          device_map=self.device_map, max_memory=self.max_memory,
                          deterministic=self.deterministic, tf32=self.tf32, placement=placement)

    def untrusted(self) -> ModelOptions:
        """These options as read from a file someone may have sent: never running a model's code."""
        return replace(self, trust_remote_code=False)
