"""ReplaceMe's linear replacement (`prune --replace linear`), the last-layers baseline (`--method
last`, `--heal last`) and the built-in generative task (exact_facts): the least-squares map on cases
where it is known, the fold into the MLP output projection, exports that reload to the same logits
over several families, and lm-eval's exact match as the task defines it."""

from __future__ import annotations

import json

import pytest
import torch
from test_prune import run_prune
from tiny_models import TINY_CONFIGS, tiny_model
from transformers import AutoModelForCausalLM

from engine.core.errors import UserError
from engine.evaluation.accuracy import (
    GEN_DATA,
    GEN_TASK,
    Harness,
    LmEvalSettings,
    TaskScore,
    builtin_task_folder,
    exact_match_of,
)
from engine.evaluation.judging import disagreement
from engine.experiments.prune.healing import CutWeights, Healer, holding
from engine.experiments.prune.replace import estimate, folded, least_squares, output_projection
from engine.experiments.prune.vocabulary import PruneSettings
from engine.models.anatomy import LayerStack
from engine.models.memory import ModelShape
from engine.models.pruning import removed

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDABLE = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gpt2", "gpt_neox", "opt")
IDS = torch.tensor([[5, 70, 33, 101, 9, 250, 17, 3], [44, 2, 200, 8, 8, 120, 61, 77]])


def calibration(rows=16, length=16, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed))


def deeper(family="llama", layers=6, seed=0):
    config = TINY_CONFIGS[family]()
    config.num_hidden_layers = layers
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval().requires_grad_(False)


def test_least_squares_recovers_a_known_map():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=generator, dtype=torch.float64)
    truth = torch.randn(16, 16, generator=generator, dtype=torch.float64)
    fitted = least_squares(x.T @ x, x.T @ (x @ truth))
    torch.testing.assert_close(fitted, truth, atol=1e-5, rtol=0)


def test_a_linear_layer_is_replaced_exactly():
    """Layer 1 made linear in the MLP output M of layer 0 (h -> h + M A): ReplaceMe's regression
    (Y = h_2 - h_1 + M on X = M) is exactly T = I + A, and the cut with T folded into layer 0's
    down_proj gives the logits of the model with that layer."""
    model = tiny_model("llama")
    stack = LayerStack(model)
    d = model.config.hidden_size
    a = 0.1 * torch.randn(d, d, generator=torch.Generator().manual_seed(1))
    stash: dict[str, torch.Tensor] = {}
    output_projection(stack, 0).register_forward_hook(lambda module, args, output: stash.update(m=output))
    stack.layers[1].forward = lambda hidden_states, *args, **kwargs: hidden_states + stash["m"] @ a
    with torch.no_grad():
        full = model(input_ids=IDS).logits
    transform = estimate(model, calibration(), 1, 1, "linear", 4)
    torch.testing.assert_close(transform, torch.eye(d, dtype=torch.float64) + a.double(), atol=1e-5, rtol=0)
    with holding(model, CutWeights(folded(model, 0, transform))), removed(model, (1,)), torch.no_grad():
        cut = model(input_ids=IDS).logits
    torch.testing.assert_close(cut, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FOLDABLE)
def test_fold_equals_applying_the_map_explicitly(family):
    model = tiny_model(family)
    stack = LayerStack(model)
    d = model.config.hidden_size
    transform = torch.eye(d, dtype=torch.float64) + 0.2 * torch.randn(d, d, dtype=torch.float64,
                                                                       generator=torch.Generator().manual_seed(2))
    before = {name: p.clone() for name, p in model.named_parameters()}
    with removed(model, (2,)), torch.no_grad():
        handle = output_projection(stack, 1).register_forward_hook(
            lambda module, args, output: output @ transform.float())
        explicit = model(input_ids=IDS).logits
        handle.remove()
    with holding(model, CutWeights(folded(model, 1, transform))), removed(model, (2,)), torch.no_grad():
        fold = model(input_ids=IDS).logits
    torch.testing.assert_close(fold, explicit, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())  # put back exactly


