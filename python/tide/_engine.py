"""The Pythonic API: ``tide.Engine``, registrations, segments, requests (batches:
_batch.py; the enums and TaskStatus: _types.py).

Threads: an Engine, its Registrations and Segments are thread-safe; a Batch
is one thread's at a time (its status calls are safe from any thread).  The
GIL is released for everything that can block (creation, registration,
opening a segment, submit, wait, cancel, close); tide's own threads never
take it.
"""
from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Union

from . import _tide
from ._batch import Batch
from ._memory import exported_memory, is_one_buffer
from ._types import Access, InFlight, Op, TaskStatus
from .errors import EngineClosed, InvalidArgument, TideError, class_for, code_of


class Registration:
    """Registered memory: pinned on every NIC and published under a stable
    ``buffer_id``.  Holds the exporter's buffer (a bytearray cannot resize, a
    numpy array keeps its memory) until :meth:`unregister`."""

    def __init__(self, engine: "Engine", obj: Any, address: int, nbytes: int, readonly: bool, view, access: Access,
                 buffer_id: int) -> None:
        self._engine = engine
        self.obj = obj
        self.address = address
        self.nbytes = nbytes
        self.readonly = readonly
        self.access = access
        self.buffer_id = buffer_id
        self._view = view
        self._live = True

    def unregister(self, mode: InFlight = InFlight.DRAIN) -> None:
        """Withdraws the buffer (idempotent).  With transfers in flight from it:
        DRAIN waits for them, CANCEL cancels them first, REJECT raises."""
        if not self._live:
            return
        self._engine._core().unregister_memory(self.address, int(mode))
        self._live = False
        self._engine._forget(self)
        if self._view is not None:
            self._view.release()
        self._view = None
        self.obj = None

    def _released(self) -> None:
        """The engine that registered it is gone: let the buffer go."""
        self._live = False
        if self._view is not None:
            self._view.release()
        self._view = None
        self.obj = None

    @property
    def registered(self) -> bool:
        return self._live

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc) -> None:
        self.unregister()

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        state = "" if self._live else " unregistered"
        return f"<tide.Registration id={self.buffer_id} addr=0x{self.address:x} nbytes={self.nbytes}{state}>"


@dataclass(frozen=True)
class RemoteBuffer:
    address: int
    length: int
    buffer_id: int
    access: Access


class Segment:
    """An opened remote segment (a peer engine's registered buffers)."""

    def __init__(self, engine: "Engine", name: str, handle: int) -> None:
        self._engine = engine
        self.name = name
        self.handle = handle

    def buffers(self) -> List[RemoteBuffer]:
        """The peer's buffers as last read from its descriptor."""
        _, bufs = self._engine._core().segment_buffers(self.handle)
        return [RemoteBuffer(a, n, i, Access(acc)) for a, n, i, acc in bufs]

    def close(self, mode: InFlight = InFlight.REJECT) -> None:
        self._engine._core().close_segment(self.handle, int(mode))

    def __repr__(self) -> str:
        return f"<tide.Segment {self.name!r} handle={self.handle}>"


@dataclass(frozen=True)
class Request:
    """One transfer between local memory and a remote segment.  Build it with
    :func:`read` or :func:`write`."""

    op: Op
    local: Union[Registration, int]
    segment: Segment
    length: int
    buffer_id: Optional[int]
    offset: int
    local_offset: int = 0

    def _native(self):
        if isinstance(self.local, Registration):
            if not self.local.registered:
                raise InvalidArgument(code_of("unregistered_source"), "the local Registration was unregistered")
            if self.local_offset < 0 or self.local_offset + self.length > self.local.nbytes:
                raise InvalidArgument(code_of("out_of_bounds"),
                                      f"local range [{self.local_offset}, {self.local_offset + self.length}) outside "
                                      f"the registration's {self.local.nbytes} bytes")
            if self.op == Op.READ and self.local.readonly:
                raise InvalidArgument(code_of("invalid_argument"), "a READ into a read-only registration")
            src = self.local.address + self.local_offset
        else:
            src = int(self.local) + self.local_offset
        buf = -1 if self.buffer_id is None else self.buffer_id
        return (int(self.op), src, self.segment.handle, buf, self.offset, self.length)


