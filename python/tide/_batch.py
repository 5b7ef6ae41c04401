"""tide.Batch: submitted requests, their status, waits (blocking and asyncio), and the
finalizer that frees a batch nobody freed."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ._types import TaskStatus
from .errors import EngineClosed, TideError

if TYPE_CHECKING:
    from ._engine import Engine, Registration, Request


class Batch:
    """Submitted requests.  Keeps their Registrations until every task is final.
    Leaving ``with`` finishes it (waits; on an exception cancels first; then
    frees); :meth:`free` frees a final one; a Batch dropped without either is
    freed once final (cancelled first when still running), so nothing leaks
    whatever ``max_batches`` is.  ``await batch`` waits without blocking the
    event loop (no thread per await).  One thread at a time per batch; its
    status calls are safe from any thread."""

    def __init__(self, engine: "Engine", batch_id: int, requests: Sequence[Request]) -> None:
        self._engine = engine
        self.id = batch_id
        self.size = len(requests)
        from ._engine import Registration as registration  # at call time: _engine imports this module

        self._refs = [r.local for r in requests if isinstance(r.local, registration)]
        self._freed = False
        # Refers to the native engine, the id and the refs, never to self: it
        # runs when the Batch is collected without free() or ``with``.
        self._finalizer = weakref.finalize(self, _drop_batch, engine._native, batch_id, self._refs, engine._orphans)
        self._finalizer.atexit = False  # the engine's own close ends every batch at exit

    def status(self) -> TaskStatus:
        """The batch's roll-up: PENDING while any task runs, else COMPLETED or the first failure."""
        return TaskStatus._of(self._engine._core().batch_status(self.id))

    def tasks(self) -> List[TaskStatus]:
        core = self._engine._core()
        return [TaskStatus._of(core.task_status(self.id, i)) for i in range(self.size)]

    @property
    def done(self) -> bool:
        return self.status().state.final

    def wait(self, timeout: Optional[float] = None) -> List[TaskStatus]:
        """Blocks (GIL released, Ctrl-C works) until every task is final, then
        returns their statuses.  Raises TransferTimeout when `timeout` seconds
        pass first (the tasks keep running; cancel() or wait again), ValueError
        for a timeout that is not a finite number."""
        self._engine._core().wait(self.id, -1.0 if timeout is None else float(timeout))
        return self.tasks()

    def result(self, timeout: Optional[float] = None) -> int:
        """wait(), then the bytes moved; raises the first failed task's error."""
        tasks = self.wait(timeout)
        for t in tasks:
            err = t.error()
            if err is not None:
                raise err
        return sum(t.bytes for t in tasks)

    def telemetry(self, task: Optional[int] = None) -> Dict[str, Any]:
        """Per-request telemetry of task `task` (None: the batch's sum): seconds
        from the submit to the first post and to completion (None: not yet),
        bytes, WRs, retries, the local NICs used, the transports that carried
        it ("rdma", "tcp": both after a failover); complete once it is final."""
        return self._engine._core().telemetry(self.id, -1 if task is None else int(task))

    def cancel(self) -> None:
        """Unfinished tasks end CANCELED; posted work drains first (wait() returns then)."""
        self._engine._core().cancel(self.id)

    def free(self) -> None:
        """Releases the batch (idempotent; after Engine.close() it does nothing).
        Raises batch_busy while tasks run."""
        if self._freed:
            return
        try:
            self._engine._core().free_batch(self.id)
        except EngineClosed:
            pass  # close() ended it with the engine
        self._forget()

    def _forget(self, parked: bool = False) -> None:
        """The batch is freed (or parked by the engine, ``parked``): drop it."""
        if parked:
            self._engine._orphans[self.id] = self._refs  # kept until the engine frees it
        self._freed = True
        self._finalizer.detach()
        self._refs = []
        self._engine._batches.pop(self.id, None)

    def _finish(self, cancel: bool) -> None:
        """The engine's finish: wait (cancel first when `cancel`), drain within
        transfer_timeout + 10 s, free; a batch not final by then, or on Ctrl-C,
        is parked with its registrations until it is."""
        try:
            *_, leaked = self._engine._core().finish(self.id, 0.0 if cancel else -1.0)
        except EngineClosed:
            self._forget()
            return
        except BaseException:
            self._forget(parked=True)
            raise
        self._forget(parked=leaked)

    async def wait_async(self, timeout: Optional[float] = None) -> List[TaskStatus]:
        """wait() for asyncio: the loop is woken by the engine (an eventfd) when
        the batch is final.  Cancelling the awaiting task cancels the batch."""
        from ._aio import wait_batch

        await wait_batch(self, timeout)
        return self.tasks()

    def __await__(self):
        return self.wait_async().__await__()

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if not self._freed:
            self._finish(cancel=exc_type is not None)

    def __repr__(self) -> str:
        try:
            state = "freed" if self._freed else self.status().state.name
        except TideError:
            state = "closed"
        return f"<tide.Batch id=0x{self.id:x} tasks={self.size} {state}>"


def _drop_batch(native, batch_id: int, refs: List[Registration], orphans: Dict[int, List[Registration]]) -> None:
    """A Batch collected without free() or ``with``: freed now when final, else
    cancelled and parked by the engine, its registrations kept until then."""
    try:
        if not native.release(batch_id):
            orphans[batch_id] = refs
    except TideError:
        pass  # closed: the engine's teardown ended it
