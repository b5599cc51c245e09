#!/usr/bin/env bash
# make bench [BENCH="fingerprint keys ..."]: build and install as make test
# does, start a throwaway cluster, and run each workload under bench/NAME/
# (its run.sh), which prints ratios against a baseline measured in the same
# run.  Run as root.  Not part of make test: timings belong here, not in tests.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

prepare_server
stage_tree "$top"
build_and_install ""
cluster_options
# benchmarks run with durable commits, as production does
CLUSTER_OPTS=("${CLUSTER_OPTS[@]/fsync=off/fsync=on}")
CLUSTER_OPTS+=(-o "shared_buffers=1GB" -o "max_wal_size=4GB")
# BENCH_PG_OPTS="guc=value ..." adds server settings, e.g. wal_compression=on
for opt in ${BENCH_PG_OPTS:-}; do
    CLUSTER_OPTS+=(-o "$opt")
done

names=${BENCH:-}
if [ -z "$names" ]; then
    names=$(cd "$top/bench" && for d in */; do [ -x "$d/run.sh" ] && echo "${d%/}"; done)
fi
# bench/maint draws its latency picture with gnuplot
case " $(echo $names) " in
    *" maint "*)
        if ! command -v gnuplot >/dev/null; then
            apt-get install -y -q gnuplot-nox >/dev/null ||
                echo "bench: gnuplot-nox could not be installed; bench/maint draws no picture"
        fi ;;
esac
echo "bench: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(pg_config --version)"
rc=0
with_cluster bash -c '
    set -e
    psql -X -q -d postgres -c "CREATE EXTENSION IF NOT EXISTS pg_cron"
    for n in '"$(echo $names)"'; do
        echo "################ bench/$n"
        (cd "'"$WORK"'/bench/$n" && ./run.sh)
    done' || rc=$?
# what the workloads wrote under bench/results (pictures, data) outlives the
# scratch copy
if [ -d "$WORK/bench/results" ]; then
    mkdir -p "$top/bench/results"
    cp -r "$WORK/bench/results/." "$top/bench/results/"
fi
rm -rf "$WORK"
exit $rc
