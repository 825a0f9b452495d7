"""The memory plan against real tensors of tiny models, the fit checks, and out-of-memory errors."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import tiny_model

from engine import memory, oom
from engine.anatomy import LayerStack
from engine.errors import UserError
from engine.experiments.recovery import MasterTrainer
from engine.memory import MemoryPlan, ModelShape, Training, check_fits, fits_beside, plan_memory
from engine.perplexity import Evaluator, token_nll

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
    for param in params:
        param.requires_grad_(True)
    trainer = MasterTrainer(params, 1e-3)
    with trainer.autocast():
        loss = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().square().mean()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.scaler.scale(loss).backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)  # the step moves them to the master
    trainer.step(model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().square().mean())
    held = grads + sum(
        t.numel() * t.element_size()
        for m in trainer.master for t in [m.grad, *trainer.optimizer.state[m].values()] if t is not None and t.dim()
    )
    if trainer.half:  # the model's half gradients (moved to the master at the step) and the master
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


def test_free_memory_asks_the_driver_on_a_gpu(monkeypatch):
    asked = []

    def fake_info(index):
        asked.append(index)
        return 5_000, 16_000

    monkeypatch.setattr(torch.cuda, "mem_get_info", fake_info)
    assert memory.free_memory("cuda:1") == 5_000 and asked == [1]
    assert memory.free_memory("cpu") > 0


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
    from engine.experiments.recovery import RecoverySettings, run_recovery

    model, tokenizer = tiny_llama
    before = copy.deepcopy(model.state_dict())
    train, evaluation = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text("The cat sat on the mat and looked at the dog.\n" * 40, encoding="utf-8")
    evaluation.write_text("\n".join(TEXTS), encoding="utf-8")
    settings = RecoverySettings(layers=(1,), steps=2, batch_size=2, block_size=16, train_blocks=4,
                                train_file=str(train), eval_file=str(evaluation))
    layer = model.model.layers[3]
    original = layer.forward

    def forward(*args, **kwargs):
        if torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", forward)
    with pytest.raises(UserError, match=r"^out of memory in recovery training of layer 1; try .*--batch-size"):
        list(run_recovery(model, tokenizer, settings))
    monkeypatch.undo()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_plan_run_reads_the_model_folder_and_the_settings_before_any_load(tmp_path):
    from tiny_models import save_tiny

    from engine.experiments.recovery import RecoverySettings
    from engine.models import load_model

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

    import engine.models
    from engine.experiments.ablation import AblationSettings
    from engine.models import load_model

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
    monkeypatch.setattr(engine.models, "choose_device", lambda requested: "cuda:0")
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
