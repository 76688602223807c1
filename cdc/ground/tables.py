"""Schema-qualified table names, parsed and printed with PostgreSQL's quoting rules.

Unquoted identifiers fold to lower case, "double quoted" ones keep case, spaces, dots and
unicode (a doubled "" is a literal quote) — exactly as in SQL, so `public.Orders` names the
table `public.orders` and `"Sales"."Order Items"` names the table with capitals and a space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLAIN = re.compile(r"[a-z_][a-z0-9_$]*\Z")


def quote_ident(name: str) -> str:
    """Quote an identifier unless it is a plain lower-case one (for display; SQL uses psycopg2.sql)."""
    return name if _PLAIN.match(name) else '"' + name.replace('"', '""') + '"'


def spark_ident(name: str) -> str:
    """A Spark SQL identifier, always backquoted (a backquote in the name doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _split_qualified(text: str) -> list[str]:
    """Split on dots outside double quotes, unquoting and case-folding each part."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f"unterminated quoted identifier in {text!r}")
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                break
            part, i = "".join(buf), k + 1
            if not part:
                raise ValueError(f"empty quoted identifier in {text!r}")
        else:
            k = text.find(".", i)
            k = n if k < 0 else k
            raw = text[i:k].strip()
            if not raw:
                raise ValueError(f"empty name in {text!r}")
            if '"' in raw:
                raise ValueError(f"misplaced double quote in {text!r}")
            part, i = raw.lower() if raw != "*" else "*", k
        parts.append(part)
        if i >= n:
            return parts
        if text[i] != ".":
            raise ValueError(f"expected '.' after {parts[-1]!r} in {text!r}")
        i += 1


@dataclass(frozen=True, order=True)
class TableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """'public.orders' / '"My Schema"."My Table"' -> TableName. Requires a schema."""
        parts = _split_qualified(text.strip())
        if len(parts) != 2 or "*" in parts:
            raise ValueError(f"{text!r} is not a schema-qualified table name (write it as schema.table)")
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


@dataclass(frozen=True)
class TableSelector:
    """One entry of `source.postgres.tables`: a table, or every table of a schema (`schema.*`)."""

    schema: str
    name: str | None  # None = all tables of the schema

    @classmethod
    def parse(cls, text: str) -> TableSelector:
        parts = _split_qualified(text.strip())
        if len(parts) != 2:
            raise ValueError(f"{text!r} is not schema.table or schema.*")
        if parts[0] == "*":
            raise ValueError(f"{text!r}: the schema cannot be a wildcard")
        return cls(parts[0], None if parts[1] == "*" else parts[1])

    def matches(self, table: TableName) -> bool:
        return table.schema == self.schema and (self.name is None or table.name == self.name)

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}." + ("*" if self.name is None else quote_ident(self.name))
