"""Hosts with addresses of their own: a scheduler and two workers, each in a network namespace of this test's
on a bridge, the driver outside them all, as on a cluster of three machines. Skipped, with the reason, where
network namespaces cannot be made (not root, no ``ip``)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dask_clust

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster

NAMES = ("s", "w1", "w2")  # the scheduler's host, then the workers'


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _can_make_namespaces():
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"dcprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def hosts(tmp_path):
    """(client, {name: (address, process)}, bridge): three namespaces on a bridge 10.77.<net>.0/24, the
    bridge at .1 (the driver's side), the scheduler at .2 and the workers at .3 and .4."""
    why = _can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = f"dc{os.getpid() % 100000}"
    net = 20 + os.getpid() % 200
    bridge = f"{tag}br"
    spaces = {n: f"{tag}{n}" for n in NAMES}
    procs = {}
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"10.77.{net}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, (name, ns) in enumerate(spaces.items()):
            _ip("netns", "add", ns)
            outside = f"{tag}{name}v"
            _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"10.77.{net}.{i + 2}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", f"10.77.{net}.1")
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        sched_file = str(tmp_path / "scheduler.json")

        def start(name, *args):
            host = f"10.77.{net}.{NAMES.index(name) + 2}"
            cmd = ["ip", "netns", "exec", spaces[name], dask, *args, "--host", host, "--no-dashboard"]
            procs[name] = (host, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        start("s", "scheduler", "--port", "0", "--scheduler-file", sched_file)
        deadline = time.time() + 60
        while not os.path.exists(sched_file) and time.time() < deadline:
            time.sleep(0.2)
        for name in NAMES[1:]:
            start(name, "worker", "--scheduler-file", sched_file, "--nthreads", "1", "--no-nanny")
        from distributed import Client

        with Client(scheduler_file=sched_file, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            yield client, procs, bridge
    finally:
        for _, p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        for ns in spaces.values():
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", bridge, check=False)


def _bridge_bytes(bridge):
    """Bytes the driver's side of the bridge has received and sent: the driver's traffic with the hosts (the
    workers' traffic with each other is bridged between their ports, never through it)."""
    stats = f"/sys/class/net/{bridge}/statistics/"
    return tuple(int(open(stats + f).read()) for f in ("rx_bytes", "tx_bytes"))


def test_hosts_of_their_own_give_the_in_process_bits_recover_a_killed_worker_and_move_little(hosts):
    """A fit whose scheduler and workers sit at addresses of their own gives the in-process model bit for
    bit; a worker SIGKILLed between two iterations costs a rebuild, not another model; and the driver's traffic
    per Lloyd iteration, each way, is the centres' size and a little more (1 kB of centres: 2-3 kB measured),
    not the rows' (200,000 rows, k = 16, d = 8: their labels alone would be 800 kB an iteration)."""
    from dask_clust.datasets import make_blobs

    client, procs, bridge = hosts
    X, _ = make_blobs(200_000, 8, 16, chunks=25_000, random_state=3)
    X = client.persist(X)  # on the workers (the client is not the default scheduler)
    kw = dict(n_clusters=16, random_state=1, tol=0.0, max_iter=8)
    here = dask_clust.fit(client.compute(X).result(), client="in-process", **kw)
    workers = sorted(client.scheduler_info()["workers"])
    assert all(a.split("://")[1].startswith("10.77.") for a in workers), workers

    seen = {}
    model = dask_clust.fit(
        X, client=client, callback=lambda r: seen.setdefault(r["iteration"], _bridge_bytes(bridge)), **kw
    )
    np.testing.assert_array_equal(model.cluster_centers_, here.cluster_centers_)
    assert model.objective_ == here.objective_
    per_iteration = [(seen[8][i] - seen[2][i]) / 6 for i in (0, 1)]  # into and out of the driver
    centres = 16 * 8 * 8
    assert all(0 < b < 8 * centres + 8_000 for b in per_iteration), per_iteration

    lost = []
    host, victim = procs["w2"]

    def kill_at_iteration_3(record):
        if record["iteration"] == 3 and not lost:
            lost.append(host)
            os.kill(victim.pid, signal.SIGKILL)

    killed = dask_clust.fit(X, client=client, callback=kill_at_iteration_3, **kw)
    assert lost and killed.engine_["rebuilds"] >= 1
    np.testing.assert_array_equal(killed.cluster_centers_, here.cluster_centers_)
    assert killed.objective_ == here.objective_
