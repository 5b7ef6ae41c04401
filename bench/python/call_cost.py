"""What a synchronous call costs in Python alone, on this host (no RDMA device needed).

  build/py-venv/bin/python bench/python/call_cost.py [--iters N]   (tools/python-wheel build first)

tide.TransferEngine.transfer_sync_write / transfer_sync_read of 4 KiB, with the native call
(_tide.sync_one) replaced by a Python function that reports a COMPLETED transfer at once: what is
left is the module's Python work per call (the engine check, the call, the outcome); a Python
call costs more than the C call it stands for, so this is an upper bound. The cost of one
pybind11 call is printed beside it. The end-to-end latency over RDMA is bench/python-module's
row; this isolates the part Python adds to it.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

try:  # the installed module (tools/python-wheel's venv) ...
    import tide
except ImportError:  # ... else a meson build's, in the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tide
from tide import _tide  # noqa: E402


def completed_one(engine, target_hostname, opcode, buffer, peer_address, length, base_timeout, per_byte):
    """Answers as _tide.sync_one does for a transfer that completed."""
    return None


def per_call_us(fn, iters):
    best = float("inf")
    for _ in range(5):  # the best of 5 rounds: the machine's other load only adds
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=100000)
    a = ap.parse_args()
    from tide import _mooncake

    _mooncake._SYNC_ONE = completed_one
    te = tide.TransferEngine()
    te._engine = object()  # initialized, as far as the Python side checks
    out = {}
    for name in ("transfer_sync_write", "transfer_sync_read"):
        call = getattr(te, name)
        out[name + "_us"] = round(per_call_us(lambda: call("127.0.0.1:15000", 0x1000, 0x2000, 4096), a.iters), 2)
    buf = np.zeros(4096, np.uint8)
    out["one_pybind11_call_us"] = round(per_call_us(lambda: _tide.buffer_address(buf), a.iters), 2)
    te._engine = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
