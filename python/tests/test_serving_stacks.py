"""The serving stacks' calls into ``mooncake.engine.TransferEngine``, replayed
against tide's shim over TCP between two processes on 127.0.0.1.

Each case replays what docs/serving-stacks.md lists for one stack, with the
stack's method names, argument shapes (positional, lists of int addresses,
``"P2PHANDSHAKE"``, ``"host:rpc_port"`` session ids) and its direction of
traffic: the decode side (a second process, this file run as a script)
initializes, registers its KV-like buffers and hands its session id and
addresses over (here a JSON pipe stands in for the stacks' ZMQ/HTTP side
channel); the prefill side (this process) registers its own and WRITEs into the
decode's.  After each phase the decode's whole arena is compared with what the
writes must have made of it, so a byte written wrong, one not written, and one
written where nothing should be all fail the case.

- SGLang: python/sglang/srt/disaggregation/mooncake/conn.py (MooncakeKVManager)
  through its wrapper srt/distributed/device_communicators/mooncake_transfer_engine.py,
  and the embedding path (conn_multimodal.py);
- vLLM: vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
  (MooncakeConnectorWorker).

The module is ``mooncake.engine`` when the drop-in is importable (installed, or
python/compat from TIDE_TEST_COMPAT_DIR, which tools/python-wheel sets), else
``tide``; the decode process imports the same one.  Every case is bounded
(TEST_BOUND_S, and CALL_BOUND_S per answer of the peer and per threaded call).
"""
from __future__ import annotations

import base64
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import pattern  # noqa: E402

HOST = "127.0.0.1"
P2P = "P2PHANDSHAKE"
CALL_BOUND_S = 60  # a peer's answer, a threaded call
TEST_BOUND_S = 240  # a whole case
GUARD = 4096  # bytes between buffers of an arena: a write that strays lands there and is seen
DECODE_SEED, PREFILL_SEED = 7001, 3001

# ---------------------------------------------------------------------------
# Layouts: the KV-like buffers of each stack, carved out of one arena per side
# ---------------------------------------------------------------------------

# SGLang's KVArgs: per-layer K then V buffers (kv_data_ptrs), aux buffers (aux_data_ptrs,
# one item per request slot), one state buffer (state_data_ptrs, e.g. mamba).
SGLANG = {"layers": 4, "pages": 32, "page_size": 4, "item_len": 512, "aux_item_lens": [64, 256], "aux_slots": 8,
          "state_item_len": 1024, "state_slots": 4}
# vLLM: one storage per layer of `blocks` blocks; a block of a layer with R regions holds R
# regions of region_bytes (the non-block-contiguous layout the connector splits per head).
VLLM = {"blocks": 32, "layers": [{"regions": 1, "region_bytes": 1024}, {"regions": 1, "region_bytes": 1024},
                                 {"regions": 2, "region_bytes": 512}, {"regions": 2, "region_bytes": 512}]}


def _layout(stack: str, cfg: dict):
    """[(kind, size)] of the buffers, in registration order."""
    if stack == "sglang":
        kv = [("kv", cfg["pages"] * cfg["item_len"])] * (2 * cfg["layers"])
        aux = [("aux", cfg["aux_slots"] * n) for n in cfg["aux_item_lens"]]
        return kv + aux + [("state", cfg["state_slots"] * cfg["state_item_len"])]
    return [("kv", cfg["blocks"] * layer["regions"] * layer["region_bytes"]) for layer in cfg["layers"]]


class Arena:
    """One numpy arena holding a side's buffers GUARD bytes apart, filled with pattern(seed)."""

    def __init__(self, stack: str, cfg: dict, seed: int) -> None:
        offsets, pos = [], GUARD
        for _, size in _layout(stack, cfg):
            offsets.append(pos)
            pos = (pos + size + GUARD + 4095) // 4096 * 4096
        self.size = pos
        self.mem = np.frombuffer(pattern(seed, pos), np.uint8).copy()
        self.base = self.mem.ctypes.data
        self.ptrs, self.lens = {}, {}
        for (kind, size), off in zip(_layout(stack, cfg), offsets):
            self.ptrs.setdefault(kind, []).append(self.base + off)
            self.lens.setdefault(kind, []).append(size)

    def regions(self, kinds=("kv", "aux", "state")):
        """SGLang's _registerable_regions: (ptr, len) of every buffer, exact duplicates removed."""
        seen, out = set(), []
        for kind in kinds:
            for p, n in zip(self.ptrs.get(kind, []), self.lens.get(kind, [])):
                if (p, n) not in seen:
                    seen.add((p, n))
                    out.append((p, n))
        return out

    def bytes_at(self, addr: int, n: int) -> bytes:
        off = addr - self.base
        assert 0 <= off and off + n <= self.size, "a planned source outside the arena"
        return self.mem[off:off + n].tobytes()


