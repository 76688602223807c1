#!/usr/bin/env bash
# The secrets of docker-compose.yml (README "Operations", "Running in containers"): random
# passwords written once into ./secrets/ (or the folder given), never printed. The folder is mode
# 0700 (other users of the host cannot read it); the files are 0644 because compose mounts them
# into containers whose services run as their own users (PostgreSQL, Redis), as they are.
# Re-running keeps existing files: delete one to make it anew (then also the volume that holds
# the old password: PostgreSQL sets its passwords only when its data directory is created).
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
# derived from the files above, so that each pair always agrees
pg=$(cat "$dir/cdc_pg_password")
redis=$(cat "$dir/redis_password")
write cdc_pg_dsn "postgresql://cdc:${pg}@postgres:5432/shop"
write cdc_redis_url "redis://:${redis}@redis:6379/0"
write redis.conf "$(printf 'requirepass %s\nappendonly yes' "$redis")"
echo "secrets in $dir: pg_superuser_password cdc_pg_password cdc_pg_dsn redis_password cdc_redis_url redis.conf"