@pytest.mark.parametrize("family", FOLDABLE)
def test_replaced_export_reloads_to_identical_logits(tokenizer, files, tmp_path, family):
    model = tiny_model(family)
    folder = tmp_path / "out"
    settings = PruneSettings(method="angular", eval_file=files[0], train_file=files[1], remove=(1, 2), bootstrap=0,
                             replace=("linear",), block_size=16, train_blocks=16, export=str(folder),
                             export_method="angular+linear")
    _, doc = run_prune(model, tokenizer, settings)
    rows = {(p["method"], p["removed"]): p for p in doc["curve"]}
    assert set(rows) == {("angular", 1), ("angular", 2), ("angular+linear", 1), ("angular+linear", 2)}
    assert rows[("angular+linear", 2)]["layers"] == [1, 2]  # the only block with a layer before, not the last
    point = doc["exported_point"]
    layers = tuple(point["layers"])
    reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert reloaded.config.num_hidden_layers == 2 and type(reloaded) is type(model)
    blocks, _ = settings.training_blocks(tokenizer)
    assert point["method"] == "angular+linear" and layers == (1, 2)
    weights = CutWeights(folded(model, 0, estimate(model, blocks, 1, 2, "linear", 8)))
    with holding(model, weights), removed(model, layers), torch.no_grad():
        expected = model(input_ids=IDS).logits
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=IDS).logits, expected, atol=1e-6, rtol=1e-6)
    assert "ReplaceMe" in (folder / "README.md").read_text(encoding="utf-8")


def test_least_squares_lowers_the_cut_perplexity_and_cosine_runs(tokenizer, files):
    model = deeper("llama", 6)
    settings = PruneSettings(method="angular", eval_file=files[0], train_file=files[1], remove=(2,), bootstrap=0,
                             replace=("linear", "linear-cosine"), block_size=16, train_blocks=16)
    _, doc = run_prune(model, tokenizer, settings)
    rows = {p["method"]: p for p in doc["curve"]}
    assert set(rows) == {"angular", "angular+linear", "angular+linear-cosine"}
    for label in ("angular+linear", "angular+linear-cosine"):
        layers = rows[label]["layers"]
        assert layers[0] >= 1 and layers[-1] <= 4
        assert rows[label]["healed_ppl"] is None


def test_replacement_one_line_errors(tokenizer, files):
    shape = ModelShape(params=1, n_layers=4, hidden=32, intermediate=64, heads=4, vocab=260)
    with pytest.raises(UserError, match="must not reach the last layer; remove at most 2"):
        PruneSettings(method="angular", remove=(3,), replace=("linear",)).check_against(shape)
    with pytest.raises(UserError, match="needs a block criterion"):
        PruneSettings(method="bi", remove=(1,), replace=("linear",)).validate()
    with pytest.raises(UserError, match="not a curve of this run; one of angular, angular[+]linear"):
        PruneSettings(method="angular", remove=(1,), replace=("linear",), export="x", export_method="bi").validate()
    with pytest.raises(UserError, match="cannot be folded"):
        run_prune(tiny_model("gemma2"), tokenizer, PruneSettings(method="angular", eval_file=files[0],
                                                                 train_file=files[1], remove=(1,),
                                                                 replace=("linear",)))


def test_last_criterion_removes_the_last_layers(tokenizer, files):
    _, doc = run_prune(tiny_model("llama"), tokenizer,
                       PruneSettings(method="last", eval_file=files[0], remove=(1, 2), bootstrap=0))
    assert [p["layers"] for p in doc["curve"]] == [[3], [2, 3]]
    assert doc["methods"] == ["last"]


