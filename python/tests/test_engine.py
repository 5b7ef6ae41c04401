"""tide.Engine (the Pythonic API) against a peer process, over TCP (every host)
and, where it is RDMA that is tested or to see the API on it end to end, over
RDMA (rxe): buffer-protocol registration, bounds errors as exceptions, cancel,
asyncio, notifications, telemetry, stats, metrics, policies."""
from __future__ import annotations

import array
import asyncio
import mmap
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

import tide
from conftest import pattern, rdma_only, tcp_only, wait_until

NBLOCKS, BLOCK = 8, 64 << 10


@pytest.fixture
def target(peer_factory, net):
    return peer_factory("engine", net.peer_device(), str(NBLOCKS), str(BLOCK))


@pytest.fixture
def engine(net):
    with tide.Engine(**net.config()) as e:
        yield e


def test_register_anything_with_the_buffer_protocol(engine):
    objs = [bytearray(4096), memoryview(bytearray(8192)), mmap.mmap(-1, 4096), np.zeros(1024, np.float32),
            array.array("d", [0.0] * 512)]
    regs = [engine.register(o) for o in objs]
    assert len({r.buffer_id for r in regs}) == len(regs)
    assert [r.nbytes for r in regs] == [4096, 8192, 4096, 4096, 4096]
    with pytest.raises(BufferError):
        engine.register(b"read-only bytes")
    ro = engine.register(b"x" * 4096, readonly=True)
    assert ro.readonly and ro.access == tide.Access.REMOTE_READ
    with pytest.raises(ValueError):
        engine.register(np.zeros((64, 64))[:, 3])
    with pytest.raises(tide.InvalidArgument):
        engine.register(bytearray(0))
    with pytest.raises(tide.InvalidArgument):  # overlaps regs[0]
        engine.register(memoryview(objs[0])[16:32])
    ba = objs[0]
    with pytest.raises(BufferError):
        ba.extend(b"1")  # pinned while registered
    regs[0].unregister()
    ba.extend(b"1")
    for r in regs[1:] + [ro]:
        r.unregister()



def test_register_batch_registers_all_in_one_call(engine, target):
    objs = [np.frombuffer(pattern(40 + i, BLOCK), np.uint8).copy() for i in range(3)] + [bytearray(4096)]
    regs = engine.register_batch(objs)
    assert [r.obj is o for r, o in zip(regs, objs)] == [True] * 4
    assert [r.nbytes for r in regs] == [BLOCK, BLOCK, BLOCK, 4096]
    assert len({r.buffer_id for r in regs}) == 4 and all(r.registered for r in regs)
    assert all(r.access == tide.Access.REMOTE_READ_WRITE and not r.readonly for r in regs)
    with pytest.raises(BufferError):
        objs[3].extend(b"1")  # pinned while registered, as register()'s
    seg = engine.open(target.hello["segment"])
    ids = target.hello["ids"]
    assert engine.transfer([tide.write(regs[i], seg, ids[i]) for i in range(3)]) == 3 * BLOCK
    assert target.ask(cmd="digest", seeds=[40, 41, 42] + [0] * (NBLOCKS - 3))["found"][:3] == [40, 41, 42]
    with pytest.raises(tide.InvalidArgument, match="already_registered|overlap"):
        engine.register(objs[1])  # registered by the batch
    for r in regs:
        r.unregister()
    objs[3].extend(b"1")
    ro = engine.register_batch([b"x" * 4096, b"y" * 4096], readonly=True)
    assert all(r.readonly and r.access == tide.Access.REMOTE_READ for r in ro)
    for r in ro:
        r.unregister()


def test_register_batch_names_the_bad_buffer_and_registers_none(engine):
    good = [bytearray(4096), bytearray(4096)]
    cases = [
        ([], tide.InvalidArgument, "no buffers"),
        (bytearray(4096), TypeError, "sequence of buffers"),  # one buffer, not a sequence
        (42, TypeError, ""),  # not iterable
        (good + [object()], TypeError, "buffer 2: "),
        (good + [b"read-only"], BufferError, "buffer 2: .*readonly=True"),
        ([good[0], np.zeros((64, 64))[:, 3]], ValueError, "buffer 1: "),
        ([good[0], bytearray(0)], tide.InvalidArgument, "buffer 1: zero length"),
    ]
    for objs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            engine.register_batch(objs)
        # all or nothing: the good buffers are not registered, nor pinned
        good[0].extend(b"1")
        del good[0][-1:]
    part = memoryview(good[0])[16:32]
    with pytest.raises(tide.InvalidArgument, match="buffer 1: "):
        engine.register_batch([good[0], part])  # overlaps buffer 0
    part.release()
    good[0].extend(b"1")
    del good[0][-1:]
    regs = engine.register_batch(good)
    with pytest.raises(tide.InvalidArgument, match="buffer 1: "):
        engine.register_batch([bytearray(4096), good[1]])  # already registered
    for r in regs:
        r.unregister()