# ---------------------------------------------------------------------------
# The decode side: this file run as a script
# ---------------------------------------------------------------------------

def _out(**kw) -> None:
    print(json.dumps(kw), flush=True)


def _decode_main(argv) -> int:
    stack, module_name, cfg = argv[0], argv[1], json.loads(argv[2])
    mod = importlib.import_module(module_name)
    te = mod.TransferEngine()
    # Both stacks: initialize(local_hostname, "P2PHANDSHAKE", protocol, device_name), positional.
    rc = te.initialize(cfg["host"], P2P, cfg["protocol"], cfg["device"])
    if rc != 0:
        _out(error=f"initialize returned {rc}", why=getattr(te, "last_error", ""))
        return 1
    port = te.get_rpc_port()
    arena = Arena(stack, cfg["layout"], cfg["seed"])
    each = cfg.get("register") == "each"
    # SGLang's PD manager and vLLM's worker register with one batch_register_memory; SGLang's
    # embedding manager with register_memory per aux buffer.
    regions = arena.regions(("aux",)) if each else arena.regions()

    def register():
        if each:
            return [te.register_memory(p, n) for p, n in regions]
        ptrs, lens = zip(*regions)
        return te.batch_register_memory(list(ptrs), list(lens))

    def unregister():
        if each:
            return [te.unregister_memory(p) for p, _ in regions]
        return te.batch_unregister_memory([p for p, _ in regions])

    rc_register = register()
    # The session id both stacks hand to the prefill side: host:get_rpc_port().
    _out(session=f"{cfg['host']}:{port}", host=cfg["host"], port=port, base=arena.base, size=arena.size,
         ptrs=arena.ptrs, lens=arena.lens, rc_register=rc_register, module=mod.TransferEngine.__module__)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            _out(ok=True)
            return 0
        if cmd["cmd"] == "dump":
            _out(data=base64.b64encode(arena.mem.tobytes()).decode())
        elif cmd["cmd"] == "unregister":
            _out(rc=unregister())
        elif cmd["cmd"] == "register":
            _out(rc=register())
        elif cmd["cmd"] == "register_again":  # the first region once more (SGLang dedups for this)
            p, n = regions[0]
            _out(rc=te.batch_register_memory([p], [n]), rc_single=te.register_memory(p, n))
        else:
            _out(error=f"unknown command {cmd['cmd']!r}")
    return 0


class Decode:
    """The decode process; every answer is awaited at most CALL_BOUND_S."""

    def __init__(self, stack: str, module, protocol: str = "tcp", device: str = "", env=None, **extra) -> None:
        cfg = {"host": HOST, "protocol": protocol, "device": device, "seed": DECODE_SEED,
               "layout": extra.pop("layout", SGLANG if stack == "sglang" else VLLM), **extra}
        self.cfg = cfg
        self.stack = stack
        self.proc = subprocess.Popen([sys.executable, __file__, stack, module.name, json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **module.env, **(env or {})})
        self.hello = self.read()
        if "error" in self.hello:
            raise AssertionError(f"decode side: {self.hello}")
        self.session = self.hello["session"]
        self.ptrs = self.hello["ptrs"]
        self.lens = self.hello["lens"]
        # What its arena must hold: its initial fill, then every write that returned 0.
        self.expect = bytearray(pattern(DECODE_SEED, self.hello["size"]))

    def read(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], CALL_BOUND_S)
        if not ready:
            self.kill()
            pytest.fail(f"the decode process did not answer within {CALL_BOUND_S} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the decode process exited ({self.proc.wait()}) before answering")
        return json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def wrote(self, src: Arena, writes) -> None:
        """Record that `writes` ((src, dst, len), as the stack planned them) returned 0."""
        base = self.hello["base"]
        for s, d, n in writes:
            off = d - base
            assert 0 <= off and off + n <= len(self.expect), "a planned destination outside the decode arena"
            self.expect[off:off + n] = src.bytes_at(s, n)

    def check(self) -> None:
        got = base64.b64decode(self.ask(cmd="dump")["data"])
        if got != bytes(self.expect):
            diff = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(bytes(self.expect), np.uint8))
            pytest.fail(f"decode arena: {diff.size} bytes differ from what the writes must leave, first at offset "
                        f"{diff[0]} (base 0x{self.hello['base']:x})")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(cmd="quit")
                self.proc.wait(timeout=CALL_BOUND_S)
            except Exception:  # noqa: BLE001 - a peer that cannot quit is killed
                self.kill()


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------

