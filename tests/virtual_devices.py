"""Two GPUs on a CPU: real tensors that remember the device they would live on.

A `VirtualDevices` mode (a torch `TorchFunctionMode`) tags every tensor it sees made or moved with a
virtual device ("cuda:0", "cuda:1", "cpu"). The arithmetic is real, on the CPU, so a run under it
gives numbers that can be compared with a plain run; but an operation that mixes tensors of two
devices raises the error CUDA raises, as do `.numpy()` and `np.asarray` of a GPU tensor, indexing a
tensor with an index tensor on another GPU, and a CPU generator drawing GPU numbers.
`tensor.device` answers the virtual device, so code that follows a tensor's device
(`x.new_zeros`, `torch.zeros(..., device=x.device)`, `.to(layer_device)`) behaves as on the GPUs.

It counts what a GPU pays for: `reads`, each GPU-to-host read, which waits for the queued work
(`.item()`, `float()`, `int()`, `bool()`, `.tolist()`, `.cpu()`, an f-string's `__format__`, `__index__`);
`uploads`, each host-to-GPU copy of more than one number (`.to("cuda")` of a host tensor, a host
index tensor indexing a GPU one); `crossings`, each copy between two GPUs. `.to("cpu", non_blocking=True)`
is queued as CUDA queues it, no read: its host tensor may be copied back to a GPU (stream-ordered
after it), but any other use before `torch.cuda.synchronize()` (a read: it waits) raises, as its values
may not have arrived. `torch.autocast("cuda")`
autocasts the CPU arithmetic as CUDA's would the GPU's (two_gpus), so half-precision training under
the harness runs as on the cards.

`place(model, devices)` spreads a model's layers the way `--device-map` does: accelerate's own hooks
(`dispatch_model`) with each module's execution device set to its virtual GPU, and its parameters
tagged there; "disk" offloads a layer as accelerate does.

Tensors made outside the mode, or by autograd (gradients are tagged as their parameter when read),
are untagged and mix with anything: the harness never raises on what a GPU would accept.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, TypeVar, cast

import torch
from accelerate import dispatch_model
from torch.overrides import TorchFunctionMode

CPU = torch.device("cpu")
ModelT = TypeVar("ModelT", bound=torch.nn.Module)
_TAG = "_virtual_device"
_MOVES = {"to", "cuda", "cpu"}
_CROSS_DEVICE = {"copy_", "__setitem__", "set_"}  # CUDA copies between devices in these
_READS = {"item", "tolist", "__float__", "__int__", "__bool__", "__complex__", "__index__", "__format__"}
_TO_NUMPY = {"numpy", "__array__"}  # np.asarray(t) calls t.__array__
_NO_MATH = {"_has_compatible_shallow_copy_type"}  # compares two tensors' types; computes nothing
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}  # CPU index tensors are allowed
_IN_FLIGHT = "_virtual_in_flight"  # on a non_blocking copy to the host: the synchronizations before it


class DeviceMismatch(RuntimeError):
    """What CUDA raises when one operation gets tensors of two devices."""


class NotArrived(RuntimeError):
    """A host tensor from a non_blocking copy used before a synchronize: on CUDA, garbage."""


def device_of(tensor: torch.Tensor) -> torch.device | None:
    return getattr(tensor, _TAG, None)


def tag(tensor: Any, device: torch.device | str | None) -> Any:
    if isinstance(tensor, (torch.Tensor, torch.Generator)) and device is not None:
        setattr(tensor, _TAG, torch.device(device))
    return tensor


def _name(func: Any) -> str:
    owner = getattr(func, "__self__", None)  # a property's __get__ / __set__
    if func.__name__ in ("__get__", "__set__") and owner is not None:
        return f"{owner.__name__}.{func.__name__}"
    return func.__name__


def _target(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a `.to(...)` call asks for, if any."""
    for value in (*args, kwargs.get("device"), kwargs.get("other")):
        if isinstance(value, torch.Tensor):
            return device_of(value) or CPU
        if isinstance(value, (str, torch.device, int)) and not isinstance(value, bool):
            return torch.device(f"cuda:{value}" if isinstance(value, int) else value)
    return None


def _real(value: Any) -> Any:
    """The CPU stand-in of a GPU device argument (`meta` stays meta: accelerate's offload uses it)."""
    if isinstance(value, (str, torch.device)) and torch.device(value).type == "cuda":
        return CPU
    return value


