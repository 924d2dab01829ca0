"""Running dask_clust on a cluster: four deploy paths, all ending in ``fit(X, client=<scheduler address>)``.

- Kubernetes, Helm chart: ``deploy/helm/dask-clust`` is a chart of a long-lived scheduler and worker pods
  running the image of ``deploy/docker/Dockerfile``, with its NetworkPolicies.
- Kubernetes, dask-kubernetes operator: ``deploy/kubernetes/daskcluster.yaml`` is a ``DaskCluster``
  resource for ``kubectl apply`` (with ``networkpolicy.yaml``); the operator creates and scales the pods.
- Kubernetes, many users: ``deploy/helm/daskhub-values.yaml`` configures JupyterHub with Dask Gateway, which
  gives each user authenticated clusters with TLS credentials of their own.
- HPC batch queues, dask-jobqueue: ``deploy/jobqueue/jobqueue.yaml`` describes SLURM and PBS jobs; a
  scheduler runs where ``hpc_cluster`` is called and each batch job starts a node's worth of workers.
  ``job_script`` shows the script such a job would run, without starting anything.

Every path is private by default: a Dask scheduler runs whatever a connected client sends it, so the
scheduler, the workers and the clients speak TLS with mutual certificates. A client given a ``tls://``
address takes the cluster's CA and its own certificate from ``tls_config`` (or the same keys as environment
variables, for the command line's ``--scheduler tls://...``); a client of ``hpc_cluster`` connects through the
cluster object, which holds the temporary credentials it made.

    >>> from dask_clust.deploy import hpc_cluster
    >>> cluster = hpc_cluster("slurm", config="deploy/jobqueue/jobqueue.yaml", queue="short")
    >>> cluster.scale(jobs=2)
    >>> with distributed.Client(cluster) as client:
    ...     model = dask_clust.fit(X, n_clusters=100, client=client)
"""

from .hpc import hpc_cluster, job_script
from .tls import tls_config

__all__ = ["hpc_cluster", "job_script", "tls_config"]
