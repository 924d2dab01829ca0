"""The package's layers (ARCHITECTURE.md, CONTRIBUTING.md), read from the source with ``ast`` (nothing is
imported): imports point down only, no import cycle between modules, only ``engine/`` imports
``distributed`` (``deploy/`` its ``Security`` settings object), no module imports another's ``_private`` name,
and the benchmark harness is outside the package."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "dask_clust"

# lowest first: a module may import modules of its own layer and of the layers below
LAYERS = (
    ("errors",),
    ("_random", "_params", "outputs", "datasets", "deploy", "progress", "loop", "checkpoint"),
    ("kernels",),
    ("engine",),
    ("blocks",),
    ("algorithms",),
    ("models", "metrics", "mixture"),
    ("api", "estimators", "sweeps"),
    ("cli", "warmup", "__init__"),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def unit(module):
    """The layer unit of a module: its top-level file or folder under dask_clust."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(module):
    """(imported module, names, at module level) for every import statement of ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body} | {
        id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = tuple(a.name for a in node.names)
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            for sub in subs:  # ``from . import kmeans``: the submodule, not the package
                yield sub, (), id(node) in top
            rest = tuple(n for n in names if f"{target}.{n}" not in MODULES)
            if rest:
                yield target, rest, id(node) in top


def own(target):
    """The dask_clust module an import names (a name imported from a package resolves to the package)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_every_module_sits_in_a_layer():
    assert {unit(m) for m in MODULES} <= set(RANK), {unit(m) for m in MODULES} - set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_and_name_nothing_private(module):
    for target, names, _ in imports(module):
        if not target.startswith("dask_clust"):
            assert target.split(".")[0] not in ("harness", "benchmarks"), (module, target)
            # deploy/ builds TLS settings for the clusters it describes: distributed's Security, nothing that talks
            if target.split(".")[0] == "distributed" and (unit(module), target) != ("deploy", "distributed.security"):
                assert unit(module) == "engine", f"{module} imports {target}: only engine/ talks to Dask"
            continue
        assert RANK[unit(own(target))] <= RANK[unit(module)], f"{module} imports {target}, a layer above it"
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{module} imports {private} from {target}"


def test_no_import_cycle_between_modules():
    """Module-level imports only (a function's import runs after every module has loaded)."""
    graph = {m: {own(t) for t, _, top in imports(m) if top and t.startswith("dask_clust")} - {m, None} for m in MODULES}
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m) :] + [m]))
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            visit(n)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_the_benchmark_harness_is_not_in_the_package():
    assert not (ROOT / "bench").exists()
    assert (ROOT.parent / "benchmarks" / "harness" / "suites.py").is_file()


def positional_params(source):
    """Lines of ``source`` that unpack a step's ``params`` (or a part of it) by position: ``a, b = params``,
    ``*a, b = params[1:]``, ``a, b = params.draw``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], (ast.Tuple, ast.List)):
            value = node.value
            while isinstance(value, (ast.Subscript, ast.Attribute)):
                value = value.value
            if isinstance(value, ast.Name) and value.id == "params":
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("layer", ["algorithms", "blocks"])
def test_steps_read_their_parameters_by_name(layer):
    """Issue #57: a step's parameters are a NamedTuple read by name, not a tuple unpacked in an order only its
    caller knows."""
    found = {p.name: positional_params(p.read_text()) for p in sorted((ROOT / layer).glob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_positional_parameters_are_found():
    source = "def step(chunk, params):\n    a, b = params\n    *c, d = params[1:]\n    e, f = params.draw\n"
    assert positional_params(source) == [2, 3, 4]
    assert positional_params("def step(chunk, params):\n    a, b = params.a, params.b\n") == []


# the calls whose result is a step's fields: an engine call (``reduce``), a Lloyd model's step and last pass
STEP_RESULTS = {"reduce", "step", "assigned_qe"}


def positional_results(source):
    """Lines of ``source`` that unpack a step's combined fields by position: ``a, b = engine.reduce(...)``,
    ``(x,) = engine.reduce(...)``, ``a, b = model.step()``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], (ast.Tuple, ast.List)):
            value = node.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in STEP_RESULTS
            ):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("layer", ["algorithms", "blocks"])
