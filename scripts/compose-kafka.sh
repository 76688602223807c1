#!/usr/bin/env bash
# Entry point of docker-compose.yml's `kafka` service (image apache/kafka:4.3.1): creates the
# SCRAM-SHA-512 user `cdc` from the compose secret /run/secrets/kafka_password when the storage
# is formatted (`kafka-storage.sh format --add-scram`: KRaft keeps SCRAM credentials in its
# metadata, which format seeds), then hands over to the image's own start (/etc/kafka/docker/run),
# which configures the broker from the KAFKA_* variables of the compose file and finds the storage
# formatted already. The properties format reads are those same variables, converted as the
# image documents (KAFKA_ dropped, lower case, `_` -> `.`, `__` -> `_`, `___` -> `-`), written to
# a file of the container's /tmp that only its user can read. The password is never printed; it
# is on the format command's line for its few seconds (the storage tool has no file option for
# it), visible to processes of this container only.
# Not run in a container here (no Docker daemon on the machine that tests this repository):
# tests/unit/test_compose.py runs it with the compose file's variables, the PGCDC_* paths below
# pointed at a temporary folder, and Kafka 4.3.1's own storage tool from .jars/kafka.
set -euo pipefail
user=${KAFKA_SCRAM_USER:-cdc}
secrets=${PGCDC_SECRETS_DIR:-/run/secrets}
storage=${PGCDC_KAFKA_STORAGE:-/opt/kafka/bin/kafka-storage.sh}
run=${PGCDC_KAFKA_RUN:-/etc/kafka/docker/run}
password=$(tr -d '\r\n' < "$secrets/kafka_password")
umask 077
props=$(mktemp "${TMPDIR:-/tmp}/pgcdc-format-XXXXXX")
trap 'rm -f "$props"' EXIT
env | grep -E '^KAFKA_[A-Z0-9_]+=' | grep -vE '^KAFKA_(VERSION|HEAP_OPTS|LOG4J_OPTS|OPTS|JMX_OPTS|JVM_PERFORMANCE_OPTS|GC_LOG_OPTS|LOG4J_ROOT_LOGLEVEL|LOG4J_LOGGERS|TOOLS_LOG4J_LOGLEVEL|JMX_HOSTNAME|SCRAM_USER)=' \
  | while IFS='=' read -r key value; do
      key=$(printf '%s' "${key#KAFKA_}" | tr 'A-Z_' 'a-z.' | sed -e 's/\.\.\./-/g' -e 's/\.\./_/g')
      printf '%s=%s\n' "$key" "$value"
    done > "$props"
"$storage" format --ignore-formatted --cluster-id "$CLUSTER_ID" -c "$props" \
  --add-scram "SCRAM-SHA-512=[name=$user,password=$password]" > /dev/null
unset password
rm -f "$props"
exec "$run" "$@"
