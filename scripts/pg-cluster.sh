#!/usr/bin/env bash
# pg-cluster.sh [-o guc=value]... COMMAND...
#
# Runs COMMAND against a throwaway cluster of the server whose initdb and
# pg_ctl are first on PATH, as Debian's pg_virtualenv does for Debian's own
# packages (see with_cluster in scripts/lib.sh): initdb in a scratch
# directory, the -o settings added to postgresql.conf, the server started
# listening only on a Unix socket in that directory (so no port is shared
# with anything else), and PGHOST, PGPORT, PGUSER and PGDATABASE pointing
# at it.  Afterwards the server is stopped and the directory removed; when
# COMMAND failed, or the server hit an assertion, the end of the server log
# is printed first.  Run as the postgres user (initdb refuses root).
set -euo pipefail

settings=()
while getopts o: opt; do
    case $opt in
        o) settings+=("$OPTARG") ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))

dir=$(mktemp -d /tmp/idempotency-cluster.XXXXXX)
data=$dir/data
log=$dir/server.log
cleanup() {
    pg_ctl -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

if ! initdb -D "$data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    exit 1
fi
{
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = ${PGPORT:-5432}"
    for s in "${settings[@]}"; do
        value=${s#*=}
        echo "${s%%=*} = '${value//\'/\'\'}'"
    done
} >>"$data/postgresql.conf"

if ! pg_ctl -D "$data" -l "$log" -w start >/dev/null; then
    cat "$log" >&2
    exit 1
fi

export PGHOST=$dir PGPORT=${PGPORT:-5432} PGUSER=postgres PGDATABASE=postgres
rc=0
"$@" || rc=$?

pg_ctl -D "$data" -m fast -w stop >/dev/null || rc=1
if grep -q '^TRAP:' "$log"; then
    echo "pg-cluster: the server failed an assertion" >&2
    rc=1
fi
if [ $rc -ne 0 ]; then
    echo "======== server log (last 100 lines)"
    tail -n 100 "$log"
fi
exit $rc
