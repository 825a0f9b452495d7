"""Memory free on a device now, and what a loaded model holds: the driver's figure through NVML
(no CUDA context), torch's allocator cache, the host's available memory.
"""

from __future__ import annotations

import os
from typing import Any


def free_memory(device: str) -> int:
    """Bytes free on this device now: the driver's figure (`gpu_free`) plus what torch's allocator
    holds unused (its cache, ours to reuse), or the host's available RAM."""
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index or 0
        cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
        return int(gpu_free(index) + cached)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def gpu_free(index: int) -> int:
    """Free bytes on CUDA device `index` as the driver counts them: through NVML (`nvml_free`),
    else `torch.cuda.mem_get_info`, which makes a CUDA context on the GPU it asks about."""
    found = nvml_free(index)
    if found is None:
        import torch

        return int(torch.cuda.mem_get_info(index)[0])
    return found


def nvml_free(index: int) -> int | None:
    """Free bytes on CUDA device `index` read through NVML (the nvidia-ml-py package), which opens
    no CUDA context (mem_get_info makes one, 300-500 MB, on every GPU it asks about, other users'
    too). NVML numbers GPUs in PCI order, CUDA by CUDA_VISIBLE_DEVICES and speed, so the GPU is
    found by the UUID torch reports for the CUDA index (a device query). None without NVML (no
    package, no driver library) or when NVML lists no GPU of that UUID (a MIG slice)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        import torch

        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def cuda_devices(model: Any) -> list[str]:
    """The GPUs a loaded model's parameters are on (none on the CPU)."""
    return sorted({str(p.device) for p in model.parameters() if p.device.type == "cuda"})


def model_bytes(model: Any) -> int:
    """Bytes held by a loaded model's parameters and buffers."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)
