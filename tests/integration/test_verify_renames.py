"""`cdc verify` after a column rename the follower has not got yet (issue 33 item 8).

A rename reaches the log with the table's next change (or at its commit with `cdc ddl install`),
so until then the Delta follower has the old column name. verify must say that, compare the
values under the old name, and not call every row different nor suggest a rebuild; once a change
brings the rename, the follower (the new name needs encoding in plain Delta: `v renamed` is stored
as `v_x0020_renamed`) is identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.lake import LAKE, apply_ok, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import delta_rows
from tests.harness import sql, verify

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

    # The table's next change brings the rename: the follower renames (encoded) and verifies identical.
    sql(pg_db, "UPDATE r SET \"v renamed\" = 'after' WHERE id = 1")
    stream(pipe)
    apply_ok(pipe, spark)
    rows = delta_rows(None, lake)  # delta-rs: no column mapping, the name encoded
    assert rows[("1",)]["v_x0020_renamed"] == "after" and rows[("2",)]["v_x0020_renamed"] == "v2", rows[("2",)]
    assert "v" not in rows[("2",)]
    verified(pipe, spark)
