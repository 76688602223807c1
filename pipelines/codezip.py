"""The project's Python code as one zip for Spark executors (`--py-files`, `addPyFile`): used by
`cdc package spark` (pipelines/package.py) and by the driver on a real cluster (pipelines/spark.py
ship_code), so neither imports the other."""

from __future__ import annotations

import importlib
import zipfile
from pathlib import Path

PACKAGES = ("cdc", "snapshot", "sinks", "pipelines")  # every import of the apply job stays inside these
ZIP_NAME = "pgcdc.zip"
# Caches, and compiled speedups (Python cannot import an extension module from a zip; the pure
# Python fallback runs on executors)
SKIP = {".pyc", ".pyo", ".so", ".c"}


def write_zip(path: Path) -> Path:
    """The packages' files (sources and data such as Lua scripts; no caches) in one zip, written
    to a temp name first so a reader never sees half a zip."""
    part = path.with_name(path.name + ".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as out:
        for name in PACKAGES:
            root = Path(importlib.import_module(name).__file__ or "").parent
            for file in sorted(root.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts and file.suffix not in SKIP:
                    out.write(file, Path(name) / file.relative_to(root))
    part.replace(path)
    return path
