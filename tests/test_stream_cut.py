"""The perplexity of a cut, streamed (engine/experiments/evaluate/streamed.py): equal to the cut in
memory (engine/models/pruning.py `removed`, float32 on the CPU, relative 1e-5), each kept layer read
once and the removed ones never; `run evaluate --stream` scores it from the command line, its plan
counting the kept layers' bytes; and `evaluate` with lm-eval tasks (which do not stream) refuses a
model beyond its budget, and --stream, in one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors import safe_open
from tiny_models import save_tiny

from cli.main import main
from cli.plan import memory_plan
from engine.core.events import Progress
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.experiments.evaluate.streamed import cut_scores
from engine.experiments.evaluate.vocabulary import EvaluateSettings
from engine.models.loading import load_model
from engine.models.options import ModelOptions
from engine.models.pruning import removed
from engine.models.streaming import open_streamed
from engine.registry import experiment

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("family", "cut"), [("llama", (1,)), ("gemma3_text", (0, 2)), ("gpt_neox", (3,)),
                                             ("gemma2", (1, 2)), ("phi3", (0,))])
def test_a_streamed_cut_scores_as_the_cut_in_memory(tmp_path, family, cut):
    folder = save_tiny(tmp_path / family, family)
    texts = eval_texts(None, "paper")
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    with removed(loaded.model, cut):
        want = Evaluator(loaded.model, loaded.tokenizer, texts, 4).scores()
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    source = streamed.stream
    assert source is not None
    work = cut_scores(source, streamed.tokenizer, texts, cut, batch_size=4)
    progress = []
    try:
        while True:
            event = next(work)
            if isinstance(event, Progress) and event.phase == "streaming":
                progress.append(event.done)
    except StopIteration as done:
        got = done.value
    source.close()
    assert got.perplexity == pytest.approx(want.perplexity, rel=1e-5)
    np.testing.assert_allclose(got.nll, want.nll, rtol=1e-5)
    assert progress == list(range(5 - len(cut)))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        stored = list(handle.keys())
    layer = {key: int(key.split(".")[2]) for key in stored if ".layers." in key}
    assert dict(source.reads) == {key: 1 for key in stored if layer.get(key) not in cut}
    assert source.peak_layers == 1


def test_evaluate_refuses_a_model_beyond_its_budget_in_one_line(tmp_path, capsys, monkeypatch):
    """lm-eval's tasks load the whole model: on a machine with too little memory, one line saying what
    does stream, before any weight is read."""
    import engine.models.memory as memory

    folder = save_tiny(tmp_path / "llama", "llama")
    monkeypatch.setattr(memory, "free_memory", lambda device: 10_000)
    assert main(["run", "evaluate", "--model", str(folder), "--device", "cpu", "--tasks", "piqa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and "evaluate loads the whole model" in err[-1]
    assert "streamed: ablation, dynamics, evaluate (--stream)" in err[-1]
    assert "--stream without --tasks (the perplexity only)" in err[-1]


def test_run_evaluate_stream_scores_the_cut_as_in_memory_reading_the_kept_tensors(tmp_path, capsys):
    """From the command line: the cut's perplexity on the built-in texts equals the in-memory cut's, the
    bytes read are the kept tensors' (every stored tensor but layer 1's), and the plan before the load
    counts those bytes and the 3 kept layers, not the whole checkpoint."""
    folder = save_tiny(tmp_path / "llama", "llama")
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    with removed(loaded.model, (1,)):
        want = Evaluator(loaded.model, loaded.tokenizer, eval_texts(None, "full"), 1, 256).scores().perplexity
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        kept = sum(handle.get_tensor(key).nbytes for key in handle.keys() if ".layers.1." not in key)
    settings = EvaluateSettings(stream=True, variants=("pruned",), remove=(1,))
    plan = memory_plan(experiment("evaluate"), settings,
                       ModelOptions(model=str(folder), device="cpu", dtype="float32"), quiet=True)
    assert plan is not None and plan.stream is not None
    assert (plan.stream.layers, plan.stream.read_bytes) == (3, kept)
    out = tmp_path / "evaluate.json"
    assert main(["run", "evaluate", "--model", str(folder), "--device", "cpu", "--dtype", "float32", "--stream",
                 "--variants", "pruned", "--remove", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    err = printed.err
    assert "streamed plan on cpu: 3 layers read once" in err
    assert "llama: perplexity" in printed.out and "perplexity on the built-in texts, streamed" in printed.out
    read = re.search(r"pruned -1: perplexity [0-9.]+ on 48 built-in texts, streamed \(([0-9,]+) bytes read", err)
    assert read is not None and int(read.group(1).replace(",", "")) == kept
    row = json.loads(out.read_text())["models"][0]
    assert (row["label"], row["n_layers"], row["scores"]) == ("pruned -1", 3, [])
    assert row["perplexity"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(("flags", "said"), [
    (["--tasks", "piqa"], "lm-eval tasks do not stream"),
    (["--variants", "original,healed"], "--variants healed: not streamed"),
])
def test_evaluate_stream_refuses_what_does_not_stream_in_one_line(tmp_path, capsys, flags, said):
    folder = save_tiny(tmp_path / "llama", "llama")
    capsys.readouterr()
    assert main(["run", "evaluate", "--model", str(folder), "--device", "cpu", "--stream", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]
