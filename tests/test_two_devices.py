"""Every experiment on a model split over two GPUs, simulated on the CPU (tests/virtual_devices.py).

Each run happens twice: on the plain model, and with the model's layers spread over a virtual
cuda:0 and cuda:1 by accelerate's hooks, where an operation that mixes the two devices raises as
it would on CUDA. The numbers must be the plain run's. The ablation, recovery, prune and dynamics
runs also keep to a budget of host reads (each waits for the GPU) and uploads, written as what the
run's structure needs (per batch, per evaluation, per step); `test_*_mutation_is_caught` checks
that a read per matrix or per layer and batch, a training forward without its attention mask,
healed weights read to the host, an `np.asarray` of a GPU tensor and an index on the wrong GPU each
fail them."""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import pytest
import torch
from tiny_models import TINY_CONFIGS, tiny_model
from virtual_devices import DeviceMismatch, NotArrived, VirtualDevices, device_of, place, two_gpus

from engine.core.events import Result
from engine.models.anatomy import LayerStack

pytestmark = pytest.mark.usefixtures("one_thread")

SPLIT = ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
# the second layout: the head back on cuda:0, layer 1 offloaded to disk between the GPUs (it computes on
# cuda:0, its weights brought from disk at each forward, as accelerate's device_map "disk" does)
class Layout(TypedDict):
    layout: list[str]
    head: str


OFFLOADED: Layout = {"layout": ["cuda:0", "disk", "cuda:1", "cuda:1"], "head": "cuda:0"}
LAYERS = len(SPLIT)
MATRICES = 7  # a tiny llama layer's q, k, v, o, gate, up, down
LAYER_PARAMS = MATRICES + 2  # and its two norms


def result(events) -> dict:
    events = list(events)
    assert isinstance(events[-1], Result)
    return events[-1].data


def without_times(doc):
    """A result document less its wall-clock fields, which no two runs share."""
    if isinstance(doc, dict):
        return {k: without_times(v) for k, v in doc.items() if "second" not in k and k != "tokens_per_s"}
    if isinstance(doc, list):
        return [without_times(v) for v in doc]
    return doc


def on_both(monkeypatch, run, seed: int = 3, family: str = "llama", dtype=torch.float32, layout=SPLIT,
            **placement):
    """run(model) on the plain model and on the same model (in `dtype`) split over two virtual GPUs;
    the split run's VirtualDevices mode too (its reads and uploads)."""
    expected = run(tiny_model(family, seed=seed).to(dtype))
    got, mode = on_gpus(monkeypatch, run, seed, family, dtype, layout, **placement)
    return expected, got, mode


def on_gpus(monkeypatch, run, seed: int = 3, family: str = "llama", dtype=torch.float32, layout=SPLIT, **placement):
    """run(model) on the model split over two virtual GPUs alone: (its result, the mode)."""
    with two_gpus(monkeypatch) as mode:
        got = run(place(tiny_model(family, seed=seed).to(dtype), layout, **placement))
    assert mode.crossings > 0  # activations really went from one GPU to the other
    return got, mode


def within(mode: VirtualDevices, reads: int, uploads: int) -> None:
    """The split run read from and uploaded to the GPUs at most this often; otherwise the lines that did."""
    assert mode.reads <= reads and mode.uploads <= uploads, (
        f"{mode.reads} host reads (budget {reads}), {mode.uploads} uploads (budget {uploads}): "
        f"{dict(sorted(mode.sites.items()))}")


def batches(settings, tokenizer) -> int:
    """The evaluation batches of these settings (their texts, eval_batch_size at a time)."""
    return math.ceil(len(settings.eval_source(tokenizer).texts) / settings.eval_batch_size)


def ablation_budget(settings, tokenizer) -> dict[str, int]:
    """Per batch: its token count (one read) and its ids and mask (two uploads); one read per
    evaluation (the baseline, then each layer and each block: the batches' losses gathered first);
    per layer and block the meter's sums once, and the map once."""
    blocks = 1 + len(settings.parts())
    evaluations = 1 + LAYERS * blocks
    n = batches(settings, tokenizer)
    return {"reads": n + evaluations + LAYERS * blocks + 1, "uploads": 2 * n}


# --- the harness itself ------------------------------------------------------------------------------


