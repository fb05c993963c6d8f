#!/usr/bin/env bash
# Starts a Docker engine for the deploy tests when none answers, the way these machines allow:
# no bridge network, no iptables (every container runs on the host network). Prints "started"
# when it started one (the caller stops it after: engine.sh --stop), "running" when one answered.
set -euo pipefail
docker="${DOCKER:-docker}"
pidfile=/run/fx-dockerd.pid
if [ "${1:-}" = "--stop" ]; then
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
  exit 0
fi
if "$docker" info >/dev/null 2>&1; then echo running; exit 0; fi
command -v dockerd >/dev/null || { echo "engine: dockerd is not installed (make system-deps installs docker.io)" >&2; exit 1; }
nohup dockerd --bridge=none --iptables=false --ip-masq=false >/var/log/fx-dockerd.log 2>&1 &
echo $! >"$pidfile"
for _ in $(seq 60); do
  if "$docker" info >/dev/null 2>&1; then echo started; exit 0; fi
  sleep 1
done
echo "engine: dockerd did not answer within 60 s; log: /var/log/fx-dockerd.log" >&2
tail -20 /var/log/fx-dockerd.log >&2 || true
exit 1
