"""anatomy-tui from Python (a notebook): load a model once, run any experiment of the registry on it
in this process, read the results as DataFrames, and open the sessions the console and the CLI make.

    from anatomy_tui import load_model, run, open_session

    model = load_model()                                  # the embedded SmolLM2-135M
    result = run("ablation", model, layers=[0, 1, 2], session="notebook")
    result.to_pandas()                                    # a row per layer
    open_session("notebook").results["ablation"]          # what the console and the CLI see

An experiment's settings are the fields of its Settings class (`anatomy-tui run NAME --help` lists
them as flags: `--eval-set` is `eval_set=`), checked as the command line checks its flags. A run given
`session=` writes its job, events and result into the session store exactly as `anatomy-tui run
--session` does. Importing this module imports no torch, pandas or tqdm: each comes when first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from anatomy_tui.results import InputError, RunResult, one_line, plot, to_pandas, typed
from anatomy_tui.stored import Session, open_session
from engine import registry
from engine.core.errors import UserError
from engine.core.events import (
    Cancelled,
    CancelToken,
    Event,
    Message,
    Progress,
    Result,
)
from engine.core.settings import FieldSpec, Settings, from_preset
from engine.experiments.context import RunContext
from engine.models.options import ModelOptions, check_device
from sessions.job_runner import run_job
from sessions.store import Session as StoredSession
from sessions.store import SessionStore

if TYPE_CHECKING:
    from engine.models.loading import LoadedModel

__all__ = ["InputError", "Model", "RunResult", "Session", "load_model", "open_session", "plot", "run", "to_pandas"]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# models ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    """A loaded model and the options it was loaded with (recorded in a session's job files, so the
    console can resume a run made here). `model` and `tokenizer` are the transformers objects."""

    loaded: LoadedModel
    options: ModelOptions

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def n_layers(self) -> int:
        return self.loaded.n_layers

    def __repr__(self) -> str:
        loaded = self.loaded
        return f"Model({loaded.name!r}: {loaded.n_layers} layers on {loaded.device} in {loaded.dtype_name})"


_LOADED: dict[ModelOptions, Model] = {}  # every model loaded here, by its options: each loads once


def load_model(name_or_path: str | None = None, *, device: str | None = None, dtype: str | None = None,
               trust_remote_code: bool | None = None, device_map: str | None = None, max_memory: str | None = None,
               deterministic: bool | None = None, tf32: bool | None = None, fresh: bool = False,
               progress: bool = True) -> Model:
    """Loads a model as `anatomy-tui --model NAME_OR_PATH` does, once: the same options again return
    the model already loaded (`fresh=True` loads another copy, which later calls then return).

    `name_or_path`: `smollm2-135m` (the embedded default, when None), a local Hugging Face folder, a
    `.gguf` file or a hub id. The other options are the CLI's model flags (None: the flag's default):
    `device` auto, cpu, cuda or cuda:N; `dtype` auto, float32, bfloat16 or float16; `device_map` and
    `max_memory` spread a large model over several devices; `deterministic` and `tf32` say how torch
    runs on a GPU. `progress=False` says nothing while loading. A bad option raises InputError."""
    given = {"model": name_or_path, "device": device, "dtype": dtype, "trust_remote_code": trust_remote_code,
             "device_map": device_map, "max_memory": max_memory, "deterministic": deterministic, "tf32": tf32}
    with one_line():
        options = _checked(ModelOptions(), {name: value for name, value in given.items() if value is not None})
        check_device(options.device)
        if not fresh and options in _LOADED:
            return _LOADED[options]
        loaded = options.load(_say if progress else lambda _: None)
    model = Model(loaded, options)
    if progress:
        _say(repr(model))
    _LOADED[options] = model
    return model


def _default_model(progress: bool) -> Model:
    """The embedded model with the default options, loaded on first use."""
    return load_model(progress=progress)


# settings ----------------------------------------------------------------------------------------


S = TypeVar("S", bound=Settings)


def _checked(base: S, given: Mapping[str, Any]) -> S:
    """`base` with the values `given` (Python values, or text read as the flag reads it), checked
    as the command line checks its flags; an unknown name or a bad value raises InputError."""
    specs = {spec.name: spec for spec in base.fields()}
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise InputError(f"{type(base).__name__} has no setting {unknown[0]!r}; its settings: {', '.join(specs)}")
    return base.override({name: _value(specs[name], value) for name, value in given.items()})


def _value(spec: FieldSpec, value: Any) -> Any:
    """One setting's value: a string as its flag's text (`layers="all"`, `layers="0,1,2"`), else
    checked as it is (a list for a tuple field becomes the tuple, one value a tuple of one); errors
    name it `name=`."""
    if spec.is_tuple and spec.base is not object and value is not None and not isinstance(value, (str, list, tuple)):
        value = (value,)
    try:
        return spec.parse_text(value) if isinstance(value, str) else spec.coerce(value)
    except UserError as exc:
        text = str(exc)
        raise InputError(f"{spec.name}={text[len(spec.flag) + 1:]}" if text.startswith(spec.flag + " ")
                         else text) from None


def _settings(entry: registry.Experiment, preset: str | None, given: Mapping[str, Any]) -> Settings:
    if preset is not None and not entry.presets:
        raise InputError(f"{entry.name} has no presets; give its settings alone")
    base = from_preset(entry.presets, preset) if preset is not None else entry.defaults()
    return _checked(base, given)


# results -----------------------------------------------------------------------------------------


# running -----------------------------------------------------------------------------------------


class _Bar:
    """The run's progress: a tqdm.auto bar (a widget in Jupyter) fed by its `job.progress` events,
    its messages written above it, and the caller's `on_event` after each."""

    def __init__(self, label: str, shown: bool, on_event: Callable[[Event], None] | None) -> None:
        self.label, self.shown, self.on_event = label, shown, on_event
        self.bar: Any = None
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if self.shown and isinstance(event, Progress):
            self._progress(event)
        elif self.shown and isinstance(event, Message):
            self.write(f"[{event.level}] {event.text}")
        if self.on_event is not None:
            self.on_event(event)

    def _progress(self, event: Progress) -> None:
        label = event.label or self.label
        if self.bar is None:
            with warnings.catch_warnings():  # without ipywidgets: the text bar, no warning
                warnings.simplefilter("ignore")
                from tqdm.auto import tqdm
            self.bar = tqdm(total=event.total, initial=event.done, desc=label, file=sys.stderr, unit=event.unit or "it")
            return
        self.bar.total, self.bar.unit = event.total, event.unit or "it"  # `12/48 [..., 4.00texts/s]`
        self.bar.n = event.done
        self.bar.set_description(label, refresh=False)
        self.bar.refresh()

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        elif self.shown:
            _say(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def _interrupt_cancels(token: CancelToken, bar: _Bar) -> Iterator[None]:
    """The first Ctrl-C (Jupyter's interrupt) sets the run's cancel token: the experiment stops at
    its next step and leaves the model as it was; a second one raises KeyboardInterrupt where the
    run is, mid-step, which cancels it too (the step unwinds, putting back what it changed). Only the
    main thread can take signals: elsewhere Ctrl-C is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(signum: int, frame: Any) -> None:
        if token.cancelled:
            raise KeyboardInterrupt
        token.cancel()
        bar.write("interrupted: stopping at the next step (interrupt again to stop at once)")

    previous = signal.signal(signal.SIGINT, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _drain(events: Iterable[Event], show: _Bar) -> Result | None:
    """A run with no session: its events to `show`; its Result, or None when it was cancelled."""
    result = None
    try:
        for event in events:
            show(event)
            if isinstance(event, Result):
                result = event
    except (Cancelled, KeyboardInterrupt):
        return None
    return result


def _model_checks(entry: registry.Experiment, settings: Settings, loaded: LoadedModel) -> None:
    """What `anatomy-tui run` checks before its load, checked against the model loaded: layers in
    range, components its family has, texts that leave a token to predict, an export folder."""
    from engine.models.memory import ModelPreview, ModelShape
    from engine.models.preflight import check_before_load

    config = loaded.model.config
    preview = ModelPreview(config, loaded.tokenizer, loaded.model, ModelShape.from_meta(config, loaded.model))
    check_before_load(entry.name, settings, preview, None)


def _stored(store: SessionStore, name: str, options: ModelOptions | None, settings: Settings,
            writes: str) -> StoredSession:
    """Session `name`, made when there is none (as `anatomy-tui run --session NAME` makes it)."""
    store.check_home()
    session = store.open_or_create(name, model=options.model if options else "", settings=settings.to_dict())
    session.check_writable(writes)
    return session


def run(experiment: str, model: Model | None = None, session: str | Session | None = None, *,
        preset: str | None = None, resume: bool = False, progress: bool = True,
        on_event: Callable[[Event], None] | None = None, **settings: Any) -> RunResult:
    """Runs an experiment of the registry in this process and returns its result.

    `experiment`: a name `anatomy-tui run` takes (ablation, recovery, growth, dynamics, scaling-fit,
    toy-depth, weights, manipulate, prune, evaluate). `model`: a `load_model()` model (None: the
    embedded one, loaded once); experiments that train their own models (growth, toy-depth,
    scaling-fit) take none. `settings`: the fields of the experiment's Settings, as Python values
    or as the flag's text (`layers=[0, 1]` or `layers="0,1"`), over the experiment's defaults or
    its `preset`; an unknown experiment or setting, or a value out of range, raises InputError
    before anything runs.

    `session`: a name (made when there is none) or an open Session: the job, every event and the
    result go into the session store as with `anatomy-tui run --session`, so the console and
    `anatomy-tui sessions show` see them, and the run reads the session's earlier results it needs
    (recovery and prune the ablation map). `resume=True` continues a resumable run (ablation,
    recovery, growth, toy-depth) from the session's checkpoint. None: nothing is written.

    Progress shows as a tqdm bar and the run's messages above it (`progress=False`: nothing);
    `on_event` hears every event as it comes. An interrupt (Ctrl-C, Jupyter's interrupt button)
    cancels the run at its next step through its cancel token, leaving the model's weights as they
    were: the run returns a `partial` RunResult holding the events sent so far (and the session
    records the job cancelled). A second interrupt stops it at once, mid-step, with the same end; a
    KeyboardInterrupt raised in `on_event` cancels it too."""
    with one_line():
        entry = registry.experiment(experiment)
        chosen = _settings(entry, preset, settings)
        chosen.check_inputs()
        if isinstance(session, Session):
            session = session.name
        if resume and (session is None or not entry.resumable):
            resumable = ", ".join(row.name for row in registry.EXPERIMENTS if row.resumable)
            raise InputError(f"resume=True continues a run checkpointed in a session: give session=NAME "
                             f"and one of {resumable}")
        if not entry.needs_model:
            check_device(str(getattr(chosen, "device", "auto")))  # growth and toy-depth train on their own
        model = (model or _default_model(progress)) if entry.needs_model else None
        if model is not None:
            _model_checks(entry, chosen, model.loaded)
        options = model.options if model is not None else None
        store = SessionStore()  # the session's earlier results the run reads (none in a new one), then its own
        source = chosen.inputs_from() or (session if session is not None and store.exists(session) else None)
        inputs = store.open(source).results_named(entry.reads) if source else {}
        stored = _stored(store, session, options, chosen, entry.writes) if session is not None else None
        token = CancelToken()
        context = RunContext(
            model=model.loaded if model is not None else None, cancel=token, inputs=inputs, resume=resume,
            checkpoint_dir=stored.checkpoint_dir(entry.name) if stored is not None and entry.resumable else None,
            output_dir=stored.path if stored is not None else None,
        )  # fmt: skip
        show = _Bar(entry.name, progress, on_event)
        events = entry.run(chosen, context)
        try:
            with _interrupt_cancels(token, show):
                if stored is None:
                    result = _drain(events, show)
                else:
                    spec = {**chosen.to_dict(), "model": model.loaded.describe() if model is not None else None}
                    result = run_job(stored, entry.name, spec, events, on_event=show, settings=chosen.to_dict(),
                                     model=options.to_dict() if options is not None else None, resume=resume)
        finally:
            events.close()  # a run stopped between two events puts back what it changed now
            show.close()
    kept = tuple(event for event in show.events if not event.kind.startswith("job."))
    where = stored.name if stored is not None else None
    if result is None:
        line = f"{entry.name} cancelled; the events it sent are in .events (.to_pandas() reads them)"
        if entry.resumable and where is not None:
            line += f"; continue it with run({entry.name!r}, session={where!r}, resume=True, ...)"
        show.write(line)
        return RunResult(entry.name, entry.writes, None, None, kept, where, partial=True)
    return typed(entry.name, result.name, result.data, events=kept, session=where)
