"""Checks before the load (issue 20): what a model's config and tokenizer can tell is refused in one
line, exit 2, before any weight loads. The model's load is replaced by a function that fails the
test, so each refusal is proved to come before it; nothing is left in the session store."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
from typing import cast

import pytest
from tiny_models import save_tiny

import engine.models.loading
from cli.main import main
from engine import registry
from engine.core.errors import UserError
from engine.core.files import read_lines
from engine.core.settings import check_layers
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.recovery.vocabulary import RecoverySettings
from engine.models.memory import ModelShape, plan_run, preview_model
from sessions.store import SessionStore

PAPER = ["--eval-set", "paper"]


@pytest.fixture
def no_load(monkeypatch):
    """The weights must not load: any call fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded")

    monkeypatch.setattr(engine.models.loading, "load_model", refuse)


def refused(argv: list[str], capsys, session: str = "s") -> str:
    """The one error line of a run that exits 2, with no other error-looking line and no session."""
    assert main([*argv, "--session", session]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("anatomy-tui: error: "), err
    assert "memory plan skipped" not in err and "Traceback" not in err
    assert not SessionStore().home.exists() or not any(SessionStore().home.iterdir())
    return errors[0]


# --- layers against the model's depth (the tiny model has layers 0 to 3) -----------------------------

LAYER_CASES = [
    (["ablation", "--layers", "99"], "--layers: layer 99 is out of range; this model has layers 0 to 3"),
    (["recovery", "--layers", "1,4"], "--layers: layer 4 is out of range; this model has layers 0 to 3"),
    (["manipulate", "--layers", "0,7"], "--layers: layer 7 is out of range; this model has layers 0 to 3"),
    (["prune", "--remove", "1,4"], "cannot remove 4 layers: this model has 4; remove at most 3"),
    (["prune", "--max-fraction", "0.1"], "--max-fraction 0.1 of 4 layers removes none"),
    (["weights", "--first-layer", "2"], "--first-layer must be between 0 and 1"),
    (["weights", "--first-layer", "0", "--paradox-layers", "9"], "--paradox-layers: layer 9 is out of range"),
]


@pytest.mark.parametrize(("args", "message"), LAYER_CASES, ids=[" ".join(case[0]) for case in LAYER_CASES])
def test_layers_out_of_range_are_refused_before_the_load(args, message, tiny_folder, no_load, capsys):
    line = refused(["run", *args, "--model", str(tiny_folder), *PAPER], capsys)
    assert message in line


def test_the_checks_run_when_only_the_plan_cannot_be_made(tiny_folder, monkeypatch, no_load, capsys):
    import engine.models.memory

    def unplannable(*args, **kwargs):
        raise OSError("an unusual config")

    monkeypatch.setattr(engine.models.memory, "plan_run", unplannable)
    line = refused(["run", "ablation", "--layers", "4", "--model", str(tiny_folder), *PAPER], capsys)
    assert line.endswith("--layers: layer 4 is out of range; this model has layers 0 to 3")


def test_every_field_naming_layers_is_checked_against_the_depth():
    """Registry-driven: every integer field of a model experiment's settings whose name says
    'layer' (and prune's --remove) is checked by its `check_against` against the model's depth;
    a new such field without a check fails here."""
    shape = ModelShape(params=0, n_layers=30, hidden=32, intermediate=64, heads=4, vocab=260, family="llama")
    checked, unchecked = [], []
    for entry in registry.EXPERIMENTS:
        if not entry.needs_model:
            continue
        base = entry.defaults()
        base.check_against(shape)  # the defaults fit a 30-layer model (recovery: 11, 14, 17)
        for spec in base.fields():
            if spec.base is not int or not ("layer" in spec.name or spec.name == "remove"):
                continue
            beyond = shape.n_layers if spec.name != "first_layer" else shape.n_layers - 2
            value = (beyond,) if spec.is_tuple else beyond
            try:
                dataclasses.replace(base, **{spec.name: value}).check_against(shape)
            except UserError:
                checked.append(f"{entry.name}.{spec.name}")
            else:
                unchecked.append(f"{entry.name} --{spec.name.replace('_', '-')}")
    assert not unchecked, f"not checked against the model's depth before the load: {unchecked}"
    assert set(checked) >= {"ablation.layers", "recovery.layers", "manipulate.layers", "prune.remove",
                            "weights.first_layer", "weights.paradox_layers"}


@pytest.mark.embedded
@pytest.mark.slow
def test_the_embedded_model_is_checked_from_its_gguf_config(no_load, capsys):
    """The issue's cases on the embedded SmolLM2 (30 layers), read from its GGUF header (or the
    config its dequantization saved), never from its weights."""
    line = refused(["run", "recovery", "--layers", "11,30", *PAPER], capsys)
    assert line.endswith("--layers: layer 30 is out of range; this model has layers 0 to 29")
    line = refused(["run", "prune", "--remove", "1,30", *PAPER], capsys)
    assert line.endswith("cannot remove 30 layers: this model has 30; remove at most 29")


def test_check_layers_names_the_flag_and_the_range():
    check_layers((0, 3), 4, "--layers")
    with pytest.raises(UserError, match=r"^--layers: layer -1 is out of range; this model has layers 0 to 3$"):
        check_layers((0, -1), 4, "--layers")


def test_components_unknown_to_the_family_are_refused_before_the_load(tmp_path, no_load, capsys):
    gpt2 = save_tiny(tmp_path / "gpt2", "gpt2")
    line = refused(["run", "weights", "--model", str(gpt2), "--first-layer", "0", "--components", "qkv,gate", *PAPER],
                   capsys)
    assert "unknown component 'gate' for GPT-2" in line


# --- export paths ---------------------------------------------------------------------------------------


def test_export_folders_in_use_are_refused_before_the_load(tiny_folder, tmp_path, no_load, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept.txt").write_text("someone's file")
    a_file = tmp_path / "model.bin"
    a_file.write_text("x")
    run = ["run", "prune", "--model", str(tiny_folder), "--remove", "1,2", *PAPER]
    assert "export folder" in refused([*run, "--export", str(full)], capsys)
    assert "exists and is not empty" in refused([*run, "--export", str(full)], capsys)
    assert "is a file" in refused([*run, "--export", str(a_file)], capsys)
    line = refused([*run, "--export", str(tmp_path / "new"), "--export-count", "3"], capsys)
    assert "--export-count 3 is not a count of the curve (1,2)" in line
    assert (full / "kept.txt").read_text() == "someone's file" and not (tmp_path / "new").exists()


# --- the model's config -----------------------------------------------------------------------------


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda doc: "{\"model_type\": \"llama\", ", "is not a valid JSON file"),
    (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "num_hidden_layers"}),
     "config.json has no num_hidden_layers (the model's layer count)"),
    (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "hidden_size"}),
     "config.json has no hidden_size (the model's hidden size)"),
], ids=["invalid JSON", "no layer count", "no hidden size"])
def test_a_broken_config_is_one_line(breakage, message, tiny_folder, tmp_path, no_load, capsys):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_folder, folder)
    config = folder / "config.json"
    config.write_text(breakage(json.loads(config.read_text())))
    assert message in refused(["run", "ablation", "--model", str(folder), *PAPER], capsys)


