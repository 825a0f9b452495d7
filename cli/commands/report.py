"""`anatomy-tui report SESSION [--out DIR] [--format html,md,pdf | --pdf]`: a session's results as a paper
appendix. For every result its figure (figures/, drawn from the typed result) as PNG and SVG files
in DIR, and in the report its tables (the result's scalars and per-layer rows), its settings and
protocol, the model, the package versions and the exact command that reproduces it.

    DIR/report.html   self-contained: the figures embedded as data URIs (mail it, open it offline)
    DIR/report.md     the same text, the figures linked as the files beside it
    DIR/report.pdf    every figure, one a page (matplotlib PdfPages)
    DIR/<result>.png, DIR/<result>.svg

Nothing read from the session is trusted: every text is escaped in the HTML and in the Markdown
(entities and backslashes, one line, code in a fence no text can close, links only to the files
beside it); a result that does not fit this version's class, or holds more rows than the model it
names has layers, is left out with a note, so the time and memory a report takes are bounded by
what it draws. The report is written whole or not at all: every file into a staging folder inside
DIR, moved over the old ones once all are written (engine/disk/staging.py), so a full disk or a kill
leaves the previous report as it was. The pages are written by cli/commands/report_pages.py, the
sizes checked by cli/commands/report_limits.py.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cli.argv import run_argv, typed
from cli.commands.report_limits import size_problem
from cli.commands.report_pages import Entry, html_report, markdown_report
from engine import registry
from engine.atlas.table import AtlasDocument
from engine.core.errors import UserError
from engine.core.events import result_class
from engine.core.process import say
from engine.disk.atomic import is_no_space, mount_point
from engine.disk.staging import staged
from engine.models.options import ModelOptions
from sessions.documents import Damaged, JobRecord, typed_result
from sessions.store import Session

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("html", "md", "pdf")
EXTRA = "pip install 'anatomy-tui[figures]'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", help="the session to report")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for the report and its figures (default: ./SESSION-report)")
    parser.add_argument("--format", default=None, metavar="LIST",
                        help=f"comma-separated: {', '.join(FORMATS)} (default: all; the figures' PNG and SVG "
                             "files are always written)")
    parser.add_argument("--pdf", action="store_true",
                        help="only report.pdf, every figure one a page (the same as --format pdf)")


def parse_formats(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UserError(f"--format {text}: unknown format {', '.join(unknown) or '(none)'}; choose from "
                        f"{', '.join(FORMATS)}")
    return chosen


def output_folder(text: str | None, session: str) -> tuple[Path, bool]:
    """The report's folder, made if needed (and whether it was made now), or a one-line UserError:
    a file, or not writable."""
    folder = Path(text if text is not None else f"{session}-report").expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out {folder} is a file, not a folder; give a folder for the report")
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {folder} cannot be made ({exc.strerror}); choose another folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"--out {folder} is not writable; choose another folder")
    return folder, made


def experiment_of(name: str) -> registry.Experiment | None:
    """The registry row that writes results/<name>.json (ablation's proxies-only map: ablation)."""
    cls = result_class(name)
    return next((e for e in registry.EXPERIMENTS if cls is not None and e.result_class.__module__ == cls.__module__),
                None)


def reproducing_command(name: str, result: Any, session: Session, jobs: Mapping[str, JobRecord]) -> str:
    """`anatomy-tui run ...` with the settings of the newest finished job of the result's experiment
    (else the result's own settings) and its model flags; an atlas: the compare that redraws it."""
    if isinstance(result, AtlasDocument):
        return f"anatomy-tui compare --atlas {result.name}"
    entry = experiment_of(name)
    if entry is None:
        return "(no registered experiment writes this result)"
    done = [job for job in jobs.values() if job.experiment == entry.name and job.status in ("done", "resumed")]
    job = max(done, key=lambda job: job.started, default=None)
    try:
        settings = (entry.settings_class.from_dict(job.settings or {}, base=entry.defaults())
                    if job is not None else getattr(result, "settings", None))
        if not isinstance(settings, entry.settings_class):
            return "(cannot be rebuilt: no job file of it and no settings in the result)"
        options = None
        if entry.needs_model:
            recorded = (job.model if job is not None else None) or {"model": session.header.model}
            options = ModelOptions.from_dict(recorded).untrusted()
        # the command as run anywhere: no --shards from the GPUs of the machine that writes the report
        return typed([*run_argv(entry.name, settings, options), "--session", session.name])
    except (UserError, TypeError, ValueError) as exc:
        return f"(cannot be rebuilt: {exc})"


def entries(session: Session) -> tuple[list[Entry], list[str]]:
    """The session's results that this version reads (sessions/documents.py: each as its class), in
    the registry's order, and a note for each one it cannot read or that is larger than its model
    allows (`size_problem`: "damaged")."""
    docs = session.results()  # as written: their sizes are checked before anything reads their rows
    notes = list(session.damage)
    jobs = session.job_records()
    order = {e.writes: i for i, e in enumerate(registry.EXPERIMENTS)}
    found = []
    for name in sorted(docs, key=lambda n: (order.get(n, len(order)), n)):
        damage = size_problem(name, docs[name])
        if damage:
            notes.append(f"results/{name}.json left out, damaged: {damage}")
            continue
        try:
            result = typed_result(name, docs[name], f"results/{name}.json")
        except Damaged as exc:
            notes.append(f"results/{name}.json left out: {exc.why}")
            continue
        found.append(Entry(name, result, docs[name], reproducing_command(name, result, session, jobs)))
    return found, notes


def import_figures() -> ModuleType:
    """The figures package, or the one line naming the extra when matplotlib is not installed."""
    try:
        from matplotlib.backends import backend_pdf  # noqa: F401  report.pdf's, checked before any drawing

        import figures
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        raise UserError(f"the report draws its figures with matplotlib, which is not installed: {EXTRA}") from None
    return figures


def draw(found: Sequence[Entry], staging: Path, notes: list[str]) -> dict[str, Figure]:
    """Each result's figure, written as PNG and SVG into the staging folder, one progress line on
    stderr per figure; a kind without a figure module gets a note (its tables stay)."""
    figures = import_figures()
    drawn = {}
    for number, entry in enumerate(found, 1):
        progress(f"anatomy-tui report: drawing {entry.name} ({number} of {len(found)})")
        try:
            fig = figures.figure_for(entry.result)
        except UserError as exc:  # a result kind without a figure module (an experiment added since)
            if "no figure is drawn" not in str(exc):
                raise
            notes.append(f"{entry.name}: {exc}; its tables are below")
            continue
        for fmt in ("png", "svg"):
            figures.write_figure(fig, staging / f"{entry.name}.{fmt}", fmt)
        drawn[entry.name] = fig
    return drawn


def write_report(staging: Path, formats: Sequence[str], session: Session, found: Sequence[Entry],
                 notes: Sequence[str], drawn: Mapping[str, Figure]) -> list[str]:
    """report.html, .md and .pdf as `formats` asks, into the staging folder; their names."""
    written = []
    if "html" in formats:
        pngs = {name: (staging / f"{name}.png").read_bytes() for name in drawn}
        (staging / "report.html").write_text(html_report(session, found, notes, pngs), encoding="utf-8")
        written.append("report.html")
    if "md" in formats:
        (staging / "report.md").write_text(markdown_report(session, found, notes, drawn), encoding="utf-8")
        written.append("report.md")
    if "pdf" in formats:
        import matplotlib
        from matplotlib.backends.backend_pdf import PdfPages

        from figures.style import DPI, RC

        progress(f"anatomy-tui report: writing report.pdf ({len(drawn)} figures)")
        with matplotlib.rc_context(RC), PdfPages(staging / "report.pdf") as pages:
            for fig in drawn.values():
                pages.savefig(fig, dpi=DPI)
        written.append("report.pdf")
    return written


def progress(line: str) -> None:
    """A line on stderr; a reader gone (`2>&1 | head -1`) stops the lines, never the report: the rest
    go to the null device (the paths then printed on stdout end the command as cli/main.py does)."""
    try:
        say(line)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def main(args: argparse.Namespace) -> int:
    from sessions.store import SessionStore

    if args.pdf and args.format is not None:
        raise UserError(f"--pdf is short for --format pdf; give one of them (--format {args.format},pdf for both)")
    formats = ("pdf",) if args.pdf else parse_formats(args.format or ",".join(FORMATS))
    import_figures()
    store = SessionStore()
    store.check_home(writing=False)
    session = store.open(args.session)
    found, notes = entries(session)
    if not found:
        why = f" ({notes[0]}{f'; and {len(notes) - 1} more' if notes[1:] else ''})" if notes else ""
        raise UserError(f"session {session.name!r} has no results to report{why}; run an experiment into it first "
                        f"(anatomy-tui run ablation --session {session.name})")
    for note in notes:  # each on one line: a control character from the session escaped as repr writes it
        progress(f"anatomy-tui report: {repr(note)[1:-1]}")
    folder, made = output_folder(args.out, session.name)
    files = [*(f"report.{f}" for f in FORMATS), *(f"{entry.name}.{f}" for entry in found for f in ("png", "svg"))]
    leftovers = [f".{glob.escape(file)}.{'?' * 8}.tmp" for file in files]  # an older version's killed atomic writes
    try:
        with staged(folder, "report", leftovers) as staging:
            drawn = draw(found, staging, notes)
            written = write_report(staging, formats, session, found, notes, drawn)
    except BaseException as exc:
        if made:  # a folder made for this report is not left behind empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if is_no_space(exc):
            kept = "nothing was written" if made else "the report there is as it was"
            raise UserError(f"no space left on {mount_point(folder)} writing the report to {folder}; {kept}: free "
                            "some space and run again") from None
        raise
    for name in written:
        print(folder / name)
    print(f"{len(drawn)} figures (PNG, SVG) in {folder}")
    return 0
