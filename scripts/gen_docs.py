"""Write the reference pages generated from the code: docs/reference/cli.md (click commands),
pipeline-file.md (pydantic models), types.md (cdc/typetable.py). Run from the repository root:

    .venv/bin/python scripts/gen_docs.py          # write the pages
    .venv/bin/python scripts/gen_docs.py --check  # exit 1 naming the pages that are out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages, not an installed copy

from pipelines.docgen import REFERENCE, pages  # noqa: E402


def stale() -> list[Path]:
    return [
        ROOT / REFERENCE / name for name, make in pages().items() if _read(ROOT / REFERENCE / name) != make()
    ]


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a page is out of date")
    args = parser.parse_args()
    if args.check:
        old = stale()
        for path in old:
            print(f"out of date: {path.relative_to(ROOT)}")
        return 1 if old else 0
    (ROOT / REFERENCE).mkdir(parents=True, exist_ok=True)
    for name, make in pages().items():
        path = ROOT / REFERENCE / name
        text = make()
        if _read(path) != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
