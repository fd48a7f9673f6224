"""Shared test set-up.

A network guard makes any connection or DNS look-up to a non-loopback host fail at once, so no
test can reach a remote LLM provider (or a model hub) by accident. Loopback endpoints that tests
start themselves stay reachable. The judge cache goes to a per-session temporary directory.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile

import pytest

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["RULER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ruler-test-cache-")
for _key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "GEMINI_API_KEY"):
    os.environ.pop(_key, None)


class RemoteCallBlocked(ConnectionRefusedError):
    """A test tried to reach a host other than this machine."""


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "", None}


def _is_local_host(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _check(address: object) -> None:
    if isinstance(address, tuple) and address and not _is_local_host(address[0]):
        raise RemoteCallBlocked(
            f"tests may not reach {address[0]}:{address[1] if len(address) > 1 else ''}; "
            "only loopback endpoints started by the test are allowed (no remote LLM calls)"
        )


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self, address):
    _check(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    _check(address)
    return _real_connect_ex(self, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    if not _is_local_host(host):
        raise socket.gaierror(socket.EAI_NONAME, f"network guard: {host!r} is not loopback")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
socket.getaddrinfo = _guarded_getaddrinfo


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def mcp1_python() -> str:
    """A Python interpreter with the 1.x MCP SDK, to run example servers on the old SDK.

    Built once into a cache directory (pip from the package index), then reused.
    """
    import subprocess
    import sys
    from pathlib import Path

    root = Path(os.environ.get("MCPRL_TEST_CACHE", Path.home() / ".cache" / "mcprl-tests"))
    venv = root / "mcp1-venv"
    python = venv / "bin" / "python"
    marker = venv / ".ready"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "mcp>=1.20,<2"],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        marker.write_text("ok")
    return str(python)


@pytest.fixture(scope="session")
def policy_server(tmp_path_factory):
    """The real default model (SmolLM2-135M) behind mcprl's server, shared by every test.

    It loads adapters over HTTP from the tests' temporary directories only."""
    from mcprl.serving import LocalServer

    with LocalServer("smollm2-135m", adapter_dirs=[tmp_path_factory.getbasetemp()]) as server:
        yield server
