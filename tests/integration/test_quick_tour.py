"""The README's quick tour, run by bash as written: every command of its shell block, in a
directory of its own (the tour's `.venv` is the repository's), must exit 0 and print what the
comments promise. The getting-started page carries the same block; both must stay the same."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipelines.devservices.postgres import LocalPostgres
from tests.harness import REPO


def tour_block(page: Path) -> str:
    """The first ```sh block after the page's "Quick tour" heading."""
    text = page.read_text()
    after = text[re.search(r"^#+ Quick tour.*$", text, re.M).end() :]  # type: ignore[union-attr]
    return re.search(r"```sh\n(.*?)```", after, re.S).group(1)  # type: ignore[union-attr]


def test_readme_and_getting_started_carry_the_same_tour() -> None:
    assert tour_block(REPO / "README.md") == tour_block(REPO / "docs" / "getting-started.md")


def test_quick_tour_runs_as_written() -> None:
    block = tour_block(REPO / "README.md")
    # not pytest's tmp: the dev server runs as the postgres user, who must reach .cdc/dev
    home = Path(tempfile.mkdtemp(prefix="cdc-test-tour-"))
    home.chmod(0o755)
    (home / ".venv").symlink_to(REPO / ".venv")
    try:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail -x\n" + block],
            cwd=home,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        if (home / ".cdc" / "dev" / "postgres").exists():  # a tour that failed before `dev down`
            LocalPostgres(home / ".cdc" / "dev" / "postgres").stop()
        shutil.rmtree(home, ignore_errors=True)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "all checks passed" in out, out
    assert "verify: all followers identical to the source" in out, out
    # `cdc sql` prints the Delta table's two rows; `cdc log read` their change events
    assert re.search(r"^1\ta\t", out, re.M) and re.search(r"^2\tb\t", out, re.M), out
    assert len(re.findall(r'^\{"before":null,"after":\{"id":\d,"v":"\w"\}.*"op":"c"', out, re.M)) == 2, out
