#!/usr/bin/env bash
# Runs as postgres (from scripts/check-valgrind.sh): a cluster whose server
# runs under valgrind, the suites against it, then valgrind's verdict.
set -uo pipefail
WORK=$1
prefix=$2
vg=$WORK/valgrind
mkdir -p "$vg/logs"
export PATH="$prefix/bin:$PATH"
cd "$WORK"

initdb -D "$vg/data" -A trust -E UTF8 --locale=C.UTF-8 -U postgres >"$vg/initdb.log" 2>&1 ||
    { cat "$vg/initdb.log"; exit 1; }
cat >> "$vg/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$vg'
port = 5432
shared_preload_libraries = 'idempotency'
fsync = off
autovacuum = off
max_connections = 40
log_line_prefix = '%m [%p] '
CONF

# the postmaster and every backend it forks run under memcheck; one log per
# process, each error between markers.  VALGRIND_TRACK_ORIGINS=1 says where
# uninitialised values come from (twice as slow).
track_origins=
[ -n "${VALGRIND_TRACK_ORIGINS:-}" ] && track_origins=--track-origins=yes
cat > "$vg/postgres" <<WRAP
#!/bin/sh
exec valgrind --quiet --trace-children=yes $track_origins --read-var-info=no \\
    --num-callers=40 --leak-check=no --gen-suppressions=all --fullpath-after= \\
    --suppressions="$WORK/scripts/valgrind.supp" \\
    --error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END \\
    --log-file="$vg/logs/%p.log" "$prefix/bin/postgres" "\$@"
WRAP
chmod +x "$vg/postgres"

# PostgreSQL's jsonb_agg takes time quadratic in the number of elements
# under memcheck (not natively): the fingerprint test's 50,000-line request
# would take hours, 5,000 lines take about a minute.  The same edit in the
# test and its expected output (which echoes the statements).
for f in sql/fingerprint.sql expected/fingerprint.out; do
    if grep -q 'generate_series(1, 50000)' "$f"; then
        sed -i -e 's/generate_series(1, 50000)/generate_series(1, 5000)/' \
               -e 's/{lines,49999,qty}/{lines,4999,qty}/g' \
               -e 's|/lines/49999/qty|/lines/4999/qty|g' \
               -e 's/> 10 \* 1024 \* 1024 AS over_10mib/> 1024 * 1024 AS over_10mib/' "$f"
    else
        echo "check-valgrind: $f has no 50,000-line request to shrink any more"
    fi
done

export PGHOST=$vg PGPORT=5432 PGUSER=postgres
start=$SECONDS
echo "check-valgrind: starting the server under valgrind"
pg_ctl -D "$vg/data" -p "$vg/postgres" -l "$vg/server.log" -t 900 -w start >/dev/null ||
    { tail -n 50 "$vg/server.log"; exit 1; }

suites=0
suites_failed=()
suite() {
    local name=$1
    shift
    echo "======== suite: $name (under valgrind)"
    local t0=$SECONDS
    if "$@"; then
        suites=$((suites + 1))
    else
        suites_failed+=("$name")
        for f in regression.diffs output_iso/regression.diffs; do
            [ -s "$f" ] && { echo "======== $f"; head -n 200 "$f"; }
        done
    fi
    echo "check-valgrind: $name took $((SECONDS - t0)) s"
}

# Every regression test but those whose expected output counts on work
# finishing within a statement_timeout, which a server some 30 times slower
# does not meet (they are named with VALGRIND_REGRESS to run them anyway).
VALGRIND_SKIP_REGRESS="outbox_lease_deadline"
if [ -z "${VALGRIND_REGRESS:-}" ]; then
    VALGRIND_REGRESS=$(cd sql && for f in *.sql; do
        t=${f%.sql}
        case " $VALGRIND_SKIP_REGRESS " in *" $t "*) ;; *) echo "$t" ;; esac
    done | LC_ALL=C sort | tr '\n' ' ')
    echo "check-valgrind: leaving out $VALGRIND_SKIP_REGRESS (bound by a statement_timeout)"
fi
regress_args=(REGRESS="$VALGRIND_REGRESS")
isolation_args=()
[ "${VALGRIND_ISOLATION-all}" != all ] && isolation_args=(ISOLATION="$VALGRIND_ISOLATION")

suite regression make -s installcheck PG_CONFIG="$prefix/bin/pg_config" ISOLATION= TAP_TESTS= \
    "${regress_args[@]}"
if [ "${VALGRIND_ISOLATION-all}" != "" ]; then
    suite isolation make -s installcheck PG_CONFIG="$prefix/bin/pg_config" REGRESS= TAP_TESTS= \
        "${isolation_args[@]}"
fi
if [ -n "${VALGRIND_FUZZ:-}" ]; then
    # shellcheck disable=SC2086
    export FUZZ_SERVER_LOG="$vg/server.log"
    suite fuzz bash fuzz/run.sh $VALGRIND_FUZZ
fi

pg_ctl -D "$vg/data" -m fast -t 900 -w stop >/dev/null || echo "check-valgrind: the server did not stop cleanly"
echo "check-valgrind: server under valgrind for $((SECONDS - start)) s"

/usr/bin/python3 "$WORK/scripts/valgrind-report.py" "$vg/logs" "$WORK"
verdict=$?
if [ ${#suites_failed[@]} -ne 0 ]; then
    echo "check-valgrind: suites with differences under valgrind: ${suites_failed[*]}"
fi
[ $verdict -eq 0 ] && [ ${#suites_failed[@]} -eq 0 ]
