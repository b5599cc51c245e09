#!/usr/bin/env bash
# Find or build Citus for PostgreSQL 15 (make test-citus, bench/citus.sh).
# Sourced, after scripts/lib.sh.  citus_locate sets:
#   CITUS_DEST  the DESTDIR tree Citus was installed into ("" when Citus is
#               installed in the server's own directories)
#   CITUS_WHY   why there is no Citus, when citus_locate fails
#
# An installed Citus (citus.so in the server's library directory) is used as
# it is.  Otherwise Citus is built from the archive CITUS_ARCHIVE (by
# default ../shared/vendor/citus-13.2.2.tar.gz beside the checkout: Citus is
# a test dependency, never part of this tree) into a DESTDIR under
# $IDEM_PG_CACHE/citus-<version>-pg<major>, which is reused while the
# archive's checksum is the same.  Building needs root (it installs the
# build dependencies with apt-get).

citus_locate() {
    local top=$1 archive sum name cache stamp src log
    CITUS_DEST=
    CITUS_WHY=
    if [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
        echo "citus: using the Citus installed for $("$PG_CONFIG" --version)"
        return 0
    fi
    archive=${CITUS_ARCHIVE:-$(dirname "$top")/shared/vendor/citus-13.2.2.tar.gz}
    if [ ! -f "$archive" ]; then
        CITUS_WHY="Citus is not installed for $("$PG_CONFIG" --version) and there is no archive to build it from ($archive; set CITUS_ARCHIVE)"
        return 1
    fi
    sum=$(sha256sum "$archive" | cut -d' ' -f1)
    name=$(basename "$archive" .tar.gz)
    cache=$IDEM_PG_CACHE/$name-pg$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    stamp=$cache/archive.sha256
    mkdir -p "$cache"
    # one build at a time; a second caller waits and reuses it
    exec 8>"$cache/.lock"
    flock 8
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -d "$cache/dest" ]; then
        echo "citus: reusing the build of $name in $cache (archive sha256 $sum)"
        CITUS_DEST=$cache/dest
        flock -u 8
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        CITUS_WHY="building Citus from $archive needs root"
        flock -u 8
        return 1
    fi
    echo "citus: building $name from $archive into $cache (a few minutes)"
    bash "$top/scripts/deps.sh" libkrb5-dev libcurl4-openssl-dev liblz4-dev libzstd-dev
    rm -rf "$cache/src" "$cache/dest" "$stamp"
    mkdir -p "$cache/src"
    log=$cache/build.log
    : >"$log"
    tar -C "$cache/src" -xzf "$archive"
    src=$(find "$cache/src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    # Debian's PostgreSQL 15.x headers declare have_createdb_privilege()
    # (commands/dbcommands.h), which Citus 13.2's compatibility header also
    # defines as a static inline for 15: the server's declaration wins.
    perl -0pi -e 's/static inline bool\nhave_createdb_privilege\(void\)\n\{.*?\n\}\n/#include "commands\/dbcommands.h"\n/s' \
        "$src/src/include/pg_version_compat.h"
    if ! (cd "$src" &&
          nice ./configure PG_CONFIG="$PG_CONFIG" &&
          nice make -j2 &&
          make install DESTDIR="$cache/dest") >>"$log" 2>&1; then
        tail -n 60 "$log" >&2
        CITUS_WHY="the build of $name failed (log: $log)"
        flock -u 8
        return 2
    fi
    chmod -R a+rX "$cache/dest"
    rm -rf "$cache/src"
    echo "$sum" >"$stamp"
    echo "citus: built $name"
    CITUS_DEST=$cache/dest
    flock -u 8
    return 0
}
