"""``mooncake.engine``'s names: ``from tide.compat.mooncake import TransferEngine``."""
from .._mooncake import Read, TransferEngine, TransferNotify, TransferOpcode, Write

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "Read", "Write"]
