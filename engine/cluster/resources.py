"""What a task asks the cluster for: the nodes as Ray reports them (`NodeShape`), the hardware the
placement rules read for a task (`cluster_hardware`), and the resources a memory plan needs
(`task_resources`): one whole GPU for a model that fits one (so small models are packed one per
GPU), the GPUs of one node (a STRICT_PACK placement group) for a model spread with --device-map,
CPUs and memory for a CPU run; a model no node can hold is one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import UserError
from engine.models.memory import MARGIN  # a GPU or node holds a plan of at most 90 % of its memory
from engine.models.placement import Hardware


@dataclass(frozen=True)
class NodeShape:
    """One alive node of the cluster, as Ray reports it (`gpu_memory` and `gpu_capability`: each
    GPU's bytes and compute capability, read through NVML on the node; empty where NVML cannot say)."""

    node_id: str
    host: str
    cpus: float
    gpus: int
    memory: int
    gpu_memory: tuple[int, ...] = ()
    gpu_capability: tuple[tuple[int, int], ...] = ()


def cluster_hardware(nodes: Sequence[NodeShape]) -> Hardware:
    """The GPU a task may land on, as engine.models.placement's rules read it (a worker sees its GPU
    as `cuda`, index 0): the lowest compute capability and the smallest GPU of the GPU nodes, so a
    plan in the dtype it gives holds wherever Ray places the task; no GPU node: the CPU."""
    gpu_nodes = [node for node in nodes if node.gpus]
    capabilities = [capability for node in gpu_nodes for capability in node.gpu_capability]
    sizes = [size for node in gpu_nodes for size in node.gpu_memory]
    return Hardware(bool(gpu_nodes), max((node.gpus for node in gpu_nodes), default=0),
                    (min(capabilities),) if capabilities else (), (min(sizes),) if sizes else (),
                    max((node.memory for node in nodes), default=0), local=False)


@dataclass(frozen=True)
class TaskResources:
    """What one task asks Ray for: `gpus` whole GPUs (several: a STRICT_PACK placement group, so on
    one node), `cpus`, and `memory` bytes for a run on the CPU (Ray's scheduling resource)."""

    cpus: float
    gpus: int = 0
    memory: int = 0

    @property
    def packed(self) -> bool:
        return self.gpus > 1

    def text(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU{'s of one node' if self.packed else ''}"
        return f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''}" + (f", {size_text(self.memory)}" if self.memory
                                                                      else "")


def task_resources(what: str, plan_bytes: int | None, device: str, device_map: str | None,
                   max_memory: str | None, nodes: Sequence[NodeShape], cpus: float = 1) -> TaskResources:
    """The resources of a task that holds `plan_bytes` at its peak (None: no plan could be made),
    or the one line saying no node of `nodes` can hold it. A GPU run on a cluster with GPUs (any
    `device` but cpu): with `device_map`, the GPUs `max_memory` names, else as many as the plan
    needs of the node GPUs' memory, else every GPU of the largest node (accelerate spreads the
    layers over what the task is given); without, one whole GPU. Else a CPU run: `cpus` and the
    plan's bytes of a node's memory."""
    from engine.models.placement import parse_max_memory

    gpu_nodes = [node for node in nodes if node.gpus]
    if device != "cpu" and gpu_nodes:
        if device_map is None:
            sizes = [size for node in gpu_nodes for size in node.gpu_memory]
            if plan_bytes is not None and sizes and plan_bytes > MARGIN * max(sizes):
                raise UserError(f"{what} needs about {size_text(plan_bytes)} but the largest GPU of the cluster "
                                f"has {size_text(max(sizes))}; spread the model with --device-map auto, or use "
                                "--device cpu")
            return TaskResources(cpus, 1)
        most = max(node.gpus for node in gpu_nodes)
        named = [key for key in (parse_max_memory(max_memory) or {}) if isinstance(key, int)]
        if named:
            wanted = len(named)
        elif plan_bytes is not None and all(node.gpu_memory for node in gpu_nodes):
            each = min(size for node in gpu_nodes for size in node.gpu_memory)
            wanted = min(most, max(1, math.ceil(plan_bytes / (MARGIN * each))))  # the rest: CPU, disk
        else:
            wanted = most
        if wanted > most:
            raise UserError(f"{what}: --max-memory names {wanted} GPUs but no node of the cluster has more than "
                            f"{most}; name at most {most}")
        return TaskResources(cpus, wanted)
    if device.startswith("cuda"):
        raise UserError(f"{what} asks for --device {device} but the cluster has no GPU; use --device auto or cpu")
    memory = plan_bytes or 0
    if not any(node.cpus >= cpus and node.memory * MARGIN >= memory for node in nodes):
        largest = max((node.memory for node in nodes), default=0)
        raise UserError(f"{what} needs about {size_text(memory)} of memory but the largest node of the cluster "
                        f"has {size_text(largest)} for tasks; use a smaller model, --dtype float16, or a GPU "
                        "cluster")
    return TaskResources(cpus, 0, memory)


def size_text(size: float) -> str:
    """Bytes as a line shows them: GB, or MB below one GB."""
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
