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
leaves the previous report as it was.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import html
import json
import os
import re
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from cli.argv import run_argv, typed
from engine import registry
from engine.atlas.table import AtlasDocument
from engine.core.errors import UserError
from engine.core.events import ResultDocument, result_class
from engine.core.process import say
from engine.disk.atomic import is_no_space, mount_point
from engine.disk.staging import staged
from engine.models.options import ModelOptions
from sessions.documents import Damaged, JobRecord, typed_result
from sessions.store import Session

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("html", "md", "pdf")
ROW_LIMIT = 200  # rows of one table in the report (a 100-layer map stays readable)
CELL_LIMIT = 200  # characters of one cell
MAX_LAYERS = 1024  # no decoder this project loads is deeper (the deepest LMs published have a few hundred)
RECORDS_PER_LAYER = 16  # records in any one list of a result, per layer (a part map: 2, prune's curve: 10 curves)
MAX_POINTS = 1 << 20  # numbers in any one list (a curve of training steps)
MAX_NAME = 4096  # characters of a model's name or path (PATH_MAX)
ATLAS_SERIES = 64  # models of an atlas's figure, and series (model, variant, measure) of its rows per layer
EXTRA = "pip install 'anatomy-tui[figures]'"
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
    doc: dict[str, Any]  # as stored: the tables walk it
    command: str  # the command line that reproduces it, or why there is none


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


# sizes -------------------------------------------------------------------------------------------

def stated_layers(doc: Mapping[str, Any]) -> int | None:
    """The model's layer count as the result states it: its `n_layers`, else the length of its
    one-layer blocks' angular distances (an ablation map); None when it says neither."""
    stated = doc.get("n_layers")
    if isinstance(stated, int) and not isinstance(stated, bool):
        return stated
    blocks = doc.get("angular_blocks")
    one = blocks.get("1") if isinstance(blocks, dict) else None
    return len(one) if isinstance(one, list) else None


def layer_of(row: Any) -> int | None:
    """The layer a row is of: a record's `layer`, or a layer number itself (manipulate's `layers`)."""
    layer = row.get("layer") if isinstance(row, dict) else row
    return layer if isinstance(layer, int) and not isinstance(layer, bool) else None


def lists(doc: Any) -> Iterator[tuple[str, list[Any]]]:
    """Every list in the document, with where it is (`curve`, `arms.growth.phases`), walked without
    recursion."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
        elif isinstance(value, list):
            yield where, value
            stack.extend((f"{where}[]", item) for item in value if isinstance(item, (dict, list)))


def size_problem(name: str, doc: Any) -> str:
    """Why a result holds more than the model it names can have ("" when it does not): more layers
    than any model, more layer rows than its layers (a part map: two per layer), a row of a layer it
    lacks, a list longer than RECORDS_PER_LAYER records per layer or MAX_POINTS numbers, a model
    name longer than a path. What the report draws and prints is bounded by these."""
    if not isinstance(doc, dict):
        return ""  # the class's decoding says what is wrong with it
    depth = stated_layers(doc)
    if depth is not None and not 0 < depth <= MAX_LAYERS:
        return f"it says the model has {depth} layers (a model here has 1 to {MAX_LAYERS})"
    depth = depth or MAX_LAYERS
    model = doc.get("model")
    if isinstance(model, str) and len(model) > MAX_NAME:
        return f"its model name is {len(model)} characters long (a name or path has at most {MAX_NAME})"
    if name == "atlas":
        return atlas_problem(doc)
    for key, per_layer in (("layers", 1), ("parts", 2)):
        rows = doc.get(key)
        if not isinstance(rows, list):
            continue
        if len(rows) > per_layer * depth:
            return f"{len(rows)} rows in '{key}', more than its model's {depth} layers have"
        wrong = next((layer for row in rows if (layer := layer_of(row)) is not None and not 0 <= layer < depth), None)
        if wrong is not None:
            return f"a row of layer {wrong} in '{key}', which its model of {depth} layers lacks"
    for where, items in lists(doc):
        records = bool(items) and isinstance(items[0], dict)
        limit = RECORDS_PER_LAYER * depth if records else MAX_POINTS
        if len(items) > limit:
            return (f"{len(items)} {'rows' if records else 'values'} in '{where}', more than a model of {depth} "
                    f"layers gives (at most {limit})")
    return ""


def atlas_problem(doc: Mapping[str, Any]) -> str:
    """An atlas's rows: each of a layer its model has (at most MAX_LAYERS), of at most ATLAS_SERIES
    models, and at most ATLAS_SERIES series of MAX_LAYERS rows each."""
    rows = doc.get("rows")
    if not isinstance(rows, list):
        return ""
    if len(rows) > ATLAS_SERIES * MAX_LAYERS:
        return f"{len(rows)} rows, more than {ATLAS_SERIES} series of {MAX_LAYERS} layers"
    models = {row.get("model") for row in rows if isinstance(row, dict)}
    if len(models) > ATLAS_SERIES:
        return f"{len(models)} models in its rows (an atlas draws at most {ATLAS_SERIES})"
    for row in rows:
        layer, depth = layer_of(row), row.get("n_layers") if isinstance(row, dict) else None
        if isinstance(depth, int) and not 0 < depth <= MAX_LAYERS:
            return f"a row says its model has {depth} layers (a model here has 1 to {MAX_LAYERS})"
        if isinstance(depth, int) and layer is not None and not 0 <= layer < depth:
            return f"a row of layer {layer} of a model of {depth} layers"
    return ""


# tables ------------------------------------------------------------------------------------------

def cell(value: Any) -> str:
    """A value as one cell's text, at most CELL_LIMIT characters."""
    if value is None:
        text = "–"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (list, tuple)):
        text = ", ".join(cell(v) for v in value) if len(value) <= 12 else f"{len(value)} values"
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True)
    else:
        text = str(value)
    return text if len(text) <= CELL_LIMIT else text[:CELL_LIMIT - 1] + "…"


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
            file = esc(quote(entry.name, safe=""))  # a file beside the page, never a scheme or a folder
            parts.append(f"<figure><img alt='{esc(entry.name)} figure' src='data:image/png;base64,{data}'>"
                         f"<figcaption>files: <a href='{file}.png'>{esc(entry.name)}.png</a>, "
                         f"<a href='{file}.svg'>{esc(entry.name)}.svg</a></figcaption></figure>")
        parts += [html_table(table) for table in tables(entry.doc)]
    return "\n".join(parts) + "\n</body></html>\n"


MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# what Markdown reads as markup inline: emphasis, code, links and images, tables' bars, strikethrough,
# math ($), headings' closing #, and the `:` and `@` of the URLs and addresses GFM makes links of
MD_ACTIVE = re.compile(r"[\\`*_{}\[\]()#!|~$:@&<>]")


def md_text(text: Any) -> str:
    """Text from the session as Markdown that shows it and nothing else: on one line (every line
    break and other space one space), `&`, `<`, `>` as entities, other markup characters escaped
    by a backslash; so no HTML, link, emphasis or table cell is made of it, in any CommonMark or
    GFM reader (GitHub, VS Code, Jupyter)."""
    line = " ".join(str(text).split())
    return MD_ACTIVE.sub(lambda m: MD_ENTITIES.get(m[0], "\\" + m[0]), line)


def md_code(text: str) -> list[str]:
    """A fenced code block of `text` whose fence (backticks, one more than the longest run in the
    text) nothing in the text can close."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return [fence, text, fence]


def md_link(name: str, suffix: str, image: bool = False) -> str:
    """A link to the report's own file `name + suffix` beside it: the name percent-encoded, so the
    target is a file in the report's folder, never a scheme or another folder."""
    return f"{'!' if image else ''}[{md_text(name + suffix)}]({quote(name, safe='')}{suffix})"


def md_table(table: Table) -> str:
    title, header, rows = table

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(md_text(c) or " " for c in cells) + " |"

    return "\n".join([f"#### {md_text(title)}", "", line(header), "| " + " | ".join(["---"] * len(header)) + " |",
                      *map(line, rows), ""])


def markdown_report(session: Session, found: Sequence[Entry], notes: Sequence[str], drawn: Collection[str]) -> str:
    parts = [f"# Session {md_text(session.name)}", "", md_table(("session", ["field", "value"], header_rows(session)))]
    parts += [f"> {md_text(note)}\n" for note in notes]
    for entry in found:
        parts += [f"## {md_text(entry.name)}", "", "Reproduce:", "", *md_code(entry.command), ""]
        if entry.name in drawn:
            parts += [md_link(entry.name, ".png", image=True), "", f"Vector: {md_link(entry.name, '.svg')}", ""]
        parts += [md_table(table) for table in tables(entry.doc)]
    return "\n".join(parts)


def header_rows(session: Session) -> list[list[str]]:
    header = session.header
    rows = [["model", cell(header.model or "–")],
            ["created", time.strftime("%Y-%m-%d %H:%M", time.localtime(header.created))],
            ["reported", time.strftime("%Y-%m-%d %H:%M")]]
    return rows + [[f"version of {name}", cell(version)] for name, version in header.versions.items()]


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
