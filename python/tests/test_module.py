"""The module without RDMA devices: import, errors, the Mooncake surface's
sentinels before initialize and with no device, argument checks."""
from __future__ import annotations

import json
import pickle
import sys

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
    with pytest.raises(NotImplementedError, match="GPU"):
        te.transfer_write_on_cuda("x", 0, 0, 0)


def test_sync_one_needs_an_engine():
    # The engine is checked before any other argument, with one type lookup.
    for not_an_engine in (None, object(), tide.TransferEngine()):
        with pytest.raises(TypeError, match="^sync_one: engine must be a tide._tide.Engine, got "):
            _tide.sync_one(not_an_engine, "h:1", 1, 0, 0, 4096, 5.0, 0.0)
    assert tide.TransferEngine.transfer_sync_write.__qualname__ == "TransferEngine.transfer_sync_write"
    assert "transfer_sync_read" in tide.TransferEngine.transfer_sync_read.__doc__


def test_initialize_without_a_device_says_why(tmp_path):
    te = tide.TransferEngine()
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
