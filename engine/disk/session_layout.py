"""The parts of a session folder, named once. The store lays the folder out and guards it
(sessions/store.py); experiments write into the parts a RunContext hands them (growth's final
models under the session folder, recovery's recovered layers in its checkpoint folder); the console
finds its log, the jobs' logs and the saved models by the same names. Here, below the store, so
engine, sessions and tui can all import it.

    <session>/MANIFEST        schema version, model, settings, versions, times
              EVENTS          every event, appended and flushed line by line
              EVENT_INDEX     which lines of EVENTS the console's panels depend on (tui/event_index.py)
              RESULTS/<x>.json  one document per finished experiment
              JOBS/<id>.json  each job's command, pid and status
              CHECKPOINTS/<experiment>/  what a resumable job needs (recovery: LAYER_WEIGHTS/ too)
              LOGS/           the output of jobs the console started
              APP_LOG         the console's log file
              CONSOLE_VIEW    where the console was: its selected layer, tab and forms (tui/console_view.py)
              GROWTH_MODELS/  the growth run's final models
              FIGURES/        figures the console saved (its key F8: the panel in view's)
"""

from __future__ import annotations

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
EVENT_INDEX = "events.index.json"
RESULTS = "results"
JOBS = "jobs"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
APP_LOG = "app.log"
CONSOLE_VIEW = "console.json"
GROWTH_MODELS = "growth_models"
FIGURES = "figures"
LAYER_WEIGHTS = "weights"  # in an experiment's checkpoint folder: each layer it changed (recovery)

FOLDERS = (RESULTS, JOBS, CHECKPOINTS, LOGS, GROWTH_MODELS, FIGURES)  # the parts that are folders
# none may be a symbolic link
PARTS = (MANIFEST, EVENTS, EVENT_INDEX, RESULTS, JOBS, CHECKPOINTS, LOGS, APP_LOG, GROWTH_MODELS, FIGURES,
         CONSOLE_VIEW)
