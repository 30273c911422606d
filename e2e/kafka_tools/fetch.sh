#!/usr/bin/env bash
# Fetches Apache Kafka's tools (kafka-tools, pinned in pom.xml, and their runtime dependencies)
# from Maven Central into a cache directory, for the tests that run Kafka's own
# kafka-metadata-quorum against a quorum (tests/node/test_kafka_metadata_quorum.py). A no-op when
# the cache holds them already. Prints the directory of the jars (the tool's class path is
# DIR/*). The cache: $E2E_KAFKA_CACHE, else ~/.cache/quorum-kafka-tools.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
cache="${E2E_KAFKA_CACHE:-$HOME/.cache/quorum-kafka-tools}"
lib="$cache/kafka-tools-$version/lib"
if [ ! -f "$lib/.complete" ]; then
    command -v mvn >/dev/null || { echo "fetch.sh: Maven (mvn) is needed" >&2; exit 1; }
    rm -rf "$lib"
    mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$lib" >&2
    touch "$lib/.complete"
fi
echo "$lib"
