"""docs/notebook.ipynb, run top to bottom by nbclient on a real ipykernel: the embedded model loaded,
a small ablation into a session, its DataFrame, and the session read back, with no cell failing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"


def _text(cell) -> str:
    """What a code cell showed: its printed text and its value's plain text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("name") == "stdout":
            parts.append(output["text"])
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.embedded
@pytest.mark.slow
def test_the_notebook_runs_on_a_real_kernel(monkeypatch, isolated_home):
    import nbclient
    import nbformat

    # the kernel imports this checkout's packages, and keeps its sessions in the test's own home
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # kept clean
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # a cell that raises fails here (CellExecutionError), naming the cell
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    shown = [_text(cell) for cell in code]
    assert "Model('smollm2-135m': 30 layers on cpu in float32)" in shown[0]
    assert "baseline perplexity" in shown[1] and "on 10 texts" in shown[1]
    assert all(f"\n{index}  " in shown[2] for index in range(3))  # a row per layer ablated
    assert "same map as the run returned: True" in shown[3] and "jobs: ['done']" in shown[3]
    assert (isolated_home / "notebook-demo" / "results" / "ablation.json").is_file()