class Module:
    def __init__(self, name: str, mod, env: dict, why: str = "") -> None:
        self.name, self.mod, self.env, self.why = name, mod, env, why
        self.TransferEngine = mod.TransferEngine


def _drop_in():
    """mooncake.engine as the stacks import it: installed, or python/compat on sys.path (TIDE_TEST_COMPAT_DIR);
    (module, env for the peer, the path added) or (None, why, None)."""
    import tide

    env, added = {}, None
    try:
        mod = importlib.import_module("mooncake.engine")
    except ImportError:
        compat = os.environ.get("TIDE_TEST_COMPAT_DIR", "")
        if not (compat and Path(compat, "mooncake", "engine.py").is_file()):
            return None, "mooncake.engine is not importable (install python/compat, or set TIDE_TEST_COMPAT_DIR)", None
        sys.path.insert(0, compat)
        try:
            mod = importlib.import_module("mooncake.engine")
        except ImportError as e:
            sys.path.remove(compat)
            return None, f"python/compat does not import here: {e}", None
        added = compat
        env["PYTHONPATH"] = os.pathsep.join([compat] + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
    if mod.TransferEngine is not tide.TransferEngine:
        if added:
            sys.path.remove(added)
        return None, "mooncake.engine here is not tide's drop-in (a real Mooncake?): this file tests tide's shim", None
    return mod, env, added


@pytest.fixture(scope="module")
def mc():
    mod, env, added = _drop_in()
    if mod is None:
        import tide

        yield Module("tide", tide, {}, why=env)
        return
    yield Module("mooncake.engine", mod, env)
    if added in sys.path:
        sys.path.remove(added)


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    """Each case ends within TEST_BOUND_S (tide's waits check for signals every 100 ms); a
    transfer's deadline is Mooncake's MC_TRANSFER_TIMEOUT, 10 s here, plus 1 ns per byte."""
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "10")
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)

    def on_alarm(signum, frame):
        raise TimeoutError(f"the case ran past {TEST_BOUND_S} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_BOUND_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def decodes():
    started = []

    def start(*args, **kwargs):
        d = Decode(*args, **kwargs)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


@pytest.fixture
def engines(mc):
    """Prefill-side engines, closed at the end (tide's close; the stacks let theirs die with the process)."""
    made = []

    def make(protocol="tcp", device=""):
        te = mc.TransferEngine()
        assert te.initialize(HOST, P2P, protocol, device) == 0, getattr(te, "last_error", "")
        made.append(te)
        return te

    yield make
    for te in made:
        if hasattr(te, "close"):
            te.close()


def threaded(fn, args_list, workers):
    """fn(*args) for each args on a pool of `workers` threads (the stacks' sender pools); the results in order."""
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(fn, *args) for args in args_list]
        return [f.result(timeout=CALL_BOUND_S) for f in futures]
    finally:
        pool.shutdown(wait=False)


# ---------------------------------------------------------------------------
# The stacks' transfer plans (paraphrased from the code docs/serving-stacks.md cites)
# ---------------------------------------------------------------------------

def contiguous_groups(src_ids, dst_ids):
    """Both stacks' group_concurrent_contiguous: runs where source and destination ids both step by 1."""
    groups, start = [], 0
    for i in range(1, len(src_ids) + 1):
        if i == len(src_ids) or src_ids[i] != src_ids[i - 1] + 1 or dst_ids[i] != dst_ids[i - 1] + 1:
            groups.append((src_ids[start:i], dst_ids[start:i]))
            start = i
    return groups


def sglang_kv_blocks(src_ptrs, dst_ptrs, item_len, layers, src_pages, dst_pages):
    """MooncakeKVManager._send_kvcache_generic (MHA, same TP): for each buffer (K of every
    layer, then V), one (src, dst, length) per contiguous page run; one list per buffer."""
    per_buffer = []
    for b in range(2 * layers):  # K of every layer, then V of every layer
        per_buffer.append([(src_ptrs[b] + s[0] * item_len, dst_ptrs[b] + d[0] * item_len, item_len * len(s))
                           for s, d in contiguous_groups(src_pages, dst_pages)])
    return per_buffer


def sglang_slot_blocks(src_ptrs, dst_ptrs, item_lens, src_index, dst_index):
    """send_aux / _send_mamba_state: one item of each buffer, slot src_index to slot dst_index."""
    return [(s + n * src_index, d + n * dst_index, n) for s, d, n in zip(src_ptrs, dst_ptrs, item_lens)]


