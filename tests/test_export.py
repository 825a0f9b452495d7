"""engine.export.folder: recovered layers and growth/uniform models saved as folders that load back."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model
from transformers import AutoModelForCausalLM

from engine.core.errors import UserError
from engine.experiments.growth.export import export_growth
from engine.export.folder import check_export_folder, export_recovered
from engine.models.anatomy import LayerStack

IDS = torch.tensor([[5, 17, 99, 3, 42, 8]])


def test_recovered_layers_are_in_the_export_and_the_model_is_unchanged(tokenizer, tmp_path):
    model = tiny_model("llama")
    before = model(input_ids=IDS).logits
    stack = LayerStack(model)
    recovered = {2: {name: w.detach() + 0.01 for name, w in stack.matrices(2).items()}}
    folder = export_recovered(model, tokenizer, recovered, tmp_path / "rec", model_name="tiny")
    torch.testing.assert_close(model(input_ids=IDS).logits, before, rtol=0, atol=0)
    loaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    for name, tensor in LayerStack(loaded).matrices(2).items():
        assert torch.equal(tensor, recovered[2][name])
    assert torch.equal(LayerStack(loaded).matrices(1)["q"], stack.matrices(1)["q"])
    with stack.holding(recovered):
        expected = model(input_ids=IDS).logits
    torch.testing.assert_close(loaded(input_ids=IDS).logits, expected, rtol=0, atol=0)
    assert "Layers 2" in (folder / "README.md").read_text(encoding="utf-8")
    assert (folder / "tokenizer.json").exists()


def test_export_refuses_what_a_user_can_fix(tokenizer, tmp_path):
    with pytest.raises(UserError, match="no recovered layers"):
        export_recovered(tiny_model("llama"), tokenizer, {}, tmp_path / "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "a").write_text("a")
    with pytest.raises(UserError, match="not empty; choose another or add --force"):
        check_export_folder(tmp_path / "busy")
    assert check_export_folder(tmp_path / "busy", force=True) == tmp_path / "busy"
    with pytest.raises(UserError, match="not a saved model folder"):
        export_growth(tmp_path / "nothing", tmp_path / "out")


@pytest.mark.parametrize("uniform", [True, False])
def test_growth_and_uniform_models_export(tmp_path, uniform):
    from engine.experiments.growth.architecture import build_model
    from engine.experiments.growth.data import CharTokenizer

    model = build_model(20, 16, 2, [32, 32] if uniform else [16, 48], 32, seed=0, uniform=uniform)
    source = tmp_path / "arm"
    model.save_pretrained(source)
    CharTokenizer("abcdefghijklmnopqrs").save(source)
    folder = export_growth(source, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert (folder / "growth_tokenizer.json").exists()
    assert ("growth_llama" in (folder / "README.md").read_text(encoding="utf-8")) is not uniform


def test_cli_exports_a_sessions_recovered_model(tmp_path, capsys):
    from tiny_models import save_tiny

    from cli import main as cli
    from engine.experiments.recovery.checkpoints import save_layer_weights
    from engine.models.loading import load_model
    from sessions.store import SessionStore

    base = save_tiny(tmp_path / "tiny", "llama")
    loaded = load_model(str(base), device="cpu", dtype="float32")
    session = SessionStore().open_or_create("lab", model=str(base))
    changed = {name: w.detach() * 0.5 for name, w in LayerStack(loaded.model).matrices(1).items()}
    save_layer_weights(session.checkpoint_dir("recovery") / "weights", 1, changed, loaded.name)
    out = tmp_path / "out"
    assert cli.main(["export", "lab", "--model", "recovered", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(LayerStack(exported).matrices(1)["down"], changed["down"])
    assert cli.main(["export", "lab", "--model", "recovered", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert cli.main(["export", "lab", "--model", "growth", str(tmp_path / "g")]) == 2
