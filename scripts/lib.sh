# Shared by scripts/test.sh, scripts/demo.sh and bench/run.sh.  Sourced, not run.
#
# The server-side steps (initdb, pg_regress's clusters, the TAP framework)
# refuse to run as root, so the tree is copied into a scratch directory owned
# by the "postgres" user and built there; only "make install" runs as root.
#
# IDEM_DESTDIR=/some/dir installs into that directory instead of the system
# directories and points the throwaway clusters at it (Debian's
# extension_destdir), so several checkouts can be tested side by side.

PG_BINDIR=$(/usr/lib/postgresql/15/bin/pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
PG_PKGLIBDIR=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
export PATH="$PG_BINDIR:$PATH"
# Clusters are UTF-8 whatever the caller's locale (CI may have none).
export LANG=C.UTF-8 LC_ALL=C.UTF-8

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
            IDEM_DESTDIR="${IDEM_DESTDIR:-}" FUZZ_SEED="${FUZZ_SEED:-}" \
            FUZZ_DOCS="${FUZZ_DOCS:-}" FUZZ_CALLS="${FUZZ_CALLS:-}" \
            FUZZ_VERBOSE="${FUZZ_VERBOSE:-}" ${PGPORT:+PGPORT="$PGPORT"} "$@"
    else
        "$@"
    fi
}

# Build in $WORK (extra compiler flags in $1) and install.
build_and_install() {
    local copt=${1:-}
    as_postgres make -C "$WORK" -s clean >/dev/null
    as_postgres make -C "$WORK" -s COPT="$copt"
    if [ -n "${IDEM_DESTDIR:-}" ]; then
        make -C "$WORK" -s install DESTDIR="$IDEM_DESTDIR" >/dev/null
        chmod -R a+rX "$IDEM_DESTDIR"
    else
        make -C "$WORK" -s install >/dev/null
    fi
}

# postgresql.conf settings for every throwaway cluster, as "-o guc=value"
# arguments for pg_virtualenv.
cluster_options() {
    CLUSTER_OPTS=(-o "shared_preload_libraries=pg_cron,idempotency"
                  -o "cron.database_name=postgres"
                  -o "fsync=off"
                  -o "max_connections=200")
    if [ -n "${IDEM_DESTDIR:-}" ]; then
        CLUSTER_OPTS+=(-o "extension_destdir=$IDEM_DESTDIR"
                       -o "dynamic_library_path=$IDEM_DESTDIR$PG_PKGLIBDIR:\$libdir")
    fi
    # pg_virtualenv takes port 5432 (or the next one its own configuration
    # knows) and fails when another cluster on the machine holds it: pick a
    # free one at random, so that several checkouts can test at once
    if [ -z "${PGPORT:-}" ]; then
        local p i
        for i in $(seq 1 100); do
            p=$((20000 + RANDOM % 20000))
            if [ ! -e "/var/run/postgresql/.s.PGSQL.$p" ] && [ ! -e "/tmp/.s.PGSQL.$p" ] &&
               ! (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
                export PGPORT=$p
                break
            fi
        done
    fi
}
