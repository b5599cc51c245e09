# Shared by scripts/test.sh, scripts/demo.sh, scripts/build-server.sh and
# bench/run.sh.  Sourced, not run.
#
# PG chooses the server (README, Testing): 15, the default, is Debian 12's
# postgresql-15 packages, whose throwaway clusters Debian's pg_virtualenv
# starts; 17 and 18 are built from Debian's source packages (trixie's and
# sid's) with assertions enabled, with pg_cron, by scripts/build-server.sh
# into $IDEM_PG_CACHE/postgresql-$PG, outside the tree, and their throwaway
# clusters are started by scripts/pg-cluster.sh.  Everything else is the same
# for every version: the pg_config of the chosen server (PG_CONFIG) is the
# one passed to make and found first on PATH.
#
# The server-side steps (initdb, pg_regress's clusters, the TAP framework)
# refuse to run as root, so the tree is copied into a scratch directory owned
# by the "postgres" user and built there; only "make install" runs as root.
#
# IDEM_DESTDIR=/some/dir installs into that directory instead of the server's
# directories and points the throwaway clusters at it (Debian's
# extension_destdir), so several checkouts can be tested side by side.

PG=${PG:-15}
IDEM_PG_CACHE=${IDEM_PG_CACHE:-/var/cache/idempotency}
# PG_BUILD chooses how a server built from source is configured: "assert"
# (the default: assertions on, for the tests) or "release" (as Debian ships
# it, without assertions, for bench/run.sh: assertions cost more in some
# code paths than in others, so they would skew the ratios).  Each has its
# own directory under $IDEM_PG_CACHE.
PG_BUILD=${PG_BUILD:-assert}
case $PG_BUILD in
    assert) build_suffix= ;;
    release) build_suffix=-release ;;
    *)
        echo "PG_BUILD=$PG_BUILD: assert or release" >&2
        exit 1
        ;;
esac
case $PG in
    15) PG_PREFIX=/usr/lib/postgresql/15 PG_SUITE= ;;
    17) PG_PREFIX=$IDEM_PG_CACHE/postgresql-17$build_suffix PG_SUITE=trixie ;;
    18) PG_PREFIX=$IDEM_PG_CACHE/postgresql-18$build_suffix PG_SUITE=sid ;;
    *)
        echo "PG=$PG: the tested versions are 15, 17 and 18" >&2
        exit 1
        ;;
esac
PG_CONFIG=$PG_PREFIX/bin/pg_config
if [ "$PG" = 18 ] && [ -n "${IDEM_DESTDIR:-}" ]; then
    # Debian's PostgreSQL 18 has no extension_destdir any more
    echo "IDEM_DESTDIR works with PG=15 and PG=17; PG=18 installs into its own server" >&2
    exit 1
fi
export PG PG_BUILD PG_CONFIG PATH="$PG_PREFIX/bin:$PATH"
# Clusters are UTF-8 whatever the caller's locale (CI may have none).
export LANG=C.UTF-8 LC_ALL=C.UTF-8

# Install the packages that are missing and, for a version built from
# source, build that server unless it is cached.
prepare_server() {
    local here
    here=$(dirname "${BASH_SOURCE[0]}")
    bash "$here/deps.sh"
    if [ -n "$PG_SUITE" ]; then
        bash "$here/build-server.sh"
    fi
}

# Copy the source tree (without .git and build products) to a scratch
# directory owned by postgres; sets WORK.
stage_tree() {
    local top=$1
    WORK=$(mktemp -d /tmp/idempotency.XXXXXX)
    chmod 755 "$WORK"
    tar -C "$top" --exclude=.git --exclude='*.o' --exclude='*.so' \
        --exclude=tmp_check --exclude=tmp_check_iso --exclude=results \
        --exclude=output_iso --exclude=bench/results -cf - . | tar -C "$WORK" -xf -
    if [ "$(id -u)" -eq 0 ]; then
        chown -R postgres:postgres "$WORK"
    fi
    export WORK
}

