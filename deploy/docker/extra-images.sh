#!/usr/bin/env bash
# Builds the two images the host-network compose stack adds (docker-compose.host.yml) on the
# local Debian base: PREFIX-kafka:4.1.1 (Apache Kafka from the jars deploy/local-kafka/fetch.sh
# cached) and PREFIX-prometheus:2.42 (Debian's package). Usage:
#   extra-images.sh [BASE_IMAGE] [PREFIX] [kafka|prometheus|all]
# (defaults fx-debian-base:bookworm, ninelives-fx, all). Prints each image's tag.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
base="${1:-fx-debian-base:bookworm}"
prefix="${2:-ninelives-fx}"
which="${3:-all}"
docker="${DOCKER:-docker}"
export DOCKER_BUILDKIT=1
if [[ $which == all || $which == kafka ]]; then
  lib="$(bash "$root/deploy/local-kafka/fetch.sh" --print-lib)"
  version="$(basename "$(dirname "$lib")")"; version="${version#kafka-}"
  ctx="$(mktemp -d /tmp/fx-kafka-image.XXXXXX)"
  trap 'rm -rf "$ctx"' EXIT
  cp -r "$lib" "$ctx/lib"
  cp "$root/deploy/local-kafka/server.properties.template" "$root/deploy/local-kafka/log4j2.properties" \
     "$here/kafka/entrypoint.sh" "$ctx/"
  "$docker" build -q --network host --build-arg BASE_IMAGE="$base" -f "$here/kafka/Dockerfile" \
    -t "$prefix-kafka:$version" "$ctx" >/dev/null
  echo "$prefix-kafka:$version"
fi
if [[ $which == all || $which == prometheus ]]; then
  "$docker" build -q --network host --build-arg BASE_IMAGE="$base" \
    -t "$prefix-prometheus:2.42" "$here/prometheus" >/dev/null
  echo "$prefix-prometheus:2.42"
fi
