"""The documentation site builds in strict mode (mkdocs.yml): a link to a missing page or anchor,
a page left out of the nav, or a nav entry without its page fails, as `make docs` would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "metrics" / "index.html").exists()


def test_readme_links_every_docs_page() -> None:
    """The README is the way in: each page of the site is linked from it."""
    readme = (ROOT / "README.md").read_text()
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "docs").rglob("*.md"))
        if str(p.relative_to(ROOT)) not in readme
    ]
    assert not missing, f"README.md does not link {missing}"


def test_the_declare_a_pipeline_example_is_a_valid_pipeline_file(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    import yaml

    from sinks.registry import parse_pipeline

    monkeypatch.setenv("SHOP_DSN", "dbname=shop")
    page = (ROOT / "docs" / "declare-a-pipeline.md").read_text()
    example = re.findall(r"```yaml\n(.*?)```", page, flags=re.S)[0]
    pipeline = parse_pipeline(yaml.safe_load(example), "docs/declare-a-pipeline.md")
    assert [s.name for s in pipeline.sinks] == ["lake", "search", "cache"]
