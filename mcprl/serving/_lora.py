"""LoRA adapters for serving: several resident on one model, one active per forward pass.

peft's LoRA layer is built for training, and in a decoding step of a few rows its per-call work
dominates: argument checks, a cast of the input to the adapter's float32, dropout, two matrix
products, a scale, an add that promotes the result to float32 and a cast back. Over the 210
adapted projections of SmolLM2-135M that made a decoding step of 8 rows 1.4x slower than the
base model's on a 2-core CPU (154 against 109 ms). Here each adapted linear layer keeps every
resident adapter's weights in the model's dtype, transposed, with the scale folded in, and adds
`(x @ A) @ B` to the base layer's output: two matrix products and an in-place add (on CPU in
float32 under 16-bit base weights, `_adapter_dtype`).

Plain LoRA only (what mcprl trains and most adapters are): an adapter that uses DoRA, biases,
extra saved modules or per-module patterns is refused with a message that names the setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mcprl.errors import AdapterError

__all__ = ["AdapterError", "ServedAdapters"]

_PREFIX = "base_model.model."
# adapter_config.json settings this module does not implement (None, false or empty: unused)
_UNSUPPORTED = (
    "use_dora",
    "lora_bias",
    "fan_in_fan_out",
    "modules_to_save",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "alpha_pattern",
)


class LoraLinear(nn.Module):
    """A linear layer plus the active adapter's low-rank update, if any."""

    def __init__(self, base: nn.Linear, active: list[str | None]) -> None:
        super().__init__()
        self.base = base
        self.active = active  # shared by every layer of the model: [name or None]
        self.weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        pair = self.weights.get(self.active[0]) if self.active[0] is not None else None
        if pair is None:
            return out
        down, up = pair
        if down.dtype != x.dtype:  # float32 products over 16-bit activations (`_adapter_dtype`)
            x = x.to(down.dtype)
        return out.add_((x @ down) @ up)


def _adapter_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype an adapter's weights are kept and multiplied in, for a base layer's `weight`.

    On CPU, float32 under 16-bit base weights: a decoding step's LoRA products are tiny (rows
    x 576 by 576 x 8), and in bfloat16 oneDNN's per-call work made them 3-4x slower than
    float32 (47 against 17 us a layer for 20 rows on a 2-core Intel Xeon; 16.5% of a rollout's
    engine time). The sum is rounded to the base layer's dtype as peft rounds it (float32
    adapter weights, the product added to the base output in float32). Elsewhere the
    model's dtype, as before."""
    if weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return weight.dtype


class ServedAdapters:
    """The adapters resident on `model`; `use(name)` picks the one the next forward pass uses."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.active: list[str | None] = [None]

    def use(self, name: str | None) -> None:
        self.active[0] = name

    def load(self, name: str, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        config = _read_config(path)
        weights_file = path / "adapter_model.safetensors"
        if not weights_file.exists():
            raise AdapterError(f"{path} has no adapter_model.safetensors")
        tensors = load_file(str(weights_file))
        pairs = _pairs(tensors)
        if not pairs:
            raise AdapterError(f"{weights_file} holds no LoRA weights (lora_A/lora_B)")
        alpha = float(config.get("lora_alpha", 8))
        rslora = bool(config.get("use_rslora", False))
        prepared = []
        try:
            layers = {m: self._layer(m) for m in pairs}
        except AdapterError:
            self._unwrap_if_unused()
            raise
        for module_path, (a, b) in pairs.items():
            layer = layers[module_path]
            rank = a.shape[0]  # read off the weights, so a rank_pattern needs nothing more
            scale = alpha / (rank**0.5 if rslora else rank)
            weight = layer.base.weight
            dtype = _adapter_dtype(weight)
            down = a.t().to(device=weight.device, dtype=dtype).contiguous()
            up = (b.t().float() * scale).to(device=weight.device, dtype=dtype).contiguous()
            prepared.append((layer, down, up))
        for layer, down, up in prepared:
            layer.weights[name] = (down, up)

    def unload(self, name: str) -> None:
        for module in self._wrapped():
            module.weights.pop(name, None)
        if self.active[0] == name:
            self.active[0] = None
        self._unwrap_if_unused()

    def _wrapped(self) -> list[LoraLinear]:
        return [m for m in self.model.modules() if isinstance(m, LoraLinear)]

    def _layer(self, module_path: str) -> LoraLinear:
        try:
            module = self.model.get_submodule(module_path)
        except AttributeError as exc:
            raise AdapterError(
                f"the adapter has weights for {module_path!r}, which this model does not have; "
                "was it trained on another base model?"
            ) from exc
        if isinstance(module, LoraLinear):
            return module
        if not isinstance(module, nn.Linear):
            raise AdapterError(f"{module_path!r} is a {type(module).__name__}, not a linear layer")
        parent_path, _, child = module_path.rpartition(".")
        wrapped = LoraLinear(module, self.active)
        setattr(self.model.get_submodule(parent_path), child, wrapped)
        return wrapped

    def _unwrap_if_unused(self) -> None:
        """Give the model back its plain linear layers once no adapter is resident."""
        if any(m.weights for m in self._wrapped()):
            return
        for module_path, module in list(self.model.named_modules()):
            if isinstance(module, LoraLinear):
                parent_path, _, child = module_path.rpartition(".")
                setattr(self.model.get_submodule(parent_path), child, module.base)


def _read_config(path: Path) -> dict[str, Any]:
    file = path / "adapter_config.json"
    if not file.exists():
        raise AdapterError(f"{path} is not a LoRA adapter: it has no adapter_config.json")
    config = json.loads(file.read_text(encoding="utf-8"))
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise AdapterError(f"{path} is a {kind} adapter; this server serves LoRA adapters only")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: adapters with bias={config['bias']!r} are not supported")
    for key in _UNSUPPORTED:
        value = config.get(key)
        if value not in (None, False, {}, []):
            raise AdapterError(
                f"{path}: adapter_config.json sets {key}={value!r}, which this server does not "
                "support (it serves plain LoRA); serve this adapter with vLLM or peft instead"
            )
    return config


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module path in the base model: (lora_A [r, in], lora_B [out, r])}."""
    out: dict[str, list[torch.Tensor | None]] = {}
    for key, value in tensors.items():
        for index, part in enumerate((".lora_A.weight", ".lora_B.weight")):
            if key.endswith(part):
                module = key[: -len(part)].removeprefix(_PREFIX)
                out.setdefault(module, [None, None])[index] = value
                break
        else:  # embedding adapters, DoRA magnitudes, saved modules: not plain LoRA
            raise AdapterError(f"the adapter holds {key!r}, which is not a LoRA linear weight")
    missing = [m for m, (a, b) in out.items() if a is None or b is None]
    if missing:
        raise AdapterError(f"the adapter's weights lack lora_A or lora_B for {missing[0]!r}")
    return {m: (a, b) for m, (a, b) in out.items()}
