"""Fixtures of the Python suite.  RDMA cases need devices (the rxe VM gives
rxe0 and rxe1); without any they skip.  The module under test is `tide`, or
what TIDE_TEST_ENGINE_MODULE names (e.g. "mooncake.engine", so the same
Mooncake-API file runs against the real thing)."""
from __future__ import annotations

import importlib
import json
import os
import shutil
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

    def close(self) -> None:
        if self.proc.poll() is None:
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
