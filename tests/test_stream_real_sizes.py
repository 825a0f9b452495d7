"""Plans for real sizes, on paper: Llama-3-8B and Llama-3-70B configs (built from their published
shapes with transformers' LlamaConfig, no download) planned on a T4's budget (15 GB on the GPU,
13 GB of host memory): the plan streams, and says its window, peaks and bytes to read. The expected
sizes are worked out here from the shapes and the models' published parameter counts."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

import engine.models.memory as memory
from engine.core.errors import UserError
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.models.placement import Hardware
from engine.models.shape import preview_model

pytestmark = pytest.mark.embedded  # the embedded model's tokenizer: a real BPE's token counts of the text

T4 = Hardware(cuda=True, gpus=1, capabilities=((7, 5),), gpu_memory=(15 * 10**9,), host_memory=30 * 10**9)
BUDGET = "0=15GB,cpu=13GB"
# (hidden, intermediate, layers, heads, published parameters)
SHAPES = {"8B": (4096, 14336, 32, 32, 8_030_261_248), "70B": (8192, 28672, 80, 64, 70_553_706_496)}


def layer_params(hidden: int, intermediate: int, heads: int) -> int:
    """q and o (hidden x hidden), k and v (8 key-value heads of hidden/heads), gate, up, down, 2 norms."""
    kv = 8 * hidden // heads
    return 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate + 2 * hidden


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A config.json of each size (bfloat16, as Meta ships them) beside a real BPE tokenizer."""
    tokenizer = preview_model("smollm2-135m").tokenizer
    made = {}
    for name, (hidden, intermediate, layers, heads, _) in SHAPES.items():
        folder = tmp_path_factory.mktemp(name)
        LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=8, vocab_size=128256,
                    max_position_embeddings=8192, tie_word_embeddings=False,
                    dtype="bfloat16").save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        made[name] = folder
    return made


@pytest.fixture(autouse=True)
def a_t4(monkeypatch):
    """The memory free as on a T4 box (15 GB GPU, 13 GB host), not this machine's."""
    monkeypatch.setattr(memory, "free_memory", lambda device: 15 * 10**9 if device.startswith("cuda") else 13 * 10**9)


@pytest.mark.parametrize("size", ["8B", "70B"])
@pytest.mark.parametrize("settings", [AblationSettings(eval_batch_size=8),
                                      AblationSettings(eval_batch_size=8, method="skip"),
                                      DynamicsSettings(max_tokens=2048)], ids=["map-mean", "map-skip", "dynamics"])
def test_a_t4_streams_llama_3(folders, size, settings):
    hidden, intermediate, layers, heads, params = SHAPES[size]
    plan = memory.plan_run(str(folders[size]), settings, "cuda", "auto", max_memory=BUDGET, hardware=T4)
    streamed = plan.stream
    assert streamed is not None, plan.line()  # the whole model (16 or 141 GB in float16) does not fit 15 GB
    assert plan.dtype == "float16"  # a T4 (7.5) has no native bfloat16: the bfloat16 checkpoint runs in float16
    assert plan.weights == 2 * params > 15 * 10**9
    assert streamed.read_bytes == 2 * params  # each weight read once, as stored (bfloat16)
    assert streamed.layer_bytes == 2 * layer_params(hidden, intermediate, heads)
    window = 1 if isinstance(settings, DynamicsSettings) or settings.method == "skip" else 3
    assert streamed.window == window and streamed.held == window + 1
    assert streamed.device_peak <= streamed.device_budget == 15 * 10**9
    assert streamed.host_peak == 2 * streamed.layer_bytes <= streamed.host_budget == 13 * 10**9
    line = streamed.line()
    assert f"{layers} layers read once" in line and f"a window of {window} layer" in line
    assert "peak" in line and "in host memory" in line and "--max-memory allows" in line


def test_a_budget_below_one_window_says_what_would_fit(folders):
    """70B's window of four layers (6.8 GB in float16) and its outer weights do not fit 8 GB: one line."""
    with pytest.raises(UserError, match=r"needs at least .* on cuda for 4 layers .* raise it or map fewer texts"):
        memory.plan_run(str(folders["70B"]), AblationSettings(eval_batch_size=8, stream=True), "cuda", "auto",
                        max_memory="0=8GB,cpu=13GB", hardware=T4)
