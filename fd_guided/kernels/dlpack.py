"""Zero-copy views across Paddle, torch and any DLPack producer, and the CUDA stream rule.

Type checks look the library up in `sys.modules` instead of importing it: an object cannot be a
torch tensor unless torch is already imported, so telling a tensor's kind never loads a library.

Stream rule (CUDA): the kernel must run after the producer's pending work on the logits, and the
producer's later work (sampling) after the kernel, without a device-wide sync. `producer_stream(x)`
makes the producer's current stream torch's current stream, so both hold by stream order:
  - torch tensor: torch's current stream on the tensor's device;
  - paddle tensor: paddle's current stream, wrapped as `torch.cuda.ExternalStream`. If it cannot
    be wrapped, `StreamOrderError`: a kernel on any other stream would be ordered after Paddle's
    writes (the DLPack handshake) but Paddle's sampling would not be ordered after it. The CUDA
    path then masks with Paddle's own ops instead (kernels/cuda.py);
  - any other `__dlpack__` producer: torch's current stream (the DLPack handshake orders the
    kernel after its work; its later work is ordered only if it runs on that stream too).
`to_torch_view` must be called inside that block: `torch.from_dlpack` passes torch's current
stream to `x.__dlpack__(stream=...)`, and by the DLPack protocol the producer makes that consumer
stream wait for its work (a stream-to-stream event wait, a no-op when the streams are the same).

A second operand on the device (a bitmask produced by another library or on another stream) is
read through `cross_stream_read`: the kernel's stream waits for the operand's producer stream
before the read, and afterwards the operand's producer stream waits for the kernel (an event) and
a torch operand is `record_stream`-ed, so neither its next write nor the reuse of its memory can
overtake the read. All waits are GPU-side: the host never blocks.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

CPU, CUDA, OTHER = "cpu", "cuda", "other"

# DLDeviceType codes (dlpack.h) -> our device kinds. Pinned and managed host memory is host memory.
_DLPACK_DEVICE_KINDS = {1: CPU, 2: CUDA, 3: CPU, 10: CUDA, 11: CPU, 13: CUDA}


def _loaded_class(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def is_torch_tensor(x: Any) -> bool:
    cls = _loaded_class("torch", "Tensor")
    return cls is not None and isinstance(x, cls)


def is_paddle_tensor(x: Any) -> bool:
    cls = _loaded_class("paddle", "Tensor")
    return cls is not None and isinstance(x, cls)


def is_numpy_array(x: Any) -> bool:
    cls = _loaded_class("numpy", "ndarray")
    return cls is not None and isinstance(x, cls)


def device_kind(x: Any) -> str:
    """ "cpu", "cuda" or "other" (XPU, NPU, custom places...) for a tensor of any supported kind."""
    if is_torch_tensor(x):
        kind = x.device.type
        return kind if kind in (CPU, CUDA) else OTHER
    if is_paddle_tensor(x):
        place = x.place
        if place.is_cpu_place() or place.is_cuda_pinned_place() or place.is_xpu_pinned_place():
            return CPU
        return CUDA if place.is_gpu_place() else OTHER
    if is_numpy_array(x):
        return CPU
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is None:
        raise TypeError(f"expected a paddle.Tensor, a torch.Tensor or a DLPack producer, got {type(x).__name__}")
    return _DLPACK_DEVICE_KINDS.get(int(dlpack_device()[0]), OTHER)


def dtype_name(x: Any) -> str:
    """The dtype as a bare name ("float32", "bfloat16", "int32"), whatever library owns `x`."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = to_torch_view(x).dtype
    return str(dtype).rsplit(".", 1)[-1]


