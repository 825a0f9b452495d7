"""`anatomy-tui report SESSION [--out DIR] [--format html,md,pdf | --pdf]`: a session's results as a paper
appendix. For every result its figure (figures/, drawn from the typed result) as PNG and SVG files
in DIR, and in the report its tables (the result's scalars and per-layer rows), its settings and
protocol, the model, the package versions and the exact command that reproduces it.

    DIR/report.html   self-contained: the figures embedded as data URIs (mail it, open it offline)
    DIR/report.md     the same text, the figures linked as the files beside it
    DIR/report.pdf    every figure, one a page (matplotlib PdfPages)
    DIR/<result>.png, DIR/<result>.svg

Nothing read from the session is trusted: every text is escaped in the HTML, a result that does not
fit this version's class is left out with a note, and files are written atomically.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import registry
from engine.atlas.table import AtlasDocument
from engine.core.errors import UserError
from engine.core.events import ResultDocument, decode_or_none, result_class
from engine.disk.atomic import atomic_write, atomic_write_bytes
from engine.models.options import ModelOptions
from sessions.store import Session
from tui.jobs import run_argv, typed

FORMATS = ("html", "md", "pdf")
ROW_LIMIT = 200  # rows of one table in the report (a 100-layer map stays readable)
Table = tuple[str, list[str], list[list[str]]]  # title, header, rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", help="the session to report")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for the report and its figures (default: ./SESSION-report)")
    parser.add_argument("--format", default=None, metavar="LIST",
                        help=f"comma-separated: {', '.join(FORMATS)} (default: all; the figures' PNG and SVG "
                             "files are always written)")
    parser.add_argument("--pdf", action="store_true",
                        help="only report.pdf, every figure one a page (the same as --format pdf)")


@dataclass(frozen=True)
class Entry:
    """One result of the session, read through its class, with what reproduces it."""

    name: str  # results/<name>.json
    result: ResultDocument | AtlasDocument
    doc: dict[str, Any]  # as stored
    command: str  # the command line that reproduces it, or why there is none


def parse_formats(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UserError(f"--format {text}: unknown format {', '.join(unknown) or '(none)'}; choose from "
                        f"{', '.join(FORMATS)}")
    return chosen


def output_folder(text: str | None, session: str) -> Path:
    """The report's folder, made if needed, or a one-line UserError: a file, or not writable."""
    folder = Path(text if text is not None else f"{session}-report").expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out {folder} is a file, not a folder; give a folder for the report")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {folder} cannot be made ({exc.strerror}); choose another folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"--out {folder} is not writable; choose another folder")
    return folder


def experiment_of(name: str) -> registry.Experiment | None:
    """The registry row that writes results/<name>.json (ablation's proxies-only map: ablation)."""
    cls = result_class(name)
    return next((e for e in registry.EXPERIMENTS if cls is not None and e.result_class.__module__ == cls.__module__),
                None)


def reproducing_command(name: str, result: Any, session: Session, jobs: Mapping[str, Mapping[str, Any]]) -> str:
    """`anatomy-tui run ...` with the settings of the newest finished job of the result's experiment
    (else the result's own settings) and its model flags; an atlas: the compare that redraws it."""
    if isinstance(result, AtlasDocument):
        return f"anatomy-tui compare --atlas {result.name}"
    entry = experiment_of(name)
    if entry is None:
        return "(no registered experiment writes this result)"
    done = [doc for doc in jobs.values() if doc.get("experiment") == entry.name and doc.get("status") in ("done",
                                                                                                       "resumed")]
    job = max(done, key=lambda doc: float(doc.get("started") or 0.0), default=None)
    try:
        settings = (entry.settings_class.from_dict(job.get("settings") or {}, base=entry.defaults())
                    if job is not None else getattr(result, "settings", None))
        if not isinstance(settings, entry.settings_class):
            return "(cannot be rebuilt: no job file of it and no settings in the result)"
        options = None
        if entry.needs_model:
            recorded = (job or {}).get("model") or {"model": session.manifest.get("model") or ""}
            options = ModelOptions.from_dict(recorded).untrusted()
        # the command as run anywhere: no --shards from the GPUs of the machine that writes the report
        return typed([*run_argv(entry.name, settings, options), "--session", session.name])
    except (UserError, TypeError, ValueError) as exc:
        return f"(cannot be rebuilt: {exc})"


