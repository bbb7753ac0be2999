"""Console output of the ``fastnsq`` command: aligned tables and a progress line."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

# ---- console rendering --------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """A plain-text table: numbers right-aligned with thousands separators, text left-aligned.

    >>> print(format_table(["NAME", "MSG/S"], [["pub", 12345.6], ["sub", 7]]))
    NAME     MSG/S
    pub     12,346
    sub          7
    """
    values = [list(row) for row in rows]
    cells = [[_cell(value) for value in row] for row in values]
    numeric = _numeric_columns(headers, values)
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in cells)])


def _numeric_columns(headers: Sequence[str], rows: list[list[Any]]) -> list[bool]:
    """Columns whose every filled cell is a number (or a number already formatted as text)."""
    result = []
    for index in range(len(headers)):
        values = [row[index] for row in rows if row[index] not in ("", "-", None)]
        result.append(bool(values) and all(_is_number(v) for v in values))
    return result


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


class ProgressLine:
    """A progress bar: one self-rewriting line on a terminal, a plain line every few seconds otherwise.

    >>> import io
    >>> progress = ProgressLine(io.StringIO(), interval=0)
    >>> progress.update("mpub", 50, 100, "1,234 msg/s")
    >>> progress.stream.getvalue()
    'mpub  [##########          ]  50%  50/100  1,234 msg/s\\n'
    """

    def __init__(self, stream: TextIO | None = None, *, interval: float | None = None, width: int = 20) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.1 if self.tty else 2.0)
        self.width = width
        self._last = float("-inf")
        self._open = False

    def update(self, label: str, done: float, total: float | None, detail: str = "", *, force: bool = False) -> None:
        """Show progress (throttled to ``interval`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        text = render_progress(label, done, total, detail, self.width)
        if self.tty:
            columns = shutil.get_terminal_size((100, 24)).columns
            self.stream.write("\r\x1b[K" + text[: max(columns - 1, 10)])
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, line: str | None = None) -> None:
        """End the bar; on a terminal the line is replaced by ``line`` (or kept)."""
        if self.tty and self._open:
            self.stream.write("\r\x1b[K" + line + "\n" if line is not None else "\n")
        elif line is not None:
            self.stream.write(line + "\n")
        self._open = False
        self._last = float("-inf")
        self.stream.flush()


def render_progress(label: str, done: float, total: float | None, detail: str = "", width: int = 20) -> str:
    """``label  [#####     ]  50%  50/100  detail`` (no bar when the total is unknown)."""
    if total:
        fraction = min(max(done / total, 0.0), 1.0)
        filled = int(fraction * width)
        bar = f"[{'#' * filled}{' ' * (width - filled)}] {fraction * 100:3.0f}%  {_cell(done)}/{_cell(total)}"
    else:
        bar = _cell(done) if done else ""
    return "  ".join(part for part in (label, bar, detail) if part)

