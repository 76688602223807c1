"""The side-by-side result of a benchmark: one row per measurement, printed as a rich table, kept in
the JSON file, and drawn as a PNG bar chart (one panel per part, since units differ).

Each row has a role: `cdc` (what we measure), `ceiling` (PostgreSQL's own tool, the most a client
could get), `peer` (another product doing the same job) or `diag` (a diagnostic variant of ours)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COLORS = {"cdc": "#1f77b4", "ceiling": "#8c8c8c", "peer": "#ff7f0e", "diag": "#9ecae1"}
LABELS = {"cdc": "cdc", "ceiling": "ceiling", "peer": "peer", "diag": "diagnostic"}


def fmt_int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:,.1f} MB"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def fmt_value(value: float) -> str:
    """A rate as an integer with separators; a small figure (seconds) with its decimals."""
    return f"{value:.2f}" if value < 10 else f"{value:,.1f}" if value < 100 else fmt_int(value)


@dataclass
class Row:
    part: str  # the chart panel, e.g. "stream"
    name: str  # e.g. "cdc stream"
    value: float  # what the chart draws: a rate, more is better
    unit: str  # e.g. "events/s"
    role: str = "cdc"
    ratio: float | None = None  # value / the part's reference (ceiling or peer)
    cells: dict[str, str] = field(default_factory=dict)  # the table's other columns
    notes: str = ""
    less_is_better: bool = False  # a time (freshness), not a rate


class Report:
    def __init__(self, title: str, columns: tuple[str, ...] = ()):
        self.title = title
        self.columns = columns  # the table's columns between "rate" and "notes"
        self.rows: list[Row] = []
        self.subtitle = ""
        self.summary: list[str] = []  # lines printed under the table
        self.targets: dict[str, tuple[float, str]] = {}  # part -> (value, label): a dashed line in its panel

    def add(
        self,
        part: str,
        name: str,
        value: float,
        unit: str,
        *,
        role: str = "cdc",
        ratio: float | None = None,
        notes: str = "",
        less_is_better: bool = False,
        **cells: str,
    ) -> None:
        cells = {k.replace("_", " "): v for k, v in cells.items()}
        unknown = set(cells) - set(self.columns)
        if unknown:
            raise ValueError(f"columns {sorted(unknown)} are not in the report's {self.columns}")
        self.rows.append(Row(part, name, value, unit, role, ratio, cells, notes, less_is_better))

    def ratio_text(self, row: Row) -> str:
        """Against a peer as a factor (4.36x), against a ceiling as a share (80%)."""
        if row.ratio is None:
            return "-"
        peer = any(r.role == "peer" for r in self.rows if r.part == row.part)
        return f"{row.ratio:.2f}x" if peer else fmt_pct(row.ratio)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "subtitle": self.subtitle,
            "columns": list(self.columns),
            "rows": [asdict(r) for r in self.rows],
            "summary": self.summary,
            "targets": self.targets,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        """The report a run wrote under "table" (to draw its chart again: bench/chart.py)."""
        rep = cls(doc["title"], tuple(doc["columns"]))
        rep.subtitle, rep.summary = doc["subtitle"], doc["summary"]
        rep.rows = [Row(**r) for r in doc["rows"]]
        rep.targets = {k: (v[0], v[1]) for k, v in doc["targets"].items()}
        return rep

    def print(self, footer: str) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(
            title=self.title,
            caption=f"{self.subtitle}; {footer}",
            title_justify="left",
            caption_justify="left",
        )
        table.add_column("measurement")
        table.add_column("rate", justify="right")
        table.add_column("vs ref.", justify="right")
        for name in self.columns:
            table.add_column(name, justify="right")
        table.add_column("notes")
        for r in self.rows:
            table.add_row(
                f"{r.part}: {r.name}",
                f"{fmt_value(r.value)} {r.unit}",
                self.ratio_text(r),
                *(r.cells.get(c, "") for c in self.columns),
                r.notes,
            )
        console = Console(width=max(shutil.get_terminal_size().columns, 160))
        console.print(table)
        for line in self.summary:
            console.print(line, highlight=False)

    def chart(self, path: Path, footer: str) -> None:
        """Horizontal bars, one panel per part, each bar labelled with its rate (and ratio)."""
        import matplotlib

        matplotlib.use("Agg")  # no display: write the file only
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter

        parts = list(dict.fromkeys(r.part for r in self.rows))
        heights = [len([r for r in self.rows if r.part == p]) for p in parts]
        fig, axes = plt.subplots(
            len(parts),
            1,
            figsize=(10, 1.2 + 0.55 * sum(heights) + 0.5 * len(parts)),
            gridspec_kw={"height_ratios": heights},
            squeeze=False,
        )
        for ax, part in zip(axes[:, 0], parts, strict=True):
            rows = [r for r in self.rows if r.part == part][::-1]  # first row on top
            bars = ax.barh(
                [r.name for r in rows], [r.value for r in rows], color=[COLORS[r.role] for r in rows]
            )
            top = max(r.value for r in rows) or 1
            if part in self.targets:
                value, text = self.targets[part]
                ax.axvline(value, color="#d62728", linestyle="--", linewidth=1)
                ax.text(value, len(rows) - 0.5, f" {text}", color="#d62728", fontsize=8, va="bottom")
                top = max(top, value)
            ax.set_xlim(0, top * 1.45)  # room for the labels right of the longest bar
            for bar, r in zip(bars, rows, strict=True):
                label = f" {fmt_value(r.value)}" + (
                    f"  ({self.ratio_text(r)})" if r.ratio is not None else ""
                )
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=9)
            better = "less" if rows[0].less_is_better else "more"
            ax.set_title(f"{part} ({rows[0].unit}, {better} is better)", loc="left", fontsize=10)
            ax.tick_params(axis="y", labelsize=9)
            ax.tick_params(axis="x", labelsize=8)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
            ax.spines[["top", "right"]].set_visible(False)
        fig.suptitle(f"{self.title}\n{self.subtitle}\n{footer}", fontsize=10, x=0.01, ha="left")
        roles = [k for k in COLORS if any(r.role == k for r in self.rows)]
        fig.legend(
            [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in roles],
            [LABELS[k] for k in roles],
            loc="upper right",
            fontsize=8,
            ncols=len(roles),
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