class VirtualDevices(TorchFunctionMode):
    """Real CPU arithmetic; device bookkeeping as on several GPUs (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.crossings = 0  # explicit moves between two GPUs (what a split model pays per forward)
        self.sites: collections.Counter[str] = collections.Counter()  # "read engine/x.py:12": how many
        self.synchronizations = 0

    def synchronize(self) -> None:
        """torch.cuda.synchronize: waits for every GPU (a read), after which every copy has arrived."""
        self.count("read")
        self.synchronizations += 1

    @property
    def reads(self) -> int:
        """GPU-to-host reads (.item(), float(), .tolist(), .cpu(), ...): each waits for the GPU."""
        return sum(n for site, n in self.sites.items() if site.startswith("read"))

    @property
    def uploads(self) -> int:
        """Host-to-GPU copies of more than one number."""
        return sum(n for site, n in self.sites.items() if site.startswith("upload"))

    def count(self, what: str) -> None:
        """One read or upload, with the engine line that made it (the innermost frame in engine/)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and "/engine/" not in frame.f_code.co_filename:
            frame = frame.f_back
        where = "elsewhere" if frame is None else (
            f"engine/{frame.f_code.co_filename.rsplit('/engine/', 1)[1]}:{frame.f_lineno}")
        self.sites[f"{what} {where}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name.endswith(".__get__") or name.endswith(".__set__"):
            return self._property(name, func, args)
        self._check_arrived(name, args, kwargs)
        if name in _MOVES:
            return self._move(name, func, args, kwargs)
        if name in _TO_NUMPY and (device_of(args[0]) or CPU).type != "cpu":
            raise TypeError(f"can't convert {device_of(args[0])} device type tensor to numpy. "
                            "Use Tensor.cpu() to copy the tensor to host memory first.")
        if name in _INDEXING:
            self._check_indices(args)
        if name in _READS and (device_of(args[0]) or CPU).type == "cuda":
            self.count("read")
        if name in _NO_MATH:
            return func(*args, **kwargs)
        if name.startswith("_foreach_"):
            return self._foreach(func, args, kwargs)
        asked = kwargs.get("device")
        if asked is not None:
            asked = torch.device(f"cuda:{asked}" if isinstance(asked, int) else asked)
            kwargs = {**kwargs, "device": _real(asked)}
        device = self._common(name, args, kwargs)
        if asked is not None:
            device = asked
        self._check_generator(kwargs, device)
        out = func(*args, **kwargs)
        if device is None and not _has_tensor((args, kwargs)):
            device = CPU  # made here from Python values or numpy: a host tensor
        if name in _CROSS_DEVICE and args:
            device = device_of(args[0])
        for tensor in tensors_in(out):
            tag(tensor, device)
        return out

    def _property(self, name: str, func, args):
        owner = name.split(".")[0]
        if owner == "device":
            return device_of(args[0]) or func(*args)
        if owner == "is_cuda":
            return (device_of(args[0]) or CPU).type == "cuda"
        if owner == "data" and name.endswith("__set__"):
            func(*args)
            tag(args[0], device_of(args[1]))
            return None
        out = func(*args)
        if owner in ("grad", "data") and isinstance(out, torch.Tensor) and device_of(out) is None:
            tag(out, device_of(args[0]))
        return out

    def _move(self, name: str, func, args, kwargs):
        source = device_of(args[0])
        target: torch.device | None
        if name == "cpu":
            target = CPU
        elif name == "cuda":
            index = args[1] if len(args) > 1 else kwargs.get("device", 0)
            target = torch.device(f"cuda:{index}" if isinstance(index, int) else index)
            args, kwargs = args[:1], {k: v for k, v in kwargs.items() if k != "device"}
            func = torch.Tensor.cpu
        else:
            target = _target(args[1:], kwargs)
            args = tuple(_real(a) if not isinstance(a, torch.Tensor) else a for a in args)
            kwargs = {k: _real(v) if k == "device" else v for k, v in kwargs.items()}
            if target is not None and len(args) > 1 and isinstance(args[1], torch.Tensor):
                args = (args[0], args[1].dtype, *args[2:])  # .to(other): other's dtype, our device
        if target is None or target == source or target.type == "meta":
            return tag(func(*args, **kwargs), source if target is None or target == source else None)
        if source is not None and source.type == "cuda" and target.type == "cuda":
            self.crossings += 1
        if source is not None and source.type == "cpu" and target.type == "cuda" and args[0].numel() > 1:
            self.count("upload")
        queued = name == "to" and bool(kwargs.get("non_blocking"))
        if source is not None and source.type == "cuda" and target.type == "cpu" and not queued:
            self.count("read")
        if name in ("cpu", "cuda"):
            out = func(*args, **kwargs).clone()
        else:
            out = func(*args, **{**kwargs, "copy": True})
        if source is not None and source.type == "cuda" and target.type == "cpu" and queued:
            setattr(out, _IN_FLIGHT, self.synchronizations)
        return tag(out, target)

    def _check_arrived(self, name: str, args, kwargs) -> None:
        """A non_blocking copy's host tensor may only go back to a GPU before a synchronize."""
        to_gpu = (name == "copy_" and args and (device_of(args[0]) or CPU).type == "cuda") or (
            name in _MOVES and ((_target(args[1:], kwargs) or CPU).type == "cuda" or name == "cuda"))
        if to_gpu:
            return
        for value in tensors_in((args, kwargs)):
            if getattr(value, _IN_FLIGHT, None) == self.synchronizations:
                raise NotArrived(f"{name} of a host tensor copied from a GPU with non_blocking=True before "
                                 "torch.cuda.synchronize(): its values may not have arrived")

    def _foreach(self, func, args, kwargs):
        """A multi-tensor op (optimizers use them) may take lists spread over devices: CUDA groups
        them by device. Only the tensors at one position must share a device."""
        lists = [a for a in args if isinstance(a, (list, tuple))]
        devices = [self._common(func.__name__, tuple(column), {}) for column in zip(*lists, strict=True)]
        out = func(*args, **kwargs)
        for tensor, device in zip(out if isinstance(out, (list, tuple)) else (), devices, strict=False):
            tag(tensor, device)
        return out

    def _common(self, name: str, args, kwargs) -> torch.device | None:
        """The one device every tagged tensor argument is on; two devices raise as CUDA does."""
        found: dict[torch.device, None] = {}
        operands = args[:1] if name in _INDEXING else args
        tensors = tensors_in((operands, kwargs))
        if name in _CROSS_DEVICE:
            tensors = tensors[:1]
        for value in tensors:
            device = device_of(value)
            if device is None or (device.type == "cpu" and value.dim() == 0):
                continue  # untagged, or a CPU scalar (CUDA takes those)
            found[device] = None
        if len(found) > 1:
            first, second = list(found)[:2]
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{first} and {second}! (in {name})"
            )
        return next(iter(found), None)

    def _check_indices(self, args) -> None:
        """Index tensors on the host or on the indexed tensor's GPU, as CUDA wants them; a host index
        of a GPU tensor is copied up (an upload)."""
        indexed = device_of(args[0]) if args else None
        if indexed is None or len(args) < 2:
            return
        for index in tensors_in(args[1]):
            where = device_of(index)
            if where is None:
                continue
            if where.type != "cpu" and where != indexed:
                raise DeviceMismatch(f"indices should be either on cpu or on the same device as the indexed "
                                     f"tensor ({indexed})")
            if where.type == "cpu" and indexed.type == "cuda" and index.numel() > 1:
                self.count("upload")

    @staticmethod
    def _check_generator(kwargs: dict, device: torch.device | None) -> None:
        generator = kwargs.get("generator")
        if generator is None or device is None:
            return
        wanted = device_of(generator) or generator.device
        if wanted.type != device.type:
            raise RuntimeError(f"Expected a '{device.type}' device type for generator but found '{wanted.type}'")


