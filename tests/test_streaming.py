"""The streamed ablation map (engine/experiments/ablation/wavefront.py over engine/models/streaming.py):
a tiny model of each family saved as safetensors, mapped in memory and streamed; the maps must agree
row for row, every checkpoint tensor must be read exactly once, and the layers held at once stay
within the method's window."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from tiny_models import save_tiny

from cli.main import main
from engine.core.errors import UserError
from engine.core.events import Message, Progress, Result
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings, LayerProxies
from engine.models.loading import load_model
from engine.models.streaming import LayerSource, StreamedModel, open_streamed

pytestmark = pytest.mark.usefixtures("one_thread")


def source_of(streamed: StreamedModel) -> LayerSource:
    """The layer source of a model open_streamed opened (which always gives one)."""
    assert streamed.stream is not None
    return streamed.stream


def maps(folder, **settings):
    """(in-memory result, streamed result, the streamed run's source, its events) of one model folder."""
    chosen = AblationSettings(eval_set="paper", **settings)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    memory = [e for e in run_ablation(loaded.model, loaded.tokenizer, chosen) if isinstance(e, Result)][-1].data
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    events = list(run_ablation(streamed.model, streamed.tokenizer, chosen, stream=streamed.stream))
    source_of(streamed).close()
    return memory, [e for e in events if isinstance(e, Result)][-1].data, streamed.stream, events


def stored_tensors(folder) -> dict[str, int]:
    """Every tensor of the checkpoint and its size in bytes, read with safetensors itself."""
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_tensor(key).numel() * handle.get_tensor(key).element_size() for key in handle.keys()}


