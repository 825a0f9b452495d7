"""No pickle is ever read (issue 27): a model, growth or adapter folder whose weights would be read
through `torch.load` is refused in one line before anything is unpickled, a damaged safetensors file
is one line too, and the source holds no load that could unpickle (a pickle can run code: the
payload tests write a marker file when unpickled, and it must never appear)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import save_tiny, tiny_model

from engine.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


class Payload:
    """Unpickled, it creates `marker` (what a hostile pickle would do with a shell instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"import pathlib; pathlib.Path({self.marker!r}).touch()",)


def hostile_pickle(path: Path, marker: Path) -> Path:
    """A `torch.save` file whose state dict carries a payload next to real tensors."""
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "payload": Payload(marker)}, path)
    return path


def test_the_payload_is_live(tmp_path):
    """The payload the tests use does run when unpickled without weights_only."""
    marker = tmp_path / "ran"
    torch.load(hostile_pickle(tmp_path / "p.bin", marker), weights_only=False)
    assert marker.exists()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Model folders: a real `torch.save` of a tiny model's state dict as its only weights, one with
    a payload, one whose model.safetensors is cut in half, and a good one."""
    root = tmp_path_factory.mktemp("pickles")
    good = save_tiny(root / "good")
    made = {"good": good}
    for name in ("state-dict", "payload", "truncated", "named", "sharded"):
        made[name] = Path(shutil.copytree(good, root / name))
    state = load_file(good / "model.safetensors")
    for name in ("state-dict", "payload"):
        (made[name] / "model.safetensors").unlink()
    torch.save(state, made["state-dict"] / "pytorch_model.bin")
    hostile_pickle(made["payload"] / "pytorch_model.bin", root / "marker")
    data = (good / "model.safetensors").read_bytes()
    (made["truncated"] / "model.safetensors").write_bytes(data[: len(data) // 2])
    # a config.json naming a pickle (transformers reads "adapter_model.bin" with torch.load even
    # under use_safetensors=True) and a sharded index whose shard is a pickle (read the same way)
    config = json.loads((good / "config.json").read_text())
    hostile_pickle(made["named"] / "adapter_model.bin", root / "marker")
    (made["named"] / "config.json").write_text(json.dumps({**config, "transformers_weights": "adapter_model.bin"}))
    (made["sharded"] / "model.safetensors").unlink()
    hostile_pickle(made["sharded"] / "model-00001-of-00001.bin", root / "marker")
    (made["sharded"] / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {key: "model-00001-of-00001.bin" for key in state}}))
    made["marker"] = root / "marker"
    return made


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TUI_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert lines and lines[-1].startswith("anatomy-tui: error: "), done.stderr
    assert not any("Error" in line for line in lines[:-1]), done.stderr
    return lines[-1]


@pytest.mark.parametrize("kind", ["state-dict", "payload"])
def test_a_model_folder_with_only_a_pickle_is_refused_in_one_line(folders, kind, tmp_path):
    line = one_line_exit_2(cli("run", "ablation", "--model", str(folders[kind]), "--device", "cpu",
                               home=tmp_path))
    assert "only pickled weights (pytorch_model.bin)" in line and "save_pretrained" in line
    assert "memory plan" not in line
    assert not folders["marker"].exists()


@pytest.mark.parametrize("kind", ["named", "sharded"])
def test_a_folder_that_points_transformers_at_a_pickle_is_refused(folders, kind):
    from engine.models.loading import load_model

    with pytest.raises(UserError, match="never loads pickles") as info:
        load_model(str(folders[kind]), device="cpu")
    assert "\n" not in str(info.value)
    assert not folders["marker"].exists()


def test_a_truncated_safetensors_file_is_one_line(folders, tmp_path):
    line = one_line_exit_2(cli("run", "ablation", "--model", str(folders["truncated"]), "--device", "cpu",
                               home=tmp_path))
    assert "safetensors weights are damaged or truncated" in line


def test_a_good_folder_with_a_pickle_beside_its_safetensors_loads_the_safetensors(folders, tmp_path):
    from engine.models.loading import load_model

    folder = Path(shutil.copytree(folders["good"], tmp_path / "both"))
    hostile_pickle(folder / "pytorch_model.bin", tmp_path / "marker")
    loaded = load_model(str(folder), device="cpu")
    assert loaded.n_layers == 4 and not (tmp_path / "marker").exists()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, folders) -> dict[str, Path]:
    """A real LoRA adapter saved as a pickle (adapter_model.bin, peft's safe_serialization=False),
    one with a payload, and one as safetensors cut in half."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapters")
    model = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(root / "bin", safe_serialization=False)
    model.save_pretrained(root / "truncated")
    model.save_pretrained(root / "good")
    hostile_pickle(root / "good" / "adapter_model.bin", folders["marker"])  # beside it: never read
    assert (root / "bin" / "adapter_model.bin").is_file()
    shutil.copytree(root / "bin", root / "payload")
    hostile_pickle(root / "payload" / "adapter_model.bin", folders["marker"])
    cut = root / "truncated" / "adapter_model.safetensors"
    cut.write_bytes(cut.read_bytes()[:100])
    return {name: root / name for name in ("bin", "payload", "truncated", "good")}


