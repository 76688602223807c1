"""Progress output for long work: a live bar on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress


class RowProgress:
    """Rows done / expected with rate and ETA. Thread-safe `advance`."""

    def __init__(self, description: str, total: int | None, *, enabled: bool = True, every_s: float = 10.0):
        self.description = description
        self.total = total
        self.done = 0
        self.detail = ""  # shown after the rows (a chunked snapshot: "chunk 3/~10")
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._tty = enabled and sys.stderr.isatty()
        self._plain = enabled and not self._tty
        self._every = every_s
        self._last_line = self.started
        self._bar: Progress | None = None
        if self._tty:
            # imported here: rich costs ~0.1 CPU-s at start, paid only when a bar is drawn
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows"),
                TextColumn("{task.fields[rate]:>12}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task(description, total=total or None, rate="")
            self._bar.start()

    def advance(self, rows: int) -> None:
        with self._lock:
            self.done += rows
            now = time.monotonic()
            rate = self.done / max(now - self.started, 1e-6)
            if self._bar is not None:
                total = max(self.total or 0, self.done)
                description = f"{self.description} {self.detail}".rstrip()
                self._bar.update(
                    self._task,
                    completed=self.done,
                    total=total,
                    rate=f"{rate:,.0f} rows/s",
                    description=description,
                )
            elif self._plain and now - self._last_line >= self._every:
                self._last_line = now
                pct = f" ({100 * self.done / self.total:.0f}% of ~{self.total:,})" if self.total else ""
                eta = ""
                if self.total and self.done < self.total and rate > 0:
                    eta = f", ETA {(self.total - self.done) / rate:,.0f}s"
                detail = f", {self.detail}" if self.detail else ""
                print(
                    f"{self.description}: {self.done:,} rows{pct}{detail}, {rate:,.0f} rows/s{eta}",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    @property
    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started, 1e-6)
