"""deploy/: every config a user applies is checked offline, and every check is shown to fail on a broken value.

The oracles are the tools a cluster would apply (Helm's linter and renderer, the Kubernetes OpenAPI
schemas of kubernetes-validate, the operator's CRD through check-jsonschema, yamllint) and the
arithmetic a worker pod must satisfy (threads = CPU limit, dask's memory limit = the pod's, requests =
limits), computed here from the files themselves.
"""

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import dask
import pytest
import yaml
from dask.utils import parse_bytes
from distributed import Security

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBE_VERSION = "1.33.0"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/dask-clust/dask-clust:{VERSION}"
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
SCALE = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    **{p + "i": 2 ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")},
}


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


# --- private by default: TLS addresses and settings, locked-down pods, NetworkPolicies ------------------

# every container of a scheduler or worker pod (and the operator's)
CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
DASK_ADDRESS = re.compile(r"\b([a-z]+)://")


def pods(docs):
    """(name, labels, pod spec) of every workload among Kubernetes objects."""
    for d in docs:
        if d["kind"] == "Pod":
            yield d["metadata"]["name"], d["metadata"].get("labels", {}), d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            template = d["spec"]["template"]
            yield d["metadata"]["name"], template["metadata"].get("labels", {}), template["spec"]


def container_problems(where, pod, token=False):
    """A pod that is not locked down: a service-account token it does not need (``token``: the operator's,
    which does), a container's securityContext short of CONTAINER_SECURITY, a read-only root without /tmp."""
    problems = (
        []
        if token or pod.get("automountServiceAccountToken") is False
        else [f"{where}: mounts a service-account token"]
    )
    for c in pod.get("initContainers", []) + pod["containers"]:
        context = c.get("securityContext") or {}
        wrong = {key: context.get(key) for key, value in CONTAINER_SECURITY.items() if context.get(key) != value}
        if wrong:
            problems.append(f"{where}/{c['name']}: securityContext has {wrong}, not {CONTAINER_SECURITY}")
        if "/tmp" not in {m["mountPath"] for m in c.get("volumeMounts", [])} and not token:
            problems.append(f"{where}/{c['name']}: no writable /tmp beside its read-only root")
    return problems


def tls_problems(where, pod):
    """A Dask container that could speak plain TCP: an address of another scheme in its arguments or
    environment, or dask settings (read from its environment as dask reads them) that do not make every
    connection TLS with this pod's certificates."""
    problems = []
    for c in pod["containers"]:
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        texts = [*c.get("command", []), *c.get("args", []), *env.values()]
        plain = [t for t in texts for m in DASK_ADDRESS.finditer(str(t)) if m.group(1) != "tls"]
        if plain:
            problems.append(f"{where}/{c['name']}: addresses that are not tls://: {plain}")
        with dask.config.set(dask.config.merge(dask.config.config, dask.config.collect_env(env))):
            security = Security()
            scheme = dask.config.get("distributed.comm.default-scheme")
        missing = [
            name
            for name in (
                "tls_ca_file",
                "tls_scheduler_cert",
                "tls_scheduler_key",
                "tls_worker_cert",
                "tls_worker_key",
                "tls_client_cert",
                "tls_client_key",
            )
            if not getattr(security, name)
        ]
        if scheme != "tls" or not security.require_encryption or missing:
            problems.append(
                f"{where}/{c['name']}: default scheme {scheme!r}, require_encryption "
                f"{security.require_encryption}, no {missing}"
            )
    return problems


def policy_problems(docs):
    """Workloads no NetworkPolicy fences (ingress), and policies that admit any peer."""
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
    problems = [
        f"NetworkPolicy {p['podSelector']}: an ingress rule admits any peer"
        for p in policies
        for rule in p.get("ingress", [])
        if not rule.get("from")
    ]
    for name, labels, _ in pods(docs):
        if not any(
            p["podSelector"].get("matchLabels", {}).items() <= labels.items()
            and "Ingress" in p.get("policyTypes", ["Ingress"])
            for p in policies
        ):
            problems.append(f"{name}: no NetworkPolicy selects its pods")
    return problems


def private_problems(docs):
    """Everything that makes a deployed cluster reachable or exploitable beyond its TLS clients."""
    problems = policy_problems(docs)
    for name, _, pod in pods(docs):
        problems += container_problems(name, pod) + tls_problems(name, pod)
    return problems


