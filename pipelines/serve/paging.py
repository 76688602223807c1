"""One page of a snapshot read (`?page=&limit=`) and the link to the next one, for table and view routes."""

from __future__ import annotations

from typing import TypeVar

from starlette.requests import Request

Row = TypeVar("Row")


def one_page(
    rows: list[Row], page: int, limit: int, request: Request, pin: dict[str, str]
) -> tuple[list[Row], str | None]:
    """The page's rows, and the next page's URL (None on the last page). `pin` holds the query
    parameters that keep the next page on the same cut or version; a token in the query is not
    repeated in the link."""
    chunk = rows[page * limit : (page + 1) * limit]
    if (page + 1) * limit >= len(rows):
        return chunk, None
    params = dict(request.query_params) | pin | {"page": str(page + 1), "limit": str(limit)}
    params.pop("access_token", None)
    return chunk, f"{request.url.path}?" + "&".join(f"{k}={v}" for k, v in params.items())
