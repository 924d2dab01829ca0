"""deploy/jobqueue/jobqueue.yaml through dask_clust.deploy: job scripts checked against the YAML read
independently, and the cluster private (TLS workers, nothing listening on every interface)."""

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import psutil
import pytest
import yaml
from dask.utils import parse_bytes, parse_timedelta
from distributed import Client

import dask_clust
from dask_clust.deploy import hpc_cluster, job_script

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster

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
    assert lines[command_at - len(prologue) : command_at] == prologue
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
    assert any(args[i : i + len(extra)] == extra for i in range(len(args)))
    # TLS with temporary credentials: the workers listen with TLS and read theirs from the shared directory
    assert cfg["security"] is True and args[3].startswith("tls://") and flag("--protocol") == "tls://"
    for name in ("--tls-ca-file", "--tls-cert", "--tls-key"):
        assert os.path.dirname(flag(name)) == cfg["shared-temp-directory"], name
    assert "--no-dashboard" in extra
    return args


def without_random_names(script):
    """A job script with the random part of dask-jobqueue's credential file names masked."""
    return re.sub(r"(\.dask-jobqueue\.worker\.\w+\.)\w+", r"\1XXXXXXXX", script)


@pytest.mark.parametrize("kind", KINDS)
def test_yaml_values_are_consistent(kind):
    cfg = settings(kind)
    assert cfg["cores"] % cfg["processes"] == 0
    assert parse_bytes(cfg["memory"]) / cfg["processes"] >= 4 * 2**30  # a worker holds a partition
    lifetime = cfg["worker-extra-args"]
    # workers leave, staggered, before the batch system kills them at the walltime
    assert parse_timedelta(lifetime[lifetime.index("--lifetime") + 1]) + parse_timedelta(
        lifetime[lifetime.index("--lifetime-stagger") + 1]
    ) < seconds(cfg["walltime"])


@pytest.mark.parametrize("kind", KINDS)
def test_offline_job_script_matches_yaml(kind):
    cfg = settings(kind)
    args = check_script(kind, job_script(kind, config=JOBQUEUE_YAML), cfg, interface=cfg["interface"])
    assert args[3] == "tls://127.0.0.1:8786"
    address = "tls://10.0.0.1:8786"
    assert shlex.split(job_script(kind, config=JOBQUEUE_YAML, scheduler=address).splitlines()[-1])[3] == address


def listening(process):
    return {c.laddr for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


@pytest.mark.parametrize("kind", KINDS)
def test_cluster_job_script_matches_yaml_and_the_cluster_listens_on_its_interface_only(kind, tmp_path):
    cfg = {**settings(kind), "shared-temp-directory": str(tmp_path)}
    overrides = {"interface": "lo", "shared_temp_directory": str(tmp_path)}
    me = psutil.Process()
    before = listening(me)
    with hpc_cluster(kind, config=JOBQUEUE_YAML, **overrides) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        # the scheduler on the interface asked for, its dashboard on loopback: nothing on 0.0.0.0 or ::
        opened = listening(me) - before
        assert len(opened) >= 2 and all(a.ip in ("127.0.0.1", "::1") for a in opened), opened
        args = check_script(kind, cluster.job_script(), cfg, interface="lo")
        assert args[3] == cluster.scheduler_address
        # the offline script for the same arguments is the same script, but for the random names of the files
        # the started cluster wrote the workers' credentials to (private to the user)
        offline = job_script(kind, config=JOBQUEUE_YAML, scheduler=cluster.scheduler_address, **overrides)
        assert offline == without_random_names(cluster.job_script())
        written = [Path(flag) for flag in args if flag.startswith(str(tmp_path))]
        assert len(written) == 3 and all(f.stat().st_mode & 0o077 == 0 for f in written)


def test_job_script_workers_join_over_tls_only(tmp_path):
    """The worker command of the job script, run here: the worker it starts listens with TLS and joins; a
    client without the cluster's credentials is refused, naming why."""
    overrides = {
        "interface": "lo",
        "shared_temp_directory": str(tmp_path),
        "cores": 1,
        "processes": 1,
        "memory": "2GiB",
    }
    with hpc_cluster("slurm", config=JOBQUEUE_YAML, **overrides) as cluster:
        command = cluster.job_script().splitlines()[-1]
        assert command.startswith("python -m distributed.cli.dask_worker tls://")
        worker = subprocess.Popen(
            ["bash", "-c", shlex.quote(sys.executable) + command[len("python") :]],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with Client(cluster) as client:
                client.wait_for_workers(1, timeout=60)
                # asked of the workers themselves: the client's cached scheduler_info() can lag behind the join
                (address,) = client.run(os.getpid)
            assert address.startswith("tls://127.0.0.1:")
            with pytest.raises(dask_clust.TLSRefused, match="speaks TLS, and this client has no"):
                dask_clust.fit(np.zeros((10, 2)), n_clusters=2, client=cluster.scheduler_address)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)


def test_security_choices(tmp_path):
    script = job_script("slurm", config=JOBQUEUE_YAML, security=False)
    assert "tcp://127.0.0.1:8786" in script and "--tls" not in script and "--protocol" not in script
    for name in ("ca.pem", "dask.pem", "dask.key"):
        (tmp_path / name).write_text("")
    files = {"ca-file": str(tmp_path / "ca.pem"), "cert": str(tmp_path / "dask.pem"), "key": str(tmp_path / "dask.key")}
    args = shlex.split(job_script("slurm", config=JOBQUEUE_YAML, security=files).splitlines()[-1])
    assert [args[args.index(flag) + 1] for flag in ("--tls-ca-file", "--tls-cert", "--tls-key")] == list(files.values())
    with pytest.raises(FileNotFoundError, match=r"security cert='.*nowhere.pem' \(keyword argument\): no such file"):
        job_script("slurm", config=JOBQUEUE_YAML, security={**files, "cert": str(tmp_path / "nowhere.pem")})
    with pytest.raises(ValueError, match=r"security='yes' \(keyword argument\): expected true"):
        job_script("slurm", config=JOBQUEUE_YAML, security="yes")
    # from dask config, as a copied jobqueue.yaml sets it
    plain = {**settings("slurm"), "security": False}
    with dask.config.set({f"jobqueue.slurm.{key}": value for key, value in plain.items()}):
        assert "tcp://127.0.0.1:8786" in job_script("slurm") and "--tls" not in job_script("slurm")


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
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # makes `import dask_jobqueue` fail
    with pytest.raises(ImportError, match=r"pip install '\.\[hpc\]' in the dask_clust checkout"):
        job_script("slurm", config=JOBQUEUE_YAML)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("cores", "four", r"cores='four' \(.*jobqueue.yaml\): expected a positive integer"),
        ("memory", "-4GB", r"memory='-4GB' .*: expected a positive size"),
        ("memory", "lots", r"memory='lots' .*: expected a positive size"),
        ("processes", 5, r"processes=5 .*: expected a positive integer dividing cores=32"),
        ("walltime", yaml.safe_load("4:00:00"), r"walltime=14400 .*: expected 'HH:MM:SS' \(quoted in YAML"),
    ],
)
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
