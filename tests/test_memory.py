"""The memory plan against real tensors of tiny models, the fit checks, and out-of-memory errors."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from tiny_models import out_of_memory_in_training, tiny_model

from engine.core.errors import UserError
from engine.evaluation.perplexity import Evaluator, token_nll
from engine.models import memory, oom
from engine.models.anatomy import LayerStack
from engine.models.memory import MemoryPlan, ModelShape, Training, check_fits, fits_beside, plan_memory
from engine.models.placement import Hardware
from engine.training.trainer import Trainer

TEXTS = ["The dog sat on the mat.", "A cat looked at the dog for a while.", "Seven.", "x" * 300,
         "Number seven sat for a while, then it left."]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "opt", "phi3"])
def test_weights_estimate_is_the_parameter_bytes(family):
    model = tiny_model(family)
    shape = ModelShape.from_config(model.config)
    for dtype in (torch.float32, torch.bfloat16):
        held = sum(p.numel() * p.element_size() for p in model.to(dtype).parameters())
        plan = plan_memory(shape, str(dtype).removeprefix("torch."), "cpu", [10], 1)
        assert plan.weights == held
    assert shape.n_layers == 4 and shape.hidden == 32 and shape.vocab == 260


@pytest.mark.parametrize(("dtype", "batch_size", "max_length"), [("float32", 2, 64), ("float16", 3, 300)])
def test_prefix_cache_estimate_is_the_cache_built(tokenizer, dtype, batch_size, max_length):
    model = tiny_model("llama").to(getattr(torch, dtype))
    evaluator = Evaluator(model, tokenizer, TEXTS, batch_size, max_length)
    evaluator.build_cache()
    assert evaluator._layer_inputs is not None  # build_cache filled it
    built = sum(t.numel() * t.element_size() for batch in evaluator._layer_inputs for t in batch)
    lengths = memory.text_lengths(tokenizer, TEXTS, max_length)
    plan = plan_memory(ModelShape.from_config(model.config), dtype, "cpu", lengths, batch_size)
    assert plan.prefix_cache == built
    assert plan_memory(ModelShape.from_config(model.config), dtype, "cpu", lengths, batch_size,
                       prefix_cache=False).prefix_cache == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_state_is_what_the_trainer_holds(dtype):
    model = tiny_model("llama").to(dtype)
    params = [model.model.layers[1].mlp.down_proj.weight, model.model.layers[1].self_attn.q_proj.weight]
    with Trainer(params, torch.device("cpu"), dtype, lr=1e-3, what="a test", advice="nothing") as trainer:
        with trainer.forward():
            loss = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().square().mean()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.scaler.scale(loss).backward()
        grads = sum(p.grad.numel() * p.grad.element_size() for p in params)  # the step moves them to the master
        trainer.step(model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().square().mean())
        held = grads + sum(
            t.numel() * t.element_size()
            for m in trainer.master for t in [m.grad, *trainer.optimizer.state[m].values()]
            if t is not None and t.dim()
        )
    if dtype != torch.float32:  # the model's half gradients (moved to the master at the step) and the master
        held += sum(m.numel() * m.element_size() for m in trainer.master)
    else:  # float32: the master is the parameter itself, its gradient is counted once
        held -= grads
    count = sum(p.numel() for p in params)
    assert memory.training_state_bytes(count, str(dtype).removeprefix("torch.")) == held


def plan_of(**parts) -> MemoryPlan:
    sizes = dict(weights=0, prefix_cache=0, activations=0, logits=0, training=0) | parts
    return MemoryPlan("cuda:0", "float16", **sizes)


def test_check_fits_names_the_part_and_the_flag():
    check_fits(plan_of(weights=800), 1000)
    with pytest.raises(UserError) as weights:
        check_fits(plan_of(weights=3_000_000_000, logits=10), 2_000_000_000, "ablation")
    message = str(weights.value)
    assert "\n" not in message and message.startswith("ablation needs about 3.00 GB on cuda:0")
    assert "--dtype" in message
    with pytest.raises(UserError, match="--eval-batch-size"):
        check_fits(plan_of(weights=100, prefix_cache=900), 1000)
    with pytest.raises(UserError, match="--batch-size"):
        check_fits(plan_of(weights=100, training=900), 1000)


def test_plan_line_and_a_real_plan_grows_with_the_batch(tokenizer):
    shape = ModelShape.from_config(tiny_model("llama").config)
    small = plan_memory(shape, "float16", "cuda:0", [50] * 48, 1)
    big = plan_memory(shape, "float16", "cuda:0", [50] * 48, 48, training=Training(1000, 4, 128, 4))
    assert big.activations > small.activations and big.logits > small.logits
    assert small.prefix_cache == big.prefix_cache and big.training > small.training == 0
    line = big.line()
    assert line.startswith("memory plan on cuda:0 (float16): weights") and "training" in line
    assert "\n" not in line and big.to_dict()["total"] == big.total


def test_a_job_fits_beside_the_console_model_or_after_it_is_released():
    job = plan_of(weights=4_000)
    assert fits_beside(job, loaded_bytes=4_000, free_bytes=10_000) == "beside"
    assert fits_beside(job, loaded_bytes=4_000, free_bytes=2_000) == "release"
    assert fits_beside(job, loaded_bytes=1_000, free_bytes=2_000) == "never"


def fake_nvml(monkeypatch, free_by_uuid: dict[str, int] | None):
    """A pynvml module in sys.modules: GPUs by UUID with their free bytes, or (None) no NVML library."""
    import types

    class NVMLError(Exception):
        pass

    calls = []
    known = free_by_uuid if free_by_uuid is not None else {}  # None: init raises before any look-up

    def init():
        if free_by_uuid is None:
            raise NVMLError("NVML Shared Library Not Found")
        calls.append("init")

    def handle_by_uuid(uuid):
        if uuid not in known:
            raise NVMLError("Not Found")
        return uuid

    module = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(free=known[handle], total=16_000))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return calls


def test_free_memory_asks_the_driver_on_a_gpu(monkeypatch):
    asked = []

    def fake_info(index):
        asked.append(index)
        return 5_000, 16_000

    monkeypatch.setattr(torch.cuda, "mem_get_info", fake_info)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert memory.free_memory("cuda:1") == 5_000 and asked == [1]
    fake_nvml(monkeypatch, None)  # installed, but no driver library
    assert memory.free_memory("cuda:0") == 5_000 and asked == [1, 0]
    assert memory.free_memory("cpu") > 0


def test_free_memory_reads_nvml_by_uuid_and_makes_no_cuda_context(monkeypatch):
    """NVML lists GPUs in PCI order, CUDA (CUDA_VISIBLE_DEVICES=1,0, or FASTEST_FIRST) in another:
    CUDA index 0 is found by its UUID, never by NVML's index 0; mem_get_info, which makes a CUDA
    context on the GPU it asks about, is not called."""
    import types

    uuids = {0: "5f1e-b", 1: "07aa-a"}  # CUDA 0 is the second GPU on the PCI bus
    calls = fake_nvml(monkeypatch, {"GPU-07aa-a": 1_000, "GPU-5f1e-b": 9_000})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid=uuids[index]))

    def no_context(index):
        raise AssertionError("mem_get_info makes a CUDA context")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_context)
    assert memory.free_memory("cuda:0") == 9_000 and memory.free_memory("cuda:1") == 1_000
    assert calls == ["init", "shutdown"] * 2
    uuids[1] = "MIG-slice"  # a GPU NVML does not list under that UUID: the driver's figure after all
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (3_000, 16_000))
    assert memory.free_memory("cuda:1") == 3_000


def test_chunked_softmax_equals_unchunked():
    torch.manual_seed(0)
    logits = torch.randn(3, 11, 500, dtype=torch.bfloat16)
    ids = torch.randint(0, 500, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    whole = token_nll(logits, ids, mask, chunk=10_000)
    reference = (torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none") * mask[:, 1:]).sum(1)
    torch.testing.assert_close(whole, reference)
    for chunk in (1, 7, 30):
        torch.testing.assert_close(token_nll(logits, ids, mask, chunk=chunk), whole)
    assert memory.softmax_chunk_tokens(128_256) == 130  # 64 MB of float32 logits


def raising(error: Exception):
    def forward(*args, **kwargs):
        raise error

    return forward


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("CUDA error: out of memory")])
def test_out_of_memory_in_a_layer_is_one_line(tiny_llama, monkeypatch, error):
    model, tokenizer = tiny_llama
    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))
    evaluator = Evaluator(model, tokenizer, TEXTS, 2, 64)
    monkeypatch.setattr(model.model.layers[2], "forward", raising(error))
    with pytest.raises(UserError) as caught:
        evaluator.perplexity()
    message = str(caught.value)
    assert message.startswith("out of memory in perplexity evaluation") and "--eval-batch-size" in message
    assert "\n" not in message and freed == [True]
    with pytest.raises(UserError, match="building the prefix cache"):
        evaluator.build_cache()


def test_other_runtime_errors_pass_through(tiny_llama, monkeypatch):
    model, tokenizer = tiny_llama
    evaluator = Evaluator(model, tokenizer, TEXTS, 2, 64)
    monkeypatch.setattr(model.model.layers[2], "forward", raising(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        evaluator.perplexity()


def test_out_of_memory_in_recovery_training_names_it_and_restores(tiny_llama, tmp_path, monkeypatch):
    from engine.experiments.recovery.run import run_recovery
    from engine.experiments.recovery.vocabulary import RecoverySettings

    model, tokenizer = tiny_llama
    before = copy.deepcopy(model.state_dict())
    train, evaluation = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text("The cat sat on the mat and looked at the dog.\n" * 40, encoding="utf-8")
    evaluation.write_text("\n".join(TEXTS), encoding="utf-8")
    settings = RecoverySettings(layers=(1,), steps=2, batch_size=2, block_size=16, train_blocks=4,
                                train_file=str(train), eval_file=str(evaluation))
    out_of_memory_in_training(monkeypatch, model.model.layers[3])
    with pytest.raises(UserError, match=r"^out of memory in recovery training of layer 1; try .*--batch-size"):
        list(run_recovery(model, tokenizer, settings))
    monkeypatch.undo()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_plan_run_reads_the_model_folder_and_the_settings_before_any_load(tmp_path):
    from tiny_models import save_tiny

    from engine.experiments.recovery.vocabulary import RecoverySettings
    from engine.models.loading import load_model

    folder = save_tiny(tmp_path / "tiny")
    evaluation = tmp_path / "eval.txt"
    evaluation.write_text("\n".join(TEXTS), encoding="utf-8")
    settings = RecoverySettings(eval_file=str(evaluation), eval_batch_size=2, max_length=64, batch_size=3,
                                block_size=16)
    plan = memory.plan_run(str(folder), settings, device="cpu", dtype="bfloat16")
    loaded = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert plan.weights == sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    evaluator = Evaluator(loaded.model, loaded.tokenizer, TEXTS, 2, 64)
    evaluator.build_cache()
    assert evaluator._layer_inputs is not None  # build_cache filled it
    assert plan.prefix_cache == sum(t.numel() * t.element_size() for b in evaluator._layer_inputs for t in b)
    layer = sum(p.numel() for p in LayerStack(loaded.model).matrices(0).values())
    assert plan.training > memory.training_state_bytes(layer, "bfloat16") > 0
    assert plan.device == "cpu" and plan.dtype == "bfloat16"


SMOLLM = ModelShape(params=134_515_008, n_layers=30, hidden=576, intermediate=1536, heads=9, vocab=49_152)


def fits(batch: int, lengths, free: int) -> bool:
    return plan_memory(SMOLLM, "float16", "cuda:0", lengths, batch).total <= memory.MARGIN * free


def test_auto_eval_batch_is_the_largest_that_fits_on_a_gpu_and_8_on_the_cpu():
    lengths = [20 + 3 * i for i in range(48)]
    auto = memory.auto_eval_batch
    assert auto("cuda:0", SMOLLM, "float16", lengths, 10**12) == 48  # one batch of every text
    weights = SMOLLM.params * 2
    assert auto("cuda:0", SMOLLM, "float16", lengths, weights) == 1  # nothing fits: 1, check_fits says so
    small = int(plan_memory(SMOLLM, "float16", "cuda:0", lengths, 12).total / memory.MARGIN) + 1
    chosen = auto("cuda", SMOLLM, "float16", lengths, small)
    assert 12 <= chosen < 48 and fits(chosen, lengths, small)
    assert not any(fits(b, lengths, small) for b in range(chosen + 1, 49))
    assert auto("cpu", SMOLLM, "float16", lengths, 10**12) == auto("cpu", SMOLLM, "float16", lengths, 1) == 8


def test_plan_and_evaluator_choose_the_same_auto_batch_and_the_same_perplexity(tmp_path, monkeypatch):
    """On a (pretended) GPU plan_run, before the load, and the evaluator, after it, size the batch
    from the same memory; an explicit --eval-batch-size wins; the batch never changes the result."""
    from tiny_models import save_tiny

    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.loading import load_model

    folder = save_tiny(tmp_path / "tiny")
    evaluation = tmp_path / "eval.txt"
    evaluation.write_text("\n".join(TEXTS), encoding="utf-8")
    settings = AblationSettings(eval_file=str(evaluation), max_length=64)
    assert settings.eval_batch_size is None  # auto by default
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    assert Evaluator.for_settings(loaded.model, loaded.tokenizer, settings).batch_size == memory.FIXED_EVAL_BATCH
    shape = ModelShape.from_config(loaded.model.config)
    lengths = memory.text_lengths(loaded.tokenizer, TEXTS, 64)
    free = int(plan_memory(shape, "float32", "cuda:0", lengths, 2).total / memory.MARGIN) + 1
    monkeypatch.setattr(Hardware, "read", classmethod(lambda cls: Hardware(cuda=True, gpus=1, capabilities=((8, 0),))))
    monkeypatch.setattr(memory, "cuda_devices", lambda model: ["cuda:0"])
    before_load, after_load = free, free - memory.model_bytes(loaded.model)
    monkeypatch.setattr(memory, "free_memory", lambda device: before_load)
    plan = memory.plan_run(str(folder), settings, device="cuda", dtype="float32")
    assert 2 <= plan.eval_batch_size < len(TEXTS) and f"evaluation batches of {plan.eval_batch_size}" in plan.line()
    monkeypatch.setattr(memory, "free_memory", lambda device: after_load)
    evaluator = Evaluator.for_settings(loaded.model, loaded.tokenizer, settings)
    assert evaluator.batch_size == plan.eval_batch_size
    assert len(evaluator.batches[0].text_index) == evaluator.batch_size
    monkeypatch.setattr(memory, "free_memory", lambda device: 10**12)
    everything = Evaluator.for_settings(loaded.model, loaded.tokenizer, settings)
    assert len(everything.batches) == 1 and everything.batch_size == len(TEXTS)
    three = settings.override({"eval_batch_size": 3})
    explicit = Evaluator.for_settings(loaded.model, loaded.tokenizer, three)
    assert explicit.batch_size == memory.plan_run(str(folder), three, "cuda", "float32").eval_batch_size == 3
    spread_plan = memory.plan_run(str(folder), settings, "cuda", "float32", device_map="auto")
    loaded.model.hf_device_map = {"model.embed_tokens": 0, "model.layers.1": 1}  # as accelerate marks it
    spread = Evaluator.for_settings(loaded.model, loaded.tokenizer, settings)
    assert spread.batch_size == spread_plan.eval_batch_size == memory.FIXED_EVAL_BATCH  # not the sum of GPUs
    del loaded.model.hf_device_map
    one = Evaluator(loaded.model, loaded.tokenizer, TEXTS, 1, 64).perplexity()
    for each in (evaluator, everything, explicit):
        assert each.perplexity() == pytest.approx(one, rel=1e-6)


def fake_gpu_run(monkeypatch, capability: tuple[int, int], free: int) -> list[bool]:
    """One GPU of this compute capability with `free` bytes; the calls that set up torch for a run
    are recorded, not made (returned: use_deterministic_algorithms' arguments), and the TF32 flags
    and the environment are restored afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (free, 16 * 2**30))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic: list[bool] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **kwargs: deterministic.append(on))
    return deterministic


