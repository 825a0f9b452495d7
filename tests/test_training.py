"""The one trainer: float32 masters for half weights, float16 loss scaling, the editable check,
out of memory in one line, seeded batches, and the stopwatch."""

from __future__ import annotations

import time

import pytest
import torch
from tiny_models import tiny_model

from engine.core.errors import UserError
from engine.models import oom
from engine.training.trainer import Stopwatch, Trainer, seeded_batches

CPU = torch.device("cpu")


def trainer(params, dtype, **options) -> Trainer:
    return Trainer(params, CPU, dtype, what="a test", advice="--nothing", **options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_weights_train_through_float32_masters(dtype):
    """AdamW steps the float32 master; the weight is the master rounded, and stays half."""
    model = tiny_model("llama").to(dtype)
    params = list(model.model.layers[1].parameters())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with trainer(params, dtype, lr=1e-2) as run:
        assert all(p.requires_grad for p in params)
        for _ in range(2):
            with run.forward():
                loss = model(input_ids=ids).logits.float().square().mean()
            run.step(loss)
        assert all(m.dtype == torch.float32 for m in run.master)
        assert all(torch.equal(p, m.to(dtype)) for p, m in zip(params, run.master, strict=True))
        assert any(not torch.equal(m.to(dtype), m) for m in run.master)  # updates finer than the half weights
    assert all(p.dtype == dtype and not p.requires_grad and p.grad is None for p in params)


def test_float32_weights_are_their_own_masters():
    weight = torch.nn.Parameter(torch.ones(3))
    with trainer([weight], torch.float32, lr=0.1) as run:
        run.step((weight * 2).sum())
        assert run.master == [weight] and not run.scaler.is_enabled()
    assert torch.all(weight < 1)


def test_float16_scales_the_loss_so_tiny_gradients_still_train():
    """A gradient of 1e-8 is 0 in float16 (its smallest is 6e-8); scaled by 2**12 it survives, and
    is unscaled in float32."""
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    with trainer([weight], torch.float16, lr=1e-2, weight_decay=0.0, init_scale=2.0**12) as run:
        assert run.scaler.is_enabled()
        run.step((weight.float() * 1e-8).sum())
    assert torch.all(weight < 1)


def test_offloaded_weights_are_refused_in_one_line(tmp_path):
    from test_dispatch import dispatched

    model = dispatched(tiny_model("llama"), offload=(3,), folder=tmp_path / "offload")
    with pytest.raises(UserError, match="^a test: its weights are offloaded .*--device-map") as info:
        trainer(list(model.model.layers[3].parameters()), torch.float32, lr=1e-2)
    assert "\n" not in str(info.value)


class OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory")


def test_out_of_memory_in_a_step_is_one_line_and_frees_memory(monkeypatch):
    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))
    weight = torch.nn.Parameter(torch.ones(3))
    with trainer([weight], torch.float32, lr=0.1) as run, pytest.raises(UserError) as info:
        run.step(OutOfMemoryInBackward.apply(weight).sum())
    assert str(info.value) == "out of memory in a test; try --nothing" and freed == [True]
    assert weight.grad is None


def test_seeded_batches_cycle_one_order_drawn_at_once():
    generator = torch.Generator().manual_seed(4)
    batches = seeded_batches(5, 2, generator)
    after = torch.rand(1, generator=generator)  # drawn after the order, before the first batch
    order = torch.randperm(5, generator=torch.Generator().manual_seed(4)).tolist()
    assert [next(batches) for _ in range(3)] == [order[0:2], order[2:4], [order[4], order[0]]]
    expected = torch.Generator().manual_seed(4)
    torch.randperm(5, generator=expected)
    assert torch.equal(after, torch.rand(1, generator=expected))


def test_stopwatch_times_the_cpu_between_start_and_stop():
    clock = Stopwatch(CPU)
    clock.start()
    time.sleep(0.02)
    assert 0.02 <= clock.stop() < 1.0
