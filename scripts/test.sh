#!/usr/bin/env bash
# make test: install what is missing, build with warnings as errors, install,
# and run the regression, isolation and TAP suites (the TAP suite includes
# the client conformance suite, clients/) against a throwaway cluster that
# preloads pg_cron and idempotency.  Run as root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

bash "$top/scripts/deps.sh"
bash "$top/scripts/fuzz-deps.sh"
# the drivers of the client conformance suite (clients/) and PgBouncer
bash "$top/clients/deps.sh"
stage_tree "$top"
echo "test: building in $WORK"
# -isystem keeps PostgreSQL's own headers out of -Wextra's reach.
build_and_install "-Wall -Wextra -Werror -isystem $(pg_config --includedir-server)"
cluster_options
echo "test: starting a throwaway cluster"
rc=0
as_postgres pg_virtualenv "${CLUSTER_OPTS[@]}" bash "$WORK/scripts/test-cluster.sh" "$WORK" || rc=$?
if [ $rc -eq 0 ]; then
    rm -rf "$WORK"
else
    echo "test: FAILED; the build tree is kept in $WORK" >&2
fi
exit $rc
