"""Fixtures of the Python suite.

Engines reach each other over `net`: "tcp" (loopback, on every host) or
"rdma" (needs devices: the rxe VM gives rxe0 and rxe1; without any it
skips).  A case that tests the API runs over TCP (on the host, in the
`python` stage of tools/run-tests); a case that tests what RDMA does
(link loss, NIC paths, pinning) runs over RDMA only, and a few run over both
so that the API is seen end to end on RDMA too.  Every RDMA case carries the
marker `rdma` (those using `devices` get it here): the VM stage runs
`-m rdma` only.  The module under test is `tide`, or what
TIDE_TEST_ENGINE_MODULE names (e.g. "mooncake.engine", so the same
Mooncake-API file runs against the real thing)."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def rdma_devices():
    for var in ("TIDE_TEST_DEVICES", "RXE_VM_DEVICES"):
        if os.environ.get(var):
            devs = os.environ[var].split()
            break
    else:
        root = Path("/sys/class/infiniband")
        devs = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if len(devs) == 1:
        devs = devs * 2
    return devs


@pytest.fixture(scope="session")
def devices():
    devs = rdma_devices()
    if not devs:
        pytest.skip("no RDMA device (run in the rxe VM: tools/rxe-vm)")
    return devs


def pytest_configure(config):
    config.addinivalue_line("markers", "rdma: needs RDMA devices (the rxe VM: tools/python-wheel test-rdma)")


def pytest_collection_modifyitems(items):
    for item in items:
        if "devices" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rdma)


class Net:
    """How a case's engines reach each other.  Side 0 is the initiator in
    this process, side 1 the peer (a second engine or process)."""

    def __init__(self, name: str, devices) -> None:
        self.name = name
        self.devices = devices

    def __repr__(self) -> str:
        return self.name

    def config(self, side: int = 0) -> dict:
        """tide.Engine's keywords."""
        if self.name == "tcp":
            return {"local_server_name": "127.0.0.1", "transports": "tcp"}
        return {"local_server_name": "127.0.0.1", "transports": "rdma", "devices": [self.devices[side]]}

    def peer_device(self, side: int = 1) -> str:
        """peer.py's DEVICE argument: "tcp", or the RDMA device."""
        return "tcp" if self.name == "tcp" else self.devices[side]

    def initialize(self, te, side: int = 0) -> int:
        """Mooncake's initialize() of a TransferEngine, over this net."""
        device = "" if self.name == "tcp" else self.devices[side]
        return te.initialize("127.0.0.1", "P2PHANDSHAKE", self.name, device)


@pytest.fixture(params=["tcp", pytest.param("rdma", marks=pytest.mark.rdma)])
def net(request):
    if request.param == "rdma":
        return Net("rdma", request.getfixturevalue("devices"))
    return Net("tcp", [])


# A case over one net only (the default is both): indirect parametrization of `net`.
tcp_only = pytest.mark.parametrize("net", ["tcp"], indirect=True)
rdma_only = pytest.mark.parametrize("net", [pytest.param("rdma", marks=pytest.mark.rdma)], indirect=True)


@pytest.fixture(scope="session")
def engine_module():
    name = os.environ.get("TIDE_TEST_ENGINE_MODULE", "tide")
    return importlib.import_module(name)


class Peer:
    """A second process (tests/peer.py): the "decode" side.  Speaks JSON lines
    on its stdin/stdout: the side channel the serving stacks use for block
    addresses."""

    def __init__(self, mode: str, device: str, *extra: str, env=None) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "peer.py"), mode, device, *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.hello = self.read()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited ({self.proc.wait()}) before answering")
        return json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: its kernel still takes connections and bytes, the process
        answers nothing (a stalled peer over TCP)."""
        self.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: self.state() == "T", "the peer stopped")  # delivery is asynchronous

    def state(self) -> str:
        """Its state letter in /proc (R, S, T for stopped, ...)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            try:
                self.ask(cmd="quit")
            except (RuntimeError, BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def peer_factory():
    peers = []

    def make(mode, device, *extra, env=None):
        p = Peer(mode, device, *extra, env=env)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()


def pattern(seed: int, n: int) -> bytes:
    """n bytes that differ per seed and per position (cheap to check)."""
    import numpy as np

    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed * 40503) >> 7).astype(np.uint8).tobytes()


def wait_until(predicate, what: str, tries: int = 600, pause: float = 0.1):
    """Polls `predicate` until it is true (at most `tries` times, `pause` s
    apart: a bound on a state the code guarantees to reach, not a timing
    assertion); fails naming `what` otherwise."""
    for _ in range(tries):
        if predicate():
            return
        time.sleep(pause)
    pytest.fail(f"never reached: {what}")


class LinkLoss:
    """100% loss (netem) on the veths of the RDMA devices while on: nothing
    crosses the wire, so posted WRs neither complete nor fail until their
    QP's retries run out (qp_timeout x qp_retry_cnt)."""

    def __init__(self, netdevs) -> None:
        self.netdevs = netdevs
        self.active = False

    def on(self) -> None:
        for d in self.netdevs:
            subprocess.run(["tc", "qdisc", "add", "dev", d, "root", "netem", "loss", "100%"], check=True)
        self.active = True

    def off(self) -> None:
        if self.active:
            for d in self.netdevs:
                subprocess.run(["tc", "qdisc", "del", "dev", d, "root"], check=False)
        self.active = False


@pytest.fixture
def link_loss(devices):
    """LinkLoss over the test's devices; skips outside tools/rxe-vm (it needs
    the VM's veths, tc and root) or in a VM already shaped."""
    netdevs = sorted({os.environ.get(f"RXE_VM_NETDEV_{d}", "") for d in devices[:2]})
    if "" in netdevs or os.geteuid() != 0 or shutil.which("tc") is None:
        pytest.skip("needs tools/rxe-vm (RXE_VM_NETDEV_<dev>), root and tc")
    for shaped in ("RXE_VM_LOSSES", "RXE_VM_RATES", "RXE_VM_DELAYS"):
        if os.environ.get(shaped, "-").strip("- "):
            pytest.skip(f"needs a VM without --loss/--rate/--delay ({shaped})")
    loss = LinkLoss(netdevs)
    yield loss
    loss.off()
