"""CI's ANATOMY_TUI_REQUIRE (tests/required_skips.py): a skipped test whose marker it names fails the
run, listed with the reason it skipped; a skip of any other test, or any skip without the variable
(`./test` on a newcomer's machine), stays a skip. Run on a small suite of its own, in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

SUITE = {
    "test_marked": """
import pytest

@pytest.mark.browser
def test_needs_a_browser():
    pytest.skip("chromium is not installed")

@pytest.mark.browser
def test_has_its_browser():
    pass

def test_needs_a_gpu():
    pytest.skip("no CUDA GPU here")
""",
    "test_whole_module": """
import pytest

pytestmark = [pytest.mark.docs, pytest.mark.usefixtures("tmp_path")]
pytest.importorskip("no_such_module_here", reason="no_such_module_here is not installed")

def test_never_collected():
    pass
""",
}


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.delenv("ANATOMY_TUI_REQUIRE", raising=False)
    pytester.makeconftest("from required_skips import register_required_skips\n\n"
                          "def pytest_configure(config):\n    register_required_skips(config)\n")
    pytester.makeini("[pytest]\nmarkers =\n    browser: a browser\n    docs: the docs\n")
    pytester.makepyfile(**SUITE)
    return pytester


MISSED = {
    "test_marked.py::test_needs_a_browser: needs browser; chromium is not installed",
    "test_whole_module.py: needs docs; no_such_module_here is not installed",
}


@pytest.mark.parametrize("workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.slow)],
                         ids=["one process", "xdist"])
def test_a_required_skip_fails_the_run_and_is_named_with_its_reason(suite, monkeypatch, workers):
    monkeypatch.setenv("ANATOMY_TUI_REQUIRE", "browser, docs")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", *workers)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "skipped, though ANATOMY_TUI_REQUIRE requires them" in line)
    assert set(lines[start + 1:start + 3]) == MISSED
    result.assert_outcomes(passed=1, skipped=3)  # the GPU's skip is not listed: no marker named it


def test_without_the_variable_or_with_other_markers_a_skip_is_a_skip(suite, monkeypatch):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK and "requires them" not in result.stdout.str()
    monkeypatch.setenv("ANATOMY_TUI_REQUIRE", "docs")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "test_whole_module.py: needs docs" in result.stdout.str() and "needs browser" not in result.stdout.str()


def test_a_marker_nobody_registered_is_refused_in_one_line(suite, monkeypatch):
    monkeypatch.setenv("ANATOMY_TUI_REQUIRE", "browsr")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ERROR: ANATOMY_TUI_REQUIRE=browsr: no marker browsr; pick from browser, docs" in result.stderr.str()
