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

Only the output layer is packed: a copy of every projection too (0.21 GB more for SmolLM2-135M)
made agent-shaped requests 1.14x faster again, against 57 MB for the output layer's 1.28x
(RESULTS.md, "The output layer's weight packed once"). The plain weight stays: the embedding
shares it, and the trainer reads the served model's weights (`LoraTrainer.share_base_weights`).
Where autograd would need a gradient through the layer, the plain `linear` runs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["pack_linear", "pack_output_layer", "packable"]


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
        weight, bias = module.weight, module.bias
        wants_grad = torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        )
        if wants_grad or x.dtype != weight.dtype or x.device != weight.device:
            return nn.functional.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, module._packed, bias, "none", [], "")

    return forward
