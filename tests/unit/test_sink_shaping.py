"""Per-sink columns, masks and renames (sinks/shaping.py, cdc/ground/settings.py): the pure parts."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from cdc.ground.errors import PipelineFileError
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from sinks.masks import REDACTED, TEXT_OID, hmac_hex, mask_text
from sinks.registry import parse_pipeline
from sinks.shaping import follower_name, shape_of

pytestmark = pytest.mark.unit

KEY = "0123456789abcdef-secret"
USERS = TableName("public", "users")
SCHEMA = TableSchema(
    (
        Column("id", 23, -1, attnum=1),
        Column("email", 25, -1, attnum=2),
        Column("password_hash", 25, -1, attnum=3),
        Column("age", 23, -1, missing="7", attnum=4),
    ),
    ("id",),
    {23: {"oid": 23, "name": "int4", "kind": "base"}},
)


def sink(options: dict, **settings) -> object:
    doc = {
        "name": "t",
        "source": {"postgres": {"dsn": "x", "tables": ["public.users"]}},
        "sinks": [
            {
                "name": "s",
                "search": {
                    "tables": ["public.users"],
                    "table_options": {"public.users": options},
                    **settings,
                },
            }
        ],
    }
    return parse_pipeline(doc).sinks[0]


def test_hash_is_rfc2104_hmac_sha256_hex() -> None:
    assert hmac_hex(KEY, "a@b.c") == hmac.new(KEY.encode(), b"a@b.c", hashlib.sha256).hexdigest()
    # RFC 4231 test case 2
    assert hmac_hex("Jefe", "what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )
    long_key = "k" * 200  # longer than a block: hashed first, as RFC 2104 says
    assert hmac_hex(long_key, "x") == hmac.new(long_key.encode(), b"x", hashlib.sha256).hexdigest()


def test_mask_text_keeps_null_and_is_stable() -> None:
    assert mask_text("hash", KEY, "a") == mask_text("hash", KEY, "a") != mask_text("hash", KEY + "x", "a")
    assert mask_text("redact", None, "a") == REDACTED
    assert mask_text("null", None, "a") is None
    assert mask_text("hash", KEY, None) is None and mask_text("redact", None, None) is None


def test_shape_keeps_masks_and_types() -> None:
    cfg = sink(
        {
            "exclude_columns": ["password_hash"],
            "mask": {"email": "hash", "age": "redact"},
            "rename": "people",
        },
        mask_key=KEY,
    )
    shape = shape_of(cfg, USERS, SCHEMA)
    assert shape is not None and shape.kept == (0, 1, 3)
    cols = {c.name: c for c in shape.schema.columns}
    assert list(cols) == ["id", "email", "age"]
    assert cols["email"].type_oid == cols["age"].type_oid == TEXT_OID and cols["id"].type_oid == 23
    assert cols["age"].missing == REDACTED  # rows from before the column was added are masked too
    assert TEXT_OID in shape.schema.types
    assert follower_name(cfg, USERS) == "people"
    assert shape_of(sink({"rename": "people"}), USERS, SCHEMA) is None  # nothing to shape


def test_columns_list_always_keeps_the_key() -> None:
    shape = shape_of(sink({"columns": ["email"]}), USERS, SCHEMA)
    assert shape is not None and shape.schema.column_names == ["id", "email"]


def test_a_renamed_source_column_keeps_its_rule() -> None:
    renamed = TableSchema((SCHEMA.columns[0], Column("mail", 25, -1, attnum=2)), ("id",), SCHEMA.types)
    shape = shape_of(sink({"mask": {"email": "redact"}}), USERS, renamed, {"mail": ("email",)})
    assert shape is not None and shape.masks == {"mail": "redact"}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"exclude_columns": ["emial"]}, ["sink s", "public.users", "'emial'", "not a column"]),
        ({"mask": {"emial": "hash"}}, ["sink s", "public.users", "'emial'"]),
        ({"exclude_columns": ["id"]}, ["sink s", "public.users", "'id'", "key column", "cannot be excluded"]),
        ({"mask": {"id": "redact"}}, ["sink s", "public.users", "'id'", "key column", "mask redact"]),
        ({"mask": {"id": "null"}}, ["'id'", "mask null"]),
    ],
)
def test_bad_columns_name_sink_table_and_column(options: dict, words: list[str]) -> None:
    with pytest.raises(PipelineFileError) as info:
        shape_of(sink(options, mask_key=KEY), USERS, SCHEMA)
    assert info.value.exit_code == 2 and info.value.fix
    for word in words:
        assert word in info.value.problem, info.value.problem


def test_hash_of_a_key_column_is_allowed() -> None:
    shape = shape_of(sink({"mask": {"id": "hash"}}, mask_key=KEY), USERS, SCHEMA)
    assert shape is not None and shape.masks == {"id": "hash"} and shape.schema.key == ("id",)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (
            {"table_options": {"public.userz": {"exclude_columns": ["a"]}}},
            ["public.userz", "did you mean", "public.users"],
        ),
        (
            {"table_options": {"public.users": {"mask": {"email": "hash"}}}},
            ["needs mask_key", "CDC_MASK_KEY"],
        ),
        (
            {"mask_key": "short", "table_options": {"public.users": {"mask": {"email": "hash"}}}},
            ["shorter than 16"],
        ),
        ({"table_options": {"public.users": {"columns": ["a"], "exclude_columns": ["b"]}}}, ["not both"]),
        ({"table_options": {"public.users": {"mask": {"email": "hide"}}}}, ["'hash', 'redact' or 'null'"]),
        ({"table_options": {"public.users": {"rename": "public"}}}, ["rename 'public'", "schema"]),
    ],
)
def test_bad_table_options_exit_2(settings: dict, words: list[str]) -> None:
    doc = {
        "name": "t",
        "source": {"postgres": {"dsn": "x", "tables": ["public.users"]}},
        "sinks": [{"name": "lake", "delta": {"path": "lake", **settings}}],
    }
    with pytest.raises(PipelineFileError) as info:
        parse_pipeline(doc)
    assert info.value.exit_code == 2
    for word in words:
        assert word in info.value.problem, info.value.problem


def test_mask_key_is_not_in_the_settings_repr() -> None:
    cfg = sink({"mask": {"email": "hash"}}, mask_key=KEY)
    assert KEY not in repr(cfg) and KEY not in str(cfg)


def test_yaml_null_means_the_null_mask() -> None:
    cfg = sink({"mask": {"email": None}})
    assert cfg.settings.options_for(USERS).mask == {"email": "null"}


def test_a_wrong_mask_key_is_not_shown_in_the_error() -> None:
    doc = {
        "name": "t",
        "source": {"postgres": {"dsn": "x", "tables": ["public.users"]}},
        "sinks": [{"name": "lake", "delta": {"path": "lake", "mask_key": 98765432109876543210}}],
    }
    with pytest.raises(PipelineFileError) as info:
        parse_pipeline(doc)
    assert "mask_key" in info.value.problem and "98765432109876543210" not in info.value.problem
