"""Dask workers as SLURM or PBS batch jobs, through dask-jobqueue (an optional dependency).

Settings come from a jobqueue YAML file (``deploy/jobqueue/jobqueue.yaml`` in the repository is a
commented example), or from dask config under ``jobqueue.<kind>`` (where ``~/.config/dask/jobqueue.yaml``
puts them), and keyword arguments of the cluster class override both. They are checked here before
dask-jobqueue sees them, because it turns a bad value into a malformed job script or a bare TypeError.

Private by default: a Dask scheduler runs whatever a connected client sends it, so the scheduler, its
workers and its clients speak TLS with mutual certificates unless ``security=False`` says otherwise, and the
scheduler's dashboard listens on the login node's loopback only (reach it with ``ssh -L 8787:localhost:8787``).
"""

import os
import re

import dask
import yaml
from dask.utils import parse_bytes
from distributed.security import Security

from ..errors import install_hint

# kind -> (cluster class, job class) in dask_jobqueue.<kind>
_CLASSES = {"slurm": ("SLURMCluster", "SLURMJob"), "pbs": ("PBSCluster", "PBSJob")}
EXAMPLE = "deploy/jobqueue/jobqueue.yaml"
# where workers of an offline job script connect (tls:// or tcp://); a real script gets the cluster's address
PLACEHOLDER_SCHEDULER = "127.0.0.1:8786"
# Temporary credentials (security: true) live in the scheduler's memory; dask-jobqueue writes the workers'
# copies (mode 0600) into this directory, which the compute nodes must see at the same path.
SHARED_TEMP_DIRECTORY = "$HOME/.dask-clust/tls"
# the scheduler's dashboard: loopback of the node the scheduler runs on, never every interface
DASHBOARD_ADDRESS = "127.0.0.1:8787"
# a site's own certificate files (security: {ca-file: ..., cert: ..., key: ...}), as Security's keywords
_SECURITY_FILES = {
    "ca-file": ("tls_ca_file",),
    "cert": ("tls_scheduler_cert", "tls_worker_cert", "tls_client_cert"),
    "key": ("tls_scheduler_key", "tls_worker_key", "tls_client_key"),
}
# A file key whose keyword argument has another name: the file's `name` is the batch job's name, while
# `name=` is the worker's name for a job class and the cluster's for a cluster class.
_RENAMED = {"name": "job_name"}
# Keyword arguments that only configure the scheduler a cluster object starts; a job class rejects them.
_CLUSTER_ONLY = ("scheduler_options", "shared_temp_directory")
_WALLTIME = re.compile(r"\d+:[0-5]\d:[0-5]\d")
_CHECKED = ("cores", "processes", "memory", "walltime")


def _classes(kind):
    """``kind``'s (cluster class, job class) from dask-jobqueue."""
    if kind not in _CLASSES:
        raise ValueError(f"kind={kind!r}: expected one of {sorted(_CLASSES)}")
    try:
        import dask_jobqueue
    except ImportError as exc:
        raise ImportError(f"a {kind} cluster needs dask-jobqueue: {install_hint('hpc')}") from exc
    module = getattr(dask_jobqueue, kind)  # dask_jobqueue.slurm or .pbs: only they export the job class
    return tuple(getattr(module, name) for name in _CLASSES[kind])


def _read(config, kind):
    """The ``jobqueue.<kind>`` block of a YAML file, keys spelled as the cluster's keyword arguments."""
    with open(config) as f:
        doc = yaml.safe_load(f)
    block = doc.get("jobqueue") if isinstance(doc, dict) else None
    block = block.get(kind) if isinstance(block, dict) else None
    if not isinstance(block, dict):
        raise ValueError(f"{config} has no 'jobqueue: {kind}:' block (see {EXAMPLE})")
    return {_RENAMED.get(key, key.replace("-", "_")): value for key, value in block.items() if value is not None}


def _prepare(kind, config, overrides):
    """``kind``'s cluster class, job class and keyword arguments for either: the file's block with
    ``overrides`` on top, validated; what neither sets, dask-jobqueue reads from dask config itself."""
    classes = _classes(kind)  # first: importing dask_jobqueue registers the jobqueue.* defaults read here
    from_file = _read(config, kind) if config is not None else {}
    opts = {**from_file, **overrides}
    where = {
        key: "keyword argument"
        if key in overrides
        else os.fspath(config)
        if key in from_file
        else f"dask config jobqueue.{kind}"
        for key in _CHECKED
    }
    _validate(
        kind,
        {key: opts[key] if key in opts else dask.config.get(f"jobqueue.{kind}.{key}", None) for key in _CHECKED},
        where,
    )
    # not a dask-jobqueue config key, but read from dask config as the others are (a copied jobqueue.yaml)
    security = opts.pop("security") if "security" in opts else dask.config.get(f"jobqueue.{kind}.security", True)
    source = (
        "keyword argument"
        if "security" in overrides
        else os.fspath(config)
        if "security" in from_file
        else f"dask config jobqueue.{kind}"
    )
    if security is not True:
        opts["security"] = _site_security(security, source)
    elif "shared_temp_directory" not in opts:
        opts["shared_temp_directory"] = (
            dask.config.get(f"jobqueue.{kind}.shared-temp-directory", None) or SHARED_TEMP_DIRECTORY
        )
    scheduler_options = opts.get("scheduler_options") or dask.config.get(f"jobqueue.{kind}.scheduler-options", None)
    opts["scheduler_options"] = {"dashboard_address": DASHBOARD_ADDRESS, **(scheduler_options or {})}
    return (*classes, opts, security is True)


