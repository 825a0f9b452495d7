"""The ablation map's proxies-only mode streamed (one pass: the wavefront with no branch but the clean
one): Block Influence and the angular distances equal to the in-memory pass's, each checkpoint tensor
read once; and a dynamics plan over its budget streams by itself, as the map's does."""

from __future__ import annotations

import pytest
from safetensors import safe_open
from test_stream_dynamics import assert_close
from tiny_models import save_tiny

from engine.core.events import Result
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.models.loading import load_model
from engine.models.memory import plan_run
from engine.models.placement import CPU_ONLY
from engine.models.streaming import open_streamed

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("family", "part"), [("llama", "layer"), ("gemma2", "both"), ("gpt_neox", "both"),
                                              ("phi3", "layer")])
def test_streamed_proxies_equal_the_in_memory_ones_and_read_each_tensor_once(tmp_path, family, part):
    folder = save_tiny(tmp_path / family, family)
    chosen = AblationSettings(eval_set="paper", proxies_only=True, part=part, method="skip")
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    want = [e for e in run_ablation(loaded.model, loaded.tokenizer, chosen) if isinstance(e, Result)][-1]
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    source = streamed.stream
    assert source is not None
    got = [e for e in run_ablation(streamed.model, streamed.tokenizer, chosen, stream=source)
           if isinstance(e, Result)][-1]
    source.close()
    assert got.name == want.name == "ablation-proxies"
    assert want.data["layers"] and (part == "layer" or want.data["parts"])
    assert_close(want.data, got.data)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        assert dict(source.reads) == dict.fromkeys(handle.keys(), 1)
    assert source.peak_layers == 1


def test_a_dynamics_plan_over_its_budget_streams(tmp_path):
    """A budget between the streamed pass's peak and the whole model's plan: the plan streams (its line
    the streamed one, one layer held, L + 2 sets of states); a budget holding the model does not."""
    folder = save_tiny(tmp_path / "llama", "llama")
    texts = tmp_path / "texts.txt"
    texts.write_text("A short line of text.\nAnother, a little longer, line of text to read.\n")

    def planned(max_memory: str | None, stream: bool = False):
        return plan_run(str(folder), DynamicsSettings(text_file=str(texts), stream=stream), "cpu", "float32",
                        max_memory=max_memory, hardware=CPU_ONLY)

    whole = planned(None)
    assert whole.stream is None
    streamed = planned("cpu=1GiB", stream=True).stream
    assert streamed is not None and streamed.device_peak < whole.total
    assert (streamed.held, streamed.branches, streamed.texts) == (2, 4 + 2, 2)
    chosen = planned(f"cpu={(streamed.device_peak + whole.total) // 2 // 1024}KiB")
    assert chosen.stream is not None and chosen.line().startswith("streamed plan on cpu: 4 layers read once")


def test_streamed_proxies_with_the_neighbour_mean_hold_one_layer(tmp_path):
    """The proxies remove nothing, so the default method's neighbours are never read beside the layer:
    the source holds one decoder layer at a time, and the plan counts one layer and the one read ahead
    (a window of 3 and one ahead, 4, before)."""
    folder = save_tiny(tmp_path / "llama", "llama")
    chosen = AblationSettings(eval_set="paper", proxies_only=True, stream=True)
    assert chosen.method == "mean"
    plan = plan_run(str(folder), chosen, "cpu", "float32", max_memory="cpu=1GiB", hardware=CPU_ONLY).stream
    assert plan is not None and plan.held == 2
    streamed = open_streamed(str(folder), device="cpu", dtype="float32")
    source = streamed.stream
    assert source is not None
    results = [e for e in run_ablation(streamed.model, streamed.tokenizer, chosen, stream=source)
               if isinstance(e, Result)]
    source.close()
    assert results[-1].name == "ablation-proxies"
    assert source.peak_layers == 1
