#!/usr/bin/env bash
# make bench [BENCH="fingerprint keys ..."]: build and install as make test
# does, start a throwaway cluster, and run each workload under bench/NAME/
# (its run.sh), which prints ratios against a baseline measured in the same
# run.  Run as root.  Not part of make test: timings belong here, not in tests.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# PG=17 or 18: a server built without assertions (scripts/lib.sh, PG_BUILD)
export PG_BUILD=${PG_BUILD:-release}
. "$top/scripts/lib.sh"

prepare_server
stage_tree "$top"
build_and_install ""
# PGMQ_SRC: a pgmq checkout (its top or its pgmq-extension directory, or a
# bare git repository, then PGMQ_REF, default the newest v1.5 tag): pgmq is
# installed beside the extension, and bench/outbox compares with it; without
# it bench/outbox says that it skips that comparison.  pgmq is pure SQL.
install_pgmq() {
    local src=$1 dir=$WORK/pgmq ref
    mkdir -p "$dir"
    if git --git-dir="$src" rev-parse --git-dir >/dev/null 2>&1 && [ ! -d "$src/pgmq-extension" ]; then
        ref=${PGMQ_REF:-$(git --git-dir="$src" tag -l 'v1.5.*' | sort -V | tail -1)}
        git --git-dir="$src" archive "$ref" pgmq-extension | tar -C "$dir" -xf -
        dir=$dir/pgmq-extension
    else
        [ -d "$src/pgmq-extension" ] && src=$src/pgmq-extension
        cp -r "$src/." "$dir"
    fi
    if [ ! -f "$dir/pgmq.control" ]; then
        echo "PGMQ_SRC=$1: no pgmq.control there; bench/outbox skips pgmq" >&2
        return 0
    fi
    [ "$(id -u)" -ne 0 ] || chown -R postgres:postgres "$WORK/pgmq"
    as_postgres make -C "$dir" -s PG_CONFIG="$PG_CONFIG" >/dev/null
    if [ -n "${IDEM_DESTDIR:-}" ]; then
        make -C "$dir" -s PG_CONFIG="$PG_CONFIG" install DESTDIR="$IDEM_DESTDIR" >/dev/null
        chmod -R a+rX "$IDEM_DESTDIR"
    else
        make -C "$dir" -s PG_CONFIG="$PG_CONFIG" install >/dev/null
    fi
    echo "bench: pgmq $(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$dir/pgmq.control") installed from $1"
}
if [ -n "${PGMQ_SRC:-}" ]; then
    install_pgmq "$PGMQ_SRC"
fi
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
# bench/outbox counts instructions with callgrind (OUTBOX_BENCH_ONLY=instructions)
if [ "${OUTBOX_BENCH_ONLY:-}" = instructions ] && ! command -v valgrind >/dev/null; then
    apt-get install -y -q valgrind >/dev/null ||
        echo "bench: valgrind could not be installed; bench/outbox counts no instructions"
fi
echo "bench: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(pg_config --version)"
rc=0
# pg_cron where it is installed (a server built from source may lack it)
cron_sql=
have_pg_cron && cron_sql="CREATE EXTENSION IF NOT EXISTS pg_cron"
with_cluster bash -c '
    set -e
    [ -z "'"$cron_sql"'" ] || psql -X -q -d postgres -c "'"$cron_sql"'"
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