def as_lists(blocks):
    """MooncakeKVManager._transfer_data: zip(*blocks) into three lists."""
    src, dst, lens = zip(*blocks)
    return list(src), list(dst), list(lens)


# ---------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------

class SglangSide:
    """SGLang's shared MooncakeTransferEngine wrapper on the prefill side, as its calls reach the engine."""

    def __init__(self, te, layout=SGLANG, seed=PREFILL_SEED) -> None:
        self.te = te
        self.session = f"{HOST}:{te.get_rpc_port()}"  # MooncakeTransferEngine.session_id
        self.arena = Arena("sglang", layout, seed)
        self.regions = self.arena.regions()

    def batch_register(self):  # register_buffer_to_engine
        ptrs, lens = zip(*self.regions)
        return self.te.batch_register_memory(list(ptrs), list(lens))

    def batch_deregister(self):  # deregister_buffer_to_engine (teardown)
        return self.te.batch_unregister_memory([p for p, _ in self.regions])

    def transfer(self, session, blocks):  # _transfer_data -> batch_transfer_sync -> batch_transfer_sync_write
        src, dst, lens = as_lists(blocks)
        return self.te.batch_transfer_sync_write(session, src, dst, lens)


@pytest.mark.parametrize("tcp_form", ["protocol tcp", "MC_FORCE_TCP=1"])
def test_sglang_pd_prefill_pushes_kv_aux_and_state(mc, engines, decodes, monkeypatch, tcp_form):
    # The wrapper's initialize: MOONCAKE_PROTOCOL=tcp passes "tcp"; older wrappers pass "rdma"
    # and TCP comes from MC_FORCE_TCP=1 (the newer one then passes device "").
    if tcp_form == "MC_FORCE_TCP=1":
        monkeypatch.setenv("MC_FORCE_TCP", "1")
        protocol, env = "rdma", {"MC_FORCE_TCP": "1"}
    else:
        protocol, env = "tcp", {}
    decode = decodes("sglang", mc, protocol=protocol, env=env)
    assert decode.hello["rc_register"] == 0
    assert decode.hello["module"] == "tide._mooncake"
    p = SglangSide(engines(protocol))
    assert p.session != decode.session and p.te.get_rpc_port() > 0
    assert p.batch_register() == 0

    L, item = SGLANG["layers"], SGLANG["item_len"]
    dst_kv, dst_aux, dst_state = decode.ptrs["kv"], decode.ptrs["aux"], decode.ptrs["state"]
    # Two rooms: each chunk's pages (prefill -> decode), with contiguous runs and breaks.
    rooms = [([3, 4, 5, 9, 10], [20, 21, 22, 7, 8]), ([0, 1, 2, 3, 30], [12, 13, 14, 15, 31])]
    # Room 0: the default path, every layer's K and V in one batch (process_layers).
    room0 = [b for per in sglang_kv_blocks(p.arena.ptrs["kv"], dst_kv, item, L, *rooms[0]) for b in per]
    # Room 1: the per-layer path (a custom memory pool): one call per buffer, on the executor.
    room1 = sglang_kv_blocks(p.arena.ptrs["kv"], dst_kv, item, L, *rooms[1])
    # Last chunk: aux (slot 2 -> 5) and state (slot 1 -> 3), each one batch.
    aux = sglang_slot_blocks(p.arena.ptrs["aux"], dst_aux, SGLANG["aux_item_lens"], 2, 5)
    state = sglang_slot_blocks(p.arena.ptrs["state"], dst_state, [SGLANG["state_item_len"]], 1, 3)
    # The transfer workers run rooms concurrently (transfer queues x executors).
    calls = [(decode.session, room0)] + [(decode.session, per) for per in room1] + [(decode.session, aux),
                                                                                    (decode.session, state)]
    assert threaded(p.transfer, calls, workers=4) == [0] * len(calls)
    for _, blocks in calls:
        decode.wrote(p.arena, blocks)
    decode.check()
    # get_engine (HiCache's Mooncake store reuses the engine through it): Mooncake's C++ engine, which tide has not.
    assert p.te.get_engine() is None


