"""What a CUDA build of vLLM needs to build its engine config on a machine without a GPU.

``EngineArgs.create_engine_config()`` imports the model's class to learn what it is (hybrid,
multimodal, attention-free: ``vllm/model_executor/models/registry.py``, ``_ModelInfo``). Those
modules import vLLM's compiled extensions, call ``torch.ops._C.*`` at import time and register
fake implementations of ops the extensions would have defined. None of that runs on a CPU
machine, and none of it decides anything about the config. :func:`install` makes it importable:

- a compiled extension (``vllm._C``, ``vllm._moe_C``, ``vllm.vllm_flash_attn._vllm_fa3_C``, ...)
  imports as an empty module;
- an op missing from one of vLLM's private op namespaces (``torch.ops._C``, ``_moe_C``, ...)
  is a function answering ``False`` ("this kernel is not supported here"), so a module-level
  capability probe takes its fallback branch;
- ``torch.library.register_fake`` for an op that does not exist is skipped.

:func:`platform` is the release's own platform class (``CudaPlatform``, ``RocmPlatform``) with
the device queries answered from the case: capability, name, count and memory. Everything else
(``check_and_update_config``, attention backend defaults, ``support_static_graph_mode``) is the
release's code.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

# A compiled extension's module name: a leading underscore and a ``C`` part (``_C``,
# ``_C_stable_libtorch``, ``_moe_C``, ``_vllm_fa2_C``, ``_qutlass_C``, ``_flashmla_C``).
_EXTENSION = re.compile(r"^vllm\.(?:.+\.)?_[A-Za-z0-9_]*C(?:_[A-Za-z0-9_]+)?$")
# The device each platform stands for, where a case names only a capability.
DEVICE_NAMES = {
    "cuda": {
        "8.0": "NVIDIA A100-SXM4-80GB",
        "8.9": "NVIDIA L40S",
        "9.0": "NVIDIA H100 80GB HBM3",
        "10.0": "NVIDIA B200",
        "12.0": "NVIDIA RTX PRO 6000 Blackwell",
    },
    "rocm": {"9.4": "AMD Instinct MI300X", "9.5": "AMD Instinct MI355X"},
}
PLATFORM_CLASSES = {
    "cuda": ("vllm.platforms.cuda", "CudaPlatform"),
    "rocm": ("vllm.platforms.rocm", "RocmPlatform"),
}


class _Extensions(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds vLLM's compiled extensions before the real finder does; each is an empty module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _EXTENSION.match(fullname):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_INSTALLED: list[bool] = []


def install() -> None:
    """Make a CUDA build of vLLM's model modules importable here (see the module's text).
    Idempotent; call it before anything imports ``vllm.platforms.cuda``."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    sys.meta_path.insert(0, _Extensions())

    import torch._ops as ops
    import torch.library as library

    real_getattr = ops._OpNamespace.__getattr__

    def lenient_getattr(self: Any, op_name: str) -> Any:
        try:
            return real_getattr(self, op_name)
        except (AttributeError, RuntimeError):
            if self.name.startswith("_") and not op_name.startswith("__"):
                return _unsupported
            raise

    ops._OpNamespace.__getattr__ = lenient_getattr  # type: ignore[method-assign]
    real_register_fake = library.register_fake

    def register_fake(op: Any, fn: Callable[..., Any] | None = None, /, **kw: Any) -> Any:
        def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
            with contextlib.suppress(RuntimeError):  # the op's extension is not loaded here
                real_register_fake(op, f, **kw)
            return f

        return wrap(fn) if fn is not None else wrap

    library.register_fake = register_fake  # type: ignore[assignment]


def _unsupported(*_args: Any, **_kwargs: Any) -> bool:
    return False


# vllm/platforms/rocm.py reads the GPU's architecture once, at import (``_GCN_ARCH``), through
# amdsmi or torch.cuda; the stand-in is the MI300X's (compute capability 9.4).
_ROCM_ARCH = "gfx942:sramecc+:xnack-"


def _import_platform(module_name: str, class_name: str) -> Any:
    if module_name in sys.modules or not module_name.endswith(".rocm"):
        return __import__(module_name, fromlist=[class_name])
    import torch.cuda

    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *_a, **_k: types.SimpleNamespace(  # type: ignore[assignment]
        gcnArchName=_ROCM_ARCH, name="AMD Instinct MI300X", total_memory=192 << 30
    )
    try:
        return __import__(module_name, fromlist=[class_name])
    finally:
        torch.cuda.get_device_properties = real  # type: ignore[assignment]


def platform(name: str, capability: str, device_count: int = 1024) -> Any:
    """An instance of the release's ``name`` platform class whose device queries answer
    ``capability`` ("9.0"), the device that has it, ``device_count`` devices and 80 GiB each.
    The default count is a node with enough devices for any layout (turnout is not told the
    node's size; a layout wider than a node is a multi-node deployment, which vLLM allows).

    Raises:
        KeyError: a platform other than cuda or rocm (the others' classes need their own
            runtimes: XPU's, TPU's tpu-inference).
    """
    module_name, class_name = PLATFORM_CLASSES[name]
    module = _import_platform(module_name, class_name)
    base = getattr(module, class_name)
    from vllm.platforms.interface import DeviceCapability

    major, minor = (int(p) for p in capability.split("."))
    device_name = DEVICE_NAMES.get(name, {}).get(capability, f"{name} device {capability}")

    class StandIn(base):  # type: ignore[misc, valid-type]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(major, minor)

        @classmethod
        def has_device_capability(cls, capability: Any, device_id: int = 0) -> bool:
            if isinstance(capability, tuple):
                return (major, minor) >= capability
            return major * 10 + minor >= int(capability)

        @classmethod
        def is_device_capability(cls, capability: Any, device_id: int = 0) -> bool:
            if isinstance(capability, tuple):
                return (major, minor) == capability
            return major * 10 + minor == int(capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return device_name

        @classmethod
        def device_count(cls) -> int:
            return device_count

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 << 30

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

    StandIn.__name__ = StandIn.__qualname__ = f"{class_name}StandIn"
    return StandIn()
