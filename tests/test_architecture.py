"""ARCHITECTURE.md's tables agree with the code, read the way ``.ci/run`` reads the README: the layer table
is ``test_layout.LAYERS`` top first, the engine's module table names every module of ``engine/``, the verb
table every public verb of ``Engine`` (and ``open_local``), and the combine table every combine of
``engine/combine.py``. A row added to the code
and not to the page, or the other way round, fails here. And every code name or file path a document shows
in backticks (ARCHITECTURE, CONTRIBUTING, README, BENCHMARKS) still exists."""

import ast
import pathlib
import re

import pytest

from tests.test_layout import LAYERS

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "ARCHITECTURE.md"


def table(text, heading):
    """The first cells of the rows of the table whose header row starts with ``heading``."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[at + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append(line.split("|")[1].strip())
    return rows


def code_names(cell):
    """The backticked names of a cell, each cut at its first parenthesis: `engine.reduce(a, b)` -> engine.reduce."""
    return [re.split(r"[(\[]", name, maxsplit=1)[0] for name in re.findall(r"`([^`]+)`", cell)]


def unit(name):
    """`algorithms/` -> algorithms, `api.py` -> api."""
    return name.rstrip("/").removesuffix(".py")


def page_layers(text):
    return [{unit(n) for n in code_names(cell)} for cell in table(text, "| layer")]


def page_verbs(text):
    verbs = set()
    for cell in table(text, "| verb"):
        for name in code_names(cell):
            verbs.add(name.removeprefix("engine."))
    return verbs


def page_combines(text):
    return {name for cell in table(text, "| combine") for name in code_names(cell)}


def class_body(path, name):
    tree = ast.parse(path.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def engine_verbs():
    """Public methods and properties of ``Engine``, ``summary`` (set in ``__init__``) and ``open_local``."""
    body = class_body(ROOT / "dask_clust/engine/ops.py", "Engine").body
    names = {n.name for n in body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    return names | {"summary", "open_local"}


def combine_classes():
    """Classes of combine.py with the combine protocol (lift, add, finish), public, not the protocols."""
    tree = ast.parse((ROOT / "dask_clust/engine/combine.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def methods(cls):
        own = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                own |= methods(classes[base.id])
        return own

    def protocol(cls):
        return any(isinstance(b, ast.Name) and b.id == "Protocol" for b in cls.bases)

    return {
        name
        for name, cls in classes.items()
        if not name.startswith("_") and not protocol(cls) and {"lift", "add", "finish"} <= methods(cls)
    }


def test_the_layer_table_is_test_layouts_list_top_first():
    assert page_layers(PAGE.read_text()) == [set(units) for units in reversed(LAYERS)]


def test_the_verb_table_names_every_verb_of_the_engine():
    assert page_verbs(PAGE.read_text()) == engine_verbs()


def test_the_module_table_names_every_engine_module():
    listed = {name for cell in table(PAGE.read_text(), "| module") for name in code_names(cell)}
    assert listed == {p.name for p in (ROOT / "dask_clust/engine").glob("*.py") if p.name != "__init__.py"}


def test_the_combine_table_names_every_combine():
    assert page_combines(PAGE.read_text()) == combine_classes()


@pytest.mark.parametrize(
    "edit",
    [
        ("| `engine/` |", "| `engine/`, `tls.py` |"),  # a layer that does not exist
        ("| `kernels/` |", "| `kernel/` |"),
        # a renamed verb
        ('| `engine.take(ids, weights=False, first_pass="before", dense=True)` |', "| `engine.fetch(ids)` |"),
        ("| `RowTop(r)` |", "| `RowTopK(r)` |"),  # a renamed combine
    ],
)
def test_a_mismatch_on_the_page_is_caught(edit):
    text = PAGE.read_text()
    assert edit[0] in text
    broken = text.replace(edit[0], edit[1], 1)
    assert (
        page_layers(broken) != [set(u) for u in reversed(LAYERS)]
        or page_verbs(broken) != engine_verbs()
        or page_combines(broken) != combine_classes()
    )


DOCUMENTS = ("ARCHITECTURE.md", "CONTRIBUTING.md", "README.md", "benchmarks/BENCHMARKS.md")
# placeholders the documents show in code type that name nothing of the tree
NOT_NAMES = {"_name"}
FILE_TYPES = ("py", "md", "toml", "json", "npy", "yaml", "csv", "zarr", "parquet", "txt", "png", "sh")


def code_words():
    """Every identifier of the tree's Python (but this module's, which names dropped ones), and its CI script."""
    trees = ("dask_clust", "tests", "benchmarks", "deploy", "notebooks")
    sources = [p for tree in trees for p in (ROOT / tree).rglob("*.py")]
    texts = [p.read_text() for p in sources if p.resolve() != pathlib.Path(__file__).resolve()]
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(texts + [(ROOT / ".ci/run").read_text()])))


def stale_names(text, words):
    """The code names a page shows in backticks (dotted, with an underscore, or camel-cased: not prose) of
    which a part is no identifier of the code, and the file paths it shows that no file of the tree has."""
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if not {".git", ".venv"} & set(p.parts)}
    stale = set()
    for token in re.findall(r"`([^`\n]+)`", text):
        name = token.strip().removesuffix("()")
        if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name) and re.search(r"[._]|[a-z][A-Z]", name):
            parts = name.split(".")
            if parts[-1] not in FILE_TYPES and name not in NOT_NAMES and not set(parts) <= words:
                stale.add(name)
        elif re.fullmatch(r"[\w./-]+\.(py|md|toml|sh|yaml|json)", name):
            if not any(f == name or f.endswith("/" + name) for f in files):
                stale.add(name)
    return stale


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_code_name_a_document_shows_exists(document):
    """Issue #57: ARCHITECTURE.md named an ``Engine._log`` and CONTRIBUTING.md an ``ArrayOf2D`` long after
    the code had dropped them."""
    assert stale_names((ROOT / document).read_text(), code_words()) == set()


def test_a_name_the_code_dropped_is_caught():
    words = code_words()
    assert stale_names("the `ArrayOf2D` constraint, `engine/backlog.py`, `Engine.reduce`", words) == {
        "ArrayOf2D",
        "engine/backlog.py",
    }