def test_sglang_prefill_tp2_to_decode_tp1_head_slices(mc, engines, decodes):
    # send_kvcache_slice: prefill attn TP 2, decode attn TP 1, 4 KV heads, page size 4. Each prefill
    # rank holds 2 heads (256 B pages), the decode 4 (512 B pages); rank r writes its 64 B of each
    # token into bytes [64r, 64r+64) of the decode's 128 B token slot: one entry per token.
    decode = decodes("sglang", mc)
    assert decode.hello["rc_register"] == 0
    page, heads, dst_item = SGLANG["page_size"], 4, SGLANG["item_len"]
    src_item = dst_item // 2
    bytes_per_head = dst_item // page // heads
    send = 2 * bytes_per_head
    ranks = [SglangSide(engines(), layout={**SGLANG, "item_len": src_item}, seed=PREFILL_SEED + r) for r in (0, 1)]
    for side in ranks:
        assert side.batch_register() == 0
    src_pages, dst_pages = [1, 2, 3, 8], [4, 5, 6, 0]

    def layer_entries(rank, b):
        src, dst = rank.arena.ptrs["kv"][b], decode.ptrs["kv"][b]
        r = ranks.index(rank)
        return [(src + sp * src_item + t * (src_item // page), dst + dp * dst_item + t * (dst_item // page) + r * send,
                 send) for sp, dp in zip(src_pages, dst_pages) for t in range(page)]

    # process_layer_tp_aware: one batch_transfer_sync per layer buffer, on the executor; both ranks at once.
    calls = [(rank, decode.session, layer_entries(rank, b)) for rank in ranks for b in range(2 * SGLANG["layers"])]
    assert threaded(lambda rank, s, blocks: rank.transfer(s, blocks), calls, workers=8) == [0] * len(calls)
    for rank, _, blocks in calls:
        decode.wrote(rank.arena, blocks)
    decode.check()


def test_sglang_failure_paths(mc, engines, decodes):
    decode = decodes("sglang", mc)
    p = SglangSide(engines())
    assert p.batch_register() == 0
    dst = decode.ptrs["kv"]
    good = [(p.arena.ptrs["kv"][0], dst[0], 4096)]
    assert p.transfer(decode.session, good) == 0
    decode.wrote(p.arena, good)

    # A write the decode refuses (an address it never registered): -1, nothing written. SGLang
    # blacklists the session; its probe loop finds the peer alive (0) and clears it; the next
    # write to the same session works.
    assert p.transfer(decode.session, [(p.arena.ptrs["kv"][1], 4096, 512)]) == -1
    assert p.transfer(decode.session, [(p.arena.ptrs["kv"][1], dst[1] + decode.lens["kv"][1] - 256, 512)]) == -1
    assert p.te.send_probe(decode.session) == 0
    again = [(p.arena.ptrs["kv"][1], dst[1], 2048)]
    assert p.transfer(decode.session, again) == 0
    decode.wrote(p.arena, again)
    # A source it did not register, and lists of unequal length: -1 (the stack's "< 0").
    loose = np.zeros(4096, np.uint8)
    assert p.te.batch_transfer_sync_write(decode.session, [loose.ctypes.data], [dst[2]], [4096]) == -1
    assert p.te.batch_transfer_sync_write(decode.session, [p.arena.ptrs["kv"][2]] * 2, [dst[2]], [64, 64]) == -1
    # The same region registered twice: refused (SGLang dedups its regions for this reason).
    kv0, len0 = p.regions[0]
    assert p.te.batch_register_memory([kv0], [len0]) != 0
    assert p.te.register_memory(kv0, len0) != 0
    decode.check()
    again_decode = decode.ask(cmd="register_again")
    assert again_decode["rc"] != 0 and again_decode["rc_single"] != 0

    # The decode dies: the write returns -1 in bounded time and the probe fails (the session stays
    # blacklisted); a session nobody serves fails the same way.
    decode.kill()
    t0 = time.monotonic()
    assert p.transfer(decode.session, good) == -1
    assert p.te.send_probe(decode.session) != 0
    assert p.transfer(f"{HOST}:1", good) == -1
    assert p.te.send_probe(f"{HOST}:1") != 0
    assert time.monotonic() - t0 < 30
    # The same engine serves the next decode.
    other = decodes("sglang", mc)
    assert p.te.send_probe(other.session) == 0
    assert p.transfer(other.session, [(p.arena.ptrs["kv"][3], other.ptrs["kv"][3], 8192)]) == 0
    other.wrote(p.arena, [(p.arena.ptrs["kv"][3], other.ptrs["kv"][3], 8192)])
    other.check()


def test_sglang_teardown_and_reregister(mc, engines, decodes):
    # MooncakeKVManager.teardown (a P<->D role switch) calls batch_unregister_memory; a manager
    # created afterwards registers the same pool again.
    decode = decodes("sglang", mc)
    p = SglangSide(engines())
    assert p.batch_register() == 0
    w = [(p.arena.ptrs["kv"][4], decode.ptrs["kv"][4], 4096)]
    assert p.transfer(decode.session, w) == 0
    decode.wrote(p.arena, w)

    assert decode.ask(cmd="unregister")["rc"] == 0
    w2 = [(p.arena.ptrs["kv"][5], decode.ptrs["kv"][5], 4096)]
    assert p.transfer(decode.session, w2) == -1  # its memory is no longer the engine's to write
    decode.check()
    assert decode.ask(cmd="register")["rc"] == 0
    assert p.transfer(decode.session, w2) == 0
    decode.wrote(p.arena, w2)

    assert p.batch_deregister() == 0
    w3 = [(p.arena.ptrs["aux"][0], decode.ptrs["aux"][0], 64)]
    assert p.transfer(decode.session, w3) == -1  # a source no longer registered
    assert p.batch_register() == 0
    assert p.transfer(decode.session, w3) == 0
    decode.wrote(p.arena, w3)
    decode.check()


def test_sglang_embedding_register_memory_and_transfer_sync_write(mc, engines, decodes):
    # MooncakeEmbeddingManager (conn_multimodal.py): register_memory per aux buffer on both sides,
    # then send_embedding: transfer_sync_write per buffer, chunk by chunk (offset, size).
    decode = decodes("sglang", mc, register="each")
    assert decode.hello["rc_register"] == [0, 0]
    p = SglangSide(engines())
    aux, lens = p.arena.ptrs["aux"], SGLANG["aux_item_lens"]
    assert [p.te.register_memory(a, n * SGLANG["aux_slots"]) for a, n in zip(aux, lens)] == [0, 0]
    dst = decode.ptrs["aux"]
    writes = []
    for chunk in ((0, 16), (16, 48)):  # two chunks of embedding slot 1 -> slot 6
        for i, n in enumerate(lens):
            off, size = chunk[0] * n // 64, chunk[1] * n // 64
            s, d = aux[i] + 1 * n + off, dst[i] + 6 * n + off
            assert p.te.transfer_sync_write(decode.session, s, d, size) == 0
            writes.append((s, d, size))
    decode.wrote(p.arena, writes)
    decode.check()
    # A KV buffer was never registered by this manager: -1, nothing written.
    assert p.te.transfer_sync_write(decode.session, p.arena.ptrs["kv"][0], dst[0], 64) == -1
    # deregister: unregister_memory; a second time, and a transfer from it, fail.
    assert p.te.unregister_memory(aux[0]) == 0
    assert p.te.unregister_memory(aux[0]) != 0
    assert p.te.transfer_sync_write(decode.session, aux[0], dst[0], 64) == -1
    assert decode.ask(cmd="unregister")["rc"] == [0, 0]
    assert p.te.transfer_sync_write(decode.session, aux[1], dst[1], 64) == -1
    decode.check()


# ---------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------

class VllmWorker:
    """MooncakeConnectorWorker on the prefill (kv_producer) side: its registration and _send_blocks."""

    def __init__(self, te, layout=VLLM, seed=PREFILL_SEED) -> None:
        self.te = te
        self.rpc_port = te.get_rpc_port()
        self.arena = Arena("vllm", layout, seed)
        self.regions = []  # (base_addr, block_len, kv_block_len) per registered region
        for storage, layer in zip(self.arena.ptrs["kv"], layout["layers"]):
            for r in range(layer["regions"]):
                self.regions.append((storage + r * layer["region_bytes"], layer["regions"] * layer["region_bytes"],
                                     layer["region_bytes"]))

    def register_kv_caches(self):
        # One storage per layer (deduplicated by data_ptr), its nbytes.
        return self.te.batch_register_memory(list(self.arena.ptrs["kv"]), list(self.arena.lens["kv"]))

    def send_blocks(self, remote_session, src_ptrs, dst_ptrs, lengths):
        return self.te.batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs, lengths)


