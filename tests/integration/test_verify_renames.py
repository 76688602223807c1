"""`cdc verify` after a column rename the follower has not got yet.

A rename reaches the log with the table's next change (or at its commit with `cdc ddl install`,
or with the stream's idle-table schema check), and the follower with its next apply after that,
so until then the Delta follower has the old column name. verify must say that (and whether the
log has the rename already), compare the values under the old name, and not call every row
different nor suggest a rebuild. A column added and one dropped in the source that the log has and
the follower has not applied make no row different either. Once applied, the follower (the new
name needs encoding in plain Delta: `v renamed` is stored as `v_x0020_renamed`) is identical.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.lake import LAKE, apply_ok, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import delta_rows
from tests.harness import cdc_here, sql, verify

pytestmark = pytest.mark.integration


def test_verify_names_a_rename_the_follower_has_not_got_yet(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE r(id int PRIMARY KEY, v text, n int)",
        "INSERT INTO r SELECT g, 'v' || g, g FROM generate_series(1, 40) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.r"], sinks=[LAKE])
    snapshot(pipe)
    apply_ok(pipe, spark)
    lake = tmp_path / "lake" / "public" / "r"

    # The rename with no change after it: the log and the follower still have `v`. One row of the
    # follower is changed by hand, so a real difference must still be found next to the rename.
    # Not streamed after the rename: a stream with nothing pending may record the catalog's columns
    # (the idle-table schema check), and then the log, not only the follower, has the new name.
    sql(pg_db, 'ALTER TABLE r RENAME COLUMN v TO "v renamed"')
    spark.sql(f"UPDATE delta.`{lake}` SET n = -1 WHERE id = 7")
    code, report = verify(pipe.file, spark)
    assert code == 1, report
    assert "column(s) the follower has under their old name: v (now v renamed)" in report, report
    assert "the table's next change" in report and "cdc ddl install" in report, report
    assert "missing 0, extra 0, different 1" in report and "different: id=7" in report, report

    # Without the hand-made difference: no row differs and no rebuild is suggested.
    spark.sql(f"UPDATE delta.`{lake}` SET n = 7 WHERE id = 7")
    code, report = verify(pipe.file, spark)
    assert code == 1, report
    assert "under their old name: v (now v renamed)" in report, report
    assert "different" not in report.replace("DIFFERENT", "") and "--rebuild" not in report, report
    assert "column(s) the follower does not have" not in report, report

    # The log gets the rename, no apply: with DDL capture, the next DDL of the table records its
    # columns (by attnum: `v renamed` is the follower's `v`) at its commit; a column added with a
    # default and one dropped come with it. The follower is matched by attnum through the log's
    # schema history: the rename is named as in the log and not applied, `tier` is not compared
    # (the apply brings it with its default), the dropped `n` is not compared (the follower keeps it).
    assert cdc_here("ddl", "install", pipe.file).code == 0
    sql(pg_db, "ALTER TABLE r ADD COLUMN tier text DEFAULT 'std'", "ALTER TABLE r DROP COLUMN n")
    stream(pipe)
    spark.sql(f"UPDATE delta.`{lake}` SET v = 'hand' WHERE id = 7")
    code, report = verify(pipe.file, spark)
    assert code == 1, report
    at = r"in the log at [0-9A-F]+/[0-9A-F]+, not applied yet\)"
    assert re.search(r"under their old name: v \(renamed in the source: v -> v renamed, " + at, report), (
        report
    )
    assert re.search(r"does not have: tier \(added in the source, " + at, report), report
    assert (
        f"`cdc apply {pipe.file} --once --sink lake` brings the rename (or wait for `cdc run`)" in report
    ), report
    assert "(now v renamed)" not in report, report  # not the message for a rename the log lacks
    assert "missing 0, extra 0, different 1" in report and "different: id=7" in report, report
    spark.sql(f"UPDATE delta.`{lake}` SET v = 'v7' WHERE id = 7")
    code, report = verify(pipe.file, spark)
    assert code == 1 and "not applied yet" in report, report
    assert "different" not in report.replace("DIFFERENT", "") and "--rebuild" not in report, report

    # The next apply brings them: the follower renames (encoded) and verifies identical.
    sql(pg_db, "UPDATE r SET \"v renamed\" = 'after' WHERE id = 1")
    stream(pipe)
    apply_ok(pipe, spark)
    rows = delta_rows(None, lake)  # delta-rs: no column mapping, the name encoded
    assert rows[("1",)]["v_x0020_renamed"] == "after" and rows[("2",)]["v_x0020_renamed"] == "v2", rows[
        ("2",)
    ]
    assert "v" not in rows[("2",)] and rows[("2",)]["tier"] == "std", rows[("2",)]
    verified(pipe, spark)