# Run a command as the postgres user (or as ourselves when not root), with
# the PostgreSQL binaries on PATH.
as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- env PATH="$PATH" HOME=/var/lib/postgresql \
            PG="$PG" PG_CONFIG="$PG_CONFIG" IDEM_DESTDIR="${IDEM_DESTDIR:-}" \
            IDEM_UPGRADE_FROM="${IDEM_UPGRADE_FROM:-}" \
            FUZZ_SEED="${FUZZ_SEED:-}" FUZZ_DOCS="${FUZZ_DOCS:-}" \
            FUZZ_CALLS="${FUZZ_CALLS:-}" FUZZ_VERBOSE="${FUZZ_VERBOSE:-}" ${PGPORT:+PGPORT="$PGPORT"} "$@"
    else
        "$@"
    fi
}

# Build in $WORK (extra compiler flags in $1) and install.
build_and_install() {
    local copt=${1:-}
    as_postgres make -C "$WORK" -s PG_CONFIG="$PG_CONFIG" clean >/dev/null
    as_postgres make -C "$WORK" -s PG_CONFIG="$PG_CONFIG" COPT="$copt"
    if [ -n "${IDEM_DESTDIR:-}" ]; then
        make -C "$WORK" -s PG_CONFIG="$PG_CONFIG" install DESTDIR="$IDEM_DESTDIR" >/dev/null
        chmod -R a+rX "$IDEM_DESTDIR"
    else
        make -C "$WORK" -s PG_CONFIG="$PG_CONFIG" install >/dev/null
    fi
}

# Whether pg_cron is installed for the chosen server.
have_pg_cron() {
    [ -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]
}

# postgresql.conf settings for every throwaway cluster, as "-o guc=value"
# arguments for with_cluster; pg_cron is preloaded when it is installed.
cluster_options() {
    if have_pg_cron; then
        CLUSTER_OPTS=(-o "shared_preload_libraries=pg_cron,idempotency"
                      -o "cron.database_name=postgres")
    else
        CLUSTER_OPTS=(-o "shared_preload_libraries=idempotency")
    fi
    CLUSTER_OPTS+=(-o "fsync=off" -o "max_connections=200")
    if [ -n "${IDEM_DESTDIR:-}" ]; then
        CLUSTER_OPTS+=(-o "extension_destdir=$IDEM_DESTDIR"
                       -o "dynamic_library_path=$IDEM_DESTDIR$("$PG_CONFIG" --pkglibdir):\$libdir")
    fi
    # pg_virtualenv takes port 5432 (or the next one its own configuration
    # knows) and fails when another cluster on the machine holds it: pick a
    # free one at random, so that several checkouts can test at once
    if [ -z "${PGPORT:-}" ]; then
        local p i
        for i in $(seq 1 100); do
            # below the kernel's ephemeral ports (32768 and up), which an
            # outgoing connection may hold at the moment the server binds
            p=$((20000 + RANDOM % 12000))
            if [ ! -e "/var/run/postgresql/.s.PGSQL.$p" ] && [ ! -e "/tmp/.s.PGSQL.$p" ] &&
               ! (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
                export PGPORT=$p
                break
            fi
        done
    fi
}

# with_cluster COMMAND...: run COMMAND as postgres against a throwaway
# cluster of the chosen server with the settings in CLUSTER_OPTS; the libpq
# environment (PGHOST, PGPORT, PGUSER, PGDATABASE) points at it.
with_cluster() {
    if [ -z "$PG_SUITE" ]; then
        as_postgres pg_virtualenv "${CLUSTER_OPTS[@]}" "$@"
    else
        # run from $WORK: the postgres user may not be able to read the clone
        as_postgres bash "$WORK/scripts/pg-cluster.sh" "${CLUSTER_OPTS[@]}" "$@"
    fi
}
