"""``cpu_offload_gb``: keep the weights of some decoder layers in host memory and stream them to
the compute device for every forward of those layers (vLLM's ``--cpu-offload-gb``, applied
from outside the model as gpt-fast applies its features).

What it means, on every platform:

- Layers are taken in order (layer 0 first) until their parameter bytes reach
  ``cpu_offload_gb`` GiB (the last layer taken may go past it; whole layers only).
- Their parameters move to a *host store*: CPU tensors, page-locked (pinned) when CUDA exists,
  so the copy to the GPU is asynchronous on the current stream.
- The layer keeps only ``meta`` placeholders: between forwards it holds no weight memory on
  the compute device.
- A pre-forward hook copies the host tensors to the compute device into fresh tensors
  (``non_blocking`` from pinned memory on CUDA; a real copy on CPU too, so the compute never
  reads the host store directly); a post-forward hook drops them again.

:class:`OffloadStats` counts layers, bytes offloaded and every transfer, which is what tests
check (with the identity of the storages: the tensors a forward uses are never the host
store's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

GIB = 1 << 30


@dataclass
class OffloadStats:
    """What was offloaded and how much was streamed since."""

    num_offloaded_layers: int = 0
    offloaded_bytes: int = 0
    num_transfers: int = 0  # layer forwards that streamed their weights in
    transferred_bytes: int = 0
    pinned: bool = False
    host_store: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of layers (``model.layers`` of a decoder, ``model.decoder.layers`` of
    OPT, ``encoder.layer`` of BERT).

    Raises:
        ValueError: the model has no recognisable layer stack.
    """
    for path in ("model.layers", "model.decoder.layers", "encoder.layer", "layers"):
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__} has no layer stack to offload")


def apply_cpu_offload(
    model: nn.Module, cpu_offload_gb: float, device: torch.device
) -> OffloadStats:
    """Offload layers' weights to host memory (see the module docstring).

    Raises:
        ValueError: ``cpu_offload_gb`` is negative, or the model has no layer stack.
    """
    if cpu_offload_gb < 0:
        raise ValueError(f"cpu_offload_gb must be >= 0, got {cpu_offload_gb}")
    stats = OffloadStats(pinned=torch.cuda.is_available())
    budget = int(cpu_offload_gb * GIB)
    if budget == 0:
        return stats
    for index, layer in enumerate(decoder_layers(model)):
        if stats.offloaded_bytes >= budget:
            break
        _offload_layer(f"layers.{index}", layer, device, stats)
    return stats


def _offload_layer(
    prefix: str, layer: nn.Module, device: torch.device, stats: OffloadStats
) -> None:
    entries: list[tuple[nn.Module, str, torch.Tensor]] = []
    for name, param in list(layer.named_parameters()):
        owner = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
        pname = name.rpartition(".")[2]
        host = param.detach().to("cpu", copy=True)
        if stats.pinned:
            host = host.pin_memory()
        stats.host_store[f"{prefix}.{name}"] = host
        stats.offloaded_bytes += host.numel() * host.element_size()
        owner._parameters[pname] = _placeholder(param)
        entries.append((owner, pname, host))
    stats.num_offloaded_layers += 1
    layer_bytes = sum(h.numel() * h.element_size() for _, _, h in entries)

    def stream_in(module: nn.Module, args: Any) -> None:
        for owner, pname, host in entries:
            # .to() of a CPU tensor to CPU would alias it: copy explicitly there.
            fresh = host.to(device, non_blocking=True) if device.type != "cpu" else host.clone()
            owner._parameters[pname] = nn.Parameter(fresh, requires_grad=False)
        stats.num_transfers += 1
        stats.transferred_bytes += layer_bytes

    def drop(module: nn.Module, args: Any, output: Any) -> None:
        for owner, pname, host in entries:
            owner._parameters[pname] = _placeholder(host)

    layer.register_forward_pre_hook(stream_in)
    layer.register_forward_hook(drop)


def _placeholder(like: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(torch.empty_like(like, device="meta"), requires_grad=False)


def resident_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters held on their device (meta placeholders excluded;
    tied parameters counted once)."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if param.is_meta or id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size()
    return total


__all__ = ["GIB", "OffloadStats", "apply_cpu_offload", "decoder_layers", "resident_parameter_bytes"]