def entries(session: Session) -> tuple[list[Entry], list[str]]:
    """The session's results that this version reads, in the registry's order, and a note for each
    one it cannot read."""
    docs = session.results()
    notes = list(session.damage)
    jobs = session.jobs()
    order = {e.writes: i for i, e in enumerate(registry.EXPERIMENTS)}
    found = []
    for name in sorted(docs, key=lambda n: (order.get(n, len(order)), n)):
        problems: list[Exception] = []
        if name == "atlas":
            result: Any = decode_or_none(AtlasDocument, docs[name], on_error=problems.append)  # type: ignore[type-var]
        else:
            cls = result_class(name)
            result = decode_or_none(cls, docs[name], on_error=problems.append) if cls is not None else None
        if result is None:
            why = problems[0] if problems else "no figure or class of this version reads it"
            notes.append(f"results/{name}.json left out: {why}")
            continue
        found.append(Entry(name, result, docs[name], reproducing_command(name, result, session, jobs)))
    return found, notes


# tables ------------------------------------------------------------------------------------------

def cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value) if len(value) <= 12 else f"{len(value)} values"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)[:120]
    return str(value)


def scalar(value: Any) -> bool:
    """A value one cell shows: a number, a text, or a list or mapping of those."""
    plain = (str, int, float, bool, type(None))
    return isinstance(value, plain) or (isinstance(value, (list, tuple)) and all(isinstance(v, plain) for v in value)) \
        or (isinstance(value, dict) and all(isinstance(v, plain) for v in value.values()))


def rows_table(title: str, rows: Sequence[Mapping[str, Any]], key: str | None = None,
               keys: Sequence[str] = ()) -> Table:
    """A table of flat records: one column per scalar field any of them has (`key` first, from `keys`)."""
    columns = list(dict.fromkeys(k for row in rows for k, v in row.items() if scalar(v)))
    header = ([key] if key else []) + columns
    body = [([keys[i]] if key else []) + [cell(row.get(c)) for c in columns] for i, row in enumerate(rows[:ROW_LIMIT])]
    if len(rows) > ROW_LIMIT:
        title += f" (first {ROW_LIMIT} of {len(rows)})"
    return title, header, body


def tables(doc: Mapping[str, Any]) -> list[Table]:
    """The result's scalars, then every list of records (per-layer rows, curves) and every mapping of
    records (arms, components) as its own table, then its settings and protocol."""
    found: list[Table] = []
    skip = {"settings", "protocol"}
    summary = [[k, cell(v)] for k, v in doc.items() if k not in skip and scalar(v)]
    if summary:
        found.append(("summary", ["field", "value"], summary))
    for key, value in doc.items():
        if key in skip:
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            found.append(rows_table(key, value))
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            found.append(rows_table(key, list(value.values()), key="name", keys=list(value)))
    for key in ("settings", "protocol"):
        if isinstance(doc.get(key), dict):
            found.append((key, ["field", "value"], [[k, cell(v)] for k, v in doc[key].items()]))
    return found


# the three formats ------------------------------------------------------------------------------

