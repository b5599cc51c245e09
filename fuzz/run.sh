#!/usr/bin/env bash
# The fuzzers against a running server (libpq environment: PGHOST, PGPORT,
# PGUSER as a superuser), in a database of their own:
#
#   fuzz/run.sh DOCUMENTS CALLS [SCHEDULES]
#
# DOCUMENTS random JSON documents through the fingerprint differential
# (jcs_diff.py), then CALLS random calls of the extension's functions
# (call_fuzz.py), then SCHEDULES (default 0) random schedules of several
# sessions racing over a few keys, checked against a model of the key
# lifecycle (lifecycle_fuzz.py; it needs track_commit_timestamp = on and is
# skipped, saying so, without it).  FUZZ_SEED fixes the seed of all three.
# Needs node and fuzz/node_modules (scripts/fuzz-deps.sh).  Exit status 1
# when any finds a difference or a violation.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
docs=${1:-10000}
calls=${2:-3000}
schedules=${3:-0}
db=idem_fuzz
export FUZZ_SEED=${FUZZ_SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
python=/usr/bin/python3

# pg_virtualenv writes the server log next to its configuration
if [ -z "${FUZZ_SERVER_LOG:-}" ] && [ -n "${PG_CLUSTER_CONF_ROOT:-}" ]; then
    FUZZ_SERVER_LOG=$(ls "$(dirname "$PG_CLUSTER_CONF_ROOT")"/log/*.log 2>/dev/null | head -n 1)
    export FUZZ_SERVER_LOG
fi

psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" \
    -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" || exit 1
PGDATABASE=$db psql -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION idempotency' || exit 1

rc=0
if [ "$docs" -gt 0 ]; then
    start=$SECONDS
    PGDATABASE=$db $python "$here/jcs_diff.py" --docs "$docs" || rc=1
    echo "fuzz: fingerprint differential took $((SECONDS - start)) s"
fi
if [ "$calls" -gt 0 ]; then
    start=$SECONDS
    PGDATABASE=$db $python "$here/call_fuzz.py" --calls "$calls" ${FUZZ_VERBOSE:+--verbose} || rc=1
    echo "fuzz: input fuzzing took $((SECONDS - start)) s"
fi
if [ "$schedules" -gt 0 ]; then
    start=$SECONDS
    if [ "$(psql -X -At -d postgres -c 'SHOW track_commit_timestamp')" != on ]; then
        echo "fuzz: lifecycle schedules skipped: the server runs without track_commit_timestamp = on"
    else
        # a database of its own: it resets the statistics before each schedule
        psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS ${db}_lifecycle" \
            -c "CREATE DATABASE ${db}_lifecycle" || exit 1
        PGDATABASE=${db}_lifecycle psql -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION idempotency' || exit 1
        PGDATABASE=${db}_lifecycle $python "$here/lifecycle_fuzz.py" \
            --seeds "$FUZZ_SEED-$((FUZZ_SEED + schedules - 1))" || rc=1
        psql -X -q -d postgres -c "DROP DATABASE IF EXISTS ${db}_lifecycle" >/dev/null 2>&1
    fi
    echo "fuzz: lifecycle schedules took $((SECONDS - start)) s"
fi
psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "DROP ROLE IF EXISTS idem_fuzz_all" >/dev/null 2>&1
[ $rc -eq 0 ] && echo "fuzz: passed (FUZZ_SEED=$FUZZ_SEED)" || echo "fuzz: FAILED (FUZZ_SEED=$FUZZ_SEED reproduces)"
exit $rc
