"""Exports by the Hub's conventions: the model card's metadata, safetensors, the re-indexed config,
the mergekit passthrough YAML (its slices checked by hand and, where mergekit is installed, by
mergekit), LoRA healing's PEFT adapter (beside the merged weights or alone) reloading to the same
logits, and `--push-to-hub` against a local stand-in of the Hub's API."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from hub_stand_in import hub_stand_in
from huggingface_hub import ModelCard
from tiny_models import save_tiny
from transformers import AutoModelForCausalLM

from engine.core.errors import UserError
from engine.core.events import Result
from engine.experiments.context import RunContext
from engine.experiments.prune.vocabulary import PruneSettings
from engine.export.folder import ADAPTER, export_recovered, push_to_hub
from engine.export.mergekit_yaml import MERGEKIT_CONFIG, kept_ranges, passthrough_config
from engine.export.model_card import CardFacts, Perplexity, hub_id, model_card
from engine.models.anatomy import LayerStack
from engine.models.loading import LoadedModel
from engine.models.pruning import removed
from engine.registry import experiment

pytestmark = [pytest.mark.hub, pytest.mark.usefixtures("one_thread")]
IDS = torch.tensor([[5, 17, 99, 3, 42, 8, 61, 7]])


def test_kept_ranges_by_hand():
    # 8 layers without 2, 3 and 7: mergekit's [start, end) slices [0, 2) and [4, 7) keep 0, 1, 4, 5, 6
    assert kept_ranges(8, [7, 3, 2]) == [(0, 2), (4, 7)]
    assert kept_ranges(8, [0]) == [(1, 8)]
    assert kept_ranges(5, [1, 3]) == [(0, 1), (2, 3), (4, 5)]
    config = passthrough_config("org/model", 8, [2, 3, 7], "bfloat16")
    assert config == {"slices": [{"sources": [{"model": "org/model", "layer_range": [0, 2]}]},
                                 {"sources": [{"model": "org/model", "layer_range": [4, 7]}]}],
                      "merge_method": "passthrough", "dtype": "bfloat16"}
    with pytest.raises(UserError, match="out of range"):
        kept_ranges(4, [4])


def test_hub_id_only_for_hub_models():
    assert hub_id("org/name", "org/name") == "org/name"
    assert hub_id("smollm2-135m", "/cache/dequantized/x") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_id("tiny", "/tmp/tiny") is None


def loaded_from(folder, dtype="float32") -> LoadedModel:
    """The saved tiny model, loaded as the run would load `--model FOLDER`."""
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    model.requires_grad_(False)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return LoadedModel(model, tokenizer, folder.name, str(folder), "cpu", dtype, model.config.model_type,
                       len(LayerStack(model)))


def prune(loaded: LoadedModel, **settings) -> dict:
    events = list(experiment("prune").run(PruneSettings(**settings), RunContext(model=loaded, inputs={})))
    assert isinstance(events[-1], Result)
    return events[-1].data


def by_slices(config: dict, n_layers: int) -> list[int]:
    """The original layers a mergekit passthrough config keeps, in order: its ranges concatenated."""
    return [i for part in config["slices"] for i in range(*part["sources"][0]["layer_range"])]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt2"])
def test_prune_export_carries_card_config_and_mergekit_yaml(tmp_path, files, family):
    base = save_tiny(tmp_path / "base", family)
    loaded = loaded_from(base)
    original_types = getattr(loaded.model.config, "layer_types", None)
    folder = tmp_path / "out"
    doc = prune(loaded, method="bi", eval_file=files[0], remove=(2,), bootstrap=0, export=str(folder))
    point = doc["exported_point"]
    kept = [i for i in range(4) if i not in point["layers"]]
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", MERGEKIT_CONFIG} <= {
        p.name for p in folder.iterdir()}

    reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    assert reloaded.config.num_hidden_layers == 2  # (GPT-2's config.json calls it n_layer)
    if original_types is not None:
        assert json.loads((folder / "config.json").read_text())["layer_types"] == [original_types[i] for i in kept]
    indices = [{m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)}
               for layer in LayerStack(reloaded).layers]
    assert indices == [{0}, {1}]  # each kept attention writes its own cache slot, renumbered from 0
    with removed(loaded.model, point["layers"]):
        expected = loaded.model(input_ids=IDS).logits
    torch.testing.assert_close(reloaded(input_ids=IDS).logits, expected, rtol=0, atol=0)

    card = ModelCard.load(folder / "README.md")
    meta = card.data.to_dict()["anatomy_tui"]
    assert meta["removed_layers"] == point["layers"] and meta["criterion"] == "bi"
    assert meta["source_num_hidden_layers"] == 4 and meta["num_hidden_layers"] == 2 and meta["healing"] is None
    assert meta["perplexity"]["pruned"] == point["ppl"] and meta["perplexity"]["original"] == doc["baseline_ppl"]
    assert card.data.base_model is None  # a local folder is no Hub model
    assert card.data.eval_results[0].metric_type == "perplexity"
    assert card.data.eval_results[0].metric_value == point["ppl"]
    assert "anatomy-tui" in card.data.tags and "pruned" in card.data.tags

    mergekit = yaml.safe_load((folder / MERGEKIT_CONFIG).read_text())
    assert mergekit["merge_method"] == "passthrough" and mergekit["dtype"] == "float32"
    assert {part["sources"][0]["model"] for part in mergekit["slices"]} == {str(base)}
    assert by_slices(mergekit, 4) == kept


def lora_settings(files, folder, **more) -> dict:
    return {"method": "bi", "eval_file": files[0], "train_file": files[1], "remove": (1,), "bootstrap": 0,
            "heal_steps": 3, "heal": "lora", "lr": 1e-2, "block_size": 16, "batch_size": 2, "train_blocks": 4,
            "export": str(folder), **more}


@pytest.mark.slow
def test_lora_adapter_reloads_with_peft_to_the_merged_exports_logits(tmp_path, files):
    from peft import PeftModel

    base = save_tiny(tmp_path / "base", "llama")
    merged_folder, adapter_folder = tmp_path / "merged", tmp_path / "adapter-only"
    doc = prune(loaded_from(base), **lora_settings(files, merged_folder))
    layers = doc["exported_point"]["layers"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (merged_folder / ADAPTER).iterdir()}
    assert json.loads((merged_folder / ADAPTER / "adapter_config.json").read_text())["base_model_name_or_path"] == ""
    merged = AutoModelForCausalLM.from_pretrained(merged_folder, attn_implementation="eager")
    merged_logits = merged(input_ids=IDS).logits

    meta = ModelCard.load(merged_folder / "README.md").data.to_dict()["anatomy_tui"]
    assert meta["healing"]["method"] == "lora" and meta["healing"]["adapter"] == "adapter/"
    assert meta["perplexity"]["healed"] == doc["exported_point"]["healed_ppl"]

    # the same run with --export-adapter: the adapter alone, no weights, a PEFT card
    only = prune(loaded_from(base), **lora_settings(files, adapter_folder, export_adapter=True))
    assert only["exported_point"] == doc["exported_point"]
    names = {p.name for p in adapter_folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", MERGEKIT_CONFIG} <= names
    assert not names & {"model.safetensors", "config.json", ADAPTER}
    assert ModelCard.load(adapter_folder / "README.md").data.library_name == "peft"

    for folder in (merged_folder / ADAPTER, adapter_folder):  # onto the pruned base: the merged export's logits
        cut = loaded_from(base)
        with removed(cut.model, layers):
            unhealed = cut.model(input_ids=IDS).logits
            healed = PeftModel.from_pretrained(cut.model, folder)(input_ids=IDS).logits
        torch.testing.assert_close(healed, merged_logits, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(unhealed, merged_logits, atol=1e-3)  # the adapter is what heals


def test_export_adapter_needs_lora_healing_and_an_export(files):
    for settings in (dict(export_adapter=True), dict(export_adapter=True, export="x"),
                     dict(export_adapter=True, export="x", heal="lora"),
                     dict(export_adapter=True, export="x", heal_steps=2)):
        with pytest.raises(UserError, match="--export-adapter needs --export DIR, --heal lora and --heal-steps N"):
            PruneSettings(**settings).validate()


@pytest.mark.slow
def test_mergekit_reproduces_the_cut_and_the_adapter_heals_it(tmp_path, files):
    """mergekit itself, run on the exported YAML, makes the pruned base; the adapter on it gives the
    merged export's logits."""
    pytest.importorskip("mergekit")
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge
    from peft import PeftModel

    base = save_tiny(tmp_path / "base", "llama")
    folder = tmp_path / "healed"
    doc = prune(loaded_from(base), **lora_settings(files, folder, remove=(2,)))
    config = MergeConfiguration.model_validate(yaml.safe_load((folder / MERGEKIT_CONFIG).read_text()))
    run_merge(config, str(tmp_path / "cut"), options=MergeOptions(copy_tokenizer=True, lazy_unpickle=False))
    cut = AutoModelForCausalLM.from_pretrained(tmp_path / "cut", attn_implementation="eager")
    assert cut.config.num_hidden_layers == 4 - len(doc["exported_point"]["layers"])
    original = loaded_from(base).model
    with removed(original, doc["exported_point"]["layers"]):
        torch.testing.assert_close(cut(input_ids=IDS).logits, original(input_ids=IDS).logits, rtol=0, atol=0)
    merged = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    healed = PeftModel.from_pretrained(cut, folder / ADAPTER)
    torch.testing.assert_close(healed(input_ids=IDS).logits, merged(input_ids=IDS).logits, rtol=1e-4, atol=1e-5)