def loaded_on_the_cpu(monkeypatch) -> dict:
    """from_pretrained asked for a GPU loads on the CPU instead; returns what it was asked."""
    from transformers import AutoModelForCausalLM

    real, seen = AutoModelForCausalLM.from_pretrained, {}

    def on_cpu(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **{**kwargs, "device_map": "cpu"})

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", on_cpu)
    return seen


def test_the_plan_and_the_load_pick_one_auto_dtype(tmp_path, monkeypatch):
    """Auto dtype on a P100 hangs on the parameter count (float16 when float32 would not fit): a free
    memory between the exact count's need and a rough formula's (12 L h^2 + 2 h V, 22 % more on this
    model) must give the plan and the load the same dtype."""
    from tiny_models import save_tiny
    from transformers import AutoConfig

    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.models.loading import load_model

    folder = save_tiny(tmp_path / "tiny")
    config = AutoConfig.from_pretrained(folder)
    exact = ModelShape.from_config(config).params
    rough = 12 * config.num_hidden_layers * config.hidden_size**2 + 2 * config.hidden_size * config.vocab_size
    free = int((exact + rough) / 2 * 4 * 1.3)  # float32 fits by the exact count, not by the rough one
    assert exact * 4 * 1.3 < free < rough * 4 * 1.3
    fake_gpu_run(monkeypatch, (6, 0), free)  # a P100: neither bfloat16 nor float16 tensor cores
    loaded_on_the_cpu(monkeypatch)
    plan = memory.plan_run(str(folder), AblationSettings(eval_set="paper", eval_batch_size=2), "cuda:0", "auto")
    loaded = load_model(str(folder), device="cuda:0", dtype="auto")
    assert plan.dtype == loaded.dtype_name == "float32"


