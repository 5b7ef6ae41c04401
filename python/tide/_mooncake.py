"""``tide.TransferEngine``: call-compatible with ``mooncake.engine.TransferEngine``.

Same method names, positional and keyword arguments, return values and
failure sentinels (0 / -1; batch id 0 on failure), so that a program written
for Mooncake runs after ``from tide import TransferEngine``.  Where Mooncake
crashes or misbehaves, tide answers instead (each case is in docs/python.md):

- every call before ``initialize`` returns the sentinel (or raises ValueError
  where the method has none) instead of dereferencing null;
- the GIL is released for every transfer, registration and wait; a sync call
  sleeps on the completion (tide's spin-then-sleep) instead of spinning;
- a transfer that times out is canceled and drained before the call returns:
  no DMA reaches a buffer the caller reuses, and no batch leaks;
- batch ids are tide's handles (never reused); a stale, repeated or zero id
  gets -1, never a use-after-free;
- bad arguments (unregistered address, lists of unequal length, unknown
  segment, a range past a managed buffer) get -1 or ValueError/TypeError with
  the reason.

``initialize``'s ``protocol`` names the transport: "rdma" installs RDMA alone
(``device_name``: the NICs, "" every one), "tcp" TCP alone (``device_name`` is
ignored); ``MC_FORCE_TCP`` (set to anything) means "tcp" whatever the protocol,
as in Mooncake.  As in Mooncake's usual builds, "rdma" on a host with no RDMA
device at all runs TCP (with a warning): vLLM's and SGLang's default protocol
is "rdma", and Mooncake serves them over TCP there.  A ``device_name`` that
names none of a host's devices stays an error (a typo, not a TCP host).

The reason for the last -1 (or 0) is kept in ``last_error`` and, as Mooncake
logs its failures, logged at ERROR on the ``logging`` logger ``"tide"``
(``TIDE_PY_QUIET=1`` silences it).
"""
from __future__ import annotations

import bisect
import enum
import json
import logging
import os
import threading
from typing import List, Optional, Sequence, Tuple

from . import _tide
from ._types import TaskStatus
from .errors import TideError

_WRITE_TIMEOUT_PER_BYTE_S = 1e-9  # Mooncake's deadline: base + 1 ns per byte (about 1 GB/s)
# The native runs of one sync call: one request as three ints (a plain C function: pybind11's
# dispatcher would cost more than the rest of the call), or three lists (_sync).
_SYNC_ONE = _tide.sync_one
_TRANSFER_LISTS = _tide.Engine.transfer_named
# The transport each protocol names; protocols of Mooncake's other transports tide does not have.
_PROTOCOLS = {"rdma": "rdma", "tcp": "tcp"}
_OTHER_TRANSPORTS = frozenset({"nvlink", "nvlink_intra", "hip", "musa", "efa", "cxi", "xgmi", "ascend", "barex"})
_log = logging.getLogger("tide")


