#!/usr/bin/env bash
# Run the client conformance scenario with each driver (default: all).
#
#   clients/run.sh [node psycopg asyncpg pgx jdbc ruby perl]
#
# The database comes from the libpq environment (PGHOST, PGPORT, PGDATABASE;
# PGHOST must be a host name or address: JDBC has no Unix sockets).  The
# clients log in as IDEM_APP_USER and IDEM_WORKER_USER (default client_app
# and client_worker, created by clients/setup.sql).  IDEM_PGBOUNCER=1 says
# the connection goes through PgBouncer in transaction mode.
#
# The Go and Java builds are kept in CLIENTS_CACHE (default
# ~/.cache/idempotency-clients), one directory per source hash, so only a
# changed source is built again.  Install the drivers with clients/deps.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export IDEM_APP_USER=${IDEM_APP_USER:-client_app}
export IDEM_WORKER_USER=${IDEM_WORKER_USER:-client_worker}
CLIENTS_CACHE=${CLIENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotency-clients}
JDBC_JAR=${JDBC_JAR:-/usr/share/java/postgresql.jar}
PYTHON=${PYTHON:-/usr/bin/python3}   # Debian's, where python3-psycopg and python3-asyncpg are

all=(node psycopg asyncpg pgx jdbc ruby perl)
[ $# -gt 0 ] || set -- "${all[@]}"

# Directory for a build of the given source files, by their content.
build_dir() {
    local sum
    sum=$(cat "$@" | sha256sum | cut -c1-16)
    echo "$CLIENTS_CACHE/$sum"
}

build_pgx() {
    local dir
    dir=$(build_dir "$here/go/conformance.go") || return 1
    if [ ! -x "$dir/conformance-pgx" ]; then
        mkdir -p "$dir" || return 1
        # offline, against Debian's Go packages (golang-github-jackc-pgx-v4-dev)
        (cd "$here/go" &&
            GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= \
            GOCACHE=${GOCACHE:-$CLIENTS_CACHE/go-build} \
            go build -o "$dir/conformance-pgx.tmp" . &&
            mv "$dir/conformance-pgx.tmp" "$dir/conformance-pgx") || return 1
    fi
    PGX_BIN=$dir/conformance-pgx
}

build_jdbc() {
    local dir
    dir=$(build_dir "$here/java/Conformance.java") || return 1
    if [ ! -f "$dir/Conformance.class" ]; then
        mkdir -p "$dir.tmp" || return 1
        javac -Xlint:all -Werror -cp "$JDBC_JAR" -d "$dir.tmp" "$here/java/Conformance.java" &&
            rm -rf "$dir" && mv "$dir.tmp" "$dir" || return 1
    fi
    JDBC_CLASSES=$dir
}

run_client() {
    case $1 in
    node) (cd "$here/node" && node conformance.js) ;;
    psycopg) "$PYTHON" "$here/python/conformance_psycopg.py" ;;
    asyncpg) "$PYTHON" "$here/python/conformance_asyncpg.py" ;;
    pgx) build_pgx && "$PGX_BIN" ;;
    jdbc) build_jdbc && java -cp "$JDBC_CLASSES:$JDBC_JAR" Conformance ;;
    ruby) ruby "$here/ruby/conformance.rb" ;;
    perl) perl "$here/perl/conformance.pl" ;;
    *) echo "clients: unknown client $1 (known: ${all[*]})" >&2; return 2 ;;
    esac
}

passed=0
failed=0
failed_names=()
for c in "$@"; do
    echo "== $c${IDEM_PGBOUNCER:+ (through PgBouncer)}"
    start=$EPOCHREALTIME
    if run_client "$c"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failed_names+=("$c")
    fi
    awk -v c="$c" -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "== %s: %.1f s\n", c, b - a }'
done
[ $failed -eq 0 ] || echo "clients failed: ${failed_names[*]}"
echo "clients: $passed passed, $failed failed"
[ $failed -eq 0 ]