def test_run_loads_the_dtype_its_plan_names(tmp_path, monkeypatch, capsys):
    """Whatever the plan decided is what loads and is recorded (the job file keeps the asked `auto`)."""
    import dataclasses

    from tiny_models import save_tiny

    from cli.main import main
    from sessions.store import SessionStore

    folder = save_tiny(tmp_path / "tiny")
    real_plan = memory.plan_run

    def bfloat16_plan(*args, **kwargs):  # the plan's placement is what the load takes (cli/runner.py)
        plan = real_plan(*args, **kwargs)
        assert plan.placement is not None
        placement = dataclasses.replace(plan.placement, dtype="bfloat16")
        return dataclasses.replace(plan, dtype="bfloat16", placement=placement)

    monkeypatch.setattr(memory, "plan_run", bfloat16_plan)
    assert main(["run", "ablation", "--model", str(folder), "--eval-set", "paper", "--session", "d"]) == 0
    assert "on cpu in bfloat16" in capsys.readouterr().err
    (job,) = SessionStore().open("d").jobs().values()
    assert job["spec"]["model"]["dtype"] == job["spec"]["memory_plan"]["dtype"] == "bfloat16"
    assert job["model"]["dtype"] == "auto"


def every_cut(n_layers: int, count: int):
    import itertools

    return itertools.combinations(range(n_layers), count)