def _host_rdma_devices() -> List[str]:
    """The host's RDMA devices: the names in /sys/class/infiniband, where libibverbs and tide's own
    scan (scan_hcas, behind _tide.local_topology) find them."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


class TransferOpcode(enum.IntEnum):
    """Mooncake's enum: ``Read`` = 0, ``Write`` = 1."""

    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: ``name`` (who sends it, as the caller names it) and ``msg``."""

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


def _base_timeout_s() -> float:
    """max(5, atoi(MC_TRANSFER_TIMEOUT)) seconds, default 30, as Mooncake reads it."""
    raw = os.environ.get("MC_TRANSFER_TIMEOUT")
    if raw is None:
        return 30.0
    digits = ""
    for ch in raw.strip():
        if not (ch.isdigit() or (ch in "+-" and not digits)):
            break
        digits += ch
    try:
        return float(max(5, int(digits)))
    except ValueError:
        return 5.0


def _split_metadata(server: str) -> Tuple[Optional[str], Optional[str]]:
    """(connection string, backend kind) as Mooncake's initialize rebuilds it;
    (None, reason) for what tide cannot serve."""
    if server == "P2PHANDSHAKE":
        return server, "p2p"
    if server.startswith(("etcd://", "etcds://")):
        return server, "etcd"
    if server.startswith(("http://", "https://")):
        return server, "http"
    if "://" in server:
        return None, f"metadata server {server!r}: tide speaks P2PHANDSHAKE, etcd:// and http:// (not this scheme)"
    if not server:
        return None, "metadata server is empty (P2PHANDSHAKE, etcd://h:p, h:p or http://h:p/path)"
    return "etcd://" + server, "etcd"  # Mooncake's default for a bare h:p


def _sync_one_call(name: str, op: int):
    """transfer_sync_write / _read: one Python frame around _tide.sync_one
    (a shared helper called from each would add a frame per call); failures
    go on to _fail / _failed."""
    def call(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
             transport_hint: str = "") -> int:
        engine = self._engine
        if engine is None:
            return self._fail(f"{name}: call initialize() first")
        try:
            failed = _SYNC_ONE(engine, target_hostname, op, buffer, peer_buffer_address, length, self._timeout,
                               _WRITE_TIMEOUT_PER_BYTE_S)
        except TideError as e:
            return self._fail(f"{name}: {e}")
        return 0 if failed is None else self._failed(name, failed)

    call.__name__ = name
    call.__qualname__ = f"TransferEngine.{name}"
    call.__doc__ = (f"Mooncake's {name}: one request of `length` bytes between the local `buffer` and "
                    f"`peer_buffer_address` on `target_hostname`; 0, or -1 with the reason in last_error.")
    return call


class TransferEngine:
    """See the module's docstring.  Thread-safe: vLLM and SGLang call one
    engine from many threads at once."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self._engine: Optional[_tide.Engine] = None
        self._timeout = _base_timeout_s()
        self._lock = threading.Lock()  # _initializing and the registered ranges; never held across a C++ call
        self._initializing = False
        self._registered = _Ranges()  # what write/read_bytes_*_buffer may touch
        self.last_error = ""

    # ---- errors ----
    def _fail(self, why, sentinel=-1):
        self.last_error = str(why)
        if os.environ.get("TIDE_PY_QUIET") != "1":
            _log.error("tide.TransferEngine: %s", self.last_error)
        return sentinel

    def _need(self, method: str):
        if self._engine is None:
            raise _NotInitialized(f"{method}: call initialize() first")
        return self._engine

    # ---- setup ----
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, /) -> int:
        """0, or -1 (no usable device, bad metadata string, called twice)."""
        return self._init(local_hostname, metadata_server, protocol, device_name, None)

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str,
                       metadata_type: str, /) -> int:
        """initialize(), where a server without a scheme takes ``metadata_type + "://"``."""
        return self._init(local_hostname, metadata_server, protocol, device_name, metadata_type)

    def _init(self, local_hostname, metadata_server, protocol, device_name, metadata_type) -> int:
        for name, v in (("local_hostname", local_hostname), ("metadata_server", metadata_server),
                        ("protocol", protocol), ("device_name", device_name)):
            if not isinstance(v, str):
                raise TypeError(f"initialize: {name} must be a str, got {type(v).__name__}")
        if protocol in _OTHER_TRANSPORTS:
            return self._fail(f"initialize: protocol {protocol!r} is not supported by tide (rdma and tcp are)")
        if protocol not in _PROTOCOLS:
            return self._fail(f"initialize: unknown protocol {protocol!r} (tide's are 'rdma' and 'tcp')")
        # Mooncake's MC_FORCE_TCP: TCP alone whatever the protocol (set to anything, as Mooncake reads it).
        transports = "tcp" if os.environ.get("MC_FORCE_TCP") is not None else _PROTOCOLS[protocol]
        if transports == "rdma" and not _host_rdma_devices():
            _log.warning("initialize: protocol 'rdma' on a host without RDMA devices (none in "
                         "/sys/class/infiniband): running TCP, as Mooncake does; pass protocol 'tcp' or set "
                         "MC_FORCE_TCP=1 to silence this warning")
            transports = "tcp"
        server = metadata_server
        if metadata_type is not None and server != "P2PHANDSHAKE" and "://" not in server:
            if metadata_type == "p2p":
                return self._fail(f"initialize_ext: metadata_type 'p2p' needs metadata_server 'P2PHANDSHAKE', "
                                  f"not {server!r}")
            server = f"{metadata_type}://{server}"
        conn, kind = _split_metadata(server)
        if conn is None:
            return self._fail(f"initialize: {kind}")
        config = {
            "local_server_name": local_hostname if kind != "p2p" else _host_part(local_hostname),
            "metadata": conn,
            "transports": transports,
        }
        if transports == "rdma":  # TCP uses no device: the name is ignored, as Mooncake does
            config["devices"] = [d.strip() for d in device_name.split(",") if d.strip()]
        if "MC_TRANSFER_TIMEOUT" in os.environ:  # else the engine's own (TIDE_TRANSFER_TIMEOUT_MS, 30 s)
            config["transfer_timeout_ms"] = int(self._timeout * 1000)

        with self._lock:  # threads racing initialize: one creates, the others get -1
            busy = self._engine is not None or self._initializing
            if not busy:
                self._initializing = True
        if busy:
            return self._fail("initialize: already initialized")
        try:
            engine = _tide.Engine(json.dumps(config), "default")
        except TideError as e:
            named = config.get("devices", [])
            host = _host_rdma_devices()
            if any(d not in host for d in named):  # a typo in device_name, not a TCP host
                return self._fail(f"initialize: {e} (device_name {device_name!r}; this host's RDMA devices: "
                                  f"{', '.join(host) or 'none'})")
            return self._fail(f"initialize: {e}")
        finally:
            with self._lock:
                self._initializing = False
        with self._lock:
            self._engine = engine
        return 0

    def get_rpc_port(self) -> int:
        """The port of this engine's handshake listener (peers use ``ip:port``)."""
        if self._engine is None:
            return self._fail("get_rpc_port: call initialize() first")
        return self._engine.handshake_port

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """This host's priority matrix (Mooncake's JSON); works without initialize."""
        devices = [] if not device_name else [d.strip() for d in device_name.split(",") if d.strip()]
        return _tide.local_topology(devices)

    # ---- memory ----
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """0; -1 (zero length, bad address, not initialized); -7 (overlaps a registered region)."""
        try:
            self._need("register_memory").register_memory(int(buffer_addr), int(capacity), location)
        except (TideError, _NotInitialized) as e:
            return self._fail(e, -7 if getattr(e, "name", "") == "already_registered" else -1)
        with self._lock:
            self._registered.add(int(buffer_addr), int(capacity))
        return 0

    def unregister_memory(self, buffer_addr: int, /) -> int:
        """0, or -1 (not the base of a registered region).  Transfers still
        using it are waited for first, so no DMA outlives the call."""
        try:
            self._need("unregister_memory").unregister_memory(int(buffer_addr), 1)
        except (TideError, _NotInitialized) as e:
            return self._fail(e)
        with self._lock:
            self._registered.remove(int(buffer_addr))
        return 0

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int],
                              location: str = "*") -> int:
        """All or nothing; -1 for lists of unequal length, -7 for an overlap."""
        if len(buffer_addresses) != len(capacities):
            return self._fail(f"batch_register_memory: {len(buffer_addresses)} addresses but "
                              f"{len(capacities)} capacities")
        addrs, caps = [int(a) for a in buffer_addresses], [int(c) for c in capacities]
        try:
            self._need("batch_register_memory").register_memory_batch(addrs, caps, location)
        except (TideError, _NotInitialized) as e:
            return self._fail(e, -7 if getattr(e, "name", "") == "already_registered" else -1)
        with self._lock:
            for a, c in zip(addrs, caps):
                self._registered.add(a, c)
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int], /) -> int:
        addrs = [int(a) for a in buffer_addresses]
        try:
            self._need("batch_unregister_memory").unregister_memory_batch(addrs)
        except (TideError, _NotInitialized) as e:
            return self._fail(e)
        finally:
            with self._lock:
                for a in addrs:
                    self._registered.remove(a)
        return 0

    def allocate_managed_buffer(self, length: int, /) -> int:
        """The address of `length` bytes of registered memory, or 0.  The engine
        owns the pages: they are unmapped by free_managed_buffer, or once the
        engine is gone, never while it may still use them."""
        if int(length) < 0:
            return self._fail(f"allocate_managed_buffer: negative length {length}", 0)
        try:
            addr = self._need("allocate_managed_buffer").allocate_managed(int(length))
        except (TideError, _NotInitialized) as e:
            return self._fail(f"allocate_managed_buffer: {e}", 0)
        with self._lock:
            self._registered.add(addr, max(int(length), 1))
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int, /) -> int:
        """0; -1 for an address allocate_managed_buffer did not return, or when
        transfers still using it did not drain (it then stays registered and
        mapped: free it again later)."""
        try:
            self._need("free_managed_buffer").free_managed(int(buffer_addr))
        except (TideError, _NotInitialized) as e:
            return self._fail(e)
        with self._lock:
            self._registered.remove(int(buffer_addr))
        return 0

    def _check_range(self, method: str, addr: int, length: int) -> None:
        if length < 0:
            raise ValueError(f"{method}: negative length {length}")
        with self._lock:
            inside = self._registered.covers(addr, length)
        if not inside:
            raise ValueError(f"{method}: [0x{addr:x}, +{length}) is not inside memory registered with this engine")

    def write_bytes_to_buffer(self, dest_address: int, src_ptr, length: int, /) -> int:
        """Copies `length` bytes of `src_ptr` (bytes or str) to registered memory; 0."""
        engine = self._need("write_bytes_to_buffer")
        data = src_ptr.encode() if isinstance(src_ptr, str) else src_ptr
        self._check_range("write_bytes_to_buffer", int(dest_address), int(length))
        engine.copy_in(int(dest_address), data, int(length))  # the engine, so a managed block, stays meanwhile
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int, /) -> bytes:
        """`length` bytes of registered memory at `source_address`."""
        engine = self._need("read_bytes_from_buffer")
        self._check_range("read_bytes_from_buffer", int(source_address), int(length))
        return engine.copy_out(int(source_address), int(length))

    # ---- segments ----
    def get_first_buffer_address(self, segment_name: str, /) -> int:
        """The address of the segment's first registered buffer, or 0.  Opens
        the segment (kept open for the transfers that follow, as they would)."""
        engine = self._engine
        if engine is None:
            return self._fail("get_first_buffer_address: call initialize() first", 0)
        try:
            _, buffers = engine.segment_buffers(engine.named_segment(segment_name))
        except TideError as e:
            return self._fail(e, 0)
        return buffers[0][0] if buffers else 0

    # ---- transfers ----
    # Each is one native call (sync_one, transfer_named or submit_named):
    # the segment is looked up by name, the requests built and the batch run
    # there, the GIL released for all of it.  Python only maps the outcome to
    # Mooncake's sentinels.
    def _sync(self, method, target_hostname, buffers, peer_addresses, lengths, op, notify) -> int:
        engine = self._engine
        if engine is None:
            return self._fail(f"{method}: call initialize() first")
        # The notification rides with the transfer: the target gets it after
        # every byte is there, never when a request failed.
        note = None if notify is None else (notify.name, notify.msg)
        try:
            failed = _TRANSFER_LISTS(engine, target_hostname, op, buffers, peer_addresses, lengths, self._timeout,
                                     _WRITE_TIMEOUT_PER_BYTE_S, note)
        except TideError as e:
            return self._fail(f"{method}: {e}")
        return 0 if failed is None else self._failed(method, failed)

    def _failed(self, method, failed) -> int:
        return self._fail(f"{method}: {_outcome(failed)}")

    def _sync_lists(self, method, target_hostname, buffers, peer_addresses, lengths, opcode, notify) -> int:
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            return self._fail(f"{method}: lists of unequal length ({len(buffers)}, {len(peer_addresses)}, "
                              f"{len(lengths)})")
        if not buffers:
            return 0
        if self._engine is None:
            return self._fail(f"{method}: call initialize() first")
        op = opcode if opcode is Write or opcode is Read else _opcode(opcode)
        return self._sync(method, target_hostname, buffers, peer_addresses, lengths, int(op), notify)

    # The two calls made once per small transfer (_sync_one_call builds them).
    transfer_sync_write = _sync_one_call("transfer_sync_write", 1)
    transfer_sync_read = _sync_one_call("transfer_sync_read", 0)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                      opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                      transport_hint: str = "") -> int:
        return self._sync_lists("transfer_sync", target_hostname, (buffer,), (peer_buffer_address,), (length,),
                                opcode, notify)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self._sync_lists("batch_transfer_sync_write", target_hostname, buffers, peer_buffer_addresses,
                                lengths, Write, None)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Sequence[int],
                                 peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                 transport_hint: str = "") -> int:
        return self._sync_lists("batch_transfer_sync_read", target_hostname, buffers, peer_buffer_addresses,
                                lengths, Read, None)

    def batch_transfer_sync(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int],
                            lengths: Sequence[int], opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        return self._sync_lists("batch_transfer_sync", target_hostname, buffers, peer_buffer_addresses, lengths,
                                opcode, notify)

    def _submit_async(self, method, target_hostname, buffers, peer_addresses, lengths, opcode) -> int:
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            return self._fail(f"{method}: lists of unequal length", 0)
        if not buffers:
            return self._fail(f"{method}: no requests", 0)
        engine = self._engine
        if engine is None:
            return self._fail(f"{method}: call initialize() first", 0)
        op = int(opcode if opcode is Write or opcode is Read else _opcode(opcode))
        try:
            # The engine keeps the deadline (Mooncake's: now + base + 1 ns per byte) for finish_named.
            return engine.submit_named(target_hostname, op, buffers, peer_addresses, lengths, self._timeout,
                                       _WRITE_TIMEOUT_PER_BYTE_S)
        except TideError as e:
            return self._fail(f"{method}: {e}", 0)

    def batch_transfer_async_write(self, target_hostname: str, buffers: Sequence[int],
                                   peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                   transport_hint: str = "") -> int:
        return self._submit_async("batch_transfer_async_write", target_hostname, buffers, peer_buffer_addresses,
                                  lengths, Write)

    def batch_transfer_async_read(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self._submit_async("batch_transfer_async_read", target_hostname, buffers, peer_buffer_addresses,
                                  lengths, Read)

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int],
                             lengths: Sequence[int], opcode: TransferOpcode, transport_hint: str = "") -> int:
        return self._submit_async("batch_transfer_async", target_hostname, buffers, peer_buffer_addresses, lengths,
                                  opcode)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """A WRITE without waiting: its batch id, or 0."""
        return self._submit_async("transfer_submit_write", target_hostname, (buffer,), (peer_buffer_address,),
                                  (length,), Write)

    def get_batch_transfer_status(self, batch_ids: Sequence[int], /) -> int:
        """Waits for every batch (deadline from its submission), frees them all;
        0 when all completed, -1 when any failed, timed out or was not a live id."""
        ids = [int(b) for b in batch_ids]
        engine = self._engine
        if engine is None:
            return self._fail("get_batch_transfer_status: call initialize() first")
        result, seen = 0, set()
        for bid in ids:
            if bid in seen:
                result = self._fail(f"get_batch_transfer_status: batch id 0x{bid:x} given twice")
                continue
            seen.add(bid)
            try:
                failed = engine.finish_named(bid)
            except TideError as e:
                result = self._fail(f"get_batch_transfer_status: 0x{bid:x}: {e}")
                continue
            if failed is not None:
                result = self._fail(f"get_batch_transfer_status: 0x{bid:x}: {_outcome(failed)}")
        return result

    def transfer_check_status(self, batch_id: int, /) -> int:
        """1 done, 0 pending, -1 failed (or not a live id), -2 timed out; a final
        batch is freed, the -2 one too (it is final in tide: nothing leaks)."""
        engine = self._engine
        if engine is None:
            return self._fail("transfer_check_status: call initialize() first")
        try:
            state = engine.poll_named(int(batch_id))[0]
        except TideError as e:
            return self._fail(f"transfer_check_status: 0x{int(batch_id):x}: {e}")
        if state < 2:
            return 0
        if state == 2:
            return 1
        return -2 if state == 4 else -1

    # ---- notifications, probe ----
    def get_notifies(self) -> List[TransferNotify]:
        """The notifications received so far (and forgets them); [] before initialize."""
        if self._engine is None:
            return []
        try:
            return [TransferNotify(n, m) for n, m in self._engine.take_notifies()]
        except TideError:
            return []

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer's engine answers; -1 not initialized, -101 a name that
        does not parse, -102 nothing answers (or it refuses our secret), -103 it
        answered something else, -200 no segment of that name is known (etcd/http).
        Bounded by MC_HANDSHAKE_CONNECT_TIMEOUT (5 s)."""
        if self._engine is None:
            return self._fail("send_probe: call initialize() first")
        timeout = float(os.environ.get("MC_HANDSHAKE_CONNECT_TIMEOUT", "5") or 5)
        try:
            self._engine.probe(peer_server_name, max(timeout, 0.001))
        except TideError as e:
            code = {"invalid_argument": -101, "protocol_error": -103, "segment_not_found": -200}.get(e.name, -102)
            return self._fail(f"send_probe {peer_server_name}: {e}", code)
        return 0

    # ---- what tide does not have ----
    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: tide has no EFA transport (as Mooncake's non-EFA builds)."""
        return 0

    def get_engine(self):
        """None: Mooncake's native consumers (mooncake.store, mooncake.pg) need its C++ engine."""
        return None

    def get_engine_ptr(self) -> int:
        """0, as get_engine()."""
        return 0

    # ---- stream-ordered transfers (Mooncake's CUDA builds) ----
    # Mooncake enqueues a host callback that runs the transfer on the
    # driver's thread and _exit(1)s the process when it fails.  tide waits
    # for the stream's queued work, runs the transfer, and returns when its
    # bytes are in place: later work on the stream sees them, and a failure
    # is a RuntimeError in the caller instead of the end of the process.
    def _on_cuda(self, method: str, stream_ptr: int, run) -> None:
        usable, _, why = _tide.cuda_status()
        if not usable:
            raise NotImplementedError(f"{method} needs a CUDA GPU: {why}")
        _tide.cuda_synchronize(int(stream_ptr))
        rc = run()
        if rc != 0:
            raise RuntimeError(f"{method} failed ({rc}); the log says why")

    def transfer_write_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                               stream_ptr: int = 0, transport_hint: str = "") -> None:
        self._on_cuda("transfer_write_on_cuda", stream_ptr, lambda: self.batch_transfer_sync_write(
            target_hostname, [buffer], [peer_buffer_address], [length]))

    def transfer_read_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              stream_ptr: int = 0, transport_hint: str = "") -> None:
        self._on_cuda("transfer_read_on_cuda", stream_ptr, lambda: self.batch_transfer_sync_read(
            target_hostname, [buffer], [peer_buffer_address], [length]))

    def batch_transfer_write_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                     peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                     stream_ptr: int = 0, transport_hint: str = "") -> None:
        self._on_cuda("batch_transfer_write_on_cuda", stream_ptr, lambda: self.batch_transfer_sync_write(
            target_hostname, buffers, peer_buffer_addresses, lengths))

    def batch_transfer_read_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                    peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                    stream_ptr: int = 0, transport_hint: str = "") -> None:
        self._on_cuda("batch_transfer_read_on_cuda", stream_ptr, lambda: self.batch_transfer_sync_read(
            target_hostname, buffers, peer_buffer_addresses, lengths))

    def close(self) -> None:
        """tide's addition: stops the engine now (Mooncake's stops with the object).
        Returns once the engine is destroyed (another thread's call ends first);
        the managed buffers are unmapped with it."""
        with self._lock:
            engine, self._engine = self._engine, None
            self._registered = _Ranges()
        if engine is not None:
            engine.close()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()