def test_recovered_export_card(tokenizer, tmp_path):
    from tiny_models import tiny_model

    model = tiny_model("llama")
    layers = {2: {name: w.detach() + 0.01 for name, w in LayerStack(model).matrices(2).items()}}
    recovery = {"model": "org/tiny", "baseline_ppl": 9.5, "settings": {"sigma": 0.1},
                "layers": [{"layer": 2, "ppl_after_noise": 30.0, "final_ppl": 10.0, "best_ppl": 9.9},
                           {"layer": 3, "ppl_after_noise": 20.0, "final_ppl": 11.0, "best_ppl": 10.9}]}
    folder = export_recovered(model, tokenizer, layers, tmp_path / "rec", "org/tiny", base_model="org/tiny",
                              recovery=recovery)
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == "org/tiny"
    meta = card.data.to_dict()["anatomy_tui"]
    assert meta["recovered_layers"] == [2] and meta["baseline_ppl"] == 9.5
    assert meta["per_layer"] == [{"layer": 2, "ppl_after_noise": 30.0, "final_ppl": 10.0, "best_ppl": 9.9}]


def test_push_to_hub_uploads_the_folder_to_a_stand_in(tmp_path, monkeypatch, capsys):
    """`anatomy-tui export ... --push-to-hub REPO` through huggingface_hub against a local stand-in
    of the Hub's API: the repository is made and every file of the export arrives intact."""
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
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-token"))
    capsys.readouterr()
    assert cli.main(["export", "lab", "--model", "recovered", str(out), "--push-to-hub", "me/rec"]) == 2
    err = capsys.readouterr().err
    assert "needs your Hugging Face token: set HF_TOKEN or run `hf auth login`" in err and err.count("\n") == 1
    assert not out.exists()  # refused before exporting anything

    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    with hub_stand_in(tmp_path / "hub") as hub:
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.endpoint)
        assert cli.main(["export", "lab", "--model", "recovered", str(out), "--push-to-hub", "me/rec",
                         "--private"]) == 0
        assert hub.created == [{"name": "rec", "organization": "me", "visibility": "private", "type": "model"}]
        assert hub.tokens == {"hf_standin"}
        sent = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        arrived = {p.relative_to(hub.root / "me/rec"): p.read_bytes()
                   for p in (hub.root / "me/rec").rglob("*") if p.is_file()}
        assert arrived == sent and "model.safetensors" in {p.name for p in arrived}
        assert "pushed" in capsys.readouterr().err

        with pytest.raises(UserError, match="could not push .* not-a/valid/repo"):
            push_to_hub(out, "not-a/valid/repo")
    with pytest.raises(UserError, match="could not push"):  # the stand-in is gone: no server answers
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.endpoint)
        push_to_hub(out, "me/rec")


