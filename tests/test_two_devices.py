"""Every experiment on a model split over two GPUs, simulated on the CPU (tests/virtual_devices.py).

Each run happens twice: on the plain model, and with the model's layers spread over a virtual
cuda:0 and cuda:1 by accelerate's hooks, where an operation that mixes the two devices raises as
it would on CUDA. The numbers must be the plain run's."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model
from virtual_devices import DeviceMismatch, VirtualDevices, device_of, place, two_gpus

from engine.core.events import Result
from engine.models.anatomy import LayerStack

pytestmark = pytest.mark.usefixtures("one_thread")

SPLIT = ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]


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


def on_both(monkeypatch, run, seed: int = 3, family: str = "llama", dtype=torch.float32, **placement):
    """run(model) on the plain model and on the same model (in `dtype`) split over two virtual GPUs."""
    expected = run(tiny_model(family, seed=seed).to(dtype))
    with two_gpus(monkeypatch) as mode:
        got = run(place(tiny_model(family, seed=seed).to(dtype), SPLIT, **placement))
    assert mode.crossings > 0  # activations really went from one GPU to the other
    return expected, got


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
    expected, got = on_both(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)), dtype=dtype)
    assert without_times(got) == without_times(expected)


@pytest.mark.parametrize(("part", "method", "dtype"), [("both", "skip", torch.float32), ("both", "mean", torch.float32),
                                                       ("mlp", "zero", torch.float16)])
def test_ablation_below_the_layer(monkeypatch, tokenizer, part, method, dtype):
    """Each layer's attention and MLP removed alone, the blocks split over two GPUs and in half precision."""
    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings

    settings = AblationSettings(method=method, part=part, eval_set="paper", eval_batch_size=4)
    expected, got = on_both(monkeypatch, lambda model: result(run_ablation(model, tokenizer, settings)), dtype=dtype)
    assert got["parts"] and without_times(got) == without_times(expected)


@pytest.mark.parametrize("lens", ["plain", "last-block"])
def test_dynamics_angles_trajectories_and_lens(monkeypatch, tokenizer, files, lens):
    from engine.experiments.dynamics.run import run_dynamics
    from engine.experiments.dynamics.vocabulary import DynamicsSettings

    settings = DynamicsSettings(text_file=files[0], max_tokens=200, max_length=64, logit_lens=True, lens=lens,
                                clusters=2)
    expected, got = on_both(monkeypatch, lambda model: result(run_dynamics(model, tokenizer, settings)))
    assert without_times(got) == without_times(expected)


def test_weights_with_the_paradox(monkeypatch, tokenizer, files):
    from engine.experiments.weights.run import run_weights
    from engine.experiments.weights.vocabulary import WeightsSettings

    settings = WeightsSettings(first_layer=0, eval_file=files[0], null_draws=2, paradox_counts=(1, 0),
                               components=("q", "gate"))
    expected, got = on_both(monkeypatch, lambda model: result(run_weights(model, tokenizer, settings)))
    assert without_times(got) == without_times(expected)


def test_manipulate(monkeypatch, tokenizer, files):
    from engine.experiments.manipulate.run import run_manipulation
    from engine.experiments.manipulate.vocabulary import ManipulationSettings

    settings = ManipulationSettings(layers=(1, 2), eval_file=files[0], alphas=(0.5,), rank=2, together=True,
                                    sample_tokens=4)
    expected, got = on_both(monkeypatch, lambda model: result(run_manipulation(model, tokenizer, settings)))
    assert without_times(got) == without_times(expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_recovery(monkeypatch, tokenizer, files, dtype):
    """float16 on the GPUs: float32 masters, autocast and a loss scaler on each layer's own device."""
    from engine.experiments.recovery.run import run_recovery
    from engine.experiments.recovery.vocabulary import RecoverySettings

    settings = RecoverySettings(layers=(1, 2), sigma=3.0, steps=3, lr=1e-2, batch_size=2, block_size=16,
                                train_blocks=4, train_file=files[1], eval_file=files[0])
    expected, got = on_both(monkeypatch, lambda model: result(run_recovery(model, tokenizer, settings)),
                            dtype=dtype)
    assert without_times(got) == without_times(expected)


@pytest.mark.parametrize("heal", ["adjacent", "lora"])
@pytest.mark.parametrize("embedding", [None, "disk"], ids=["embedding-on-gpu", "embedding-offloaded"])
def test_prune_with_healing_and_export(monkeypatch, tokenizer, files, tmp_path, heal, embedding):
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.models.loading import LoadedModel
    from engine.registry import RunContext, experiment

    def run(model, folder):
        settings = PruneSettings(eval_file=files[0], train_file=files[1], remove=(1, 2), heal_steps=2, heal=heal,
                                 export=str(folder), export_count=1)
        loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
        doc = result(experiment("prune").run(settings, RunContext(model=loaded)))
        exported = tiny_model("llama").from_pretrained(folder)
        return doc, {k: v.clone() for k, v in exported.state_dict().items()}

    folders = iter((tmp_path / "plain", tmp_path / "split"))
    (plain, plain_weights), (split, split_weights) = on_both(
        monkeypatch, lambda model: run(model, next(folders)), embedding=embedding, offload_dir=tmp_path / "offload")
    for doc in (plain, split):
        doc["exported"] = doc["settings"]["export"] = None
    assert without_times(split) == without_times(plain)
    assert split_weights.keys() == plain_weights.keys()
    assert all(torch.equal(split_weights[k], plain_weights[k]) for k in plain_weights)


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
    (plain, plain_weights), (split, split_weights) = on_both(monkeypatch, lambda model: run(model, next(folders)))
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
    (plain, plain_weights, plain_logits), (split, split_weights, split_logits) = on_both(
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
                Variant("pruned", layers=(1, 2))]

    def answers(model):
        before = {k: v.clone() for k, v in model.state_dict().items() if v.device.type != "meta"}
        texts = []
        for variant in variants:
            with applied(model, variant):
                texts.append(generate_text(model, tokenizer, "The cat", 6))
        after = model.state_dict()
        assert all(torch.equal(after[k], before[k]) for k in before)
        return texts

    expected, got = on_both(monkeypatch, answers, embedding=embedding, offload_dir=tmp_path / "offload")
    assert got == expected


# --- out of memory anywhere in an experiment ------------------------------------------------------


@pytest.mark.parametrize(("name", "target", "flag"), [
    ("dynamics", "engine.experiments.dynamics.run.trajectory", "--max-tokens"),
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
    from engine.experiments.recovery.run import add_noise, noise_seed
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
