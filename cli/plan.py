"""Before a run's model loads: its memory plan, printed and checked against the device's free
memory after what the model's config and tokenizer tell is checked; and the device the run asks for.
"""

from __future__ import annotations

import dataclasses
import errno
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.errors import UserError
from engine.core.process import say
from engine.core.settings import Settings
from engine.models.options import ModelOptions
from engine.registry import Experiment

if TYPE_CHECKING:
    from engine.models.memory import MemoryPlan
    from engine.models.placement import Hardware
    from engine.models.shape import ModelShape
    from engine.models.stream_plan import StreamPlan


UNREADABLE_PATH = (errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM)  # no load would read it either


def asked_device(options: ModelOptions | None, settings: Settings) -> str:
    """The --device of the run: the model's, or the settings' own (toy-depth trains on its own)."""
    return str(options.device if options is not None else getattr(settings, "device", "auto"))


def memory_plan(experiment: Experiment, settings: Settings, options: ModelOptions, quiet: bool = False,
                fits: bool = True, hardware: Hardware | None = None) -> MemoryPlan | None:
    """The run's memory plan, printed and checked against the device's free memory before the
    model loads (one line and exit 2 when it cannot fit), after what the model's config and
    tokenizer can tell is checked (engine/models/preflight.py: layers, components, texts, export folder,
    weight edits on offloaded layers); a config that cannot be read is one line too. A model that
    cannot be planned without loading it (an unusual config) gets a one-line note and no plan.
    `hardware`: where it will run when not this machine (a cluster's GPU: engine/cluster/resources.py)."""
    from engine.models.memory import MARGIN, check_fits, free_memory, plan_run, preview_model
    from engine.models.preflight import check_before_load

    preview, plan, skipped = None, None, ""
    try:
        preview = preview_model(options.model, options.trust_remote_code)
        plan = plan_run(options.model, settings, options.device, options.dtype, options.trust_remote_code,
                        options.device_map, options.max_memory, preview, hardware)
    except UserError:
        raise
    except OSError as exc:
        if exc.errno in UNREADABLE_PATH and exc.filename:  # a --model path the user gave: one line (cli/main.py)
            raise
        skipped = _first_line(exc)
    except (ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError,
            struct.error) as exc:  # a damaged GGUF header: the load says so in its own words
        lines = str(exc).strip().splitlines()
        skipped = lines[0] if lines else type(exc).__name__
    if preview is not None:  # what the config and tokenizer tell, even when no plan could be made
        check_before_load(experiment.name, settings, preview, plan)
    if plan is not None and preview is not None and plan.stream is not None and hasattr(settings, "cuts"):
        plan = dataclasses.replace(plan, stream=cut_reads(plan.stream, preview.shape, settings.cuts()))
    if plan is None:
        if not quiet:
            say(f"memory plan skipped ({skipped}); loading the model")
        return None
    if options.device_map is not None:  # spread over several devices: no single device to check against
        if not quiet:
            say(f"{plan.line()} in all, spread by --device-map {options.device_map}")
        return plan
    if not quiet:
        say(plan.line())
    if fits:  # against this machine's device (a cluster's task: against its nodes, engine/cluster/resources.py)
        free = free_memory(plan.device)
        if not streamable(settings) and (plan.stream is not None or plan.weights > MARGIN * free):
            raise UserError(whole_model_refusal(experiment.name, settings, plan, free))
        check_fits(plan, free, experiment.name)
    return plan


def streamable(settings: Settings) -> bool:
    """Whether the run can read its model layer by layer: a `stream` setting, and no lm-eval task
    (evaluate's --tasks load the whole model; its perplexity streams)."""
    return hasattr(settings, "stream") and not getattr(settings, "tasks", ())


def cut_reads(stream: StreamPlan, shape: ModelShape, cuts: Sequence[Sequence[int]]) -> StreamPlan:
    """The plan of passes that read only the kept layers (evaluate --stream: a pass per variant, the
    removed layers never): its layers and bytes those reads, the weights outside the layers once.
    Each layer's bytes are its share of the checkpoint's (the plan's own layer-0 estimate)."""
    reads = sum(shape.n_layers - len(set(cut)) for cut in cuts)
    outer = shape.params - shape.n_layers * shape.layer_params
    return dataclasses.replace(stream, layers=reads,
                               read_bytes=stream.read_bytes * (outer + reads * shape.layer_params) // shape.params)


def whole_model_refusal(name: str, settings: Settings, plan: MemoryPlan, free: int) -> str:
    """The line for a run that needs the whole model in memory (it does not stream: it edits, trains,
    exports or generates) on a device that cannot hold its weights: what does stream, and what else fits
    (an offloaded layer only where the run neither trains nor edits weights: docs/gpus.md)."""
    from engine.registry import EXPERIMENTS

    streamed = ", ".join(entry.name for entry in EXPERIMENTS if "stream" in entry.settings_class.__dataclass_fields__)
    fits = ["a device with room", *(["--dtype float16"] if plan.dtype == "float32" else []),
            *(["--stream without --tasks (the perplexity only)"] if hasattr(settings, "stream") else []),
            *([] if plan.training or settings.edits_weights() else
              ["--device-map auto (layers offloaded to the CPU and disk)"])]
    return (f"{name} loads the whole model ({plan.weights / 1e9:.2f} GB in {plan.dtype}) but {free / 1e9:.2f} GB is "
            f"free on {plan.device}; streamed: {streamed} (--stream) read it layer by layer; for {name}: "
            f"{', or '.join(fits)}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
