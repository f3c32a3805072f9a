#!/bin/sh
# What the Makefile's targets need from the machine, checked before they run:
#   venv        Python's venv module with ensurepip (Debian: python3-venv)
#   postgresql  PostgreSQL's server binaries, for the tests' throwaway cluster
#               (not needed when LEDGERQ_TEST_PG names a server)
#   chromium    headless Chromium, for the dashboard's browser test
# Whatever is missing is installed with apt-get when running as root on
# Debian; otherwise one line says what to install, and the target stops.
set -eu
PYTHON="${PYTHON:-python3}"
PG_ROOT="${PG_ROOT:-/usr/lib/postgresql}"   # where Debian puts the server binaries

has_venv() { "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; }
has_postgresql() {
  [ -n "${LEDGERQ_TEST_PG:-}" ] && return 0
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
  for bin in "$PG_ROOT"/*/bin; do
    [ -x "$bin/initdb" ] && [ -x "$bin/postgres" ] && return 0
  done
  return 1
}
has_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }

missing=""
for need in "$@"; do
  case "$need" in
    venv) has_venv || missing="$missing python3-venv" ;;
    postgresql) has_postgresql || missing="$missing postgresql" ;;
    chromium) has_chromium || missing="$missing chromium" ;;
    *) echo "prerequisites.sh: unknown need '$need'" >&2; exit 2 ;;
  esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing:$missing"
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  exit 0
fi
case "$missing" in
  *postgresql*) alternative=" (or set LEDGERQ_TEST_PG to a PostgreSQL server's URL)" ;;
  *) alternative="" ;;
esac
echo "missing:$missing — install with: sudo apt-get install -y$missing$alternative" >&2
exit 1
