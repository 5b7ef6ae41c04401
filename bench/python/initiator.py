"""The Python side of bench/python-module: Mooncake's API (tide.TransferEngine, or
mooncake.engine's with --module) against a tide-bench target, one JSON line out.

  initiator.py --segment S --device D [--module tide] batch --threads N [--block 64K] [--batch 128] [--duration S]
  initiator.py --segment S --device D [--module tide] latency --op write|read [--size 4K] [--iters N]

batch: each thread pushes batches of --batch blocks with batch_transfer_sync_write
(its own region of the target's buffer); bytes/s and CPU s/GB (this process).
latency: one transfer_sync_write / transfer_sync_read at a time; p50 and p99 in us.
Every call must return 0: a failed one ends the run with an error.

Buffers are page-aligned private anonymous mappings, as tide-bench's are (--alloc numpy: numpy's
own allocation, which starts 16 bytes past a page for large arrays and anywhere for a 4 KiB
one, so every block spans one page more than tide-bench's).
"""
import argparse
import importlib
import json
import mmap
import resource
import sys
import threading
import time

import numpy as np


def size(text):
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    return int(text[:-1] if mult != 1 else text) * mult


def buffer(nbytes, fill, alloc):
    if alloc == "numpy":
        return np.full(nbytes, fill, np.uint8)
    # MAP_PRIVATE as tide-bench's (Python's default for an anonymous mmap is MAP_SHARED).
    arr = np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), np.uint8)  # the array keeps the mapping alive
    arr[:] = fill
    return arr


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--segment", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--module", default="tide")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--alloc", choices=["mmap", "numpy"], default="mmap")
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("batch")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--block", type=size, default=64 << 10)
    b.add_argument("--batch", type=int, default=128)
    b.add_argument("--duration", type=float, default=5.0)
    lat = sub.add_parser("latency")
    lat.add_argument("--op", choices=["write", "read"], default="write")
    lat.add_argument("--size", type=size, default=4 << 10)
    lat.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()

    te = importlib.import_module(a.module).TransferEngine()
    if te.initialize(a.host, "P2PHANDSHAKE", "rdma", a.device) != 0:
        sys.exit("initialize failed")
    remote = te.get_first_buffer_address(a.segment)
    if remote == 0:
        sys.exit(f"no buffer at {a.segment}")

    if a.mode == "latency":
        buf = buffer(a.size, 1, a.alloc)
        # The address once, as the serving stacks keep it: numpy's .ctypes builds an object per
        # access (1.3 us on the host, ten times that in a TCG VM), which is not the call's cost.
        addr = buf.ctypes.data
        assert te.register_memory(addr, buf.nbytes) == 0
        call = te.transfer_sync_write if a.op == "write" else te.transfer_sync_read
        for _ in range(50):  # connect and warm up
            assert call(a.segment, addr, remote, a.size) == 0
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            if call(a.segment, addr, remote, a.size) != 0:
                sys.exit("a transfer failed")
            times.append(time.perf_counter() - t0)
        times.sort()
        print(json.dumps({"p50_us": times[len(times) // 2] * 1e6, "p99_us": times[int(len(times) * 0.99)] * 1e6}))
        return

    region = a.block * a.batch
    bufs = [buffer(region, t + 1, a.alloc) for t in range(a.threads)]
    for buf in bufs:
        assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    done, moved, failed = threading.Event(), [0] * a.threads, []

    def push(t):
        local = [bufs[t].ctypes.data + i * a.block for i in range(a.batch)]
        # Threads share the target's buffer in turn: tide-bench's target has 64 MiB.
        peer = [remote + ((t * region + i * a.block) % (64 << 20)) for i in range(a.batch)]
        lengths = [a.block] * a.batch
        while not done.is_set():
            if te.batch_transfer_sync_write(a.segment, local, peer, lengths) != 0:
                failed.append(t)
                return
            moved[t] += region

    threads = [threading.Thread(target=push, args=(t,)) for t in range(a.threads)]
    # One transfer first: the connection is made outside the measurement, as tide-bench's is.
    assert te.batch_transfer_sync_write(a.segment, [bufs[0].ctypes.data], [remote], [a.block]) == 0
    c0, t0 = cpu_seconds(), time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(a.duration)
    done.set()
    for t in threads:
        t.join()
    secs, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if failed:
        sys.exit(f"threads {failed} saw a failed batch")
    total = sum(moved)
    print(json.dumps({"bytes_per_s": total / secs, "cpu_s_per_gb": cpu / (total / 1e9) if total else 0}))


if __name__ == "__main__":
    main()
