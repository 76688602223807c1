"""The C speedup (cdc._render) renders exactly what the Python path renders.

Two levels:
* one row image: Plan.render on pgoutput TupleData and on COPY lines against
  EnvelopeRenderer.row/key_json + orjson, for every type the C code converts itself, their
  non-canonical inputs (which must go through the Python converter) and odd bytes;
* whole staging-log parts: the publisher's records (render._records with the speedup) against
  render.python_records, for every op, unchanged TOAST values, schema versions and escapes.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from cdc.envelope import EnvelopeRenderer, speedups
from cdc.ground.tables import TableName
from cdc.keys import escape as key_escape
from cdc.log.base import Column, TableSchema
from cdc.log.kafka import render
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED
from cdc.pgoutput_encode import encode_tuple

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not speedups(), reason="cdc._render not built (no C compiler)"),
]

if speedups():
    from cdc import _render

    KEY_ROW = _render.WANT_KEY | _render.WANT_ROW | _render.ALLOW_UNCHANGED

TYPES = {
    oid: {"oid": oid, "name": name, "kind": "base"}
    for oid, name in [
        (20, "int8"), (21, "int2"), (23, "int4"), (25, "text"), (1043, "varchar"), (16, "bool"),
        (1184, "timestamptz"), (1082, "date"), (701, "float8"), (1700, "numeric"), (17, "bytea"),
        (1114, "timestamp"), (2950, "uuid"), (3802, "jsonb"), (26, "oid"), (5069, "xid8"), (700, "float4"),
    ]
}  # fmt: skip
TYPES[1007] = {"oid": 1007, "name": "_int4", "kind": "array", "element": TYPES[23]}

# Values per type: canonical forms (converted in C) and forms only the Python converter knows.
CASES: dict[str, list[str]] = {
    "int8": ["0", "7", "-7", "123456789012345678", "-123456789012345678", "1234567890123456789",
             "-9223372036854775808", "9223372036854775807", "-0", "007", " 5", "+5", "1_0"],
    "int2": ["32767", "-32768"],
    "xid8": ["18446744073709551615"],
    "text": ["", "plain", 'a "quoted" \\ value', "tab\there", "nl\nline\rcr", "\x00\x01\x1f\x7f", "\b\f\v",
             "é ☃ 😀", "\u2028\u2029", "%s %d %%", "/slash/", "x" * 5000, "".join(map(chr, range(128))) * 40],
    "varchar": ["v"],
    "bool": ["t", "f", "true", "false", "yes", "0"],
    "timestamptz": ["2024-01-01 12:00:00+00", "2024-01-01 12:00:00.5+00", "2024-01-01 12:00:00.123456+00",
                    "2024-02-29 23:59:59.000001+00", "1970-01-01 00:00:00+00", "0999-01-01 00:00:00+00",
                    "2024-01-01 12:00:00+02", "2024-01-01 12:00:00.5-03:30", "0044-03-15 12:00:00+00 BC",
                    "10000-01-01 00:00:00+00", "infinity", "-infinity", "2024-01-01 12:00:00.+00"],
    "date": ["2024-01-01", "1970-01-01", "0001-01-01", "0000-02-29", "2000-02-29", "1600-03-01",
             "9999-12-31", "2024-13-45", "0044-03-15 BC", "12345-01-01", "infinity", "-infinity"],
    "float8": ["1.5", "-0", "1e+20", "NaN", "Infinity", "-Infinity", "3.141592653589793", "100", "-0.5", "0.0001",
               "1e-05", "0.1000", "123456789012345.6", "1234567890123456.7", "0.30000000000000004", "-.5", "5."],
    "float4": ["1.1", "3.4028235e+38", "0.3"],
    "numeric": ["1.50", "NaN", "-0.000"],
    "bytea": ["\\x", "\\x0a0b"],
    "timestamp": ["2024-01-01 00:00:01.5"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "jsonb": ['{"a": 1}'],
    "_int4": ["{1,2,NULL}", "{}"],
}  # fmt: skip
# Forms the C code must convert itself (not hand to Python): what PostgreSQL prints.
CANONICAL = {
    "int8": {"0", "7", "-7", "123456789012345678", "-123456789012345678"},
    "text": {"", "plain", 'a "quoted" \\ value', "é ☃ 😀", "\x00\x01\x1f\x7f"},
    "bool": {"t", "f"},
    "timestamptz": {"2024-01-01 12:00:00+00", "2024-01-01 12:00:00.5+00", "2024-02-29 23:59:59.000001+00"},
    "date": {"2024-01-01", "0000-02-29", "1600-03-01"},
}
OID = {t["name"]: oid for oid, t in TYPES.items()}


def schema_of(*columns: tuple[str, str, int], key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(
        tuple(Column(name, OID[type_name], typmod) for name, type_name, typmod in columns), key, TYPES
    )


def python_json(renderer: EnvelopeRenderer, schema: TableSchema, values: list) -> tuple[bytes | None, bytes]:
    """What the Python path gives for a row: (key JSON or None when a key value is missing, row JSON)."""
    row = orjson.dumps(renderer.row(schema, values))
    key_values = [values[i] for i in schema.key_indexes]
    if any(v is None or v is UNCHANGED for v in key_values):
        return None, row
    return orjson.dumps(
        {
            schema.columns[i].name: renderer.row(schema, values)[schema.columns[i].name]
            for i in schema.key_indexes
        }
    ), row


def copy_line(values: list) -> bytes:
    return b"\t".join(b"\\N" if v is None else key_escape(v.encode()) for v in values)


def both_forms(plan, values: list) -> list:
    tupledata = encode_tuple(v if v is None or v is UNCHANGED else v.encode() for v in values)
    out = [plan.render(tupledata, _render.TUPLEDATA, KEY_ROW)]
    if UNCHANGED not in values:
        out.append(plan.render(copy_line(values), _render.COPY, KEY_ROW))
    return out


def check_row(renderer: EnvelopeRenderer, schema: TableSchema, values: list, canonical: bool) -> None:
    try:
        want = python_json(renderer, schema, values)
    except Exception as exc:  # the Python path refuses: C must refuse the same way or hand it back
        for form in ("tupledata", "copy"):
            try:
                got = both_forms(renderer.c_plan(schema), values)
            except type(exc):
                continue
            assert all(g is None for g in got), f"{form}: {values!r}: Python raised {exc!r}, C gave {got!r}"
        return
    for got in both_forms(renderer.c_plan(schema), values):
        if got is None:
            assert not canonical, f"{values!r} handed back to Python though canonical"
            continue
        assert got[1] == want[1], f"row of {values!r}"
        if want[0] is not None:
            assert got[0] == want[0], f"key of {values!r}"


@pytest.mark.parametrize("type_name", sorted(CASES))
def test_every_value_renders_as_python_does(type_name: str) -> None:
    renderer = EnvelopeRenderer("db", "srv")
    precisions = [-1, 0, 3, 6] if type_name == "timestamptz" else [-1]
    for typmod in precisions:
        schema = schema_of(("id", "int4", -1), ("v", type_name, typmod), ("w", "text", -1))
        for text in CASES[type_name]:
            canonical = text in CANONICAL.get(type_name, set())
            check_row(renderer, schema, ["1", text, "after"], canonical)
            check_row(renderer, schema, ["2", None, text], type_name in ("text", "varchar") or canonical)


def test_keys_in_key_order_nulls_and_unchanged() -> None:
    renderer = EnvelopeRenderer("db", "srv")
    schema = schema_of(("a", "int4", -1), ("b", "text", -1), ("c", "date", -1), key=("c", "a"))
    plan = renderer.c_plan(schema)
    for values in (["1", "x", "2024-01-01"], ["-5", None, "1970-01-02"], ["1", UNCHANGED, "2024-01-01"]):
        check_row(renderer, schema, values, True)
    got = plan.render(encode_tuple([b"1", UNCHANGED, b"2024-01-01"]), _render.TUPLEDATA, KEY_ROW)
    assert (
        got is not None and got[0] == b'{"c":19723,"a":1}' and b'"b":"__debezium_unavailable_value"' in got[1]
    )
    # A NULL or unchanged key value: the Python path builds the key from the stored key instead.
    assert plan.render(encode_tuple([b"1", b"x", None]), _render.TUPLEDATA, KEY_ROW) is None
    assert plan.render(encode_tuple([UNCHANGED, b"x", b"2024-01-01"]), _render.TUPLEDATA, KEY_ROW) is None
    # Without ALLOW_UNCHANGED an unchanged value is reported, so the caller can fill it first.
    flags = _render.WANT_KEY | _render.WANT_ROW
    assert plan.render(encode_tuple([b"1", UNCHANGED, b"2024-01-01"]), _render.TUPLEDATA, flags) is False


def test_names_needing_escapes_and_bytea_placeholder() -> None:
    renderer = EnvelopeRenderer("db", "srv")
    schema = schema_of(('i"d%s', "int4", -1), ("b\\y\tte\u00e9", "bytea", -1), key=('i"d%s',))
    check_row(renderer, schema, ["1", "\\x00ff"], True)
    check_row(renderer, schema, ["1", UNCHANGED], True)


def test_odd_bytes_are_handed_back_not_guessed() -> None:
    renderer = EnvelopeRenderer("db", "srv")
    schema = schema_of(("id", "int4", -1), ("t", "text", -1))
    plan = renderer.c_plan(schema)
    bad_utf8 = encode_tuple([b"1", b"\xff\xfe"])
    surrogate = encode_tuple([b"1", "\ud800".encode("utf-8", "surrogatepass")])
    binary = b"\x00\x02t\x00\x00\x00\x011b\x00\x00\x00\x01x"
    for data in (bad_utf8, surrogate, binary, encode_tuple([b"1"]), encode_tuple([b"1", b"x", b"y"]), b"", b"\x00",
                 bad_utf8[:-1], b"\x00\x02q"):  # fmt: skip
        assert plan.render(data, _render.TUPLEDATA, KEY_ROW) is None, data
    for line in (b"1", b"1\tx\ty", b"1\t\xff", b""):
        assert plan.render(line, _render.COPY, KEY_ROW) is None, line
    # COPY escapes, including the ones PostgreSQL never writes, undone as cdc.keys.unescape does.
    for line, text in (
        (b"1\ta\\tb\\\\c\\nd", "a\tb\\c\nd"),
        (b"1\t\\x41\\q\\", "x41q\\"),
        (b"1\t\\Nx", "Nx"),
    ):
        got = plan.render(line, _render.COPY, KEY_ROW)
        assert got == (b'{"id":1}', orjson.dumps({"id": 1, "t": text})), line
    assert plan.render(b"1\t\\N", _render.COPY, KEY_ROW) == (b'{"id":1}', b'{"id":1,"t":null}')


def test_converter_errors_propagate() -> None:
    renderer = EnvelopeRenderer("db", "srv")
    schema = schema_of(("id", "int8", -1), ("d", "date", -1))
    plan = renderer.c_plan(schema)
    with pytest.raises(ValueError):
        plan.render(encode_tuple([b"1", b"2024-0a-01"]), _render.TUPLEDATA, KEY_ROW)
    with pytest.raises(orjson.JSONEncodeError):
        plan.render(encode_tuple([b"99999999999999999999", None]), _render.TUPLEDATA, KEY_ROW)


# ---- whole parts ---------------------------------------------------------------------------------
T = TableName("public", 'odd "t%s"')
V1 = schema_of(
    ("id", "int8", -1), ("n", "int4", -1), ("big", "text", -1), ("at", "timestamptz", 3), ("day", "date", -1)
)
V2 = schema_of(("id", "int8", -1), ("n", "int4", -1), ("big", "text", -1), ("score", "float8", -1))


def _staging(path: Path) -> tuple[LocalLog, int, int]:
    log = LocalLog(path)
    tid = log.ensure_table(T)
    sv1 = log.schema_version(tid, V1, 100)
    snap = log.begin_snapshot(tid, 100, sv1)
    seg = log.segment_path(tid, snap, 0)
    seg.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        copy_line([str(i), "0", f"big\t{i}\\é", "2024-01-01 00:00:00.5+00", "2024-01-02"])
        for i in range(1, 4000)
    ]
    lines.append(copy_line(["4000", "0", None, None, "12345-01-01"]))  # a row the Python path renders
    seg.write_bytes(b"\n".join(lines) + b"\n")
    log.add_segment(snap, 0, seg, len(lines), seg.stat().st_size)
    log.finish_snapshot(snap)
    return log, tid, log.schema_version(tid, V2, 500)


def _event(
    log: LocalLog, tid: int, lsn: int, op: str, key: int | None, values, before=None, sv: int = 1
) -> None:
    def tup(vals):
        return (
            None
            if vals is None
            else encode_tuple(v if v is None or v is UNCHANGED else v.encode() for v in vals)
        )

    row = (lsn, 1, op, None if key is None else str(key).encode(), tup(values), tup(before), "K" if before else None,
           sv, 700 + lsn, 1_700_000_000_000_000 + lsn, lsn - 1)  # fmt: skip
    log.append(tid, [row])
    log.commit(lsn)


def _parts_both_ways(log: LocalLog, monkeypatch) -> list[tuple[str, int]]:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_123.456)
    renderer = EnvelopeRenderer("db", "srv")
    cut = log.latest_cut()
    rng = cut.tables[T]
    shown = []
    for part in log.read_parts(T, 0, rng.end, events=50, segment_bytes=64 << 10):
        task = render.RenderTask(str(log.path), str(T), part, "db", "srv", 1 << 20)
        fast = list(render._records(task, log))
        slow = list(render.python_records(renderer, log, T, part))
        assert fast == slow, part
        shown.append((type(part).__name__, len(fast)))
    return shown


def test_parts_render_identically(tmp_path: Path, monkeypatch) -> None:
    log, tid, sv2 = _staging(tmp_path / "staging")
    lsn = 1000
    for i in range(1, 60):  # inserts, updates with and without before images, deletes
        lsn += 10
        _event(
            log,
            tid,
            lsn,
            "c",
            10_000 + i,
            [str(10_000 + i), str(i), f"v{i}", "2024-03-01 10:00:00+00", "2024-03-01"],
        )
        _event(log, tid, lsn + 1, "u", i, [str(i), str(i + 1), f"w{i}", None, "2024-03-02"],
               before=[str(i), None, None, None, None] if i % 2 else None)  # fmt: skip
        if i % 7 == 0:
            _event(log, tid, lsn + 2, "d", i, None, before=[str(i), None, None, None, None])
            _event(log, tid, lsn + 3, "d", i + 1, None)  # no old key image: key from the stored key
    _event(log, tid, lsn + 20, "t", None, None)
    _event(
        log, tid, lsn + 30, "c", 7, ["7", "1", "x", "2024-01-01 12:00:00.5+02", None]
    )  # via the Python converter
    _event(
        log, tid, lsn + 40, "c", 8, [None, "1", "x", None, None]
    )  # NULL key value: Python path for the row
    for i in range(1, 30):
        _event(log, tid, lsn + 100 + i, "c", 20_000 + i, [str(20_000 + i), "1", "y", "NaN"], sv=sv2)
    shown = _parts_both_ways(log, monkeypatch)
    assert sum(n for kind, n in shown if kind == "SegmentSlice") == 4000
    assert (
        sum(n for kind, n in shown if kind == "EventRun") == 166 + 16
    )  # events, plus a tombstone per delete


def test_part_with_unchanged_toast_is_filled_by_the_python_path(tmp_path: Path, monkeypatch) -> None:
    log, tid, _ = _staging(tmp_path / "staging")
    _event(log, tid, 1010, "c", 5000, ["5000", "1", "first", None, None])
    _event(log, tid, 1020, "u", 5000, ["5000", "2", UNCHANGED, None, None])
    _event(log, tid, 1030, "u", 3, ["3", "2", UNCHANGED, None, None])  # filled from the snapshot
    cut = log.latest_cut()
    runs = [p for p in log.read_parts(T, 0, cut.tables[T].end) if not hasattr(p, "path")]
    renderer = EnvelopeRenderer("db", "srv")
    from cdc.log.kafka import fastpath

    assert fastpath.event_records(renderer, log, T, runs[-1]) is None
    _parts_both_ways(log, monkeypatch)
    task = render.RenderTask(str(log.path), str(T), runs[-1], "db", "srv", 1 << 20)
    values = [orjson.loads(v) for _, v, _ in render._records(task, log) if v is not None]
    assert [v["after"]["big"] for v in values if v["op"] == "u"] == ["first", "big\t3\\é"]


# ---- Kafka record encoding ------------------------------------------------------------------------
def test_batches_encode_as_recordbatch_does(monkeypatch) -> None:
    from cdc.log.kafka import fastpath
    from cdc.log.kafka.recordbatch import batched, position_headers

    monkeypatch.setattr(time, "time", lambda: 1_700_000_123.456)
    records = [
        (
            b'{"id":%d}' % i,
            None if i % 5 == 0 else b"v" * (i % 300),
            position_headers(i, i % 7, 10**15 + i, 2),
        )
        for i in range(20_000)  # offset deltas past the one-byte and two-byte varints
    ]
    records += [
        (None, b"x" * 5000, b"\x00"),
        (b"k", None, b"\x00"),
        (b"big", b"y" * 70_000, b"\x00"),
        (b"", b"", b"\x00"),
    ]
    for limit in (1 << 20, 64 << 10, 1000, 1):
        assert list(fastpath.bodies(records, limit)) == list(batched(iter(records), limit)), limit
    with pytest.raises(TypeError):
        _render.encode_batch([(b"k", "not bytes", b"")], 0, 100)


def test_position_headers_as_recordbatch_does() -> None:
    from cdc.log.kafka.recordbatch import position_headers

    for args in (
        (0, 0, 0, 0),
        (1, 2, 3, 4),
        (2**63 - 1, 2**31, 1_700_000_000_123_456, 12),
        (5, 0, -86_400_000_000, 1),
    ):
        assert _render.position_headers(*args) == position_headers(*args), args


def test_key_change_records_carry_debezium_headers(tmp_path: Path, monkeypatch) -> None:
    """A key-changing UPDATE (delete + create at one event LSN, consecutive seq): the delete and its
    tombstone carry __debezium.newkey, the create __debezium.oldkey (the keys' JSON), the same bytes
    both ways; a plain delete and a later insert do not; no part splits the pair."""
    from cdc.log.kafka.keychange import NEWKEY, OLDKEY

    log, tid, _ = _staging(tmp_path / "staging")
    values = ["1", "2", "moved", None, None]
    ts = 1_700_000_000_000_000
    log.append(tid, [
        (2000, 1, "d", b"5", None, None, None, 1, 900, ts, 1990),
        (2000, 2, "c", b"6000", encode_tuple(v if v is None else v.encode() for v in ["6000", *values[1:]]),
         None, None, 1, 900, ts, 1990),
        (2000, 3, "d", b"7", None, None, None, 1, 900, ts, 1991),  # a plain delete...
        (2000, 4, "c", b"8000", encode_tuple(v if v is None else v.encode() for v in ["8000", *values[1:]]),
         None, None, 1, 900, ts, 1992),  # ...and an insert after it (another WAL record)
    ])  # fmt: skip
    log.commit(2000)
    _parts_both_ways(log, monkeypatch)
    end = log.latest_cut().tables[T].end
    for events in (1, 2, 3, 50):
        runs = [p for p in log.read_parts(T, end - 4, end, events=events) if not hasattr(p, "path")]
        assert end - 3 not in [r.upto for r in runs], events  # never between the pair's delete and create
    records = [r for p in log.read_parts(T, end - 4, end, events=1)
               for r in render._records(render.RenderTask(str(log.path), str(T), p, "db", "srv", 1 << 20), log)]  # fmt: skip

    def header(headers: bytes, name: bytes) -> bytes | None:
        at = headers.find(name)
        return None if at < 0 else headers[at + len(name) + 1 :]

    (k1, v1, h1), (k2, v2, h2), (k3, v3, h3), (_, _, h4), (_, _, h5), (_, _, h6) = records
    assert (k1, k2, k3) == (b'{"id":5}', b'{"id":5}', b'{"id":6000}') and v2 is None
    assert header(h1, NEWKEY) == b'{"id":6000}' and header(h2, NEWKEY) == b'{"id":6000}'
    assert header(h3, OLDKEY) == b'{"id":5}' and header(h3, NEWKEY) is None and header(h1, OLDKEY) is None
    assert orjson.loads(v1)["op"] == "d" and orjson.loads(v3)["op"] == "c"
    assert all(header(h, NEWKEY) is None and header(h, OLDKEY) is None for h in (h4, h5, h6))
    assert h1.startswith(b"\x0a")  # five headers now: the position's four and the key change's


# ---- keyless tables: records keyed by position ----------------------------------------------------
K = TableName("public", "events")
KV = schema_of(("who", "text", -1), ("n", "int4", -1), ("at", "timestamptz", 3), key=())


def _headers(encoded: bytes) -> dict[bytes, bytes]:
    from cdc.log.kafka.keychange import _read_varint

    count, at = _read_varint(encoded)
    out = {}
    for _ in range(count):
        n, used = _read_varint(encoded[at:])
        name = encoded[at + used : at + used + n]
        at += used + n
        n, used = _read_varint(encoded[at:])
        out[name] = encoded[at + used : at + used + n]
        at += used + n
    return out


def test_keyless_records_are_keyed_by_position_without_tombstones(tmp_path: Path, monkeypatch) -> None:
    """A keyless table's snapshot rows and events (REPLICA IDENTITY FULL deletes carrying the whole
    row, an update logged as a delete and a create, identical rows, a truncate): each record keyed by
    its own position, {"_cdc_lsn":..,"_cdc_seq":..}, the same as its headers (a snapshot row's seq from
    its byte offset, cdc.keys.snapshot_seq), no tombstone after a delete; C and Python give the same bytes,
    and the embedded log's reader the same positions."""
    from cdc.keys import snapshot_seq
    from cdc.log.kafka.keychange import NEWKEY, OLDKEY

    log = LocalLog(tmp_path / "staging")
    tid = log.ensure_table(K)
    sv = log.schema_version(tid, KV, 100)
    snap = log.begin_snapshot(tid, 100, sv)
    seg = log.segment_path(tid, snap, 0)
    seg.parent.mkdir(parents=True, exist_ok=True)
    lines = [copy_line([f"u{i % 3}", str(i % 2), "2024-01-01 00:00:00.5+00"]) for i in range(2500)]
    lines.append(copy_line(["tab\there", None, "2024-01-01 12:00:00+02"]))  # the Python converter's
    seg.write_bytes(b"\n".join(lines) + b"\n")
    log.add_segment(snap, 0, seg, len(lines), seg.stat().st_size)
    log.finish_snapshot(snap)
    ts = 1_700_000_000_000_000

    def tup(values):
        return encode_tuple(None if v is None else v.encode() for v in values)

    row = ["u1", "1", "2024-01-01 00:00:00.5+00"]
    log.append(tid, [
        (2000, 1, "c", b"2000\t1", tup(row), None, None, sv, 900, ts, 1990),
        (2000, 2, "c", b"2000\t2", tup(row), None, None, sv, 900, ts, 1991),  # identical rows
        (2000, 3, "d", b"2000\t3", None, tup(row), "O", sv, 900, ts, 1992),  # a FULL delete: the whole row
        (2000, 4, "d", b"2000\t4", None, tup(row), "O", sv, 900, ts, 1993),  # a FULL update: delete ...
        (2000, 5, "c", b"2000\t5", tup(["u1", "9", None]), None, None, sv, 900, ts, 1993),  # ... and create
    ])  # fmt: skip
    log.commit(2000)
    log.append(tid, [(2100, 1, "t", None, None, None, None, sv, 901, ts, 2090)])
    log.append(tid, [(2100, 2, "c", b"2100\t2", tup(row), None, None, sv, 901, ts, 2091)])
    log.commit(2100)

    monkeypatch.setattr(time, "time", lambda: 1_700_000_123.456)
    renderer = EnvelopeRenderer("db", "srv")
    end = log.latest_cut().tables[K].end
    records = []
    for part in log.read_parts(K, 0, end, events=2, segment_bytes=16 << 10):
        task = render.RenderTask(str(log.path), str(K), part, "db", "srv", 1 << 20)
        fast = list(render._records(task, log))
        assert fast == list(render.python_records(renderer, log, K, part)), part
        records += fast
    assert len(records) == len(lines) + 7 and all(v is not None for _, v, _ in records), "no tombstones"
    positions = [(int(_headers(h)[b"cdc.lsn"]), int(_headers(h)[b"cdc.seq"])) for _, _, h in records]
    keys = [orjson.loads(k) for k, _, _ in records]
    truncate = next(i for i, k in enumerate(keys) if k == {"__cdc_truncate": True})
    assert [(k["_cdc_lsn"], k["_cdc_seq"]) for i, k in enumerate(keys) if i != truncate] == [
        p for i, p in enumerate(positions) if i != truncate
    ]
    assert len(set(positions)) == len(positions), "every record its own key"
    marker = next(p.off for p in log.read_parts(K, 0, end) if hasattr(p, "path"))
    starts = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
    assert positions[: len(lines)] == [(100, snapshot_seq(marker, at)) for at in starts]
    assert [(r.lsn, r.seq) for r in log.read(K, 0, end)] == positions  # `cdc log read`, the Python path
    values = [orjson.loads(v) for _, v, _ in records[len(lines) :]]
    assert [v["op"] for v in values] == ["c", "c", "d", "d", "c", "t", "c"]
    assert (
        values[2]["before"] == values[0]["after"] == values[1]["after"]  # the whole deleted row
        and values[2]["after"] is None
    )
    (_, _, h_plain), (_, _, h_del), (_, _, h_new) = records[len(lines) + 2 : len(lines) + 5]
    # the update's halves share one WAL record: marked as Debezium marks a key change (the identity changed)
    assert _headers(h_del)[NEWKEY] == b'{"_cdc_lsn":2000,"_cdc_seq":5}'
    assert _headers(h_new)[OLDKEY] == b'{"_cdc_lsn":2000,"_cdc_seq":4}'
    assert NEWKEY not in _headers(h_plain) and OLDKEY not in _headers(h_plain)
