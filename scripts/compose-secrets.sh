#!/usr/bin/env bash
# The secrets of docker-compose.yml (README "Operations", "Running in containers"), written once
# into ./secrets/ (or the folder given as the first argument), never printed:
#   passwords   pg_superuser_password cdc_pg_password redis_password kafka_password
#               opensearch_admin_password, and what is derived from them (cdc_pg_dsn,
#               cdc_redis_url, redis.conf)
#   TLS (openssl) ca.crt + ca.key (a CA of this stack only), kafka.crt + kafka.key (DNS:kafka)
#               and kafka.pem (Kafka's PEM keystore: key then certificate), opensearch.crt +
#               opensearch.key (DNS:opensearch, localhost, 127.0.0.1: it is published on the
#               host's loopback). Keys are unencrypted PKCS#8, valid 825 days.
# The folder is mode 0700 (other users of the host cannot read it). Private keys (*.key,
# kafka.pem) are 0600. The other files are 0644 because compose bind-mounts them, owner and
# mode as they are, into containers whose services run as their own users (PostgreSQL, Redis).
# The Kafka and OpenSearch images run as uid 1000: they read the 0600 keys when the host user
# who ran this script is uid 1000; otherwise `sudo chown 1000 secrets/kafka.pem
# secrets/opensearch.key` (the cdc container runs as root and reads them all).
# Re-running keeps existing files: delete one to make it anew (then also the volume that holds
# the old password: PostgreSQL sets its passwords only when its data directory is created, Kafka
# its SCRAM user when its storage is formatted, OpenSearch its admin when its security index is
# made). Deleting ca.key makes the CA and every certificate anew.
set -euo pipefail
dir=${1:-"$(cd "$(dirname "$0")/.." && pwd)/secrets"}
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
random() { head -c 24 /dev/urandom | base64 | tr -d '/+=' ; }
write() {  # write NAME CONTENT: only when missing
  if [ ! -s "$dir/$1" ]; then printf '%s\n' "$2" > "$dir/$1"; chmod 0644 "$dir/$1"; fi
}
write pg_superuser_password "$(random)"
write cdc_pg_password "$(random)"
write redis_password "$(random)"
write kafka_password "$(random)"
write opensearch_admin_password "$(random)"
# derived from the files above, so that each pair always agrees
pg=$(cat "$dir/cdc_pg_password")
redis=$(cat "$dir/redis_password")
write cdc_pg_dsn "postgresql://cdc:${pg}@postgres:5432/shop"
write cdc_redis_url "redis://:${redis}@redis:6379/0"
write redis.conf "$(printf 'requirepass %s\nappendonly yes' "$redis")"

# TLS: a CA, and a server certificate for Kafka and for OpenSearch that it signs
command -v openssl >/dev/null || { echo "compose-secrets.sh: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
days=825
ossl() {  # openssl quietly; its messages only on failure (they hold no secret)
  local log; log=$(openssl "$@" 2>&1) || { printf 'openssl %s failed: %s\n' "$1" "$log" >&2; exit 1; }
}
if [ ! -s "$dir/ca.key" ] || [ ! -s "$dir/ca.crt" ]; then
  rm -f "$dir"/kafka.* "$dir"/opensearch.{crt,key}  # issued by a CA that is gone
  ossl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=pgcdc-compose-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt"
  chmod 0600 "$dir/ca.key"; chmod 0644 "$dir/ca.crt"
fi
issue() {  # issue NAME SAN: NAME.crt (0644) and NAME.key (0600), signed by the CA
  local name=$1 san=$2 tmp
  [ -s "$dir/$name.key" ] && [ -s "$dir/$name.crt" ] && return 0
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  ossl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$dir/$name.key" -out "$tmp/$name.csr"
  chmod 0600 "$dir/$name.key"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' "$san" > "$tmp/ext"
  ossl x509 -req -in "$tmp/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -days "$days" -extfile "$tmp/ext" -out "$dir/$name.crt"
  chmod 0644 "$dir/$name.crt"
}
issue kafka "DNS:kafka"
issue opensearch "DNS:opensearch,DNS:localhost,IP:127.0.0.1"
if [ ! -s "$dir/kafka.pem" ]; then
  cat "$dir/kafka.key" "$dir/kafka.crt" > "$dir/kafka.pem"
  chmod 0600 "$dir/kafka.pem"
fi
echo "secrets in $dir: pg_superuser_password cdc_pg_password cdc_pg_dsn redis_password cdc_redis_url redis.conf" \
     "kafka_password opensearch_admin_password ca.crt ca.key kafka.crt kafka.key kafka.pem opensearch.crt opensearch.key"
