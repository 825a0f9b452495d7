"""Judging a cut beside its perplexity: the greedy generation check (how much of the original's
continuation of the fixed prompts a variant reproduces), whether accuracy and perplexity tell
different stories, and what `prune --evaluate-tasks` adds to each row of its curve (`CutJudge`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.evaluation.accuracy import (
    ACCURACY_DROP,
    PPL_STEADY,
    PROMPTS,
    GenerationCheck,
    Harness,
    TaskScore,
)


def continuations(model: Any, tokenizer: Any, tokens: int) -> list[list[int]]:
    """The greedy continuation of each fixed prompt, as token ids."""
    from engine.evaluation.generation import greedy_tokens

    return [greedy_tokens(model, tokenizer, prompt, tokens) for prompt in PROMPTS]


def agreement(reference: Sequence[Sequence[Any]], other: Sequence[Sequence[Any]]) -> tuple[float, float]:
    """(up to the first divergence, position by position): the fraction of the reference's and the
    other's longer continuation that matches, summed over the prompts. Both 1.0 for identical
    continuations (and for no continuations at all)."""
    total = prefix = same = 0
    for a, b in zip(reference, other, strict=True):
        matches = [x == y for x, y in zip(a, b, strict=False)]
        total += max(len(a), len(b))
        same += sum(matches)
        prefix += next((i for i, match in enumerate(matches) if not match), len(matches))
    return (prefix / total, same / total) if total else (1.0, 1.0)


def generation_check(tokenizer: Any, reference: Sequence[Sequence[int]], ids: Sequence[Sequence[int]],
                     other_tokenizer: Any = None) -> GenerationCheck:
    """The check of one model's continuations `ids` against the original's `reference`; with a
    different tokenizer (growth's character models) the decoded texts are compared character by
    character."""
    texts = [(other_tokenizer or tokenizer).decode(list(row)) for row in ids]
    if other_tokenizer is None:
        prefix, same = agreement(reference, ids)
        unit = "token"
    else:
        prefix, same = agreement([tokenizer.decode(list(row)) for row in reference], texts)
        unit = "character"
    return GenerationCheck(texts=texts, unit=unit, prefix_agreement=prefix, token_agreement=same)


def disagreement(ppl: float | None, baseline_ppl: float, scores: Sequence[TaskScore],
                 baseline: Sequence[TaskScore]) -> str | None:
    """Where a cut's perplexity and accuracy tell different stories: perplexity moved less than 10 %
    while some task's accuracy fell more than 5 points, or perplexity moved 10 % or more while no
    task's accuracy fell more than 5 points. A generative task counts by its exact match, and a cut
    whose perplexity holds while it fails says so ("generation fails"). None when they agree (or
    accuracy is missing)."""
    before = {row.task: row.score for row in baseline if row.score is not None}
    drops = {row.task: 100.0 * (before[row.task] - row.score) for row in scores
             if row.score is not None and row.task in before}
    if not drops:
        return None
    moved = abs(ppl / baseline_ppl - 1.0) if ppl is not None else float("inf")
    task, worst = max(drops.items(), key=lambda item: item[1])
    generative = {row.task for row in scores if row.acc is None and row.score is not None}
    if moved < PPL_STEADY and worst > ACCURACY_DROP:
        what = (f"generation fails ({task} exact match" if task in generative else f"accuracy falls ({task}")
        return f"{what} -{worst:.1f} points) while perplexity moves {100 * moved:.1f} %"
    if moved >= PPL_STEADY and worst <= ACCURACY_DROP:
        shown = "inf" if moved == float("inf") else f"{100 * moved:.0f} %"
        return f"perplexity moves {shown} while no task's accuracy falls more than {ACCURACY_DROP:g} points"
    return None


class CutJudge:
    """What `prune --evaluate-tasks` adds to each row of its curve: lm-eval's scores of the cut (and
    of the healed cut), the generation check against the full model, and whether accuracy and
    perplexity disagree. Each cut is scored once however many criteria choose it."""

    def __init__(self, harness: Harness, model: Any, tokenizer: Any, gen_tokens: int) -> None:
        self.harness = harness
        self.tokenizer = tokenizer
        self.gen_tokens = gen_tokens
        self.baseline = harness.scores(model, tokenizer)
        self.reference = continuations(model, tokenizer, gen_tokens) if gen_tokens else None
        self._cuts: dict[tuple[int, ...], tuple[list[TaskScore], GenerationCheck | None]] = {}
        self._healed: dict[tuple[int, ...], list[TaskScore]] = {}

    def cut(self, model: Any, layers: tuple[int, ...]) -> tuple[list[TaskScore], GenerationCheck | None]:
        """Scores and generation check of `model` as it is now, the cut `layers` (call inside
        `removed(model, layers)`)."""
        if layers not in self._cuts:
            scores = self.harness.scores(model, self.tokenizer)
            check = (generation_check(self.tokenizer, self.reference, continuations(model, self.tokenizer,
                                                                                    self.gen_tokens))
                     if self.reference is not None else None)
            self._cuts[layers] = (scores, check)
        return self._cuts[layers]

    def healed(self, model: Any, layers: tuple[int, ...]) -> list[TaskScore]:
        """Scores of the healed cut (call inside the healing block)."""
        if layers not in self._healed:
            self._healed[layers] = self.harness.scores(model, self.tokenizer)
        return self._healed[layers]

    def row(self, layers: tuple[int, ...], ppl: float | None, baseline_ppl: float) -> dict[str, Any]:
        """The row's fields (PruneCut's accuracy, healed_accuracy, generation, disagreement)."""
        scores, check = self._cuts[layers]
        return {"accuracy": scores, "healed_accuracy": self._healed.get(layers), "generation": check,
                "disagreement": disagreement(ppl, baseline_ppl, scores, self.baseline)}

    def result(self) -> dict[str, Any]:
        """PruneResult's fields: the protocol and the full model's scores."""
        return {"evaluation": self.harness.protocol(), "baseline_accuracy": self.baseline}


def accuracy_line(scores: Sequence[TaskScore]) -> str:
    """task acc (acc_norm) in percent, for a log line."""
    return ", ".join(f"{row.task} {100 * row.score:.1f}" + (f" ({100 * row.acc_norm:.1f})" if row.acc_norm is not None
                                                             else "") + (" EM" if row.acc is None else "")
                     for row in scores if row.score is not None) or "no acc"

