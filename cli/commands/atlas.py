"""`anatomy-tui atlas --models A,B,C --name ATLAS`: the same measures of many models on one
protocol, each model's in its own session, merged on relative depth (engine/atlas/table.py), kept in the
atlas's session (sessions/atlas.py) and exported as a dataset (engine/atlas/dataset.py).

Each measure runs through `anatomy-tui run <experiment>` itself (the `run` callable the command
line hands in: the same parser, memory plan, model load and session writes), one model at a time,
or is reused when a session of the store already holds it with the same settings. Run again after a
kill, an atlas continues with the first measure no session holds yet. Stopped by a signal (Ctrl-C,
SIGTERM, SIGHUP), it says which measure was interrupted, marks that step interrupted in its state (the
run's job in the model's session reads interrupted too) and exits 128 + the signal (130, 143, 129); a
recovery measure interrupted so is continued with --resume by the next run of the atlas. Two identical
atlases started at once both work: the second joins the atlas session the first made.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.flags import add_settings_arguments, cluster_arguments, flag_text, settings_from_flags
from cli.flags import model_flags as flags_of_model
from engine.atlas import table as A
from engine.core.errors import UserError
from engine.core.process import STOP_EXIT_CODES, exit_code, interruption, say
from engine.data.text_settings import EvalTextSettings
from engine.models.options import ModelOptions
from engine.registry import experiment as experiment_named

if TYPE_CHECKING:
    from engine.cluster import Cluster

MODEL_FLAGS = tuple(spec.name for spec in ModelOptions.fields() if spec.name != "model")
EVAL_FIELDS = tuple(spec.name for spec in EvalTextSettings.fields())
TEXTS = "texts"  # the atlas's calibration texts, under its checkpoints/atlas/


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", required=True, metavar="A,B,C",
                        help="the models: smollm2-135m, local Hugging Face folders, .gguf files or hub ids")
    parser.add_argument("--name", required=True, help="the atlas's name: its session, and the prefix of its "
                        "models' sessions (<name>-<model>)")
    parser.add_argument("--measures", default="map,proxies", metavar="LIST",
                        help=f"comma-separated, of {', '.join(A.MEASURES)} (default map,proxies)")
    parser.add_argument("--calib-seeds", type=int, default=0, metavar="K",
                        help="also measure on K seeded halves of the evaluation texts, for each measure's rank "
                        f"stability (Spearman; stable when at least {A.STABLE_RHO} on each) (default 0)")
    parser.add_argument("--calib-file", action="append", default=[], metavar="FILE",
                        help="also measure on this evaluation text (one text a line); may be repeated")
    parser.add_argument("--bins", type=int, default=A.DEFAULT_BINS, metavar="N",
                        help=f"relative-depth bins for the shared bands and profiles (default {A.DEFAULT_BINS})")
    cluster_arguments(parser)
    taken = {"--models", "--name", "--measures", "--calib-seeds", "--calib-file", "--bins", "--cluster", "--retries",
             "-h", "--help"}
    add_settings_arguments(parser.add_argument_group("evaluation text (as for run ablation)"), EvalTextSettings(),
                           taken)
    add_settings_arguments(parser.add_argument_group("model (each model loads with these)"), ModelOptions(), taken,
                           only=MODEL_FLAGS)


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """What the atlas is, as typed: compared with the spec it was started with when it runs again."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise UserError("--models: name at least one model")
    if len(set(models)) != len(models):
        raise UserError(f"--models {args.models}: a model is named twice")
    measures = list(A.parse_measures(args.measures))
    if measures == ["recovery-sample"]:
        raise UserError("--measures recovery-sample needs another measure too (map, say): it picks its layers "
                        "from the model's depth, which the other measures record")
    if args.calib_seeds < 0 or args.bins < 1:
        raise UserError("--calib-seeds must be 0 or more and --bins at least 1")
    evaluation = {name: getattr(args, name) for name in EVAL_FIELDS if hasattr(args, name)}
    if args.calib_seeds and evaluation.get("eval_dataset"):
        raise UserError("--calib-seeds halves a text list (--eval-set or --eval-file); with --eval-dataset give "
                        "a second text with --calib-file")
    return {"models": models, "measures": measures, "evaluation": evaluation,
            "model_flags": {name: getattr(args, name) for name in MODEL_FLAGS  # those that differ from the defaults
                            if hasattr(args, name) and getattr(args, name) != getattr(ModelOptions(), name)},
            "calib_seeds": args.calib_seeds, "calib_files": [str(Path(f).resolve()) for f in args.calib_file],
            "bins": args.bins}


