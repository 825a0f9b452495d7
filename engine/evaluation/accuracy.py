"""Zero-shot accuracy through lm-eval-harness, and a greedy generation check beside it.

Perplexity alone misleads (ShortGPT's own tables show a cut whose perplexity barely moves while a
task collapses), so `evaluate` and `prune --evaluate-tasks` put the field's yardstick next to it:
lm-eval's own `simple_evaluate` on the model object in memory (`HFLM(pretrained=model)`), so a cut
made in place (`engine.models.pruning.removed`) is what it scores and the numbers are lm-eval's, not a
re-implementation. lm-eval is an optional extra (`pip install 'anatomy-tui[eval]'`), imported only
here and only when a run asks for accuracy.

The generation check (engine/evaluation/judging.py) greedily continues a few fixed prompts
(`PROMPTS`) with the original model and a variant (`engine.evaluation.generation.greedy_tokens`) and
says how much of the original's continuation the variant reproduces: up to its first divergence, and
position by position.

Choice tasks hold up under pruning where generation does not (ShortGPT's XSum, arXiv 2602.01997's
GSM8K), so where accuracy is asked for a generative task runs beside the choice tasks by default
(`--gen-task`, on; `--no-gen-task` leaves it out): `exact_facts`, 30 short factual and arithmetic
questions of this package (engine/evaluation/tasks/exact_facts.jsonl) with one-word or one-number
answers, lm-eval's `generate_until` after a fixed three-question prompt, greedy, stopped at a new
line or a full stop, scored by exact match (`exact_match`: leading and trailing white space
dropped, case and punctuation ignored; `exact_match_of` says the same in Python).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import string
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.settings import Settings, setting
from engine.disk.atomic import atomic_write_bytes

INSTALL = "pip install 'anatomy-tui[eval]'  (or: pip install 'lm-eval>=0.4.5' 'datasets>=2.19')"
PROMPTS = (
    "The capital of France is",
    "Water freezes at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colours are",
    "To make a cup of tea, first",
)
GEN_TASK = "exact_facts"  # the built-in generative task (engine/evaluation/tasks)
GEN_DATA = Path(__file__).parent / "tasks" / f"{GEN_TASK}.jsonl"
GEN_PROMPT = ("Answer each question with one word or one number.\n\n"
              "Question: What is the capital of Italy?\nAnswer: Rome\n\n"
              "Question: What is 2 plus 2?\nAnswer: 4\n\n"
              "Question: What colour is the sky on a clear day?\nAnswer: blue\n\n")
GEN_TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
description: {prompt}
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 10
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: ["^\\\\s+", "\\\\s+$"]
metadata:
  version: 1.0
"""
ACCURACY_DROP = 5.0  # points: a task's accuracy fell this much ...
PPL_STEADY = 0.10  # ... while perplexity moved less than this fraction (or the reverse): they disagree


@dataclass(frozen=True)
class LmEvalSettings(Settings):
    """lm-eval's settings that `evaluate` and `prune --evaluate-tasks` share (each adds its tasks
    and batch size under its own flag names)."""

    include_path: str | None = setting(None, "folder of local lm-eval task YAMLs (beside lm-eval's own tasks)")
    limit: float | None = setting(None, "lm-eval: at most this many items per task (below 1: this fraction of them)",
                                  above=0.0, none_word="all")
    num_fewshot: int | None = setting(None, "lm-eval: examples in each prompt (default: each task's own, mostly 0)",
                                      low=0, none_word="task")
    gen_task: bool = setting(True, f"with accuracy: also run the built-in generative task {GEN_TASK} (30 short "
                                   "questions, greedy answers, exact match) beside the tasks named")
    gen_tokens: int = setting(32, "generation check: greedy tokens per fixed prompt, beside the original's (0: none)",
                              low=0)

    def check_include_path(self) -> None:
        if self.include_path is not None and not Path(self.include_path).is_dir():
            raise UserError(f"--include-path {self.include_path}: not a folder of lm-eval task YAMLs")


