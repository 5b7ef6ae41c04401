"""tide: an RDMA transfer engine (C++20) for Python.

Two APIs over one C++ engine:

- ``tide.Engine`` — Pythonic: buffer-protocol registration, bounds-checked
  requests by buffer id, batches with wait / cancel / asyncio, exceptions.
- ``tide.TransferEngine`` — call-compatible with ``mooncake.engine.TransferEngine``
  (same methods, arguments, return codes): ``from tide import TransferEngine``.

Both run over RDMA and over TCP (``tide.Engine(transports="tcp")``,
``TransferEngine.initialize(..., "tcp", "")``).  tide's log lines go to the
``logging`` logger ``"tide"`` (see :func:`forward_logs`, :func:`set_log_level`).
"""
from __future__ import annotations

try:
    from . import _tide
except ImportError as _e:  # pragma: no cover - only in a source tree
    from pathlib import Path as _Path

    if not any(_Path(__file__).parent.glob("_tide*.so")):
        raise ImportError(
            f"this `tide` is tide's source tree ({_Path(__file__).parent}), which has no compiled extension: "
            "install the module (python/README.md, \"Install\") and import it from outside python/ "
            "(Python puts the current directory first on sys.path)", name="tide") from _e
    raise
from . import _log
from ._log import flush_logs, forward_logs, get_log_level, set_log_level
from ._batch import Batch
from ._engine import Engine, Registration, RemoteBuffer, Request, Segment, policy_sets, read, write
from ._types import Access, InFlight, Op, State, TaskStatus
from ._mooncake import Read, TransferEngine, TransferNotify, TransferOpcode, Write
from .errors import (AuthFailed, Canceled, DeviceError, EndpointError, EngineClosed, InvalidArgument, LocalError,
                     MetadataError, NoDevice, PeerUnreachable, TideError, TransferTimeout)

try:
    from importlib.metadata import PackageNotFoundError, version as _dist_version

    __version__ = _dist_version("tide-transfer-engine")
except Exception:  # not installed as a distribution (a build tree)
    __version__ = _tide.__version__

Error = TideError

__all__ = [
    "Access", "Batch", "Engine", "InFlight", "Op", "Registration", "RemoteBuffer", "Request", "Segment", "State",
    "TaskStatus", "policy_sets", "read", "write", "TransferEngine", "TransferNotify", "TransferOpcode", "Read",
    "Write", "TideError", "Error", "LocalError", "EndpointError", "DeviceError", "MetadataError", "InvalidArgument",
    "TransferTimeout", "Canceled", "EngineClosed", "PeerUnreachable", "AuthFailed", "NoDevice",
    "forward_logs", "flush_logs", "set_log_level", "get_log_level",
]

_log._install()