STYLE = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.85em}td,th{border:1px solid #ccc;padding:.2em .5em;
text-align:left}th{background:#f3f3f3}img{max-width:100%;height:auto}code{background:#f3f3f3;padding:.1em .3em}
.note{color:#8a4b00}"""


def html_table(table: Table) -> str:
    title, header, rows = table
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"


def html_report(session: Session, found: Sequence[Entry], notes: Sequence[str], pngs: Mapping[str, bytes]) -> str:
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>anatomy-tui report: {esc(session.name)}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>Session {esc(session.name)}</h1>", html_table(("session", ["field", "value"], header_rows(session)))]
    parts += [f"<p class='note'>{esc(note)}</p>" for note in notes]
    for entry in found:
        parts += [f"<h2 id='{esc(entry.name)}'>{esc(entry.name)}</h2>",
                  f"<p>Reproduce: <code>{esc(entry.command)}</code></p>"]
        if entry.name in pngs:
            data = base64.b64encode(pngs[entry.name]).decode("ascii")
            parts.append(f"<figure><img alt='{esc(entry.name)} figure' src='data:image/png;base64,{data}'>"
                         f"<figcaption>files: <a href='{esc(entry.name)}.png'>{esc(entry.name)}.png</a>, "
                         f"<a href='{esc(entry.name)}.svg'>{esc(entry.name)}.svg</a></figcaption></figure>")
        parts += [html_table(table) for table in tables(entry.doc)]
    return "\n".join(parts) + "\n</body></html>\n"


def md_table(table: Table) -> str:
    title, header, rows = table

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([f"#### {title}", "", line(header), line(["---"] * len(header)), *map(line, rows), ""])


def markdown_report(session: Session, found: Sequence[Entry], notes: Sequence[str], drawn: Mapping[str, bytes]) -> str:
    parts = [f"# Session {session.name}", "", md_table(("session", ["field", "value"], header_rows(session)))]
    parts += [f"> {note}\n" for note in notes]
    for entry in found:
        parts += [f"## {entry.name}", "", "Reproduce:", "", "```", entry.command, "```", ""]
        if entry.name in drawn:
            parts += [f"![{entry.name}]({entry.name}.png)", "", f"Vector: [{entry.name}.svg]({entry.name}.svg)", ""]
        parts += [md_table(table) for table in tables(entry.doc)]
    return "\n".join(parts)


def header_rows(session: Session) -> list[list[str]]:
    manifest = session.manifest
    versions = manifest.get("versions") if isinstance(manifest.get("versions"), dict) else {}
    rows = [["model", cell(manifest.get("model") or "–")],
            ["created", time.strftime("%Y-%m-%d %H:%M", time.localtime(float(manifest.get("created") or 0)))],
            ["reported", time.strftime("%Y-%m-%d %H:%M")]]
    return rows + [[f"version of {name}", cell(version)] for name, version in versions.items()]


def main(args: argparse.Namespace) -> int:
    import matplotlib

    import figures
    from figures.style import DPI, RC
    from sessions.store import SessionStore

    if args.pdf and args.format is not None:
        raise UserError(f"--pdf is short for --format pdf; give one of them (--format {args.format},pdf for both)")
    formats = ("pdf",) if args.pdf else parse_formats(args.format or ",".join(FORMATS))
    store = SessionStore()
    store.check_home(writing=False)
    session = store.open(args.session)
    found, notes = entries(session)
    if not found:
        raise UserError(f"session {session.name!r} has no results to report"
                        f"{' (' + notes[0] + ')' if notes else ''}; run an experiment into it first "
                        f"(anatomy-tui run ablation --session {session.name})")
    folder = output_folder(args.out, session.name)
    pngs: dict[str, bytes] = {}
    for entry in found:
        try:
            figures.save_figure(entry.result, folder / entry.name, ("png", "svg"))
        except UserError as exc:  # a result kind without a figure module (an experiment added since)
            if "no figure is drawn" not in str(exc):
                raise
            notes.append(f"{entry.name}: {exc}; its tables are below")
            continue
        pngs[entry.name] = (folder / f"{entry.name}.png").read_bytes()
    written = []
    if "html" in formats:
        atomic_write_bytes(folder / "report.html", html_report(session, found, notes, pngs).encode(), "report")
        written.append(folder / "report.html")
    if "md" in formats:
        atomic_write_bytes(folder / "report.md", markdown_report(session, found, notes, pngs).encode(), "report")
        written.append(folder / "report.md")
    if "pdf" in formats:
        from matplotlib.backends.backend_pdf import PdfPages

        def pdf(tmp: Path) -> None:
            with matplotlib.rc_context(RC), PdfPages(tmp) as pages:
                for entry in found:
                    if entry.name in pngs:
                        pages.savefig(figures.figure_for(entry.result), dpi=DPI)

        atomic_write(folder / "report.pdf", pdf, "report")
        written.append(folder / "report.pdf")
    for path in written:
        print(path)
    print(f"{len(pngs)} figures (PNG, SVG) in {folder}")
    return 0
