#!/usr/bin/env bash
# make test-citus: the extension on a Citus cluster of a coordinator and two
# workers on 127.0.0.1 (PostgreSQL 15).  Uses an installed Citus, or builds
# Citus from CITUS_ARCHIVE (default ../shared/vendor/citus-13.2.2.tar.gz
# beside this checkout) once and caches it (scripts/citus-build.sh); with
# neither, says why and skips (exit 0).  Builds the extension with warnings
# as errors into a private directory, then runs scripts/citus-suite.sh as
# postgres, which prints "suites: N passed, M failed".  Run as root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
PG=15
. "$top/scripts/lib.sh"
. "$top/scripts/citus-build.sh"

if [ "$(id -u)" -ne 0 ]; then
    echo "test-citus: run as root (it installs packages and runs the servers as postgres)" >&2
    exit 1
fi
bash "$top/scripts/deps.sh"
rc=0
citus_locate "$top" || rc=$?
if [ $rc -eq 1 ]; then
    echo "test-citus: skipped: $CITUS_WHY"
    exit 0
elif [ $rc -ne 0 ]; then
    echo "test-citus: $CITUS_WHY" >&2
    echo "suites: 0 passed, 1 failed"
    exit 1
fi

stage_tree "$top"
# Citus and the extension side by side in one private directory, which the
# servers find through extension_destdir and dynamic_library_path
IDEM_DESTDIR=$WORK/dest
mkdir -p "$IDEM_DESTDIR"
if [ -n "$CITUS_DEST" ]; then
    cp -a "$CITUS_DEST/." "$IDEM_DESTDIR/"
fi
export IDEM_DESTDIR
echo "test-citus: building in $WORK against $("$PG_CONFIG" --version)"
build_and_install "-Wall -Wextra -Werror -isystem $("$PG_CONFIG" --includedir-server)"
chown -R postgres:postgres "$WORK"

rc=0
as_postgres env CITUS_KEEP="${CITUS_KEEP:-}" CITUS_ONLY="${CITUS_ONLY:-}" \
    CITUS_BENCH="${CITUS_BENCH:-}" CITUS_BENCH_SECONDS="${CITUS_BENCH_SECONDS:-}" \
    bash "$WORK/scripts/citus-suite.sh" "$WORK" || rc=$?
if [ $rc -eq 0 ] && [ "${CITUS_KEEP:-}" != 1 ]; then
    rm -rf "$WORK"
elif [ $rc -eq 0 ]; then
    echo "test-citus: passed; the cluster is left running (CITUS_KEEP=1), its ports in $WORK/cluster/ports"
else
    echo "test-citus: FAILED; the build tree and the cluster's logs are kept in $WORK" >&2
fi
exit $rc