def vllm_regions(decode: Decode, layout=VLLM):
    """The decode's MooncakeXferMetadata: kv_caches_base_addr, block_lens, kv_block_lens per region."""
    out = []
    for storage, layer in zip(decode.ptrs["kv"], layout["layers"]):
        for r in range(layer["regions"]):
            out.append((storage + r * layer["region_bytes"], layer["regions"] * layer["region_bytes"],
                        layer["region_bytes"]))
    return out


def vllm_plan(local_regions, remote_regions, local_ids, remote_ids, src_offset=0, dst_offset=0, transfer_len=None):
    """_build_transfer_params: a partial prefix hit reads only the last len(remote_ids) local blocks;
    a contiguous run becomes one descriptor when offsets are 0 and the copy is a whole block on both sides."""
    local_ids = local_ids[-len(remote_ids):]
    src, dst, lens = [], [], []
    for (lb, lblock, lkv), (rb, rblock, rkv) in zip(local_regions, remote_regions):
        n = lkv if transfer_len is None else transfer_len
        coalesce = src_offset == 0 and dst_offset == 0 and n == lblock and n == rblock
        for ls, rs in contiguous_groups(local_ids, remote_ids):
            if coalesce:
                src.append(lb + ls[0] * lblock)
                dst.append(rb + rs[0] * rblock)
                lens.append(n * len(ls))
            else:
                for li, ri in zip(ls, rs):
                    src.append(lb + li * lblock + src_offset)
                    dst.append(rb + ri * rblock + dst_offset)
                    lens.append(n)
    return src, dst, lens