def test_card_reads_back_with_protocol_and_lm_eval_scores(tmp_path):
    protocol = {"dataset": "wikitext", "config": "wikitext-2-raw-v1", "split": "test", "revision": None,
                "protocol": "papers", "context": 2048}
    scores = [{"task": "piqa", "acc": 0.61, "acc_norm": 0.625}, {"task": "toy", "acc": 0.5, "acc_norm": None}]
    card = model_card(CardFacts(title="m minus 2", body="Cut.", details={"removed_layers": [3, 4]},
                                base_model="org/m", perplexity=Perplexity(12.5, "wikitext", protocol),
                                accuracy=scores, n_shot={"piqa": 0}))
    card.save(tmp_path / "README.md")
    data = ModelCard.load(tmp_path / "README.md").data
    assert data.base_model == "org/m" and data.to_dict()["anatomy_tui"] == {"removed_layers": [3, 4]}
    results = data.eval_results
    assert [(r.dataset_type, r.metric_type, r.metric_value) for r in results] == [
        ("wikitext", "perplexity", 12.5), ("piqa", "acc", 0.61), ("piqa", "acc_norm", 0.625), ("toy", "acc", 0.5)]
    assert (results[0].dataset_config, results[0].dataset_split) == ("wikitext-2-raw-v1", "test")
    assert results[0].dataset_args == {"protocol": "papers", "context": 2048}
    assert results[1].dataset_args == {"num_few_shot": 0} and results[3].dataset_args is None


