"""What tide.Engine.register accepts: the address, size and owner of a
Python object's memory (buffer protocol, torch tensors, __cuda_array_interface__,
DLPack), with its layout checked before anything is registered."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from . import _tide
from .errors import class_for, code_of


def exported_memory(obj: Any, readonly: bool):
    """(owner, address, nbytes, readonly, view): `owner` is what the
    Registration keeps alive, `view` a memoryview to release with it (or
    None).  Raises TypeError (no buffer), BufferError (read-only without
    `readonly`), ValueError (layout, device), LocalError memory_unsupported
    (GPU memory where no CUDA driver loads)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"tide registers CPU and CUDA tensors, got device {obj.device}")
        if not obj.is_contiguous():
            raise ValueError("the tensor is not contiguous: register tensor.contiguous()")
        if obj.device.type == "cuda":
            _require_cuda("a CUDA tensor")
        owner = (obj, obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj.storage())
        return owner, obj.data_ptr(), obj.numel() * obj.element_size(), False, None
    if hasattr(obj, "__cuda_array_interface__"):
        address, nbytes, ro = _cuda_array(obj)
        if ro and not readonly:
            raise BufferError("the array is read-only: pass readonly=True to publish it for remote READs only")
        return obj, address, nbytes, ro, None
    if hasattr(obj, "__dlpack__") and not _has_buffer(obj):
        address, nbytes, ro = _dlpack_array(obj)
        return obj, address, nbytes, ro, None
    view = memoryview(obj)  # TypeError without the buffer protocol
    try:
        address, nbytes, ro = _tide.buffer_address(view)
    except BaseException:
        view.release()
        raise
    if ro and not readonly:
        view.release()
        raise BufferError("the buffer is read-only: pass readonly=True to publish it for remote READs only")
    return obj, address, nbytes, ro, view


def _require_cuda(what: str) -> None:
    usable, _, why = _tide.cuda_status()
    if not usable:
        raise class_for(code_of("memory_unsupported"))(code_of("memory_unsupported"),
                                                       f"{what} is GPU memory, and {why}")


def _cuda_array(obj: Any):
    """(address, nbytes, readonly) of a C-contiguous __cuda_array_interface__ array."""
    cai = obj.__cuda_array_interface__
    try:
        address, ro = cai["data"]
        shape = tuple(int(n) for n in cai["shape"])
        itemsize = int(str(cai["typestr"])[2:])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"__cuda_array_interface__ is malformed ({e!r}): {cai!r}") from None
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    strides = cai.get("strides")
    if strides is not None:
        want, step = [], itemsize
        for n in reversed(shape):
            want.append(step)
            step *= n
        if any(n > 1 and s != w for n, s, w in zip(shape, tuple(strides), reversed(want))):
            raise ValueError(f"the array is not C-contiguous (shape {shape}, strides {tuple(strides)}): "
                             "pass a contiguous copy")
    _require_cuda("a __cuda_array_interface__ array")
    return int(address), nbytes, bool(ro)


def is_one_buffer(obj: Any) -> bool:
    """Whether register() would take `obj` as one buffer (register_batch
    refuses it, rather than iterating over its rows)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    return hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__") or _has_buffer(obj)


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def _dlpack_array(obj: Any):
    """(address, nbytes, readonly) of a C-contiguous DLPack array (JAX and others
    without the buffer protocol or __cuda_array_interface__).  The capsule is
    only read: the caller keeps `obj`, which owns the memory."""
    device_type, _ = obj.__dlpack_device__()
    if device_type not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED):
        raise ValueError(f"tide registers CPU and CUDA memory, got a DLPack device of type {device_type}")
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        _require_cuda("a DLPack CUDA array")
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    if t.strides:
        want = 1
        for i in reversed(range(t.ndim)):
            if shape[i] > 1 and t.strides[i] != want:
                raise ValueError(f"the array is not C-contiguous (shape {tuple(shape)}, strides "
                                 f"{tuple(t.strides[j] for j in range(t.ndim))} elements): pass a contiguous copy")
            want *= shape[i]
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    return (t.data or 0) + t.byte_offset, nbytes, False