def test_mixing_two_devices_raises_as_cuda_does():
    with VirtualDevices():
        a, b = torch.ones(3, device="cuda:0"), torch.ones(3).to("cuda:1")
        with pytest.raises(DeviceMismatch, match="cuda:0 and cuda:1"):
            a + b
        with pytest.raises(DeviceMismatch, match="cuda:0 and cpu"):
            a * torch.ones(3)
        with pytest.raises(TypeError, match="can't convert cuda:0"):
            a.numpy()
        with pytest.raises(RuntimeError, match="'cuda' device type for generator"):
            torch.randn(3, device="cuda:0", generator=torch.Generator().manual_seed(0))
        assert (a + b.to(a.device)).device == torch.device("cuda:0")
        assert (a + torch.tensor(2.0)).device == torch.device("cuda:0")  # a CPU scalar is fine
        assert a.new_zeros(2).device == torch.zeros_like(a).device == torch.device("cuda:0")
        assert a.cpu().numpy().tolist() == [1.0, 1.0, 1.0]


def test_reads_and_uploads_are_counted_where_cuda_pays_them():
    """Every way Python reads a GPU number waits for the GPU (one read each); np.asarray raises as
    `.numpy()` does; a host index tensor on a GPU tensor is copied up."""
    with VirtualDevices() as mode:
        a = torch.arange(6.0, device="cuda:0")
        float(a[0]), int(a[1]), bool(a[2]), a[3].item(), a.tolist(), f"{a[4]:.2f}", [0, 1, 2][a[1].long()]
        assert mode.reads == 7 and mode.uploads == 0
        a.cpu()
        assert mode.reads == 8
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            np.asarray(a)
        assert np.asarray(a.cpu()).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        a[torch.tensor([0, 2])]
        assert mode.uploads == 1
        torch.ones(3).to("cuda:1")
        assert mode.uploads == 2 and mode.reads == 9
        assert all(site.endswith("elsewhere") for site in mode.sites)  # no engine line made them


def test_a_queued_copy_to_the_host_waits_for_nothing_until_it_is_used(monkeypatch):
    """`.to("cpu", non_blocking=True)` is no read; its host tensor may go back to a GPU at once (CUDA
    orders the two copies on the stream), any other use needs a synchronize first, which is a read."""
    with two_gpus(monkeypatch) as mode:
        a = torch.arange(6.0, device="cuda:1")
        saved = a.to("cpu", copy=True, non_blocking=True)
        assert mode.reads == 0 and saved.device == torch.device("cpu")
        a.mul_(2.0)
        a.copy_(saved)
        assert torch.equal(saved.to("cuda:1"), a)
        with pytest.raises(NotArrived, match="non_blocking=True before torch.cuda.synchronize"):
            saved.sum()
        with pytest.raises(NotArrived):
            np.asarray(saved)
        torch.cuda.synchronize()
        assert mode.reads == 1 and saved.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert a.to("cpu").tolist() == saved.tolist() and mode.reads == 2  # a blocking copy is a read


