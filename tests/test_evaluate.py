"""`evaluate` and `prune --evaluate-tasks`: lm-eval run for real on local task files, checked against
lm-eval's own simple_evaluate on the same model with the same settings; the cut model against a
smaller model built independently; the generation check's agreement and the disagreement flag on
hand-worked cases; one-line errors."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from lm_eval_tasks import EVERYDAY, write_items, write_task
from tiny_models import tiny_model
from transformers import AutoModelForCausalLM
from tui_fixtures import round_trips, task_score

from engine.core.errors import UserError
from engine.core.events import Event, Result
from engine.evaluation.accuracy import without_machine_report
from engine.evaluation.judging import agreement, disagreement
from engine.experiments.context import RunContext
from engine.experiments.evaluate.vocabulary import EvaluateResult, EvaluateSettings, ModelEvaluated
from engine.experiments.prune.vocabulary import PruneResult, PruneSettings
from engine.models.anatomy import LayerStack
from engine.models.loading import LoadedModel
from engine.registry import experiment

pytestmark = pytest.mark.usefixtures("one_thread")

ITEMS = [  # a tiny multiple-choice task: (context, choices, label)
    ("The sun rises in the", ["east", "west", "north"], 0),
    ("Fish live in", ["trees", "water", "clouds"], 1),
    ("Two plus two equals", ["seven", "ten", "four"], 2),
    ("Bees make", ["honey", "paper", "glass"], 0),
    ("The colour of snow is", ["red", "white", "brown"], 1),
    ("We write with a", ["spoon", "pillow", "pen"], 2),
]


@pytest.fixture
def tasks(tmp_path):
    """A folder of two local tasks: tiny_qa (6 items, 3 choices) and everyday_sense (tests/data)."""
    folder = write_task(tmp_path / "tasks", "tiny_qa", write_items(tmp_path / "tiny_qa.jsonl", ITEMS))
    return write_task(folder)


def loaded(model, tokenizer, name="tiny") -> LoadedModel:
    return LoadedModel(model, tokenizer, name, "test", "cpu", "float32", model.config.model_type,
                       len(LayerStack(model)))


def direct(model, tokenizer, folder, tasks, batch_size=1, limit=None, num_fewshot=None) -> dict:
    """lm-eval called directly, as its README shows for a model object (without its report of the
    machine, which takes seconds of subprocesses and no part in the scores: engine/evaluation/accuracy.py)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    with without_machine_report():
        out = lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=limit, num_fewshot=num_fewshot,
                                      task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    return out["results"]


def same_numbers(scores, results) -> None:
    """Our rows hold lm-eval's numbers exactly: acc, acc_norm and their standard errors."""
    assert {row.task for row in scores} == set(results)
    for row in scores:
        found = results[row.task]
        assert (row.acc, row.acc_stderr) == (found["acc,none"], found["acc_stderr,none"])
        assert (row.acc_norm, row.acc_norm_stderr) == (found["acc_norm,none"], found["acc_norm_stderr,none"])


def run_evaluate(model, tokenizer, settings, inputs=None, output_dir=None) -> tuple[list, EvaluateResult]:
    context = RunContext(model=loaded(model, tokenizer), inputs=inputs or {}, output_dir=output_dir)
    events = list(experiment("evaluate").run(settings, context))
    assert isinstance(events[-1], Result) and events[-1].name == "evaluate"
    assert round_trips("evaluate", events[-1].data)
    return events, EvaluateResult.from_json(events[-1].data)


def smaller_llama(model, kept: list[int]):
    """The same model with only layers `kept`, built from a config and a state dict (not engine.models.pruning)."""
    config = model.config.to_dict() | {"num_hidden_layers": len(kept)}
    small = AutoModelForCausalLM.from_config(type(model.config).from_dict(config), attn_implementation="eager")
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            if int(index) not in kept:
                continue
            name = f"model.layers.{kept.index(int(index))}.{rest}"
        state[name] = tensor
    small.load_state_dict(state)
    return small.eval()


