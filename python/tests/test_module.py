"""The module without RDMA devices: import, errors, the Mooncake surface's
sentinels before initialize and with no device, argument checks."""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

import tide
from tide import _tide, errors

pytestmark = pytest.mark.filterwarnings("ignore")


def test_version_matches_the_extension():
    assert tide.__version__ == _tide.__version__


def test_every_errc_has_a_class_and_pickles():
    table = _tide.errc_table()
    names = {name for _, name, _ in table}
    assert {"unregistered_source", "out_of_bounds", "timed_out", "peer_unreachable", "no_device",
            "metadata_malformed"} <= names
    for code, name, _ in table:
        exc = errors.from_native(code, "some detail")
        assert isinstance(exc, tide.Error)
        assert exc.name == name and exc.code == code and exc.detail == "some detail"
        assert {1: errors.LocalError, 2: errors.EndpointError, 3: errors.DeviceError,
                4: errors.MetadataError}[code // 100] in type(exc).__mro__
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and back.detail == exc.detail and str(back) == str(exc)
    assert issubclass(errors.InvalidArgument, ValueError)
    assert issubclass(errors.TransferTimeout, TimeoutError)


def test_opcode_and_notify_names():
    assert int(tide.TransferOpcode.Read) == 0 and int(tide.TransferOpcode.Write) == 1
    assert tide.Read is tide.TransferOpcode.Read and tide.Write is tide.TransferOpcode.Write
    assert tide.TransferEngine.TransferOpcode is tide.TransferOpcode
    n = tide.TransferNotify(name="a", msg="b")
    assert (n.name, n.msg) == ("a", "b")
    from tide.compat.mooncake import TransferEngine
    assert TransferEngine is tide.TransferEngine


def test_calls_before_initialize_return_their_sentinel():
    te = tide.TransferEngine()
    assert te.get_rpc_port() == -1
    assert te.register_memory(4096, 4096) == -1
    assert te.unregister_memory(4096) == -1
    assert te.batch_register_memory([4096], [4096]) == -1
    assert te.transfer_sync_write("127.0.0.1:15000", 4096, 4096, 16) == -1
    assert te.transfer_sync_read("127.0.0.1:15000", 4096, 4096, 16) == -1
    assert te.batch_transfer_sync_write("127.0.0.1:15000", [4096], [4096], [16]) == -1
    assert te.batch_transfer_async_write("127.0.0.1:15000", [4096], [4096], [16]) == 0
    assert te.transfer_submit_write("127.0.0.1:15000", 4096, 4096, 16) == 0
    assert te.get_batch_transfer_status([1]) == -1
    assert te.transfer_check_status(1) == -1
    assert te.allocate_managed_buffer(4096) == 0
    assert te.get_first_buffer_address("127.0.0.1:15000") == 0
    assert te.get_notifies() == []
    assert te.send_probe("127.0.0.1:15000") == -1
    with pytest.raises(Exception, match="initialize"):
        te.read_bytes_from_buffer(4096, 16)


def test_transfers_before_initialize_check_their_lists_first():
    te = tide.TransferEngine()
    # Mooncake's order: the lists are checked before anything else, an empty batch is done at once.
    assert te.batch_transfer_sync_write("127.0.0.1:15000", [4096, 8192], [4096], [16]) == -1
    assert "unequal length (2, 1, 1)" in te.last_error
    assert te.batch_transfer_sync_read("127.0.0.1:15000", [], [], []) == 0
    assert te.batch_transfer_async_read("127.0.0.1:15000", [4096], [], [16]) == 0
    assert "unequal length" in te.last_error
    assert te.batch_transfer_async_write("127.0.0.1:15000", [], [], []) == 0
    assert "no requests" in te.last_error
    assert te.transfer_sync("127.0.0.1:15000", 4096, 4096, 16, tide.Read) == -1
    assert "initialize" in te.last_error
    assert te.transfer_sync("127.0.0.1:15000", 4096, 4096, 16, 7) == -1  # no engine: the sentinel before the opcode
    assert te.batch_transfer_sync("127.0.0.1:15000", [4096], [4096], [16], tide.Write) == -1
    assert te.batch_transfer_async("127.0.0.1:15000", [4096], [4096], [16], tide.Read) == 0
    assert "initialize" in te.last_error


def test_positional_only_and_types():
    te = tide.TransferEngine()
    with pytest.raises(TypeError):
        te.initialize(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE", protocol="rdma", device_name="")
    with pytest.raises(TypeError):
        te.initialize("127.0.0.1", "P2PHANDSHAKE", None, "")


def test_sync_one_needs_an_engine():
    # The engine is checked before any other argument, with one type lookup.
    for not_an_engine in (None, object(), tide.TransferEngine()):
        with pytest.raises(TypeError, match="^sync_one: engine must be a tide._tide.Engine, got "):
            _tide.sync_one(not_an_engine, "h:1", 1, 0, 0, 4096, 5.0, 0.0)
    assert tide.TransferEngine.transfer_sync_write.__qualname__ == "TransferEngine.transfer_sync_write"
    assert "transfer_sync_read" in tide.TransferEngine.transfer_sync_read.__doc__


def test_initialize_without_a_device_says_why(tmp_path):
    te = tide.TransferEngine()
    ib = Path("/sys/class/infiniband")
    if ib.is_dir() and any(ib.iterdir()):  # else "rdma" is TCP, as in Mooncake (test_serving_stacks.py)
        rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "no_such_nic0")
        assert rc == -1
        assert "device" in te.last_error
    assert te.initialize("127.0.0.1", "redis://127.0.0.1:6379", "rdma", "") == -1
    assert "redis" in te.last_error
    assert te.initialize_ext("127.0.0.1", "127.0.0.1:2379", "rdma", "", "p2p") == -1


def test_engine_bad_arguments():
    with pytest.raises(ValueError, match="unknown policy set"):
        tide.Engine(policies="no_such_set")
    with pytest.raises(tide.InvalidArgument, match="unknown key"):
        tide.Engine(no_such_field=1)
    with pytest.raises(tide.InvalidArgument, match="slice_size"):
        tide.Engine(slice_size=0)
    with pytest.raises(ValueError, match="p2p metadata only"):
        tide.Engine(policies="cq_event", metadata="etcd://127.0.0.1:1")
    with pytest.raises(tide.NoDevice):
        tide.Engine(devices=["no_such_nic0"])


def test_policy_sets_are_named():
    sets = {s["name"]: s for s in tide.policy_sets()}
    assert {"default", "busy_poll", "cq_event", "hybrid", "lru", "round_robin", "mooncake"} <= set(sets)
    assert sets["cq_event"]["policies"].split(" / ")[2] == "cq_event"
    assert sets["default"]["metadata"] == ["p2p", "etcd", "http"]


def test_local_topology_is_json():
    assert isinstance(json.loads(tide.TransferEngine().get_local_topology()), dict)


def test_buffer_protocol_checks():
    assert _tide.buffer_address(bytearray(16))[1:] == (16, False)
    assert _tide.buffer_address(b"abcd")[1:] == (4, True)
    with pytest.raises(TypeError):
        _tide.buffer_address(object())
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="contiguous"):
        _tide.buffer_address(np.zeros((4, 4))[:, 1])