def test_host_copies_wait_once_per_gpu(monkeypatch):
    from engine.models.anatomy import host_copies

    with two_gpus(monkeypatch) as mode:
        tensors = {f"t{i}": torch.full((3,), float(i), device=f"cuda:{i % 2}") for i in range(6)}
        tensors["host"] = torch.ones(2)
        copies = host_copies(tensors)
        assert mode.reads == 2  # one synchronize per GPU, not one read per tensor
        assert {name: t.tolist() for name, t in copies.items()} == {name: t.cpu().tolist()
                                                                    for name, t in tensors.items()}
        assert all(t.device == torch.device("cpu") for t in copies.values())
        assert copies["host"] is not tensors["host"]  # copies, even of what was on the host


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_a_blocks_forward_reads_nothing_and_gives_the_forwards_numbers(family):
    """Whole blocks with their all-ones mask: the logits of a forward without one, bit for bit, and
    no host read (without a mask transformers reads the position ids back, looking for packing)."""
    from engine.training.trainer import blocks_forward

    model = tiny_model(family, seed=3)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    expected = model(input_ids=ids, use_cache=False).logits
    with VirtualDevices() as mode:
        model.to("cuda:0")
        ids = ids.to("cuda:0")
        uploads = mode.uploads
        logits = blocks_forward(model, ids).logits
        assert mode.reads == 0 and mode.uploads == uploads
        model(input_ids=ids, use_cache=False)
        assert family == "opt" or mode.reads > 0  # the read it saves (OPT makes its mask without one)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_index_tensors_on_another_gpu_raise_as_cuda_does():
    with VirtualDevices():
        states = torch.arange(12.0).reshape(4, 3).to("cuda:1")
        assert states[torch.tensor([1, 3])].device == torch.device("cuda:1")  # a host index: allowed
        assert states[torch.tensor([1, 3]).to("cuda:1")].tolist() == [[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
        wrong = torch.tensor([1, 3]).to("cuda:0")
        with pytest.raises(DeviceMismatch, match=r"indices should be either on cpu or on the same device .*\(cuda:1\)"):
            states[wrong]
        with pytest.raises(DeviceMismatch, match="indices should be"):
            states[wrong] = 0.0
        with pytest.raises(DeviceMismatch, match=r"\(cpu\)"):
            torch.arange(4.0)[wrong]
        with pytest.raises(DeviceMismatch, match="cuda:1 and cuda:0"):
            states.index_select(0, wrong)  # an ordinary operand: the usual mismatch


def test_autocast_on_the_virtual_gpus_autocasts(monkeypatch):
    """Under the harness `torch.autocast("cuda", float16)` runs the matmuls in float16, as on a card
    (a CPU build's CUDA autocast leaves CPU tensors alone), and `enabled=False` turns it off inside."""
    with two_gpus(monkeypatch):
        a = torch.randn(4, 4, device="cuda:0")
        with torch.autocast("cuda", dtype=torch.float16):
            assert (a @ a).dtype == torch.float16
            with torch.autocast(device_type="cuda", enabled=False):
                assert (a @ a).dtype == torch.float32
        assert (a @ a).dtype == torch.float32


def test_the_offloaded_layout_puts_the_head_on_the_first_gpu(monkeypatch, tokenizer, tmp_path):
    ids = torch.tensor([tokenizer.encode("The cat sat on the mat.")])
    expected = tiny_model("llama", seed=3)(input_ids=ids).logits
    with two_gpus(monkeypatch) as mode:
        model = place(tiny_model("llama", seed=3), OFFLOADED["layout"], tmp_path / "offload", head="cuda:0")
        stack = LayerStack(model)
        assert stack.layer_devices() == ["cuda:0", "disk", "cuda:1", "cuda:1"]
        assert device_of(model.get_output_embeddings().weight) == torch.device("cuda:0")
        logits = model(input_ids=ids.to(stack.input_device())).logits
        torch.testing.assert_close(logits.cpu(), expected, rtol=0, atol=0)
        assert mode.crossings >= 2  # up to cuda:1 and back down to the head


def test_place_spreads_layers_and_keeps_the_numbers(monkeypatch, tokenizer):
    ids = torch.tensor([tokenizer.encode("The cat sat on the mat.")])
    expected = tiny_model("llama", seed=3)(input_ids=ids).logits
    with two_gpus(monkeypatch) as mode:
        model = place(tiny_model("llama", seed=3), SPLIT)
        stack = LayerStack(model)
        assert stack.layer_devices() == SPLIT
        assert stack.input_device() == torch.device("cuda:0")
        assert device_of(stack.matrices(3)["q"]) == torch.device("cuda:1")
        logits = model(input_ids=ids.to(stack.input_device())).logits
        assert logits.device == torch.device("cuda:0")  # accelerate hands the output back where the input was
        torch.testing.assert_close(logits.cpu(), expected, rtol=0, atol=0)
        assert mode.crossings >= 1


# --- the experiments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "dtype"), [("mean", torch.float32), ("skip", torch.float32),
                                               ("zero", torch.float32), ("mean", torch.float16)])
def test_ablation_map_with_its_meter_and_prefix_cache(monkeypatch, tokenizer, method, dtype):
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    settings = AblationSettings(method=method, eval_set="paper", eval_batch_size=4)
    expected, got, mode = on_both(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)),
                                  dtype=dtype)
    assert without_times(got) == without_times(expected)
    within(mode, **ablation_budget(settings, tokenizer))


@pytest.mark.parametrize(("part", "method", "dtype"), [("both", "skip", torch.float32), ("both", "mean", torch.float32),
                                                       ("mlp", "zero", torch.float16)])
