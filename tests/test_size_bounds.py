"""Every size bounded before it is allocated (issue 40): a config's sizes and a tokenizer file's size
refused in one line before any model (meta or real) is built from them, transformers' own config
validation one line too, prompts and texts cut by characters before they are tokenized, and an
export folder that the save could not write refused before the run."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_preload_checks import refused
from tiny_models import byte_tokenizer, tiny_model

from engine.core.errors import UserError
from engine.data.text import clip_text
from engine.evaluation.generation import generate_text
from engine.models.loading import load_model
from engine.models.memory import preview_model

ROOT = Path(__file__).resolve().parent.parent
PAPER = ["--eval-set", "paper"]


def edited(model: Path, folder: Path, **changes) -> Path:
    """A copy of `model` (the tiny llama) whose config.json has `changes` (None: the key removed)."""
    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def nothing_built(monkeypatch):
    """No model may be built, on the meta device or for real: any call fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    for builder in ("engine.models.loading.meta_model", "engine.models.loading.load_model",
                    "transformers.AutoModelForCausalLM.from_pretrained"):
        monkeypatch.setattr(builder, refuse)


SIZE_CASES = [
    ({"num_hidden_layers": 10**7}, "num_hidden_layers is 10000000; the layer count must be a whole number from 1 to "
                                   "1,000"),
    ({"hidden_size": 100_000}, "hidden_size is 100000; the hidden size must be a whole number from 1 to 65,536"),
    ({"intermediate_size": 3_000_000}, "intermediate_size is 3000000; the intermediate size must be a whole number "
                                       "from 1 to 1,048,576"),
    ({"vocab_size": 2**21}, "vocab_size is 2097152; the vocabulary must be a whole number from 1 to 1,048,576"),
    ({"num_attention_heads": 5_000}, "num_attention_heads is 5000; the attention head count must be a whole number"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0; the layer count must be a whole number from 1 to 1,000"),
    ({"num_hidden_layers": "12"}, "num_hidden_layers is '12'; the layer count must be a whole number"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers is 2.5; the layer count must be a whole number"),
    ({"hidden_size": 30, "head_dim": None}, "the hidden size 30 is not a multiple of the 4 attention heads"),
    ({"num_key_value_heads": 3}, "the 4 attention heads are not a multiple of the 3 key-value heads"),
]


@pytest.mark.parametrize(("changes", "message"), SIZE_CASES, ids=[str(case[0]) for case in SIZE_CASES])
def test_sizes_out_of_bounds_are_one_line_before_any_model_is_built(changes, message, tiny_folder, tmp_path,
                                                                   nothing_built, capsys):
    folder = edited(tiny_folder, tmp_path / "model", **changes)
    line = refused(["run", "ablation", "--layers", "1", "--model", str(folder), *PAPER], capsys)
    assert f"{folder / 'config.json'}: {message}" in line, line
    with pytest.raises(UserError) as caught:  # the API's load: one line too, before the model is built
        load_model(str(folder), device="cpu")
    said = str(caught.value)  # the bound's line, or transformers' check of the same field first
    assert "\n" not in said and (message in said or "its config is not valid" in said), said


def test_a_config_of_ten_million_layers_is_refused_in_seconds_by_a_fresh_process(tiny_folder, tmp_path):
    folder = edited(tiny_folder, tmp_path / "model", num_hidden_layers=10**7)
    env = {**os.environ, "ANATOMY_TUI_HOME": str(tmp_path / "home")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.main", "run", "ablation", "--layers", "1", "--model", str(folder),
                           *PAPER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"anatomy-tui: error: {folder / 'config.json'}: num_hidden_layers is 10000000; the layer count must be a whole "
        "number from 1 to 1,000 (larger than any released model); fix the config"]
    assert time.monotonic() - start < 60  # before the bound: no answer in 300 s, memory growing 16 MB/s


def test_the_memory_preview_bounds_the_config_before_its_meta_model(tiny_folder, tmp_path, nothing_built):
    """The preview reads configs `check_config` had no copy of (a hub id not yet cached) itself."""
    folder = edited(tiny_folder, tmp_path / "model", num_hidden_layers=10**7)
    with pytest.raises(UserError, match="num_hidden_layers is 10000000; the layer count must be a whole number"):
        preview_model(str(folder))


def gguf_header(path: Path, numbers: dict[str, int]) -> Path:
    """A GGUF file of a header alone: the llama architecture and `numbers` (uint32 values)."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    entries = [string("general.architecture") + struct.pack("<I", 8) + string("llama")]
    entries += [string(f"llama.{key}") + struct.pack("<II", 4, value) for key, value in numbers.items()]
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, len(entries)) + b"".join(entries))
    return path


def test_a_gguf_header_of_ten_million_blocks_is_refused_before_any_model_is_built(tmp_path, nothing_built, capsys):
    gguf = gguf_header(tmp_path / "huge.gguf", {"block_count": 10**7, "embedding_length": 32,
                                                "feed_forward_length": 64, "attention.head_count": 4})
    line = refused(["run", "ablation", "--layers", "1", "--model", str(gguf), *PAPER], capsys)
    assert line.endswith(f"{gguf}: num_hidden_layers is 10000000; the layer count must be a whole number from 1 to "
                         "1,000 (larger than any released model); fix the config")


def test_transformers_own_config_validation_is_one_line(tiny_folder, tmp_path, nothing_built, capsys):
    """hidden_size 30 with head_dim 8 given: the bounds leave it to the family (some allow it), and
    Llama's config class refuses it with a validation error that is not a ValueError."""
    folder = edited(tiny_folder, tmp_path / "model", hidden_size=30)
    line = refused(["run", "ablation", "--layers", "1", "--model", str(folder), *PAPER], capsys)
    assert "its config is not valid" in line and "The hidden size (30) is not a multiple" in line, line
    with pytest.raises(UserError, match=r"its config is not valid \(.*The hidden size \(30\)"):
        load_model(str(folder), device="cpu")


def test_a_tokenizer_file_over_the_bound_is_refused_before_it_is_read(tiny_folder, tmp_path, nothing_built, capsys,
                                                                      monkeypatch):
    folder = edited(tiny_folder, tmp_path / "model")
    with (folder / "tokenizer.json").open("r+b") as file:
        file.truncate(51 * 2**20)  # sparse: 51 MB that take no disk
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("the tokenizer was read"))
    message = f"{folder / 'tokenizer.json'} is 51 MB; a tokenizer file of more than 50 MB is refused before it is read"
    assert message in refused(["run", "ablation", "--layers", "1", "--model", str(folder), *PAPER], capsys)
    with pytest.raises(UserError, match="a tokenizer file of more than 50 MB"):
        load_model(str(folder), device="cpu")


# --- texts cut before they are tokenized ------------------------------------------------------------


class Counting:
    """A tokenizer's encode and decode (`inner`'s), with the longest text asked to encode recorded."""

    def __init__(self, inner) -> None:
        self.inner, self.longest = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, text, *args, **kwargs):
        self.longest = max(self.longest, len(text))
        return self.inner.encode(text, *args, **kwargs)


