"""The fast tier (``pytest -m "not cluster"``) is what the tests' own marks say: a module whose tests all start
processes carries ``pytestmark = pytest.mark.cluster``, any other such test ``@pytest.mark.cluster``. This
test checks the marks against what each test does, so that the tier stays true as tests are written."""

import inspect

# what a test (or a fixture it uses) does when it starts processes: a cluster's workers, a CLI, a kernel
PROCESSES = (
    "LocalCluster(",
    "local_cluster(",
    "subprocess",
    "nbclient",
    "hpc_cluster(",
    "Client(",
    "separate_cluster(",
)


def starts_processes(fn, seen):
    """Whether ``fn``, or a function of the test suite it calls (by name, through its module's globals),
    starts processes."""
    fn = inspect.unwrap(fn)
    if fn in seen or not getattr(fn, "__module__", "").startswith("tests"):
        return False
    seen.add(fn)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    if any(word in source for word in PROCESSES):
        return True
    code = getattr(fn, "__code__", None)
    names = set(code.co_names) if code else set()
    for const in code.co_consts if code else ():  # nested functions' names too
        names |= set(getattr(const, "co_names", ()))
    called = [fn.__globals__.get(name) for name in names]
    return any(callable(f) and starts_processes(f, seen) for f in called)


def test_every_test_that_starts_processes_is_marked_cluster_and_no_other(request):
    """Each collected test that starts processes, itself or through a fixture, is marked ``cluster``; a test
    marked by itself starts them (a module's mark covers tests that only run on its clusters' fixtures
    in ways this reading cannot follow, such as the benchmark harness's suites)."""
    unmarked, needless = [], []
    for item in request.session.items:
        fns = [getattr(item, "function", None)] + [
            d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
        ]
        seen = set()
        starts = any(fn is not None and starts_processes(fn, seen) for fn in fns)
        module_marks = getattr(item.module, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        module_marked = any(m.name == "cluster" for m in module_marks)
        own = any(m.name == "cluster" for m in getattr(item.function, "pytestmark", []))
        if starts and not (module_marked or own):
            unmarked.append(item.nodeid)
        if own and not starts:
            needless.append(item.nodeid)
    assert not unmarked, f"tests that start processes without @pytest.mark.cluster: {unmarked}"
    assert not needless, f"tests marked cluster that run in-process: {needless}"
