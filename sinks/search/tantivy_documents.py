"""What the tantivy follower stores (sinks/search/tantivy_engine.py says how it is laid out): the
tantivy field per column, the index schema, a document made from a row (its JSON values converted to
what each field takes, or the row rejected naming its key), and a stored field read back.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import types as T

from sinks.search.fields import FieldSpec

if TYPE_CHECKING:
    import tantivy


ROW, TOMBSTONE, MARKER = 1, 2, 3
MAX_KEYWORD = 8191
_PLAIN_FIELD = re.compile(r"[^\W\d]\w*\Z")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# (column, tantivy field name, field type, derived, plain): `plain` = the column's JSON values are
# already what the field takes (derived text of a string column, integers, booleans): no conversion.
Field = tuple[str, str, str, bool, bool]
_PLAIN_TYPES: dict[str, tuple[type[T.DataType], ...]] = {"text": (T.StringType,), "boolean": (T.BooleanType,)}


_PLAIN_TYPES |= dict.fromkeys(
    ("long", "integer", "short"), (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
)


def tantivy_fields(specs: list[FieldSpec], dtypes: dict[str, T.DataType]) -> list[Field]:
    used = {"_cdc_id", "_cdc_version", "_cdc_kind", "_cdc_row"}
    fields = []
    for i, spec in enumerate(specs):
        name = (
            spec.column
            if _PLAIN_FIELD.match(spec.column) and not spec.column.startswith("_cdc_")
            else f"col{i + 1}"
        )
        while name in used:
            name += "_"
        used.add(name)
        plain = spec.derived and isinstance(dtypes.get(spec.column), _PLAIN_TYPES.get(spec.type, ()))
        fields.append((spec.column, name, spec.type, spec.derived, plain))
    return fields


def build_schema(fields: list[Field]) -> tantivy.Schema:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("_cdc_id", stored=True, tokenizer_name="raw")
    sb.add_integer_field("_cdc_version", stored=True, indexed=True, fast=True)
    sb.add_integer_field("_cdc_kind", stored=True, indexed=True, fast=True)
    sb.add_bytes_field("_cdc_row", stored=True, indexed=False)
    for _column, name, kind, _derived, _plain in fields:
        if kind == "text":
            sb.add_text_field(name, stored=False, tokenizer_name="default")
        elif kind == "keyword":
            sb.add_text_field(name, stored=False, tokenizer_name="raw")
        elif kind in ("long", "integer", "short"):
            sb.add_integer_field(name, indexed=True)
        elif kind in ("double", "float"):
            sb.add_float_field(name, indexed=True)
        elif kind == "boolean":
            sb.add_boolean_field(name, indexed=True)
        elif kind == "date":
            sb.add_date_field(name, indexed=True)
    return sb.build()


class RowRejected(Exception):
    """A value the column's (configured) field type cannot take."""


def _flat(value: list) -> Iterator[Any]:
    for v in value:
        if isinstance(v, list):
            yield from _flat(v)
        elif v is not None:
            yield v


def _text(v: Any) -> str:
    return v if type(v) is str else orjson.dumps(v).decode()


def _keyword(v: Any) -> str | None:
    text = v if type(v) is str else orjson.dumps(v).decode()
    return text if len(text) <= MAX_KEYWORD else None  # longer: kept in the row, too long for one term


def _int(v: Any) -> int:
    if type(v) is int:
        return v
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


def _float(v: Any) -> float | None:
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a number")
    number = float(v)
    return number if number - number == 0 else None  # NaN, ±inf: not indexed


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not a boolean")
    return v


def _date(v: Any) -> dt.datetime:
    if isinstance(v, str):
        value = dt.datetime.fromisoformat(v)  # "YYYY-MM-DD", "YYYY-MM-DDTHH:MM:SS.ffffff[Z]"
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    if isinstance(v, int) and not isinstance(v, bool):
        return _EPOCH + dt.timedelta(
            milliseconds=v
        )  # epoch milliseconds, as OpenSearch reads numbers for dates
    raise ValueError(f"{v!r} is not a date")


Converter = Callable[[Any], Any]
_CONVERT: dict[str, Converter] = {
    "text": _text,
    "keyword": _keyword,
    "long": _int,
    "integer": _int,
    "short": _int,
}


_CONVERT |= {"double": _float, "float": _float, "boolean": _bool, "date": _date}


def _converter(field: Field) -> Converter | None:
    """A JSON value -> the value the field takes (None: nothing to index). None for a plain field."""
    column, _name, kind, derived, plain = field
    convert = _CONVERT[kind]
    if plain:
        return None

    def conv(v: Any) -> Any:
        try:
            return convert(v)
        except (ValueError, TypeError, OverflowError) as exc:
            if derived:
                return None  # a derived field is lenient: the value stays in the row only
            raise RowRejected(f"column {column!r} (field type {kind}): {exc}") from None

    return conv


class DocumentMaker:
    """Builds the tantivy documents of one index: one `Document.from_dict` call per document."""

    def __init__(self, fields: list[Field], schema: Any) -> None:
        import tantivy

        self.from_dict = tantivy.Document.from_dict
        self.schema = schema
        self.fields = [(f[0], f[1], _converter(f)) for f in fields if f[2] in _CONVERT]

    def __call__(
        self, doc_id: str, version: int, kind: int, row: dict | None = None, row_json: bytes | None = None
    ):
        doc: dict[str, Any] = {"_cdc_id": doc_id, "_cdc_version": version, "_cdc_kind": kind}
        if kind == ROW:
            assert row is not None
            doc["_cdc_row"] = row_json if row_json is not None else orjson.dumps(row)
            for column, name, conv in self.fields:
                value = row.get(column)
                if value is None:
                    continue
                if isinstance(value, list):
                    values = [x for v in _flat(value) if (x := v if conv is None else conv(v)) is not None]
                    if values:
                        doc[name] = values
                elif conv is None:
                    doc[name] = value
                elif (x := conv(value)) is not None:
                    doc[name] = x
        try:
            return self.from_dict(doc, self.schema)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer beyond 64 bits
            raise RowRejected(f"document {doc_id!r}: {exc}") from None


def _stored(doc: tantivy.Document, name: str) -> Any:
    """A field every document cdc writes stores (tantivy types get_first optional)."""
    value = doc.get_first(name)
    if value is None:
        raise ValueError(f"a document in the index lacks its {name} field: the index was not written by cdc")
    return value
