"""The issue's load test of `cdc serve` (make test-slow): 200 SSE subscribers while the source writes
2k changes/s for 60 s; bench/serve.py exits 1 unless every subscriber saw every event of the log
exactly once and in order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_200_subscribers_see_every_event_once(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    run = subprocess.run(
        [sys.executable, "bench/serve.py", "--subscribers", "200", "--rate", "2000", "--seconds", "60", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["exact_subscribers"] == 200 and result["all_reached_end"], result
    assert result["transactions"] > 0
