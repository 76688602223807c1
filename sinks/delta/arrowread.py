"""A Delta table (or one version of it) read into Arrow with delta-rs, without a JVM.

`DeltaTable.to_pyarrow_table()` scans with pyarrow's dataset scanner, whose C++ thread pools made
a short process that exits right after (`cdc status`, a read verb) abort about one time in two
with "terminate called without an active exception" (SIGABRT, exit -6; apache/arrow#34314,
delta-rs#2184); `use_threads=False` only made it rarer. `DeltaTable.scan()` reads with delta-rs's
own engine (column mapping and deletion vectors included) and hands the batches to pyarrow over
the Arrow C stream interface, so no pyarrow pool runs. Its strings come as `string_view`, which
pyarrow's sort and take kernels refuse: they are cast back to the table's own Arrow schema, the
types `to_pyarrow_table()` gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow


def read_delta(
    path: str | Path, version: int | None = None, columns: list[str] | None = None
) -> pyarrow.Table:
    """The table at `version` (latest when None), rows in no set order; raises deltalake's
    TableNotFoundError when there is no table."""
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    rows = pa.RecordBatchReader.from_stream(table.scan(columns=columns)).read_all()
    declared = pa.schema(table.schema().to_arrow())
    return rows.cast(pa.schema([declared.field(name) for name in rows.column_names]))