def variants_of(spec: dict[str, Any], texts: Path) -> dict[str, dict[str, Any]]:
    """Variant name -> its evaluation settings: main, a seeded half of the main texts per calibration
    seed (written into the atlas's folder), and each --calib-file."""
    from engine.core.files import read_lines
    from engine.data.text import eval_texts
    from engine.disk.atomic import atomic_write_bytes

    main = dict(spec["evaluation"])
    variants = {A.MAIN: main}
    if spec["calib_seeds"]:
        lines = eval_texts(Path(main["eval_file"]) if main.get("eval_file") else None, main.get("eval_set", "full"))
        if len(lines) < 6:
            raise UserError(f"--calib-seeds needs at least 6 evaluation texts to halve; there are {len(lines)}")
        for seed in range(1, spec["calib_seeds"] + 1):
            half = sorted(random.Random(seed).sample(range(len(lines)), len(lines) // 2))
            path = texts / f"seed-{seed}.txt"
            atomic_write_bytes(path, ("\n".join(lines[i] for i in half) + "\n").encode("utf-8"), "calibration text")
            variants[f"seed-{seed}"] = {**_without_text(main), "eval_file": str(path)}
    for file in spec["calib_files"]:
        read_lines(Path(file), "calibration file")
        stem = "".join(c if c.isalnum() else "-" for c in Path(file).stem)[:30]
        variants[f"file-{stem}"] = {**_without_text(main), "eval_file": file}
    return variants


def _without_text(evaluation: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evaluation.items() if k not in ("eval_set", "eval_file", "eval_dataset")}


def experiment_flags(experiment: str, evaluation: dict[str, Any], texts: Path) -> list[str]:
    """The evaluation settings as the flags of one experiment: those its settings have; dynamics
    reads its text from --text-file, so the evaluation file (or the built-in set, written out) goes
    there."""
    fields = {spec.name: spec for spec in experiment_named(experiment).settings_class.fields()}
    values = dict(evaluation)
    if "text_file" in fields and "eval_file" not in fields:
        if values.get("eval_file"):
            values["text_file"] = values["eval_file"]
        elif not values.get("eval_dataset"):
            values["text_file"] = str(_builtin_text(values.get("eval_set", "full"), texts))
        if values.get("eval_batch_size") is None:
            values.pop("eval_batch_size", None)
    return [flag_text(fields[name], value) for name, value in values.items() if name in fields]


def _builtin_text(eval_set: str, texts: Path) -> Path:
    from engine.data.text import eval_texts
    from engine.disk.atomic import atomic_write_bytes

    path = texts / f"builtin-{eval_set}.txt"
    atomic_write_bytes(path, ("\n".join(eval_texts(None, eval_set)) + "\n").encode("utf-8"), "evaluation text")
    return path


def main(args: argparse.Namespace, run: Callable[[list[str]], int]) -> int:
    """Runs or reuses every measure of every model, then merges, saves and exports the atlas.
    `run(argv)` is `anatomy-tui argv` (the exit code), handed in by cli/main.py."""
    from engine.atlas.dataset import write_dataset
    from sessions.atlas import member_name, open_atlas
    from sessions.documents import ATLAS_RESULT
    from sessions.store import SessionStore
    from tui.views.atlas import print_report

    spec = spec_of(args)
    cluster = _cluster_flags(args)  # connected now: no Ray, no cluster there, one line before any work
    store = SessionStore()
    atlas, state = open_atlas(store, args.name, spec, say)
    texts = atlas.checkpoint_dir(ATLAS_RESULT) / TEXTS
    variants = variants_of(spec, texts)
    model_flags = flags_of_model(ModelOptions().override(spec["model_flags"]))
    slugs: dict[str, str] = {}
    members = {(m, v): member_name(args.name, m, v, slugs) for m in spec["models"] for v in variants}
    for model, variant, experiment, _ in planned(spec, variants):  # the console's Compare view lists them all
        state.mark(model, variant, experiment, "waiting", members[model, variant])
    runs = _Runs(args.name, run, store, state, cluster)
    try:
        _measure(args, spec, variants, texts, model_flags, members, store, state, runs)
    except KeyboardInterrupt as stop:  # Ctrl-C, or a signal between two runs (stop_on_signals in cli/main.py)
        runs.stop(stop)
        return _interrupted(args.name, state, runs.doing, exit_code(stop))
    doc = merged(args.name, spec, variants, store, state)
    atlas.save_result(ATLAS_RESULT, doc.to_json())
    folder = write_dataset(doc, atlas.path / "dataset")
    print_report(doc)
    say(f"atlas {args.name}: {len(doc.rows)} rows in session {atlas.name}; dataset in {folder}")
    if runs.failed:
        say(f"atlas {args.name}: {len(runs.failed)} measure(s) failed ({'; '.join(runs.failed)}), the rest are in "
            "the table; run the same atlas command again to retry them")
        return 1
    return 0


def _cluster_flags(args: argparse.Namespace) -> tuple[Cluster, list[str]] | None:
    """With --cluster: the cluster connected, and the flags each measure's run gets (None without)."""
    if args.cluster is None:
        if args.retries is not None:
            raise UserError("--retries applies to tasks on a cluster; add --cluster local or auto")
        return None
    from engine.cluster import connect

    return connect(args.cluster), ["--cluster", args.cluster,
                                   *(["--retries", str(args.retries)] if args.retries is not None else [])]


def _interrupted(name: str, state: Any, doing: list[Step], code: int) -> int:
    """Measures stopped by Ctrl-C or a signal: their steps marked interrupted, said in one line, and
    the atlas's exit code 128 + the signal."""
    signum = code - 128
    by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
    again = "run the same atlas command again to continue from here"
    if not doing:
        say(f"atlas {name} interrupted{by} between two measures; {again}")
        return code
    for step in doing:
        with contextlib.suppress(OSError, UserError):
            state.done(step.model, step.variant, step.experiment, step.member, "interrupted")
    at = "; ".join(f"{step.model} · {step.experiment} on {step.variant}" for step in doing)
    sessions = ("their sessions " if len(doing) > 1 else "its session ") + ", ".join(step.member for step in doing)
    say(f"atlas {name} interrupted{by} at {at} (marked interrupted; {sessions}); {again}")
    return code


@dataclass(frozen=True)
class Step:
    """One measure that runs: `anatomy-tui run ARGV` into the model's session `member`."""

    model: str
    variant: str
    experiment: str
    member: str
    argv: list[str]


class _Runs:
    """The measures that run: one after another through `run` (`anatomy-tui run ...` in this
    process), or, with --cluster (`cluster`: the flags each run gets), all at once, each run by a
    thread of this driver as a Ray task whose events it writes into the model's session. The state
    is written here alone (the main thread), as each measure ends; a measure that fails on the
    cluster is said in one line by its run and the others go on (`failed`). `depth(model)` is the
    model's layer count from its first measure (a cluster's atlas waits for it: recovery's layers)."""

    def __init__(self, name: str, run: Callable[[list[str]], int], store: Any, state: Any,
                 cluster: tuple[Cluster, list[str]] | None) -> None:
        self.name, self.run, self.store, self.state = name, run, store, state
        self.cluster: Cluster | None
        self.flags: list[str]
        self.cluster, self.flags = cluster if cluster is not None else (None, [])
        self.doing: list[Step] = []  # the measures under way
        self.failed: list[str] = []
        self.depths: dict[str, int] = {}
        self.pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="atlas") if cluster else None
        self.pending: dict[Future[int], Step] = {}

    def start(self, step: Step) -> None:
        self.doing.append(step)
        self.state.mark(step.model, step.variant, step.experiment, "queued" if self.pool else "running", step.member,
                        "in the driver" if self.pool else "starting", _log_end(self.store, step.member))
        if self.pool is None:
            self._ended(step, self.run(step.argv))
        else:
            self.pending[self.pool.submit(self.run, [*step.argv, *self.flags])] = step

    def reused(self, model: str, variant: str, experiment: str) -> None:
        self._measured(model, variant, experiment)

    def depth(self, model: str) -> int:
        while model not in self.depths and any(step.model == model for step in self.pending.values()):
            self._next()
        return self.depths.get(model, 0)

    def join(self) -> None:
        while self.pending:
            self._next()
        if self.pool is not None:
            self.pool.shutdown()

    def stop(self, why: KeyboardInterrupt) -> None:
        """Ctrl-C or a signal: every task under way cancelled; those that ended first recorded as
        done, the others left in `doing` (marked interrupted by the caller)."""
        if self.pool is None or self.cluster is None:
            return
        self.cluster.cancel_all(why)
        for future, step in list(self.pending.items()):
            if future.cancel() or _code(future) != 0:  # never started, or stopped: the latter stay in `doing`
                if future.cancelled():
                    self.doing.remove(step)
                    self.state.mark(step.model, step.variant, step.experiment, "waiting", step.member)
                continue
            self.doing.remove(step)
            self.state.done(step.model, step.variant, step.experiment, step.member, "run")
        self.pending.clear()
        self.pool.shutdown()
        self.cluster.stopping = None

    def _next(self) -> None:
        done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        for future in done:
            self._ended(self.pending.pop(future), future.result())

    def _ended(self, step: Step, code: int) -> None:
        if code in STOP_EXIT_CODES:  # Ctrl-C, SIGTERM, SIGHUP: the run said so, its job interrupted
            raise interruption(code - 128)
        if code != 0 and self.pool is None:
            self.state.mark(step.model, step.variant, step.experiment, "failed", step.member, f"exit {code}")
            raise UserError(f"atlas {self.name}: {step.experiment} of {step.model} failed (exit {code}); "
                            "fix that, then run the same atlas command again to continue from here")
        self.doing.remove(step)
        if code != 0:  # its run said why in one line
            self.failed.append(f"{step.model} · {step.experiment} on {step.variant}")
            self.state.done(step.model, step.variant, step.experiment, step.member, "failed")
            return
        self.state.done(step.model, step.variant, step.experiment, step.member, "run")
        self._measured(step.model, step.variant, step.experiment)

    def _measured(self, model: str, variant: str, experiment: str) -> None:
        if variant == A.MAIN and not self.depths.get(model):
            self.depths[model] = _depth(self.store, self.state, model, variant, experiment)


MAX_IN_FLIGHT = 32  # measures an atlas has on a cluster at once (the rest wait in this driver)


def _code(future: Future[int]) -> int:
    """The exit code of a measure's run once it has ended (a run that raised: 1)."""
    try:
        return future.result()
    except Exception:
        return 1


def _measure(args: argparse.Namespace, spec: dict[str, Any], variants: dict[str, dict[str, Any]], texts: Path,
             model_flags: list[str], members: dict[tuple[str, str], str], store: Any, state: Any,
             runs: _Runs) -> None:
    """Each measure of each model and variant, reused or run (by `runs`)."""
    from sessions.atlas import reusable
    from sessions.job_runner import resumed_job

    for model, variant, experiment, wanted in planned(spec, variants):
        flags = A.experiment_flags(experiment, wanted) + experiment_flags(experiment, variants[variant], texts)
        if experiment == "recovery":
            flags += ["--layers", ",".join(map(str, A.sample_layers(runs.depth(model))))]
        settings = settings_from_flags(experiment_named(experiment), flags)
        settings.check_inputs()
        free = {s.name for s in settings.fields() if s.meta.get("resume_free")}
        what = f"atlas {args.name} [model {spec['models'].index(model) + 1}/{len(spec['models'])}] {model} · " \
               f"{experiment} ({', '.join(m for m in wanted if A.MEASURES[m].experiment == experiment)}) on {variant}"
        member = members[model, variant]
        writes = experiment_named(experiment).writes
        found = reusable(store, model, writes, settings.to_dict(), free, member, type(settings)().to_dict())
        if found is not None:
            say(f"{what}: reused from session {found.name}")
            previous = state.steps.get(state.key(model, variant, experiment), {})
            ran = previous.get("status") == "run" and previous.get("session") == found.name
            state.done(model, variant, experiment, found.name, "run" if ran else "reused")
            runs.reused(model, variant, experiment)
            continue
        previous = state.steps.get(state.key(model, variant, experiment), {})
        resume = (previous.get("status") == "interrupted" and experiment_named(experiment).resumable
                  and store.exists(member)
                  and resumed_job(store.open(member), experiment) is not None)
        say(f"{what}: {'resuming' if resume else 'running'} into session {member}")
        runs.start(Step(model, variant, experiment, member,
                        ["run", experiment, "--model", model, *model_flags, "--session", member, *flags,
                         *(["--resume"] if resume else [])]))
    runs.join()


def planned(spec: dict[str, Any], variants: dict[str, dict[str, Any]]) -> Iterator[tuple[str, str, str, list[str]]]:
    """Each step of the atlas in its order: (model, variant, experiment, the measures wanted of that
    variant: all on the main texts, those that read the evaluation text on a calibration variant)."""
    for model in spec["models"]:
        for variant in variants:
            wanted = [m for m in spec["measures"] if variant == A.MAIN or A.MEASURES[m].reads_eval_text]
            for experiment in A.experiments_of(wanted):
                yield model, variant, experiment, wanted


def _log_end(store: Any, name: str) -> int:
    """The size of session `name`'s event log (0 when there is none yet): the job of a measure
    started now follows it."""
    from sessions.store import SessionError

    try:
        if not store.exists(name):
            return 0
        info = os.lstat(store.open(name).events_path)
    except (OSError, SessionError, UserError):
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def _depth(store: Any, state: Any, model: str, variant: str, experiment: str) -> int:
    step = state.steps[state.key(model, variant, experiment)]
    doc = store.open(step["session"]).load_result(experiment_named(experiment).writes) or {}
    rows = A.rows_of(model, variant, step["session"], {experiment: doc})
    return max((row.n_layers for row in rows), default=0)


def merged(name: str, spec: dict[str, Any], variants: dict[str, dict[str, Any]], store: Any,
           state: Any) -> A.AtlasDocument:
    """The atlas document from the sessions its state names."""
    rows: list[A.AtlasRow] = []
    sessions: dict[str, dict[str, dict[str, str]]] = {}
    for model in spec["models"]:
        found: list[A.AtlasRow] = []
        for variant in variants:
            for experiment in A.experiments_of(spec["measures"]):
                step = state.steps.get(state.key(model, variant, experiment))
                if step is None:
                    continue
                sessions.setdefault(model, {}).setdefault(variant, {})[experiment] = step["session"]
                doc = store.open(step["session"]).load_result(experiment_named(experiment).writes)
                if doc is not None:
                    found += A.rows_of(model, variant, step["session"], {experiment: doc})
        rows += A.with_depth(found, max((row.n_layers for row in found), default=0))
    wanted = {c for m in spec["measures"] for c in A.MEASURES[m].criteria}
    rows = [row for row in rows if row.measure in wanted]
    return A.build(name, spec["models"], spec["measures"], sessions, variants, rows, spec["bins"])