def _has_tensor(tree: Any) -> bool:
    return bool(tensors_in(tree))


def tensors_in(tree: Any, found: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result (in tuples, lists and dicts, as ops take them), in
    order: torch's general pytree walk took most of the harness's time (every op walks its
    arguments twice)."""
    found = [] if found is None else found
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            tensors_in(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            tensors_in(item, found)
    return found


def place(model: ModelT, devices: Sequence[str], offload_dir: Any = None,
          embedding: str | None = None, head: str | None = None) -> ModelT:
    """Layers i on devices[i] ("cuda:0", "cuda:1", "disk"), the embedding on the first GPU (or on
    `embedding`: "disk" offloads it) and the final norm and head on the last (or on `head`), as
    accelerate's balanced map puts them; accelerate's hooks move activations between them. A
    "disk" layer computes on the first GPU, as accelerate runs an offloaded module."""
    from engine.models.anatomy import LayerStack

    stack = LayerStack(model)
    gpus = [d for d in devices if d != "disk"]
    layers = stack.spec.layers
    virtual: dict[str, str] = {}
    top = layers.rsplit(".", 1)[0]  # e.g. "model" for "model.layers"
    body = model.get_submodule(top)
    for name, _ in body.named_children():
        if f"{top}.{name}" != layers:
            first = embedding or gpus[0]
            virtual[f"{top}.{name}"] = first if "emb" in name or "wte" in name or "wpe" in name else head or gpus[-1]
    for name, _ in model.named_children():
        if name != top.split(".")[0]:
            virtual[name] = head or gpus[-1]
    for index, device in enumerate(devices):
        virtual[f"{layers}.{index}"] = device
    real = {name: ("disk" if device == "disk" else "cpu") for name, device in virtual.items()}
    quiet = logging.getLogger("accelerate.big_modeling")  # it calls CPU-mapped modules offloaded
    level, quiet.level = quiet.level, logging.ERROR
    try:
        # dispatch_model hooks the model it is given and returns that same model
        model = cast(ModelT, dispatch_model(model, real, offload_dir=offload_dir, force_hooks=True))
    finally:
        quiet.setLevel(level)
    placed = {"": gpus[0], **virtual}  # the model's own hook: accelerate's main device, the first GPU of the map
    for name, device in placed.items():
        module = model.get_submodule(name)
        execution = torch.device(gpus[0] if device == "disk" else device)
        for sub in module.modules() if name else (module,):
            hook = getattr(sub, "_hf_hook", None)
            for part in getattr(hook, "hooks", (hook,)):
                if part is not None and hasattr(part, "execution_device"):
                    part.execution_device = execution
        if device != "disk" and name:
            for tensor in (*module.parameters(), *module.buffers()):
                tag(tensor, execution)
    model.hf_device_map = {  # type: ignore[assignment]  # torch types Module.__setattr__ for tensors and modules only
        name: (int(d.split(":")[1]) if d.startswith("cuda:") else d) for name, d in virtual.items()}
    return model


class VirtualGenerator(torch.Generator):
    """`torch.Generator(device="cuda:1")` on a CPU build: a CPU generator that says it is cuda:1."""

    def __new__(cls, device: Any = "cpu") -> VirtualGenerator:
        generator = super().__new__(cls, "cpu")  # type: ignore[call-arg]  # torch's stubs omit Generator's device
        tag(generator, device)
        return generator

    def __init__(self, device: Any = "cpu") -> None:
        pass


class VirtualAutocast(torch.autocast):
    """`torch.autocast("cuda", dtype)` on a CPU build: the CPU arithmetic autocast to `dtype`, as
    CUDA's autocast would the GPU's (without it, autocast("cuda") does nothing to CPU tensors)."""

    def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
        super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)


class _FakeEvent:
    """torch.cuda.Event on the CPU: elapsed_time from perf_counter."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.time = 0.0

    def record(self, stream: Any = None) -> None:
        import time

        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.time - self.time) * 1000.0


