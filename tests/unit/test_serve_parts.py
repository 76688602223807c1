"""`cdc serve` parts without services: tokens, subscription filters, a sink's shaping of rows."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.log.base import Column, LogRecord, TableSchema
from cdc.pgoutput import UNCHANGED
from pipelines.serve.filters import parse_filter
from pipelines.serve.shape import TableShape, mask_text
from pipelines.serve.tokens import authorize, load_grants, parse_env, parse_file

pytestmark = pytest.mark.unit

ORDERS = TableName("public", "orders")


def test_tokens_hashed_in_a_file_and_plain_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = hashlib.sha256(b"file-token-0123456789").hexdigest()
    file = tmp_path / "tokens"
    file.write_text(f"# reader of orders\nsha256:{digest} public.orders\n")
    monkeypatch.setenv("CDC_SERVE_TOKENS", "env-token-0123456789=public.*")
    grants = load_grants(file)
    file_grant = authorize(grants, "file-token-0123456789")
    assert (
        file_grant is not None
        and file_grant.allows(ORDERS)
        and not file_grant.allows(TableName("public", "users"))
    )
    env_grant = authorize(grants, "env-token-0123456789")
    assert env_grant is not None and env_grant.allows(TableName("public", "users"))
    assert not env_grant.allows(TableName("other", "users"))
    assert authorize(grants, "wrong-token") is None and authorize(grants, None) is None
    assert not any("0123456789" in g.name for g in grants)  # the names used in messages carry no token


def test_no_token_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_SERVE_TOKENS", raising=False)
    monkeypatch.delenv("CDC_SERVE_TOKENS_FILE", raising=False)
    with pytest.raises(UsageError, match="no token"):
        load_grants(None)


@pytest.mark.parametrize(
    "text",
    [
        "plain-token public.orders",
        "sha256:abc public.orders",
        f"sha256:{'0' * 64}",
        f"sha256:{'0' * 64} not_a_table",
    ],
)
def test_token_file_lines_refused(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_file(text, "tokens")
    assert "plain-token" not in err.value.problem  # the line's token is never repeated


def test_env_tokens_need_tables_and_length() -> None:
    with pytest.raises(UsageError):
        parse_env("short=public.orders")
    with pytest.raises(UsageError):
        parse_env("long-enough-token-0123=")
    assert parse_env("long-enough-token-0123=*")[0].selectors is None


def test_filters() -> None:
    by_key = parse_filter([("key", "7")], ("id",))
    assert by_key.matches({"op": "c", "after": {"id": 7}, "before": None})
    assert not by_key.matches({"op": "c", "after": {"id": 8}, "before": None})
    assert by_key.matches({"op": "d", "after": None, "before": {"id": 7}})
    where = parse_filter([("where", "qty>=10"), ("where", "status=open")], ("id",))
    assert where.matches({"op": "u", "after": {"id": 1, "qty": 12, "status": "open"}})
    assert not where.matches({"op": "u", "after": {"id": 1, "qty": 9, "status": "open"}})
    # a row leaving the filter is seen when the event has its old row
    assert where.matches(
        {
            "op": "u",
            "after": {"id": 1, "qty": 9, "status": "shut"},
            "before": {"id": 1, "qty": 12, "status": "open"},
        }
    )
    assert parse_filter([("where", "flag=true")], ("id",)).matches({"op": "c", "after": {"flag": True}})
    assert parse_filter([("where", "n!=null")], ("id",)).matches({"op": "c", "after": {"n": 1}})
    assert parse_filter([("from", "1")], ("id",)).empty
    with pytest.raises(UsageError):
        parse_filter([("key", "1")], ("a", "b"))
    with pytest.raises(UsageError):
        parse_filter([("where", "no operator")], ("id",))


def test_shape_keeps_key_drops_and_masks_columns() -> None:
    schema = TableSchema(
        (Column("id", 23, -1), Column("email", 25, -1), Column("secret", 25, -1), Column("note", 25, -1)),
        ("id",),
    )
    rec = LogRecord(
        ORDERS, 5, 100, 1, "u", b"", ["1", "a@b.c", "s", UNCHANGED], None, None, schema, 1, 0, 100
    )
    shape = TableShape(
        ORDERS, "orders", None, frozenset({"secret"}), {"email": "hash", "note": "redact"}, "k" * 16
    )
    out = shape.apply(rec)
    assert out.schema.column_names == ["id", "email", "note"] and out.schema.key == ("id",)
    assert out.values == ["1", mask_text("hash", "k" * 16, "a@b.c"), UNCHANGED]  # unchanged stays unchanged
    assert rec.values[1] == "a@b.c"  # the shared record is not changed for other feeds


def test_the_feed_masks_with_the_sinks_masks() -> None:
    """The feed and the sinks share sinks/masks.py; the hash is HMAC-SHA256 hex with mask_key."""
    import hashlib
    import hmac

    from pipelines.serve import shape
    from sinks import masks

    assert shape.mask_text is masks.mask_text
    assert mask_text("hash", "x" * 16, "value") == hmac.new(b"x" * 16, b"value", hashlib.sha256).hexdigest()
    assert mask_text("redact", "x" * 16, "value") == "[redacted]" and mask_text("null", None, "value") is None


def _view_cut(path: Path, rows: list[dict], cut: int, first: bool = False) -> None:
    """One cut of a view's out table as the view stage leaves it: a MERGE by key (deletes: rows with
    `gone`), committed with the Delta txn (cdc-view:<pipeline>:<view>, cut id), CDF on."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    txn = CommitProperties(app_transactions=[Transaction("cdc-view:test:docs", cut)])
    table = pa.table(
        {
            "id": [r["id"] for r in rows],
            "name": [r.get("name") for r in rows],
            "gone": [bool(r.get("gone")) for r in rows],
        }
    )
    if first:
        write_deltalake(
            str(path),
            table.drop_columns(["gone"]),
            configuration={"delta.enableChangeDataFeed": "true"},
            commit_properties=txn,
        )
        return
    (
        DeltaTable(str(path))
        .merge(table, "t.id = s.id", source_alias="s", target_alias="t", commit_properties=txn)
        .when_matched_delete("s.gone")
        .when_matched_update({"name": "s.name"}, "NOT s.gone")
        .when_not_matched_insert({"id": "s.id", "name": "s.name"}, "NOT s.gone")
        .execute()
    )


