#!/usr/bin/env bash
# make check-valgrind: the regression and isolation suites, and short runs
# of both fuzzers, against a server running under valgrind (memcheck), then
# a count of the errors valgrind reported: those whose stack passes through
# idempotency.so fail the run.  Run as root.  Slow: each backend runs some
# 30 times slower, about an hour on 2 cores.
#
# The server is PostgreSQL 15 built with USE_VALGRIND and assertions
# (scripts/valgrind-pg.sh, built once and cached), so that reads of freed
# or unallocated palloc memory are seen, not only those of malloc memory.
#
#   VALGRIND_REGRESS="fingerprint keys_lifecycle"   these regression tests only
#   VALGRIND_ISOLATION=""                           no isolation test
#   VALGRIND_FUZZ="DOCUMENTS CALLS"                 fuzzer slices (default "300 300"; "" for none)
#   VALGRIND_TRACK_ORIGINS=1                        origins of uninitialised values (slower)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

bash "$top/scripts/deps.sh" valgrind libssl-dev bzip2
bash "$top/scripts/fuzz-deps.sh"
prefix=$(bash "$top/scripts/valgrind-pg.sh")
stage_tree "$top"
echo "check-valgrind: building in $WORK against $prefix"
as_postgres make -C "$WORK" -s clean >/dev/null
as_postgres make -C "$WORK" -s PG_CONFIG="$prefix/bin/pg_config"
make -C "$WORK" -s PG_CONFIG="$prefix/bin/pg_config" install >/dev/null
rc=0
as_postgres env VALGRIND_REGRESS="${VALGRIND_REGRESS-}" VALGRIND_ISOLATION="${VALGRIND_ISOLATION-all}" \
    VALGRIND_FUZZ="${VALGRIND_FUZZ-300 300}" VALGRIND_TRACK_ORIGINS="${VALGRIND_TRACK_ORIGINS:-}" \
    bash "$WORK/scripts/valgrind-cluster.sh" "$WORK" "$prefix" || rc=$?
if [ $rc -eq 0 ]; then
    rm -rf "$WORK"
else
    echo "check-valgrind: FAILED; the build tree and valgrind's logs are kept in $WORK" >&2
fi
exit $rc
