"""mooncake.engine.TransferEngine's API, used the way vLLM's MooncakeConnector and
SGLang's disaggregation backend use it, against a peer process, over TCP (a
few cases over RDMA too).  The same file
runs against `tide` (default) and against Mooncake's own module
(TIDE_TEST_ENGINE_MODULE=mooncake.engine): a case only tide passes would be
testing tide's reading of the API, not the API.  Every byte is verified."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from conftest import pattern, tcp_only

NBLOCKS, BLOCK = 64, 16 << 10
MODULE = os.environ.get("TIDE_TEST_ENGINE_MODULE", "tide")


@pytest.fixture
def prefill(engine_module, net):
    te = engine_module.TransferEngine()
    assert net.initialize(te) == 0
    yield te
    if hasattr(te, "close"):
        te.close()


@pytest.fixture
def decode(peer_factory, net):
    return peer_factory("mooncake", net.peer_device(), MODULE, str(NBLOCKS), str(BLOCK))


def kv_blocks(te, n=NBLOCKS, block=BLOCK, seed=0):
    """n numpy KV blocks with distinct patterns, registered with batch_register_memory."""
    arena = np.empty(n * block, dtype=np.uint8)
    for i in range(n):
        arena[i * block:(i + 1) * block] = np.frombuffer(pattern(seed + i, block), np.uint8)
    addrs = [arena.ctypes.data + i * block for i in range(n)]
    assert te.batch_register_memory(addrs, [block] * n) == 0
    return arena, addrs


def test_ten_threads_push_kv_blocks(prefill, decode):
    arena, addrs = kv_blocks(prefill, seed=1000)
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    results, per_thread = [], NBLOCKS // 8

    def push(t):
        # Each of 10 threads writes its own slice of blocks (threads 8, 9 overlap 0, 1 with the same data).
        lo = (t % 8) * per_thread
        idx = list(range(lo, lo + per_thread))
        results.append(prefill.batch_transfer_sync_write(seg, [addrs[i] for i in idx], [remote[i] for i in idx],
                                                         [BLOCK] * len(idx)))

    threads = [threading.Thread(target=push, args=(t,)) for t in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [0] * 10
    assert decode.ask(cmd="digest", seeds=[1000 + i for i in range(NBLOCKS)])["found"] == [1000 + i for i in
                                                                                            range(NBLOCKS)]
    assert prefill.batch_unregister_memory(addrs) == 0


@tcp_only
def test_sync_read_and_opcode(prefill, decode, engine_module):
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    assert decode.ask(cmd="fill", seed=7)["ok"]
    dst = np.zeros(2 * BLOCK, dtype=np.uint8)
    assert prefill.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert prefill.transfer_sync_read(seg, dst.ctypes.data, remote[3], BLOCK) == 0
    assert dst[:BLOCK].tobytes() == pattern(7 + 3, BLOCK)
    op = engine_module.TransferEngine.TransferOpcode.Read
    assert prefill.transfer_sync(seg, dst.ctypes.data + BLOCK, remote[5], BLOCK, op) == 0
    assert dst[BLOCK:].tobytes() == pattern(7 + 5, BLOCK)
    assert prefill.batch_transfer_sync_read(seg, [dst.ctypes.data], [remote[9]], [BLOCK]) == 0
    assert dst[:BLOCK].tobytes() == pattern(7 + 9, BLOCK)
    assert prefill.unregister_memory(dst.ctypes.data) == 0


def test_async_batches_and_status(prefill, decode):
    arena, addrs = kv_blocks(prefill, seed=50)
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    ids = []
    for lo in range(0, NBLOCKS, 16):
        bid = prefill.batch_transfer_async_write(seg, addrs[lo:lo + 16], remote[lo:lo + 16], [BLOCK] * 16)
        assert bid != 0
        ids.append(bid)
    assert prefill.get_batch_transfer_status(ids) == 0
    assert decode.ask(cmd="digest", seeds=[50 + i for i in range(NBLOCKS)])["found"] == [50 + i for i in
                                                                                          range(NBLOCKS)]


@tcp_only
def test_submit_write_and_check_status(prefill, decode):
    arena, addrs = kv_blocks(prefill, n=4, seed=300)
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    decode.ask(cmd="zero")
    bid = prefill.transfer_submit_write(seg, addrs[2], remote[2], BLOCK)
    assert bid != 0
    deadline = time.monotonic() + 60
    while (rc := prefill.transfer_check_status(bid)) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert rc == 1
    found = decode.ask(cmd="digest", seeds=[300 + i for i in range(NBLOCKS)])["found"]
    assert found[2] == 302


@tcp_only
def test_managed_buffers(prefill, decode):
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    addr = prefill.allocate_managed_buffer(BLOCK)
    assert addr != 0
    payload = pattern(4242, BLOCK)
    assert prefill.write_bytes_to_buffer(addr, payload, BLOCK) == 0
    assert prefill.read_bytes_from_buffer(addr, 16) == payload[:16]
    assert prefill.transfer_sync_write(seg, addr, remote[1], BLOCK) == 0
    seeds = [None] * NBLOCKS
    seeds[1] = 4242
    assert decode.ask(cmd="digest", seeds=[4242] * NBLOCKS)["found"][1] == 4242
    assert prefill.free_managed_buffer(addr, BLOCK) == 0


def test_notify_reaches_the_peer(prefill, decode, engine_module):
    arena, addrs = kv_blocks(prefill, n=2, seed=900)
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    note = engine_module.TransferNotify("prefill-0", "req-17 done")
    assert prefill.transfer_sync(seg, addrs[0], remote[0], BLOCK, engine_module.TransferEngine.TransferOpcode.Write,
                                 note) == 0
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = decode.ask(cmd="notifies")["notifies"]
    assert got == [["prefill-0", "req-17 done"]]


@tcp_only
def test_probe_live_unknown_and_killed(prefill, decode):
    assert prefill.send_probe(decode.hello["segment"]) == 0
    t0 = time.monotonic()
    assert prefill.send_probe("127.0.0.1:1") != 0  # nothing listens there
    decode.kill()
    assert prefill.send_probe(decode.hello["segment"]) != 0
    assert time.monotonic() - t0 < 15


def test_peer_killed_mid_transfer(prefill, decode, peer_factory, net, monkeypatch):
    big = np.zeros(NBLOCKS * BLOCK, dtype=np.uint8)
    assert prefill.register_memory(big.ctypes.data, big.nbytes) == 0
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    results = []
    moving = threading.Event()

    def writer():
        # Until a call fails: the kill comes once transfers are seen to succeed (not after a
        # sleep, which a fast transport outlasts), and the next calls must fail in time.
        for _ in range(1_000_000):
            rc = prefill.batch_transfer_sync_write(seg, [big.ctypes.data + i * BLOCK for i in range(NBLOCKS)], remote,
                                                   [BLOCK] * NBLOCKS)
            results.append(rc)
            if len(results) == 3:
                moving.set()
            if rc != 0:
                moving.set()
                return

    t = threading.Thread(target=writer)
    t.start()
    assert moving.wait(120)
    decode.kill()
    t.join(120)
    assert not t.is_alive(), "the sync call did not return after its peer died"
    assert results and results[-1] == -1
    other = peer_factory("mooncake", net.peer_device(), MODULE, "2", str(BLOCK))
    assert prefill.transfer_sync_write(other.hello["segment"], big.ctypes.data, other.hello["blocks"][0], BLOCK) == 0


@tcp_only
def test_bad_input_gets_its_sentinel(prefill, decode):
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    arena, addrs = kv_blocks(prefill, n=2, seed=5)
    # Lists of unequal length.
    assert prefill.batch_transfer_sync_write(seg, addrs, remote[:1], [BLOCK]) == -1
    # An unregistered local address.
    loose = np.zeros(BLOCK, dtype=np.uint8)
    assert prefill.transfer_sync_write(seg, loose.ctypes.data, remote[0], BLOCK) == -1
    # A remote address outside every buffer of the peer.
    assert prefill.transfer_sync_write(seg, addrs[0], 16, BLOCK) == -1
    # An unknown segment.
    assert prefill.transfer_sync_write("127.0.0.1:1", addrs[0], remote[0], BLOCK) == -1
    assert prefill.batch_transfer_async_write("127.0.0.1:1", [addrs[0]], [remote[0]], [BLOCK]) == 0
    # Zero length registration; overlap.
    assert prefill.register_memory(addrs[0], 0) != 0
    assert prefill.register_memory(addrs[0] + 8, 64) != 0


@tcp_only
@pytest.mark.skipif(MODULE != "tide", reason="Mooncake dereferences stale, repeated and zero ids (its quirk Q6)")
def test_stale_repeated_and_zero_batch_ids(prefill, decode):
    # Review 1ab3d99 #21: each id must reach the engine's own generation check (unknown_batch),
    # not be stopped by a table in Python first.
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    arena, addrs = kv_blocks(prefill, n=2, seed=11)
    bid = prefill.batch_transfer_async_write(seg, addrs[:1], remote[:1], [BLOCK])
    assert prefill.get_batch_transfer_status([bid]) == 0
    assert prefill.get_batch_transfer_status([bid]) == -1  # freed by the first call
    assert "unknown_batch" in prefill.last_error
    assert prefill.get_batch_transfer_status([0]) == -1
    assert "unknown_batch" in prefill.last_error
    assert prefill.transfer_check_status(bid) == -1
    assert "unknown_batch" in prefill.last_error
    # A stale id whose slot holds a live batch now: the generation tells them apart, and the
    # live batch is untouched.
    live = prefill.batch_transfer_async_write(seg, addrs[:1], remote[:1], [BLOCK])
    assert live != bid
    assert prefill.get_batch_transfer_status([bid]) == -1 and "unknown_batch" in prefill.last_error
    assert prefill.get_batch_transfer_status([live]) == 0
    b2 = prefill.batch_transfer_async_write(seg, addrs[1:], remote[1:], [BLOCK])
    assert prefill.get_batch_transfer_status([b2, b2]) == -1  # the repeat is refused, the batch still waited and freed
    assert "given twice" in prefill.last_error
    assert prefill.transfer_check_status(b2) == -1
    assert "unknown_batch" in prefill.last_error


@tcp_only
@pytest.mark.skipif(MODULE != "tide", reason="tide's native entry point under tide.TransferEngine")
def test_named_transfer_bad_input(prefill, decode):
    seg, remote = decode.hello["segment"], decode.hello["blocks"]
    arena, addrs = kv_blocks(prefill, n=2, seed=21)
    loose = np.zeros(BLOCK, dtype=np.uint8)
    # Every sync and async variant: unequal lists, an unregistered address, an unknown segment.
    for call, bad in ((prefill.batch_transfer_sync_read, -1), (prefill.batch_transfer_async_read, 0)):
        assert call(seg, addrs, remote[:2], [BLOCK]) == bad
        assert "unequal length" in prefill.last_error
        assert call(seg, [loose.ctypes.data], remote[:1], [BLOCK]) == bad
        assert call("127.0.0.1:1", addrs[:1], remote[:1], [BLOCK]) == bad
    assert prefill.transfer_sync_read(seg, loose.ctypes.data, remote[0], BLOCK) == -1
    assert prefill.transfer_submit_write("127.0.0.1:1", addrs[0], remote[0], BLOCK) == 0
    with pytest.raises(TypeError, match="opcode"):
        prefill.transfer_sync(seg, addrs[0], remote[0], BLOCK, 1)  # a plain int, refused as Mooncake does
    # The native call itself: a segment opened once and kept; its own argument errors.
    native = prefill._engine
    assert native.named_segment(seg) == native.named_segment(seg)
    assert native.transfer_named(seg, 1, addrs[:1], remote[:1], [BLOCK], 5.0, 0.0) is None
    assert native.transfer_named(seg, 1, [], [], [], 5.0, 0.0) is None
    with pytest.raises(ValueError, match="unequal length"):
        native.transfer_named(seg, 1, addrs, remote[:1], [BLOCK], 5.0, 0.0)
    with pytest.raises(ValueError, match="opcode"):
        native.transfer_named(seg, 2, addrs[:1], remote[:1], [BLOCK], 5.0, 0.0)
    with pytest.raises(TypeError, match="lengths"):
        native.transfer_named(seg, 1, addrs[:1], remote[:1], [-1], 5.0, 0.0)
    with pytest.raises(TypeError, match="buffers"):
        native.transfer_named(seg, 1, [float(addrs[0])], remote[:1], [BLOCK], 5.0, 0.0)
    with pytest.raises(TypeError, match="sequence"):
        native.submit_named(seg, 1, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    # sync_one (transfer_sync_write / _read's): the same run for one request as three ints, a plain
    # C function with its own argument checks.
    from tide import _tide
    one = _tide.sync_one
    assert one(native, seg, 1, addrs[0], remote[0], BLOCK, 5.0, 0.0) is None
    assert one(native, seg, True, addrs[0], remote[0], BLOCK, 5, 0) is None  # bool and int pass, as in pybind11
    with pytest.raises(ValueError, match="opcode"):
        one(native, seg, 2, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^opcode must be an int"):
        one(native, seg, 1.0, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^opcode must be an int"):
        one(native, seg, 2**70, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^length must be an int"):
        one(native, seg, 1, addrs[0], remote[0], -1, 5.0, 0.0)
    with pytest.raises(TypeError, match="^buffer must be an int"):
        one(native, seg, 1, float(addrs[0]), remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^peer address must be an int"):
        one(native, seg, 1, addrs[0], [remote[0]], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^target_hostname must be a str, got bytes"):
        one(native, seg.encode(), 1, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="^base_timeout must be a float, got str"):
        one(native, seg, 1, addrs[0], remote[0], BLOCK, "5", 0.0)
    with pytest.raises(TypeError, match="engine must be a tide._tide.Engine, got TransferEngine"):
        one(prefill, seg, 1, addrs[0], remote[0], BLOCK, 5.0, 0.0)
    with pytest.raises(TypeError, match="takes 8 arguments, got 7"):
        one(native, seg, 1, addrs[0], remote[0], BLOCK, 5.0)
    with pytest.raises(TypeError, match="keyword"):
        one(native, seg, 1, addrs[0], remote[0], BLOCK, 5.0, timeout_per_byte=0.0)
    import tide
    with pytest.raises(tide.Error):
        one(native, "127.0.0.1:1", 1, addrs[0], remote[0], BLOCK, 5.0, 0.0)  # nothing listens there
    # Through the Mooncake methods: a wrong type raises as pybind11 made Mooncake's raise.
    with pytest.raises(TypeError, match="target_hostname"):
        prefill.transfer_sync_write(None, addrs[0], remote[0], BLOCK)
    with pytest.raises(TypeError, match="^length must be an int"):
        prefill.transfer_sync_read(seg, addrs[0], remote[0], "4096")
    bid = native.submit_named(seg, 0, addrs, remote[:2], [BLOCK, BLOCK], 5.0, 0.0)
    native.wait(bid, 5.0)
    assert native.batch_status(bid)[0] == 2  # COMPLETED
    assert native.finish_named(bid) is None  # frees it
    with pytest.raises(tide.Error, match="unknown_batch"):
        native.finish_named(bid)