def test_a_views_out_table_read_by_version_with_its_cuts(tmp_path: Path) -> None:
    """viewfeed.ViewAccess over an out table written by delta-rs like the view stage writes it: rows at
    the state's version, each later cut one event from the change data feed, must-refetch when the
    position is of another table (rebuilt), past the end, or its change data is gone (vacuumed)."""
    import orjson

    from pipelines.serve.viewfeed import ViewAccess, parse_position
    from pipelines.views.state import ViewState, out_path, save_view_state

    out = out_path(tmp_path, "docs")
    out.parent.mkdir(parents=True)
    _view_cut(out, [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], 7, first=True)  # version 0: cut 7
    save_view_state(tmp_path, ViewState("docs", cut_id=7, lsn=70, epoch=1, version=0, key=["id"]))
    access = ViewAccess(tmp_path, ["docs"])
    at = access.at("docs")
    assert at is not None and at.version == 0 and at.cut_id == 7
    assert [orjson.loads(c.envelope)["after"] for c in access.rows(at)] == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
    ]
    _view_cut(out, [{"id": 1, "name": "A"}, {"id": 2, "gone": True}, {"id": 3, "name": "c"}], 8)  # version 1
    _view_cut(out, [{"id": 3, "name": "C"}], 9)  # version 2
    assert access.at("docs") == at  # not served before the state file says the cut is done
    save_view_state(tmp_path, ViewState("docs", cut_id=9, lsn=90, epoch=1, version=2, key=["id"]))
    now = access.at("docs")
    assert now is not None and now.version == 2 and now.position == f"{at.table_id[:8]}-2"
    got, control = access.changes(now, *parse_position(at.position))
    assert control is None and got.upto == 2
    events = [(v, cut, [orjson.loads(c.envelope) for c in changes]) for v, cut, changes in got.events]
    assert [(v, cut) for v, cut, _ in events] == [(1, 8), (2, 9)]
    assert [(d["op"], d["before"], d["after"]) for d in events[0][2]] == [
        ("u", {"id": 1, "name": "a"}, {"id": 1, "name": "A"}),
        ("d", {"id": 2, "name": "b"}, None),
        ("c", None, {"id": 3, "name": "c"}),
    ]
    assert [(d["op"], d["after"]) for d in events[1][2]] == [("u", {"id": 3, "name": "C"})]
    assert access.changes(now, at.table_id[:8], 2) == (type(got)([], 2), None)  # at the newest: nothing
    assert access.changes(now, "0badc0de", 1)[1].reason == "rebuilt"
    assert access.changes(now, at.table_id[:8], 5)[1].reason == "unknown-position"
    with pytest.raises(UsageError):
        parse_position("12")
    # the change data files vacuumed: a fresh reader (no shared read cached) cannot resume from version 0
    for file in (out / "_change_data").rglob("*.parquet"):
        file.unlink()
    for file in out.glob("*.parquet"):
        file.unlink()
    got, control = ViewAccess(tmp_path, ["docs"]).changes(now, at.table_id[:8], 0)
    assert control is not None and control.reason == "compacted" and got.events == []
