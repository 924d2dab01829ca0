"""deploy/: every config a user applies is checked offline, and every check is shown to fail on a broken value.

The oracles are the tools a cluster would apply (Helm's linter and renderer, the Kubernetes OpenAPI
schemas of kubernetes-validate, the operator's CRD through check-jsonschema, yamllint) and the
arithmetic a worker pod must satisfy (threads = CPU limit, dask's memory limit = the pod's, requests =
limits), computed here from the files themselves.
"""
import copy
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dask.utils import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBE_VERSION = "1.33.0"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/dask-clust/dask-clust:{VERSION}"
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         **{p + "i": 2 ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")}}


def load(rel):
    return yaml.safe_load((DEPLOY / rel).read_text())


def quantity(value):
    """A Kubernetes quantity as a number; negative or malformed ones raise ValueError."""
    m = QUANTITY.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity")
    return float(m.group(1)) * SCALE[m.group(2)]


def pod_problems(where, replicas, threads, limits, requests, dask_memory_limit):
    """What makes a worker pod inconsistent: threads must equal the CPU limit (more threads than CPUs
    thrash the numba pool), dask's memory limit must equal the pod's (a larger one gets the pod
    OOM-killed before dask spills), and requests must equal limits (Guaranteed QoS: no eviction)."""
    problems = []
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        problems.append(f"{where}: replicas must be a positive integer, not {replicas!r}")
    try:
        cpu, memory = quantity(limits["cpu"]), quantity(limits["memory"])
        if (quantity(requests["cpu"]), quantity(requests["memory"])) != (cpu, memory):
            problems.append(f"{where}: requests {requests} differ from limits {limits}")
        if cpu < 1 or threads != cpu:
            problems.append(f"{where}: {threads!r} threads for a CPU limit of {limits['cpu']!r}")
        if not 0 < parse_bytes(str(dask_memory_limit)) == memory:
            problems.append(f"{where}: dask memory limit {dask_memory_limit!r} is not the pod's {limits['memory']!r}")
    except (KeyError, ValueError) as e:
        problems.append(f"{where}: {e}")
    return problems


def dask_chart_problems(v):
    w = v["worker"]
    problems = pod_problems("worker", w["replicas"], w["threads_per_worker"], w["resources"]["limits"],
                            w["resources"]["requests"], w["resources"]["limits"]["memory"])
    if v["scheduler"]["serviceType"] != "ClusterIP" or v["webUI"]["ingress"]["enabled"]:
        problems.append("the scheduler and dashboard must stay cluster-internal by default")
    if v["jupyter"]["enabled"]:
        problems.append("Jupyter must be opt-in")
    return problems


def daskhub_problems(v):
    w = v["dask-gateway"]["gateway"]["backend"]["worker"]
    limits = {"cpu": w["cores"]["limit"], "memory": w["memory"]["limit"]}
    requests = {"cpu": w["cores"]["request"], "memory": w["memory"]["request"]}
    problems = pod_problems("gateway worker", 1, w["threads"], limits, requests, limits["memory"])
    env = v["jupyterhub"]["singleuser"]["extraEnv"]
    if env.get("DASK_GATEWAY__CLUSTER__OPTIONS__IMAGE") != "{JUPYTER_IMAGE_SPEC}":
        problems.append("gateway workers must run the singleuser image")
    return problems


def arg(args, flag):
    return args[args.index(flag) + 1]


def daskcluster_problems(dc):
    worker = dc["spec"]["worker"]
    (c,) = worker["spec"]["containers"]
    problems = pod_problems("DaskCluster worker", worker["replicas"], int(arg(c["args"], "--nthreads")),
                            c["resources"]["limits"], c["resources"]["requests"], arg(c["args"], "--memory-limit"))
    if dc["spec"]["scheduler"]["service"]["type"] != "ClusterIP":
        problems.append("the scheduler service must stay cluster-internal by default")
    return problems


# --- yamllint ---------------------------------------------------------------------------------------

def yamllint_problems(text, path):
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    return list(linter.run(text, YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml")), path))


def test_every_yaml_file_under_deploy_is_strictly_lint_clean():
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(files) >= 5
    for f in files:
        assert yamllint_problems(f.read_text(), str(f)) == [], f


def test_yamllint_fails_on_a_duplicate_key():
    text = (DEPLOY / "helm/dask-values.yaml").read_text().replace("  replicas: 4\n", "  replicas: 4\n  replicas: 5\n")
    assert any("duplication" in p.message for p in yamllint_problems(text, "dask-values.yaml"))


# --- the image --------------------------------------------------------------------------------------

def images_in_configs():
    dask, hub, dc = load("helm/dask-values.yaml"), load("helm/daskhub-values.yaml"), load("kubernetes/daskcluster.yaml")
    for part in ("scheduler", "worker", "jupyter"):
        yield f"{dask[part]['image']['repository']}:{dask[part]['image']['tag']}"
    for image in (hub["jupyterhub"]["singleuser"]["image"], hub["dask-gateway"]["gateway"]["backend"]["image"]):
        yield f"{image['name']}:{image['tag']}"
    for part in ("scheduler", "worker"):
        yield from (c["image"] for c in dc["spec"][part]["spec"]["containers"])


def test_every_config_runs_the_image_of_this_version():
    images = list(images_in_configs())
    assert len(images) == 7 and set(images) == {IMAGE}


def test_dockerfile_pins_python_runs_as_a_user_and_documents_the_tag():
    text = (DEPLOY / "docker/Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-\w+", base), base
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^RUN pip install "/src\[[^]]*\]"', text, re.M)
    assert f"-t {IMAGE} ." in text


# --- the dask and daskhub charts' values ------------------------------------------------------------

def test_dask_chart_values_are_consistent():
    assert dask_chart_problems(load("helm/dask-values.yaml")) == []


def test_daskhub_values_are_consistent():
    assert daskhub_problems(load("helm/daskhub-values.yaml")) == []


@pytest.mark.parametrize("path, value, complaint", [
    (("worker", "replicas"), "four", "replicas must be a positive integer"),
    (("worker", "resources", "limits", "memory"), "-16Gi", "not a non-negative Kubernetes quantity"),
    (("worker", "threads_per_worker"), 8, "8 threads for a CPU limit of 4"),
    (("worker", "resources", "requests", "cpu"), 2, "requests"),
    (("scheduler", "serviceType"), "LoadBalancer", "cluster-internal"),
])
def test_dask_chart_check_fails_on_a_broken_value(path, value, complaint):
    v = copy.deepcopy(load("helm/dask-values.yaml"))
    node = v
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(complaint in p for p in dask_chart_problems(v))


def test_daskhub_check_fails_when_requests_differ_from_limits():
    v = copy.deepcopy(load("helm/daskhub-values.yaml"))
    v["dask-gateway"]["gateway"]["backend"]["worker"]["memory"]["request"] = "32G"
    assert any("requests" in p for p in daskhub_problems(v))


# --- the dask-kubernetes operator chart: rendered, strictly linted, manifests validated --------------

@pytest.fixture(scope="module")
def operator_chart():
    import dask_kubernetes

    path = Path(dask_kubernetes.__file__).parent / "operator/deployment/helm/dask-kubernetes-operator"
    assert (path / "Chart.yaml").is_file()
    return path


def render(chart, values):
    import helm_python as helm

    with helm.Chart.load(chart) as c:
        rendered = c.render(values, name="dask-operator", namespace="dask-operator")
    return [doc for name, text in rendered.items() if name.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def manifest_errors(docs):
    import kubernetes_validate

    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{doc['kind']}: {e.message}")
    return errors


def lint_errors(chart, values):
    import helm_python as helm

    return helm.lint(chart, values, strict=True, namespace="dask-operator", kube_version=KUBE_VERSION)["errors"]


def test_operator_chart_lints_strictly_and_renders_valid_manifests(operator_chart):
    values = load("helm/operator-values.yaml")
    assert lint_errors(operator_chart, values) == []
    docs = render(operator_chart, values)
    kinds = sorted(d["kind"] for d in docs)
    assert "Deployment" in kinds and "ServiceAccount" in kinds
    assert manifest_errors(docs) == []
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":" + values["image"]["tag"])


def test_helm_lint_fails_on_a_broken_value(operator_chart):
    assert lint_errors(operator_chart, {**load("helm/operator-values.yaml"), "image": "latest"})


def test_manifest_validation_fails_on_a_broken_value(operator_chart):
    values = {**load("helm/operator-values.yaml"), "livenessProbe": {"timeoutSeconds": "five"}}
    assert any("'five' is not of type 'integer'" in e for e in manifest_errors(render(operator_chart, values)))


# --- the DaskCluster resource ------------------------------------------------------------------------

def check_jsonschema(path):
    schema = DEPLOY / "kubernetes/daskcluster.schema.json"
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(path)],
                          capture_output=True, text=True)


def test_daskcluster_validates_against_the_operator_schema():
    result = check_jsonschema(DEPLOY / "kubernetes/daskcluster.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert daskcluster_problems(load("kubernetes/daskcluster.yaml")) == []


@pytest.mark.parametrize("old, new, complaint", [
    ("    replicas: 4\n", "    replicas: four\n", "'four' is not of type 'integer'"),
    ("              memory: 16Gi\n", "              memory: -16Gi\n", "'-16Gi' does not match"),
    ("    replicas: 4\n", "    replica: 4\n", "'replica' was unexpected"),
])
def test_daskcluster_schema_check_fails_on_a_broken_value(tmp_path, old, new, complaint):
    text = (DEPLOY / "kubernetes/daskcluster.yaml").read_text()
    assert old in text
    broken = tmp_path / "daskcluster.yaml"
    broken.write_text(text.replace(old, new, 1))
    result = check_jsonschema(broken)
    assert result.returncode == 1 and complaint in result.stdout, result.stdout


def test_daskcluster_check_fails_when_threads_exceed_the_cpu_limit():
    dc = copy.deepcopy(load("kubernetes/daskcluster.yaml"))
    args = dc["spec"]["worker"]["spec"]["containers"][0]["args"]
    args[args.index("--nthreads") + 1] = "16"
    assert any("16 threads" in p for p in daskcluster_problems(dc))


def test_kept_schema_is_the_one_derived_from_the_installed_operator_crd():
    spec = importlib.util.spec_from_file_location("derive_schema", DEPLOY / "kubernetes/derive_schema.py")
    derive_schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive_schema)
    path, source = derive_schema.installed_crd()
    expected = derive_schema.render(derive_schema.derive(yaml.safe_load(path.read_text()), source))
    assert (DEPLOY / "kubernetes/daskcluster.schema.json").read_text() == expected
