"""Dask workers as SLURM or PBS batch jobs, through dask-jobqueue (an optional dependency).

Settings come from a jobqueue YAML file (``deploy/jobqueue/jobqueue.yaml`` in the repository is a
commented example), or from dask config under ``jobqueue.<kind>`` (where ``~/.config/dask/jobqueue.yaml``
puts them), and keyword arguments of the cluster class override both. They are checked here before
dask-jobqueue sees them, because it turns a bad value into a malformed job script or a bare TypeError.
"""
import os
import re

import dask
import yaml
from dask.utils import parse_bytes

# kind -> (cluster class, job class) in dask_jobqueue.<kind>
_CLASSES = {"slurm": ("SLURMCluster", "SLURMJob"), "pbs": ("PBSCluster", "PBSJob")}
EXAMPLE = "deploy/jobqueue/jobqueue.yaml"
# where workers of an offline job script connect; a real script gets the cluster's scheduler address
PLACEHOLDER_SCHEDULER = "tcp://127.0.0.1:8786"
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
        raise ImportError(f"a {kind} cluster needs dask-jobqueue: pip install 'dask_clust[hpc]'") from exc
    module = getattr(dask_jobqueue, kind)   # dask_jobqueue.slurm or .pbs: only they export the job class
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
    classes = _classes(kind)   # first: importing dask_jobqueue registers the jobqueue.* defaults read here
    from_file = _read(config, kind) if config is not None else {}
    opts = {**from_file, **overrides}
    where = {key: "keyword argument" if key in overrides else os.fspath(config) if key in from_file
             else f"dask config jobqueue.{kind}" for key in _CHECKED}
    _validate(kind, {key: opts[key] if key in opts else dask.config.get(f"jobqueue.{kind}.{key}", None)
                     for key in _CHECKED}, where)
    return (*classes, opts)


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _validate(kind, v, where):
    if v["cores"] is None or v["memory"] is None:
        raise ValueError(f"no cores or memory for {kind} ({where['cores']}): pass config= a jobqueue YAML "
                         f"file like {EXAMPLE}, or copy that file to ~/.config/dask/jobqueue.yaml")
    if not _positive_int(v["cores"]):
        raise ValueError(f"cores={v['cores']!r} ({where['cores']}): expected a positive integer")
    if v["processes"] is not None and not (_positive_int(v["processes"]) and v["cores"] % v["processes"] == 0):
        raise ValueError(f"processes={v['processes']!r} ({where['processes']}): expected a positive integer "
                         f"dividing cores={v['cores']}")
    try:
        nbytes = parse_bytes(v["memory"])
    except (TypeError, ValueError):
        nbytes = 0
    if nbytes <= 0:
        raise ValueError(f"memory={v['memory']!r} ({where['memory']}): expected a positive size such as "
                         "'120GiB'")
    if v["walltime"] is not None and not (isinstance(v["walltime"], str) and _WALLTIME.fullmatch(v["walltime"])):
        raise ValueError(f"walltime={v['walltime']!r} ({where['walltime']}): expected 'HH:MM:SS' (quoted in "
                         "YAML, which reads an unquoted 4:00:00 as the integer 14400)")


def hpc_cluster(kind, config=None, **overrides):
    """A dask-jobqueue cluster: ``SLURMCluster`` for kind "slurm", ``PBSCluster`` for "pbs".

    Its scheduler starts here, on this (login) node; workers start as batch jobs when you scale it.
    config: path to a jobqueue YAML file (``deploy/jobqueue/jobqueue.yaml`` is an example); None uses
    dask config ``jobqueue.<kind>`` (e.g. from ``~/.config/dask/jobqueue.yaml``).
    overrides: keyword arguments of the cluster class, which win over the file, e.g. ``queue="short"``,
    ``job_name="km"``, ``scheduler_options={"dashboard_address": ":0"}``.

    >>> cluster = hpc_cluster("slurm", config="deploy/jobqueue/jobqueue.yaml", account="proj123")
    >>> cluster.scale(jobs=4)                       # 4 nodes x 4 workers
    >>> model = dask_clust.fit(X, n_clusters=1000, client=cluster.scheduler_address)
    >>> cluster.close()
    """
    cluster_cls, _, opts = _prepare(kind, config, overrides)
    return cluster_cls(**opts)


def job_script(kind, config=None, **overrides):
    """The batch script ``hpc_cluster`` would submit for one job, made without starting a scheduler.

    Same arguments as ``hpc_cluster``; ``scheduler=`` sets the address the workers connect to (default
    ``PLACEHOLDER_SCHEDULER``), and keyword arguments that only configure a scheduler are ignored.

    >>> print(job_script("pbs", config="deploy/jobqueue/jobqueue.yaml", walltime="01:00:00"))
    #!/usr/bin/env bash
    <BLANKLINE>
    #PBS -N dask-clust-worker
    ...
    """
    _, job_cls, opts = _prepare(kind, config, overrides)
    opts = {key: value for key, value in opts.items() if key not in _CLUSTER_ONLY}
    # "dummy-name" stands for the per-job worker name, as in dask-jobqueue's own cluster.job_script()
    return job_cls(**{"scheduler": PLACEHOLDER_SCHEDULER, "name": "dummy-name", **opts}).job_script()
