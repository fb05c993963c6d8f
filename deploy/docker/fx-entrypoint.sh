#!/bin/sh
# The images' entrypoint: `fx ARGS`. For `fx executor run` without FX_EXECUTOR_NODE_ID, the node id
# is the one kept in the state volume (made once: exec-<hostname>-<8 hex>), so every replica of a
# scaled service has its own (on the host network all containers share the host's hostname,
# which the executor's default node id is made of) and a restarted container keeps it.
set -eu
if [ "${1:-}" = executor ] && [ -z "${FX_EXECUTOR_NODE_ID:-}" ]; then
  file="${FX_DATA_DIR:-/var/lib/ninelives-fx}/node-id"
  if [ ! -s "$file" ]; then
    suffix="$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
    echo "exec-$(cat /proc/sys/kernel/hostname)-$suffix" >"$file"
  fi
  FX_EXECUTOR_NODE_ID="$(cat "$file")"
  export FX_EXECUTOR_NODE_ID
fi
exec fx "$@"