def element_strides(x: Any) -> tuple[int, ...]:
    """Strides in elements (numpy and CuPy report bytes; torch and paddle report elements)."""
    if is_torch_tensor(x):
        return tuple(x.stride())
    if is_paddle_tensor(x):
        return tuple(x.strides)
    strides, itemsize = getattr(x, "strides", None), getattr(x, "itemsize", None)
    if strides is not None and itemsize:
        return tuple(s // itemsize for s in strides)
    return tuple(to_torch_view(x).stride())


def to_torch_view(x: Any):
    """A torch tensor sharing `x`'s memory (no copy). On CUDA call it inside `producer_stream(x)`."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if is_paddle_tensor(x) and not x.stop_gradient:
        x = x.detach()  # paddle refuses to export tensors that require grad; detach shares memory
    try:
        return torch.from_dlpack(x)
    except BufferError:
        if is_numpy_array(x):  # read-only arrays cannot be exported; only ever read (bitmasks)
            return torch.as_tensor(x)
        raise


def to_paddle_view(x: Any):
    """A paddle tensor sharing `x`'s memory (no copy); paddle passes its own current stream."""
    import paddle

    if isinstance(x, paddle.Tensor):
        return x
    if is_torch_tensor(x) and x.requires_grad:
        x = x.detach()
    from_dlpack = getattr(paddle, "from_dlpack", None) or paddle.utils.dlpack.from_dlpack
    return from_dlpack(x)


def cuda_device_index(x: Any) -> int:
    if is_torch_tensor(x):
        return x.device.index if x.device.index is not None else 0
    if is_paddle_tensor(x):
        return x.place.gpu_device_id()
    return int(x.__dlpack_device__()[1] or 0)


def _paddle_current_stream(device):
    """paddle's current stream on `device` as a torch stream, or None if paddle's API differs."""
    import paddle
    import torch

    try:  # a tensor's .place is a generic Place, which current_stream() does not accept
        stream = paddle.device.current_stream(paddle.CUDAPlace(device.index))
        base: Any = getattr(stream, "stream_base", stream)
        handle = base.cuda_stream
        return torch.cuda.ExternalStream(handle, device=device)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


class StreamOrderError(RuntimeError):
    """A producer's current CUDA stream cannot be reached from torch, so a kernel could not be
    ordered both ways with its work (see the module docstring)."""


def producer_torch_stream(x: Any):
    """The torch stream that orders work after the producer's pending writes to CUDA tensor `x`
    (for a torch tensor: torch's current stream NOW; call it before entering another stream).

    Raises:
        StreamOrderError: `x` is a Paddle tensor whose current stream cannot be wrapped.
    """
    import torch

    device = torch.device(CUDA, cuda_device_index(x))
    if not is_paddle_tensor(x):
        return torch.cuda.current_stream(device)
    stream = _paddle_current_stream(device)
    if stream is None:
        raise StreamOrderError(
            "paddle's current CUDA stream cannot be wrapped as a torch stream (torch.cuda.ExternalStream): "
            "a kernel on another stream would not be ordered before paddle's next work"
        )
    return stream


def same_stream(a, b) -> bool:
    return a.cuda_stream == b.cuda_stream and a.device == b.device


def cross_stream_read(producer, stream):
    """Order a read on `stream` of a tensor written on `producer` (both torch streams); returns
    ``release(view)``, to call right after the reading kernel is enqueued. A no-op pair when the
    streams are the same."""
    if same_stream(producer, stream):
        return lambda view: None
    stream.wait_stream(producer)  # the read after the producer's pending writes (GPU-side)

    def release(view) -> None:
        import torch

        if getattr(view, "is_cuda", False):
            view.record_stream(stream)  # torch memory: not reused before `stream` got past the read
        done = torch.cuda.Event()
        done.record(stream)
        producer.wait_event(done)  # the producer's next write (or free) after the read

    return release


@contextlib.contextmanager
def producer_stream(x: Any) -> Iterator[Any]:
    """Run the block on the producer's current CUDA stream (yields it); a no-op off CUDA."""
    if device_kind(x) != CUDA:
        yield None
        return
    import torch

    stream = producer_torch_stream(x)
    # The device too: Triton launches on the current device, which may not be the logits' one.
    with torch.cuda.device(stream.device), torch.cuda.stream(stream):
        yield stream
