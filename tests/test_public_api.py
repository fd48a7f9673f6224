"""The public surface: explicit `__all__`, and `import ruler` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mcprl
import ruler


@pytest.mark.parametrize("package", [ruler, mcprl], ids=lambda p: p.__name__)
def test_all_names_exist_and_nothing_public_is_unlisted(package):
    for name in package.__all__:
        assert hasattr(package, name), name
    public = {n for n in vars(package) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(package, n)).__name__ == "module"}
    unlisted = public - set(package.__all__) - modules - {"annotations"}
    assert not unlisted, f"public but not in __all__: {sorted(unlisted)}"


def test_import_ruler_does_not_import_torch_mcprl_or_litellm():
    code = (
        "import sys, ruler, ruler.cli;"
        "bad = [m for m in ('torch', 'mcprl', 'litellm', 'transformers') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
