#!/usr/bin/env bash
# make crash: the reliability runs on their own, with more injected crashes
# than "make test" uses: the failover test (t/095) and the crash injection
# test (t/096) with CRASHES crashes (default 60).  Run as root; each test
# starts its own clusters.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

crashes=${CRASHES:-60}
prepare_server
stage_tree "$top"
echo "crash: building in $WORK"
build_and_install ""
echo "crash: failover, then $crashes injected crashes"
rc=0
as_postgres env IDEM_CRASHES="$crashes" make -C "$WORK" -s installcheck \
    REGRESS= ISOLATION= \
    PROVE_TESTS='t/095_payments_failover.pl t/096_crash_injection.pl' || rc=$?
if [ $rc -eq 0 ]; then
    rm -rf "$WORK"
else
    for f in "$WORK"/tmp_check/log/regress_log_*; do
        [ -f "$f" ] || continue
        echo "======== $f (last 100 lines)"
        tail -n 100 "$f"
    done
    echo "crash: FAILED; the build tree is kept in $WORK" >&2
fi
exit $rc
