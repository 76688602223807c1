"""The example systemd units in examples/systemd (issue 34 item 5; docs/run-continuously.md,
"Running under systemd") pass `systemd-analyze verify`. No systemd runs here: verify loads the units offline
from a throw-away root (--root) holding them, the executables they start and the distribution's
own units (for the default dependencies), without man pages or generators."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.unit

UNITS = REPO / "examples" / "systemd"
INSTANCES = [
    f.name.replace("@.", "@shop.") for f in sorted(UNITS.iterdir()) if f.suffix in (".service", ".timer")
]


def verify(root: Path, *units: str) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: scripts/setup.sh installs it (Debian package systemd)"
    return subprocess.run(
        [tool, "verify", "--man=no", "--generators=no", f"--root={root}", *units],
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS.iterdir():
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    # what the units start, where they say (verify checks each ExecStart is an executable file)
    (root / "opt/pgcdc/.venv/bin").mkdir(parents=True)
    shutil.copy(REPO / ".venv/bin/cdc", root / "opt/pgcdc/.venv/bin/cdc")
    (root / "bin").mkdir()
    shutil.copy("/bin/sh", root / "bin/sh")
    (root / "usr/lib/systemd").mkdir(parents=True)
    (root / "usr/lib/systemd/system").symlink_to("/lib/systemd/system")  # sysinit.target and friends
    return root


def test_the_example_units_verify(tmp_path: Path) -> None:
    assert {"pgcdc-run@shop.service", "pgcdc-health@shop.timer", "pgcdc-stream@shop.service"} <= set(
        INSTANCES
    )
    done = verify(make_root(tmp_path), *INSTANCES)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check can fail: a misspelt key is reported, a missing executable fails it."""
    root = make_root(tmp_path)
    unit = root / "etc/systemd/system/pgcdc-run@.service"
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    done = verify(root, "pgcdc-run@shop.service")
    assert "Unknown key 'Restrat'" in done.stdout + done.stderr, done
    (root / "opt/pgcdc/.venv/bin/cdc").unlink()
    done = verify(root, "pgcdc-run@shop.service")
    assert done.returncode != 0 and "is not executable" in done.stdout + done.stderr, done


def test_the_units_use_the_documented_pieces() -> None:
    run = (UNITS / "pgcdc-run@.service").read_text()
    assert "EnvironmentFile=/etc/pgcdc/%i.env" in run and "Restart=on-failure" in run
    assert "--metrics-port ${CDC_METRICS_PORT}" in run
    assert "/healthz" in (UNITS / "pgcdc-health@.service").read_text()
    page = (REPO / "docs" / "run-continuously.md").read_text()
    for unit in UNITS.iterdir():
        assert f"examples/systemd/{unit.name}" in page or unit.name in page, (
            f"the docs do not show {unit.name}"
        )