def worker_problems(docs):
    """pod_problems for every worker Deployment: threads and memory limit read from the worker's command."""
    problems = []
    for d in docs:
        if d["kind"] != "Deployment" or "worker" not in d["metadata"]["name"]:
            continue
        (c,) = d["spec"]["template"]["spec"]["containers"]
        problems += pod_problems(
            d["metadata"]["name"],
            d["spec"]["replicas"],
            int(arg(c["args"], "--nthreads")),
            c["resources"]["limits"],
            c["resources"]["requests"],
            arg(c["args"], "--memory-limit"),
        )
    return problems


def arg(args, flag):
    return args[args.index(flag) + 1]


def daskhub_problems(v):
    gateway = v["dask-gateway"]["gateway"]
    w = gateway["backend"]["worker"]
    limits = {"cpu": w["cores"]["limit"], "memory": w["memory"]["limit"]}
    requests = {"cpu": w["cores"]["request"], "memory": w["memory"]["request"]}
    problems = pod_problems("gateway worker", 1, w["threads"], limits, requests, limits["memory"])
    env = v["jupyterhub"]["singleuser"]["extraEnv"]
    if env.get("DASK_GATEWAY__CLUSTER__OPTIONS__IMAGE") != "{JUPYTER_IMAGE_SPEC}":
        problems.append("gateway workers must run the singleuser image")
    if gateway.get("auth", {}).get("type") != "jupyterhub":
        problems.append("gateway users must authenticate through JupyterHub")
    for role in ("scheduler", "worker"):
        extra = gateway["backend"][role]
        # the gateway's pod: its own credentials mount, no token; ours merged in (lists appended)
        pod = {
            **extra.get("extraPodConfig", {}),
            "automountServiceAccountToken": False,
            "containers": [{"name": role, **extra.get("extraContainerConfig", {})}],
        }
        problems += container_problems(f"gateway {role}", pod)
    return problems


def gateway_commands(v):
    """The commands the gateway runs, set by the values' extraConfig (a traitlets config snippet)."""
    from traitlets.config import Config

    c = Config()
    for code in v["dask-gateway"]["gateway"]["extraConfig"].values():
        exec(code, {"c": c})
    return [list(c.KubeClusterConfig.scheduler_cmd), list(c.KubeClusterConfig.worker_cmd)]


# --- yamllint ---------------------------------------------------------------------------------------