def test_vllm_producer_pushes_blocks_from_ten_sender_threads(mc, engines, decodes):
    decode = decodes("vllm", mc)  # the kv_consumer: initialize, get_rpc_port, batch_register_memory
    assert decode.hello["rc_register"] == 0
    remote_session = f"{decode.hello['host']}:{decode.hello['port']}"  # from remote_hostname, remote_port
    w = VllmWorker(engines())
    assert w.register_kv_caches() == 0
    remote = vllm_regions(decode)
    # Requests (local P blocks, remote D blocks); the last is a partial prefix hit on D.
    reqs = [([0, 1, 2, 3], [4, 5, 6, 7]), ([8, 9, 12], [16, 17, 18]), ([20, 21], [2, 3]), ([13], [30]),
            ([24, 25, 26, 27, 28], [9, 10, 14])]
    plans = [vllm_plan(w.regions, remote, lo, ro) for lo, ro in reqs]
    assert any(len(set(lens)) > 1 for _, _, lens in plans), "no coalesced descriptor in the plans"
    # The sender executor: 10 workers; the first calls race to open the session.
    calls = [(remote_session, *plan) for plan in plans] * 2
    assert threaded(w.send_blocks, calls, workers=10) == [0] * len(calls)
    for src, dst, lens in plans:
        decode.wrote(w.arena, zip(src, dst, lens))
    decode.check()


def test_vllm_producer_tp2_to_consumer_tp1(mc, engines, decodes):
    # _compute_sender_transfer_plan with tp_ratio 2: each P rank writes its kv_block_len at offset
    # (rank % 2) * kv_block_len of the D block (twice as long), one descriptor per block.
    layout_p = {"blocks": 32, "layers": [{"regions": 1, "region_bytes": 512}] * 3}
    layout_d = {"blocks": 32, "layers": [{"regions": 1, "region_bytes": 1024}] * 3}
    decode = decodes("vllm", mc, layout=layout_d)
    assert decode.hello["rc_register"] == 0
    session = f"{decode.hello['host']}:{decode.hello['port']}"
    ranks = [VllmWorker(engines(), layout=layout_p, seed=PREFILL_SEED + r) for r in (0, 1)]
    for w in ranks:
        assert w.register_kv_caches() == 0
    remote = vllm_regions(decode, layout_d)
    plans = [(w, vllm_plan(w.regions, remote, [3, 4, 5, 6], [10, 11, 12, 20], dst_offset=r * 512, transfer_len=512))
             for r, w in enumerate(ranks)]
    assert all(set(lens) == {512} for _, (_, _, lens) in plans)
    results = threaded(lambda w, plan: w.send_blocks(session, *plan), plans, workers=10)
    assert results == [0, 0]
    for w, (src, dst, lens) in plans:
        decode.wrote(w.arena, zip(src, dst, lens))
    decode.check()


def test_vllm_failed_send_returns_nonzero(mc, engines, decodes):
    # _send_blocks: ret_value != 0 fails every ready request (the D side then marks its blocks invalid).
    decode = decodes("vllm", mc)
    session = f"{decode.hello['host']}:{decode.hello['port']}"
    w = VllmWorker(engines())
    assert w.register_kv_caches() == 0
    remote = vllm_regions(decode)
    src, dst, lens = vllm_plan(w.regions, remote, [0, 1], [0, 1])
    assert w.send_blocks(session, src, [16] * len(dst), lens) != 0  # D never registered these
    loose = np.zeros(4096, np.uint8)
    assert w.send_blocks(session, [loose.ctypes.data], dst[:1], [1024]) != 0
    decode.check()  # nothing written
    assert w.send_blocks(session, src, dst, lens) == 0
    decode.wrote(w.arena, zip(src, dst, lens))
    decode.check()
    decode.kill()
    t0 = time.monotonic()
    assert w.send_blocks(session, src, dst, lens) != 0
    assert time.monotonic() - t0 < 30
    other = decodes("vllm", mc)
    o_session = f"{other.hello['host']}:{other.hello['port']}"
    src, dst, lens = vllm_plan(w.regions, vllm_regions(other), [5], [6])
    assert w.send_blocks(o_session, src, dst, lens) == 0
    other.wrote(w.arena, zip(src, dst, lens))
    other.check()


