"""Draw a benchmark's chart again from the JSON it wrote (`--json`), without running it again.

.venv/bin/python bench/chart.py out.json [chart.png]     # default: out.png next to it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.main import footer
from harness.report import Report


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    source = Path(argv[0])
    results = json.loads(source.read_text())
    target = Path(argv[1]) if len(argv) > 1 else source.with_suffix(".png")
    Report.from_json(results["table"]).chart(
        target, footer(results["loadavg"], results.get("started", ""), results.get("command", ""))
    )
    print(f"chart written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
