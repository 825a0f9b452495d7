"""A load that speaks (issue 43): each step of a model's load is said as it begins and again every
few seconds, a GGUF's dequantization tensor by tensor with its percentage and the time left at the
measured rate; the console's status line shows it while the load runs."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.models.load_progress import DEQUANTIZE_LOOP, WEIGHTS_LOOP, LoadProgress, LoadStep

PERCENT = re.compile(r"^dequantizing tiny\.gguf: (\d+)% \((\d+)/(\d+) tensors\)")


def tiny_gguf(path: Path, layers: int = 2, hidden: int = 16) -> Path:
    """A complete little Llama as a GGUF file (config, a byte-level tokenizer, float32 tensors):
    what the embedded model is, in 20 tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = ["<s>", "</s>", "a", "b", "c", "ab"]
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(hidden // 2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 1, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rng = np.random.default_rng(0)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,)}
    for layer in range(layers):
        for part, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)), ("attn_v", (hidden, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (32, hidden)), ("ffn_up", (32, hidden)),
                            ("ffn_down", (hidden, 32)), ("attn_norm", (hidden,)), ("ffn_norm", (hidden,))):
            shapes[f"blk.{layer}.{part}.weight"] = shape
    for name, size in shapes.items():
        writer.add_tensor(name, rng.standard_normal(size).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_load_says_each_step_and_the_dequantization_in_percent_up_to_100(tmp_path, monkeypatch):
    """Every tensor said (the interval set to 0): percentages that only grow, 20 tensors, ending at
    100%, after the import and the header and before the weights are read."""
    from engine.models import load_progress
    from engine.models.loading import load_model

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(load_progress, "REPORT_EVERY_S", 0.0)
    lines: list[str] = []
    loaded = load_model(str(tiny_gguf(tmp_path / "tiny.gguf")), device="cpu", dtype="float32", report=lines.append)
    assert loaded.n_layers == 2
    counted = [(int(m[1]), int(m[2]), int(m[3])) for line in lines if (m := PERCENT.match(line))]
    counts = [count for _, count, _ in counted]  # the heartbeat may say a count again
    assert counts == sorted(counts) and sorted(set(counts)) == list(range(1, 21)) and {n for *_, n in counted} == {20}
    percents = [percent for percent, _, _ in counted]
    assert percents == sorted(percents) and percents[-1] == 100 and percents[0] < 100
    assert "about" in lines[lines.index(next(line for line in lines if PERCENT.match(line)))]  # an estimate at once
    firsts = [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in (
        "importing torch and transformers", "reading tiny.gguf's header", "dequantizing tiny.gguf",
        "writing the float copy", "reading the weights of tiny.gguf onto cpu in float32")]
    assert firsts == sorted(firsts), lines
    assert "reading tiny.gguf's tokenizer…" in lines[firsts[-1]:]
    again: list[str] = []  # the copy is read now: no header, no dequantization
    load_model(str(tmp_path / "tiny.gguf"), device="cpu", dtype="float32", report=again.append)
    assert not any("dequantizing" in line or "header" in line for line in again), again


def test_transformers_loops_are_where_the_load_counts_them():
    """The per-tensor loops the load counts still iterate through a module-level `tqdm` (an
    upgrade of transformers that moves them fails here, not silently)."""
    import importlib

    for module in (DEQUANTIZE_LOOP, WEIGHTS_LOOP):
        assert callable(importlib.import_module(module).tqdm), module


def test_a_step_is_said_again_every_few_seconds_while_it_lasts():
    """The heartbeat: a step that counts nothing is said again with its seconds, from its first second."""
    lines: list[str] = []
    said = threading.Event()

    def report(text: str) -> None:
        lines.append(text)
        if len(lines) >= 3:
            said.set()

    progress = LoadProgress(report, every=0.05)
    with progress.running():
        progress.step("importing torch and transformers")
        assert said.wait(10)
    assert lines[0] == "importing torch and transformers…"
    assert all(line.startswith("importing torch and transformers…") for line in lines)


@pytest.mark.parametrize(("done", "elapsed", "expected"), [
    (1, 2.0, "50% (1/2 tensors), about 2 s left"),   # half the bytes in 2 s: 2 s more
    (1, 60.0, "50% (1/2 tensors), about 60 s left"),
    (2, 3.0, "100% (2/2 tensors) in 3 s"),
])
def test_the_time_left_is_the_measured_rate_over_what_is_left(done, elapsed, expected):
    step = LoadStep("dequantizing", started=0.0, done=done * 10.0, total=20.0, count=done, items=2)
    assert step.text(elapsed) == f"dequantizing: {expected}"


def test_a_cold_gguf_load_parses_its_header_once_and_copies_it_exactly(tmp_path, monkeypatch):
    """The header parsed once for the config, the tokenizer, the model's config and its tensors
    (four parses before), and the copy's tensors equal to transformers' own load of the file."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from engine.models.loading import load_model

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path / "tiny.gguf")
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).state_dict()
    parsed: list[str] = []
    reader = gguf.GGUFReader

    def counted(where, mode="r"):
        parsed.append(str(where))
        return reader(where, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    loaded = load_model(str(path), device="cpu", dtype="float32")
    assert len(parsed) == 1 and gguf.GGUFReader is counted  # and put back
    copy = loaded.model.state_dict()
    assert fresh.keys() == copy.keys()
    for name, tensor in fresh.items():
        assert torch.equal(tensor, copy[name]), name


def test_a_headless_run_says_its_loads_steps_on_stderr(tiny_folder, capsys):
    """`anatomy-tui run` says what its load does, step by step, before the run's own lines."""
    from cli.main import main

    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--layers", "1"]) == 0
    err = capsys.readouterr().err
    steps = ["importing torch and transformers…", "reading tiny's config and transformers' code for it…",
             "reading the weights of tiny onto cpu in", "reading tiny's tokenizer…"]
    places = [err.find(step) for step in steps]
    assert -1 not in places and places == sorted(places), err
