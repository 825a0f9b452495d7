"""The pages of `anatomy-tui report` (cli/commands/report.py): a session's results as tables, written
as self-contained HTML and as Markdown. Nothing read from the session is trusted: every text is
escaped in the HTML and in the Markdown (entities and backslashes, one line, code in a fence no text
can close, links only to the files beside it)."""

from __future__ import annotations

import base64
import html
import json
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from engine.atlas.table import AtlasDocument
from engine.core.events import ResultDocument
from sessions.store import Session

ROW_LIMIT = 200  # rows of one table in the report (a 100-layer map stays readable)
CELL_LIMIT = 200  # characters of one cell
Table = tuple[str, list[str], list[list[str]]]  # title, header, rows


@dataclass(frozen=True)
class Entry:
    """One result of the session, read through its class, with what reproduces it."""

    name: str  # results/<name>.json
    result: ResultDocument | AtlasDocument
    doc: dict[str, Any]  # as stored: the tables walk it
    command: str  # the command line that reproduces it, or why there is none


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
    return isinstance(value, PLAIN) or (isinstance(value, (list, tuple)) and all(isinstance(v, PLAIN) for v in value)) \
        or (isinstance(value, dict) and all(isinstance(v, PLAIN) for v in value.values()))


PLAIN = (str, int, float, bool, type(None))


def flat(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record with the numbers and words of each record nested in it that is more than one cell
    beside its own (`anatomy.mean_angle`: a member's anatomy summary in the members' table)."""
    inner = {f"{k}.{name}": v for k, value in row.items() if isinstance(value, dict) and not scalar(value)
             for name, v in value.items() if isinstance(v, PLAIN)}
    return {**row, **inner}


def rows_table(title: str, rows: Sequence[Mapping[str, Any]], key: str | None = None,
               keys: Sequence[str] = ()) -> Table:
    """A table of records: one column per scalar field any of them, or a record nested in them, has
    (`key` first, from `keys`)."""
    records = [flat(row) for row in rows]
    columns = list(dict.fromkeys(k for row in records for k, v in row.items() if scalar(v)))
    header = ([key] if key else []) + columns
    body = [([keys[i]] if key else []) + [cell(row.get(c)) for c in columns]
            for i, row in enumerate(records[:ROW_LIMIT])]
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
        if key not in skip:
            found += parts(key, value)
    for key in ("settings", "protocol"):
        if isinstance(doc.get(key), dict):
            found.append((key, ["field", "value"], [[k, cell(v)] for k, v in doc[key].items()]))
    return found


def parts(key: str, value: Any) -> list[Table]:
    """The tables of one field: a list of records, a mapping of records (a row each, named), or a
    record that is more than one cell (a fit: its scalars, then each list of records in it, `fit.loo`)."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [rows_table(key, value)]
    if not isinstance(value, dict) or not value or scalar(value):
        return []
    if all(isinstance(v, dict) for v in value.values()):
        return [rows_table(key, list(value.values()), key="name", keys=list(value))]
    found = [(key, ["field", "value"], [[k, cell(v)] for k, v in value.items() if scalar(v)])]
    return found + [rows_table(f"{key}.{k}", v) for k, v in value.items()
                    if isinstance(v, list) and v and all(isinstance(item, dict) for item in v)]


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
