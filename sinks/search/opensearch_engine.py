"""`engine: opensearch`: one OpenSearch index per table, written with the bulk API from Spark
executors (opensearch_bulk.py); the driver manages the indexes and their generations
(opensearch_index.py). How it behaves for an operator: README, "OpenSearch followers".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import EngineSettingError, SinkError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.changes import Batch
from sinks.executor_env import missing_error, provide
from sinks.search.documents import pending_renames
from sinks.search.fields import FieldSpec
from sinks.search.opensearch_bulk import (
    FIX_UNREACHABLE,
    BulkPlan,
    bulk_partition,
    error_text,
    failure_reason,
    read_slice,
    show_hosts,
)
from sinks.search.opensearch_client import ClientSettings, make_client
from sinks.search.opensearch_index import (
    META_FIELDS,
    create_generation,
    field_mapping,
    index_name,
    index_state,
    mapped_type,
    switch_generation,
)
from sinks.search.sink import SearchSink, SearchStats, WriteJob
from sinks.shaping import follower_name

if TYPE_CHECKING:
    from opensearchpy import OpenSearch
    from pyspark import RDD


@dataclass(frozen=True)
class _Create:
    """The table's first index generation."""

    batch: Batch
    alias: str


@dataclass(frozen=True)
class _Rebuild:
    """A new generation, the documents copied over (a column renamed, retyped or added with a default)."""

    batch: Batch
    alias: str
    concrete: str  # the generation the alias names now
    meta: dict[str, Any]
    keep: dict[str, Any]  # members of columns the batch lacks, kept in the mapping
    fills: dict[str, Any]  # column -> the default the copied documents get


@dataclass(frozen=True)
class _Update:
    """New columns mapped in place, and the generation's settings brought up to date."""

    batch: Batch
    alias: str
    concrete: str
    meta: dict[str, Any]
    added: dict[str, Any]