def assert_same_map(memory: dict, streamed: dict) -> None:
    assert streamed["baseline_ppl"] == pytest.approx(memory["baseline_ppl"], rel=1e-5)
    rows = memory["layers"] + memory.get("parts", [])
    found = streamed["layers"] + streamed.get("parts", [])
    assert [(r["layer"], r.get("part")) for r in found] == [(r["layer"], r.get("part")) for r in rows]
    for want, got in zip(rows, found, strict=True):
        for key in ("ppl", "degradation_pct", "block_influence", "angular_distance", "angular_last_token"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-9), (want["layer"], key)
        assert got["layer_class"] == want["layer_class"]
    assert streamed["angular_block_best"] == memory["angular_block_best"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2", "gemma3_text", "phi3", "gpt_neox", "gpt2"])
def test_streamed_map_equals_the_in_memory_map_and_reads_each_tensor_once(tmp_path, family):
    """Neighbour mean (the widest window): untied heads (Llama, Qwen2, Phi-3, GPT-NeoX) and tied
    ones (Gemma 2 and 3, GPT-2), Gemma's sliding-window layers (window 16 < the texts' length)."""
    folder = save_tiny(tmp_path / family, family)
    memory, streamed, source, _ = maps(folder, method="mean")
    assert_same_map(memory, streamed)
    sizes = stored_tensors(folder)
    assert dict(source.reads) == dict.fromkeys(sizes, 1)
    assert source.bytes_read == sum(sizes.values())
    assert source.peak_layers == 3  # the ablated layer and its two neighbours


@pytest.mark.parametrize(("family", "method"), [("gemma2", "skip"), ("gpt_neox", "zero"), ("llama", "mean")])
def test_streamed_blocks_equal_the_in_memory_blocks(tmp_path, family, method):
    """--part both: attention and MLP removed alone; GPT-NeoX adds them in parallel, Gemma through
    its post-norms."""
    folder = save_tiny(tmp_path / family, family)
    memory, streamed, source, _ = maps(folder, method=method, part="both")
    assert len(streamed["parts"]) == 8
    assert_same_map(memory, streamed)
    assert source.peak_layers == (3 if method == "mean" else 1)


def test_skip_holds_one_layer_and_says_its_plan_before_reading(tmp_path):
    """Skip and zero read no neighbour: one layer held at a time. The plan (bytes to read, window,
    branches) comes before the first layer's progress, and the progress counts layers."""
    folder = save_tiny(tmp_path / "llama", "llama")
    memory, streamed, source, events = maps(folder, method="skip", layers=(1, 2))
    assert_same_map(memory, streamed)
    assert source.peak_layers == 1
    plan = next(i for i, e in enumerate(events) if isinstance(e, Message) and e.text.startswith("streamed plan"))
    first = next(i for i, e in enumerate(events) if isinstance(e, Progress) and e.phase == "streaming")
    assert plan < first
    assert "a window of 1 layer" in events[plan].text and "3 branches" in events[plan].text
    layers = [e.done for e in events if isinstance(e, Progress) and e.phase == "streaming"]
    assert layers == [0, 1, 2, 3, 4]


def test_a_checkpoint_missing_a_layer_weight_is_one_line(tmp_path):
    folder = save_tiny(tmp_path / "llama", "llama")
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    del state["model.layers.2.mlp.down_proj.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="lacks model.layers.2.mlp.down_proj.weight"):
        open_streamed(str(folder), device="cpu", dtype="float32")


def test_run_ablation_stream_from_the_command_line(tmp_path, capsys):
    """`run ablation --stream` writes the map the in-memory run writes; with --shards, one line."""
    folder = save_tiny(tmp_path / "qwen2", "qwen2")
    common = ["run", "ablation", "--model", str(folder), "--device", "cpu", "--dtype", "float32",
              "--eval-set", "paper"]
    assert main([*common, "--stream", "--json", str(tmp_path / "s.json")]) == 0
    assert main([*common, "--json", str(tmp_path / "m.json")]) == 0
    assert_same_map(json.loads((tmp_path / "m.json").read_text()), json.loads((tmp_path / "s.json").read_text()))
    assert "streamed plan on cpu: 4 layers read once" in capsys.readouterr().err
    assert main([*common, "--stream", "--shards", "2"]) == 2
    assert "--stream reads each weight once in one process" in capsys.readouterr().err


def test_streamed_states_stay_float32_on_the_cpu(tmp_path):
    """The skeleton's buffers (rotary tables) are real and the weights arrive in the run's dtype."""
    folder = save_tiny(tmp_path / "llama", "llama")
    streamed = open_streamed(str(folder), device="cpu", dtype="bfloat16")
    source = source_of(streamed)
    assert all(p.device.type == "meta" for p in streamed.model.parameters())
    source.load(0)
    assert {p.dtype for p in streamed.model.model.layers[0].parameters()} == {torch.bfloat16}
    source.free(0)
    assert all(p.device.type == "meta" for p in streamed.model.model.layers[0].parameters())
    assert streamed.model.model.rotary_emb.inv_freq.device.type == "cpu"
    source.close()


def test_a_killed_streamed_map_resumes_from_its_last_checkpoint(tmp_path):
    """Stopped at layer 3 of 4 (its state kept after layers 1 and 3), the resumed run reads layer 0
    no more, starts at layer 2, and its map equals the in-memory one."""
    from engine.core.events import Cancelled, CancelToken
    from engine.experiments.ablation.wavefront import StreamCheckpoint

    folder = save_tiny(tmp_path / "llama", "llama")
    chosen = AblationSettings(eval_set="paper", method="mean", part="attention")
    key = {"model": "tiny", "settings": chosen.resume_key()}
    state = tmp_path / "stream.safetensors"
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    token = CancelToken()
    work = run_ablation(streamed.model, streamed.tokenizer, chosen, token, stream=streamed.stream,
                        stream_state=StreamCheckpoint(state, key, resume=False, every=2))
    with pytest.raises(Cancelled):
        for event in work:
            if isinstance(event, Progress) and event.phase == "streaming" and event.done == 3:
                token.cancel()
    source_of(streamed).close()
    assert state.is_file()
    again = open_streamed(str(folder), device="cpu", dtype="float32")
    events = list(run_ablation(again.model, again.tokenizer, chosen, stream=again.stream,
                               stream_state=StreamCheckpoint(state, key, resume=True, every=2)))
    source_of(again).close()
    assert any(isinstance(e, Message) and e.text.startswith("resuming the streamed map after layer 1") for e in events)
    assert [e.done for e in events if isinstance(e, Progress) and e.phase == "streaming"] == [2, 3, 4]
    assert [e.layer for e in events if isinstance(e, LayerProxies)] == [0, 1, 2, 3]  # below its checkpoint: told again
    read = set(source_of(again).reads)
    assert not any(key.startswith("model.layers.0.") for key in read)
    assert {key for key in read if key.startswith("model.layers.2.")} and max(source_of(again).reads.values()) == 1
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    memory = [e for e in run_ablation(loaded.model, loaded.tokenizer, chosen) if isinstance(e, Result)][-1].data
    assert_same_map(memory, [e for e in events if isinstance(e, Result)][-1].data)
