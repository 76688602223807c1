#!/bin/sh
# docker-compose.yml's PostgreSQL, first start only (/docker-entrypoint-initdb.d, after shop.sql):
# the pipeline's own role, least privilege as in docs/security.md ("Least-privilege role, per
# verb"): LOGIN REPLICATION and SELECT on the captured tables; the publication is made here by
# the tables' owner. Its password comes from the compose secret, never from this file.
set -eu
password=$(cat "${CDC_PG_PASSWORD_FILE:-/run/secrets/cdc_pg_password}")
psql -v ON_ERROR_STOP=1 -v role="${CDC_PG_USER:-cdc}" -v password="$password" \
  --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE :"role" LOGIN REPLICATION PASSWORD :'password';
GRANT SELECT ON public.customers, public.products, public.orders TO :"role";
CREATE PUBLICATION cdc_shop FOR TABLE public.customers, public.products, public.orders
  WITH (publish_via_partition_root = true);
SQL