@pytest.mark.slow
def test_push_the_sessions_prune_export(tmp_path, monkeypatch, files, capsys):
    """`run prune --export DIR`, then `export SESSION --model pruned DIR --push-to-hub REPO`: the
    prune's folder arrives, its card given the session's lm-eval scores of that cut (a later
    `run evaluate`); another DIR is refused in one line."""
    from cli import main as cli
    from sessions.store import SessionStore

    base = save_tiny(tmp_path / "tiny", "llama")
    out = tmp_path / "cut"
    assert cli.main(["run", "prune", "--session", "lab", "--model", str(base), "--method", "bi", "--remove", "1",
                     "--bootstrap", "0", "--eval-file", files[0], "--export", str(out)]) == 0
    session = SessionStore().open("lab")
    prune = session.load_result("prune")
    assert prune is not None
    cut = ",".join(map(str, prune["exported_point"]["layers"]))
    scores = [{"task": "toy", "acc": 0.75, "acc_stderr": 0.1, "acc_norm": None, "acc_norm_stderr": None,
               "samples": 8, "metrics": {}}]
    other = [{**scores[0], "acc": 0.25}]
    session.save_result("evaluate", {"model": prune["model"], "protocol": {"tasks": ["toy"], "n_shot": {"toy": 0}},
                                     "models": [{"variant": "pruned", "label": "pruned -9", "scores": other},
                                                {"variant": "pruned", "label": f"pruned -{cut}", "scores": scores,
                                                 "description": "the session's prune cut"}]})
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    with hub_stand_in(tmp_path / "hub") as hub:
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.endpoint)
        capsys.readouterr()
        assert cli.main(["export", "lab", "--model", "pruned", str(tmp_path / "other"), "--push-to-hub", "me/c"]) == 2
        assert "--model pruned is the folder run prune exported" in capsys.readouterr().err
        assert cli.main(["export", "lab", "--model", "pruned", str(out), "--push-to-hub", "me/cut"]) == 0
        arrived = {p.name for p in (hub.root / "me/cut").iterdir()}
    assert arrived == {p.name for p in out.iterdir()} and {MERGEKIT_CONFIG, "README.md"} <= arrived
    card = ModelCard.load(hub.root / "me/cut/README.md").data
    assert [(r.metric_type, r.metric_value) for r in card.eval_results] == [
        ("perplexity", prune["exported_point"]["ppl"]), ("acc", 0.75)]
    assert card.eval_results[1].dataset_args == {"num_few_shot": 0}
    assert card.to_dict()["anatomy_tui"]["lm_eval"]["scores"] == scores
    assert card.to_dict()["anatomy_tui"]["removed_layers"] == prune["exported_point"]["layers"]


@pytest.mark.slow
def test_prune_card_carries_lm_evals_scores_of_the_exported_cut(tmp_path, files):
    """prune --evaluate-tasks: the card's model-index holds the exported cut's own lm-eval scores
    (acc, acc_norm per task, with its shots), its anatomy_tui block the original's too and the protocol."""
    pytest.importorskip("lm_eval")
    from lm_eval_tasks import write_items, write_task

    items = [("The sun is", [" hot", " cold", " blue"], 0), ("Water is", [" wet", " dry", " loud"], 0),
             ("Snow is", [" green", " white", " fast"], 1), ("Fire is", [" cold", " old", " hot"], 2)]
    tasks = write_task(tmp_path / "tasks", "tiny_qa", write_items(tmp_path / "tiny_qa.jsonl", items))
    folder = tmp_path / "out"
    doc = prune(loaded_from(save_tiny(tmp_path / "base", "llama")), method="bi", eval_file=files[0], remove=(1,),
                bootstrap=0, export=str(folder), evaluate_tasks=("tiny_qa",), include_path=str(tasks), gen_tokens=0,
                gen_task=False)
    (score,) = doc["exported_point"]["accuracy"]
    data = ModelCard.load(folder / "README.md").data
    assert [(r.dataset_type, r.metric_type, r.metric_value) for r in data.eval_results] == [
        (doc["protocol"]["dataset"], "perplexity", doc["exported_point"]["ppl"]),
        ("tiny_qa", "acc", score["acc"]), ("tiny_qa", "acc_norm", score["acc_norm"])]
    assert data.eval_results[1].dataset_args == {"num_few_shot": doc["evaluation"]["n_shot"]["tiny_qa"]}
    lm_eval = data.to_dict()["anatomy_tui"]["lm_eval"]
    assert lm_eval["pruned"] == [score] and lm_eval["original"] == doc["baseline_accuracy"]
    assert lm_eval["protocol"] == doc["evaluation"]


def test_dequantized_copy_names_its_architecture_for_mergekit(tmp_path):
    """A GGUF model's prune export names the dequantized copy in its mergekit YAML; mergekit picks
    the architecture from the copy's config.json `architectures`, which the copy must carry."""
    from tiny_models import tiny_model

    from engine.models.gguf_cache import _save_float_copy

    _save_float_copy(tiny_model("qwen2"), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
