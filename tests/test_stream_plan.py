"""The streamed map planned and budgeted (engine/models/memory.py StreamPlan, plan_run): the plan
chooses streaming when the whole model does not fit its budget, refuses a budget below its minimum
in one line before any weight is read, and a streamed run holds no more than it planned (the
source's own counters); its progress says `layer j of L` with the bytes read and the rate."""

from __future__ import annotations

import re
import time

import pytest
from tiny_models import save_tiny

from engine.core.errors import UserError
from engine.core.events import Message, Progress, Result
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.models.loading import load_model
from engine.models.memory import MemoryPlan, StreamPlan, batch_widths, plan_run, text_lengths
from engine.models.placement import CPU_ONLY
from engine.models.streaming import LayerSource, open_streamed

pytestmark = pytest.mark.usefixtures("one_thread")

HIDDEN = 32  # tests/tiny_models.py's width


@pytest.fixture
def folder(tmp_path):
    return save_tiny(tmp_path / "llama", "llama")


def plan(folder, max_memory: str | None = None, **settings) -> MemoryPlan:
    return plan_run(str(folder), AblationSettings(eval_set="paper", **settings), "cpu", "float32",
                    max_memory=max_memory, hardware=CPU_ONLY)


def stream_plan(folder, max_memory: str, **settings) -> StreamPlan:
    """The streamed part of a plan that streams (`stream=True` or a budget below the whole model)."""
    chosen = plan(folder, max_memory, **settings).stream
    assert chosen is not None
    return chosen


def streamed_run(folder, max_memory: str, **settings) -> tuple[list, LayerSource]:
    chosen = AblationSettings(eval_set="paper", **settings)
    loaded = open_streamed(str(folder), device="cpu", dtype="float32", max_memory=max_memory)
    stream = loaded.stream
    assert stream is not None  # open_streamed always gives its source
    try:
        return list(run_ablation(loaded.model, loaded.tokenizer, chosen, stream=stream)), stream
    finally:
        stream.close()


def kib(size: int) -> str:
    return f"cpu={size // 1024}KiB"