# ---------------------------------------------------------------------------
# Both: the default protocol on a host without RDMA
# ---------------------------------------------------------------------------

def _host_rdma_devices():
    from tide._mooncake import _host_rdma_devices as devices  # what initialize's fallback looks at

    return devices()


def _fallback_warnings(caplog):
    return [r for r in caplog.records if r.name == "tide" and r.levelname == "WARNING"
            and "without RDMA devices" in r.getMessage()]


@pytest.mark.skipif(bool(_host_rdma_devices()), reason="this host has RDMA devices: 'rdma' installs RDMA")
def test_default_rdma_protocol_on_a_host_without_rdma(mc, engines, decodes, caplog):
    # Both stacks default to protocol "rdma" (vLLM's mooncake_protocol, SGLang's MOONCAKE_PROTOCOL /
    # its older wrappers). Mooncake's usual builds pick TCP when no HCA is found, and so does tide,
    # with one warning that says how to silence it: the stack runs unchanged, its writes land.
    decode = decodes("sglang", mc, protocol="rdma")
    assert decode.hello["rc_register"] == 0
    with caplog.at_level("WARNING", logger="tide"):
        p = SglangSide(engines("rdma"))
    warned = _fallback_warnings(caplog)
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "TCP" in warned[0].getMessage() and "protocol 'tcp'" in warned[0].getMessage()
    assert "MC_FORCE_TCP" in warned[0].getMessage()
    assert p.te._engine.stats()["nics"] == []  # no RDMA transport behind it
    assert p.batch_register() == 0
    w = [(p.arena.ptrs["kv"][0], decode.ptrs["kv"][0], 8192), (p.arena.ptrs["aux"][1], decode.ptrs["aux"][1], 256)]
    assert p.transfer(decode.session, w) == 0
    decode.wrote(p.arena, w)
    decode.check()
    # A device list naming a device is a typo only where devices exist: here it is TCP too.
    caplog.clear()
    with caplog.at_level("WARNING", logger="tide"):
        te = engines("rdma", "mlx5_0")
    assert len(_fallback_warnings(caplog)) == 1
    # Saying TCP (protocol "tcp", or MC_FORCE_TCP) is the same engine without the warning.
    caplog.clear()
    with caplog.at_level("WARNING", logger="tide"):
        engines("tcp")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MC_FORCE_TCP", "1")
            engines("rdma")
    assert _fallback_warnings(caplog) == []
    assert te.get_rpc_port() > 0


@pytest.mark.skipif(not _host_rdma_devices(), reason="needs RDMA devices (the rxe VM)")
def test_rdma_protocol_with_a_device_the_host_lacks_is_an_error(mc, devices, caplog):
    # Where the host has RDMA devices, "rdma" stays RDMA: a device_name that names none of them is
    # a typo, -1 with a reason that names what the host has, and no fallback to TCP.
    te = mc.TransferEngine()
    with caplog.at_level("WARNING", logger="tide"):
        assert te.initialize(HOST, P2P, "rdma", "no_such_nic0") == -1
    assert "no_such_nic0" in te.last_error
    assert all(d in te.last_error for d in _host_rdma_devices()), te.last_error
    assert _fallback_warnings(caplog) == []
    ok = mc.TransferEngine()
    assert ok.initialize(HOST, P2P, "rdma", devices[0]) == 0, ok.last_error
    try:
        assert {n["name"] for n in ok._engine.stats()["nics"]} == {devices[0]}
    finally:
        ok.close()


def test_import_line_of_the_stacks(mc):
    # Both stacks: `from mooncake.engine import TransferEngine` (nothing else from the module).
    if mc.name != "mooncake.engine":
        pytest.skip(mc.why)
    import tide

    from mooncake.engine import TransferEngine

    assert TransferEngine is tide.TransferEngine


if __name__ == "__main__":
    sys.exit(_decode_main(sys.argv[1:]))