def builtin_task_folder() -> Path:
    """A folder holding the built-in generative task's YAML, pointing at the packaged data (lm-eval's
    json builder wants an absolute path, so the YAML is written where this package is installed)."""
    data = str(GEN_DATA.resolve())
    text = GEN_TASK_YAML.format(name=GEN_TASK, data=json.dumps(data), prompt=json.dumps(GEN_PROMPT))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]  # one folder per installed copy and version
    folder = Path(tempfile.gettempdir()) / f"anatomy-tui-lm-eval-{digest}"
    path = folder / f"{GEN_TASK}.yaml"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, text.encode("utf-8"), "lm-eval task")
    return folder


def exact_match_of(prediction: str, answer: str) -> bool:
    """The task's exact match, as its YAML asks lm-eval for it: white space at either end dropped,
    case and punctuation ignored."""
    def norm(text: str) -> str:
        text = re.sub(r"\s+$", "", re.sub(r"^\s+", "", text)).lower()
        return text.translate(str.maketrans("", "", string.punctuation))

    return norm(prediction) == norm(answer)


def _lm_eval() -> Any:
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM  # noqa: F401  (the model wrapper, checked here once)
    except ImportError:
        raise UserError(f"zero-shot accuracy needs lm-eval: {INSTALL}") from None
    return lm_eval


def _limit(limit: float | None) -> int | float | None:
    """lm-eval reads an int as a count and a float below 1 as a fraction."""
    return int(limit) if limit is not None and limit >= 1 else limit


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval logs each step at INFO and warns that it was handed a model object (as meant):
    the console's log would fill with it."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def without_machine_report() -> Iterator[None]:
    """simple_evaluate attaches a report of the machine to every result (torch's collect_env: pip,
    nvidia-smi and other subprocesses, 5-20 s on a busy CPU), the scores do not depend on it, and
    a prune curve calls it once per cut: it is left out (lm-eval's `add_env_info`, where it has one)."""
    import lm_eval.evaluator as evaluator

    saved = getattr(evaluator, "add_env_info", None)
    if saved is None:
        yield
        return
    evaluator.add_env_info = lambda storage: None
    try:
        yield
    finally:
        evaluator.add_env_info = saved


