"""deploy/jobqueue/jobqueue.yaml through dask_clust.deploy (job scripts checked against the YAML read
independently), and TLS: a fit on a TLS-only cluster equals the in-process fit."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest
import trustme
import yaml
from dask.utils import parse_bytes, parse_timedelta
from distributed import Client, LocalCluster, Security

import dask_clust
from dask_clust.deploy import hpc_cluster, job_script, tls_config
from tests.reference.make_blobs import blobs

JOBQUEUE_YAML = Path(__file__).resolve().parents[1] / "deploy" / "jobqueue" / "jobqueue.yaml"
KINDS = ["slurm", "pbs"]
PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS"}
# what the schedulers call KB/MB/GB in a memory request are KiB/MiB/GiB
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def settings(kind):
    return yaml.safe_load(JOBQUEUE_YAML.read_text())["jobqueue"][kind]


def seconds(walltime):
    h, m, s = map(int, walltime.split(":"))
    return 3600 * h + 60 * m + s


def requested_bytes(request):
    """'120G' (SLURM) or '180GB' (PBS): the scheduler's binary units."""
    number, unit = re.fullmatch(r"(\d+)([KMG])B?", request).groups()
    return int(number) * UNITS[unit]


def check_script(kind, script, cfg, interface):
    """The script's directives, prologue and worker command agree with the YAML block ``cfg``."""
    lines = script.splitlines()
    header = [line for line in lines if line.startswith(PREFIX[kind])]
    memory, cores, processes = parse_bytes(cfg["memory"]), cfg["cores"], cfg["processes"]
    if kind == "slurm":
        assert f"#SBATCH -J {cfg['name']}" in header
        assert f"#SBATCH --cpus-per-task={cores}" in header
        assert f"#SBATCH -t {cfg['walltime']}" in header
        request = next(line for line in header if line.startswith("#SBATCH --mem="))
        request = request.split("=", 1)[1]
    else:
        assert f"#PBS -N {cfg['name']}" in header
        assert f"#PBS -l walltime={cfg['walltime']}" in header
        request = next(line for line in header if line.startswith("#PBS -l select="))
        select = dict(item.split("=") for item in request.split(" ", 2)[2].split(":")[1:])
        assert int(select["ncpus"]) == cores
        request = select["mem"]
    # rounded up to the scheduler's unit, never below what the workers' limits add up to
    assert memory <= requested_bytes(request) < memory + UNITS[request.rstrip("B")[-1]]
    for directive in cfg["job-extra-directives"]:
        assert f"{PREFIX[kind]} {directive}" in header

    command_at = next(i for i, line in enumerate(lines) if "distributed.cli.dask_worker" in line)
    prologue = cfg["job-script-prologue"]
    assert lines[command_at - len(prologue):command_at] == prologue
    args = shlex.split(lines[command_at])

    def flag(name):
        return args[args.index(name) + 1]

    assert args[:3] == [cfg["python"], "-m", "distributed.cli.dask_worker"]
    assert int(flag("--nworkers")) == processes
    assert int(flag("--nthreads")) == cores // processes
    assert parse_bytes(flag("--memory-limit")) == pytest.approx(memory / processes, rel=1e-3)
    assert flag("--local-directory") == cfg["local-directory"]
    assert flag("--interface") == interface
    extra = cfg["worker-extra-args"]
    assert any(args[i:i + len(extra)] == extra for i in range(len(args)))
    return args


@pytest.mark.parametrize("kind", KINDS)
def test_yaml_values_are_consistent(kind):
    cfg = settings(kind)
    assert cfg["cores"] % cfg["processes"] == 0
    assert parse_bytes(cfg["memory"]) / cfg["processes"] >= 4 * 2**30   # a worker holds a partition
    lifetime = cfg["worker-extra-args"]
    # workers leave, staggered, before the batch system kills them at the walltime
    assert (parse_timedelta(lifetime[lifetime.index("--lifetime") + 1])
            + parse_timedelta(lifetime[lifetime.index("--lifetime-stagger") + 1]) < seconds(cfg["walltime"]))


@pytest.mark.parametrize("kind", KINDS)
def test_offline_job_script_matches_yaml(kind):
    cfg = settings(kind)
    args = check_script(kind, job_script(kind, config=JOBQUEUE_YAML), cfg, interface=cfg["interface"])
    assert args[3] == "tcp://127.0.0.1:8786"
    address = "tcp://10.0.0.1:8786"
    assert shlex.split(job_script(kind, config=JOBQUEUE_YAML, scheduler=address).splitlines()[-1])[3] == address


@pytest.mark.parametrize("kind", KINDS)
def test_cluster_job_script_matches_yaml(kind):
    cfg = settings(kind)
    overrides = {"interface": "lo", "scheduler_options": {"interface": "lo", "dashboard_address": ":0"}}
    with hpc_cluster(kind, config=JOBQUEUE_YAML, **overrides) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        args = check_script(kind, cluster.job_script(), cfg, interface="lo")
        assert args[3] == cluster.scheduler_address
        # the offline script for the same arguments is the same script (scheduler_options only reach a cluster)
        offline = job_script(kind, config=JOBQUEUE_YAML, scheduler=cluster.scheduler_address, **overrides)
        assert offline == cluster.job_script()


def test_overrides_win_over_the_file():
    cfg = {**settings("slurm"), "cores": 8, "processes": 2}
    script = job_script("slurm", config=JOBQUEUE_YAML, cores=8, processes=2, queue="short", job_name="km")
    check_script("slurm", script, {**cfg, "name": "km"}, interface=cfg["interface"])
    assert "#SBATCH -p short" in script.splitlines()