@contextlib.contextmanager
def two_gpus(monkeypatch, free: int = 16 * 2**30, capability: tuple[int, int] = (8, 0)) -> Iterator[VirtualDevices]:
    """torch believes it has two GPUs (count, capability, free memory, synchronize, events), and the
    VirtualDevices mode keeps each tensor's device; inside, experiments run as on two cards."""
    cuda = torch.cuda
    mode = VirtualDevices()
    fakes = {
        "is_available": lambda: True, "device_count": lambda: 2, "synchronize": lambda device=None: mode.synchronize(),
        "get_device_capability": lambda device=None: capability,
        "is_bf16_supported": lambda *a, **k: capability >= (8, 0),
        "mem_get_info": lambda device=None: (free, 2 * free), "memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0, "max_memory_allocated": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None, "empty_cache": lambda: None,
        "set_device": lambda device: None, "current_device": lambda: 0, "Event": _FakeEvent,
        "current_stream": lambda device=None: None,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(cuda, name, fake)
    monkeypatch.setattr(torch, "Generator", VirtualGenerator)
    monkeypatch.setattr(torch, "autocast", VirtualAutocast)
    make_parameter = torch.nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):  # accelerate re-wraps moved weights
        return tag(make_parameter(cls, data, requires_grad), None if data is None else device_of(data))

    monkeypatch.setattr(torch.nn.Parameter, "__new__", staticmethod(parameter))
    with mode:
        yield mode