def yamllint_problems(text, path):
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    return list(linter.run(text, YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml")), path))


def test_every_yaml_file_under_deploy_is_strictly_lint_clean():
    # a chart's templates are Go templates, not YAML: helm lint reads them (below)
    files = [f for f in sorted(DEPLOY.rglob("*.y*ml")) if "templates" not in f.parts]
    assert len(files) >= 7
    for f in files:
        assert yamllint_problems(f.read_text(), str(f)) == [], f


def test_yamllint_fails_on_a_duplicate_key():
    text = (CHART / "values.yaml").read_text().replace("  replicas: 4\n", "  replicas: 4\n  replicas: 5\n")
    assert any("duplication" in p.message for p in yamllint_problems(text, "values.yaml"))


# --- rendering and validating charts ------------------------------------------------------------------

CHART = DEPLOY / "helm/dask-clust"


def render(chart, values, name="dask-operator", namespace="dask-operator"):
    import helm_python as helm

    with helm.Chart.load(chart) as c:
        rendered = c.render(values, name=name, namespace=namespace)
    return [doc for name, text in rendered.items() if name.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]


def manifest_errors(docs):
    import kubernetes_validate

    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{doc['kind']}: {e.message}")
    return errors


def lint_errors(chart, values, namespace="dask-operator"):
    import helm_python as helm

    return helm.lint(chart, values, strict=True, namespace=namespace, kube_version=KUBE_VERSION)["errors"]


# --- the dask-clust chart ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_docs():
    return render(CHART, load("helm/dask-clust/values.yaml"), name="clust", namespace="dask")


def test_chart_lints_strictly_and_renders_valid_manifests(chart_docs):
    assert lint_errors(CHART, load("helm/dask-clust/values.yaml"), namespace="dask") == []
    assert sorted(d["kind"] for d in chart_docs) == [
        "Deployment",
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "Service",
    ]
    assert manifest_errors(chart_docs) == []
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION


def test_rendered_chart_is_private(chart_docs):
    """Every address tls://, TLS settings for every role, every container locked down, every pod fenced."""
    assert private_problems(chart_docs) == []
    (service,) = (d for d in chart_docs if d["kind"] == "Service")
    assert service["spec"]["type"] == "ClusterIP"


def test_rendered_workers_are_consistent(chart_docs):
    assert worker_problems(chart_docs) == []


def test_chart_check_fails_on_a_broken_value():
    values = load("helm/dask-clust/values.yaml")
    values["worker"]["threads"] = 8
    assert any(
        "8 threads for a CPU limit of 4" in p
        for p in worker_problems(render(CHART, values, name="clust", namespace="dask"))
    )


def pod_of(docs, name):
    (deployment,) = (d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    return deployment["spec"]["template"]["spec"]


def broken_security(docs):
    pod_of(docs, "clust-worker")["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False


def broken_capabilities(docs):
    del pod_of(docs, "clust-scheduler")["containers"][0]["securityContext"]["capabilities"]


def broken_token(docs):
    pod_of(docs, "clust-scheduler")["automountServiceAccountToken"] = True


def broken_scratch(docs):
    pod_of(docs, "clust-worker")["containers"][0]["volumeMounts"].pop()


def broken_address(docs):
    args = pod_of(docs, "clust-worker")["containers"][0]["args"]
    args[2] = args[2].replace("tls://", "tcp://")


def broken_scheme(docs):
    env = pod_of(docs, "clust-scheduler")["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME"]


def broken_ca(docs):
    env = pod_of(docs, "clust-worker")["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"]


def broken_policy(docs):
    docs[:] = [d for d in docs if d["metadata"]["name"] != "clust-worker" or d["kind"] != "NetworkPolicy"]


def broken_open_ingress(docs):
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    policy["spec"]["ingress"].append({"ports": [{"port": 8786}]})


@pytest.mark.parametrize(
    "breaks, complaint",
    [
        (broken_security, "clust-worker/worker: securityContext has {'readOnlyRootFilesystem': False}"),
        (broken_capabilities, "clust-scheduler/scheduler: securityContext has {'capabilities': None}"),
        (broken_token, "clust-scheduler: mounts a service-account token"),
        (broken_scratch, "clust-worker/worker: no writable /tmp"),
        (broken_address, "clust-worker/worker: addresses that are not tls://: ['tcp://clust-scheduler:8786']"),
        (broken_scheme, "clust-scheduler/scheduler: default scheme 'tcp'"),
        (broken_ca, "clust-worker/worker: default scheme 'tls', require_encryption True, no ['tls_ca_file']"),
        (broken_policy, "clust-worker: no NetworkPolicy selects its pods"),
        (broken_open_ingress, "an ingress rule admits any peer"),
    ],
)
def test_private_check_fails_on_a_broken_manifest(chart_docs, breaks, complaint):
    docs = copy.deepcopy(chart_docs)
    breaks(docs)
    assert any(complaint in p for p in private_problems(docs)), private_problems(docs)


# --- daskhub ------------------------------------------------------------------------------------------


def test_daskhub_values_are_consistent_and_locked_down():
    assert daskhub_problems(load("helm/daskhub-values.yaml")) == []


@pytest.mark.parametrize(
    "path, value, complaint",
    [
        (("worker", "memory", "request"), "32G", "requests"),
        (
            ("worker", "extraContainerConfig", "securityContext", "allowPrivilegeEscalation"),
            True,
            "gateway worker/worker: securityContext has {'allowPrivilegeEscalation': True}",
        ),
        (("scheduler", "extraContainerConfig", "volumeMounts"), [], "gateway scheduler/scheduler: no writable /tmp"),
    ],
)
def test_daskhub_check_fails_on_a_broken_value(path, value, complaint):
    v = copy.deepcopy(load("helm/daskhub-values.yaml"))
    node = v["dask-gateway"]["gateway"]["backend"]
    for key in path[:-1]:
        node[key] = copy.deepcopy(node[key])  # the YAML anchors share these between scheduler and worker
        node = node[key]
    node[path[-1]] = value
    assert any(complaint in p for p in daskhub_problems(v)), daskhub_problems(v)


# --- the image and the commands it must have -------------------------------------------------------------


def images_in_configs(chart_docs, daskcluster_docs):
    hub = load("helm/daskhub-values.yaml")
    for image in (hub["jupyterhub"]["singleuser"]["image"], hub["dask-gateway"]["gateway"]["backend"]["image"]):
        yield f"{image['name']}:{image['tag']}"
    for _, _, pod in pods(chart_docs + daskcluster_docs):
        yield from (c["image"] for c in pod["containers"])


def test_every_config_runs_the_image_of_this_version(chart_docs, daskcluster_docs):
    images = list(images_in_configs(chart_docs, daskcluster_docs))
    assert len(images) == 6 and set(images) == {IMAGE}


def test_dockerfile_pins_python_runs_as_a_user_and_documents_the_tag():
    text = (DEPLOY / "docker/Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-\w+", base), base
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^RUN pip install "/src\[[^]]*\]"', text, re.M)
    assert f"-t {IMAGE} ." in text


def image_requirements():
    """The distributions the image installs by name: the package's dependencies and the extras its
    Dockerfile asks for."""
    from packaging.requirements import Requirement

    text = (DEPLOY / "docker/Dockerfile").read_text()
    extras = set(re.search(r'^RUN pip install "/src\[([^]]*)\]"', text, re.M).group(1).split(","))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    return {canonical(Requirement(r).name) for r in names} | {"dask-clust"}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def command_problems(commands):
    """Commands whose executable no distribution the image installs provides as a console script, whose
    ``dask`` subcommand no installed distribution registers, or whose arguments that subcommand's parser
    (click) refuses."""
    from importlib.metadata import entry_points

    import click

    scripts = {e.name: canonical(e.dist.name) for e in entry_points(group="console_scripts")}
    subcommands = {e.name: e for e in entry_points(group="dask_cli")}
    wanted = image_requirements()
    problems = []
    for command in commands:
        if scripts.get(command[0]) not in wanted:
            problems.append(f"{command}: no {command[0]!r} among the console scripts of {sorted(wanted)}")
        elif command[0] == "dask" and command[1] not in subcommands:
            problems.append(f"{command}: dask has no subcommand {command[1]!r} ({sorted(subcommands)})")
        elif command[0] == "dask":
            try:
                subcommands[command[1]].load().make_context(" ".join(command[:2]), list(command[2:]))
            except click.ClickException as e:
                problems.append(f"{command}: {e.format_message()}")
    return problems


def commands_in_configs(chart_docs, daskcluster_docs):
    hub = load("helm/daskhub-values.yaml")
    yield [hub["jupyterhub"]["singleuser"]["cmd"]]
    yield from gateway_commands(hub)
    for _, _, pod in pods(chart_docs + daskcluster_docs):
        yield from (c.get("command", []) + c.get("args", []) for c in pod["containers"])
    yield json.loads(re.search(r"^CMD (.*)$", (DEPLOY / "docker/Dockerfile").read_text(), re.M).group(1))


def test_every_command_in_the_configs_exists_in_the_image(chart_docs, daskcluster_docs):
    commands = list(commands_in_configs(chart_docs, daskcluster_docs))
    assert len(commands) == 8
    assert command_problems(commands) == []
    # the gateway's scheduler preloads dask_gateway's plugin: the image installs the package that has it
    assert "dask-gateway" in image_requirements() and importlib.util.find_spec("dask_gateway.scheduler_preload")


@pytest.mark.parametrize(
    "command, complaint",
    [
        (["dask-scheduler", "--port", "8786"], "no 'dask-scheduler' among the console scripts"),
        (["dask-worker", "tls://clust-scheduler:8786"], "no 'dask-worker' among the console scripts"),
        (["dask", "schedule"], "dask has no subcommand 'schedule'"),
        (["dask", "worker", "--nanny-prot", "8790"], "Got unexpected extra argument: (8790)"),
        (["dask", "scheduler", "--port"], "Option '--port' requires an argument"),
    ],
)
def test_command_check_fails_on_a_command_the_image_lacks(command, complaint):
    assert any(complaint in p for p in command_problems([command]))


# --- the dask-kubernetes operator chart: rendered, strictly linted, manifests validated --------------


@pytest.fixture(scope="module")
def operator_chart():
    import dask_kubernetes

    path = Path(dask_kubernetes.__file__).parent / "operator/deployment/helm/dask-kubernetes-operator"
    assert (path / "Chart.yaml").is_file()
    return path


def test_operator_chart_lints_strictly_and_renders_valid_locked_down_manifests(operator_chart):
    values = load("helm/operator-values.yaml")
    assert lint_errors(operator_chart, values) == []
    docs = render(operator_chart, values)
    kinds = sorted(d["kind"] for d in docs)
    assert "Deployment" in kinds and "ServiceAccount" in kinds
    assert manifest_errors(docs) == []
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":" + values["image"]["tag"])
    # the controller talks to the Kubernetes API, so it keeps its token; the rest as for every container
    assert container_problems("operator", deployment["spec"]["template"]["spec"], token=True) == []
    broken = {**values, "securityContext": {**values["securityContext"], "capabilities": {"add": ["NET_ADMIN"]}}}
    (deployment,) = (d for d in render(operator_chart, broken) if d["kind"] == "Deployment")
    assert container_problems("operator", deployment["spec"]["template"]["spec"], token=True)


def test_helm_lint_fails_on_a_broken_value(operator_chart):
    assert lint_errors(operator_chart, {**load("helm/operator-values.yaml"), "image": "latest"})


def test_manifest_validation_fails_on_a_broken_value(operator_chart):
    values = {**load("helm/operator-values.yaml"), "livenessProbe": {"timeoutSeconds": "five"}}
    assert any("'five' is not of type 'integer'" in e for e in manifest_errors(render(operator_chart, values)))


# --- the DaskCluster resource ------------------------------------------------------------------------


def operator_objects(dc, namespace="dask"):
    """The Deployments and Service the operator makes of a DaskCluster, by its own code (its controller's
    builders, which add its labels and, unless given, a tcp:// scheduler address to the workers): one
    Deployment of one pod per worker."""
    from dask_kubernetes.operator.controller import controller

    name, spec = dc["metadata"]["name"], copy.deepcopy(dc["spec"])
    return [
        controller.build_scheduler_deployment_spec(name, spec["scheduler"]["spec"], {}, {}),
        controller.build_scheduler_service_spec(name, spec["scheduler"]["service"], {}, {}),
        controller.build_worker_deployment_spec(
            f"{name}-default", namespace, name, "0a1b2c", spec["worker"]["spec"], {}, {}
        ),
    ]


@pytest.fixture(scope="module")
def daskcluster_docs():
    return operator_objects(load("kubernetes/daskcluster.yaml")) + list(
        yaml.safe_load_all((DEPLOY / "kubernetes/networkpolicy.yaml").read_text())
    )


def check_jsonschema(path):
    schema = DEPLOY / "kubernetes/daskcluster.schema.json"
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(path)],
        capture_output=True,
        text=True,
    )


@pytest.mark.cluster
def test_daskcluster_validates_against_the_operator_schema():
    result = check_jsonschema(DEPLOY / "kubernetes/daskcluster.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_daskcluster_as_the_operator_deploys_it_is_private_and_valid(daskcluster_docs):
    assert manifest_errors(daskcluster_docs) == []
    assert private_problems(daskcluster_docs) == []
    assert worker_problems(daskcluster_docs) == []


def test_daskcluster_and_chart_give_every_container_the_same_tls_settings(chart_docs, daskcluster_docs):
    def settings(docs):
        return {
            frozenset((e["name"], e["value"]) for e in c["env"] if "__COMM__" in e["name"])
            for _, _, pod in pods(docs)
            for c in pod["containers"]
        }

    assert len(settings(chart_docs)) == 1 and settings(chart_docs) == settings(daskcluster_docs)


def test_the_operator_would_give_workers_a_tcp_address_without_ours():
    dc = copy.deepcopy(load("kubernetes/daskcluster.yaml"))
    env = dc["spec"]["worker"]["spec"]["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "DASK_SCHEDULER_ADDRESS"]
    docs = operator_objects(dc) + list(yaml.safe_load_all((DEPLOY / "kubernetes/networkpolicy.yaml").read_text()))
    assert any(
        "addresses that are not tls://: ['tcp://dask-clust-scheduler.dask.svc.cluster.local:8786']" in p
        for p in private_problems(docs)
    )


@pytest.mark.cluster
@pytest.mark.parametrize(
    "old, new, complaint",
    [
        ("    replicas: 4\n", "    replicas: four\n", "'four' is not of type 'integer'"),
        ("              memory: 16Gi\n", "              memory: -16Gi\n", "'-16Gi' does not match"),
        ("    replicas: 4\n", "    replica: 4\n", "'replica' was unexpected"),
    ],
)
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
    (worker,) = (d for d in operator_objects(dc) if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"])
    assert any("16 threads" in p for p in worker_problems([worker]))


def test_kept_schema_is_the_one_derived_from_the_installed_operator_crd():
    spec = importlib.util.spec_from_file_location("derive_schema", DEPLOY / "kubernetes/derive_schema.py")
    derive_schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive_schema)
    path, source = derive_schema.installed_crd()
    expected = derive_schema.render(derive_schema.derive(yaml.safe_load(path.read_text()), source))
    assert (DEPLOY / "kubernetes/daskcluster.schema.json").read_text() == expected


# --- the image's kernels: compiled at build, handed to numba by the entrypoint -------------------------

# a kernel run in a fresh process: numba's dispatcher counts the signatures it loaded from its cache (hits)
# and those it had to compile (misses)
CALL_A_KERNEL = """
import numpy as np
from dask_clust.kernels.stats import to_fixed
to_fixed(np.ones(3), 2, np.zeros((3, 3), np.int64))
print(sum(to_fixed.stats.cache_hits.values()), sum(to_fixed.stats.cache_misses.values()))
"""


def run_kernel(cache, built=None, entrypoint=True):
    """(hits, misses) of a kernel called in a new process whose numba cache is ``cache``, started through
    the image's entrypoint with the build's cache at ``built``; the CPU named as the Dockerfile does."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": ""}
    env.pop("NUMBA_DISABLE_JIT", None)
    if built is not None:
        env["DASK_CLUST_BUILT_KERNELS"] = str(built)
    command = [sys.executable, "-c", CALL_A_KERNEL]
    if entrypoint:
        command = ["sh", str(DEPLOY / "docker/entrypoint.sh"), *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return tuple(map(int, out.split()))


@pytest.mark.cluster
def test_entrypoint_hands_the_kernels_compiled_at_build_to_a_fresh_pod(tmp_path):
    built, pod = tmp_path / "built", tmp_path / "tmp" / "numba-cache"
    assert run_kernel(built, entrypoint=False) == (0, 1)  # the build compiles it
    built.chmod(0o555)  # the image's copy is read-only for the pod's user
    assert run_kernel(pod, built) == (1, 0)  # a new pod loads it: nothing compiled
    assert run_kernel(tmp_path / "elsewhere", entrypoint=False) == (0, 1)  # without the entrypoint: compiled


@pytest.mark.cluster
def test_entrypoint_leaves_a_cache_the_pod_already_has(tmp_path):
    built, pod = tmp_path / "built", tmp_path / "numba-cache"
    run_kernel(built, entrypoint=False)
    pod.mkdir()
    (pod / "kept").write_text("a restarted container keeps its /tmp volume")
    assert run_kernel(pod, built) == (0, 1)
    assert (pod / "kept").exists()


def test_dockerfile_compiles_the_kernels_for_the_cpu_it_names_and_starts_through_the_entrypoint():
    text = (DEPLOY / "docker/Dockerfile").read_text()
    built = re.search(r"^RUN NUMBA_CACHE_DIR=(\S+) dask-clust compile$", text, re.M).group(1)
    assert f"built=${{DASK_CLUST_BUILT_KERNELS:-{built}}}" in (DEPLOY / "docker/entrypoint.sh").read_text()
    assert re.search(r"^ARG NUMBA_CPU_NAME=\S+", text, re.M)
    assert "NUMBA_CPU_NAME=${NUMBA_CPU_NAME}" in text and re.search(r"NUMBA_CPU_FEATURES=$", text, re.M)
    (entry,) = re.findall(r"^COPY deploy/docker/entrypoint.sh (\S+)$", text, re.M)
    assert re.search(rf'^ENTRYPOINT \["{entry}"\]$', text, re.M)


@pytest.mark.cluster
def test_entrypoint_starts_the_command_when_the_copy_fails(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    (built / "index.nbi").write_bytes(b"x")
    (tmp_path / "a-file").write_text("not a directory")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "a-file" / "cache"), "DASK_CLUST_BUILT_KERNELS": str(built)}
    done = subprocess.run(
        ["sh", str(DEPLOY / "docker/entrypoint.sh"), "echo", "started"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == "started\n"
    assert "could not copy the built kernels" in done.stderr
