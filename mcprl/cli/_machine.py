"""Where a command's model runs: the backend, the device, the threads."""

from __future__ import annotations

import argparse
import os

from mcprl.cli._display import say
from mcprl.errors import UsageError

DTYPES = ["auto", "bfloat16", "float32"]


def open_backend(args: argparse.Namespace):
    """The backend `--backend` names: this process (`local`, the default), `vllm`, or the URL
    of `mcprl serve --train`."""
    if args.backend != "local" and args.max_batch_kv_mb != "auto":
        raise UsageError(
            f"--max-batch-kv-mb bounds the engine of this process; with --backend "
            f"{args.backend} the server decides its batch: leave the flag out"
        )
    if args.backend == "vllm":
        unsloth_before_transformers(args.trainer)
        from mcprl.backends import VLLMBackend

        quiet_libraries()
        set_threads(args)
        backend = VLLMBackend(
            args.path, vllm_url=args.vllm_url, api_key=args.api_key, sleep_mode=args.vllm_sleep,
            train_dtype=args.dtype, device=args.device, train_with=args.trainer,
        )  # fmt: skip
        where = args.vllm_url or "a `vllm serve` started here"
        say(f"  inference on vLLM ({where}), training with {backend.trainer_name} here")
        return backend
    if args.backend and args.backend != "local":
        from mcprl.backends import RemoteBackend

        if args.trainer != "auto":
            raise UsageError(
                f"--trainer {args.trainer}: a remote backend trains with its own trainer; "
                "leave --trainer out with --backend URL"
            )
        say(f"  training and inference on {args.backend} (runs kept there)")
        return RemoteBackend(args.backend, api_key=args.api_key)
    from mcprl.backends import LocalBackend
    from mcprl.training import pick_trainer

    pick_trainer(args.trainer, args.device, separate_inference=False)  # refuses unsloth here
    quiet_libraries()
    set_threads(args)
    return LocalBackend(
        args.path, inference_dtype=args.dtype, train_dtype=args.dtype, device=args.device,
        max_batch_kv_bytes=args.max_batch_kv_mb,
    )  # fmt: skip


def unsloth_before_transformers(choice: str) -> None:
    """Import Unsloth first where it may train: it patches transformers as it is imported, and
    warns that optimizations are lost when transformers came first."""
    import importlib.util

    if choice == "peft" or importlib.util.find_spec("unsloth") is None:
        return
    import torch

    if torch.cuda.is_available():
        import unsloth  # noqa: F401


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        default="local",
        metavar="local|vllm|URL",
        help="where the model is served and trained: local (this process, the default), vllm "
        "(vLLM serves, peft trains here: a GPU machine), or the URL of `mcprl serve --train` on "
        "another machine (e.g. http://gpu-box:8000); rollouts and MCP sessions stay here",
    )
    p.add_argument(
        "--api-key",
        help="the remote backend's key (default: $MCPRL_API_KEY), or with --backend vllm the "
        "vLLM server's (default: $VLLM_API_KEY); a flag is visible in `ps`",
    )
    p.add_argument(
        "--vllm-url",
        help="with --backend vllm: attach to this running vLLM server (it must read the "
        "adapters under --path at the same absolute path) instead of starting one",
    )
    p.add_argument(
        "--vllm-sleep",
        action="store_true",
        help="with --backend vllm: put vLLM to sleep while a step trains (one shared GPU)",
    )
    p.add_argument(
        "--trainer",
        default="auto",
        choices=("auto", "peft", "unsloth"),
        help="what trains the LoRA with --backend vllm: unsloth (Unsloth's FastLanguageModel, on "
        "a GPU), peft, or auto (the default: Unsloth where it is installed and the device is a "
        "GPU, else peft); the local backend always trains with peft",
    )


def kv_megabytes(text: str) -> int | str | None:
    """`--max-batch-kv-mb`: "auto", 0 (no bound) or megabytes, as the engine takes it (bytes)."""
    if text == "auto":
        return "auto"
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give megabytes (e.g. 1024), 0 for no bound, or auto"
        )
    return int(mb * 2**20) or None


def add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (a GPU where present, the default), cpu, cuda, cuda:N",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for the model (default: $MCPRL_THREADS, else one per physical core, "
        "fewer while other processes keep cores busy, more as they free up); a number fixes "
        "the count",
    )
    p.add_argument(
        "--max-batch-kv-mb",
        type=kv_megabytes,
        default="auto",
        metavar="MB",
        help="the most keys and values the engine's running batch holds, padding included, "
        "before waiting requests stop joining it: less memory, slower rollouts; 0 for no bound "
        "(default auto: 1024 on a CPU, 512 where under 16 GiB is available at start, none on a "
        "GPU)",
    )


def set_threads(args: argparse.Namespace) -> None:
    """Apply --threads (or MCPRL_THREADS) before a model loads. Without either, the engine
    sizes its threads to the cores other processes leave free (`mcprl.serving._threads`), and a
    machine already busy is named here, in one line, with the flag that fixes the count."""
    threads = args.threads
    if threads is None and os.environ.get("MCPRL_THREADS"):
        try:
            threads = int(os.environ["MCPRL_THREADS"])
        except ValueError:
            raise UsageError(
                f"MCPRL_THREADS={os.environ['MCPRL_THREADS']!r}: must be a whole number"
            ) from None
    from mcprl.serving import busy_at_start, fix_threads, start_with, threads_left

    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads {threads}: must be 1 or more")
        fix_threads(threads)
        return
    import torch

    device = getattr(args, "device", "auto")
    if device not in ("auto", "cpu") or (device == "auto" and torch.cuda.is_available()):
        return
    busy = busy_at_start()
    if busy is None:
        return
    others, cores = busy
    left = threads_left(others, cores, torch.get_num_threads())
    if left == torch.get_num_threads():
        return
    start_with(left)
    say(
        f"  this machine is busy: other processes use {others:.1f} of its {cores} cores, so "
        f"mcprl starts on {left} thread{'s' if left != 1 else ''} and takes more as they free "
        "up (--threads N fixes the count)"
    )


def quiet_libraries() -> None:
    """Loading bars and deprecation notes from transformers say nothing to a user of mcprl."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
