"""``mooncake.engine`` served by tide: ``from mooncake.engine import TransferEngine``
gives ``tide.TransferEngine``, call-compatible with Mooncake's (same methods,
arguments and return codes), over RDMA or TCP (``initialize``'s protocol)."""
from tide import TransferEngine, TransferNotify, TransferOpcode
from tide._mooncake import Read, Write

# Mooncake's build flags.  SUPPORT_CUDA: Mooncake built with CUDA registers GPU memory; tide always
# can (it loads the CUDA driver when it meets a GPU pointer, docs/gpu.md).  The others name
# transports and allocators tide has not.
SUPPORT_CUDA = True
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "Read", "Write", "SUPPORT_CUDA", "SUPPORT_EFA",
           "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"]
