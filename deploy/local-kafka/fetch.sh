#!/usr/bin/env bash
# Fetch Apache Kafka (broker + tools) and a log4j2 binding from Maven Central into a cache:
#   ${FX_CACHE_DIR:-$HOME/.cache/ninelives-fx}/kafka-<version>/lib
# Idempotent: a marker file records the sha256 of pom.xml and the Kafka version; a complete cache
# for the same pom is left alone (a few milliseconds). A changed pom refetches.
# Usage: fetch.sh [--print-lib] [--mirror]   KAFKA_VERSION=x.y.z overrides the pom's version.
# --mirror also builds MirrorMaker 2 for `fx mirror` (mirror/pom.xml: connect-mirror and this
# project's SourceOffsetHeader transform, compiled, so a JDK is needed) into kafka-<version>/mirror,
# with its own marker (.mirror-fetched: the sha256 of mirror/pom.xml and mirror/src).
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
mirror=0
for arg in "$@"; do
  case "$arg" in
    --print-lib) print_lib=1 ;;
    --mirror) mirror=1 ;;
    *) echo "fetch.sh: unknown argument $arg (use --print-lib, --mirror)" >&2; exit 2 ;;
  esac
done

mirror_src="$here/mirror"
mirror_dir="$dest/mirror"
mirror_marker="$dest/.mirror-fetched"
mirror_want() {
  (cd "$mirror_src" && find pom.xml src -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) \
    | sha256sum | cut -d' ' -f1 | sed "s/\$/ $version/"
}
mirror_complete() {
  [[ -f "$mirror_marker" && "$(cat "$mirror_marker")" == "$(mirror_want)" && -d "$mirror_dir" ]]
}
fetch_mirror() {
  if mirror_complete; then return 0; fi
  command -v mvn >/dev/null || { echo "fetch.sh: mvn (Maven 3.8+) not found on PATH" >&2; exit 2; }
  command -v javac >/dev/null || {
    echo "fetch.sh --mirror: javac not found: building the fx mirror transform needs a JDK 17+" >&2
    exit 2; }
  exec 8>"$dest/.mirror-lock"
  flock 8
  if mirror_complete; then return 0; fi
  local t0 mtmp
  t0=$(date +%s.%N)
  mtmp="$(mktemp -d "$dest/mirror.tmp.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$mtmp'" EXIT
  echo "fetch.sh: building MirrorMaker 2 + the fx transform into $mirror_dir" >&2
  mvn -q -B -Dstyle.color=never -f "$mirror_src/pom.xml" -Dkafka.version="$version" \
      -Dfx.build.dir="$mtmp/build" package dependency:copy-dependencies \
      -DoutputDirectory="$mtmp/lib" -DincludeScope=runtime 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
  ls "$mtmp"/lib/connect-mirror-"$version".jar "$mtmp"/build/fx-mirror-1.jar >/dev/null
  cp "$mtmp"/build/fx-mirror-1.jar "$mtmp"/lib/
  # only what the broker's lib does not hold already (MirrorMaker runs on lib/* + mirror/*)
  for jar in "$mtmp"/lib/*.jar; do
    [[ -e "$lib/$(basename "$jar")" ]] && rm -f "$jar"
  done
  rm -rf "$mirror_dir" "$mirror_marker"
  mv "$mtmp/lib" "$mirror_dir"
  rm -rf "$mtmp"
  trap - EXIT
  mirror_want > "$mirror_marker"
  awk -v n="$(ls "$mirror_dir" | wc -l)" -v s="$t0" -v e="$(date +%s.%N)" \
      'BEGIN { printf "fetch.sh: MirrorMaker 2 (%d jars) in %.1f s\n", n, e - s }' >&2
}

done_() {
  [[ $mirror == 1 ]] && fetch_mirror
  [[ $print_lib == 1 ]] && echo "$lib"
  exit 0
}

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
