"""Notifications between tide's module and Mooncake's own `mooncake.engine`, both
ways, over the wire (the Mooncake side in its own process): a prefill node's
`transfer_sync(..., notify)` must reach a decode node of the other kind, after
its data.  Needs Mooncake's module: MOONCAKE_PYTHONPATH names the folder that
holds its `mooncake` package (../shared/tools/build-mooncake-py.sh); without it
the cases skip."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import pattern

MOONCAKE = os.environ.get("MOONCAKE_PYTHONPATH", "")
pytestmark = pytest.mark.skipif(not MOONCAKE, reason="no Mooncake module (set MOONCAKE_PYTHONPATH)")
BLOCK = 64 << 10


@pytest.fixture
def mooncake_peer(peer_factory, devices):
    path = os.pathsep.join(p for p in (MOONCAKE, os.environ.get("PYTHONPATH", "")) if p)
    peer = peer_factory("mooncake", devices[1], "mooncake.engine", "2", str(BLOCK), env={"PYTHONPATH": path})
    assert "error" not in peer.hello, peer.hello
    return peer


def wait_for(poll, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = poll()
        if got:
            return got
        time.sleep(0.01)
    return []


def test_tide_notifies_a_mooncake_peer(mooncake_peer, devices):
    import tide

    te = tide.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", devices[0]) == 0
    try:
        src = np.frombuffer(pattern(31, BLOCK), np.uint8).copy()
        assert te.register_memory(src.ctypes.data, BLOCK) == 0
        seg, remote = mooncake_peer.hello["segment"], mooncake_peer.hello["blocks"]
        note = tide.TransferNotify("tide-prefill", "req-31 done")
        assert te.transfer_sync(seg, src.ctypes.data, remote[1], BLOCK, tide.TransferEngine.TransferOpcode.Write,
                                note) == 0
        reply = {}

        def poll():
            nonlocal reply
            reply = mooncake_peer.ask(cmd="notifies_then_digest", seeds=[0, 31])
            return reply["notifies"]

        assert wait_for(poll) == [["tide-prefill", "req-31 done"]]
        assert reply["found"][1] == 31  # the bytes were there when Mooncake's side read the notification
    finally:
        te.close()


def test_a_mooncake_peer_notifies_tide(mooncake_peer, devices):
    import tide

    te = tide.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", devices[0]) == 0
    try:
        dst = np.zeros(BLOCK, np.uint8)
        assert te.register_memory(dst.ctypes.data, BLOCK) == 0
        seg = f"127.0.0.1:{te.get_rpc_port()}"
        reply = mooncake_peer.ask(cmd="push", segment=seg, remote=dst.ctypes.data, seed=77, name="mc-prefill",
                                  msg="req-77 done")
        assert reply["rc"] == 0
        got = wait_for(lambda: [[n.name, n.msg] for n in te.get_notifies()])
        assert got == [["mc-prefill", "req-77 done"]]
        assert dst.tobytes() == pattern(77, BLOCK)
        assert te.get_notifies() == []  # drained: exactly once
    finally:
        te.close()