def test_register_batch_after_close_raises(net):
    e = tide.Engine(**net.config())
    e.close()
    buf = bytearray(4096)
    with pytest.raises(tide.EngineClosed):
        e.register_batch([buf])
    buf.extend(b"1")  # not left pinned


def test_write_read_by_buffer_id_and_bounds(engine, target):
    seg = engine.open(target.hello["segment"])
    ids = target.hello["ids"]
    src = engine.register(np.frombuffer(pattern(77, BLOCK), np.uint8).copy())
    assert engine.transfer([tide.write(src, seg, ids[3])]) == BLOCK
    assert target.ask(cmd="digest", seeds=[77] * NBLOCKS)["found"][3] == 77
    back = engine.register(np.zeros(BLOCK, np.uint8))
    assert engine.transfer([tide.read(back, seg, ids[3])]) == BLOCK
    assert bytes(back.obj) == pattern(77, BLOCK)
    with pytest.raises(tide.InvalidArgument, match="out_of_bounds"):
        engine.submit([tide.write(src, seg, ids[3], offset=1)])  # one byte past the end
    with pytest.raises(tide.InvalidArgument, match="out_of_bounds"):
        engine.submit([tide.write(src, seg, 10_000)])  # no such id
    with pytest.raises(tide.InvalidArgument):
        engine.submit([tide.write(src, seg, ids[0], length=BLOCK + 1)])  # past the local registration
    raw = seg.buffers()[5]
    assert engine.transfer([tide.write(src, seg, address=raw.address)]) == BLOCK
    assert target.ask(cmd="digest", seeds=[77] * NBLOCKS)["found"][5] == 77


def test_transfer_past_its_timeout_is_drained_and_raises(engine, target):
    seg = engine.open(target.hello["segment"])
    ids = target.hello["ids"]
    src = engine.register(np.frombuffer(pattern(5, BLOCK), np.uint8).copy())
    with pytest.raises(tide.TransferTimeout, match="canceled and drained"):
        engine.transfer([tide.write(src, seg, ids[i % NBLOCKS]) for i in range(256)], timeout=0.0)
    # Final before the raise: nothing of it is in flight from the buffer any
    # more (REJECT raises busy otherwise), and the engine still moves bytes.
    src.unregister(tide.InFlight.REJECT)
    src = engine.register(np.frombuffer(pattern(6, BLOCK), np.uint8).copy())
    assert engine.transfer([tide.write(src, seg, ids[2])], timeout=60) == BLOCK
    assert target.ask(cmd="digest", seeds=[6] * NBLOCKS)["found"][2] == 6


@rdma_only
def test_cancel_ends_unfinished_tasks_canceled_and_writes_nothing(net, target, link_loss):
    # Review 1ab3d99 #21: this case accepted COMPLETED or CANCELED, so a cancel() that did
    # nothing passed.  Under 100% loss nothing can complete, and only the cancel ends the
    # tasks before their transfer_timeout (which would make them TIMEOUT).
    with tide.Engine(**net.config(), transfer_timeout_ms=60000) as eng:
        seg = eng.open(target.hello["segment"])
        ids = target.hello["ids"]
        src = eng.register(np.frombuffer(pattern(3, BLOCK), np.uint8).copy())
        assert eng.transfer([tide.write(src, seg, ids[0])], timeout=60) == BLOCK  # the endpoint is up
        target.ask(cmd="zero")
        link_loss.on()
        batch = eng.submit([tide.write(src, seg, ids[i % NBLOCKS]) for i in range(64)])
        wait_until(lambda: batch.telemetry()["first_post_s"] is not None, "the batch posted")
        batch.cancel()
        tasks = batch.wait(50)
        assert {t.state for t in tasks} == {tide.State.CANCELED}
        assert all(t.reason == "canceled" for t in tasks)
        link_loss.off()
        batch.free()
        with pytest.raises(tide.LocalError):
            batch.status()  # freed: unknown_batch
        # Final, so nothing of it can still arrive: the peer's blocks are as zeroed.
        assert target.ask(cmd="digest", seeds=[3] * NBLOCKS)["found"] == [None] * NBLOCKS


