#!/usr/bin/env bash
# make test [PG=17|18]: install what is missing (and build that server unless
# it is cached), build with warnings as errors, install, and run the
# regression, isolation and TAP suites (the TAP suite includes the client
# conformance suite, clients/) against a throwaway cluster that
# preloads pg_cron and idempotency.  Run as root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

# phase NAME: report how long the previous phase took, start the next
phase_start=$SECONDS
phase_name=
phase() {
    if [ -n "$phase_name" ]; then
        echo "test: $phase_name took $((SECONDS - phase_start)) s"
    fi
    phase_name=$1
    phase_start=$SECONDS
}

phase "preparing PostgreSQL $PG"
prepare_server
bash "$top/scripts/fuzz-deps.sh"
# the drivers of the client conformance suite (clients/) and PgBouncer
bash "$top/clients/deps.sh"
# prometheus-postgres-exporter and promtool (t/070_monitoring.pl)
bash "$top/examples/monitoring/deps.sh"
if [ "$PG" = 18 ]; then
    phase "checking the C files' layout (pgindent)"
    CHECK=1 OPTIONAL=1 bash "$top/scripts/pgindent.sh"
fi
phase "building the extension"
stage_tree "$top"
if [ "$PG" = 18 ] && [ -f "$IDEM_PG_CACHE/postgresql-17/.complete" ]; then
    # t/016_pg_upgrade upgrades from PostgreSQL 17 when it is built (make
    # test PG=17 builds it), with this extension installed there too
    from=$IDEM_PG_CACHE/postgresql-17
    echo "test: installing the extension into $from as well, for t/016_pg_upgrade"
    as_postgres make -C "$WORK" -s PG_CONFIG="$from/bin/pg_config" clean >/dev/null
    as_postgres make -C "$WORK" -s PG_CONFIG="$from/bin/pg_config" \
        COPT="-Wall -Wextra -Werror -isystem $("$from/bin/pg_config" --includedir-server)"
    make -C "$WORK" -s PG_CONFIG="$from/bin/pg_config" install >/dev/null
    export IDEM_UPGRADE_FROM=$from
elif [ "$PG" = 18 ]; then
    echo "test: PostgreSQL 17 is not built here: t/016_pg_upgrade upgrades between two clusters of 18"
fi
echo "test: building in $WORK against $("$PG_CONFIG" --version)"
# -isystem keeps PostgreSQL's own headers out of -Wextra's reach.
build_and_install "-Wall -Wextra -Werror -isystem $("$PG_CONFIG" --includedir-server)"
phase "the suites"
cluster_options
# the lifecycle fuzzer (fuzz/lifecycle_fuzz.py) replays commits in commit order
CLUSTER_OPTS+=(-o "track_commit_timestamp=on")
echo "test: starting a throwaway cluster"
rc=0
with_cluster bash "$WORK/scripts/test-cluster.sh" "$WORK" || rc=$?
phase ""
if [ $rc -eq 0 ]; then
    rm -rf "$WORK"
else
    echo "test: FAILED; the build tree is kept in $WORK" >&2
fi
exit $rc