@pytest.mark.slow
def test_evaluate_gives_lm_evals_numbers_for_the_original_and_a_cut(tokenizer, tasks):
    model = tiny_model("llama")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    settings = EvaluateSettings(tasks=("tiny_qa", "everyday_sense"), include_path=str(tasks), limit=12.0,
                                variants=("original", "pruned"), remove=(1, 2), gen_tokens=6,
                                gen_task=False)
    events, result = run_evaluate(model, tokenizer, settings)
    original, pruned = result.models
    assert (original.label, pruned.label, original.n_layers, pruned.n_layers) == ("original", "pruned -1,2", 4, 2)
    same_numbers(original.scores, direct(model, tokenizer, tasks, ["tiny_qa", "everyday_sense"], limit=12))
    small = smaller_llama(model, [0, 3])
    same_numbers(pruned.scores, direct(small, tokenizer, tasks, ["tiny_qa", "everyday_sense"], limit=12))
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())  # put back
    assert len(model.model.layers) == 4
    # the protocol is recorded; each model's event came as it was scored
    assert result.protocol.batch_size == 1 and result.protocol.limit == 12 and result.protocol.tasks == [
        "tiny_qa", "everyday_sense"]
    assert result.protocol.n_shot == {"tiny_qa": 0, "everyday_sense": 0}
    assert [e.label for e in events if isinstance(e, ModelEvaluated)] == ["original", "pruned -1,2"]
    assert {row.samples for row in original.scores} == {6, 12}
    # the generation check: the original agrees with itself; the cut against the model built without the layers
    assert original.generation is not None and pruned.generation is not None  # gen_tokens asked for both
    assert (original.generation.prefix_agreement, original.generation.token_agreement) == (1.0, 1.0)
    from engine.evaluation.accuracy import PROMPTS
    from engine.evaluation.generation import greedy_tokens

    reference = [greedy_tokens(model, tokenizer, p, 6) for p in PROMPTS]
    others = [greedy_tokens(small, tokenizer, p, 6) for p in PROMPTS]
    assert (pruned.generation.prefix_agreement, pruned.generation.token_agreement) == agreement(reference, others)
    assert pruned.generation.texts == [tokenizer.decode(ids) for ids in others]

    # a later run evaluates one more model and keeps the earlier rows (same model and protocol)
    settings = EvaluateSettings(tasks=("tiny_qa", "everyday_sense"), include_path=str(tasks), limit=12.0,
                                variants=("pruned",), remove=(3,), gen_tokens=6, gen_task=False)
    events, later = run_evaluate(model, tokenizer, settings, inputs={"evaluate": json_of(result)})
    assert [row.label for row in later.models] == ["original", "pruned -1,2", "pruned -3"]
    assert later.models[0] == original
    # another protocol (batch size) replaces them, and says so
    settings = EvaluateSettings(tasks=("tiny_qa",), include_path=str(tasks), limit=12.0, batch_size=2, gen_tokens=0,
                                gen_task=False)
    events, other = run_evaluate(model, tokenizer, settings, inputs={"evaluate": json_of(later)})
    assert [row.label for row in other.models] == ["original"] and other.models[0].generation is None
    assert any("replaced" in getattr(e, "text", "") for e in events)
    same_numbers(other.models[0].scores, direct(model, tokenizer, tasks, ["tiny_qa"], batch_size=2, limit=12))


def last_data(events: list[Event]) -> dict[str, Any]:
    """The document of a run's last event, its result."""
    assert isinstance(events[-1], Result)
    return events[-1].data


def json_of(result: EvaluateResult) -> dict:
    from engine.core.codec import json_safe

    return json_safe(result)