@pytest.mark.parametrize("remove", [(1,), (2,), (1, 2, 4), (5,)])
def test_prune_healing_is_planned_for_every_layer_it_trains(remove):
    """Adjacent healing trains every kept layer next to a cut: up to two per removed layer when the
    cuts are scattered. The plan holds the most any cut of these counts trains, no more."""
    from engine.experiments.prune.healing import neighbours_of_cuts
    from engine.experiments.prune.vocabulary import PruneSettings

    model = tiny_model("llama")
    shape = ModelShape.from_config(model.config)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.layer_params == layer > shape.layer_matrices
    twelve = ModelShape(**{**shape.__dict__, "n_layers": 12})
    settings = PruneSettings(remove=remove, heal_steps=5)
    training = settings.training_needs(twelve)
    assert training is not None  # it heals
    most = max(len(neighbours_of_cuts(12, cut)) for count in remove for cut in every_cut(12, count))
    assert training.params == most * layer
    assert training.layers_with_graph == 12 - min(remove)  # the graph spans the cut model's layers
    assert (training.batch_size, training.block_size) == (settings.batch_size, settings.block_size)


def test_prune_without_healing_plans_no_training_and_lora_its_adapters(tokenizer):
    from peft import LoraConfig, get_peft_model

    from engine.experiments.prune.vocabulary import PruneSettings

    model = tiny_model("llama")
    shape = ModelShape.from_config(model.config)
    assert PruneSettings(heal_steps=0, remove=(1,)).training_needs(shape) is None
    assert plan_memory(shape, "float32", "cpu", [10], 1,
                       training=PruneSettings(remove=(1,)).training_needs(shape)).training == 0
    lora = PruneSettings(heal="lora", lora_rank=4, heal_steps=5, remove=(1,))
    targets = sorted({path.rsplit(".", 1)[-1] for _, path in LayerStack(model).spec.matrices})
    adapted = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
    adapters = sum(p.numel() for name, p in adapted.named_parameters() if "lora_" in name)
    needs = lora.training_needs(shape)
    assert needs is not None and needs.params == adapters * (shape.n_layers - 1) // shape.n_layers
    from engine.experiments.recovery.vocabulary import RecoverySettings

    recovery = RecoverySettings().training_needs(shape)
    assert (recovery.params, recovery.layers_with_graph) == (shape.layer_matrices, shape.n_layers)


def test_a_7b_config_on_a_t4_is_planned_in_float16_and_refused_where_it_cannot_fit(tmp_path, monkeypatch, tokenizer):
    """Llama-2-7B's config (no weights: the plan reads the config and the tokenizer only): 6.74 B
    parameters counted exactly, float16 on a T4, and one line naming --dtype/--device on a smaller card."""
    from transformers import LlamaConfig

    from engine.experiments.ablation.vocabulary import AblationSettings

    folder = tmp_path / "llama-7b"
    LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    fake_gpu_run(monkeypatch, (7, 5), 15 * 2**30)
    plan = memory.plan_run(str(folder), AblationSettings(eval_set="paper", eval_batch_size=8), "cuda:0", "auto")
    assert plan.dtype == "float16" and plan.weights == 6_738_415_616 * 2
    assert plan.prefix_cache > 0 and plan.logits > 0 and "no native bfloat16" in plan.dtype_reason
    check_fits(plan, 15 * 2**30, "ablation")
    with pytest.raises(UserError, match=r"^ablation needs about .* GB on cuda:0.*--dtype") as small:
        check_fits(plan, 8 * 2**30, "ablation")
    assert "\n" not in str(small.value)
