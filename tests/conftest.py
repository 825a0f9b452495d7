"""Shared fixtures: tiny models of each family, the tiny model as a folder, the embedded model, an
isolated session home, and the environment of workers started by torch's launcher.

Under pytest-xdist (`./test` runs `-n auto --dist loadgroup`) every worker is its own process with its
own session fixtures; the tests marked `embedded` all go to one worker (one xdist group), so the
real model loads once per run, the tests marked `slow` are handed out first, and each worker takes
an equal share of the CPU threads."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from required_skips import register_required_skips

TESTS = Path(__file__).resolve().parent

# Hypothesis (tests/test_settings_properties.py, tests/test_distributed.py): by default (and in CI)
# the `ci` profile, derandomized, so every run draws the same examples and a failure is one every run
# sees; `HYPOTHESIS_PROFILE=explore` draws new random examples, many more of them, to look for new
# failures (each one found becomes a fixed test).
hypothesis_settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
hypothesis_settings.register_profile(
    "explore", derandomize=False, max_examples=200, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    register_required_skips(config)  # CI's ANATOMY_TUI_REQUIRE: tests/required_skips.py
    gc.disable()  # collecting imports torch, transformers and textual: see pytest_collection_finish
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # two workers of two threads each on two cores would fight over them
        import torch

        from engine.models.distributed import cpu_threads

        torch.set_num_threads(cpu_threads(workers))
        # and so would the processes the tests start (runs, jobs, kernels, Ray's workers): the same share
        os.environ.setdefault("OMP_NUM_THREADS", str(cpu_threads(workers)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What importing and collecting made lives as long as this process: frozen out of every later
    collection, as a run's own process does (engine/core/frozen_imports.py); what tests make is
    collected as usual."""
    gc.freeze()
    gc.enable()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("embedded") is not None:
            item.add_marker(pytest.mark.xdist_group("embedded"))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the longest first, so no worker ends alone on one of them
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own session home; the model cache stays shared (it is expensive)."""
    monkeypatch.setenv("ANATOMY_TUI_HOME", str(tmp_path / "sessions"))
    return tmp_path / "sessions"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices: one thread is many times faster than several fighting over a loaded CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    from tiny_models import byte_tokenizer  # here, not above: ./test's controller never imports transformers

    return byte_tokenizer()


@pytest.fixture
def tiny_llama(tokenizer):
    from tiny_models import tiny_model

    return tiny_model("llama"), tokenizer


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """The tiny llama saved as a Hugging Face folder (`--model FOLDER`), once a session: read, never
    written (a test that changes a model folder saves its own)."""
    from tiny_models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def files(tmp_path) -> tuple[str, str]:
    """An evaluation file (tiny_models.EVAL, a text a line) and a training file (TRAIN)."""
    from tiny_models import EVAL, TRAIN

    evaluation, train = tmp_path / "eval.txt", tmp_path / "train.txt"
    evaluation.write_text("\n".join(EVAL), encoding="utf-8")
    train.write_text(TRAIN, encoding="utf-8")
    return str(evaluation), str(train)


@pytest.fixture
def worker_env(monkeypatch):
    """Workers started by torch's launcher import this tree's engine and the tiny models, like the
    test process does, and start outside any torchrun world."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def embedded():
    """SmolLM2-135M, the real embedded default (dequantized once, then read from the cache)."""
    from engine.models.loading import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32")
