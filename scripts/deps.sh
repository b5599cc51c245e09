#!/usr/bin/env bash
# Install the Debian 12 packages the extension, its tests and its demo need,
# skipping what is already there; packages named as arguments too (make
# check-valgrind's).  With PG=17 or PG=18 (see scripts/lib.sh), what
# building that server from source needs instead of the postgresql-15
# packages.  Run as root.
set -euo pipefail

if [ "${PG:-15}" = 15 ]; then
    packages=(
        postgresql-15               # server, contrib (pgcrypto, the test oracle)
        postgresql-server-dev-15    # PGXS, headers, pg_regress, isolation tester, TAP modules
        postgresql-15-cron          # pg_cron 1.4: schedules idem_maintain
    )
else
    packages=(
        postgresql-common           # the postgres user (no server)
        dpkg-dev                    # apt-get source unpacks with dpkg-source
        bzip2 xz-utils
        bison flex perl             # the server's build
        libreadline-dev zlib1g-dev libicu-dev pkg-config
        libssl-dev                  # pgcrypto, the test oracle
    )
fi
packages+=(
    libipc-run-perl             # TAP framework
    python3-psycopg             # examples/payments: a real client library,
    python3-psycopg-pool        # its connection pool,
    python3-fastapi             # the web framework of service.py
    python3-uvicorn             # and the server that runs it
    curl                        # the demo talks HTTP to the example service
    make
    gcc
    "$@"
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
# the fingerprint differential runs the RFC 8785 reference implementation
# (npm "canonicalize") on node; any node >= 18 will do, Debian's or another
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "deps: run as root (or install them) and try again" >&2
    exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
