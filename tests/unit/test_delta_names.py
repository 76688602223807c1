"""Column names of Delta follower tables without column mapping (sinks/delta/names.py, README
"Reading the lake"): the documented encoding, the comment that keeps the source name, and the
collision check that refuses two source columns sharing one stored name."""

from __future__ import annotations

import pytest

from cdc.ground.errors import SinkError
from sinks.delta.names import ColumnNames, comment_for, encode, source_name

pytestmark = pytest.mark.unit


def test_only_names_plain_delta_cannot_hold_are_encoded() -> None:
    assert (
        encode("id") == "id" and encode("a_x0020_b") == "a_x0020_b" and encode("Ünïcode.ok") == "Ünïcode.ok"
    )
    assert encode("v renamed") == "v_x0020_renamed"
    assert encode(" ,;{}()=\t\n") == "".join(
        f"_x{c:04X}_" for c in (0x20, 0x2C, 0x3B, 0x7B, 0x7D, 0x28, 0x29, 0x3D, 0x09, 0x0A)
    )
    assert ColumnNames(mapped=True).stored("v renamed") == "v renamed"  # column mapping holds any name


@pytest.mark.parametrize(
    "name", ["v renamed", "a=b", "x,y;z", "tab\there", "new\nline", 'quote\'s "q" \\ (x)']
)
def test_the_comment_gives_the_source_name_back(name: str) -> None:
    names = ColumnNames(mapped=False)
    stored = names.stored(name)
    assert source_name(stored, names.metadata(name)) == name
    assert names.metadata("plain") == {}


def test_a_comment_not_matching_the_stored_name_is_ignored() -> None:
    # a comment copied onto another column (or written by hand) does not rename it
    assert source_name("other", {"comment": comment_for("v renamed")}) == "other"
    assert source_name("v_x0020_renamed", {"comment": "pgcdc source column: not json"}) == "v_x0020_renamed"
    assert source_name("v_x0020_renamed", {"comment": "a user's comment"}) == "v_x0020_renamed"
    assert source_name("v_x0020_renamed", None) == "v_x0020_renamed"


def test_two_source_columns_with_one_stored_name_are_refused_naming_both() -> None:
    names = ColumnNames(mapped=False)
    with pytest.raises(SinkError) as err:
        names.check("public.t", "/lake/public/t", ["id", "a b", "a_x0020_b"], {})
    text = str(err.value)
    assert "'a_x0020_b'" in text and "'a b'" in text and "stored as 'a_x0020_b'" in text, text
    assert "RENAME COLUMN" in err.value.fix
    with pytest.raises(SinkError):  # Spark compares names ignoring case
        names.check("public.t", "/lake/public/t", ["A b", "a_x0020_B"], {})
    names.check("public.t", "/lake/public/t", ["id", "a b", "a c"], {})


def test_a_stored_name_the_table_has_for_another_column_is_refused() -> None:
    names = ColumnNames(mapped=False)
    # the table kept `a_x0020_b` of a source column of that very name (dropped since); `a b` is new
    with pytest.raises(SinkError) as err:
        names.check("public.t", "/lake/public/t", ["id", "a b"], {"id": "id", "a_x0020_b": "a_x0020_b"})
    assert "'a b'" in str(err.value) and "'a_x0020_b'" in str(err.value), str(err.value)
    assert "drop it from the Delta table" in err.value.fix
    # the column that is `a b`'s own is no collision
    names.check("public.t", "/lake/public/t", ["id", "a b"], {"id": "id", "a_x0020_b": "a b"})


def test_a_column_the_table_has_is_found_by_its_source_name_whichever_way_it_was_stored() -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("unit_x0020_price", T.StringType(), True, {"comment": comment_for("unit price")}),
        ]
    )
    # column mapping turned on after `unit price` was stored encoded: it stays that column
    names = ColumnNames.of_table(True, schema)
    assert names.stored("unit price") == "unit_x0020_price" and names.stored("new col") == "new col"
    assert ColumnNames.of_table(False, schema).stored("new col") == "new_x0020_col"
