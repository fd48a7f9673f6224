"""The served model's output layer with its weight packed once for oneDNN (CPU).

On CPU, `torch.nn.functional.linear` hands a plain weight to oneDNN, which reorders it into its
blocked layout at every call. With the few rows of a decoding step that reorder is most of the
work, and most of all for the output layer, the model's largest matrix: SmolLM2-135M's (49,152 x
576, bfloat16) took 12.6 ms a call for 8 rows, 6.4 ms with its weight reordered once
(`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`, the kernels torch's own
compiler uses for frozen CPU models). The results are the same bits: the same kernel runs on the
same numbers, only the reorder is done once.

It matters most in a prefill. The model's forward passes the output layer only each row's last
position (`logits_to_keep=1`), a strided slice of the hidden states, and for such an input the
plain bfloat16 call took 2,016 ms for 16 rows of 150 positions (one thread), against 11.7 ms for
the same rows made contiguous; the packed call takes 8.5 ms on the slice.

The output layer keeps its plain weight beside the packed copy (57 MB for SmolLM2-135M): the
embedding shares it. Every other linear layer of the model (the projections) is *swapped*
(`SwappedWeights`): while the engine decodes, only its packed weight exists, the plain weight's
memory given back; for work that reads the plain weights (a training step: the trainer shares
the served model's weights, `LoraTrainer.share_base_weights`) it is rebuilt from the packed one,
bit for bit, and packed again when decoding resumes. Packed beside their plain weights, the
projections made agent-shaped requests 1.14x faster for 0.21 GB more (RESULTS.md, "The output
layer's weight packed once"); swapped, 1.15x at no cost in memory (RESULTS.md, "The default run
under 10 minutes alone"), and a swap of SmolLM2-135M's 210 projections takes about 0.1 s each
way on a 2-core CPU. Decoding steps give the same bits as plain `linear`; prefills, whose inputs
have hundreds of rows, differ in the last bit of some values (oneDNN picks another kernel).
Where autograd would need a gradient through a layer, the plain `linear` runs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SwappedWeights", "pack_linear", "pack_output_layer", "packable"]


def packable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch can pack weights of this dtype on this device."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    return dtype != torch.bfloat16 or bool(ops._is_mkldnn_bf16_supported())


def pack_output_layer(model: nn.Module) -> int:
    """Give `model`'s output layer a packed copy of its weight (`pack_linear`). Returns the
    bytes the copy takes (0 where there is none to pack)."""
    head = model.get_output_embeddings()
    return pack_linear(head) if type(head) is nn.Linear else 0


def pack_linear(module: nn.Linear) -> int:
    """Give `module` a packed copy of its weight, used whenever no gradient is wanted. Returns
    the bytes the copy takes (0 where packing is not available, or it is packed already)."""
    weight = module.weight
    if hasattr(module, "_packed") or not packable(weight.device, weight.dtype):
        return 0
    with torch.no_grad():
        module._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)
    module.forward = _packed_forward(module)
    return weight.numel() * weight.element_size()


def _packed_forward(module: nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias, packed = module.weight, module.bias, module._packed
        wants_grad = torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        )
        if packed is None or wants_grad or x.dtype != weight.dtype or x.device != weight.device:
            if packed is not None and getattr(module, "_swapped", False):
                raise RuntimeError(
                    "this layer's plain weight is swapped out while its engine decodes; run work "
                    "that wants gradients through the served model under `Engine.run_exclusive` "
                    "or `Engine.paused()`"
                )
            return nn.functional.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


class SwappedWeights:
    """Linear layers that hold either a packed weight (for decoding) or their plain one.

    `pack()` reorders each weight for oneDNN and gives the plain weight's memory back: its
    storage is resized to nothing in place, so every tensor sharing it (a trainer's copy of the
    base weights, `LoraTrainer.share_base_weights`) lets go of it too. Reading the weight then
    is an error: the layer's forward raises where it would need it, and
    `mcprl.training.LoraTrainer` checks its shared weights before a step; other readers must
    hold the engine (`Engine.run_exclusive`, `Engine.paused()`), which swaps the plain weights
    back first. `unpack()` restores each plain weight from its packed copy (the same bits) into
    that same storage, and drops the packed copy. Only the layers this can be done for take part
    (`swappable`); the others stay as they are."""

    def __init__(self, model: nn.Module) -> None:
        counts: dict[int, int] = {}
        for _, p in model.named_parameters(remove_duplicate=False):
            key = p.untyped_storage().data_ptr()
            counts[key] = counts.get(key, 0) + 1
        self.layers = [
            m
            for m in model.modules()
            if type(m) is nn.Linear
            and swappable(m)
            and counts.get(m.weight.untyped_storage().data_ptr()) == 1
        ]
        self.packed = False

    def pack(self) -> None:
        if self.packed:
            return
        with torch.no_grad():
            for m in self.layers:
                m._packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 8)
                if not hasattr(m, "_swapped"):
                    m._swapped = True
                    m.forward = _packed_forward(m)
                m.weight.untyped_storage().resize_(0)
        self.packed = True

    def unpack(self) -> None:
        if not self.packed:
            return
        with torch.no_grad():
            for m in self.layers:
                weight = m.weight
                weight.untyped_storage().resize_(weight.numel() * weight.element_size())
                weight.copy_(m._packed.to_dense())
                m._packed = None
        self.packed = False


def swappable(module: nn.Linear) -> bool:
    """Whether `module`'s weight can be swapped for a packed one (`SwappedWeights`): packable
    here, frozen, not packed beside its plain weight already (the output layer,
    `pack_output_layer`), and the only tensor in a storage of its own, so the storage can be
    freed."""
    weight = module.weight
    return (
        packable(weight.device, weight.dtype)
        and not weight.requires_grad
        and not hasattr(module, "_packed")
        and weight.storage_offset() == 0
        and weight.is_contiguous()
        and weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
        and weight.untyped_storage().resizable()
    )