def test_a_one_megabyte_prompt_is_cut_before_it_is_tokenized():
    model = tiny_model("llama")  # 128 positions: the prompt keeps its last 127 tokens
    tokenizer = Counting(byte_tokenizer())
    prompt = "x" * 10**6 + " and the end of it"
    text = generate_text(model, tokenizer, prompt, 2)
    assert isinstance(text, str)
    assert 127 <= tokenizer.longest <= 4_000  # 16 characters a token, and a margin: not 1,000,018


def test_a_prompt_within_the_context_is_tokenized_whole_as_before():
    model = tiny_model("llama")
    tokenizer = Counting(byte_tokenizer())
    generate_text(model, tokenizer, "The dog sat on the mat.", 2)
    assert tokenizer.longest == len("The dog sat on the mat.")


def test_an_evaluation_text_of_long_tokens_is_cut_before_it_is_tokenized():
    """A tokenizer whose tokens cover 1,000 characters each: the beginning that holds 100 tokens
    used to double until the whole text was tokenized."""
    seen = []

    def thousand_per_token(text, add_special_tokens=True):
        seen.append(len(text))
        return {"input_ids": list(range(len(text) // 1000))}

    clipped = clip_text(thousand_per_token, "y" * 10**7, 100)
    assert max(seen) < 10_000 and len(clipped) < 10_000  # 16 characters a token for 164 tokens, and a margin


# --- export folders the save could not write ------------------------------------------------------


def export_refused(model: Path, export: Path, capsys) -> str:
    return refused(["run", "prune", "--model", str(model), "--remove", "1", "--export", str(export), *PAPER], capsys)


def test_an_export_to_a_dangling_link_is_refused_before_the_run(tiny_folder, tmp_path, nothing_built, capsys):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    line = export_refused(tiny_folder, link, capsys)
    # paths over 80 characters are cut in their middle (engine/core/files.py short_path): their ends are kept
    assert line.startswith("anatomy-tui: error: export folder ") and "/out" in line and "/nowhere, which" in line
    assert line.endswith("which does not exist; give a folder path, or remove the link")


def test_an_export_under_a_dangling_link_or_a_file_is_refused_before_the_run(tiny_folder, tmp_path, nothing_built,
                                                                            capsys):
    link, a_file = tmp_path / "link", tmp_path / "file"
    link.symlink_to(tmp_path / "nowhere")
    a_file.write_text("x")
    # the line names the folder and the part of its path at fault (long paths cut in their middle), and why
    under_link = export_refused(tiny_folder, link / "out", capsys)
    assert "export folder " in under_link
    assert "/link" in under_link and under_link.endswith("is a symbolic link to nothing; give a path in a folder")
    under_file = export_refused(tiny_folder, a_file / "a" / "out", capsys)
    assert "export folder " in under_file
    assert "/file" in under_file and under_file.endswith("is not a folder; give a path in a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_export_folder_that_cannot_be_written_is_refused_before_the_run(tiny_folder, tmp_path, nothing_built,
                                                                          capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert "cannot be written (no permission)" in export_refused(tiny_folder, locked, capsys)
        assert "cannot be written (no permission)" in export_refused(tiny_folder, locked / "out", capsys)
    finally:
        locked.chmod(0o755)
