"""TLS between a client and a cluster configured as the manifests configure theirs: a fit over TLS equals
the in-process fit (API and CLI), and each way the two can disagree is named in one line, at once."""

import os
import re
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest
import trustme
import yaml
from distributed import LocalCluster, Security

import dask_clust
from dask_clust.cli import main
from dask_clust.deploy import tls_config
from tests.reference.make_blobs import blobs

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_tls_config_keys_are_what_security_reads(tmp_path):
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("")
    with dask.config.set(tls_config(tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key")):
        security = Security()
    assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (
        str(tmp_path / "ca.pem"),
        str(tmp_path / "client.pem"),
        str(tmp_path / "client.key"),
    )
    with pytest.raises(FileNotFoundError, match="cert=.*nowhere.pem"):
        tls_config(tmp_path / "ca.pem", tmp_path / "nowhere.pem")


def manifest_settings(tls_dir):
    """The dask settings of the DaskCluster's scheduler container (the Helm chart gives every container the
    same, tests/test_deploy.py), read from its environment as dask reads it, with the Secret's mount point
    moved to ``tls_dir``."""
    dc = yaml.safe_load((DEPLOY / "kubernetes/daskcluster.yaml").read_text())
    (container,) = dc["spec"]["scheduler"]["spec"]["containers"]
    (mount,) = (m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls")
    env = {e["name"]: e["value"].replace(mount, str(tls_dir)) for e in container["env"]}
    return dask.config.merge(dask.config.config, dask.config.collect_env(env))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A LocalCluster on loopback started from the manifests' settings: TLS only, certificates of a throwaway CA
    under the Secret's key names; the client's own certificate kept apart."""
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp / "ca.crt")
    server = ca.issue_cert("dask-clust")
    server.cert_chain_pems[0].write_to_path(tmp / "tls.crt")
    server.private_key_pem.write_to_path(tmp / "tls.key")
    client = ca.issue_cert("dask-clust-client")
    client.cert_chain_pems[0].write_to_path(tmp / "client.pem")
    client.private_key_pem.write_to_path(tmp / "client.key")
    # another cluster's CA, and a client certificate it signed
    other = trustme.CA()
    other.cert_pem.write_to_path(tmp / "other-ca.pem")
    other.issue_cert("dask-clust-client").private_key_and_cert_chain_pem.write_to_path(tmp / "other-client.pem")
    with dask.config.set(manifest_settings(tmp)):
        security, scheme = Security(), dask.config.get("distributed.comm.default-scheme")
    assert security.require_encryption and scheme == "tls"
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol=f"{scheme}://",
        host="127.0.0.1",
        security=security,
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        yield cluster, (tmp / "ca.crt", tmp / "client.pem", tmp / "client.key")


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


NO_TLS = {
    "distributed.comm.tls.ca-file": None,
    "distributed.comm.tls.client.cert": None,
    "distributed.comm.tls.client.key": None,
}


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "no settings",
            r"tls://127\.0\.0\.1:\d+ speaks TLS, and this client has no the cluster's CA certificate and "
            r"no this client's certificate: set them with dask\.config\.set\(dask_clust\.deploy\.tls_config",
        ),
        (
            "another CA",
            r"the scheduler at tls://127\.0\.0\.1:\d+ presented a certificate that the CA in \S+other-ca\.pem "
            r"did not sign \(self-signed certificate in certificate chain\)",
        ),
        (
            "a certificate of another CA",
            r"the scheduler at tls://127\.0\.0\.1:\d+ refused this client's certificate "
            r"\(TLSV1_ALERT_UNKNOWN_CA\)",
        ),
        ("plain TCP", r"the scheduler at tcp://127\.0\.0\.1:(\d+) requires TLS: connect to tls://127\.0\.0\.1:\1 with"),
    ],
)
def test_each_tls_refusal_is_one_line_through_the_api_and_exit_2_through_the_cli(
    tls_cluster, tls_data, tmp_path, capsys, case, message
):
    cluster, (ca_file, cert, key) = tls_cluster
    tmp = ca_file.parent
    address = cluster.scheduler_address
    config = {
        "no settings": NO_TLS,
        "another CA": tls_config(tmp / "other-ca.pem", tmp / "other-client.pem"),
        "a certificate of another CA": tls_config(ca_file, tmp / "other-client.pem"),
        "plain TCP": NO_TLS,
    }[case]
    if case == "plain TCP":
        address = address.replace("tls://", "tcp://")
    X = tls_data[0]
    np.save(tmp_path / "X.npy", X)
    with dask.config.set(config):
        with pytest.raises(dask_clust.TLSRefused, match=message) as refused:
            dask_clust.fit(X, algo="kmeans", n_clusters=3, client=address, random_state=0)
        assert "\n" not in str(refused.value)
        capsys.readouterr()
        assert main(["fit", str(tmp_path / "X.npy"), "-k", "3", "--quiet", "--scheduler", address]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dask-clust: error: ") and re.search(message, line), line


def test_cli_over_tls_with_environment_variables(tls_cluster, tls_data, tmp_path):
    """The environment variables of tls_config's docstring serve the CLI's --scheduler tls://..."""
    cluster, (ca_file, cert, key) = tls_cluster
    X, expected = tls_data
    np.save(tmp_path / "X.npy", X)
    env = {
        **os.environ,
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(ca_file),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(cert),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(key),
        # the chunking of this test session (conftest), on which the in-process model depends
        "DASK_DASK_CLUST__MIN_CHUNK_BYTES": dask.config.get("dask_clust.min-chunk-bytes"),
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dask_clust.cli",
            "fit",
            str(tmp_path / "X.npy"),
            "-k",
            "3",
            "--seed",
            "0",
            "--quiet",
            "--scheduler",
            cluster.scheduler_address,
            "--out",
            str(tmp_path / "model"),
        ],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    np.testing.assert_allclose(dask_clust.load(str(tmp_path / "model")).cluster_centers_, expected, rtol=1e-10)
