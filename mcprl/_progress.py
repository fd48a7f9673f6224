"""Progress bars that suit where the output goes.

On a terminal, tqdm's bar, redrawn in place. Anywhere else (a log file, a pipe, CI), redraws
pile up: a quick run wrote 121 KB of bars to a log. There a phase writes a line when it starts
(its name and how much it has to do, so a log shows what is under way) and one when it ends (how
much was done, the time it took and the bar's last postfix), and nothing in between.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    enabled: bool = True,
    **tqdm_kwargs: Any,
) -> Any:
    """tqdm's bar where stderr is a terminal, else a `LineBar`; nothing shown when disabled.
    Either works as a context manager, an iterator over `iterable`, and with `update`,
    `refresh`, `set_postfix_str` and `close`."""
    from tqdm.auto import tqdm

    if not enabled:
        return tqdm(iterable, total=total, desc=desc, disable=True)
    if _is_terminal():
        return tqdm(iterable, total=total, desc=desc, **tqdm_kwargs)
    return LineBar(iterable, total=total, desc=desc, unit=tqdm_kwargs.get("unit", ""))


def _is_terminal() -> bool:
    stream = sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


class LineBar:
    """A bar for a log: a line to stderr when it starts, and one when it closes."""

    def __init__(
        self, iterable: Iterable[Any] | None, *, total: int | None, desc: str, unit: str = ""
    ) -> None:
        self.iterable = iterable
        self.total = total if total is not None else _length(iterable)
        self.desc, self.unit = desc, unit
        self.n = 0
        self.postfix = ""
        self.started = time.perf_counter()
        self.closed = False
        todo = f" {self.total}{f' {unit}s' if unit else ''}" if self.total else ""
        print(f"{desc}:{todo} …", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def refresh(self) -> None:
        return None

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        unit = f" {self.unit}s" if self.unit else ""
        extra = f", {self.postfix}" if self.postfix else ""
        seconds = time.perf_counter() - self.started
        print(f"{self.desc}: {done}{unit} in {seconds:.0f} s{extra}", file=sys.stderr, flush=True)

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.n += 1
        self.close()

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _length(iterable: Iterable[Any] | None) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None