def _request(op: Op, local, segment: Segment, buffer_id: Optional[int], offset: int, length: Optional[int],
             local_offset: int, address: Optional[int]) -> Request:
    if (buffer_id is None) == (address is None):
        raise TypeError("give exactly one of buffer_id (bounds-checked) or address (the peer's raw address)")
    if length is None:
        if not isinstance(local, Registration):
            raise TypeError("length is required when `local` is an address")
        length = local.nbytes - local_offset
    return Request(op, local, segment, length, buffer_id, offset if address is None else address, local_offset)


def write(local, segment: Segment, buffer_id: Optional[int] = None, offset: int = 0, length: Optional[int] = None,
          *, local_offset: int = 0, address: Optional[int] = None) -> Request:
    """A WRITE of `local` (a Registration or an address) into the peer's buffer
    `buffer_id` at `offset` (bounds-checked), or at its raw `address`."""
    return _request(Op.WRITE, local, segment, buffer_id, offset, length, local_offset, address)


def read(local, segment: Segment, buffer_id: Optional[int] = None, offset: int = 0, length: Optional[int] = None,
         *, local_offset: int = 0, address: Optional[int] = None) -> Request:
    """A READ from the peer's buffer into `local`; arguments as :func:`write`."""
    return _request(Op.READ, local, segment, buffer_id, offset, length, local_offset, address)