def test_stub_names_match_the_extension():
    import ast
    from pathlib import Path

    stub = ast.parse(Path(tide.__file__).with_name("_tide.pyi").read_text())
    top = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    real = {n for n in dir(_tide) if not n.startswith("_")}
    assert top == real
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    stub_methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert stub_methods == {n for n in dir(_tide.Engine) if not n.startswith("_")}


def _doc_params(obj):
    """Parameter names from the signature line pybind11 writes first in a docstring."""
    import re

    first = (obj.__doc__ or "").strip().splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(")")]
    params, depth, cur = [], 0, ""
    for ch in inside + ",":
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    return [re.split(r"[:=]", p.strip())[0].strip() for p in params if p.strip()]


def test_stub_signatures_match_the_docstrings():
    import ast
    from pathlib import Path

    stub = ast.parse(Path(tide.__file__).with_name("_tide.pyi").read_text())
    checked = 0
    for node in stub.body:
        targets = [(node, getattr(_tide, node.name, None))] if isinstance(node, ast.FunctionDef) else []
        if isinstance(node, ast.ClassDef):
            cls = getattr(_tide, node.name)
            targets += [(f, getattr(cls, f.name)) for f in node.body
                        if isinstance(f, ast.FunctionDef) and not f.decorator_list and f.name != "__init__"]
        for fn, real in targets:
            names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            assert _doc_params(real) == names, f"{fn.name}: stub {names} vs {_doc_params(real)}"
            checked += 1
    assert checked >= 25


def test_copy_in_needs_a_c_contiguous_buffer():
    # Review 1ab3d99 #15: a strided view was read as if contiguous, from its first
    # element on (memoryview(b)[::-1] read forward past the end of b).
    dst = bytearray(8)
    addr = _tide.buffer_address(dst)[0]
    with pytest.raises(ValueError, match=r"not C-contiguous \(shape \(8\), strides \(-1\)\)"):
        _tide.copy_in(addr, memoryview(b"abcdefgh")[::-1], 8)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _tide.copy_in(addr, memoryview(b"abcdefghabcdefgh")[::2], 8)
    assert dst == bytearray(8)  # nothing copied
    _tide.copy_in(addr, memoryview(b"abcdefgh")[2:6], 4)
    assert dst == bytearray(b"cdef\0\0\0\0")
    with pytest.raises(ValueError, match="8 bytes asked, the data has 4"):
        _tide.copy_in(addr, b"abcd", 8)


