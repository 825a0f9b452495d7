"""Help and bad settings answer before torch is imported: `run --help`, a bad value (`--sigma nan`)
and a setting the model's config refuses (`--layers 99`: read from config.json or a GGUF header,
engine/models/preflight.py `check_config`), each in a fresh process that reports, at the refusal,
whether torch or transformers had been imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.models.preflight import config_shape, gguf_config

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys\nfrom cli.main import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n    code = stop.code\n"
    "print('heavy:', ','.join(m for m in ('torch', 'transformers') if m in sys.modules) or '-', 'exit:', code)\n"
)


def refused(*argv: str) -> tuple[str, str, str]:
    """(the heavy modules imported at the refusal, the exit code, stderr) of `anatomy-tui ARGV`."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    last = done.stdout.strip().splitlines()[-1].split()
    return last[1], last[3], done.stderr


def write_gguf(path: Path, layers: int) -> Path:
    """A GGUF file whose header holds a token list (strings) and scores (numbers) before the numbers
    the check reads, as a real one can: the reader must step over both."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["<s>", "a", "b"])
    writer.add_token_scores([0.0, -1.0, -2.0])
    writer.add_block_count(layers)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((3, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_run_help_imports_no_torch():
    heavy, code, _ = refused("run", "--help")
    assert (heavy, code) == ("-", "0")


def test_a_bad_value_is_refused_before_torch():
    heavy, code, err = refused("run", "recovery", "--sigma", "nan")
    assert (heavy, code) == ("-", "2") and "--sigma nan" in err


@pytest.mark.parametrize(("argv", "fragment"), [
    (["recovery", "--layers", "99"], "layer 99 is out of range; this model has layers 0 to 3"),
    (["ablation", "--layers", "1,99"], "layer 99 is out of range"),
    (["ablation", "--part", "mlp", "--layers", "7"], "layer 7 is out of range"),
    (["weights", "--first-layer", "0", "--components", "zz"], "unknown component 'zz' for Llama"),
    (["prune", "--remove", "9"], "cannot remove 9 layers: this model has 4"),
])
def test_a_setting_the_config_refuses_is_refused_before_torch(tiny_folder, argv, fragment):
    heavy, code, err = refused("run", *argv, "--model", str(tiny_folder))
    assert (heavy, code) == ("-", "2")
    assert err.count("\n") == 1 and fragment in err


def test_a_gguf_header_gives_the_depth_before_torch(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", layers=6)
    assert gguf_config(model) == {"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 32,
                                  "intermediate_size": 64, "num_attention_heads": 4}
    heavy, code, err = refused("run", "manipulate", "--layers", "6", "--model", str(model))
    assert (heavy, code) == ("-", "2") and "this model has layers 0 to 5" in err


def test_the_config_shape_is_the_previews(tiny_folder):
    """What config.json alone says is what the full preview (transformers, the meta model) says."""
    from engine.models.memory import preview_model

    quick, full = config_shape(str(tiny_folder)), preview_model(str(tiny_folder)).shape
    assert quick is not None
    assert (quick.n_layers, quick.hidden, quick.intermediate, quick.heads, quick.vocab, quick.family) == (
        full.n_layers, full.hidden, full.intermediate, full.heads, full.vocab, full.family)


def test_no_config_on_disk_leaves_the_check_to_the_preview(tmp_path):
    """A hub id not in the hub cache is not fetched here: the preview after it does that."""
    assert config_shape("someone/not-downloaded") is None
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03")
    assert config_shape(str(broken)) is None  # the load says what is wrong with it, in its words