@pytest.mark.slow
def test_prune_evaluate_tasks_puts_lm_evals_numbers_in_each_row(tokenizer, tasks, files):
    model = tiny_model("llama")
    settings = PruneSettings(eval_file=files[0], method="bi", remove=(1, 2), bootstrap=0,
                             evaluate_tasks=("tiny_qa",), include_path=str(tasks), gen_tokens=4, gen_task=False)
    context = RunContext(model=loaded(model, tokenizer))
    events = list(experiment("prune").run(settings, context))
    assert round_trips("prune", last_data(events))
    result = PruneResult.from_json(last_data(events))
    same_numbers(result.baseline_accuracy, direct(model, tokenizer, tasks, ["tiny_qa"]))
    assert result.evaluation.tasks == ["tiny_qa"] and result.evaluation.batch_size == 1
    for row in result.curve:
        kept = [i for i in range(4) if i not in row.layers]
        same_numbers(row.accuracy, direct(smaller_llama(model, kept), tokenizer, tasks, ["tiny_qa"]))
        assert row.healed_accuracy is None and row.generation is not None and row.generation.unit == "token"
        assert row.disagreement == disagreement(row.ppl, result.baseline_ppl, row.accuracy, result.baseline_accuracy)
    plain = list(experiment("prune").run(PruneSettings(eval_file=files[0], method="bi", remove=(1,), bootstrap=0),
                                         RunContext(model=loaded(model, tokenizer))))
    assert "accuracy" not in last_data(plain)["curve"][0] and "evaluation" not in last_data(plain)  # only when asked