class OpenSearchSink(SearchSink):
    engine = "opensearch"

    @property
    def hosts(self) -> list[str]:
        return list(self.settings.hosts or [])

    @property
    def prefix(self) -> str:
        return self.settings.index_prefix or self.pipeline.name

    def index_of(self, table: TableName) -> str:
        # table_options rename: the name itself (checked as a valid lower-case index name), no prefix
        return follower_name(self.config, table) or index_name(self.prefix, table)

    def describe(self) -> str:
        return f"{self.name} (search, opensearch at {show_hosts(self.hosts)})"

    @property
    def client_settings(self) -> ClientSettings:
        return ClientSettings.of(self.settings, self.name)

    def client(self) -> OpenSearch:
        return make_client(self.client_settings)

    @contextmanager
    def calls(self, what: str) -> Iterator[None]:
        """OpenSearch client failures as SinkError: unreachable, or refused with its reason."""
        from opensearchpy.exceptions import ConnectionError as OsConnectionError
        from opensearchpy.exceptions import SSLError as OsSSLError
        from opensearchpy.exceptions import TransportError

        try:
            yield
        except OsSSLError as exc:
            raise self._tls_error(exc) from None
        except OsConnectionError as exc:
            raise SinkError(
                f"OpenSearch at {show_hosts(self.hosts)} is unreachable ({failure_reason(exc)})",
                FIX_UNREACHABLE,
            ) from None
        except TransportError as exc:
            if exc.status_code in (401, 403):
                raise self._auth_error(exc.status_code, what) from None
            raise SinkError(
                f"OpenSearch at {show_hosts(self.hosts)} refused {what}: HTTP {exc.status_code} {error_text(exc.info.get('error') if isinstance(exc.info, dict) else exc.info)}",
                "check the cluster's health and the user's rights; the next `cdc apply` resumes from the checkpoint",
            ) from None

    def _tls_error(self, exc: BaseException) -> EngineSettingError:
        """A refused TLS handshake (exit 3), naming the setting at fault; never a secret."""
        where, cs = f"sinks[{self.name}].search", self.client_settings
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            why = re.search(r"certificate verify failed: ([^(')\]]+)", text)
            mismatch = "mismatch" in text.lower()
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)}: the node's TLS certificate was refused "
                f"({why.group(1).strip() if why else 'certificate verify failed'}); {where}.ca_file is "
                f"{cs.ca_file or 'not set (the system CAs)'}",
                f"set {where}.ca_file to the CA that signed the nodes' certificates"
                + (", or list the hosts by the name their certificates carry" if mismatch else ""),
            )
        return EngineSettingError(
            f"OpenSearch at {show_hosts(self.hosts)}: the TLS handshake failed ({failure_reason(exc) if 'Errno' in text else text[:200]})",
            f"check the hosts' scheme (https) and {where}.client_cert/client_key (a node that requires a client "
            f"certificate refuses the handshake without one), ca_file and verify_certs",
        )

    def _auth_error(self, status: int, what: str) -> EngineSettingError:
        """401 (sign-in refused) or 403 (signed in, not allowed) as exit 3, naming the settings."""
        where, cs = f"sinks[{self.name}].search", self.client_settings
        if cs.username is not None:
            who = f"{where}.username {cs.username!r}"
            check = f"{where}.username and {where}.password (its ${{ENV}} variable)"
        elif cs.sigv4_region:
            who = f"the AWS identity of {where}.aws_sigv4 (region {cs.sigv4_region}, service {cs.sigv4_service})"
            check = f"the AWS credentials and {where}.aws_sigv4's region and service"
        elif cs.client_cert:
            who = f"the client certificate {where}.client_cert"
            check = f"{where}.client_cert/client_key and how the cluster maps certificates to users"
        else:
            who = "an anonymous client (no username, client certificate or aws_sigv4 set)"
            check = f"{where}.username/password, client_cert/client_key or aws_sigv4"
        if cs.sigv4_region and cs.username is None:  # Amazon answers a bad signature with 403 too
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)} refused the SigV4-signed request of {who} for {what} "
                f"(HTTP {status}): credentials that do not match, another region or service, or an identity the "
                "domain's access policy does not allow",
                f"check {check}, and the domain's access policy (or the collection's data access policy)",
            )
        if status == 401:
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)} refused the sign-in of {who} (HTTP 401): wrong password, "
                "no such user, or credentials of another cluster",
                f"check {check}",
            )
        return EngineSettingError(
            f"OpenSearch at {show_hosts(self.hosts)} does not allow {who} {what} (HTTP 403)",
            "give that user a role with the index rights docs/security.md lists for the search sink "
            f"(indices {self.prefix}.*: create, write, read, manage aliases; cluster: monitor), or check {check}",
        )

    # ---- marker (sinks/marker.py): `_meta.cdc.follower` of the table's index ---------------------
    markers = True
    reads_without_spark = True  # a client of the engine, no session (sinks/base.py)

    def has_table(self, table: TableName) -> bool:
        with self.calls("the index check"):
            return index_state(self.client(), self.index_of(table)) is not None

    def clear_table(self, table: TableName) -> None:
        client, alias = self.client(), self.index_of(table)
        with self.calls("an index change"):
            if client.indices.exists(index=alias):
                client.indices.delete(index=list(client.indices.get_alias(index=alias)))

    def read_marker(self, table: TableName) -> str | None:
        with self.calls("the index check"):
            state = index_state(self.client(), self.index_of(table))
        return None if state is None else state[2].get("follower")

    def write_marker(self, table: TableName, text: str) -> None:
        client, alias = self.client(), self.index_of(table)
        with self.calls("an index change"):
            state = index_state(client, alias)
            if state is not None and state[2].get("follower") != text:
                client.indices.put_mapping(
                    index=alias, body={"_meta": {"cdc": state[2] | {"follower": text}}}
                )

    # ---- prepare ---------------------------------------------------------------------------------
    def _fills(self, batch: Batch, new_columns: list[str]) -> dict[str, Any]:
        """The constant DEFAULTs of columns the index does not map yet, as documents hold them."""
        if not any(c in batch.defaults for c in new_columns):
            return {}  # no Spark job
        return {c: v for c, v in self._defaults(batch).items() if c in new_columns}

    def _prepare(self, batches: Sequence[Batch], specs: dict[TableName, list[FieldSpec]]) -> None:
        client = self.client()
        actions: list[_Create | _Rebuild | _Update] = []  # decided for every table before any changes
        with self.calls("the index check"):
            client.info()
            for batch in batches:
                alias = self.index_of(batch.table)
                wanted = {s.column: field_mapping(s) for s in specs[batch.table]}
                state = index_state(client, alias)
                if state is None:
                    if not batch.bootstrap:
                        raise SinkError(
                            f"{batch.table}: OpenSearch index {alias} does not exist, but this follower has applied the table before",
                            f"rebuild this follower from the log's base: `{self.pipeline.command('reset', '--sink', self.name, '--rebuild', '--yes')}`",
                        )
                    actions.append(_Create(batch, alias))
                    continue
                concrete, properties, meta = state
                changed = any(
                    (have := mapped_type(properties, c)) is not None and have != m["type"]
                    for c, m in wanted.items()
                )
                fills = self._fills(batch, [c for c in wanted if mapped_type(properties, c) is None])
                # A renamed source column, or a new one with a constant DEFAULT: a new generation, its
                # documents copied with the member renamed or the default given.
                if changed or fills or pending_renames(meta.get("schema", {}), batch.renames):
                    # Documents keep the members of dropped columns (the mapping is strict).
                    gone = {o for olds in batch.renames.values() for o in olds}
                    keep = {
                        c: m
                        for c, m in properties.items()
                        if c not in wanted and c not in META_FIELDS and c not in gone
                    }
                    actions.append(_Rebuild(batch, alias, concrete, meta, keep, fills))
                    continue
                added = {c: m for c, m in wanted.items() if mapped_type(properties, c) is None}
                actions.append(_Update(batch, alias, concrete, meta, added))
        with self.calls("an index change"):
            for action in actions:
                batch, alias = action.batch, action.alias
                if isinstance(action, _Create):
                    create_generation(client, self.settings, alias, batch, specs[batch.table], {})
                elif isinstance(action, _Rebuild):
                    new = create_generation(
                        client, self.settings, alias, batch, specs[batch.table], action.meta, action.keep
                    )
                    switch_generation(
                        client,
                        self.settings.timeout_s,
                        alias,
                        action.concrete,
                        new,
                        batch,
                        not batch.bootstrap,
                        action.fills,
                    )
                else:
                    concrete = action.concrete
                    meta = action.meta | {"table": str(batch.table), "schema": batch.schema.to_json()}
                    client.indices.put_mapping(
                        index=alias, body={"_meta": {"cdc": meta}, "properties": action.added}
                    )
                    current = client.indices.get_settings(index=concrete, name="index.gc_deletes")
                    if (
                        current.get(concrete, {}).get("settings", {}).get("index", {}).get("gc_deletes")
                        != self.settings.gc_deletes
                    ):
                        client.indices.put_settings(
                            index=concrete, body={"index": {"gc_deletes": self.settings.gc_deletes}}
                        )

    # ---- apply -----------------------------------------------------------------------------------
    def _write(self, job: WriteJob) -> SearchStats:
        batch, truncate = job.batch, job.truncate
        client = self.client()
        index = self.index_of(batch.table)
        with self.calls(f"the truncate of {index}"):
            state = index_state(client, index)
            if state is None:
                raise SinkError(
                    f"{batch.table}: OpenSearch index {index} disappeared during the apply",
                    "run `cdc apply` again",
                )
            meta = state[2]
            recorded = int(meta.get("truncate_version", 0))
            if truncate is not None and truncate >= recorded:
                if truncate > recorded:
                    meta["truncate_version"] = recorded = (
                        truncate  # first remember it: older writes are dropped from now on
                    )
                    client.indices.put_mapping(index=index, body={"_meta": {"cdc": meta}})
                client.indices.refresh(index=index)
                done = client.delete_by_query(
                    index=index,
                    body={"query": {"range": {"_cdc_version": {"lt": truncate}}}},
                    conflicts="proceed",
                    refresh=True,
                    slices="auto",
                    request_timeout=max(3600.0, self.settings.timeout_s),
                )
                if done.get("failures"):
                    raise SinkError(
                        f"{batch.table}: emptying OpenSearch index {index} for a truncate failed: {error_text(done['failures'][0])}",
                        "the next `cdc apply` tries again",
                    )
        plan = BulkPlan(
            self.client_settings,
            index,
            job.layout,
            recorded,
            self.settings.bulk_actions,
            job.rejected_fix,
        )
        provide(self.spark, plan.client.refs)  # the tasks carry the passwords' variable names only
        try:
            stats = self.collect(
                str(batch.table),
                job.frame.rdd.mapPartitions(partial(bulk_partition, plan)),
                f"OpenSearch index {index}",
            )
        except SinkError as exc:
            raise missing_error(exc.problem, self.name) or exc from None
        with self.calls(f"the refresh of {index}"):
            client.indices.refresh(index=index)
        return stats

    # ---- reads -----------------------------------------------------------------------------------
    def stored_schema(self, table: TableName) -> TableSchema | None:
        with self.calls("reading the index mapping"):
            state = index_state(self.client(), self.index_of(table))
        if state is None or "schema" not in state[2]:
            return None
        return TableSchema.from_json(state[2]["schema"])

    def documents(self, table: TableName) -> RDD:
        index = self.index_of(table)
        with self.calls("a refresh"):
            self.client().indices.refresh(index=index)
        slices = max(2, self.spark.sparkContext.defaultParallelism)
        cs = self.client_settings
        provide(self.spark, cs.refs)
        read = partial(read_slice, cs, index, slices)
        return self.spark.sparkContext.parallelize(range(slices), slices).flatMap(read)

    def search(
        self, table: TableName, query: str, limit: int
    ) -> tuple[int, int | None, list[tuple[float, dict[str, Any]]]]:
        from opensearchpy.exceptions import RequestError

        client = self.client()
        index = self.index_of(table)
        with self.calls("the search"):
            if not client.indices.exists(index=index):
                raise SinkError(
                    f"sink {self.name} has no index for {table} yet (index {index})", "run `cdc apply` first"
                )
            total = client.count(index=index)["count"]
            if total == 0:
                return 0, 0, []
            try:
                resp = client.search(
                    index=index,
                    body={
                        "query": {"query_string": {"query": query, "lenient": True}},
                        "size": limit,
                        "track_total_hits": True,  # the exact number of matches, not "10,000 or more"
                        "_source": {"excludes": ["_cdc_*"]},
                    },
                )
            except RequestError as exc:
                from cdc.ground.errors import UsageError

                raise UsageError(
                    f"invalid query {query!r}: {error_text(exc.info.get('error') if isinstance(exc.info, dict) else exc.info)}"
                ) from None
        matched = resp["hits"].get("total")
        exact = isinstance(matched, dict) and matched.get("relation") == "eq"
        return (
            total,
            matched["value"] if exact else None,
            [(hit["_score"] or 0.0, hit["_source"]) for hit in resp["hits"]["hits"]],
        )
