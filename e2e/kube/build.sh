#!/usr/bin/env bash
# Builds a Kubernetes control plane from the Go module proxy: etcd (go.etcd.io/etcd/server/v3's
# etcdmain) and kube-apiserver, kube-controller-manager, kube-scheduler and kubectl of one
# pinned Kubernetes release (k8s.io/kubernetes, its staging modules replaced by their published
# versions: gomod/kube/go.mod). The versions are those the two build modules require; their
# go.sum files pin every module's hash.
#
#   bash e2e/kube/build.sh            # prints the directory that holds the binaries (last line)
#   bash e2e/kube/build.sh --locate   # only prints it, if they are built (exit 3 otherwise)
#
# The binaries are cached in $E2E_KUBE_CACHE (default ~/.cache/quorum-kube), in a directory
# named after the versions and a hash of the build modules, so a second run only checks them.
# Needs Go (the version the modules name, see `go` in gomod/*/go.mod) and the Go module proxy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${E2E_KUBE_CACHE:-$HOME/.cache/quorum-kube}"

die() { echo "e2e/kube/build.sh: $*" >&2; exit 1; }
command -v go >/dev/null || die "Go is not installed (it builds the control plane from the Go module proxy)"

required() {  # the version of module $2 that build module $1 requires
  awk -v m="$2" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$here/gomod/$1/go.mod" | head -1
}
kube_version="$(required kube k8s.io/kubernetes)"
etcd_version="$(required etcd go.etcd.io/etcd/server/v3)"
[ -n "$kube_version" ] && [ -n "$etcd_version" ] || die "cannot read the pinned versions from gomod/*/go.mod"
key="$(cat "$here"/gomod/*/go.mod "$here"/gomod/*/go.sum "$here"/gomod/etcd/main.go "$0" | sha256sum | cut -c1-12)"
out="$cache/kube-$kube_version-etcd-$etcd_version-$key"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

complete() { for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done; }

if [ "${1:-}" = "--locate" ]; then
  complete || { echo "e2e/kube/build.sh: not built yet (run: bash e2e/kube/build.sh)" >&2; exit 3; }
  echo "$out"
  exit 0
fi
if complete; then
  echo "cached: Kubernetes $kube_version, etcd $etcd_version" >&2
else
  # The Go release the modules name, and no other: a toolchain download is not wanted.
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
  go_wanted="$(awk '$1 == "go" {print $2; exit}' "$here/gomod/kube/go.mod")"
  echo "building Kubernetes $kube_version and etcd $etcd_version with $(go version | cut -d' ' -f3) (needs go $go_wanted) into $out" >&2
  stage="$out.partial-$$"
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage"
  started=$SECONDS
  (cd "$here/gomod/etcd" && go build -trimpath -ldflags "-s -w" -o "$stage/etcd" .) \
    || die "building etcd $etcd_version failed"
  echo "  etcd: $((SECONDS - started)) s" >&2
  # What Kubernetes' own build stamps (hack/lib/version.sh): discovery, kubectl's version skew
  # check and charts' kubeVersion read it; unstamped, the binaries say v0.0.0.
  minor="${kube_version#v1.}"; minor="${minor%%.*}"
  stamp="-s -w"
  for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $package.gitVersion=$kube_version -X $package.gitMajor=1 -X $package.gitMinor=$minor"
    stamp+=" -X $package.gitTreeState=clean"
  done
  for command in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    step=$SECONDS
    (cd "$here/gomod/kube" && go build -trimpath -ldflags "$stamp" -o "$stage/$command" "k8s.io/kubernetes/cmd/$command") \
      || die "building $command $kube_version failed"
    echo "  $command: $((SECONDS - step)) s" >&2
  done
  rm -rf "$out"
  mv "$stage" "$out"
  trap - EXIT
  echo "built in $((SECONDS - started)) s" >&2
fi
for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
  printf '  %-24s %s\n' "$b" "$("$out/$b" --version 2>&1 | head -1)" >&2
done
printf '  %-24s %s\n' kubectl "$("$out/kubectl" version --client 2>&1 | head -1)" >&2
echo "$out"