def test_tide_config_names_the_metadata_backend(tmp_path, monkeypatch):
    # Review 1ab3d99 #20: the backend was chosen from the keyword arguments alone, then
    # TIDE_CONFIG set metadata to etcd: a p2p engine holding an etcd connection string.
    cfg = tmp_path / "tide.json"
    cfg.write_text(json.dumps({"metadata": "etcd://127.0.0.1:1"}))
    monkeypatch.setenv("TIDE_CONFIG", str(cfg))
    with pytest.raises(ValueError, match='p2p metadata only, not "etcd://127.0.0.1:1"'):
        tide.Engine(policies="cq_event")  # a set built with p2p metadata only
    with pytest.raises(ValueError, match="p2p metadata only"):
        _tide.Engine("{}", "lru")
    # The keyword still counts where TIDE_CONFIG does not name the backend.
    monkeypatch.delenv("TIDE_CONFIG")
    with pytest.raises(ValueError, match='not "http://127.0.0.1:1/m"'):
        tide.Engine(policies="round_robin", metadata="http://127.0.0.1:1/m")


def test_registered_ranges_are_found_by_bisect():
    from tide._mooncake import _Ranges

    r = _Ranges()
    for base in (0x5000, 0x1000, 0x3000):
        r.add(base, 0x1000)
    assert r.covers(0x1000, 0x1000) and r.covers(0x3800, 0x800) and r.covers(0x5fff, 1)
    assert not r.covers(0x2000, 1) and not r.covers(0xfff, 1) and not r.covers(0x3800, 0x801)
    assert not r.covers(0x6000, 1) and r.covers(0x6000, 0)
    r.remove(0x3000)
    assert not r.covers(0x3000, 1) and r.covers(0x5000, 16)
    r.remove(0x3000)  # twice: nothing


class _FakeNative:
    """What tide.Engine's Python calls of _tide.Engine, without a device: batch ids
    final at once unless listed in `running`."""

    def __init__(self):
        self.closed = False
        self.released, self.running, self.parked, self.watched, self.forgotten = [], set(), set(), {}, []

    def release(self, batch_id):
        self.released.append(batch_id)
        if batch_id in self.running:
            self.parked.add(batch_id)
            return False
        return True

    def orphans(self):
        self.parked -= {b for b in self.parked if b not in self.running}
        return list(self.parked)

    def watch(self, batch_id, queue):
        self.watched[batch_id] = queue

    def unwatch(self, batch_id):
        self.watched.pop(batch_id, None)

    def batch_status(self, batch_id):
        return (2, 0, 0, "", "")

    def task_status(self, batch_id, task):
        return (2, 0, 0, "", "")

    def forget_queue(self, queue):
        self.forgotten.append(queue.fileno())  # not the queue: the engine lets it go
        for b in [b for b, q in self.watched.items() if q is queue]:
            del self.watched[b]


def _fake_engine():
    import threading
    import weakref

    eng = object.__new__(tide.Engine)
    eng._native = _FakeNative()
    eng._lock = threading.Lock()
    eng._closing = False
    eng._registrations, eng._orphans = {}, {}
    eng._batches = weakref.WeakValueDictionary()
    eng._loops = weakref.WeakKeyDictionary()
    return eng


def test_a_batch_dropped_without_free_is_released():
    # The loop `eng.submit(reqs).result()`: every Batch was kept (Engine._batches held it,
    # and it had no finalizer), so allocate failed after max_batches.
    eng = _fake_engine()
    for i in range(1, 101):
        tide.Batch(eng, i, [])  # dropped at once
    assert eng._native.released == list(range(1, 101))
    # One still running when dropped: cancelled and parked by the engine, its refs kept
    # until the engine has freed it.
    eng._native.running.add(500)
    refs = [object()]
    batch = tide.Batch(eng, 500, [])
    batch._refs.extend(refs)
    del batch
    assert eng._orphans == {500: refs}
    eng._reap()
    assert 500 in eng._orphans  # still running
    eng._native.running.clear()
    eng._reap()
    assert eng._orphans == {}
    # free() and ``with`` detach the finalizer: released once, by them.
    b = tide.Batch(eng, 600, [])
    b._forget()
    del b
    assert 600 not in eng._native.released


def test_asyncio_run_per_call_keeps_one_watcher(monkeypatch):
    # Review 1ab3d99 #5: each event loop that awaited a batch kept its watcher, eventfd and
    # the loop itself until Engine.close().
    import asyncio
    import gc
    import os

    from tide import _aio

    monkeypatch.setattr(_aio, "_EXPIRY_TICK", 0.001)  # the stand-in's batches are final at the first tick
    eng = _fake_engine()

    async def one(i):
        await tide.Batch(eng, i, []).wait_async(30)

    def fds():
        return len(os.listdir("/proc/self/fd"))

    asyncio.run(one(1))
    before = fds()
    for i in range(2, 152):
        asyncio.run(one(i))
    gc.collect()
    assert fds() <= before
    assert len(eng._loops) <= 1
    assert len(eng._native.forgotten) >= 149  # the engine was told to stop calling each queue
    assert eng._native.watched == {}
