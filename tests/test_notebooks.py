"""Execute every notebook in notebooks/ (jupytext "percent" .py files) top to bottom in a fresh kernel.

A notebook passes when no cell errors and the run leaves the repository as it found it: notebooks may
write only into temporary directories of their own.

Needs jupytext, nbclient and ipykernel (plus matplotlib, which the notebooks plot with). The kernel is
ipykernel's "python3": jupyter_client finds it even without an installed kernelspec when ipykernel is
importable, and starts it with this interpreter (``sys.executable``), so the notebooks see the same
environment as the test.
"""

import html
import os
import time
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))

# papermill-style overrides injected after a notebook's parameters cell: the same cells on less work
OVERRIDES = {"03_algorithms": "n_repeats = 1  # injected by tests/test_notebooks.py"}

# files that running Python, numba or pytest may legitimately (re)write inside the repository; with
# pytest-xdist, hypothesis tests in the other process write their example database while a notebook runs
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis"}
SKIP_SUFFIXES = (".nbi", ".nbc")


# what a notebook's fit shows while it runs in a kernel (progress widgets per phase, the iterations' with the
# objective; tqdm's text bars on stderr if ipywidgets were missing) and its model's HTML view afterwards
SHOWN = {"01_quickstart": ("loading ", "kmeans iterations", "objective=")}


def test_notebooks_exist():
    # the parametrized test below would silently collect nothing if the folder went missing
    assert NOTEBOOKS, f"no notebooks found in {REPO / 'notebooks'}"


def snapshot(root):
    """{relative path: (mtime_ns, size)} of every file under root, minus caches."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if name.endswith(SKIP_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed while we walked
                continue
            files[os.path.relpath(path, root)] = (st.st_mtime_ns, st.st_size)
    return files


def shown_text(nb):
    """The text a reader sees of the notebook's progress: its widgets' values (the state nbclient stores
    in the notebook's metadata) and its stream outputs."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    texts = [str(w.get("state", {}).get("value", "")) for w in state.values()]
    texts += [
        out.get("text", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
    ]
    return html.unescape("\n".join(texts)).replace("\u2007", " ")  # tqdm's widgets space with figure spaces


def html_outputs(nb):
    return [
        out["data"]["text/html"]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if "text/html" in out.get("data", {})
    ]


def error_outputs(nb):
    errors = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
    return errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb = jupytext.read(path, fmt="py:percent")
    at = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    assert at, f"{path.name} has no papermill parameters cell"
    if path.stem in OVERRIDES:
        nb.cells.insert(at[0] + 1, nbformat.v4.new_code_cell(OVERRIDES[path.stem]))

    before = snapshot(REPO)
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    elapsed = time.perf_counter() - t0
    after = snapshot(REPO)
    print(f"{path.name}: {elapsed:.1f} s")

    assert not error_outputs(nb), error_outputs(nb)
    for text in SHOWN.get(path.stem, ()):
        assert text in shown_text(nb), f"{path.name}: no progress showing {text!r}"
    if path.stem in SHOWN:
        assert any("<table>" in h and "objective" in h and "<svg" in h for h in html_outputs(nb)), (
            f"{path.name}: no HTML view of the model"
        )
    created = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert not (created or removed or changed), (
        f"{path.name} touched the repository: created {created}, removed {removed}, changed {changed} "
        "(a false positive if something else edited the checkout while the notebook ran)"
    )
    # the kernel ran in tmp_path: anything written to the working directory is a stray file too
    assert not list(tmp_path.iterdir()), f"{path.name} wrote {sorted(os.listdir(tmp_path))} to its cwd"