def test_ablation_below_the_layer(monkeypatch, tokenizer, part, method, dtype):
    """Each layer's attention and MLP removed alone, the blocks split over two GPUs and in half precision."""
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    settings = AblationSettings(method=method, part=part, eval_set="paper", eval_batch_size=4)
    expected, got, mode = on_both(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)),
                                  dtype=dtype)
    assert got["parts"] and without_times(got) == without_times(expected)
    within(mode, **ablation_budget(settings, tokenizer))


def test_ablation_with_the_head_on_the_first_gpu_and_a_layer_on_disk(monkeypatch, tokenizer, tmp_path):
    """The second layout: activations go cuda:0, disk (computed on cuda:0), cuda:1 and back to cuda:0 for
    the head; skipping layers edits no weight, so it runs with a layer offloaded."""
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    settings = AblationSettings(method="skip", eval_set="paper", eval_batch_size=4)
    expected, got, mode = on_both(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)),
                                  offload_dir=tmp_path / "offload", **OFFLOADED)
    assert without_times(got) == without_times(expected)
    budget = ablation_budget(settings, tokenizer)
    # each forward through the disk layer brings its parameters up: the baseline's batches and layer 0's
    # (the layers above start from the prefix cache, past it)
    budget["uploads"] += LAYER_PARAMS * 2 * batches(settings, tokenizer)
    within(mode, **budget)


def dynamics_budget(settings, measures: int = 7) -> dict[str, int]:
    """Per batch: each of the meter's `measures` once, the kept positions, the token count, the
    lens' token count, the ids and mask for the clusters' examples (one read each) and its ids and
    mask up; the lens' losses once at the end."""
    with open(settings.text_file, encoding="utf-8") as texts:
        n = math.ceil(len(texts.read().splitlines()) / settings.eval_batch_size)
    return {"reads": n * (measures + 5) + 1, "uploads": 2 * n}


