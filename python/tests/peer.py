"""The other side of the RDMA tests, in its own process.

  peer.py mooncake DEVICE MODULE NBLOCKS BLOCK   a TransferEngine target (MODULE: tide or mooncake.engine)
  peer.py engine DEVICE NBLOCKS BLOCK            a tide.Engine target

DEVICE is an RDMA device, or "tcp": the engine then runs over TCP alone.

It registers NBLOCKS numpy blocks of BLOCK bytes, prints {"segment", "blocks"}
(one JSON line), then answers commands on stdin: fill (a pattern into every
block), digest (which blocks hold which pattern), notifies, notifies_then_digest,
push (TransferEngine mode: WRITE a pattern from block 0 to another segment with a
notification, as a prefill node does), reregister (TransferEngine mode: unregister
and register every block again), quit.
"""
import importlib
import json
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import pattern  # noqa: E402


def out(**kw):
    print(json.dumps(kw), flush=True)


def main():
    mode, device = sys.argv[1], sys.argv[2]
    if mode == "mooncake":
        module, nblocks, block = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        mod = importlib.import_module(module)
        te = mod.TransferEngine()
        protocol, device_name = ("tcp", "") if device == "tcp" else ("rdma", device)
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, device_name) != 0:
            out(error="initialize failed")
            return 1
        arena = np.zeros(nblocks * block, dtype=np.uint8)
        addrs = [arena.ctypes.data + i * block for i in range(nblocks)]
        if te.batch_register_memory(addrs, [block] * nblocks) != 0:
            out(error="batch_register_memory failed")
            return 1
        out(segment=f"127.0.0.1:{te.get_rpc_port()}", blocks=addrs)
        notifies = lambda: [[n.name, n.msg] for n in te.get_notifies()]  # noqa: E731

        def reregister(cmd):
            # What a node that rebuilds its KV pool does: WRITEs in flight to the old
            # registration fail (remote access error), later ones find the new one.
            return (te.batch_unregister_memory(addrs), te.batch_register_memory(addrs, [block] * nblocks))

        def push(cmd):
            arena[:block] = np.frombuffer(pattern(cmd["seed"], block), np.uint8)
            note = mod.TransferNotify(cmd["name"], cmd["msg"])
            return te.transfer_sync(cmd["segment"], addrs[0], cmd["remote"], block,
                                    mod.TransferEngine.TransferOpcode.Write, note)
    else:
        import tide

        nblocks, block = int(sys.argv[3]), int(sys.argv[4])
        net = {"transports": "tcp"} if device == "tcp" else {"transports": "rdma", "devices": [device]}
        eng = tide.Engine(local_server_name="127.0.0.1", **net)
        arena = np.zeros(nblocks * block, dtype=np.uint8)
        regs = [eng.register(arena[i * block:(i + 1) * block]) for i in range(nblocks)]
        out(segment=eng.segment_name, blocks=[r.address for r in regs], ids=[r.buffer_id for r in regs])
        notifies = lambda: [list(n) for n in eng.notifications()]  # noqa: E731
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            out(ok=True)
            return 0
        if cmd["cmd"] == "fill":
            for i in range(nblocks):
                arena[i * block:(i + 1) * block] = np.frombuffer(pattern(cmd["seed"] + i, block), np.uint8)
            out(ok=True)
        elif cmd["cmd"] == "digest":
            # For each block, the seed whose pattern it holds (or None): the initiator names the seeds it wrote.
            seeds = cmd["seeds"]
            found = []
            for i in range(nblocks):
                got = arena[i * block:(i + 1) * block].tobytes()
                found.append(seeds[i] if got == pattern(seeds[i], block) else None)
            out(found=found)
        elif cmd["cmd"] == "zero":
            arena[:] = 0
            out(ok=True)
        elif cmd["cmd"] == "push":
            out(rc=push(cmd))
        elif cmd["cmd"] == "reregister":
            out(rc=list(reregister(cmd)))
        elif cmd["cmd"] == "notifies":
            out(notifies=notifies())
        elif cmd["cmd"] == "notifies_then_digest":
            # What a receiver of a transfer-bound notification does: read it, then trust the bytes.
            got = notifies()
            seeds = cmd["seeds"]
            found = [seeds[i] if arena[i * block:(i + 1) * block].tobytes() == pattern(seeds[i], block) else None
                     for i in range(nblocks)]
            out(notifies=got, found=found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
