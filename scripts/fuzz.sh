#!/usr/bin/env bash
# make fuzz: the fingerprint differential over FUZZ_DOCS random documents
# (default 1,000,000), the input fuzzer over FUZZ_CALLS random calls
# (default 100,000) and the lifecycle fuzzer over FUZZ_SCHEDULES schedules
# (default 100), against a throwaway cluster like make test's.  FUZZ_SEED
# reproduces a run; FUZZ_VERBOSE=1 prints every function's SQLSTATEs.
# Run as root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

prepare_server
bash "$top/scripts/fuzz-deps.sh"
stage_tree "$top"
echo "fuzz: building in $WORK"
build_and_install "-Wall -Wextra -Werror -isystem $("$PG_CONFIG" --includedir-server)"
cluster_options
# the lifecycle fuzzer replays commits in commit order
CLUSTER_OPTS+=(-o "track_commit_timestamp=on")
export FUZZ_DOCS=${FUZZ_DOCS:-1000000} FUZZ_CALLS=${FUZZ_CALLS:-100000}
export FUZZ_SCHEDULES=${FUZZ_SCHEDULES:-100}
rc=0
with_cluster bash "$WORK/fuzz/run.sh" "$FUZZ_DOCS" "$FUZZ_CALLS" "$FUZZ_SCHEDULES" || rc=$?
rm -rf "$WORK"
exit $rc
