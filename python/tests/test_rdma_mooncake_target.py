"""tide's Python module against the real Mooncake: a `transfer_engine_bench
--mode=target` (P2PHANDSHAKE) built by ../shared/tools/build-mooncake.sh, named
by TIDE_MOONCAKE_BENCH.  The module's engine WRITEs a pattern into the target's
buffer and READs it back, through Mooncake's handshake and descriptor.  Skips
where no Mooncake build is given (CI cannot fetch its sources)."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import tide
from conftest import pattern

BENCH = os.environ.get("TIDE_MOONCAKE_BENCH", "")
pytestmark = pytest.mark.skipif(not (BENCH and Path(BENCH).is_file()),
                                reason="no Mooncake transfer_engine_bench (set TIDE_MOONCAKE_BENCH)")


@pytest.fixture
def mooncake_target(devices, tmp_path):
    log = tmp_path / "target.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([BENCH, "--mode=target", "--metadata_server=P2PHANDSHAKE",
                                 "--local_server_name=127.0.0.1", f"--device_name={devices[1]}", "--protocol=rdma",
                                 "--buffer_size=16777216"], stdout=out, stderr=subprocess.STDOUT)
    segment = None
    deadline = time.monotonic() + 60
    while segment is None and time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"listening on (\S+):(\d+)", log.read_text())
        if m:
            segment = f"127.0.0.1:{m.group(2)}"
        time.sleep(0.2)
    if segment is None:
        proc.kill()
        pytest.fail(f"the Mooncake target printed no RPC port:\n{log.read_text()[-2000:]}")
    time.sleep(1.0)  # it registers its buffer after the listener is up
    yield segment
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_write_then_read_back_through_mooncake(devices, mooncake_target):
    te = tide.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", devices[0]) == 0
    try:
        assert te.send_probe(mooncake_target) == 0
        remote = te.get_first_buffer_address(mooncake_target)
        assert remote != 0
        n = 1 << 20
        src = np.frombuffer(pattern(31337, n), np.uint8).copy()
        dst = np.zeros(n, np.uint8)
        assert te.batch_register_memory([src.ctypes.data, dst.ctypes.data], [n, n]) == 0
        blocks = 16
        step = n // blocks
        assert te.batch_transfer_sync_write(mooncake_target, [src.ctypes.data + i * step for i in range(blocks)],
                                            [remote + i * step for i in range(blocks)], [step] * blocks) == 0
        assert te.transfer_sync_read(mooncake_target, dst.ctypes.data, remote, n) == 0
        assert dst.tobytes() == src.tobytes()
    finally:
        te.close()
