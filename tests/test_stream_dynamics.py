"""dynamics streamed (engine/experiments/dynamics/streamed.py): a tiny model of each family saved as
safetensors, its dynamics run in memory and streamed; the results must agree (float32 on the CPU, to
a relative 1e-5), every checkpoint tensor the pass needs read exactly once, one layer held at a time."""

from __future__ import annotations

import math

import pytest
from safetensors import safe_open
from tiny_models import save_tiny

from cli.main import main
from engine.core.errors import UserError
from engine.core.events import Message, Progress, Result
from engine.experiments.ablation.wavefront import source_plan
from engine.experiments.dynamics.run import run_dynamics
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.models.loading import load_model
from engine.models.memory import batch_widths
from engine.models.streaming import open_streamed

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["The river ran past the mill and under the old stone bridge.", "Seven small birds sat on the wire.",
         "A quiet morning; the bakery opened at six, as it always had.", "Numbers: 3, 14, 15, 92 and 65."]


def both(folder, tmp_path, **settings):
    """(in-memory result, streamed result, the streamed run's source, its events)."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS))
    chosen = DynamicsSettings(text_file=str(texts), eval_batch_size=3, clusters=2, components=3, **settings)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    memory = [e for e in run_dynamics(loaded.model, loaded.tokenizer, chosen) if isinstance(e, Result)][-1].data
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    events = list(run_dynamics(streamed.model, streamed.tokenizer, chosen, stream=streamed.stream))
    assert streamed.stream is not None
    streamed.stream.close()
    return memory, [e for e in events if isinstance(e, Result)][-1].data, streamed.stream, events


def assert_close(want, got, where="result"):
    """Every number of the two documents equal to a relative 1e-5 (NaN where NaN), the rest identical."""
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            if key != "seconds":
                assert_close(want[key], got[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, rel=1e-5, abs=1e-7), where
    else:
        assert got == want, where


def stored(folder) -> dict[str, int]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_slice(key).get_shape()[0] for key in handle.keys()}


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2", "gemma3_text", "phi3", "gpt_neox"])
def test_streamed_dynamics_equal_the_in_memory_ones_and_read_each_tensor_once(tmp_path, family):
    """With the plain logit lens (the head read and held): untied heads (Llama, Qwen2, Mistral, Phi-3,
    GPT-NeoX) and tied ones (Gemma 2 and 3), Gemma's sliding-window layers."""
    folder = save_tiny(tmp_path / family, family)
    memory, streamed, source, events = both(folder, tmp_path, logit_lens=True)
    assert memory["logit_lens"] is not None
    assert_close(memory, streamed)
    assert dict(source.reads) == dict.fromkeys(stored(folder), 1)
    assert source.peak_layers == 1
    plan = next(i for i, e in enumerate(events) if isinstance(e, Message) and e.text.startswith("streamed plan"))
    layers = [e.done for e in events if isinstance(e, Progress) and e.phase == "streaming"]
    assert layers == [0, 1, 2, 3, 4]
    assert plan < next(i for i, e in enumerate(events) if isinstance(e, Progress) and e.phase == "streaming")


def test_without_the_lens_an_untied_head_is_never_read(tmp_path):
    """The profiles need no logits: the pass reads the embedding and the layers once, the head never,
    and holds the running states and each token's trajectory (the plan's L + 2 sets of states)."""
    folder = save_tiny(tmp_path / "llama", "llama")
    memory, streamed, source, _ = both(folder, tmp_path)
    assert_close(memory, streamed)
    assert dict(source.reads) == {key: 1 for key in stored(folder) if key != "lm_head.weight"}
    tokens = streamed["tokens"] + streamed["texts"]  # the analysed tokens and each text's first (excluded)
    assert source.peak_states >= (4 + 1) * tokens * 32 * 4  # h_0..h_4 of every token, float32, 32 wide
    widths = batch_widths([len(t.encode()) for t in TEXTS], 3)
    planned = source_plan(source, widths, DynamicsSettings().branches(4), 1)
    assert source.peak_states <= planned.states  # within the plan: every padded token, L + 2 times


def test_the_last_block_lens_does_not_stream(tmp_path):
    with pytest.raises(UserError, match="--lens last-block runs the last layer on every layer's input"):
        DynamicsSettings(lens="last-block", stream=True).validate()


def test_run_dynamics_stream_from_the_command_line(tmp_path, capsys):
    """`run dynamics --stream` writes what the in-memory run writes, and says its streamed plan."""
    import json

    folder = save_tiny(tmp_path / "qwen2", "qwen2")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS))
    common = ["run", "dynamics", "--model", str(folder), "--device", "cpu", "--dtype", "float32", "--text-file",
              str(texts), "--clusters", "2", "--components", "3"]
    assert main([*common, "--stream", "--json", str(tmp_path / "s.json")]) == 0
    assert "streamed plan on cpu: 4 layers read once" in capsys.readouterr().err
    assert main([*common, "--json", str(tmp_path / "m.json")]) == 0
    memory, streamed = (json.loads((tmp_path / name).read_text()) for name in ("m.json", "s.json"))
    assert streamed["settings"].pop("stream") is True and memory["settings"].pop("stream") is False
    assert_close(memory, streamed)
