"""asyncio for tide batches: one eventfd per (engine, live event loop).

The engine's lane that retires a watched batch's last task writes the
eventfd (tide._tide.CompletionQueue); the loop, woken through add_reader,
reads it and then drains the ids, resolving futures on the loop's thread.
Task deadlines are applied by status reads, so while futures are pending a
100 ms timer reads their batches' status (no thread, no busy loop).

A loop's watcher (its eventfd, its queue in the engine) goes when the loop
closes: the next wait_batch on any loop of the engine drops the watchers of
closed loops, and a loop that is collected drops its own.  So a program that
runs asyncio.run() per request keeps one watcher, not one per call.
"""
from __future__ import annotations

import asyncio
import weakref
from typing import Dict, List, Optional

from . import _tide
from .errors import TideError, TransferTimeout, code_of

_EXPIRY_TICK = 0.1


def _forget_queue(native, queue) -> None:
    """The engine stops every watch of `queue` (its loop is gone)."""
    try:
        native.forget_queue(queue)
    except TideError:
        pass  # closed: the engine calls nothing any more


class _LoopWatcher:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop_ref = weakref.ref(loop)  # the loop keeps this watcher (add_reader), not the reverse
        self.queue = _tide.CompletionQueue()
        self.waiting: Dict[int, List[asyncio.Future]] = {}
        self.timer: Optional[asyncio.TimerHandle] = None
        self.closed = False
        loop.add_reader(self.queue.fileno(), self._on_ready)
        # A loop collected without this watcher being closed still frees the queue.
        self.finalizer = weakref.finalize(loop, _forget_queue, engine._native, self.queue)
        self.finalizer.atexit = False

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        return self.loop_ref()

    def add(self, batch_id: int) -> asyncio.Future:
        loop = self.loop
        fut = loop.create_future()
        first = batch_id not in self.waiting
        self.waiting.setdefault(batch_id, []).append(fut)
        if first:
            self.engine._core().watch(batch_id, self.queue)  # told at once when already final
        if self.timer is None:
            self.timer = loop.call_later(_EXPIRY_TICK, self._tick)
        return fut

    def _resolve(self, batch_id: int) -> None:
        for fut in self.waiting.pop(batch_id, []):
            if not fut.done():  # wait_for may have cancelled it
                fut.set_result(None)
        try:
            self.engine._core().unwatch(batch_id)
        except TideError:
            pass  # freed or closed meanwhile: nothing to stop

    def _on_ready(self) -> None:
        for batch_id in self.queue.drain():
            if batch_id in self.waiting:
                self._resolve(batch_id)

    def _tick(self) -> None:
        self.timer = None
        core = self.engine._native
        for batch_id in list(self.waiting):
            try:
                if core.batch_status(batch_id)[0] >= 2:  # final: the listener may have raced the watch
                    self._resolve(batch_id)
            except TideError as e:
                for fut in self.waiting.pop(batch_id, []):
                    if not fut.done():
                        fut.set_exception(e)
        if self.waiting:
            self.timer = self.loop.call_later(_EXPIRY_TICK, self._tick)

    def close(self) -> None:
        """Stops watching (idempotent): the reader, the futures, the engine's watches."""
        if self.closed:
            return
        self.closed = True
        loop = self.loop
        if self.timer is not None:
            self.timer.cancel()
        if loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(self.queue.fileno())
            except (RuntimeError, ValueError):
                pass
        for futs in self.waiting.values():
            for fut in futs:
                if not fut.done():
                    fut.cancel()
        self.waiting.clear()
        self.finalizer()  # forget_queue, once
        if loop is not None:
            self.engine._loops.pop(loop, None)


def _drop_closed_loops(engine) -> None:
    for loop, watcher in list(engine._loops.items()):
        if loop.is_closed():
            watcher.close()


async def wait_batch(batch, timeout: Optional[float]) -> None:
    loop = asyncio.get_running_loop()
    engine = batch._engine
    _drop_closed_loops(engine)
    watcher = engine._loops.get(loop)
    if watcher is None:
        watcher = engine._loops[loop] = _LoopWatcher(engine, loop)
    fut = watcher.add(batch.id)
    try:
        await asyncio.wait_for(asyncio.shield(fut), timeout)
    except asyncio.TimeoutError:
        raise TransferTimeout(code_of("timed_out"), f"wait_async: batch unfinished after {timeout} s") from None
    except asyncio.CancelledError:
        batch.cancel()  # the batch stays with the engine until final (Engine.close drains it)
        raise
