"""The parts of a session folder the store and the experiments share, named once. The store lays
the folder out and guards it (sessions/store.py); experiments write into the parts a RunContext
hands them (growth's final models under the session folder, recovery's recovered layers in its
checkpoint folder); every front end finds the log, the jobs' logs and the saved models by the same
names. Here, below the store, so engine, sessions and tui can all import it. The parts only the
console uses (its event index, log, view and saved figures) are named in tui/session_files.py.

    <session>/MANIFEST        schema version, model, settings, versions, times
              EVENTS          every event, appended and flushed line by line
              RESULTS/<x>.json  one document per finished experiment
              JOBS/<id>.json  each job's command, pid and status
              CHECKPOINTS/<experiment>/  what a resumable job needs (recovery: LAYER_WEIGHTS/ too)
              LOGS/           the output of jobs a front end started in the background
              GROWTH_MODELS/  the growth run's final models
"""

from __future__ import annotations

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
RESULTS = "results"
JOBS = "jobs"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
GROWTH_MODELS = "growth_models"
LAYER_WEIGHTS = "weights"  # in an experiment's checkpoint folder: each layer it changed (recovery)

FOLDERS = (RESULTS, JOBS, CHECKPOINTS, LOGS, GROWTH_MODELS)  # the parts that are folders