@pytest.mark.parametrize("lens", ["plain", "last-block"])
@pytest.mark.parametrize("layout", ["split", "offloaded"])
def test_dynamics_angles_trajectories_and_lens(monkeypatch, tokenizer, files, tmp_path, lens, layout):
    from engine.experiments.dynamics.run import run_dynamics
    from engine.experiments.dynamics.vocabulary import DynamicsSettings

    settings = DynamicsSettings(text_file=files[0], max_tokens=200, max_length=64, logit_lens=True, lens=lens,
                                clusters=2)
    placement = {"offload_dir": tmp_path / "offload", **OFFLOADED} if layout == "offloaded" else {}
    expected, got, mode = on_both(monkeypatch, lambda model: result(run_dynamics(model, tokenizer, settings)),
                                  **placement)
    assert without_times(got) == without_times(expected)
    budget = dynamics_budget(settings)
    if placement:  # the one forward of each batch brings the disk layer's parameters up
        budget["uploads"] += LAYER_PARAMS * (budget["uploads"] // 2)
    within(mode, **budget)


def test_weights_with_the_paradox(monkeypatch, tokenizer, files):
    from engine.experiments.weights.run import run_weights
    from engine.experiments.weights.vocabulary import WeightsSettings

    settings = WeightsSettings(first_layer=0, eval_file=files[0], null_draws=2, paradox_counts=(1, 0),
                               components=("q", "gate"))
    expected, got, _ = on_both(monkeypatch, lambda model: result(run_weights(model, tokenizer, settings)))
    assert without_times(got) == without_times(expected)


def test_manipulate(monkeypatch, tokenizer, files):
    from engine.experiments.manipulate.run import run_manipulation
    from engine.experiments.manipulate.vocabulary import ManipulationSettings

    settings = ManipulationSettings(layers=(1, 2), eval_file=files[0], alphas=(0.5,), rank=2, together=True,
                                    sample_tokens=4)
    expected, got, _ = on_both(monkeypatch, lambda model: result(run_manipulation(model, tokenizer, settings)))
    assert without_times(got) == without_times(expected)


def recovery_settings(files):
    from engine.experiments.recovery.vocabulary import RecoverySettings

    return RecoverySettings(layers=(1, 2), sigma=3.0, steps=3, lr=1e-2, batch_size=2, block_size=16,
                            train_blocks=4, train_file=files[1], eval_file=files[0], eval_every=1)


def recovery_budget(settings, dtype) -> dict[str, int]:
    """The evaluation texts in one batch (its token count read, its ids and mask up) and the
    training blocks up once; one read per evaluation (the baseline, each layer noised and after each
    step); per step its loss, and in float16 GradScaler's overflow check. The prefix and training
    forwards read nothing: they pass their blocks' all-ones attention mask (without one transformers
    reads the position ids back at every forward, looking for packed sequences)."""
    layers, steps = len(settings.layers), settings.steps
    per_step = 2 if dtype == torch.float16 else 1
    return {"reads": 1 + (1 + layers * (steps + 1)) + per_step * layers * steps, "uploads": 3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_recovery(monkeypatch, tokenizer, files, dtype):
    """float16 on the GPUs: float32 masters, autocast and a loss scaler on each layer's own device."""
    from engine.experiments.recovery.run import run_recovery

    settings = recovery_settings(files)
    expected, got, mode = on_both(monkeypatch, lambda model: result(run_recovery(model, tokenizer, settings)),
                                  dtype=dtype)
    assert without_times(got) == without_times(expected)
    within(mode, **recovery_budget(settings, dtype))


# prune's host reads and uploads on this layout, exactly as counted site by site: every run reads the
# map's (3 batches' token counts, 22 evaluations, the meter's 4 + 1), the angular distances (a row of
# sums at a time: 6), each healing step's loss (12) and the export's parameters from the GPUs (30; 29
# with the embedding on disk); LoRA waits once per GPU for the adapters it writes to the export's
# adapter folder (3 adapters on 2 GPUs: 6); float16 adds GradScaler's overflow check per step (16;
# LoRA 20). The healing forwards pass their all-ones mask (without it, transformers' packed-sequence
# test read once each: 12 more); the trained layers' snapshots and the kept healed weights are queued
# to the host, only ever copied back (read one parameter at a time they cost 36 more, 216 with LoRA),
# and the adapters' copies queued (one read a tensor: 126 instead of 6). It uploads each batch's ids
# and mask (6) and the training blocks (1); LoRA its adapters, drawn on the host (210: the same numbers
# whatever the layout; drawn on each GPU they would follow the layout); an embedding on disk comes up
# at every forward (68; 80 with LoRA).
PRUNE_BUDGET = {
    ("adjacent", None, torch.float32): (78, 7), ("adjacent", "disk", torch.float32): (77, 75),
    ("adjacent", None, torch.float16): (94, 7), ("lora", None, torch.float32): (84, 217),
    ("lora", "disk", torch.float32): (83, 297), ("lora", None, torch.float16): (104, 217),
}


@pytest.mark.parametrize("heal", ["adjacent", "lora"])
@pytest.mark.parametrize(("embedding", "dtype"), [(None, torch.float32), ("disk", torch.float32),
                                                  (None, torch.float16)],
                         ids=["embedding-on-gpu", "embedding-offloaded", "float16"])
def test_prune_with_healing_and_export(monkeypatch, tokenizer, files, tmp_path, heal, embedding, dtype):
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    dtype_name = str(dtype).removeprefix("torch.")

    def run(model, folder):
        settings = PruneSettings(eval_file=files[0], train_file=files[1], remove=(1, 2), heal_steps=2, heal=heal,
                                 export=str(folder), export_count=1)
        loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", dtype_name, "llama", 4)
        doc = result(experiment("prune").run(settings, RunContext(model=loaded)))
        exported = tiny_model("llama").from_pretrained(folder, torch_dtype=dtype)
        return doc, {k: v.clone() for k, v in exported.state_dict().items()}

    folders = iter((tmp_path / "plain", tmp_path / "split"))
    (plain, plain_weights), (split, split_weights), mode = on_both(
        monkeypatch, lambda model: run(model, next(folders)), dtype=dtype, embedding=embedding,
        offload_dir=tmp_path / "offload")
    for doc in (plain, split):
        doc["exported"] = doc["settings"]["export"] = None
    assert without_times(split) == without_times(plain)
    assert split_weights.keys() == plain_weights.keys()
    assert all(torch.equal(split_weights[k], plain_weights[k]) for k in plain_weights)
    reads, uploads = PRUNE_BUDGET[heal, embedding, dtype]
    within(mode, reads, uploads)


def test_prune_with_a_linear_replacement_and_export(monkeypatch, tokenizer, files, tmp_path):
    """ReplaceMe's calibration pass and fold when the block's layers and the layer before it sit on
    different GPUs: the same curves and the same exported weights as on one device."""
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    def run(model, folder):
        settings = PruneSettings(method="angular", eval_file=files[0], train_file=files[1], remove=(2,), bootstrap=0,
                                 replace=("linear",), block_size=16, train_blocks=16, export=str(folder),
                                 export_method="angular+linear")
        loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
        doc = result(experiment("prune").run(settings, RunContext(model=loaded)))
        exported = tiny_model("llama").from_pretrained(folder)
        return doc, {k: v.clone() for k, v in exported.state_dict().items()}

    folders = iter((tmp_path / "plain", tmp_path / "split"))
    (plain, plain_weights), (split, split_weights), _ = on_both(monkeypatch, lambda model: run(model, next(folders)))
    for doc in (plain, split):
        doc["exported"] = doc["settings"]["export"] = None
    assert plain["exported_point"]["method"] == "angular+linear"
    assert without_times(split) == without_times(plain)
    assert all(torch.allclose(split_weights[k], plain_weights[k], atol=1e-6) for k in plain_weights)


def test_prune_by_blocks_and_export(monkeypatch, tokenizer, files, tmp_path):
    """Block cuts (each block's proxies from the one forward, its term skipped) with blocks on both
    GPUs, the greedy search over blocks, and an export whose zeroed output projections sit on the
    second GPU: the same curves and exported weights as on one device, reloading to the same logits."""
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    ids = torch.tensor([[5, 70, 33, 101, 9, 250, 17, 3]])

    def run(model, folder):
        settings = PruneSettings(method="all", unit="block", eval_file=files[0], remove=(1, 2), bootstrap=0,
                                 export=str(folder), export_method="bi", export_count=2)
        loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
        doc = result(experiment("prune").run(settings, RunContext(model=loaded)))
        exported = tiny_model("llama").from_pretrained(folder)
        with torch.no_grad():
            logits = exported(input_ids=ids).logits
        return doc, {k: v.clone() for k, v in exported.state_dict().items()}, logits

    folders = iter((tmp_path / "plain", tmp_path / "split"))
    (plain, plain_weights, plain_logits), (split, split_weights, split_logits), _ = on_both(
        monkeypatch, lambda model: run(model, next(folders)))
    for doc in (plain, split):
        doc["exported"] = doc["settings"]["export"] = None
    assert {block["layer"] for block in plain["exported_point"]["blocks"]} & {2, 3}  # a cut on the second GPU
    assert without_times(split) == without_times(plain)
    assert all(torch.equal(split_weights[k], plain_weights[k]) for k in plain_weights)
    assert torch.equal(split_logits, plain_logits)


@pytest.mark.parametrize("embedding", [None, "disk"], ids=["embedding-on-gpu", "embedding-offloaded"])
def test_prompt_variants_and_generation(monkeypatch, tokenizer, tmp_path, embedding):
    from engine.evaluation.generation import generate_text
    from engine.experiments.variants import Variant, applied

    variants = [Variant("original"), Variant("modified", layers=(1, 2)), Variant("noised", layers=(2,), sigma=2.0),
                Variant("pruned", layers=(1, 2)),
                Variant("modified", layers=(1,), blocks=((2, "mlp"), (3, "attention")))]  # blocks across the GPUs

    def answers(model):
        before = {k: v.clone() for k, v in model.state_dict().items() if v.device.type != "meta"}
        texts = []
        for variant in variants:
            with applied(model, variant):
                texts.append(generate_text(model, tokenizer, "The cat", 6))
        after = model.state_dict()
        assert all(torch.equal(after[k], before[k]) for k in before)
        return texts

    expected, got, _ = on_both(monkeypatch, answers, embedding=embedding, offload_dir=tmp_path / "offload")
    assert got == expected


# --- the budgets catch what a GPU pays for: each mutation below once passed every test ---------------------


def test_a_float_of_each_matrix_std_mutation_is_caught(monkeypatch, tokenizer, files):
    """Recovery with a `float(w.std())` per matrix in its noise loop: within budget no more."""
    import engine.experiments.recovery.sweep as sweep
    from engine.experiments.recovery.run import run_recovery

    settings = recovery_settings(files)
    noise = sweep.add_noise

    def reading(stack, index, *args, **kwargs):
        for weight in stack.matrices(index).values():
            float(weight.std())
        return noise(stack, index, *args, **kwargs)

    monkeypatch.setattr(sweep, "add_noise", reading)
    _, mode = on_gpus(monkeypatch, lambda model: result(run_recovery(model, tokenizer, settings)))
    with pytest.raises(AssertionError, match="host reads"):
        within(mode, **recovery_budget(settings, torch.float32))
    assert sum(n for site, n in mode.sites.items() if "recovery/sweep.py" in site) >= MATRICES * len(settings.layers)


def test_a_training_forward_without_its_mask_mutation_is_caught(monkeypatch, tokenizer, files):
    """Recovery's prefix and training forwards given no attention mask: transformers' read per forward."""
    import engine.experiments.recovery.sweep as sweep
    from engine.experiments.recovery.run import run_recovery

    monkeypatch.setattr(sweep, "blocks_forward", lambda model, ids: model(input_ids=ids, use_cache=False))
    settings = recovery_settings(files)
    _, mode = on_gpus(monkeypatch, lambda model: result(run_recovery(model, tokenizer, settings)))
    with pytest.raises(AssertionError, match="host reads"):
        within(mode, **recovery_budget(settings, torch.float32))


def test_healed_weights_read_to_the_host_mutation_is_caught(monkeypatch, tokenizer, files, tmp_path):
    """Prune's kept healed weights copied to the host one parameter at a time, each waiting for the GPU."""
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    copies = LayerStack.copies
    monkeypatch.setattr(LayerStack, "copies",
                        lambda self, indices, host=False, queued=False: copies(self, indices, host))
    settings = PruneSettings(eval_file=files[0], train_file=files[1], remove=(1, 2), heal_steps=2, heal="adjacent",
                             export=str(tmp_path / "export"), export_count=1)
    run = experiment("prune").run
    _, mode = on_gpus(monkeypatch, lambda model: result(run(settings, RunContext(
        model=LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)))))
    with pytest.raises(AssertionError, match="host reads"):
        within(mode, *PRUNE_BUDGET["adjacent", None, torch.float32])


def test_a_cpu_copy_per_layer_and_batch_mutation_is_caught(monkeypatch, tokenizer):
    """The ablation map with each layer's output copied to the host in every batch."""
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    capture = LayerStack.capture

    def copying(self, observe, batch=None):
        def copied(b, i, x, y) -> None:
            y.cpu()
            observe(b, i, x, y)

        return capture(self, copied, batch)

    monkeypatch.setattr(LayerStack, "capture", copying)
    settings = AblationSettings(method="mean", eval_set="paper", eval_batch_size=4)
    _, mode = on_gpus(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)))
    with pytest.raises(AssertionError, match="host reads"):
        within(mode, **ablation_budget(settings, tokenizer))


