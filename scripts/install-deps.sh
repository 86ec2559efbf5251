#!/usr/bin/env bash
# Installs everything oml needs to build, run and test on a fresh Debian 12 machine.
# Idempotent: it only installs what is missing. Needs root (or sudo) for apt.
# `--bench` also installs what bench/ needs (wrk, the openssl command).
set -euo pipefail

# postgresql-15-plpgsql-check: the PL/pgSQL lint of tests/test_db_boundary.py (issue 17).
# libjemalloc-dev: the `oml` binary's allocator (src/cli/CMakeLists.txt says why); libsimdjson-dev:
# the reconciler's envelope parser (src/journal/event.cc).
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache mold git curl
  libpq-dev libssl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libboost1.81-dev prometheus-cpp-dev libtomlplusplus-dev libgtest-dev googletest
  libmagic-dev libmagic-mgc libpoppler-cpp-dev libre2-dev poppler-utils libjemalloc-dev libsimdjson-dev
  postgresql-15 postgresql-contrib postgresql-15-plpgsql-check sudo python3-venv locales
)
if [ "${1:-}" = "--bench" ]; then APT_PACKAGES+=(wrk openssl); fi

# Spark 4.0 (tests/test_lake_spark.py) runs on Java 17 or 21. Any such runtime already present
# will do ($JAVA_HOME, java on PATH, /usr/lib/jvm); otherwise Debian's Java 17 runtime.
java_17_or_21() {
  local j
  for j in "${JAVA_HOME:-/nonexistent}/bin/java" "$(command -v java || echo /nonexistent)" /usr/lib/jvm/*/bin/java; do
    [ -x "$j" ] && "$j" -version 2>&1 | head -1 | grep -qE '"(17|21)[."]' && return 0
  done
  return 1
}
if ! java_17_or_21; then
  APT_PACKAGES+=(openjdk-17-jre-headless)
  # Slim images drop /usr/share/man, and the JRE's postinst fails without its man1 folder.
  mkdir -p /usr/share/man/man1 2>/dev/null || true
fi

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

# A non-English OS locale, so the tests can run PostgreSQL with translated server messages and
# show that oml does not depend on the server's language (src/journal/journal_pg_test.cc,
# "TranslatedServer"). PostgreSQL's own translations come with postgresql-15; setlocale() also
# needs the OS locale, which Debian generates only on request.
if ! locale -a 2>/dev/null | grep -qix 'de_DE\.utf-\?8'; then
  echo "install-deps: generating the de_DE.UTF-8 locale (for the translated-messages tests)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if [ -f /etc/locale.gen ] && command -v locale-gen >/dev/null; then
    grep -q '^de_DE.UTF-8 UTF-8' /etc/locale.gen || echo 'de_DE.UTF-8 UTF-8' | $SUDO tee -a /etc/locale.gen >/dev/null
    $SUDO locale-gen >/dev/null || echo "install-deps: locale-gen failed; the translated-messages tests will be skipped" >&2
  else
    echo "install-deps: no locale-gen; the translated-messages tests will be skipped" >&2
  fi
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