def test_agreement_on_hand_worked_cases():
    assert agreement([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == (1.0, 1.0)
    assert agreement([[1, 2, 3, 4]], [[1, 2, 9, 4]]) == (0.5, 0.75)  # diverges at 2; 3 of 4 positions match
    assert agreement([[1, 2]], [[1, 2, 3]]) == (2 / 3, 2 / 3)  # the longer continuation counts
    assert agreement([[5, 6], [1, 2, 3, 4]], [[7, 6], [1, 2, 3, 4]]) == (4 / 6, 5 / 6)  # summed over prompts
    assert agreement([[]], [[]]) == (1.0, 1.0)
    assert agreement(["abc"], ["abd"]) == (2 / 3, 2 / 3)  # characters, for the growth models


def test_disagreement_on_hand_worked_cases():
    base = [task_score("a", 0.60), task_score("b", 0.50)]
    assert str(disagreement(20.5, 20.0, [task_score("a", 0.50), task_score("b", 0.50)], base)).startswith(
        "accuracy falls (a -10.0 points) while perplexity moves 2.5 %")
    assert disagreement(20.5, 20.0, [task_score("a", 0.58), task_score("b", 0.49)], base) is None  # both steady
    assert str(disagreement(30.0, 20.0, [task_score("a", 0.58), task_score("b", 0.49)], base)).startswith(
        "perplexity moves 50 % while no task's accuracy falls more than 5 points")
    assert disagreement(30.0, 20.0, [task_score("a", 0.40), task_score("b", 0.50)], base) is None  # both fall
    assert str(disagreement(None, 20.0, [task_score("a", 0.60), task_score("b", 0.50)], base)).startswith(
        "perplexity moves inf")
    assert disagreement(20.0, 20.0, [], base) is None


def test_char_tokenizer_for_lm_eval_gives_the_same_ids():
    from engine.experiments.growth.data import CharTokenizer

    chars = CharTokenizer.from_text("abc de\nf")
    hf = chars.transformers()
    text = "a bad cafe\n?x"
    assert hf.encode(text) == chars.encode(text) and hf.decode(hf.encode(text)) == chars.decode(chars.encode(text))


@pytest.mark.slow  # the first import of lm-eval takes seconds
def test_one_line_errors(tokenizer, tasks, monkeypatch, tmp_path):
    model = tiny_model("llama")

    def fails(settings, inputs=None) -> str:
        with pytest.raises(UserError) as caught:
            run_evaluate(model, tokenizer, settings, inputs=inputs)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    with pytest.raises(UserError, match="--tasks"):
        EvaluateSettings().check_inputs()
    from engine.models.memory import ModelShape

    with pytest.raises(UserError, match="layer 4 is out of range"):
        EvaluateSettings(tasks=("x",), remove=(4,)).check_against(ModelShape.from_config(model.config))
    with pytest.raises(UserError, match="not a folder"):
        EvaluateSettings(tasks=("x",), include_path=str(tmp_path / "none")).validate()
    local = EvaluateSettings(tasks=("tiny_qa",), include_path=str(tasks), gen_tokens=0)
    assert "no prune result" in fails(EvaluateSettings(**{**local.to_dict(), "variants": ("pruned",)}))
    assert "no healed cut" in fails(EvaluateSettings(**{**local.to_dict(), "variants": ("healed",)}))
    assert "no growth model" in fails(EvaluateSettings(**{**local.to_dict(), "variants": ("growth",)}))
    assert "no recovered layer" in fails(EvaluateSettings(**{**local.to_dict(), "variants": ("recovered",)}))
    assert "cannot remove all 4 layers" in fails(EvaluateSettings(**{**local.to_dict(), "variants": ("pruned",),
                                                                    "remove": (0, 1, 2, 3)}))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # lm-eval not installed
    assert "pip install 'anatomy-tui[eval]'" in fails(local)


@pytest.mark.slow
def test_an_unknown_task_is_one_line(tokenizer, tasks):
    """Not in the local folder, so lm-eval's own index is searched too (seconds) before the refusal."""
    with pytest.raises(UserError, match="^unknown lm-eval task 'nope'$"):
        run_evaluate(tiny_model("llama"), tokenizer, EvaluateSettings(tasks=("nope",), include_path=str(tasks)))


def test_recovered_variant_reads_the_sessions_layers(tokenizer, tasks, tmp_path):
    """The recovered layers saved for this model are put in for the run (and only for it); layers
    saved for another model are not."""
    from engine.experiments.recovery.checkpoints import save_layer_weights

    model = tiny_model("llama")
    stack = LayerStack(model)
    weights = {name: torch.zeros_like(t) for name, t in stack.copies([2], host=True)[2].items()}
    folder = tmp_path / "checkpoints" / "recovery" / "weights"
    save_layer_weights(folder, 2, weights, "tiny")
    save_layer_weights(folder, 1, weights, "another-model")
    settings = EvaluateSettings(tasks=("tiny_qa",), include_path=str(tasks), variants=("original", "recovered"),
                                gen_tokens=0, gen_task=False)
    _, result = run_evaluate(model, tokenizer, settings, output_dir=tmp_path)
    recovered = result.models[1]
    assert recovered.description.startswith("layers 2 as the recovery run")
    with stack.holding({2: weights}):
        same_numbers(recovered.scores, direct(model, tokenizer, tasks, ["tiny_qa"]))


def test_printed_table_and_console_summary(capsys):
    from rich.console import Console
    from tui_fixtures import evaluate_doc

    from tui.views.evaluate import print_result, summary

    print_result(evaluate_doc())
    out = capsys.readouterr().out
    assert "pruned -2,3" in out and "everyday_sense" in out and "lm-eval 0.4.13, batch size 1" in out
    assert "45.0" in out and "(-15.0)" in out  # the pruned acc and its change from the original, in points
    console = Console(width=200, record=True)
    console.print(summary(EvaluateResult.from_json(evaluate_doc())))
    text = console.export_text()
    assert "folder /models/smol-minus-2" in text and "25 % / 40 %" in text


@pytest.mark.slow
@pytest.mark.embedded
def test_embedded_model_gives_lm_evals_numbers(embedded, tasks):
    settings = EvaluateSettings(tasks=("everyday_sense",), include_path=str(tasks), limit=8.0,
                                variants=("original", "pruned"), remove=(14, 15), gen_tokens=4,
                                gen_task=False)
    context = RunContext(model=embedded)
    events = list(experiment("evaluate").run(settings, context))
    result = EvaluateResult.from_json(last_data(events))
    original, pruned = result.models
    same_numbers(original.scores, direct(embedded.model, embedded.tokenizer, tasks, ["everyday_sense"], limit=8))
    from engine.models.pruning import removed

    with removed(embedded.model, [14, 15]):
        same_numbers(pruned.scores, direct(embedded.model, embedded.tokenizer, tasks, ["everyday_sense"], limit=8))
    assert original.generation is not None  # gen_tokens=4
    assert pruned.n_layers == embedded.n_layers - 2 and original.generation.token_agreement == 1.0
    assert EVERYDAY.exists()
