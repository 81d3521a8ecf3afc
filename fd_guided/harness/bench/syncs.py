"""Count the host reads of tensors that fd_guided's own code makes: on a GPU each one is a
device-to-host transfer that waits for the stream (a sync), so a step's count is its sync count.

`HostReads` patches the methods that read a tensor's values on the host (``numpy``, ``tolist``,
``item``, ``__array__``, ``__int__``, ``__float__``, ``__bool__``, ``__index__``) of
``paddle.Tensor`` and ``torch.Tensor`` with wrappers that call the real method and count the call
when the caller's module is in the fd_guided library (``fd_guided.*`` outside
``fd_guided.harness``). Calls made by the host's own code (FastDeploy, its stood-in ops, a test)
are not counted. A nested read (``__array__`` calling ``numpy``) counts once.

On a CPU, Paddle tensors are host memory and nothing waits, but they stand in for the host's
device tensors (FastDeploy's ``share_inputs``, sampled tokens), and the calls are the ones that
would wait on a GPU: the tests count them (`count_host_tensors=True`, the default). With
``count_host_tensors=False`` only reads of tensors on a device are counted (a GPU run). torch CPU
tensors are never counted: in fd_guided they are host buffers by design (the pinned bitmask).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter

READ_METHODS = ("numpy", "tolist", "item", "__array__", "__int__", "__float__", "__bool__", "__index__")
_LIBRARY = "fd_guided"
_NOT_LIBRARY = ("fd_guided.harness",)


def _library_caller(frame) -> str | None:
    """The module name of the first frame outside this file, if it is the fd_guided library."""
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    if name == _LIBRARY or name.startswith(_LIBRARY + "."):
        if not name.startswith(_NOT_LIBRARY):
            return name
    return None


def _on_device(tensor) -> bool:
    place = getattr(tensor, "place", None)
    if place is not None and hasattr(place, "is_cpu_place"):
        return not (place.is_cpu_place() or place.is_cuda_pinned_place())
    device = getattr(tensor, "device", None)
    return getattr(device, "type", "cpu") != "cpu"


class HostReads:
    """Context manager: ``with HostReads() as reads: ...; reads.total``, ``reads.by_caller``."""

    def __init__(self, *, count_host_tensors: bool = True, libraries: tuple[str, ...] = ("paddle", "torch")):
        self.count_host_tensors = count_host_tensors
        self.libraries = libraries
        self.by_caller: Counter[str] = Counter()
        self._saved: list[tuple[type, str, object]] = []
        self._local = threading.local()

    @property
    def total(self) -> int:
        return sum(self.by_caller.values())

    def reset(self) -> None:
        self.by_caller.clear()

    def __enter__(self) -> HostReads:
        for library in self.libraries:
            module = sys.modules.get(library)
            cls = getattr(module, "Tensor", None) if module is not None else None
            if cls is None:
                continue
            for name in READ_METHODS:
                original = getattr(cls, name, None)
                if original is None:
                    continue
                self._saved.append((cls, name, original))
                setattr(cls, name, self._wrap(original, name, library == "torch"))
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        self._saved.clear()

    def _wrap(self, original, name: str, device_only: bool):
        counter = self

        def read(tensor, *args, **kwargs):
            depth = getattr(counter._local, "depth", 0)
            if depth == 0 and ((counter.count_host_tensors and not device_only) or _on_device(tensor)):
                caller = _library_caller(sys._getframe(1))
                if caller is not None:
                    counter.by_caller[f"{caller}:{name}"] += 1
            counter._local.depth = depth + 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                counter._local.depth = depth

        read.__name__ = name
        return read
