"""Execute ``notebooks/compare_strategies.ipynb`` on ``results/samples`` and store its outputs, so
it reads on GitHub; run it after changing the notebook, the sample records or the charts:

    .venv/bin/python scripts/refresh_notebook.py

Execution counts and timing metadata are cleared, so a refresh changes the file only where an
output changed. To run the notebook without changing it, use the headless command in its first
cell (``jupyter nbconvert --execute ... --output-dir``), which writes the executed copy elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "compare_strategies.ipynb"


def execute(path: Path = NOTEBOOK) -> nbformat.NotebookNode:
    """The notebook at ``path``, executed on the committed sample records."""
    nb = nbformat.read(path, as_version=4)
    os.environ["SHARDBENCH_RECORDS"] = "results/samples"  # from ROOT, the kernel's directory
    nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.execution_count = None
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = None
    return nb


if __name__ == "__main__":
    nbformat.write(execute(), NOTEBOOK)
    print(f"wrote {NOTEBOOK.relative_to(ROOT)}")