def test_heal_last_trains_only_the_head_and_the_last_three_kept_layers(tokenizer, files):
    model = deeper("llama", 6)
    assert not model.config.tie_word_embeddings
    stack = LayerStack(model)
    settings = PruneSettings(method="last", eval_file=files[0], train_file=files[1], remove=(1,), heal="last",
                             heal_steps=2, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    everything = dict(model.named_parameters())
    before = {name: p.clone() for name, p in everything.items()}
    trained = {name for name in everything if name == "lm_head.weight"
               or any(name.startswith(f"model.layers.{i}.") for i in (2, 3, 4))}
    healer = Healer(model, tokenizer, settings)
    with removed(model, (5,)), healer.healed((5,), None, keep=True) as weights:
        changed = {name for name, p in everything.items() if not torch.equal(p, before[name])}
    assert changed == trained
    assert weights is not None and set(weights.layers) == {2, 3, 4} and weights.head is not None
    assert all(torch.equal(p, before[name]) for name, p in everything.items())  # restored exactly
    assert len(stack) == 6


# --- the generative task ---------------------------------------------------------------------------


def test_exact_match_as_defined():
    assert exact_match_of(" Paris", "Paris") and exact_match_of("paris!", "Paris")
    assert exact_match_of("  12 ", "12") and not exact_match_of("Paris, France", "Paris")
    assert not exact_match_of("", "7")
    items = [json.loads(line) for line in GEN_DATA.read_text(encoding="utf-8").splitlines()]
    assert len(items) == 30 and all(item["answer"] and item["question"].endswith("?") for item in items)


def test_lm_eval_scores_the_task_by_exact_match_as_defined():
    """A stand-in model answers the task's questions (right, with odd case, space and punctuation, or
    wrong); lm-eval's exact match is the fraction our definition counts right."""
    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    answers = {item["question"]: item["answer"]
               for item in map(json.loads, GEN_DATA.read_text(encoding="utf-8").splitlines())}
    given: list[tuple[str, str]] = []

    class Answering(LM):
        def generate_until(self, requests):
            out = []
            for request in requests:
                question = request.args[0].rsplit("Question: ", 1)[1].split("\n")[0]
                place = len(given)
                reply = [f" {answers[question]}", f" {answers[question].upper()}!", "  nothing"][place % 3]
                given.append((reply, answers[question]))
                out.append(reply)
            return out

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    manager = TaskManager(include_path=str(builtin_task_folder()), include_defaults=False)
    out = lm_eval.simple_evaluate(model=Answering(), tasks=[GEN_TASK], task_manager=manager, log_samples=False)
    expected = sum(exact_match_of(reply, answer) for reply, answer in given) / len(given)
    assert len(given) == 30 and expected == pytest.approx(20 / 30)
    assert out["results"][GEN_TASK]["exact_match,none"] == pytest.approx(expected)


def test_generative_task_runs_by_default_beside_the_choice_tasks(tokenizer, files, tmp_path):
    from lm_eval_tasks import write_task

    tasks = write_task(tmp_path / "tasks")
    harness = Harness(["everyday_sense"], 1, LmEvalSettings(include_path=str(tasks), limit=3))
    assert harness.tasks == ["everyday_sense", GEN_TASK]
    assert Harness(["everyday_sense"], 1, LmEvalSettings(include_path=str(tasks), gen_task=False)).tasks == [
        "everyday_sense"]
    settings = PruneSettings(method="last", eval_file=files[0], remove=(1,), bootstrap=0, limit=3, gen_tokens=4,
                             evaluate_tasks=("everyday_sense",), include_path=str(tasks))
    _, doc = run_prune(tiny_model("llama"), tokenizer, settings)
    scores = {row["task"]: row for row in doc["curve"][0]["accuracy"]}
    assert set(scores) == {"everyday_sense", GEN_TASK}
    assert scores[GEN_TASK]["acc"] is None and 0.0 <= scores[GEN_TASK]["exact_match"] <= 1.0
    assert scores[GEN_TASK]["samples"] == 3 and "exact_match" not in scores["everyday_sense"]


def test_a_cut_whose_perplexity_holds_while_generation_fails_is_flagged():
    def row(task, acc=None, exact=None):
        extra = {} if exact is None else {"exact_match": exact}
        return TaskScore(task=task, acc=acc, acc_stderr=None, acc_norm=None, acc_norm_stderr=None, samples=30,
                         metrics={}, **extra)

    base = [row("everyday_sense", 0.6), row(GEN_TASK, exact=0.5)]
    cut = [row("everyday_sense", 0.6), row(GEN_TASK, exact=0.1)]
    found = disagreement(10.3, 10.0, cut, base)
    assert found is not None and found.startswith(f"generation fails ({GEN_TASK} exact match -40.0 points)")
    assert disagreement(10.3, 10.0, base, base) is None
