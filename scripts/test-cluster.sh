#!/usr/bin/env bash
# Runs inside the throwaway cluster as postgres (from scripts/test.sh): each
# suite in turn, then a summary.  A failing suite prints its diffs and logs.
set -uo pipefail
WORK=$1
PG_CONFIG=${PG_CONFIG:-pg_config}
cd "$WORK"

if psql -X -qAt -d postgres -c 'SHOW shared_preload_libraries' | grep -q pg_cron; then
    psql -X -q -d postgres -c 'CREATE EXTENSION IF NOT EXISTS pg_cron' || exit 1
else
    echo "pg_cron is not installed for this server: the tests that need it are skipped"
fi

passed=0
failed=0
failed_names=()

show_file() {
    if [ -s "$1" ]; then
        echo "======== $1"
        cat "$1"
    fi
}

run_suite() {
    local name=$1
    shift
    local started=$SECONDS rc=0
    echo "======== suite: $name"
    make -s installcheck PG_CONFIG="$PG_CONFIG" "$@" || rc=$?
    echo "======== suite: $name took $((SECONDS - started)) s"
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failed_names+=("$name")
        show_file regression.diffs
        show_file output_iso/regression.diffs
        for f in tmp_check/log/*; do
            [ -f "$f" ] || continue
            echo "======== $f (last 200 lines)"
            tail -n 200 "$f"
        done
    fi
}

# a short run of both fuzzers (make fuzz runs them long)
run_fuzz() {
    echo "======== suite: fuzz"
    if bash fuzz/run.sh "${FUZZ_DOCS:-10000}" "${FUZZ_CALLS:-3000}" "${FUZZ_SCHEDULES:-10}"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failed_names+=(fuzz)
    fi
}

run_suite regression ISOLATION= TAP_TESTS=
run_suite isolation REGRESS= TAP_TESTS=
run_suite tap REGRESS= ISOLATION=
run_fuzz

if [ $failed -ne 0 ]; then
    echo "failed suites: ${failed_names[*]}"
    # the cluster's runner prints the end of the server log on exit
fi
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ]
