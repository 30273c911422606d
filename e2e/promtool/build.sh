#!/usr/bin/env bash
# Builds promtool of one pinned Prometheus release from the Go module proxy: the build module
# gomod/ names it as a tool (github.com/prometheus/prometheus/cmd/promtool at the version it
# requires); its go.sum pins every module's hash. The chart's alert rules are tested with it
# (`promtool test rules`, tests/monitoring/test_monitoring_alerts.py).
#
#   bash e2e/promtool/build.sh            # prints the path of the promtool binary (last line)
#   bash e2e/promtool/build.sh --locate   # only prints it, if it is built (exit 3 otherwise)
#
# The binary is cached in $E2E_PROMTOOL_CACHE (default ~/.cache/quorum-promtool), in a
# directory named after the version and a hash of the build module, so a second run only checks
# it. Needs Go (the version the module names, see `go` in gomod/go.mod) and the Go module proxy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${E2E_PROMTOOL_CACHE:-$HOME/.cache/quorum-promtool}"

die() { echo "e2e/promtool/build.sh: $*" >&2; exit 1; }

version="$(awk '$1 == "github.com/prometheus/prometheus" {print $2; exit}' "$here/gomod/go.mod")"
[ -n "$version" ] || die "cannot read the pinned Prometheus version from gomod/go.mod"
key="$(cat "$here/gomod/go.mod" "$here/gomod/go.sum" "$0" | sha256sum | cut -c1-12)"
out="$cache/prometheus-$version-$key"

if [ "${1:-}" = "--locate" ]; then
  [ -x "$out/promtool" ] || { echo "e2e/promtool/build.sh: not built yet (run: bash e2e/promtool/build.sh)" >&2; exit 3; }
  echo "$out/promtool"
  exit 0
fi
if [ -x "$out/promtool" ]; then
  echo "cached: promtool $version" >&2
else
  command -v go >/dev/null || die "Go is not installed (it builds promtool from the Go module proxy)"
  # The Go release the module names, and no other: a toolchain download is not wanted.
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
  go_wanted="$(awk '$1 == "go" {print $2; exit}' "$here/gomod/go.mod")"
  echo "building promtool $version with $(go version | cut -d' ' -f3) (needs go $go_wanted) into $out" >&2
  stage="$out.partial-$$"
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage"
  started=$SECONDS
  # What Prometheus' own build stamps (promu): unstamped, `promtool --version` says nothing.
  stamp="-s -w -X github.com/prometheus/common/version.Version=${version#v}"
  stamp+=" -X github.com/prometheus/common/version.Branch=HEAD"
  (cd "$here/gomod" && go build -trimpath -ldflags "$stamp" -o "$stage/promtool" \
      github.com/prometheus/prometheus/cmd/promtool) \
    || die "building promtool $version failed"
  rm -rf "$out"
  mv "$stage" "$out"
  trap - EXIT
  echo "built in $((SECONDS - started)) s" >&2
fi
printf '  %s\n' "$("$out/promtool" --version 2>&1 | head -1)" >&2
echo "$out/promtool"
