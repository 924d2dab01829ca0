"""TLS settings for connecting to a scheduler that requires them, as dask config.

dask_clust connects with ``distributed.Client(address)``, which, given no ``security=``, builds its
``Security()`` from dask config ``distributed.comm.tls.*``; so a dask config block is all it takes.
"""

import os


def tls_config(ca_file, cert, key=None):
    """Dask config for a client speaking TLS: the cluster's CA and this client's certificate and key.

    ca_file: PEM file of the CA that signed the scheduler's and workers' certificates (distributed checks
    certificates both ways against it, not host names). cert, key: PEM files of a certificate that CA
    signed for this client, and its private key; key=None if the key is appended to the cert file.

    In Python:

    >>> with dask.config.set(tls_config("ca.pem", "client.pem", "client.key")):
    ...     model = dask_clust.fit(X, n_clusters=100, client="tls://scheduler-host:8786")

    For the command line, set the same keys as environment variables:

    .. code-block:: bash

        export DASK_DISTRIBUTED__COMM__TLS__CA_FILE=ca.pem
        export DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=client.pem
        export DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=client.key
        dask-clust fit data.parquet -k 100 --scheduler tls://scheduler-host:8786
    """
    files = {"ca_file": ca_file, "cert": cert, "key": key}
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            raise FileNotFoundError(f"{name}={os.fspath(path)!r}: no such file")
    paths = {name: None if path is None else os.fspath(path) for name, path in files.items()}
    return {
        "distributed.comm.tls.ca-file": paths["ca_file"],
        "distributed.comm.tls.client.cert": paths["cert"],
        "distributed.comm.tls.client.key": paths["key"],
    }
