"""tide.TransferEngine (Mooncake's API) where lifetimes meet: a peer that
re-registers its pool under writers (RDMA: the NIC path in the message),
managed buffers that cannot be freed yet (RDMA: WRs held by link loss) or are
read while the engine closes, racing initialize() calls (TCP).  tide only
(they read tide's failure messages and use tide's link shaping); cases named
after a finding of review 1ab3d99 fail with that bug put back."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import tide
from conftest import pattern, rdma_only, tcp_only, wait_until

NBLOCKS, BLOCK = 64, 16 << 10


@pytest.fixture
def decode(peer_factory, net):
    return peer_factory("mooncake", net.peer_device(), "tide", str(NBLOCKS), str(BLOCK))


def initiator(net):
    te = tide.TransferEngine()
    assert net.initialize(te) == 0
    return te


@rdma_only
def test_writers_while_the_peer_reregisters_report_its_nic_path(net, decode, monkeypatch):
    # Review 1ab3d99 #1(a): run_batch freed the batch, then the outcome read its failed
    # peer path, a view into the segment view the free destroyed once another thread's
    # submit had refreshed the segment: freed heap (garbage in the message, or ASan's
    # heap-use-after-free under tools/python-wheel test-rdma-asan).
    monkeypatch.setenv("TIDE_PY_QUIET", "1")
    te = initiator(net)
    try:
        arena = np.frombuffer(pattern(5, NBLOCKS * BLOCK), np.uint8).copy()
        addrs = [arena.ctypes.data + i * BLOCK for i in range(NBLOCKS)]
        assert te.batch_register_memory(addrs, [BLOCK] * NBLOCKS) == 0
        seg, remote = decode.hello["segment"], decode.hello["blocks"]
        messages, lock = [], threading.Lock()
        real_fail = te._fail

        def record(why, sentinel=-1):
            with lock:
                messages.append(str(why))
            return real_fail(why, sentinel)

        te._fail = record
        stop = threading.Event()
        errors = []

        def writer(t):
            lo = (t % 8) * 8
            try:
                while not stop.is_set():
                    te.batch_transfer_sync_write(seg, addrs[lo:lo + 8], remote[lo:lo + 8], [BLOCK] * 8)
            except BaseException as e:  # noqa: B902 - e.g. UnicodeDecodeError of a freed path's bytes
                errors.append(e)
                stop.set()

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(10)]
        for t in threads:
            t.start()
        try:
            for _ in range(60):  # re-registrations until enough WRITEs failed on the wire
                assert decode.ask(cmd="reregister")["rc"] == [0, 0]
                if stop.is_set():
                    break
                with lock:
                    if sum(" -> " in m for m in messages) >= 40:
                        break
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert errors == []
        paths = [re.search(r"\((\S*) -> ([^)]*)\)", m) for m in messages if " -> " in m]
        assert paths, f"no WRITE failed on the wire: {messages[:5]}"
        expected = f"{seg}@{net.devices[1]}"
        assert {(p.group(1), p.group(2)) for p in paths} == {(net.devices[0], expected)}
        # And the engine still moves bytes to the re-registered pool.
        assert te.batch_transfer_sync_write(seg, addrs[:4], remote[:4], [BLOCK] * 4) == 0
        assert te.batch_unregister_memory(addrs) == 0
    finally:
        te.close()


@rdma_only
def test_a_managed_buffer_that_cannot_drain_stays_registered_and_mapped(net, decode, link_loss, monkeypatch):
    # Review 1ab3d99 #7: free_managed_buffer dropped the block before the unregister, so when
    # that failed (transfers not drained within transfer_timeout + 10 s) the pages were unmapped
    # while the engine still held them registered.
    monkeypatch.setenv("TIDE_PY_QUIET", "1")
    monkeypatch.setenv("TIDE_TRANSFER_TIMEOUT_MS", "500")
    monkeypatch.setenv("TIDE_QP_TIMEOUT", "20")  # a posted WR is retried 8 x 4.3 s under loss
    monkeypatch.setenv("TIDE_QP_RETRY_CNT", "7")
    te = initiator(net)
    try:
        seg, remote = decode.hello["segment"], decode.hello["blocks"]
        addr = te.allocate_managed_buffer(BLOCK)
        assert addr != 0
        assert te.write_bytes_to_buffer(addr, pattern(8, BLOCK), BLOCK) == 0
        assert te.transfer_sync_write(seg, addr, remote[0], BLOCK) == 0  # the endpoint is up
        link_loss.on()
        bid = te.batch_transfer_async_write(seg, [addr] * 16, remote[:16], [BLOCK] * 16)
        assert bid != 0
        wait_until(lambda: te._engine.telemetry(bid)["first_post_s"] is not None, "the batch posted")
        assert te.free_managed_buffer(addr, BLOCK) == -1
        assert "transfer_timeout + 10 s" in te.last_error
        # Still mapped, still registered memory as far as every call is concerned.
        assert te.read_bytes_from_buffer(addr, 16) == pattern(8, BLOCK)[:16]
        link_loss.off()
        assert te.get_batch_transfer_status([bid]) in (0, -1)
        assert te.free_managed_buffer(addr, BLOCK) == 0
        with pytest.raises(ValueError, match="not inside memory registered"):
            te.read_bytes_from_buffer(addr, 16)
    finally:
        te.close()


@tcp_only
def test_close_while_another_thread_reads_a_managed_buffer(net):
    # Review 1ab3d99 #7: close() unmapped every managed block at once, while another thread's
    # read_bytes_from_buffer could be copying from one (a segfault).
    te = initiator(net)
    addr = te.allocate_managed_buffer(4 << 20)
    assert addr != 0
    reads, errors = [0], []

    def reader():
        try:
            while True:
                te.read_bytes_from_buffer(addr, 4 << 20)
                reads[0] += 1
        except Exception as e:  # _NotInitialized / EngineClosed / ValueError once closed
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    wait_until(lambda: reads[0] >= 3, "reads made")
    te.close()
    t.join()
    assert errors


@tcp_only
def test_racing_initialize_creates_one_engine(net, monkeypatch):
    # Review 1ab3d99 #13: two threads could both see no engine and both create one; one was
    # dropped without close(), torn down with the GIL held.
    monkeypatch.setenv("TIDE_PY_QUIET", "1")
    te = tide.TransferEngine()
    go = threading.Barrier(4)
    rcs = []

    def init():
        go.wait()
        rcs.append(net.initialize(te))

    threads = [threading.Thread(target=init) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(rcs) == [-1, -1, -1, 0]
        assert te.get_rpc_port() > 0
    finally:
        te.close()