def test_step_results_are_read_by_name(layer):
    """Issue #57: a step's combined fields come back as the NamedTuple its return annotation names
    (``Engine.reduce``) and are read by name, not unpacked in an order only the step knows."""
    found = {p.name: positional_results(p.read_text()) for p in sorted((ROOT / layer).glob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_positional_results_are_found():
    source = (
        "a, b = engine.reduce(step)\n(c,) = self.engine.reduce(s, p)\nd, e = model.step()\nf = engine.reduce(s).x\n"
    )
    assert positional_results(source) == [1, 2, 3]


# what an engine module may read of another object's underscored names: a NamedTuple's API and a dask
# array's meta (both public in all but name)
PUBLIC_UNDERSCORED = {"_make", "_replace", "_fields", "_asdict", "_meta"}


def reached_privates(source):
    """``obj._name`` reads in ``source`` where obj is not ``self`` or ``cls``: one part reaching into another."""
    return [
        ast.unparse(n)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Attribute)
        and n.attr.startswith("_")
        and not n.attr.startswith("__")
        and n.attr not in PUBLIC_UNDERSCORED
        and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
    ]


def engine_classes():
    for path in sorted((ROOT / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield path.name, node


def test_the_engine_is_composed_of_parts():
    """Issue #57: the cluster side was one object spread over three files as mixins reading each other's
    state. Now no engine class has more than one base besides ``Protocol`` (no mixins), none is over 300 lines,
    and no engine module reads another object's private names."""
    for name, node in engine_classes():
        bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) != "Protocol"]
        assert len(bases) <= 1, (name, node.name, bases)
        assert node.end_lineno - node.lineno < 300, (name, node.name, node.end_lineno - node.lineno + 1)
    for path in sorted((ROOT / "engine").glob("*.py")):
        assert not reached_privates(path.read_text()), (path.name, reached_privates(path.read_text()))


def test_reached_privates_are_found():
    assert reached_privates("backend._part_futures[0]\nself._x\nparams._replace(a=1)\nX._meta") == [
        "backend._part_futures"
    ]


def test_no_algorithm_module_is_over_600_lines():
    """Issue #52: an algorithm's module is its config and fit; its steps go to ``blocks/`` before it passes
    600 lines (vcgmm.py was 1,019 lines of two algorithms and a family; slk.py reached 613)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "algorithms").glob("*.py"))}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


# scikit-learn's covariance types and vc-GMM's, as ``covariance_type`` names them
COVARIANCE_TYPES = {"tied-spherical", "spherical", "diag", "full", "tied"}


def covariance_type_tests(source):
    """Lines of ``source`` that dispatch on a covariance type by its name: a comparison (``==``, ``in``, ...)
    with one of the names (or a literal tuple, list or set holding one), or a dict keyed by the names. Checking
    that a name is valid (``covariance_type in COVARIANCE_TYPES``) is not dispatching on it."""

    def a_name(node):
        return isinstance(node, ast.Constant) and node.value in COVARIANCE_TYPES

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            a_name(n) or (isinstance(n, (ast.Tuple, ast.List, ast.Set)) and any(map(a_name, n.elts)))
            for n in (node.left, *node.comparators)
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(map(a_name, node.keys)):
            lines.append(node.lineno)
    return lines


def test_no_covariance_type_is_compared_outside_the_gaussian_family():
    """Issue #52: the Gaussian family (``blocks/gaussian.py``: one class per covariance type) is the only
    place that tells the types apart by name; everything else asks the type's class."""
    found = {
        name: covariance_type_tests(path.read_text())
        for name, path in MODULES.items()
        if name != "dask_clust.blocks.gaussian"
    }
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_covariance_type_tests_are_found():
    source = (
        'if cov == "full":\n    pass\n'
        'if covariance_type in ("diag", x):\n    pass\n'
        'ok = self.covariance_type != "tied-spherical"\n'
        'steps = {"tied": 1}\n'
        'fine = cfg.name == "kmeans"\n'
        "valid = covariance_type in COVARIANCE_TYPES\n"
        "auto = covariance(cfg.covariance_type).auto_start is not None\n"
    )
    assert covariance_type_tests(source) == [1, 3, 5, 6]