def test_the_preview_reads_the_shape_the_plan_uses(tiny_folder):
    preview = preview_model(str(tiny_folder))
    assert (preview.shape.n_layers, preview.shape.hidden, preview.shape.family) == (4, 32, "llama")
    settings = cast(type[AblationSettings], registry.experiment("ablation").settings_class)(eval_set="paper")
    assert plan_run(str(tiny_folder), settings, "cpu", "float32", preview=preview) == plan_run(
        str(tiny_folder), settings, "cpu", "float32")


# --- what the tokenizer tells --------------------------------------------------------------------------


def test_texts_that_leave_no_token_to_predict_are_refused_before_the_load(tiny_folder, tmp_path, no_load, capsys):
    one = tmp_path / "one.txt"
    one.write_text("a\n\nb\n")  # the byte tokenizer: one token a text, nothing to predict from
    line = refused(["run", "ablation", "--model", str(tiny_folder), "--eval-file", str(one)], capsys)
    assert "the evaluation texts leave no token to predict" in line


def test_an_eval_text_with_nul_bytes_is_refused(tiny_folder, tmp_path, no_load, capsys):
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"a real first line\nhello\x00world\n")
    with pytest.raises(UserError, match=r"evaluation file .* is binary \(a NUL byte on line 2\)"):
        read_lines(binary, "evaluation file")
    line = refused(["run", "ablation", "--model", str(tiny_folder), "--eval-file", str(binary)], capsys)
    assert "is binary (a NUL byte on line 2)" in line


