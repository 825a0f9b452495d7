"""The evaluate result: as `anatomy-tui run evaluate` prints it, and its Analyses view: the original
and each variant side by side, per lm-eval task accuracy (acc_norm beside it where the task has it)
with its standard error, and the generation check's agreement with the original."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from engine.evaluation.accuracy import GenerationCheck, LmEvalProtocol, TaskScore
from engine.experiments.evaluate.vocabulary import EvaluateResult
from tui.views import Analysis
from tui.views._format import fmt
from tui.views._tables import WholeConsole

ANALYSIS = Analysis("Zero-shot accuracy (lm-eval), original vs variants", place=7)


def score_cell(score: TaskScore | None, baseline: TaskScore | None = None, compact: bool = False) -> str:
    """acc ± stderr in percent, acc_norm after a slash where the task has it (`compact`: acc alone),
    and the change from the original's acc in points where there is one; a generative task's exact
    match, marked EM."""
    if score is not None and score.acc is None and score.score is not None:  # a generative task: exact match
        cell = f"{100 * score.score:.1f} EM"
        if baseline is not None and baseline is not score and baseline.score is not None:
            cell += f" ({100 * (score.score - baseline.score):+.1f})"
        return cell
    if score is None or score.acc is None:
        return "-" if score is None else fmt(score.acc_norm and 100 * score.acc_norm, ".1f", "n/a")
    cell = f"{100 * score.acc:.1f}"
    if not compact:
        cell += f" ± {fmt(score.acc_stderr and 100 * score.acc_stderr, '.1f')}"
        if score.acc_norm is not None:
            cell += f" / {100 * score.acc_norm:.1f}"
    if baseline is not None and baseline is not score and baseline.acc is not None:
        cell += f" ({100 * (score.acc - baseline.acc):+.1f})"
    return cell


def agreement_cell(check: GenerationCheck | None) -> str:
    if check is None:
        return "-"
    return f"{100 * check.prefix_agreement:.0f} % / {100 * check.token_agreement:.0f} %"


def protocol_line(protocol: LmEvalProtocol, gen_tokens: int) -> Text:
    if not protocol.tasks:  # evaluate --stream: the perplexity alone (engine/experiments/evaluate/streamed.py)
        return Text(f"perplexity on the built-in texts, streamed, batch size {protocol.batch_size}; no lm-eval task, "
                    "no generation check", style="italic")
    shots = ", ".join(f"{task} {n}" for task, n in protocol.n_shot.items()) or "each task's own"
    limit = "all items" if protocol.limit is None else f"limit {protocol.limit:g}"
    check = (f"generation check: {gen_tokens} greedy tokens per prompt, agreement with the original "
             "up to the first divergence / position by position") if gen_tokens else "no generation check"
    return Text(f"lm-eval {protocol.lm_eval_version}, batch size {protocol.batch_size}, {limit}, shots: {shots}; "
                f"{check}", style="italic")


def table(result: EvaluateResult) -> Table:
    """One row per model, one column per task: acc ± stderr / acc_norm (change from the original)."""
    tasks = list(dict.fromkeys(score.task for row in result.models for score in row.scores))
    original = next((row for row in result.models if row.variant == "original"), None)
    base = {score.task: score for score in original.scores} if original is not None else {}
    grid = Table(title=f"{result.model}: accuracy % ± stderr / acc_norm % (change from the original, points)"
                 if tasks else f"{result.model}: perplexity")
    grid.add_column("model")
    grid.add_column("layers", justify="right")
    perplexity = any(row.perplexity is not None for row in result.models)  # --stream's
    for task in [*tasks, *(["perplexity"] if perplexity else [])]:
        grid.add_column(task, justify="right")
    grid.add_column("generation agreement", justify="right")
    for row in result.models:
        scores = {score.task: score for score in row.scores}
        ppl = ["-" if row.perplexity is None else f"{row.perplexity:.4g}"] if perplexity else []
        grid.add_row(row.label, str(row.n_layers), *(score_cell(scores.get(t), base.get(t)) for t in tasks), *ppl,
                     agreement_cell(row.generation))
    return grid


def print_result(doc: dict[str, Any]) -> None:
    result = EvaluateResult.from_json(doc)
    console = WholeConsole()
    console.print(table(result))
    console.print(protocol_line(result.protocol, result.gen_tokens), highlight=False)
    for row in result.models:
        console.print(Text(f"{row.label}: {row.description}"), highlight=False)


def summary(result: EvaluateResult, command: str = "") -> Group:
    """The console's side-by-side table, the protocol, and each variant's first continuation."""
    lines: list[RenderableType] = [table(result), protocol_line(result.protocol, result.gen_tokens)]
    if result.prompts:
        lines.append(Text(f"first prompt: {result.prompts[0]!r}", style="italic"))
        for row in result.models:
            if row.generation is not None and row.generation.texts:
                lines.append(Text(f"  {row.label}: {row.generation.texts[0]!r}"))
    return Group(*lines)
