"""asyncio for tide batches: one eventfd per (engine, event loop).

The engine's lane that retires a watched batch's last task writes the
eventfd (tide._tide.CompletionQueue); the loop, woken through add_reader,
reads it and then drains the ids, resolving futures on the loop's thread.
Task deadlines are applied by status reads, so while futures are pending a
100 ms timer reads their batches' status (no thread, no busy loop).
"""
from __future__ import annotations

import asyncio
from typing import Dict, List, Optional

from . import _tide
from .errors import TideError, TransferTimeout, code_of

_EXPIRY_TICK = 0.1


class _LoopWatcher:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self.queue = _tide.CompletionQueue()
        self.waiting: Dict[int, List[asyncio.Future]] = {}
        self.timer: Optional[asyncio.TimerHandle] = None
        loop.add_reader(self.queue.fileno(), self._on_ready)

    def add(self, batch_id: int) -> asyncio.Future:
        fut = self.loop.create_future()
        first = batch_id not in self.waiting
        self.waiting.setdefault(batch_id, []).append(fut)
        if first:
            self.engine._core().watch(batch_id, self.queue)  # told at once when already final
        if self.timer is None:
            self.timer = self.loop.call_later(_EXPIRY_TICK, self._tick)
        return fut

    def _resolve(self, batch_id: int) -> None:
        for fut in self.waiting.pop(batch_id, []):
            if not fut.done():  # wait_for may have cancelled it
                fut.set_result(None)
        try:
            self.engine._core().watch(batch_id, None)
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
        if self.timer is not None:
            self.timer.cancel()
        try:
            self.loop.remove_reader(self.queue.fileno())
        except (RuntimeError, ValueError):
            pass  # the loop is closed already
        for futs in self.waiting.values():
            for fut in futs:
                if not fut.done():
                    fut.cancel()
        self.waiting.clear()
        self.engine._loops.pop(self.loop, None)


async def wait_batch(batch, timeout: Optional[float]) -> None:
    loop = asyncio.get_running_loop()
    engine = batch._engine
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
