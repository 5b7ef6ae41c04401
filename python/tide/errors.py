"""tide's exceptions: one class family per blast radius of a ``tide::errc``.

Every exception raised by the engine is a :class:`TideError` carrying
``code`` (the errc value), ``name`` (``"unregistered_source"``), ``group``
(``"local"``, ``"endpoint"``, ``"device"``, ``"metadata"``) and ``detail``
(which field, device or errno).  The family follows ``code // 100``, so a new
errc needs no change here; the leaves are the ones callers branch on.
Instances pickle (Ray, multiprocessing) and compare by their fields.
"""
from __future__ import annotations

from typing import Dict, Tuple, Type

_GROUPS = {1: "local", 2: "endpoint", 3: "device", 4: "metadata"}
_table: Dict[int, Tuple[str, str]] = {}


def _names() -> Dict[int, Tuple[str, str]]:
    if not _table:
        from . import _tide

        _table.update({code: (name, text) for code, name, text in _tide.errc_table()})
    return _table


class TideError(Exception):
    """Base of every tide error."""

    def __init__(self, code: int, detail: str = "", message: str = "") -> None:
        name, text = _names().get(code, ("unknown", "unknown error"))
        self.code = code
        self.name = name
        self.group = _GROUPS.get(code // 100, "none")
        self.detail = detail
        self.message = message or (f"{name}: {detail}" if detail else text)
        super().__init__(code, detail, self.message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.detail!r})"

    def __reduce__(self):
        return (from_native, (self.code, self.detail, self.message))


class LocalError(TideError):
    """One call or one transfer failed; nothing else is affected."""


class EndpointError(TideError):
    """A connection to one peer NIC failed."""


class DeviceError(TideError):
    """One RDMA device failed."""


class MetadataError(TideError):
    """The view of remote segments failed (descriptor, store)."""


class InvalidArgument(LocalError, ValueError):
    """A bad argument: unregistered source, out of bounds, zero length, ..."""


class TransferTimeout(LocalError, TimeoutError):
    """A wait or a transfer passed its deadline."""


class Canceled(LocalError):
    """The batch was canceled."""


class EngineClosed(LocalError):
    """The engine was used after close()."""


class PeerUnreachable(EndpointError, ConnectionError):
    """Nothing answers at the peer's handshake port."""


class AuthFailed(EndpointError, PermissionError):
    """The peer did not prove the cluster secret (or requires one we lack)."""


class NoDevice(DeviceError):
    """No usable RDMA device (or not the one named)."""


_FAMILIES: Dict[int, Type[TideError]] = {1: LocalError, 2: EndpointError, 3: DeviceError, 4: MetadataError}
_LEAVES: Dict[str, Type[TideError]] = {
    "invalid_argument": InvalidArgument,
    "zero_length": InvalidArgument,
    "unregistered_source": InvalidArgument,
    "out_of_bounds": InvalidArgument,
    "batch_full": InvalidArgument,
    "unknown_task": InvalidArgument,
    "capacity_zero": InvalidArgument,
    "bad_location": InvalidArgument,
    "already_registered": InvalidArgument,
    "not_registered": InvalidArgument,
    "unknown_batch": InvalidArgument,
    "config_invalid": InvalidArgument,
    "timed_out": TransferTimeout,
    "canceled": Canceled,
    "not_initialized": EngineClosed,
    "peer_unreachable": PeerUnreachable,
    "auth_failed": AuthFailed,
    "no_device": NoDevice,
    "device_not_found": NoDevice,
}


def class_for(code: int) -> Type[TideError]:
    """The exception class that `code` raises."""
    name = _names().get(code, ("unknown", ""))[0]
    return _LEAVES.get(name) or _FAMILIES.get(code // 100, TideError)


def from_native(code: int, detail: str = "", message: str = "") -> TideError:
    """The exception for an errc (the extension calls this)."""
    return class_for(code)(code, detail, message)


def code_of(name: str) -> int:
    """The errc value of `name` ("out_of_bounds")."""
    for code, (n, _) in _names().items():
        if n == name:
            return code
    raise KeyError(name)


__all__ = [
    "TideError", "LocalError", "EndpointError", "DeviceError", "MetadataError", "InvalidArgument",
    "TransferTimeout", "Canceled", "EngineClosed", "PeerUnreachable", "AuthFailed", "NoDevice",
    "class_for", "from_native", "code_of",
]