def _site_security(security, where):
    """``security`` when it is not True: False (plain TCP, asked for explicitly), a ``Security``, or a
    mapping of a site's own PEM files {ca-file, cert, key} used by the scheduler, the workers and clients."""
    if security is False or isinstance(security, Security):
        return security or None
    if not (isinstance(security, dict) and {"ca-file", "cert"} <= set(security) <= set(_SECURITY_FILES)):
        raise ValueError(
            f"security={security!r} ({where}): expected true (temporary certificates), false (plain "
            "TCP), or a mapping of PEM files {ca-file: ..., cert: ..., key: ...}"
        )
    files = {name: os.path.expanduser(path) for name, path in security.items() if path is not None}
    for name, path in files.items():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"security {name}={security[name]!r} ({where}): no such file")
    return Security(
        require_encryption=True, **{keyword: path for name, path in files.items() for keyword in _SECURITY_FILES[name]}
    )


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _validate(kind, v, where):
    if v["cores"] is None or v["memory"] is None:
        raise ValueError(
            f"no cores or memory for {kind} ({where['cores']}): pass config= a jobqueue YAML "
            f"file like {EXAMPLE}, or copy that file to ~/.config/dask/jobqueue.yaml"
        )
    if not _positive_int(v["cores"]):
        raise ValueError(f"cores={v['cores']!r} ({where['cores']}): expected a positive integer")
    if v["processes"] is not None and not (_positive_int(v["processes"]) and v["cores"] % v["processes"] == 0):
        raise ValueError(
            f"processes={v['processes']!r} ({where['processes']}): expected a positive integer "
            f"dividing cores={v['cores']}"
        )
    try:
        nbytes = parse_bytes(v["memory"])
    except (TypeError, ValueError):
        nbytes = 0
    if nbytes <= 0:
        raise ValueError(f"memory={v['memory']!r} ({where['memory']}): expected a positive size such as '120GiB'")
    if v["walltime"] is not None and not (isinstance(v["walltime"], str) and _WALLTIME.fullmatch(v["walltime"])):
        raise ValueError(
            f"walltime={v['walltime']!r} ({where['walltime']}): expected 'HH:MM:SS' (quoted in "
            "YAML, which reads an unquoted 4:00:00 as the integer 14400)"
        )


def hpc_cluster(kind, config=None, **overrides):
    """A dask-jobqueue cluster: ``SLURMCluster`` for kind "slurm", ``PBSCluster`` for "pbs".

    Its scheduler starts here, on this (login) node; workers start as batch jobs when you scale it.
    config: path to a jobqueue YAML file (``deploy/jobqueue/jobqueue.yaml`` is an example); None uses
    dask config ``jobqueue.<kind>`` (e.g. from ``~/.config/dask/jobqueue.yaml``).
    overrides: keyword arguments of the cluster class, which win over the file, e.g. ``queue="short"``,
    ``job_name="km"``, ``scheduler_options={"dashboard_address": "127.0.0.1:8790"}``.

    TLS: ``security`` (file or keyword) True, the default, makes temporary self-signed credentials held by
    this process; the workers read theirs from ``shared_temp_directory`` (default ``SHARED_TEMP_DIRECTORY``,
    created private here), which must be on a filesystem the compute nodes share. A mapping
    ``{"ca-file": ..., "cert": ..., "key": ...}`` uses a site's own files instead; False speaks plain TCP.
    Clients connect through the cluster object, which holds the credentials: ``Client(cluster)``.

    >>> cluster = hpc_cluster("slurm", config="deploy/jobqueue/jobqueue.yaml", account="proj123")
    >>> cluster.scale(jobs=4)                       # 4 nodes x 4 workers
    >>> with distributed.Client(cluster) as client:
    ...     model = dask_clust.fit(X, n_clusters=1000, client=client)
    >>> cluster.close()
    """
    cluster_cls, _, opts, temporary = _prepare(kind, config, overrides)
    if temporary:
        os.makedirs(os.path.expanduser(os.path.expandvars(opts["shared_temp_directory"])), mode=0o700, exist_ok=True)
        opts["security"] = True
    return cluster_cls(**opts)


def job_script(kind, config=None, **overrides):
    """The batch script ``hpc_cluster`` would submit for one job, made without starting a scheduler.

    Same arguments as ``hpc_cluster``; ``scheduler=`` sets the address the workers connect to (default
    ``tls://`` + ``PLACEHOLDER_SCHEDULER``), and keyword arguments that only configure a scheduler are
    ignored. With temporary credentials the workers' certificate files are named as the cluster names them,
    in the shared directory, with ``XXXXXXXX`` for the random part that a started cluster fills in.

    >>> print(job_script("pbs", config="deploy/jobqueue/jobqueue.yaml", walltime="01:00:00"))
    #!/usr/bin/env bash
    <BLANKLINE>
    #PBS -N dask-clust-worker
    ...
    """
    _, job_cls, opts, temporary = _prepare(kind, config, overrides)
    if temporary:
        shared = opts["shared_temp_directory"]
        opts["security"] = Security(
            **{
                f"tls_{'' if key == 'ca_file' else 'worker_'}{key}": os.path.join(
                    shared, f".dask-jobqueue.worker.{key}.XXXXXXXX"
                )
                for key in ("ca_file", "cert", "key")
            }
        )
    opts = {key: value for key, value in opts.items() if key not in _CLUSTER_ONLY}
    if opts.get("security"):
        opts.setdefault("protocol", "tls://")
    # "dummy-name" stands for the per-job worker name, as in dask-jobqueue's own cluster.job_script()
    scheduler = ("tls://" if opts.get("security") else "tcp://") + PLACEHOLDER_SCHEDULER
    return job_cls(**{"scheduler": scheduler, "name": "dummy-name", **opts}).job_script()
