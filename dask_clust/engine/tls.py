"""Why a client and a TLS scheduler could not agree, in one line and at once.

distributed reports the three usual mistakes in ways that hide them: a ``tls://`` address without TLS
settings raises a TypeError about an ``ssl_context``; a certificate signed by another CA raises a
``FatalCommClosedError`` whose cause holds the reason; a plain ``tcp://`` client is reset by the TLS listener,
which reads as a scheduler that does not answer. Each is named here as what it is.
"""

import re
import socket
import ssl

import dask
from distributed.comm.addressing import parse_address, parse_host_port
from distributed.comm.core import CommClosedError
from distributed.security import Security

from ..errors import TLSRefused

# dask config keys of a client's TLS settings, and the environment variables that set them
_SETTINGS = (
    ("the cluster's CA certificate", "distributed.comm.tls.ca-file"),
    ("this client's certificate", "distributed.comm.tls.client.cert"),
)
HOW_TO_SET = (
    "set them with dask.config.set(dask_clust.deploy.tls_config(ca_file, cert, key)) or the environment "
    "variables DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and "
    "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY; for a cluster object that holds its own credentials "
    "(dask_clust.deploy.hpc_cluster), pass client=distributed.Client(cluster)"
)
_SSL_REASON = re.compile(r"SSLError: \[SSL: (\w+)\]")
# how long a plain client's failure may take to be checked for a TLS listener behind it
PROBE_SECONDS = 3.0


def check_settings(address):
    """Raise TLSRefused, before connecting, if ``address`` is ``tls://`` and dask config lacks the CA or this
    client's certificate (distributed verifies the scheduler against the CA and presents the certificate)."""
    if not str(address).startswith("tls://"):
        return
    missing = [name for name, key in _SETTINGS if not dask.config.get(key, None)]
    if missing:
        raise TLSRefused(f"{address} speaks TLS, and this client has no {' and no '.join(missing)}: {HOW_TO_SET}")


def refusal(address, exc):
    """TLSRefused naming why the connection to ``address`` failed with ``exc``, or None if TLS is not why."""
    causes = _causes(exc)
    verify = next((c for c in causes if isinstance(c, ssl.SSLCertVerificationError)), None)
    if verify is not None:
        ca = dask.config.get("distributed.comm.tls.ca-file", None)
        return TLSRefused(
            f"the scheduler at {address} presented a certificate that the CA in {ca} did not sign "
            f"({verify.verify_message}): this client was given another cluster's CA"
        )
    # The alert by which the scheduler refused this client's certificate: an SSLError cause, or the text of a
    # FatalCommClosedError. With TLS 1.3 the verdict on a client's certificate follows the handshake, and
    # the stream may close before the alert is read: then the alert is asked for again.
    closed = any(isinstance(c, CommClosedError) for c in causes)
    reason = (
        next((c.reason for c in causes if isinstance(c, ssl.SSLError)), None)
        or next((m.group(1) for c in causes for m in [_SSL_REASON.search(str(c))] if m), None)
        or (closed and str(address).startswith("tls://") and refused_certificate(address))
        or None
    )
    if reason is not None:
        return TLSRefused(
            f"the scheduler at {address} refused this client's certificate ({reason}): it "
            "accepts only certificates signed by its own CA"
        )
    if closed and str(address).startswith("tcp://") and speaks_tls(address):
        tls_address = "tls://" + parse_address(address)[1]
        return TLSRefused(
            f"the scheduler at {address} requires TLS: connect to {tls_address} with the cluster's "
            f"CA and a client certificate ({HOW_TO_SET})"
        )
    return None


def refused_certificate(address):
    """The TLS alert with which the listener at ``address`` refuses this client's certificate, or None."""
    host, port = parse_host_port(parse_address(address)[1])
    context = Security().get_connection_args("client")["ssl_context"]
    try:
        with (
            socket.create_connection((host, port), timeout=PROBE_SECONDS) as raw,
            context.wrap_socket(raw, server_hostname=host) as conn,
        ):
            conn.recv(1)  # a scheduler that accepts the certificate sends its handshake; one that does not, an alert
    except ssl.SSLError as exc:
        return exc.reason
    except OSError:
        return None
    return None


def speaks_tls(address):
    """Whether the listener at ``address`` answers a TLS handshake (nothing is verified: only asked of a
    listener that has already reset a plain client)."""
    host, port = parse_host_port(parse_address(address)[1])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=PROBE_SECONDS) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError as exc:  # an alert, e.g. "certificate required", is the listener speaking TLS
        return "ALERT" in str(exc.reason)
    except OSError:
        return False


def _causes(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen
