#!/usr/bin/env bash
# Build (once) a PostgreSQL 15 server for "make check-valgrind" from
# Debian's source package (the installed release when its source can be
# fetched, else the one in the release's main archive), configured with USE_VALGRIND (palloc'd memory is tracked chunk by
# chunk: a read of a pfree'd chunk, or past the end of one, is an error) and
# with assertions (freed memory is clobbered, memory contexts are checked).
# The Debian server cannot show these: its memory contexts hand freed chunks
# out again without valgrind knowing.
#
# Prints the installation prefix.  The build is cached in
# ${IDEM_VALGRIND_PG:-/var/tmp/idempotency-valgrind-pg15}, keyed by the
# package version; delete the directory to rebuild.  About 10 minutes of CPU
# the first time.  Run as root (it reads Debian's source archive with apt).
set -euo pipefail

cache=${IDEM_VALGRIND_PG:-/var/tmp/idempotency-valgrind-pg15}
version=$(dpkg-query -W -f='${Version}' postgresql-15)
prefix=$cache/install
stamp=$prefix/.built-from

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
    echo "$prefix"
    exit 0
fi

log() { echo "valgrind-pg: $*" >&2; }
mkdir -p "$cache"
rm -rf "$cache/src" "$prefix"
mkdir -p "$cache/src" "$cache/apt/lists/partial"

# Debian's source archive, without touching the system's apt configuration:
# a private sources list and package-list directory.
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
cat > "$cache/apt/sources.list" <<EOF
deb-src http://deb.debian.org/debian $codename main
deb-src http://deb.debian.org/debian-security $codename-security main
EOF
apt_opts=(-q -o "Dir::Etc::SourceList=$cache/apt/sources.list"
          -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$cache/apt/lists")
log "fetching the source of postgresql-15 $version"
apt-get "${apt_opts[@]}" update >&2
if ! (cd "$cache/src" && apt-get "${apt_opts[@]}" source --download-only \
        "postgresql-15=$version" >&2); then
    log "not available; taking postgresql-15 from $codename's main archive"
    rm -f "$cache"/src/*
    echo "deb-src http://deb.debian.org/debian $codename main" > "$cache/apt/sources.list"
    apt-get "${apt_opts[@]}" update >&2
    (cd "$cache/src" && apt-get "${apt_opts[@]}" source --download-only postgresql-15 >&2)
fi
tarball=$(ls "$cache"/src/postgresql-15_*.orig.tar.*)
tar -C "$cache/src" -xf "$tarball"
srcdir=$(find "$cache/src" -maxdepth 1 -type d -name 'postgresql-15*' | head -n 1)

log "building in $srcdir (log: $cache/build.log)"
cd "$srcdir"
{
    ./configure --prefix="$prefix" --enable-debug --enable-cassert \
        --with-openssl --without-readline --without-icu --without-zlib \
        CFLAGS="-Og -g -fno-omit-frame-pointer" CPPFLAGS="-DUSE_VALGRIND"
    # without the make variables of "make check-valgrind": PostgreSQL's
    # build generates its headers first only in a top-level make
    # (MAKELEVEL 0)
    nice -n 10 env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make -s -j"$(nproc)"
    env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make -s install
    nice -n 10 env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make -s -C contrib/pgcrypto install
} > "$cache/build.log" 2>&1 || { tail -n 40 "$cache/build.log" >&2; exit 1; }
chmod -R a+rX "$prefix"
echo "$version" > "$stamp"
log "installed in $prefix"
echo "$prefix"