class Harness:
    """lm-eval, set up once for a run: the task index (only the local folder's when every task is
    there: lm-eval's own index of thousands of YAMLs takes seconds to build) and the settings."""

    def __init__(self, tasks: Sequence[str], batch_size: int, settings: LmEvalSettings) -> None:
        if not tasks:
            raise UserError("no lm-eval task given: e.g. --tasks piqa,arc_easy (local ones with --include-path)")
        settings.check_include_path()
        lm_eval = _lm_eval()
        from lm_eval.tasks import TaskManager

        self.tasks = list(tasks) + ([GEN_TASK] if settings.gen_task and GEN_TASK not in tasks else [])
        self.batch_size = batch_size
        self.settings = settings
        self.version = str(getattr(lm_eval, "__version__", "unknown"))
        paths = [path for path in (settings.include_path,) if path is not None]
        if GEN_TASK in self.tasks:
            paths.append(str(builtin_task_folder()))
        with _quiet():
            manager = None
            if paths:
                manager = TaskManager(include_path=paths, include_defaults=False)
                if not set(self.tasks) <= set(manager.all_tasks):
                    manager = None
            if manager is None:
                manager = TaskManager(include_path=paths or None)
        unknown = [task for task in self.tasks if task not in manager.all_tasks]
        if unknown:
            raise UserError(f"unknown lm-eval task {unknown[0]!r}"
                            + ("" if settings.include_path else "; local task YAMLs go in --include-path DIR"))
        self.manager = manager
        self.last: dict[str, Any] = {}

    def scores(self, model: Any, tokenizer: Any) -> list[TaskScore]:
        """lm-eval's scores of `model` as it is now (a cut in place included), one row per task and
        group it reports."""
        import lm_eval
        from lm_eval.models.huggingface import HFLM

        with _quiet(), without_machine_report():
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.batch_size)
            try:
                out = lm_eval.simple_evaluate(model=lm, tasks=self.tasks, num_fewshot=self.settings.num_fewshot,
                                              limit=_limit(self.settings.limit), task_manager=self.manager,
                                              log_samples=False)
            except (FileNotFoundError, ConnectionError, OSError, ValueError) as exc:
                raise UserError(f"lm-eval could not run {','.join(self.tasks)}: {_one_line(exc)}") from None
        self.last = out
        return task_scores(out)

    def protocol(self) -> LmEvalProtocol:
        """What the numbers depend on (the last run's shots per task and task versions included)."""
        return LmEvalProtocol(
            tasks=self.tasks, batch_size=self.batch_size, limit=self.settings.limit,
            num_fewshot=self.settings.num_fewshot,
            include_path=os.path.abspath(self.settings.include_path) if self.settings.include_path else None,
            lm_eval_version=self.version,
            n_shot={k: int(v) for k, v in (self.last.get("n-shot") or {}).items()},
            task_versions={k: v for k, v in (self.last.get("versions") or {}).items()},
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def task_scores(out: dict[str, Any]) -> list[TaskScore]:
    """`simple_evaluate`'s results as rows: acc and acc_norm with their standard errors under
    lm-eval's default filter ('none'), None where the task has no such metric; a generative task's
    exact match; every numeric metric as lm-eval names it."""
    rows = []
    samples = out.get("n-samples") or {}
    for task, found in (out.get("results") or {}).items():
        metrics = {key: float(value) if value == value else None for key, value in found.items()  # NaN: None
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key}
        pick = {name: metrics.get(f"{name},none") for name in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
        matches = [key for key in metrics if key.startswith("exact_match,")]  # GSM8K: strict-match, flexible-extract
        exact = next((metrics[key] for key in ("exact_match,none", "exact_match,strict-match", *sorted(matches))
                      if key in metrics), ABSENT)
        rows.append(TaskScore(task=task, **pick,
                              samples=int((samples.get(task) or {}).get("effective", 0)), metrics=metrics,
                              exact_match=exact))
    return rows


@dataclass(frozen=True)
class TaskScore:
    """One lm-eval task (or group) scored on one model: accuracy and length-normalised accuracy with
    their standard errors under lm-eval's default filter (None where the task has no such metric),
    the items scored, and every numeric metric as lm-eval names it (`acc,none`). A generative task
    (exact_facts, GSM8K) has no acc: its `exact_match` (absent from choice tasks' documents)."""

    task: str
    acc: float | None
    acc_stderr: float | None
    acc_norm: float | None
    acc_norm_stderr: float | None
    samples: int
    metrics: dict[str, float | None]
    exact_match: float | None = field(default=ABSENT, kw_only=True)

    @property
    def score(self) -> float | None:
        """acc, else a generative task's exact match."""
        if self.acc is not None:
            return self.acc
        return None if self.exact_match is ABSENT else self.exact_match


@dataclass(frozen=True)
class GenerationCheck:
    """Greedy continuations of the fixed prompts (engine/evaluation/accuracy.py PROMPTS) by one model, and how
    much of the original's they reproduce: up to the first divergence (`prefix_agreement`) and
    position by position (`token_agreement`), as fractions of the longer continuation, counted in
    tokens, or in characters where the model's tokenizer is not the original's (`unit`)."""

    texts: list[str]
    unit: str
    prefix_agreement: float
    token_agreement: float


@dataclass(frozen=True)
class LmEvalProtocol:
    """What lm-eval's numbers depend on, recorded with them: two evaluations compare only when
    these match (the batch size too: lm-eval's scores move with it)."""

    tasks: list[str]
    batch_size: int
    limit: float | None
    num_fewshot: int | None  # None: each task's own
    include_path: str | None
    lm_eval_version: str
    n_shot: dict[str, int]  # as lm-eval ran each task
    task_versions: dict[str, Any]
