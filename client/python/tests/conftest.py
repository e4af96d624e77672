"""Fixtures: real ps-master and ps-server processes on loopback, in a temporary directory.

Binaries: $PS_MASTER_BINARY / $PS_SERVER_BINARY, else $PS_BUILD_DIR/bin, else
<repo>/build/bin. Every process binds port 0 and writes its port to a file; each is
stopped by its own pid (SIGTERM, then SIGKILL).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # elastic_ps without PYTHONPATH

NUM_VSHARDS = 64


def _build_dir():
    b = os.environ.get("PS_BUILD_DIR")
    if b:
        p = Path(b)
        return p if p.is_absolute() else REPO / p
    return REPO / "build"


def binary(name, env):
    v = os.environ.get(env)
    path = Path(v) if v else _build_dir() / "bin" / name
    if not path.is_file():
        pytest.skip(f"{name} not built ({path}); build first or set {env}")
    return str(path)


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: starts ps-master / ps-server processes")
    config.addinivalue_line("markers", "lease_ms(n): the cluster fixture's lease")


_PROCESS_FIXTURES = {"cluster", "shared_cluster"}


def pytest_collection_modifyitems(config, items):
    """A test that uses a cluster fixture is an integration test, marked or not (ctest runs
    `-m "not integration"` as a unit test and `-m integration` as an integration test)."""
    for item in items:
        if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


class Proc:
    """A child process with its log file; stopped by pid."""

    def __init__(self, name, argv, log_path, port_file=None, env=None):
        self.name, self.argv, self.log_path, self.port_file = name, argv, log_path, port_file
        self.env = env
        self.port = None
        self.popen = None

    def start(self, timeout=20.0):
        if self.port_file is not None and self.port_file.exists():
            self.port_file.unlink()
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        if self.port_file is None:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n"
                                   f"{self.tail()}")
            try:
                text = self.port_file.read_text().strip()
                if text.isdigit():
                    self.port = int(text)
                    return self
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} wrote no port in {timeout} s:\n{self.tail()}")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def kill(self):
        """SIGKILL and reap."""
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()

    def stop(self, timeout=5.0):
        if not self.alive():
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def tail(self, n=40):
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


class Cluster:
    """ps-master + `num_ps` durable pods registered with it."""

    def __init__(self, tmp, num_ps=2, lease_ms=2000, data_dirs=True, master_args=()):
        self.tmp = Path(tmp)
        self.master_args = list(master_args)  # further ps-master flags (--replication=2)
        self.num_ps = num_ps
        self.lease_ms = lease_ms
        self.data_dirs = data_dirs
        self.master_bin = binary("ps-master", "PS_MASTER_BINARY")
        self.server_bin = binary("ps-server", "PS_SERVER_BINARY")
        self.master = None
        self.pods = []

    def _common(self, name):
        port_file = self.tmp / f"{name}.port"
        return port_file, ["--host=127.0.0.1", f"--port_file={port_file}"]

    def start(self):
        self.master = self.start_master()
        for i in range(self.num_ps):
            self.pods.append(self.start_pod(i))
        return self

    def start_master(self, port=0):
        port_file, common = self._common("master")
        return Proc("master", [self.master_bin, *common, f"--port={port}",
                              f"--data_dir={self.tmp / 'master-db'}",
                              f"--num_ps={self.num_ps}", f"--num_vshards={NUM_VSHARDS}",
                              f"--lease_ms={self.lease_ms}", "--shutdown_grace_ms=200",
                              *self.master_args],
                    self.tmp / "master.log", port_file).start()

    def restart_master(self):
        """SIGKILLs the master and starts it again on the same port and data dir."""
        port = self.master.port
        self.master.kill()
        self.master = self.start_master(port)
        return self.master

    def pod_argv(self, i, port=0):
        port_file, common = self._common(f"ps-{i}")
        argv = [self.server_bin, *common, f"--port={port}", f"--master={self.master.address}",
                f"--pod_id=ps-{i}", f"--num_vshards={NUM_VSHARDS}", "--shutdown_grace_ms=200"]
        if self.data_dirs:
            argv.append(f"--data_dir={self.tmp / f'ps-{i}-data'}")
        return argv, port_file

    def start_pod(self, i, port=0):
        argv, port_file = self.pod_argv(i, port)
        return Proc(f"ps-{i}", argv, self.tmp / f"ps-{i}.log", port_file).start()

    def restart_pod(self, i):
        """SIGKILLs pod i and starts it again with the same id, port and data dir."""
        old = self.pods[i]
        old.kill()
        self.pods[i] = self.start_pod(i, port=old.port)
        return self.pods[i]

    def stop(self):
        for p in self.pods:
            p.stop()
        if self.master is not None:
            self.master.stop()

    def logs(self):
        out = []
        for p in [self.master, *self.pods]:
            if p is not None:
                out.append(f"---- {p.name}:\n{p.tail()}")
        return "\n".join(out)


@pytest.fixture
def cluster(tmp_path, request):
    """A fresh cluster per test. Lease 2 s (a loaded CI machine must not expire a live
    worker's lease), or @pytest.mark.lease_ms(N) for tests that wait for an expiry."""
    marker = request.node.get_closest_marker("lease_ms")
    c = Cluster(tmp_path, lease_ms=marker.args[0] if marker else 2000)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(c.logs())


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One cluster for the tests of a module that do not disturb it."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
