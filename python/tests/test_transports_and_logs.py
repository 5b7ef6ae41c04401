"""Which transport an engine installs (Mooncake's protocol, MC_FORCE_TCP,
keywords over the environment) and tide's log lines in Python's logging.
No RDMA device needed: everything here runs over TCP on loopback."""
from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tide
from conftest import rdma_devices


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setenv("TIDE_PY_QUIET", "1")


@pytest.fixture
def log_level():
    """Restores tide's threshold after a case that changes it."""
    before = tide.get_log_level()
    yield
    tide.set_log_level(before)


def test_protocol_names_the_transport(quiet, monkeypatch):
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    te = tide.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "no_such_nic0") == 0  # TCP ignores the device
    try:
        stats = te._engine.stats()
        assert stats["nics"] == [] and stats["tcp"]["port"] == te._engine.tcp_port > 0
    finally:
        te.close()
    for protocol, why in (("nvlink", "not supported by tide"), ("", "unknown protocol"), ("RDMA", "unknown protocol")):
        te = tide.TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == -1
        assert why in te.last_error
    # "rdma" installs RDMA alone where the host has RDMA devices: one that does not exist is not
    # replaced by TCP. On a host with none it is TCP, as Mooncake's usual builds do.
    te = tide.TransferEngine()
    if Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir()):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "no_such_nic0") == -1
        assert "device" in te.last_error
    else:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "no_such_nic0") == 0
        assert te._engine.stats()["nics"] == []
        te.close()


def test_mc_force_tcp_wins_over_the_protocol(quiet, monkeypatch):
    # Mooncake's MC_FORCE_TCP (set to anything) installs TCP alone, whatever initialize() names:
    # vLLM passes "rdma" and is run over TCP this way.
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    a, b = tide.TransferEngine(), tide.TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "no_such_nic0") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    try:
        src = np.frombuffer(bytes(range(256)) * 16, np.uint8).copy()
        dst = np.zeros(4096, np.uint8)
        assert a.register_memory(src.ctypes.data, src.nbytes) == 0
        assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
        peer = f"127.0.0.1:{b.get_rpc_port()}"
        assert a.transfer_sync_write(peer, src.ctypes.data, dst.ctypes.data, 4096) == 0
        assert dst.tobytes() == src.tobytes()
        assert a._engine.stats()["tcp"]["bytes_written"] == 4096
    finally:
        a.close()
        b.close()


def test_keywords_win_over_the_environment(monkeypatch):
    # The binding applied TIDE_CONFIG and the environment over tide.Engine's keywords before
    # creating the engine, so TIDE_TRANSPORTS=rdma turned transports="tcp" into an RDMA engine
    # (NoDevice on a host without one).  The program's values win (engine_config's rule).
    monkeypatch.setenv("TIDE_TRANSPORTS", "rdma")
    with tide.Engine(local_server_name="127.0.0.1", transports="tcp") as eng:
        assert eng.tcp_port > 0 and eng.stats()["nics"] == []
    if not rdma_devices():
        # What the keywords do not set still comes from the environment: RDMA alone, and no device.
        with pytest.raises(tide.NoDevice):
            tide.Engine(local_server_name="127.0.0.1")


class _Waiter(logging.Handler):
    """Records the "tide" logger's records; sets `found` when one matches."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle, self.records, self.found = needle, [], threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.needle in record.getMessage():
            self.found.set()


def test_log_lines_reach_logging(log_level):
    logger = logging.getLogger("tide")
    waiter = _Waiter("tcp data port")
    logger.addHandler(waiter)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        tide.set_log_level("info")
        assert tide.get_log_level() == "info"
        with tide.Engine(local_server_name="127.0.0.1", transports="tcp") as eng:
            port = eng.tcp_port
        # Delivered by the drain thread (no flush_logs()): bounded by the event, not a sleep.
        assert waiter.found.wait(60), [r.getMessage() for r in waiter.records]
        line = next(r for r in waiter.records if "tcp data port" in r.getMessage())
        assert line.levelno == logging.INFO and line.name == "tide" and f"tcp data port {port}" in line.getMessage()
        assert line.threadName == "tide-log"
        # flush_logs(): every line logged before it is in logging when it returns.
        tide.set_log_level("debug")
        waiter.records.clear()
        with tide.Engine(local_server_name="127.0.0.1", transports="tcp"):
            pass
        tide.flush_logs()
        assert any("tcp data port" in r.getMessage() for r in waiter.records)
        with pytest.raises(ValueError, match="log level"):
            tide.set_log_level("loud")
        tide.set_log_level(logging.ERROR)
        assert tide.get_log_level() == "error"
    finally:
        logger.removeHandler(waiter)
        logger.setLevel(old)


def test_mooncake_failures_are_logged_not_printed(monkeypatch, caplog, capfd):
    monkeypatch.delenv("TIDE_PY_QUIET", raising=False)
    te = tide.TransferEngine()
    with caplog.at_level(logging.ERROR, logger="tide"):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") == -1
    assert [r.getMessage() for r in caplog.records if r.name == "tide"] == [
        "tide.TransferEngine: initialize: unknown protocol 'carrier-pigeon' (tide's are 'rdma' and 'tcp')"]
    assert capfd.readouterr().err == ""


def test_no_print_in_the_package():
    root = Path(tide.__file__).parent
    calls = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls == []


_CHILD = """
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
import tide
if sys.argv[1] == "stderr":
    tide.forward_logs(False)
tide.set_log_level("info")
eng = tide.Engine(local_server_name="127.0.0.1", transports="tcp")
eng.register(bytearray(4096))
# No close(): the engine is closed at exit, its lines still forwarded, and the sink removed
# before the interpreter is finalized.
"""


@pytest.mark.parametrize("where", ["logging", "stderr"])
def test_logs_at_exit_and_back_to_stderr(where):
    env = {k: v for k, v in os.environ.items() if k not in ("TIDE_LOG_LEVEL", "MC_LOG_LEVEL", "TIDE_PY_LOG")}
    r = subprocess.run([sys.executable, "-c", _CHILD, where], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    if where == "logging":
        assert "tide INFO engine 127.0.0.1:" in r.stdout and "[tide info]" not in r.stderr
    else:
        assert "[tide info] engine 127.0.0.1:" in r.stderr and "tide INFO" not in r.stdout
    # The engine's own threads are gone and nothing crashed at exit: only the lines above.
    assert "Fatal Python error" not in r.stderr and "Traceback" not in r.stderr
