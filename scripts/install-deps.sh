#!/usr/bin/env bash
# Installs everything oml needs to build, run and test on a fresh Debian 12 machine.
# Idempotent: it only installs what is missing. Needs root (or sudo) for apt.
# `--bench` also installs what bench/ needs (wrk, the openssl command).
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git curl
  libpq-dev libssl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libcpp-httplib-dev prometheus-cpp-dev libtomlplusplus-dev libgtest-dev googletest
  postgresql-15 postgresql-contrib sudo python3-venv
)
if [ "${1:-}" = "--bench" ]; then APT_PACKAGES+=(wrk openssl); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt packages missing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian's package creates and starts a default cluster; oml never uses it.
  if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q '^15 *main'; then
    $SUDO pg_ctlcluster 15 main stop 2>/dev/null || true
  fi
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
