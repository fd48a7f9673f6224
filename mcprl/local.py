"""`from mcprl.local import LocalBackend`: where ART's users import it from (`art.local`)."""

from __future__ import annotations

from mcprl.backends import LocalBackend

__all__ = ["LocalBackend"]
