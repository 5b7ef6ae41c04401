"""The Pythonic API's vocabulary: operations, states, access modes, a task's status."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from .errors import TideError, class_for, code_of


class Op(enum.IntEnum):
    READ = 0
    WRITE = 1


class State(enum.IntEnum):
    """A task's state; COMPLETED, FAILED, TIMEOUT and CANCELED are final."""

    WAITING = 0
    PENDING = 1
    COMPLETED = 2
    FAILED = 3
    TIMEOUT = 4
    CANCELED = 5

    @property
    def final(self) -> bool:
        return self >= State.COMPLETED


class Access(enum.IntEnum):
    """What remote peers may do with a registered buffer."""

    LOCAL_ONLY = 0
    REMOTE_READ = 1
    REMOTE_WRITE = 2
    REMOTE_READ_WRITE = 3


class InFlight(enum.IntEnum):
    """What unregister / close do with transfers still using the buffer or segment."""

    REJECT = 0
    DRAIN = 1
    CANCEL = 2


@dataclass(frozen=True)
class TaskStatus:
    """One task's (or a batch's roll-up) status.  ``reason`` is the errc name of
    the first error that hit it (None when COMPLETED or still running)."""

    state: State
    bytes: int
    reason: Optional[str] = None
    failed_device: str = ""
    failed_path: str = ""

    @classmethod
    def _of(cls, t) -> "TaskStatus":
        state, nbytes, reason, device, path = t
        name = None if reason == 0 else class_for(reason)(reason).name
        return cls(State(state), nbytes, name, device, path)

    def error(self) -> Optional[TideError]:
        """The exception this status stands for (None when COMPLETED or not final)."""
        if not self.state.final or self.state == State.COMPLETED:
            return None
        code = code_of(self.reason) if self.reason else code_of("canceled" if self.state == State.CANCELED else "timed_out")
        where = f" on {self.failed_device} -> {self.failed_path}" if self.failed_path else ""
        return class_for(code)(code, f"task ended {self.state.name}{where}")
