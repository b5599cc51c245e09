#!/usr/bin/env bash
# Install what the client conformance suite (clients/) and the PgBouncer tests
# need on Debian 12, skipping what is already there: the drivers from Debian's
# packages, node-postgres from npm into clients/node/node_modules (pinned by
# its package-lock.json).  Run as root (npm alone needs no root).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

packages=(
    python3-psycopg                 # psycopg 3
    python3-asyncpg                 # asyncpg
    golang-go                       # Go, built offline against ...
    golang-github-jackc-pgx-v4-dev  # ... pgx v4 from /usr/share/gocode
    libpostgresql-jdbc-java         # pgjdbc, /usr/share/java/postgresql.jar
    ruby-pg                         # ruby-pg
    libdbd-pg-perl                  # DBI and DBD::Pg
    pgbouncer                       # t/091: the payments service behind PgBouncer
)
# any Node.js with npm, and any JDK, will do: the packages only when missing
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)
command -v javac >/dev/null || packages+=(default-jdk-headless)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "clients/deps: all packages present"
elif [ "$(id -u)" -ne 0 ]; then
    echo "clients/deps: missing packages: ${missing[*]}" >&2
    echo "clients/deps: run as root (or install them) and try again" >&2
    exit 1
else
    echo "clients/deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # the package may start a pgbouncer of its own; the tests start theirs
    if command -v service >/dev/null && [[ " ${missing[*]} " == *" pgbouncer "* ]]; then
        service pgbouncer stop >/dev/null 2>&1 || true
    fi
fi

# node-postgres, exactly as package-lock.json pins it
node_dir=$here/node
if ! cmp -s "$node_dir/package-lock.json" "$node_dir/node_modules/.idem-lock"; then
    echo "clients/deps: npm ci in clients/node"
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$node_dir/package-lock.json" "$node_dir/node_modules/.idem-lock"
fi
echo "clients/deps: done"
