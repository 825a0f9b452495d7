"""The run's placement and precision, decided once (engine/models/placement.py): the documented
rule (docs/gpus.md) on a T4, an A100 and a machine without a GPU, written out here by hand; the
hardware read in one place; and every consumer following a change of the one rule."""

from __future__ import annotations

import pytest
import torch
from tiny_models import save_tiny

import engine.models.placement as placement_module
from engine.cluster.resources import NodeShape, TaskResources, cluster_hardware, task_resources
from engine.core.errors import UserError
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.models.loading import load_model
from engine.models.memory import plan_run
from engine.models.options import ModelOptions
from engine.models.placement import CPU_ONLY, Flags, Hardware, Placement, resolve_placement
from engine.models.precision import training_precision

GB = 10**9
T4 = Hardware(cuda=True, gpus=1, capabilities=((7, 5),), gpu_memory=(16 * GB,), local=False)
A100 = Hardware(cuda=True, gpus=2, capabilities=((8, 0), (8, 0)), gpu_memory=(80 * GB, 80 * GB), local=False)
SMOLLM2 = 134_515_008  # the embedded model's parameters


def test_a_t4_runs_float16_except_gemma():
    """docs/gpus.md: a T4 (compute capability 7.5) has float16 tensor cores and no native bfloat16,
    so auto is float16; Gemma 2/3 overflow float16, so float32 there."""
    llama = resolve_placement(Flags(), T4, SMOLLM2, "llama")
    assert (llama.device, llama.dtype) == ("cuda", "float16")
    assert llama.why.startswith("auto, no native bfloat16 on compute capability 7.5;")
    assert not llama.tf32_capable  # TF32 units came with Ampere
    gemma = resolve_placement(Flags(), T4, 2_600_000_000, "gemma2")
    assert (gemma.dtype, gemma.why) == ("float32", "auto, no native bfloat16 on compute capability 7.5 and "
                                                   "float16 overflows Gemma 2/3")
    assert resolve_placement(Flags(dtype="bfloat16"), T4).why == "--dtype bfloat16"  # never second-guessed


def test_an_a100_runs_bfloat16_and_the_cpu_float32():
    on_a100 = resolve_placement(Flags(device="cuda:1"), A100, SMOLLM2, "gemma2")
    assert on_a100 == Placement("cuda:1", "bfloat16", "auto, native bfloat16 on compute capability 8.0",
                                tf32_capable=True)
    on_cpu = resolve_placement(Flags(), CPU_ONLY, SMOLLM2, "llama")
    assert on_cpu == Placement("cpu", "float32", "auto, the CPU")
    placed = resolve_placement(Flags(device_map="auto", max_memory="0=14GiB,cpu=30GiB"), A100)
    assert placed.device_map == "auto" and placed.max_memory() == {0: "14GiB", "cpu": "30GiB"}


@pytest.mark.parametrize(("flags", "hardware", "words"), [
    (Flags(device="cuda"), CPU_ONLY, "no CUDA GPU is visible here; use --device cpu"),
    (Flags(device="cuda:1"), T4, "only 1 GPU(s); pick another index"),
    (Flags(device="tpu"), T4, "not understood"),
    (Flags(dtype="int4"), T4, "not understood"),
    (Flags(device_map="auto", max_memory="3=10GiB"), A100, "names GPU 3, but only 2 GPU(s)"),
    (Flags(max_memory="0=10GiB"), A100, "only applies with --device-map"),
])
def test_what_cannot_be_placed_is_one_line(flags, hardware, words):
    with pytest.raises(UserError) as info:
        resolve_placement(flags, hardware)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_hardware_is_read_in_one_place(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (7, 5))
    read = Hardware.read()
    assert (read.cuda, read.gpus, read.capabilities, read.local) == (True, 2, ((7, 5), (7, 5)), True)
    assert read.host_memory > 0


def test_a_cluster_is_placed_by_its_weakest_gpu():
    nodes = [NodeShape("a", "10.0.0.1", 8, 2, 64 * GB, (80 * GB,) * 2, ((8, 0),) * 2),
             NodeShape("b", "10.0.0.2", 8, 1, 64 * GB, (16 * GB,), ((7, 5),))]
    hardware = cluster_hardware(nodes)
    assert hardware == Hardware(True, 2, ((7, 5),), (16 * GB,), 64 * GB, local=False)
    assert resolve_placement(Flags(), hardware, SMOLLM2, "llama").dtype == "float16"  # the T4 could get it
    unknown = cluster_hardware([NodeShape("c", "10.0.0.3", 8, 1, 64 * GB)])  # no NVML on the node
    assert resolve_placement(Flags(), unknown).why == "auto, the GPU's compute capability is not known"
    assert cluster_hardware([NodeShape("d", "10.0.0.4", 8, 0, 64 * GB)]).cuda is False


SENTINEL = ("float16", "the one rule, changed by this test")


def test_every_consumer_follows_the_one_rule(tmp_path, monkeypatch):
    """The rule changed in its one place (a dtype no machine here gets, a device that is always the
    CPU): the plan, the loader, the console's job, a training run and the cluster's task all follow."""
    from cli.argv import job_argv
    from tui.jobs import job_options

    folder = save_tiny(tmp_path / "tiny")
    settings = AblationSettings(eval_set="paper")
    monkeypatch.setattr(placement_module, "dtype_rule", lambda *args, **kwargs: SENTINEL)
    gpus = [NodeShape("a", "10.0.0.1", 8, 1, 64 * GB, (80 * GB,), ((8, 0),))]  # an A100 would be bfloat16
    on_cluster = plan_run(str(folder), settings, hardware=cluster_hardware(gpus))
    assert (on_cluster.device, on_cluster.dtype, on_cluster.dtype_reason) == ("cuda", *SENTINEL)
    assert task_resources("m", on_cluster.total, on_cluster.device, None, None, gpus) == TaskResources(1, 1)
    assert training_precision("auto", "auto")["dtype"] == "float16"
    monkeypatch.setattr(placement_module, "device_rule", lambda requested, hardware: "cpu")
    plan = plan_run(str(folder), settings, device="cuda:7")  # no second rule refuses the GPU this machine lacks
    assert (plan.device, plan.dtype, plan.dtype_reason) == ("cpu", *SENTINEL)
    loaded = load_model(str(folder), device="cuda:7")
    assert (loaded.device, loaded.dtype_name) == ("cpu", "float16")
    assert next(loaded.model.parameters()).dtype == torch.float16
    assert loaded.describe()["dtype_reason"] == SENTINEL[1]
    options = job_options(ModelOptions(model=str(folder)), loaded)
    assert (options.device, options.dtype) == ("cpu", "float16")
    argv = job_argv("ablation", settings, options, "s", resume=False)
    assert "--dtype=float16" in argv and "--device=cpu" in argv
