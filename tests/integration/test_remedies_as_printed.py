"""Fix lines of the log and status paths name the pipeline file, so they run as printed (issue 23
item 2): each test takes the command out of the printed line, runs it word for word, and checks
the problem is gone."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.harness import cdc, edit_pipeline, sql, write_pipeline

pytestmark = pytest.mark.integration


def printed_command(text: str) -> list[str]:
    """The last `cdc ...` command quoted in backticks (the one that fixes it), split as a shell would."""
    found = re.findall(r"`(cdc [^`]+)`", text)
    assert found, text
    return shlex.split(found[-1])[1:]  # without the leading `cdc`


def test_log_and_status_remedies_run_as_printed(pg_db: str, tmp_path: Path) -> None:
    sql(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)",
        "INSERT INTO a VALUES (1, 'x')",
        "INSERT INTO b VALUES (1, 'y'), (2, 'z')",
    )
    file = write_pipeline(tmp_path, pg_db, ["public.a"])

    # Before any snapshot: status says the slot is missing, log read that there is no log.
    status = cdc("status", file)
    assert "slot does not exist" in status.out, status
    assert printed_command(status.out.split("slot does not exist", 1)[1].splitlines()[0]) == [
        "snapshot",
        str(file),
    ]
    missing = cdc("log", "read", file)
    assert missing.code == 4 and "error: no log at" in missing.err, missing
    follow = cdc(*printed_command(missing.err))
    assert follow.code == 0, follow
    assert cdc("log", "read", file).code == 0
    assert "slot does not exist" not in cdc("status", file).out

    # A table the file names but the log does not hold yet.
    edit_pipeline(file, lambda doc: doc["source"]["postgres"]["tables"].append("public.b"))
    absent = cdc("log", "read", file, "--table", "public.b")
    assert absent.code == 2 and "public.b is not in the log" in absent.err, absent
    assert "Traceback" not in absent.err
    follow = cdc(*printed_command(absent.err.split("fix:", 1)[1]))
    assert follow.code == 0, follow
    read = cdc("log", "read", file, "--table", "public.b")
    assert read.code == 0, read
    assert len(read.out.splitlines()) == 2  # both rows of b, from its snapshot
