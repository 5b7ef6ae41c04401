"""GPU memory from Python.  Without a CUDA driver (CI, laptops): GPU objects
and stream-ordered calls are refused with the reason, and the layout of a
``__cuda_array_interface__`` is checked first.  With a GPU and torch: CUDA
tensors register as ``cuda:N`` and move over TCP, every byte checked."""
from __future__ import annotations

import pytest

import tide
from tide import _tide
from conftest import tcp_only

USABLE, DEVICES, WHY_NOT = _tide.cuda_status()
no_gpu = pytest.mark.skipif(USABLE, reason="a CUDA driver is loaded here: the GPU cases below run instead")
gpu = pytest.mark.skipif(not USABLE, reason=f"no usable CUDA driver: {WHY_NOT}")


class FakeCudaArray:
    """An object that says it is a GPU array (its layout is checked before
    any driver call); its address is host memory, never touched."""

    def __init__(self, shape=(256,), typestr="<f4", strides=None, readonly=False):
        self._backing = bytearray(4096)
        addr = _tide.buffer_address(self._backing)[0]
        self.__cuda_array_interface__ = {"data": (addr, readonly), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def test_cuda_status_says_why_not_or_how_many():
    assert isinstance(USABLE, bool)
    if USABLE:
        assert DEVICES > 0 and WHY_NOT == ""
    else:
        assert DEVICES == 0 and WHY_NOT


@tcp_only
def test_cuda_array_layout_is_checked_first(net):
    with tide.Engine(**net.config()) as e:
        with pytest.raises(ValueError, match="not C-contiguous"):
            e.register(FakeCudaArray(shape=(16, 16), strides=(4, 64)))
        with pytest.raises(ValueError, match="malformed"):
            e.register(FakeCudaArray(typestr="f"))


@no_gpu
@tcp_only
def test_gpu_objects_are_refused_without_a_driver(net):
    with tide.Engine(**net.config()) as e:
        with pytest.raises(tide.LocalError) as err:
            e.register(FakeCudaArray())
        assert err.value.name == "memory_unsupported"
        assert WHY_NOT in str(err.value)
        buf = bytearray(4096)
        with pytest.raises(tide.LocalError, match="memory_unsupported|GPU memory"):
            e.register(buf, location="cuda:0")
        e.register(buf)  # host memory, as always


@no_gpu
def test_on_cuda_calls_say_why_without_a_driver():
    te = tide.TransferEngine()
    for call in (lambda: te.transfer_write_on_cuda("x", 0, 0, 0),
                 lambda: te.batch_transfer_read_on_cuda("x", [0], [0], [0], 0)):
        with pytest.raises(NotImplementedError, match="needs a CUDA GPU: " + WHY_NOT[:20]):
            call()


@gpu
@tcp_only
def test_cuda_tensors_move_over_tcp(net):
    torch = pytest.importorskip("torch")
    n = (8 << 20) + 13
    with tide.Engine(**net.config()) as a, tide.Engine(**net.config()) as b:
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
        host = torch.zeros(n, dtype=torch.uint8)
        ra, rb, rh = a.register(src), b.register(dst), a.register(host)
        seg = a.open(b.segment_name)
        a.transfer([tide.write(ra, seg, rb.buffer_id)])
        assert torch.equal(src, dst)
        a.transfer([tide.read(rh, seg, rb.buffer_id)])
        assert torch.equal(host, src.cpu())
    # Mooncake's API: GPU pointers registered with "*", and its byte copies.
    te = tide.TransferEngine()
    assert net.initialize(te) == 0
    assert te.batch_register_memory([src.data_ptr()], [n]) == 0
    assert te.read_bytes_from_buffer(src.data_ptr(), 16) == bytes(src[:16].cpu().tolist())
    assert te.write_bytes_to_buffer(src.data_ptr(), b"0123456789abcdef", 16) == 0
    assert bytes(src[:16].cpu().tolist()) == b"0123456789abcdef"


class DLPackOnly:
    """A real DLPack producer (a numpy array) seen only through DLPack, as JAX arrays are."""

    def __init__(self, array):
        self._a = array

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@tcp_only
def test_dlpack_arrays_register_by_their_tensor(net):
    np = pytest.importorskip("numpy")
    if not hasattr(np.ndarray, "__dlpack__"):
        pytest.skip("numpy without DLPack")
    a = np.arange(4096, dtype=np.uint32)
    with tide.Engine(**net.config()) as e:
        reg = e.register(DLPackOnly(a))
        assert reg.address == a.ctypes.data and reg.nbytes == a.nbytes
        with pytest.raises(ValueError, match="not C-contiguous"):
            e.register(DLPackOnly(np.arange(64, dtype=np.uint32)[::2]))
