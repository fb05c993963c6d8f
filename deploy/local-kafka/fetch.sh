#!/usr/bin/env bash
# Fetch Apache Kafka (broker + tools) and a log4j2 binding from Maven Central into a cache:
#   ${FX_CACHE_DIR:-$HOME/.cache/ninelives-fx}/kafka-<version>/lib
# Idempotent: a marker file records the sha256 of pom.xml and the Kafka version; a complete cache
# for the same pom is left alone (a few milliseconds). A changed pom refetches.
# Usage: fetch.sh [--print-lib]        KAFKA_VERSION=x.y.z overrides the pom's version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/pom.xml"
pom_version="$(sed -n 's#.*<kafka.version>\(.*\)</kafka.version>.*#\1#p' "$pom")"
version="${KAFKA_VERSION:-$pom_version}"
cache_root="${FX_CACHE_DIR:-$HOME/.cache/ninelives-fx}"
dest="$cache_root/kafka-$version"
lib="$dest/lib"
marker="$dest/.fetched"
want="$(sha256sum "$pom" | cut -d' ' -f1) $version"

print_lib=0
[[ "${1:-}" == "--print-lib" ]] && print_lib=1
done_() { [[ $print_lib == 1 ]] && echo "$lib"; exit 0; }

complete() { [[ -f "$marker" && "$(cat "$marker")" == "$want" && -d "$lib" ]]; }

if complete; then done_; fi

command -v mvn >/dev/null || { echo "fetch.sh: mvn (Maven 3.8+) not found on PATH" >&2; exit 2; }
mkdir -p "$dest"
# One fetch at a time per version (parallel test sessions, CI steps).
exec 9>"$dest/.lock"
flock 9
if complete; then done_; fi

start=$(date +%s.%N)
tmp="$(mktemp -d "$dest/lib.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetch.sh: fetching Kafka $version into $lib" >&2
# (Maven 3.8 prints bare ANSI resets even with -q -B; strip them.)
mvn -q -B -Dstyle.color=never -f "$pom" -Dkafka.version="$version" dependency:copy-dependencies \
    -DoutputDirectory="$tmp" -DincludeScope=runtime 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
ls "$tmp"/kafka_2.13-"$version".jar "$tmp"/kafka-tools-"$version".jar >/dev/null
rm -rf "$lib" "$marker"
mv "$tmp" "$lib"
trap - EXIT
echo "$want" > "$marker"
end=$(date +%s.%N)
awk -v n="$(ls "$lib" | wc -l)" -v s="$start" -v e="$end" \
    'BEGIN { printf "fetch.sh: %d jars in %.1f s\n", n, e - s }' >&2
done_