def test_an_np_asarray_of_a_gpu_tensor_mutation_is_caught(monkeypatch, tokenizer):
    """np.asarray of a device tensor raises, as CUDA's `.numpy()` does (it once passed silently)."""
    import engine.evaluation.perplexity as perplexity
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    nll = perplexity.token_nll
    monkeypatch.setattr(perplexity, "token_nll", lambda *args, **kwargs: torch.as_tensor(np.asarray(
        nll(*args, **kwargs))))
    settings = AblationSettings(method="skip", eval_set="paper", eval_batch_size=4)
    with pytest.raises(TypeError, match="can't convert cuda:. device type tensor to numpy"):
        on_gpus(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)))


def test_an_index_on_the_wrong_gpu_mutation_is_caught(monkeypatch, tokenizer):
    """Each batch's token losses (handed back on cuda:0, where the ids went in) indexed with rows made
    on cuda:1: CUDA refuses it, and so does the harness."""
    import engine.evaluation.perplexity as perplexity
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    masked = perplexity.masked

    def indexed(values, attention_mask):
        rows = torch.arange(values.shape[0], device="cuda:1")
        return masked(values[rows], attention_mask)

    monkeypatch.setattr(perplexity, "masked", indexed)
    settings = AblationSettings(method="skip", eval_set="paper", eval_batch_size=4)
    with pytest.raises(DeviceMismatch, match=r"indices should be either on cpu or on the same device .*cuda:0"):
        on_gpus(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)))


