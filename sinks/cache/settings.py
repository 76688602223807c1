"""The `redis:` settings of a `sinks:` entry (docs/reference/pipeline-file.md): the Redis cache
follower's database, keys and lifetime. Registered in sinks/registry.py."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from cdc.ground.executor_secrets import env_name, split_password
from cdc.ground.settings import SinkSettings, TableList, check_tables, tables_or_views, view_list, view_names


class RedisSettings(SinkSettings):
    url: str = Field(description="redis:// (or rediss://) URL of the database, e.g. redis://127.0.0.1:6379/0")
    tables: TableList | None = Field(default=None, description="required unless `views` is given")
    views: list[str] = view_list()
    key: str | None = Field(default=None, description="key template (default '{schema}.{table}:{pk}')")
    ttl: int | None = Field(default=None, gt=0, description="seconds a cached row lives (default: forever)")
    allow_eviction: bool = Field(
        default=False,
        description="accept a Redis maxmemory-policy that may evict the follower's keys (a cache whose rows may go missing)",
    )

    _tables = field_validator("tables")(check_tables)
    _views = field_validator("views")(view_names)

    @model_validator(mode="after")
    def _follows_something(self) -> RedisSettings:
        tables_or_views(self)
        return self

    def drops_columns(self) -> bool:
        return True

    def executor_secrets(self, sink: str) -> dict[str, str]:
        password = split_password(self.url)[1]  # the executors write the rows
        return {env_name(sink, "password"): password} if password else {}
