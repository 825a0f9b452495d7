"""Skips CI does not accept. What a test needs beyond the project's own install is a marker
(pyproject.toml's pytest markers: browser, report, cluster, hub, terminal, docs). Where
ANATOMY_TUI_REQUIRE names some of them (.ci/run names them all), a test so marked that skips fails
the run, listed with its skip's reason (the missing dependency); without it (`./test` on a
newcomer's machine) a skip stays a skip. Registered by tests/conftest.py."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

REQUIRE = "ANATOMY_TUI_REQUIRE"


def required_markers(config: pytest.Config) -> frozenset[str]:
    """The markers ANATOMY_TUI_REQUIRE names; a name no registered marker has is a usage error."""
    names = frozenset(name.strip() for name in os.environ.get(REQUIRE, "").split(",") if name.strip())
    known = {line.split(":")[0].strip() for line in config.getini("markers")}
    if unknown := sorted(names - known):
        raise pytest.UsageError(f"{REQUIRE}={os.environ[REQUIRE]}: no marker {', '.join(unknown)}; "
                                f"pick from {', '.join(sorted(known))} (pyproject.toml's pytest markers)")
    return names


def module_markers(path: Path) -> set[str]:
    """The marker names of a module's `pytestmark`, read from its source: a module skipped as it is
    imported (importorskip at its top) never becomes a module object with markers."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    values = [node.value for node in tree.body if isinstance(node, ast.Assign)
              and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]
    return {node.attr for value in values for node in ast.walk(value) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"}


class RequiredSkips:
    """Notes each skip of a test (or a whole module) marked with a required marker, lists them after
    the run and fails it. Under xdist it runs in the controller, which gets every worker's reports."""

    def __init__(self, required: frozenset[str], root: Path) -> None:
        self.required, self.root = required, root
        self.missed: list[str] = []

    def note(self, nodeid: str, markers: set[str], report: pytest.CollectReport | pytest.TestReport) -> None:
        if needed := sorted(self.required & markers):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.missed.append(f"{nodeid}: needs {', '.join(needed)}; {reason.removeprefix('Skipped: ')}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.note(report.nodeid, set(report.keywords), report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and report.nodeid.endswith(".py"):  # a module skipped whole as it was imported
            self.note(report.nodeid, module_markers(self.root / report.nodeid), report)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.missed:
            terminalreporter.section(f"skipped, though {REQUIRE} requires them", sep="=", red=True, bold=True)
            for line in self.missed:
                terminalreporter.line(line)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.missed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def register_required_skips(config: pytest.Config) -> None:
    """Where ANATOMY_TUI_REQUIRE names markers, notes their skips; not in an xdist worker (its
    controller gets every worker's reports and notes them once)."""
    required = required_markers(config)
    if required and not hasattr(config, "workerinput"):
        config.pluginmanager.register(RequiredSkips(required, config.rootpath), "required-skips")
