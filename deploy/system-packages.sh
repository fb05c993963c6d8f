#!/usr/bin/env bash
# The Debian packages the tests need beyond Python and Java, installed when missing:
#   chromium, chromium-driver  the console's browser tests (a real headless Chromium)
#   docker-compose             `docker-compose config` validates docker-compose.yml; the deploy
#                              tests run the compose stack with it
#   docker.io                  the Docker engine and client of the deploy tests (tests/deploy
#                              start dockerd when none answers: deploy/docker/engine.sh)
#   debootstrap                the local Debian base image (deploy/docker/base-image.sh)
#   systemd                    `systemd-analyze verify` checks the units under deploy/systemd
#   g++                        the CPU build of the integer engine's CUDA sources
#   prometheus                 only for `promtool`: checks deploy/prometheus (config, rules, alert
#                              unit tests); the Prometheus service Debian enables with it is
#                              disabled again when this script installed it
# Idempotent: prints what it installs; as root it runs apt-get, otherwise it prints the command
# and exits 1 when something is missing.
set -euo pipefail
pkgs=(chromium chromium-driver docker-compose docker.io debootstrap systemd g++ prometheus)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "system-packages: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "system-packages: not root; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
# the tests use promtool only: a Prometheus server started by the package's install is not wanted
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus.service || true
fi
