"""Engines whose descriptors live in etcd (Debian's etcd on loopback ports,
started here; skipped where there is none), over TCP: with publish_delay_ms
a registration returns before the store has it, and flush_metadata() stores
it, so that a peer's request to the new buffer then succeeds."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request

import pytest

import tide
from conftest import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_answers(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/v3/maintenance/status", data=b"{}"), timeout=1)
        return True
    except OSError:
        return False


@pytest.fixture
def etcd(tmp_path):
    exe = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if exe is None:
        pytest.skip("no etcd binary (Debian's etcd-server)")
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([exe, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", client,
                             "--advertise-client-urls", client, "--listen-peer-urls", peer,
                             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: etcd_answers(client), "etcd answers")
        yield "etcd://" + client.removeprefix("http://")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_publish_delay_a_registration_reaches_the_store_on_flush(etcd):
    config = {"local_server_name": "127.0.0.1", "transports": "tcp", "metadata": etcd}
    # A window far past the test: only flush_metadata() stores the buffer.
    with tide.Engine(publish_delay_ms=600_000, **config) as owner, tide.Engine(**config) as peer:
        src = owner.register(bytearray(b"t" * 4096))
        dst = bytearray(4096)
        local = peer.register(dst)
        seg = peer.open(owner.segment_name)
        assert seg.buffers() == []  # the store has the descriptor create() published, not the buffer
        with pytest.raises(tide.InvalidArgument, match="outside every buffer"):  # after a re-fetch
            peer.transfer([tide.read(local, seg, address=src.address)], timeout=10)
        owner.flush_metadata()
        assert peer.transfer([tide.read(local, seg, address=src.address)], timeout=10) == 4096
        assert dst == b"t" * 4096


def test_flush_metadata_without_a_delay_or_a_store_returns_at_once():
    with tide.Engine(local_server_name="127.0.0.1", transports="tcp") as eng:
        eng.register(bytearray(4096))
        assert eng.flush_metadata() is None
    with pytest.raises(tide.EngineClosed):
        eng.flush_metadata()
