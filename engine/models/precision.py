"""How torch runs on the device a `Placement` names: TF32 matmuls, deterministic kernels, the
precision of a run that trains its own model, and the warnings of a precision that is slow or unsafe
there. The placement itself (device, dtype, why) is decided in engine/models/placement.py.
"""

from __future__ import annotations

import os
from typing import TypedDict

from engine.core.events import Message
from engine.models.placement import Flags, Hardware, Placement, dtype_warnings, resolve_placement


class TrainingPrecision(TypedDict):
    """The settings fields a from-scratch training run replaces: `replace(settings, **precision)`."""

    device: str
    dtype: str


def training_precision(device: str, dtype: str) -> TrainingPrecision:
    """The device and forward dtype of a from-scratch training run (growth, toy-depth), 'auto'
    resolved as for a model load (`resolve_placement`); the run keeps float32 weights and
    autocasts to the dtype."""
    placement = resolve_placement(Flags(device, dtype))
    return {"device": placement.device, "dtype": placement.dtype}


def precision_messages(device: str, dtype: str) -> list[Message]:
    """`dtype_warnings` as log lines of a run that trains its own model (growth, toy-depth): what
    `run` and the console print before a model loads."""
    return [Message(line, "warning") for line in dtype_warnings(dtype, device, Hardware.read())]


def enable_tf32(placement: Placement, wanted: bool = True) -> bool:
    """TensorFloat-32 matmuls for float32 on Ampere and later when `wanted` (about 8x the float32
    throughput, 10-bit mantissa inputs with float32 accumulation; deterministic, only less precise).
    Set on a GPU either way, so --no-tf32 holds; returns whether it is on."""
    if not placement.on_gpu:
        return False
    import torch

    on = wanted and placement.dtype == "float32" and placement.tf32_capable
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