@tcp_only
def test_cancel_over_tcp_ends_tasks_canceled_and_reads_nothing_after(net, target):
    # TCP's "final means final": READs from a peer that answers nothing (stopped) end
    # CANCELED on cancel(), their connections closed, so nothing the peer sends once it
    # runs again lands in the caller's memory.  (A WRITE's bytes already in the peer's
    # socket may still land there: only the caller's memory is promised.)
    with tide.Engine(**net.config(), transfer_timeout_ms=60000) as eng:
        seg = eng.open(target.hello["segment"])
        ids = target.hello["ids"]
        target.ask(cmd="fill", seed=30)
        probe = eng.register(np.zeros(BLOCK, np.uint8))
        assert eng.transfer([tide.read(probe, seg, ids[0])], timeout=60) == BLOCK  # connected
        dst = eng.register(np.zeros(NBLOCKS * BLOCK, np.uint8))
        target.pause()
        batch = eng.submit([tide.read(dst, seg, ids[i], local_offset=i * BLOCK, length=BLOCK)
                            for i in range(NBLOCKS)])
        wait_until(lambda: batch.telemetry()["first_post_s"] is not None, "the batch sent")
        batch.cancel()
        tasks = batch.wait(50)
        assert {t.state for t in tasks} == {tide.State.CANCELED}
        batch.free()
        target.resume()
        # The peer answers again: a new READ is served (on a new connection) ...
        back = eng.register(np.zeros(BLOCK, np.uint8))
        assert eng.transfer([tide.read(back, seg, ids[5])], timeout=60) == BLOCK
        assert bytes(back.obj) == pattern(30 + 5, BLOCK)
        # ... and the canceled READs' replies never reached their destination.
        assert not np.asarray(dst.obj).any()


def test_asyncio_awaits_many_batches(net, engine, target):
    seg = engine.open(target.hello["segment"])
    ids = target.hello["ids"]
    srcs = [engine.register(np.frombuffer(pattern(500 + i, BLOCK), np.uint8).copy()) for i in range(NBLOCKS)]

    async def main():
        batches = [engine.submit([tide.write(srcs[i], seg, ids[i])]) for i in range(NBLOCKS)]
        done = await asyncio.gather(*(b.wait_async(60) for b in batches))
        for b in batches:
            b.free()
        return done

    done = asyncio.run(main())
    assert all(t[0].state == tide.State.COMPLETED for t in done)
    assert target.ask(cmd="digest", seeds=[500 + i for i in range(NBLOCKS)])["found"] == [500 + i for i in
                                                                                           range(NBLOCKS)]
    stats = engine.stats()
    if net.name == "rdma":
        assert stats["nics"][0]["bytes"] >= NBLOCKS * BLOCK
    else:
        assert stats["nics"] == [] and stats["tcp"]["bytes_written"] >= NBLOCKS * BLOCK
        assert stats["tcp"]["port"] == engine.tcp_port > 0


@tcp_only
def test_probe_and_notify(engine, target):
    engine.probe(target.hello["segment"], 2.0)
    with pytest.raises(tide.PeerUnreachable):
        engine.probe("127.0.0.1:1", 2.0)
    seg = engine.open(target.hello["segment"])
    engine.notify(seg, "hello")
    got = target.ask(cmd="notifies")["notifies"]
    assert got == [[engine.segment_name, "hello"]]


@tcp_only
def test_notifications_wait_blocks_until_one_arrives(net, engine):
    with tide.Engine(**net.config(1)) as receiver:
        with pytest.raises(ValueError, match="wait must be >= 0"):
            receiver.notifications(wait=-1)
        t0 = time.monotonic()
        assert receiver.notifications(wait=0.3) == []
        assert time.monotonic() - t0 >= 0.3
        seg = engine.open(receiver.segment_name)
        sender = threading.Timer(0.3, engine.notify, (seg, "late"))  # runs while the wait holds no GIL
        sender.start()
        t0 = time.monotonic()
        got = receiver.notifications(wait=30)
        sender.join()
        assert got == [(engine.segment_name, "late")]
        assert time.monotonic() - t0 < 20  # the arrival ended the wait, not its 30 s