class _NotInitialized(Exception):
    pass


def _opcode(opcode) -> TransferOpcode:
    if isinstance(opcode, TransferOpcode):
        return opcode
    # Mooncake's opcode from its own module (an enum with .value) is accepted; plain ints are not, as in Mooncake.
    value = getattr(opcode, "value", None)
    if isinstance(value, int) and not isinstance(opcode, int) and value in (0, 1):
        return TransferOpcode(value)
    raise TypeError(f"opcode must be TransferOpcode.Read or TransferOpcode.Write, got {opcode!r}")


def _host_part(name: str) -> str:
    """The host of "host[:port]" / "[v6]:port" (Mooncake ignores a port in p2p mode)."""
    if name.startswith("["):
        return name[: name.find("]") + 1] if "]" in name else name
    if name.count(":") == 1:
        return name.split(":", 1)[0]
    return name


def _outcome(failed) -> str:
    """Why a native outcome tuple (state, bytes, reason, device, path,
    timed_out, leaked[, timeout]) is not a completed transfer."""
    timed_out, leaked = failed[5], failed[6]
    if timed_out:
        after = f" after {failed[7]:.3f} s" if len(failed) > 7 else ""
        how = "not drained within transfer_timeout + 10 s: left to the engine" if leaked else "drained"
        return f"timed out{after} (canceled and {how})"
    s = TaskStatus._of(tuple(failed[:5]))
    where = f" ({s.failed_device} -> {s.failed_path})" if s.failed_path else ""
    left = "; not final within transfer_timeout + 10 s: left to the engine" if leaked else ""
    return f"transfer {s.state.name}: {s.reason or 'failed'}{where}{left}"


class _Ranges:
    """Registered ranges, which never overlap (the engine refuses an overlap):
    base addresses sorted for bisect, so a range check is O(log n)."""

    def __init__(self) -> None:
        self._bases: List[int] = []
        self._length: dict = {}

    def add(self, base: int, length: int) -> None:
        if base not in self._length:
            bisect.insort(self._bases, base)
        self._length[base] = length

    def remove(self, base: int) -> None:
        if self._length.pop(base, None) is not None:
            del self._bases[bisect.bisect_left(self._bases, base)]

    def covers(self, addr: int, length: int) -> bool:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return False
        base = self._bases[i]
        return addr + length <= base + self._length[base]