class Engine:
    """A tide transfer engine.  Keyword arguments are ``engine_config``'s fields
    (``local_server_name``, ``metadata``, ``devices``, ``transports``
    ("rdma,tcp", the default; "rdma"; "tcp"), ``transfer_timeout_ms``, ...;
    they win over TIDE_CONFIG and the environment, and the metadata backend
    is the one the result names).  ``policies`` names a
    compiled policy set (:func:`tide.policy_sets`).  Thread-safe."""

    def __init__(self, *, policies: str = "default", **config: Any) -> None:
        self._native = _tide.Engine(json.dumps(config), policies)
        self._lock = threading.Lock()  # the tables and _closing; never held across a native call
        self._close_lock = threading.Lock()  # one close() at a time, for its whole length
        self._closing = False
        self._registrations: Dict[int, Registration] = {}
        self._batches: "weakref.WeakValueDictionary[int, Batch]" = weakref.WeakValueDictionary()
        self._orphans: Dict[int, List[Registration]] = {}  # batch id -> refs, while the engine has it parked
        # event loop -> _aio watcher; weak, so that a loop collected takes its watcher with it
        self._loops: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self._finalizer = weakref.finalize(self, _close_native, self._native)

    # -- lifetime --
    def close(self) -> None:
        """Cancels every batch and waits for them with one deadline, stops the
        engine, and returns once it is destroyed (calls still running on other
        threads end first: waits within 100 ms, transfers once cancelled);
        then releases every registration's buffer (idempotent, any thread).
        Calls made meanwhile raise EngineClosed."""
        with self._close_lock:
            with self._lock:
                if self._native.closed:
                    return
                self._closing = True
                batches = list(self._batches.values())
                regs = list(self._registrations.values())
            for watcher in list(self._loops.values()):
                watcher.close()
            self._native.close([b.id for b in batches if not b._freed])
            self._finalizer.detach()
            # The engine is gone: no DMA can reach these buffers any more.
            for batch in batches:
                batch._forget()
            self._orphans.clear()
            for reg in regs:
                reg._released()
            with self._lock:
                self._registrations.clear()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _core(self):
        if self._native.closed:
            raise EngineClosed(code_of("not_initialized"), "the engine is closed")
        return self._native

    def _live(self):
        """_core() for a call that starts something: refused once close() began."""
        with self._lock:
            if self._closing:
                raise EngineClosed(code_of("not_initialized"), "the engine is closed")
        return self._core()

    def _forget(self, reg: Registration) -> None:
        with self._lock:
            self._registrations.pop(reg.address, None)

    def _reap(self) -> None:
        """Drops the refs of parked batches the engine has freed since."""
        if not self._orphans:
            return
        try:
            parked = set(self._native.orphans())
        except TideError:
            return
        for batch_id in list(self._orphans):
            if batch_id not in parked:
                self._orphans.pop(batch_id, None)

    @property
    def segment_name(self) -> str:
        """What peers open to reach this engine ("host:port" in p2p mode)."""
        return self._core().segment_name

    @property
    def handshake_port(self) -> int:
        return self._core().handshake_port

    @property
    def tcp_port(self) -> int:
        """The TCP data port peers send requests to (0: TCP is not installed)."""
        return self._core().tcp_port

    # -- memory --
    def register(self, obj: Any, location: str = "*", *, readonly: bool = False,
                 access: Optional[Access] = None) -> Registration:
        """Registers anything with the buffer protocol (bytearray, memoryview,
        mmap, numpy arrays, array.array), a torch CPU or CUDA tensor, or a GPU
        array with ``__cuda_array_interface__`` (CuPy, Numba) or DLPack (JAX), C-contiguous,
        without copying, and keeps it alive while registered.  GPU memory is
        published as ``cuda:N`` (location "*").  `readonly` publishes it
        REMOTE_READ and refuses it as a READ's destination.  Raises TypeError
        (no buffer), BufferError (a read-only buffer without readonly=True),
        ValueError (layout, device, zero length, overlap), LocalError
        memory_unsupported (GPU memory where no CUDA driver loads),
        EngineClosed (also when close() ran meanwhile)."""
        keep, address, nbytes, ro, view = exported_memory(obj, readonly)
        access = _access_of(access, readonly)
        try:
            buffer_id = self._live().register_memory(address, nbytes, location, int(access))
        except BaseException:
            if view is not None:
                view.release()
            raise
        return self._adopt([Registration(self, keep, address, nbytes, ro or readonly, view, access, buffer_id)])[0]

    def register_batch(self, objs: Iterable[Any], location: str = "*", *, readonly: bool = False,
                       access: Optional[Access] = None) -> List[Registration]:
        """Registers several buffers as :meth:`register` does, in one call that
        publishes this engine's descriptor once (one register() per buffer
        publishes it once each).  All or nothing: after an error none of them
        is registered.  `location`, `readonly` and `access` apply to every
        buffer; returns their Registrations in the order given.  Raises what
        register() raises, naming the buffer ("buffer 2: ..."), TypeError for
        one buffer instead of a sequence of them, InvalidArgument (a
        ValueError) for an empty sequence."""
        if is_one_buffer(objs):
            raise TypeError("register_batch takes a sequence of buffers; register() takes one")
        items = list(objs)  # TypeError when not iterable
        if not items:
            raise InvalidArgument(code_of("invalid_argument"), "register_batch: no buffers given")
        access = _access_of(access, readonly)
        exports = []
        try:
            for i, obj in enumerate(items):
                try:
                    exports.append(exported_memory(obj, readonly))
                except (TypeError, ValueError, BufferError) as e:
                    if isinstance(e, TideError):
                        raise class_for(e.code)(e.code, f"buffer {i}: {e.detail}") from e
                    raise type(e)(f"buffer {i}: {e}") from e
                if exports[-1][2] == 0:
                    raise InvalidArgument(code_of("zero_length"), f"buffer {i}: zero length")
            ids = self._live().register_memory_batch([e[1] for e in exports], [e[2] for e in exports], location,
                                                     [int(access)] * len(exports))
        except BaseException:
            for e in exports:
                if e[4] is not None:
                    e[4].release()
            raise
        return self._adopt([Registration(self, keep, address, nbytes, ro or readonly, view, access, bid)
                            for (keep, address, nbytes, ro, view), bid in zip(exports, ids)])

    def flush_metadata(self) -> None:
        """With etcd/http metadata and ``publish_delay_ms`` set, register()
        returns before the store holds the buffer (the store gets it within
        the delay); this stores every registration made so far now, e.g.
        before telling a peer about a buffer.  Otherwise the store is already
        current and it returns at once.  Raises MetadataError when the store
        refuses (a later write tries again)."""
        self._live().flush_metadata()

    def _adopt(self, regs: List[Registration]) -> List[Registration]:
        """Records registrations the engine has just made (raises EngineClosed,
        letting them go, when close() began meanwhile)."""
        with self._lock:
            late = self._closing
            if not late:
                for reg in regs:
                    self._registrations[reg.address] = reg
        if late:
            # close() began while these registered and does not know them: the
            # engine is destroyed with them (no batch can use them), so let them go.
            for reg in regs:
                reg._released()
            raise EngineClosed(code_of("not_initialized"), "the engine was closed while registering")
        return regs

    def allocate(self, nbytes: int, location: str = "*") -> Registration:
        """Engine-owned registered memory (anonymous pages), as a Registration
        whose ``obj`` is an mmap with the buffer protocol."""
        import mmap

        if nbytes <= 0:
            raise InvalidArgument(code_of("zero_length"), f"allocate: {nbytes} bytes")
        return self.register(mmap.mmap(-1, nbytes), location)

    # -- segments --
    def open(self, segment: str) -> Segment:
        """Opens a peer's segment by name (p2p: "host:port")."""
        return Segment(self, segment, self._live().open_segment(segment))

    def probe(self, segment: str, timeout: float = 1.0) -> None:
        """Raises unless the engine behind `segment` answers within `timeout` s
        (PeerUnreachable, AuthFailed, ...).  Opens nothing, creates no QP."""
        self._core().probe(segment, timeout)

    # -- transfers --
    def submit(self, requests: Iterable[Request], notify: Optional[str] = None, *, sender: str = "") -> Batch:
        """Submits the requests as one batch (nothing is submitted on an error).
        `notify`: a message the requests' target reads with notifications()
        only after every byte of them is in its memory, and never if one of
        them fails (one segment per notified submit; `sender` "" = this
        engine's segment name, the authenticated identity with a secret)."""
        reqs = list(requests)
        native = [r._native() for r in reqs]
        core = self._live()
        self._reap()
        bid = core.allocate_batch(max(1, len(reqs)))
        try:
            core.submit(bid, native, None if notify is None else (sender, notify))
        except BaseException:
            core.release(bid)  # nothing was submitted: freed at once
            raise
        batch = Batch(self, bid, reqs)
        with self._lock:
            self._batches[bid] = batch
        return batch

    def transfer(self, requests: Iterable[Request], timeout: Optional[float] = None, notify: Optional[str] = None,
                 *, sender: str = "") -> int:
        """submit(), wait, free; returns the bytes moved or raises the first error.
        Past `timeout` seconds the batch is canceled and drained, then
        TransferTimeout is raised: no DMA of it touches the buffers afterwards.
        `notify` and `sender` as submit()'s.  ValueError for a timeout that is
        not a finite number."""
        reqs = list(requests)
        if not reqs:
            return 0
        wait_s = 1e9 if timeout is None else float(timeout)
        note = None if notify is None else (sender, notify)
        native = [r._native() for r in reqs]
        core = self._live()
        self._reap()
        *status, timed_out, leaked = core.transfer(native, wait_s, note)
        if timed_out:
            how = "not drained within transfer_timeout + 10 s: left to the engine" if leaked else "drained"
            raise class_for(code_of("timed_out"))(code_of("timed_out"),
                                                  f"transfer unfinished after {wait_s} s (canceled and {how})")
        s = TaskStatus._of(tuple(status))
        err = s.error()
        if err is not None:
            raise err
        return s.bytes

    # -- notifications, stats --
    def notify(self, segment: Segment, message: str) -> None:
        """Sends `message` to the owner of `segment` now, tied to no transfer
        (its handshake port); submit(..., notify=) sends one after the data."""
        self._core().send_notify(segment.handle, message)

    def notifications(self, wait: float = 0.0) -> List[tuple]:
        """The (sender, message) pairs received so far (and forgets them).
        With ``wait`` (seconds) and none queued, blocks without the GIL until
        one arrives or ``wait`` passes; 0 never blocks.  ``ValueError`` for a
        negative ``wait``."""
        return self._core().take_notifies(wait)

    def metrics(self) -> str:
        """The engine's counters in Prometheus' text format (what the
        ``metrics_port`` endpoint serves)."""
        return self._core().metrics_text()

    def stats(self) -> Dict[str, Any]:
        """Per NIC bytes, WRs, errors, in-flight bytes and bandwidth estimate;
        every rail that failed; notification and handshake counters; the TCP
        transport's port and counters (``"tcp"``)."""
        return self._core().stats()

    def __repr__(self) -> str:
        if self.closed:
            return "<tide.Engine closed>"
        return f"<tide.Engine {self.segment_name!r} buffers={len(self._registrations)} batches={len(self._batches)}>"


def _access_of(access: Optional[Access], readonly: bool) -> Access:
    if access is None:
        return Access.REMOTE_READ if readonly else Access.REMOTE_READ_WRITE
    return access


def _close_native(native) -> None:
    native.close()


def policy_sets() -> List[Dict[str, Any]]:
    """The policy sets this build of the module can create, by name."""
    return [{"name": n, "policies": d, "metadata": list(b)} for n, d, b in _tide.policy_sets()]