@pytest.mark.parametrize("kind", ["bin", "payload"])
def test_an_adapter_with_only_adapter_model_bin_is_refused_in_one_line(folders, adapters, kind, tmp_path):
    line = one_line_exit_2(cli("run", "evaluate", "--model", str(folders["good"]), "--device", "cpu",
                               "--tasks", "x", "--adapter", str(adapters[kind]), home=tmp_path))
    assert f"--adapter {adapters[kind]} has only pickled weights (adapter_model.bin)" in line
    assert "adapter_model.safetensors" in line  # how to convert it
    assert not folders["marker"].exists()


def test_a_safetensors_adapter_still_loads(adapters, folders):
    from tiny_models import byte_tokenizer

    from engine.experiments.context import RunContext
    from engine.experiments.evaluate.run import _adapted
    from engine.experiments.evaluate.vocabulary import EvaluateSettings
    from engine.models.loading import LoadedModel

    settings = EvaluateSettings(tasks=("x",), adapter=str(adapters["good"]), gen_tokens=0)
    settings.validate()
    loaded = LoadedModel(tiny_model(), byte_tokenizer(), "tiny", "tiny", "cpu", "float32", "Llama", 4)
    with _adapted(settings, RunContext(model=loaded)) as subject:
        assert any("lora_" in name for name, _ in subject.model.named_parameters())
    assert not folders["marker"].exists()


def test_a_damaged_adapter_is_one_line(adapters):
    from tiny_models import byte_tokenizer

    from engine.experiments.context import RunContext
    from engine.experiments.evaluate.run import _adapted
    from engine.experiments.evaluate.vocabulary import EvaluateSettings
    from engine.models.loading import LoadedModel

    settings = EvaluateSettings(tasks=("x",), adapter=str(adapters["truncated"]), gen_tokens=0)
    loaded = LoadedModel(tiny_model(), byte_tokenizer(), "tiny", "tiny", "cpu", "float32", "Llama", 4)
    with pytest.raises(UserError, match="adapter_model.safetensors is damaged or truncated") as info:
        with _adapted(settings, RunContext(model=loaded)):
            pass
    assert "\n" not in str(info.value)


def test_a_growth_folder_with_only_a_pickle_is_refused(tmp_path):
    from engine.experiments.growth.architecture import load_growth_model

    folder = tmp_path / "growth"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    hostile_pickle(folder / "pytorch_model.bin", tmp_path / "marker")
    with pytest.raises(UserError, match="only pickled weights"):
        load_growth_model(folder)
    assert not (tmp_path / "marker").exists()


def test_a_damaged_growth_checkpoint_is_one_line(tmp_path):
    from engine.experiments.growth.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, "a", {"w": torch.ones(64)}, {"settings": {}})
    tensors = next(tmp_path.glob("state-*.safetensors"))
    tensors.write_bytes(tensors.read_bytes()[:60])
    with pytest.raises(UserError, match="growth checkpoint .* is damaged") as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value)
    (tmp_path / "state.json").write_text(json.dumps({"tensors": "../elsewhere.bin"}))
    with pytest.raises(UserError, match="not a state-\\*.safetensors file"):
        load_checkpoint(tmp_path)


