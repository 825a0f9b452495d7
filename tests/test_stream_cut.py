"""The perplexity of a cut, streamed (engine/experiments/evaluate/streamed.py): equal to the cut in
memory (engine/models/pruning.py `removed`, float32 on the CPU, relative 1e-5), each kept layer read
once and the removed ones never; and `evaluate` (lm-eval, which does not stream) refuses a model
beyond its budget in one line."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open
from tiny_models import save_tiny

from cli.main import main
from engine.core.events import Progress
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.experiments.evaluate.streamed import cut_scores
from engine.models.loading import load_model
from engine.models.pruning import removed
from engine.models.streaming import open_streamed

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
    assert "streamed: ablation, dynamics" in err[-1]
