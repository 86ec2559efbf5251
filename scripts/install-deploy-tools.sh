#!/usr/bin/env bash
# Installs the tools tests/test_deploy.py validates deploy/ with, pinned, into $OML_CACHE
# (default ~/.cache/oml). Idempotent and offline once installed: it only checks that the pinned
# files exist, and calls `go` only for what is missing.
#
#   kustomize          sigs.k8s.io/kustomize/kustomize/v5 (built by `go install` from the Go module
#                      proxy into $OML_CACHE/bin). v5.8.1 is the newest release whose go.mod accepts
#                      this machine's Go 1.26 (v5.8.3 asks for go 1.27).
#   CRD schemas        the operators' own CustomResourceDefinitions, which ship inside their Go
#                      modules (`go mod download` into $OML_CACHE/gomod; nothing is copied into the
#                      repository):
#                        github.com/cloudnative-pg/cloudnative-pg  config/crd/bases/postgresql.cnpg.io_*.yaml
#                        github.com/cloudnative-pg/plugin-barman-cloud  config/crd/bases/barmancloud.cnpg.io_objectstores.yaml
#                        github.com/prometheus-operator/prometheus-operator  example/prometheus-operator-crd/*.yaml
#
# The Python side (kubernetes-validate, jsonschema) is pinned in tests/requirements.txt.
#
# Usage: scripts/install-deploy-tools.sh [--print]
#   --print  also print KEY=VALUE lines with the installed paths on stdout (tests/test_deploy.py
#            reads them, so the pins live in this file only). Progress goes to stderr.
set -euo pipefail

KUSTOMIZE_VERSION=v5.8.1
CNPG_VERSION=v1.27.1
BARMAN_CLOUD_VERSION=v0.15.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0

OML_CACHE="${OML_CACHE:-$HOME/.cache/oml}"
BIN="$OML_CACHE/bin"
# The module cache is writable (-modcacherw) so that `rm -rf ~/.cache/oml` works; GOTOOLCHAIN=local:
# never fetch another Go toolchain behind the caller's back; GOFLAGS is replaced, not inherited.
export GOMODCACHE="$OML_CACHE/gomod" GOCACHE="$OML_CACHE/go-build" GOBIN="$BIN"
export GOFLAGS=-modcacherw GOTOOLCHAIN=local

KUSTOMIZE="$BIN/kustomize-$KUSTOMIZE_VERSION"
CNPG_DIR="$GOMODCACHE/github.com/cloudnative-pg/cloudnative-pg@$CNPG_VERSION"
BARMAN_DIR="$GOMODCACHE/github.com/cloudnative-pg/plugin-barman-cloud@$BARMAN_CLOUD_VERSION"
PROMOP_DIR="$GOMODCACHE/github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION"

need_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "install-deploy-tools: 'go' is not on PATH; it is needed once to fetch $1" >&2
    exit 3
  fi
}

if [ ! -x "$KUSTOMIZE" ]; then
  need_go "kustomize $KUSTOMIZE_VERSION"
  echo "install-deploy-tools: building kustomize $KUSTOMIZE_VERSION (about a minute, once)" >&2
  mkdir -p "$BIN"
  tmp="$(mktemp -d)"
  # Built into a scratch GOBIN, then renamed: a half-built binary never has the final name.
  GOBIN="$tmp" go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" >&2
  mv "$tmp/kustomize" "$KUSTOMIZE"
  rmdir "$tmp"
fi

fetch_module() {  # module version dir
  if [ ! -d "$3" ]; then
    need_go "$1@$2"
    echo "install-deploy-tools: fetching $1@$2" >&2
    go mod download -json "$1@$2" >/dev/null
  fi
}
fetch_module github.com/cloudnative-pg/cloudnative-pg "$CNPG_VERSION" "$CNPG_DIR"
fetch_module github.com/cloudnative-pg/plugin-barman-cloud "$BARMAN_CLOUD_VERSION" "$BARMAN_DIR"
fetch_module github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" "$PROMOP_DIR"

"$KUSTOMIZE" version | grep -qx "$KUSTOMIZE_VERSION" || {
  echo "install-deploy-tools: $KUSTOMIZE does not report $KUSTOMIZE_VERSION" >&2
  exit 1
}

if [ "${1:-}" = "--print" ]; then
  echo "KUSTOMIZE=$KUSTOMIZE"
  echo "KUSTOMIZE_VERSION=$KUSTOMIZE_VERSION"
  echo "CNPG_VERSION=$CNPG_VERSION"
  echo "CNPG_CRDS=$CNPG_DIR/config/crd/bases"
  echo "BARMAN_CLOUD_VERSION=$BARMAN_CLOUD_VERSION"
  echo "BARMAN_CLOUD_CRDS=$BARMAN_DIR/config/crd/bases"
  echo "PROMETHEUS_OPERATOR_VERSION=$PROMETHEUS_OPERATOR_VERSION"
  echo "PROMETHEUS_OPERATOR_CRDS=$PROMOP_DIR/example/prometheus-operator-crd"
fi