# --- out of memory anywhere in an experiment ------------------------------------------------------


@pytest.mark.parametrize(("name", "target", "flag"), [
    ("dynamics", "engine.experiments.dynamics.profiles.trajectory", "--max-tokens"),
    ("weights", "engine.experiments.weights.run.gram_of", "--no-paradox"),
])
def test_out_of_memory_is_one_line_naming_the_experiment_and_flag(monkeypatch, tokenizer, files, name, target, flag):
    from engine.core.errors import UserError
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(target, exhausted)
    record = experiment(name)
    text = {"text_file": files[0]} if name == "dynamics" else {"eval_file": files[0], "first_layer": 0}
    settings = record.settings_class(**text)
    loaded = LoadedModel(tiny_model("llama"), tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
    with pytest.raises(UserError, match=f"^out of memory in {name}; try .*{flag}") as caught:
        list(record.run(settings, RunContext(model=loaded)))
    assert caught.value.__suppress_context__  # one line, not the allocator's traceback


# --- growth and toy-depth: their own models, placed on a GPU of their --device ----------------------


def on_second_gpu(monkeypatch, run):
    """run(device) on the CPU and on the second of two virtual GPUs."""
    expected = run("cpu")
    with two_gpus(monkeypatch):
        got = run("cuda:1")
    return expected, got


def test_growth_on_a_gpu(monkeypatch):
    from test_growth import small_settings

    from engine.experiments.growth.experiment import run_growth

    def run(device):
        settings = small_settings(steps=8, arms=("growth_100", "uniform_100"), checkpoint_every=0, device=device,
                                  dtype="float32")
        doc = result(run_growth(settings))
        doc["settings"]["device"] = None
        return doc

    expected, got = on_second_gpu(monkeypatch, run)
    assert without_times(got)["arms"] == without_times(expected)["arms"]


def test_toy_depth_on_a_gpu(monkeypatch):
    import dataclasses

    from test_toy_depth import MICRO

    from engine.experiments.toy_depth.run import run_toy_depth

    def run(device):
        doc = result(run_toy_depth(dataclasses.replace(MICRO, device=device, dtype="float32"), preset="micro"))
        return doc["regimes"]

    expected, got = on_second_gpu(monkeypatch, run)
    assert got == expected


def test_noise_is_drawn_on_the_layers_gpu(monkeypatch):
    """No noise matrix is drawn on the host and copied up; the prompt pane's noised variant is a
    recovery run's first noise."""
    from engine.experiments.recovery.sweep import add_noise, noise_seed
    from engine.experiments.variants import noised

    with two_gpus(monkeypatch) as mode:
        model = place(tiny_model("llama", seed=3), SPLIT)
        stack = LayerStack(model)
        before = {n: p.clone() for n, p in stack.matrices(3).items()}
        with stack.preserved([3]):
            add_noise(stack, 3, 0.5, noise_seed(7, 3, 0))
            assert mode.uploads == 0
            recovery_noise = {n: p.clone() for n, p in stack.matrices(3).items()}
        with noised(model, [3], 0.5, seed=7):
            assert all(torch.equal(p, recovery_noise[n]) for n, p in stack.matrices(3).items())
        assert all(device_of(p) == torch.device("cuda:1") for p in recovery_noise.values())
        assert not any(torch.equal(recovery_noise[n], before[n]) for n in before)


def test_the_logit_lens_reads_its_sums_back_once(monkeypatch, tokenizer, tmp_path):
    """The lens scores every row of every layer; its sums stay on the GPUs, so turning it on adds
    host reads per batch (the token count), not one per row and layer."""
    from engine.experiments.dynamics.run import run_dynamics
    from engine.experiments.dynamics.vocabulary import DynamicsSettings

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"Sentence {i} about the cat on the mat." for i in range(16)), encoding="utf-8")
    reads = {}
    for lens in (False, True):
        settings = DynamicsSettings(text_file=str(texts), max_length=32, eval_batch_size=8, logit_lens=lens,
                                    clusters=2)
        with two_gpus(monkeypatch) as mode:
            result(run_dynamics(place(tiny_model("llama", seed=3), SPLIT), tokenizer, settings))
        reads[lens] = mode.reads
    batches, rows, layers = 2, 16, 4
    assert reads[True] - reads[False] <= batches + 1 < rows * layers
