"""Shared fixtures: tiny models of each family, the embedded model, and an isolated session home."""

from __future__ import annotations

import pytest
from tiny_models import byte_tokenizer, tiny_model


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
    return byte_tokenizer()


@pytest.fixture
def tiny_llama(tokenizer):
    return tiny_model("llama"), tokenizer


@pytest.fixture(scope="session")
def embedded():
    """SmolLM2-135M, the real embedded default (dequantized once, then read from the cache)."""
    from engine.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32")