def test_dask_config_is_used_without_a_file():
    cfg = settings("pbs")
    with dask.config.set({f"jobqueue.pbs.{key}": value for key, value in cfg.items()}):
        assert job_script("pbs") == job_script("pbs", config=JOBQUEUE_YAML)
    with dask.config.set({"jobqueue.pbs.cores": None, "jobqueue.pbs.memory": None}):
        with pytest.raises(ValueError, match="no cores or memory for pbs.*deploy/jobqueue/jobqueue.yaml"):
            job_script("pbs")


def test_unknown_kind():
    for make in (job_script, hpc_cluster):
        with pytest.raises(ValueError, match=r"kind='sge': expected one of \['pbs', 'slurm'\]"):
            make("sge", config=JOBQUEUE_YAML)


def test_missing_dask_jobqueue(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)   # makes `import dask_jobqueue` fail
    with pytest.raises(ImportError, match=r"pip install 'dask_clust\[hpc\]'"):
        job_script("slurm", config=JOBQUEUE_YAML)


@pytest.mark.parametrize("key, value, message", [
    ("cores", "four", r"cores='four' \(.*jobqueue.yaml\): expected a positive integer"),
    ("memory", "-4GB", r"memory='-4GB' .*: expected a positive size"),
    ("memory", "lots", r"memory='lots' .*: expected a positive size"),
    ("processes", 5, r"processes=5 .*: expected a positive integer dividing cores=32"),
    ("walltime", yaml.safe_load("4:00:00"), r"walltime=14400 .*: expected 'HH:MM:SS' \(quoted in YAML"),
])
def test_broken_value_fails_with_a_clear_error(tmp_path, key, value, message):
    doc = yaml.safe_load(JOBQUEUE_YAML.read_text())
    doc["jobqueue"]["slurm"][key] = value
    broken = tmp_path / "jobqueue.yaml"
    broken.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=message):
        job_script("slurm", config=broken)


def test_a_file_without_the_block(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("distributed: {}\n")
    with pytest.raises(ValueError, match="has no 'jobqueue: slurm:' block"):
        job_script("slurm", config=other)


def test_tls_config_keys_are_what_security_reads(tmp_path):
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("")
    with dask.config.set(tls_config(tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key")):
        security = Security()
    assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (
        str(tmp_path / "ca.pem"), str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
    with pytest.raises(FileNotFoundError, match="cert=.*nowhere.pem"):
        tls_config(tmp_path / "ca.pem", tmp_path / "nowhere.pem")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A TLS-only LocalCluster on loopback; certificates of a throwaway CA, the client's kept apart."""
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp / "ca.pem")
    # scheduler and worker: key and certificate in one file, as distributed accepts
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(tmp / "server.pem")
    client = ca.issue_cert("dask-clust-client")
    client.cert_chain_pems[0].write_to_path(tmp / "client.pem")
    client.private_key_pem.write_to_path(tmp / "client.key")
    server = str(tmp / "server.pem")
    security = Security(tls_ca_file=str(tmp / "ca.pem"), tls_scheduler_cert=server, tls_worker_cert=server,
                        tls_client_cert=server, require_encryption=True)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tls://", host="127.0.0.1",
                      security=security, dashboard_address=":0") as cluster:
        yield cluster, (tmp / "ca.pem", tmp / "client.pem", tmp / "client.key")


@pytest.fixture(scope="module")
def tls_data():
    X = blobs(2000, 4, 3, seed=2)[0].astype(np.float64)
    model = dask_clust.fit(X, algo="kmeans", n_clusters=3, client=None, random_state=0)
    assert model.engine_["backend"] == "in-process"
    return X, model.cluster_centers_


def test_fit_over_tls_equals_in_process_fit(tls_cluster, tls_data):
    cluster, files = tls_cluster
    X, expected = tls_data
    address = cluster.scheduler_address
    assert address.startswith("tls://127.0.0.1:")
    assert all(w.address.startswith("tls://") for w in cluster.workers.values())
    with dask.config.set(tls_config(*files)):
        model = dask_clust.fit(X, algo="kmeans", n_clusters=3, client=address, random_state=0)
    assert model.engine_["backend"] == "cluster"
    np.testing.assert_allclose(model.cluster_centers_, expected, rtol=1e-10)
    # without the TLS settings: no TLS context for a tls:// address, and a handshake refused for tcp://
    with pytest.raises(TypeError, match="ssl_context"):
        Client(address, timeout="5s")
    # the TLS listener drops a plain handshake (a slow host may time out first)
    with pytest.raises(OSError, match="Connection reset by peer|[Tt]imed out"):
        Client(address.replace("tls://", "tcp://"), timeout="5s")


def test_cli_over_tls_with_environment_variables(tls_cluster, tls_data, tmp_path):
    """The environment variables of tls_config's docstring serve the CLI's --scheduler tls://..."""
    cluster, (ca_file, cert, key) = tls_cluster
    X, expected = tls_data
    np.save(tmp_path / "X.npy", X)
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(ca_file),
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(cert),
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(key),
           # the chunking of this test session (conftest), on which the in-process model depends
           "DASK_DASK_CLUST__MIN_CHUNK_BYTES": dask.config.get("dask_clust.min-chunk-bytes")}
    subprocess.run([sys.executable, "-m", "dask_clust.cli", "fit", str(tmp_path / "X.npy"), "-k", "3", "--seed", "0",
                    "--quiet", "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "model")],
                   env=env, check=True, timeout=120, capture_output=True)
    np.testing.assert_allclose(dask_clust.load(str(tmp_path / "model")).cluster_centers_, expected, rtol=1e-10)
