"""Which model a run loads and where: the model flags of every command, declared once as settings.

Torch-free, so the CLI derives `--model`, `--device`, `--dtype` and `--trust-remote-code` from
these fields before anything heavy is imported, and a job file can record them as data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.settings import Settings, setting

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelOptions(Settings):
    """The model of a run; `trust_remote_code` is never read back from a session's files."""

    model: str = setting("smollm2-135m",
                         "smollm2-135m (embedded default), a local HF folder, a .gguf file, or a hub id")
    device: str = setting("auto", "auto, cpu, cuda or cuda:N")
    dtype: str = setting("auto", "weights' precision", choices=DTYPES)
    trust_remote_code: bool = setting(False, "allow a hub model's own code (off by default)")

    def load(self, report: Callable[[str], None] = lambda _: None) -> Any:
        """The loaded model (engine.models.LoadedModel); imports torch."""
        from engine.models import load_model

        return load_model(self.model, device=self.device, dtype=self.dtype,
                          trust_remote_code=self.trust_remote_code, report=report)

    def untrusted(self) -> ModelOptions:
        """These options as read from a file someone may have sent: never running a model's code."""
        return ModelOptions(self.model, self.device, self.dtype, False)
