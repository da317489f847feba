#!/usr/bin/env bash
# Installs what lakecdc needs from Debian's archive on a fresh machine, and nothing already
# present: make and Python 3 with venv (the README's two commands), CA certificates (pip's
# downloads from PyPI, Ivy's of the Delta jars from Maven Central), PostgreSQL 15 with the
# wal2json output plugin (for the tests and the demo) and a Java 17 runtime (for Spark).
# Nothing is compiled. On a bare machine run it directly
# (`bash infra/install-system-deps.sh`) or install make first: `make` runs it too. Debian's postgresql package would create and start a "main" cluster
# on port 5432; lakecdc starts its own throw-away clusters instead, so that is switched off.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need=()
command -v make >/dev/null 2>&1 || need+=(make)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# Debian's python3 has no venv/ensurepip without python3-venv.
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
[ -x /usr/lib/postgresql/15/bin/pg_ctl ] || need+=(postgresql-15)
[ -f /usr/lib/postgresql/15/lib/wal2json.so ] || need+=(postgresql-15-wal2json)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)

if [ ${#need[@]} -eq 0 ]; then
    echo "system dependencies present"
    exit 0
fi

echo "installing: ${need[*]}"
$SUDO mkdir -p /etc/postgresql-common
if ! grep -qs '^create_main_cluster *= *false' /etc/postgresql-common/createcluster.conf; then
    echo "create_main_cluster = false" | $SUDO tee -a /etc/postgresql-common/createcluster.conf >/dev/null
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