# --- --device-map budgets that leave layers on disk ---------------------------------------------------


def test_weight_edits_on_layers_left_on_disk_are_refused_before_the_load(tiny_folder, no_load, capsys):
    # float32: 4 layers of 32x32 attention and 32x64 MLP matrices, 40 KB each, plus the embedding
    budget = ["--device-map", "auto", "--max-memory", "cpu=200KB"]
    line = refused(["run", "recovery", "--model", str(tiny_folder), "--layers", "1", *budget, *PAPER], capsys)
    assert "recovery edits weights, but the --device-map placement offloads 1 of 4 layers" in line
    assert "(layers 0-2 cpu, 3 disk)" in line


def test_the_plan_names_disk_for_layers_offloaded_there(tiny_folder, capsys):
    """The plan's placement is the one the load makes (accelerate's own map, read back from the
    loaded model), and its line says disk, never 'on cpu' for them."""
    budget = ["--device-map", "auto", "--max-memory", "cpu=200KB"]
    assert main(["run", "ablation", "--model", str(tiny_folder), "--method", "skip", *budget, *PAPER]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("memory plan")]
    assert line.startswith("memory plan over layers 0-2 cpu, 3 disk (float32): ") and " on cpu" not in line
    loaded = engine.models.loading.load_model(str(tiny_folder), device_map="auto", max_memory="cpu=200KB")
    settings = cast(type[AblationSettings], registry.experiment("ablation").settings_class)(eval_set="paper")
    plan = plan_run(str(tiny_folder), settings, dtype="float32", device_map="auto", max_memory="cpu=200KB")
    assert list(plan.layer_devices) == loaded.layer_devices == ["cpu", "cpu", "cpu", "disk"]
    assert plan.offloaded_layers() == [3]


def test_without_a_device_map_nothing_is_offloaded(tiny_folder):
    recovery = cast(type[RecoverySettings], registry.experiment("recovery").settings_class)
    settings = recovery(eval_set="paper", layers=(1,))
    plan = plan_run(str(tiny_folder), settings, "cpu", "float32")
    assert plan.layer_devices == () and plan.offloaded_layers() == [] and plan.line().startswith("memory plan on cpu")


# --- the console's --serve port, session names ----------------------------------------------------------


def test_serve_port_out_of_range_or_in_use_is_one_line(capsys):
    for port in ("0", "65536"):
        assert main(["--serve", "--port", port]) == 2
        expected = f"anatomy-tui: error: --port {port}: must be 1 to 65535 (default 8000)"
        assert capsys.readouterr().err.strip() == expected
    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"anatomy-tui: error: --port {port}: cannot listen there (")


def test_a_session_name_over_the_limit_says_the_limit(tiny_folder, no_load, capsys):
    line = refused(["run", "ablation", "--model", str(tiny_folder), *PAPER], capsys, session="a" * 150)
    assert "(150 characters): use at most 100 letters" in line and "a" * 41 not in line