def test_notification_follows_the_data_and_never_a_failure(net, engine, target):
    seg = engine.open(target.hello["segment"])
    ids = target.hello["ids"]
    seeds = [700 + i for i in range(NBLOCKS)]
    target.ask(cmd="zero")
    srcs = [engine.register(np.frombuffer(pattern(s, BLOCK), np.uint8).copy()) for s in seeds]
    batch = engine.submit([tide.write(srcs[i], seg, ids[i]) for i in range(NBLOCKS)], notify="kv ready")
    deadline = time.monotonic() + 30
    seen = target.ask(cmd="notifies_then_digest", seeds=seeds)
    while not seen["notifies"] and time.monotonic() < deadline:
        seen = target.ask(cmd="notifies_then_digest", seeds=seeds)
    assert seen["notifies"] == [[engine.segment_name, "kv ready"]]
    assert seen["found"] == seeds  # every byte was there when the notification was read
    batch.wait(60)
    t = batch.telemetry()
    assert (t["tasks"], t["bytes"], t["transferred_bytes"]) == (NBLOCKS, NBLOCKS * BLOCK, NBLOCKS * BLOCK)
    assert 0 <= t["first_post_s"] <= t["completion_s"] and t["transports"] == [net.name]
    if net.name == "rdma":
        assert t["wrs"] >= NBLOCKS and t["local_nics"] == [net.devices[0]]
    else:
        assert t["local_nics"] == []
    assert batch.telemetry(3)["transports"] == [net.name]
    assert batch.telemetry(3)["bytes"] == BLOCK
    batch.free()

    # Canceled at once: some task ends CANCELED, so the notification is dropped, not sent.
    batch = engine.submit([tide.write(srcs[i % NBLOCKS], seg, ids[i % NBLOCKS]) for i in range(256)],
                          notify="never")
    batch.cancel()
    assert tide.State.CANCELED in {t.state for t in batch.wait(60)}
    batch.free()
    time.sleep(1.0)
    assert target.ask(cmd="notifies")["notifies"] == []
    sent = engine.stats()["notifications_sent"]
    assert (sent["submitted"], sent["sent"], sent["dropped_failed"]) == (2, 1, 1)
    # Several WRITEs in one submit: the message goes after them (a lone WRITE's could ride with it).
    over_rdma = 1 if net.name == "rdma" else 0
    assert (sent["sent_rdma"], sent["sent_tcp"], sent["sent_with_data"]) == (over_rdma, 1 - over_rdma, 0)
    assert (sent["rdma_fallbacks"], sent["dropped_overflow"], sent["dropped_at_stop"], sent["queued"]) == (0, 0, 0, 0)
    with pytest.raises(tide.InvalidArgument):
        engine.submit([tide.write(srcs[0], seg, ids[0])], notify="x" * 5000)  # past notification::kMaxBytes


def test_metrics_text_is_prometheus_and_counts_the_bytes(net, engine, target, tmp_path):
    seg = engine.open(target.hello["segment"])
    src = engine.register(np.zeros(BLOCK, np.uint8))
    for i in range(4):
        assert engine.transfer([tide.write(src, seg, target.hello["ids"][i])]) == BLOCK
    text = engine.metrics()
    if net.name == "rdma":
        moved = [float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("tide_nic_bytes_total{") and 'nic="' + engine.stats()["nics"][0]["name"] in line]
        assert moved == [4 * BLOCK]
    carried = [float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tide_tasks_carried_total{") and f'transport="{net.name}"' in line]
    assert carried == [4]
    promtool = shutil.which("promtool")
    if promtool:
        (tmp_path / "m.txt").write_text(text)
        with open(tmp_path / "m.txt") as f:
            r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("policies", ["cq_event", "busy_poll", "mooncake"])
def test_policy_sets_move_bytes(net, target, policies):
    with tide.Engine(**net.config(), policies=policies) as e:
        seg = e.open(target.hello["segment"])
        src = e.register(np.frombuffer(pattern(9, BLOCK), np.uint8).copy())
        assert e.transfer([tide.write(src, seg, target.hello["ids"][0])], timeout=60) == BLOCK
    assert target.ask(cmd="digest", seeds=[9] * NBLOCKS)["found"][0] == 9


@tcp_only
def test_closed_engine_raises(net):
    e = tide.Engine(**net.config())
    reg = e.register(bytearray(4096))
    e.close()
    e.close()
    assert not reg.registered
    with pytest.raises(tide.EngineClosed):
        e.register(bytearray(4096))
    assert "closed" in repr(e)


def _secret(path):
    import os

    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


@tcp_only
def test_probe_with_the_cluster_secret(net, peer_factory, tmp_path):
    ours, theirs = _secret(tmp_path / "a.key"), _secret(tmp_path / "b.key")
    peer = peer_factory("engine", net.peer_device(), "1", "4096", env={"TIDE_AUTH_SECRET_FILE": theirs})
    with tide.Engine(**net.config(), auth_secret_file=theirs) as same:
        same.probe(peer.hello["segment"], 5.0)
    with tide.Engine(**net.config(), auth_secret_file=ours) as other:
        with pytest.raises(tide.AuthFailed):
            other.probe(peer.hello["segment"], 5.0)
