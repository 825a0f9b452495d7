"""The evaluation table as bars: each task's accuracy (exact match for a generative task) for
every model evaluated, with lm-eval's standard errors, and the generation check's token agreement
with the original beside it."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.core.codec import ABSENT
from engine.evaluation.accuracy import TaskScore
from engine.experiments.evaluate.vocabulary import EvaluateResult
from figures import style


def score(task: TaskScore | None) -> tuple[float | None, float | None]:
    """(accuracy, standard error): acc, else exact match (a generative task)."""
    if task is None:
        return None, None
    if style.finite(task.acc):
        return task.acc, task.acc_stderr
    exact = None if task.exact_match is ABSENT else task.exact_match
    return exact, None


def draw(result: EvaluateResult) -> Figure:
    tasks = list(dict.fromkeys(s.task for m in result.models for s in m.scores))
    by_model = {m.label: {s.task: s for s in m.scores} for m in result.models}
    generation = [(m, check) for m in result.models if (check := m.generation) is not None]
    fig = style.figure(height=2.1)
    axes = fig.subplots(1, 2, width_ratios=(max(len(tasks), 1) + 1, 1.6)) if generation else [fig.subplots()]
    values = {label: [score(scores.get(t))[0] for t in tasks] for label, scores in by_model.items()}
    errors = {label: [score(scores.get(t))[1] for t in tasks] for label, scores in by_model.items()}
    style.grouped_bars(axes[0], tasks, values, errors)
    axes[0].set_ylabel("accuracy")
    axes[0].set_ylim(0, 1)
    axes[0].set_xlabel("task")
    axes[0].set_title(f"{result.model}: lm-eval {result.protocol.lm_eval_version}")
    axes[0].legend(loc="upper right", fontsize=5)
    if generation:
        gen = axes[1]
        for index, (model, check) in enumerate(generation):
            gen.bar(index, check.token_agreement, **style.bar_look(result.models.index(model)))
        gen.set_xticks(range(len(generation)), [m.variant for m, _ in generation], rotation=30, ha="right")
        gen.set_ylim(0, 1)
        gen.set_ylabel("token agreement with original")
        gen.set_title("greedy text")
    return fig
