"""``mooncake.engine`` served by tide: ``from mooncake.engine import TransferEngine``
gives ``tide.TransferEngine``, call-compatible with Mooncake's (same methods,
arguments and return codes), over RDMA or TCP (``initialize``'s protocol)."""
from tide import TransferEngine, TransferNotify, TransferOpcode
from tide._mooncake import Read, Write

# Mooncake's build flags: tide moves host memory only.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "Read", "Write", "SUPPORT_CUDA", "SUPPORT_EFA",
           "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"]
