"""``mooncake.engine`` served by tide: ``from mooncake.engine import TransferEngine``
gives ``tide.TransferEngine``, call-compatible with Mooncake's (same methods,
arguments and return codes), over RDMA or TCP (``initialize``'s protocol)."""
from tide import TransferEngine, TransferNotify, TransferOpcode
from tide._mooncake import Read, Write

# Mooncake's build flags (compile time there).  SUPPORT_CUDA: a build with USE_CUDA, which tells GPU
# memory apart when it registers it (location "cuda:N") and has the transfer_*_on_cuda calls.  Every
# tide build does both: it loads the NVIDIA driver at run time when it meets a GPU pointer
# (docs/gpu.md); without a driver every buffer is host memory and *_on_cuda raise
# NotImplementedError saying why.  The others name transports and allocators tide has not.
SUPPORT_CUDA = True
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "Read", "Write", "SUPPORT_CUDA", "SUPPORT_EFA",
           "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"]
