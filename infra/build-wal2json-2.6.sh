#!/usr/bin/env bash
# Builds wal2json 2.6 for PostgreSQL 15 into a directory of its own (default
# .venv/wal2json-2.6), for the tests of lakecdc's wal2json 2.6 path: a test server loads it
# instead of Debian's 2.5 by putting that directory first in `dynamic_library_path`.
#
# Debian 12 packages only wal2json 2.5, and this machine reaches package registries only:
# - the source is the wal2json_2_6 tag of github.com/eulerto/wal2json (commit 75629c2e1e81),
#   as the Go module proxy serves any public repository's commit, checked against its SHA-256;
# - the server headers are Debian's postgresql-server-dev-15, downloaded and unpacked here
#   of the installed server's version (not installed: its dependencies include clang and
#   LLVM, which a plain build needs not);
# - the build is one gcc call with the compiler flags PostgreSQL's own build uses.
set -euo pipefail

out=${1:-.venv/wal2json-2.6}
[ -f "$out/wal2json.so" ] && exit 0

VERSION=v0.0.0-20240425010238-75629c2e1e81
SHA256=d67e19ac419f66d3b8ad232170f660c67b12dcc6fb7685a29588c29d99576f36
PROXY=${GOPROXY_URL:-https://proxy.golang.org}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v gcc >/dev/null 2>&1 || { echo "building wal2json 2.6 needs gcc: run infra/install-system-deps.sh" >&2; exit 2; }

curl -sSf -o "$work/src.zip" "$PROXY/github.com/eulerto/wal2json/@v/$VERSION.zip"
echo "$SHA256  $work/src.zip" | sha256sum -c --quiet -
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$work/src.zip" "$work/src"

# Headers of the installed server's own version: a point release may add functions that
# its headers' inline code calls (15.20's, for one, calls heap_datum_check, absent in 15.18).
server=$(dpkg-query -W -f='${Version}' postgresql-15)
# apt-get download writes into the current directory as user _apt when it can; a temporary
# directory it may write to keeps that quiet.
chmod 777 "$work"
(cd "$work" && { apt-get download -qq "postgresql-server-dev-15=$server" 2>/dev/null \
    || { apt-get update -qq && apt-get download -qq "postgresql-server-dev-15=$server"; }; })
dpkg-deb -x "$work"/postgresql-server-dev-15_*.deb "$work/dev"

mkdir -p "$out"
gcc -O2 -fPIC -shared -Wall -fno-strict-aliasing -fwrapv -fexcess-precision=standard \
    -I "$work/dev/usr/include/postgresql/15/server" \
    -o "$out/wal2json.so.tmp" "$(find "$work/src" -name wal2json.c)"
mv "$out/wal2json.so.tmp" "$out/wal2json.so"
echo "built wal2json 2.6 into $out"
