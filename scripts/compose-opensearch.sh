#!/usr/bin/env bash
# Entry point of docker-compose.yml's `opensearch` service (image opensearchproject/opensearch:2.19.1):
# the security plugin with this stack's certificates (compose secrets, mounted under
# config/certs; settings in the compose file's environment, which the image passes to OpenSearch)
# and its user `admin` with the password of the compose secret
# /run/secrets/opensearch_admin_password. The password is hashed with the plugin's own tool
# (plugins/opensearch-security/tools/hash.sh, read from an environment variable of this script
# only, never from a command line) into config/opensearch-security/internal_users.yml, which the
# plugin loads into its security index when it makes it, at the first start
# (plugins.security.allow_default_init_securityindex). Then the image's own entry point runs, with
# its demo configuration off (DISABLE_INSTALL_DEMO_CONFIG: its certificates' keys are public).
# Not run here (no Docker daemon on the machine that tests this repository).
set -euo pipefail
home=/usr/share/opensearch
OPENSEARCH_ADMIN_PASSWORD=$(tr -d '\r\n' < /run/secrets/opensearch_admin_password)
export OPENSEARCH_ADMIN_PASSWORD
hash=$(bash "$home/plugins/opensearch-security/tools/hash.sh" -env OPENSEARCH_ADMIN_PASSWORD | tail -n 1)
unset OPENSEARCH_ADMIN_PASSWORD
case $hash in '$2'*) ;; *) echo "compose-opensearch.sh: hash.sh gave no bcrypt hash" >&2; exit 1 ;; esac
umask 077
cat > "$home/config/opensearch-security/internal_users.yml" <<YAML
# written by pgcdc's scripts/compose-opensearch.sh at each start
_meta:
  type: "internalusers"
  config_version: 2
admin:
  hash: "$hash"
  reserved: true
  backend_roles: ["admin"]
  description: "admin of the pgcdc compose stack (password: the compose secret opensearch_admin_password)"
YAML
exec "$home/opensearch-docker-entrypoint.sh" "$@"