def test_the_plan_streams_only_a_model_over_its_budget(folder):
    """skip of one layer: two layers held and two branches, well below the whole model and its
    prefix cache; a budget between the two streams, a large one loads the model."""
    whole = plan(folder, method="skip", layers=(0,))
    assert whole.stream is None  # the free memory holds it
    streamed = plan(folder, "cpu=1GiB", method="skip", layers=(0,), stream=True).stream
    assert streamed is not None and streamed.device_peak < whole.total
    chosen = plan(folder, kib((streamed.device_peak + whole.total) // 2), method="skip", layers=(0,))
    assert chosen.stream is not None and chosen.total == chosen.stream.device_peak
    assert chosen.line().startswith("streamed plan on cpu: 4 layers read once")
    assert (chosen.stream.held, chosen.stream.branches, chosen.stream.texts) == (2, 2, 10)
    assert plan(folder, "cpu=1GiB", method="skip", layers=(0,)).stream is None
    assert chosen.to_dict()["stream"]["branches"] == 2


def test_a_budget_below_the_minimum_is_one_line_before_any_read(folder):
    with pytest.raises(UserError) as refused:
        plan(folder, "cpu=64KiB", stream=True)
    line = str(refused.value)
    assert "\n" not in line and re.fullmatch(
        r"the streamed map needs at least [\d.]+ MiB on cpu for 4 layers and the branch states of 8 texts; "
        r"--max-memory allows 0\.1 MiB: raise it or map fewer texts", line), line
    loaded = open_streamed(str(folder), device="cpu", dtype="float32", max_memory="cpu=64KiB")
    assert loaded.stream is not None  # open_streamed always gives its source
    with pytest.raises(UserError, match="needs at least"):  # the run itself, before it reads a tensor
        list(run_ablation(loaded.model, loaded.tokenizer, AblationSettings(eval_set="paper"), stream=loaded.stream))
    assert loaded.stream.bytes_read == 0 and not loaded.stream.reads
    loaded.stream.close()


def test_a_budget_for_a_few_texts_says_how_many_fit(folder):
    streamed = stream_plan(folder, "cpu=1GiB", stream=True)
    between = kib((streamed.minimum + streamed.device_peak) // 2)
    with pytest.raises(UserError) as refused:
        plan(folder, between, stream=True)
    found = re.search(r"branch states of 10 texts \(5 branches\); --max-memory allows [\d.]+ MiB: raise it, map "
                      r"fewer texts \(about (\d+) fit\) or ablate fewer --layers", str(refused.value))
    assert found and 0 < int(found[1]) < 10, str(refused.value)


def test_a_streamed_run_holds_no_more_than_its_plan(folder):
    """The neighbour mean under a budget: the source's counters of layers and bytes held, and of
    the branch states, against the plan and against sizes counted here from the model itself."""
    planned = stream_plan(folder, "cpu=64MiB", stream=True)
    events, source = streamed_run(folder, "cpu=64MiB")
    assert [e for e in events if isinstance(e, Result)]
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    whole, tokenizer = loaded.model, loaded.tokenizer
    layer = sum(p.numel() for p in whole.model.layers[0].parameters()) * 4
    outer = sum(p.numel() for p in whole.parameters()) * 4 - 4 * layer
    assert (planned.layer_bytes, planned.outer_bytes) == (layer, outer)
    assert source.peak_layers <= planned.window == 3
    assert source.peak_bytes <= planned.held * layer + outer
    texts = AblationSettings(eval_set="paper").eval_source(tokenizer)
    padded = sum(rows * width for rows, width in batch_widths(text_lengths(tokenizer, texts, 256), 8))
    assert source.peak_states == 5 * padded * HIDDEN * 4 == planned.states  # clean + 4 layers' branches, float32
    assert source.peak_bytes + source.peak_states <= planned.device_peak <= 64 * 2**20


def test_progress_says_the_layer_the_bytes_and_the_rate_while_a_read_is_slow(folder, monkeypatch):
    read = LayerSource._read

    def slow(self, group):
        if group == 2:
            time.sleep(1.3)
        return read(self, group)

    monkeypatch.setattr(LayerSource, "_read", slow)
    events, source = streamed_run(folder, "cpu=64MiB", method="skip")
    shown = [e for e in events if isinstance(e, Progress) and e.phase == "streaming"]
    pattern = re.compile(r"streaming layer (\d) of 4 \(([\d.]+) (MB|GB) read, ([\d.e-]+) GB/s\)")
    found = [pattern.fullmatch(e.label) for e in shown]
    assert all(found), [e.label for e in shown]
    matches = [m for m in found if m is not None]  # all of them
    assert shown[0].done == 0 and matches[0][1] == "1"
    waiting = [m for e, m in zip(shown, matches, strict=True) if e.done == 2 and m[1] == "3"]
    assert waiting  # said during the slow read of layer 2 (the third), before it has run
    assert float(waiting[0][2]) > 0 and float(waiting[0][4]) > 0  # bytes and rate before layer 2 is in
    assert [e.unit for e in shown] == ["layers"] * len(shown)
    assert any(isinstance(e, Message) and e.text.startswith("streamed plan on cpu") for e in events)


def test_the_command_line_streams_what_its_plan_chose_under_max_memory(folder, capsys):
    """`run ablation --max-memory` below the whole model's plan but above the streamed one streams
    (the run's own plan line comes from the wavefront); a budget below the minimum is one line."""
    from cli.main import main

    whole = plan(folder, method="skip", layers=(0,)).total
    streamed = stream_plan(folder, "cpu=1GiB", method="skip", layers=(0,), stream=True).device_peak
    common = ["run", "ablation", "--model", str(folder), "--device", "cpu", "--eval-set", "paper"]
    assert main([*common, "--method", "skip", "--layers", "0", "--max-memory", kib((whole + streamed) // 2)]) == 0
    assert "[info] streamed plan on cpu: 4 layers read once" in capsys.readouterr().err
    assert main([*common, "--max-memory", "cpu=1GiB"]) == 0  # fits: the whole model, no stream
    assert "[info] streamed plan" not in capsys.readouterr().err
    assert main([*common, "--stream", "--max-memory", "cpu=100KiB"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert line.startswith("anatomy-tui: error: the streamed map needs at least")
