"""The console's model and the prompt pane, for the console's policy (tui/lab.py): loading it (and
whether a new session's layer map starts then), the marks of the modified model, the prompt pane's
variants and the generation in progress.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from engine.core.errors import UserError
from engine.experiments.variants import Variant, pruned_layers, saved_model_path
from sessions.layer_weights import saved_layers
from tui.lab_base import Generation, LabBase, log
from tui.marks import Marks
from tui.state import Dirty


class LabModel(LabBase):
    """The console's model: loaded off the UI thread, shared by the layer map and the prompt pane."""

    # the console's model ---------------------------------------------------------------------------
    def load_model(self) -> None:
        """The console's model, loading (at start, and again after a job that needed the GPU to itself)."""
        self.model_status = f"model: loading {self.options.model}…"
        self._start_load(self.options)
        self._status_changed()

    def model_loaded(self, loaded: Any) -> bool:
        """Keeps the loaded model; True when this session has no layer map yet and should start one
        now (the first run's map; `ConsoleSettings.auto_map` turns it off)."""
        self.loaded = loaded
        self.model_status = f"{loaded.name} · {loaded.device} · {loaded.dtype_name} · {loaded.n_layers} layers"
        if loaded.device_map:  # spread over devices: say where the layers live
            from engine.models.placement import placement_text

            self.model_status += f" · {placement_text(loaded.layer_devices)}"
        log.info("model loaded: %s", self.model_status)
        if (kept := self.marks.within(loaded.n_layers)) != self.marks:  # a saved mark of a deeper model
            self.say(f"marks beyond this model's {loaded.n_layers} layers dropped", "warning")
            self.set_marks(kept)
        self.state.dirty.update({Dirty.LAYERS, Dirty.JOBS})
        self._status_changed()
        if not self.settings.auto_map or self.session is None or "ablation" in self.state.results:
            return False
        busy = any(job.experiment == "ablation" for job in self.state.running_jobs())
        if busy or self.session.jobs():
            return False
        log.info("no layer map in this session yet: computing it")
        return True

    def model_progress(self, text: str) -> None:
        if self.loaded is None:
            self.model_status = f"model: {text}"
            self._status_changed()

    def model_failed(self, error: str) -> str:
        """The load failed: the status line says why, in one line (the whole error goes to the log);
        returns that line, for the offer of another model."""
        lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
        reason = lines[0] if lines else "no reason given"
        self.model_status = f"model: {self.options.model} could not load: {reason}"
        self.say(f"loading {self.options.model} failed: {error}", "error")
        self._status_changed()
        return reason

    def choose_model(self, name: str) -> str:
        """Another model for this session (after one that could not load), kept in its manifest so it
        reopens with it, and loaded now; or, where `name` names no model (a path that is not there),
        why, at once and nothing changed."""
        from engine.models.sources import DEFAULT_MODEL, resolve

        if name != DEFAULT_MODEL:  # the embedded model's wheel is found (or fetched) by the load
            try:
                resolve(name)
            except UserError as exc:
                return str(exc)
        self.options = replace(self.options, model=name)
        if self.session is not None:
            self.session.update_manifest(model=name)
        self.say(f"this session's model is now {name}")
        self.load_model()
        return ""

    def growth_preview_wanted(self) -> bool:
        """Whether the growth panel still wants the phases its form would run (none drawn yet)."""
        return self.state.growth.plan is None

    def growth_previewed(self, flags: tuple[str, ...], arms: dict[str, Any]) -> None:
        self.state.growth_preview = (" ".join(flags), arms)
        self.state.dirty.add(Dirty.GROWTH)

    # the prompt pane -------------------------------------------------------------------------------
    @property
    def marks(self) -> Marks:
        """The layers and blocks marked for the modified model (kept in the session's console.json)."""
        return self.view.marks

    def set_marks(self, marks: Marks) -> None:
        self.view, self.view_changes = replace(self.view, marks=marks), True
        self.state.dirty.add(Dirty.MARKS)
        self.say(f"modified model: {marks.describe() or 'nothing marked, it answers as the original'}")

    def toggle_mark(self, layer: int) -> None:
        """Marks `layer` whole in the modified model (neighbour mean; noised in the noised one), or unmarks it."""
        self.set_marks(self.marks.toggle_layer(layer))

    def toggle_block_mark(self, layer: int, part: str) -> None:
        """Marks block `part` of `layer` removed in the modified model, or unmarks it."""
        self.set_marks(self.marks.toggle_block(layer, part))

    def variant(self, choice: str, sigma: float) -> tuple[Variant | None, str]:
        """The prompt pane's model `choice` in this session, with `sigma` for the noised one; or none
        and why (`problem`): what it is made from is not in the session yet."""
        assert self.session is not None
        layers = self.marks.sorted_layers
        problem, path, chosen = "", None, layers
        if choice == "recovered" and not saved_layers(self.session, "recovery"):
            problem = "no recovered layer in this session yet (inject noise: key i)"
        elif choice == "pruned":
            from engine.experiments.prune.vocabulary import PruneResult  # here: read only for the prompt pane

            chosen = pruned_layers(self.state.result(PruneResult))
            problem = "" if chosen else "no prune result in this session yet (anatomy-tui run prune)"
        elif choice in ("growth", "uniform"):
            from engine.experiments.growth.vocabulary import GrowthResult  # here: read only for the prompt pane

            try:
                path = saved_model_path(self.state.result(GrowthResult), choice, self.session.path)
                problem = "" if path else f"no {choice} model in this session yet (run growth: key g)"
            except UserError as exc:  # a folder outside the session (a forged result): never loaded
                problem = str(exc)
        if problem:
            return None, problem
        blocks = self.marks.sorted_blocks if choice == "modified" else ()
        return Variant(choice, layers=chosen, sigma=sigma, path=path, blocks=blocks), ""

    def new_generation(self) -> Generation | None:
        """A new generation, the running one stopped first; None (said why) without a model."""
        if self.session is None or not self.need_model():
            return None
        self.stop_generation()
        self.generations += 1
        self.generation = Generation(self.generations, threading.Event())
        return self.generation

    def current_generation(self, run: int) -> bool:
        return self.generation is not None and run == self.generation.run

    def generation_done(self, run: int) -> None:
        if self.current_generation(run):
            self.generation = None

    def stop_generation(self) -> None:
        if self.generation is not None:
            self.generation.stop.set()