def test_a_hub_repository_with_only_pickles_is_one_line():
    from engine.models.loading import friendly_load_error
    from engine.models.sources import ModelSource

    exc = OSError("org/x does not appear to have a file named model.safetensors or model.safetensors.index.json "
                  "and thus cannot be loaded with `safetensors`. Please do not set `use_safetensors=True`.")
    error = friendly_load_error(exc, ModelSource("hub", "org/x", "org/x"))
    assert "org/x has only pickled weights" in str(error) and "use_safetensors" not in str(error)


# the source: no load that could unpickle ------------------------------------------------------------------
# Exempt: configs and tokenizers (JSON and tokenizer files, never weights: AutoConfig would keep an
# unknown use_safetensors as a config attribute), GGUF loads (`gguf_file=`: gguf-py parses the file's own
# header and tensors, no pickle), and peft's PeftModel (no such flag: it reads adapter_model.safetensors
# when present) when its function calls `safetensors_only` first, which refuses a folder without it.
NOT_WEIGHTS = ("Config", "Tokenizer", "ModelCard")
PICKLE_SAFE_BY_CHECK = {"PeftModel"}


def _receiver(call: ast.Call) -> str:
    func = call.func.value if isinstance(call.func, ast.Attribute) else call.func
    return ast.unparse(func)


def _keyword_true(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


def pickle_risks(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    torch_loads = {"torch.load", "torch.serialization.load"} | {  # and `from torch import load [as x]`
        alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        and node.module in ("torch", "torch.serialization") for alias in node.names if alias.name == "load"}

    def enclosing(call: ast.Call) -> ast.AST | None:
        inside = [f for f in functions if f.lineno <= call.lineno <= (f.end_lineno or f.lineno)]
        return max(inside, key=lambda f: f.lineno) if inside else None

    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        text = ast.unparse(call.func)
        place = f"{where}:{call.lineno}: {ast.unparse(call)[:100]}"
        if text in torch_loads and not _keyword_true(call, "weights_only"):
            found.append(place)
        elif text in ("pickle.load", "pickle.loads", "dill.load", "joblib.load"):
            found.append(place)
        elif isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained":
            receiver = _receiver(call)
            if receiver.endswith(NOT_WEIGHTS) or any(k.arg == "gguf_file" for k in call.keywords):
                continue
            if receiver in PICKLE_SAFE_BY_CHECK:
                function = enclosing(call)
                checks = function is not None and any(
                    isinstance(n, ast.Call) and ast.unparse(n.func).endswith("safetensors_only")
                    and n.lineno < call.lineno for n in ast.walk(function))
                if not checks:
                    found.append(place + " (no safetensors_only before it)")
            elif not _keyword_true(call, "use_safetensors"):
                found.append(place)
    return found


# engine/models/distributed.py: events travel between the ranks of one run as pickles over the process
# group torchrun set up (our own processes, never a file); the only pickle.loads allowed.
ALLOWED = {("engine/models/distributed.py", "pickle.loads")}


def test_the_source_never_loads_a_pickle():
    found = []
    for package in ("engine", "sessions", "tui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            found += [risk for risk in pickle_risks(path.read_text(encoding="utf-8"), where)
                      if not any(where == file and f": {name}(" in risk for file, name in ALLOWED)]
    assert found == []


def test_the_scan_sees_the_risks():
    risky = (
        "import torch\nfrom transformers import AutoModelForCausalLM\nfrom peft import PeftModel\n"
        "def f(p, m):\n"
        "    torch.load(p)\n"
        "    torch.load(p, weights_only=False)\n"
        "    AutoModelForCausalLM.from_pretrained(p)\n"
        "    AutoModelForCausalLM.from_pretrained(p, use_safetensors=False)\n"
        "    PeftModel.from_pretrained(m, p)\n"
        "def g(p, m):\n"
        "    torch.load(p, weights_only=True)\n"
        "    AutoModelForCausalLM.from_pretrained(p, use_safetensors=True)\n"
        "    AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name)\n"
        "    AutoTokenizer.from_pretrained(p)\n"
        "    safetensors_only(p, adapter=True)\n"
        "    PeftModel.from_pretrained(m, p)\n"
        "from torch import load as tl\n"
        "tl(p)\n"
        "tl(p, weights_only=True)\n"
    )
    assert sorted(int(line.split(":")[1]) for line in pickle_risks(risky, "x")) == [5, 6, 7, 8, 9, 18]
