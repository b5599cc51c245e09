#!/usr/bin/env bash
# Build PostgreSQL $PG (17 or 18) from Debian's source package, with
# assertions (without them when PG_BUILD=release, for benchmarks), debugging
# symbols and the TAP framework, into $PG_PREFIX,
# $IDEM_PG_CACHE/postgresql-$PG[-release] (see scripts/lib.sh), and pg_cron for it from
# Debian's pg-cron source package.  A complete build is reused as it is; an
# incomplete one is started over.  When the archive does not serve pg-cron's
# source, the server is used without pg_cron (the tests that need it are
# skipped), and the next run tries again.  Run as root.
#
# The sources come from Debian's archive through an apt state of its own
# under $IDEM_PG_CACHE/apt: the machine's apt sources are left alone, and
# nothing is installed from those suites (the build needs only Debian 12's
# packages, see scripts/deps.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

if [ -z "$PG_SUITE" ]; then
    echo "build-server: PostgreSQL $PG comes from Debian 12's packages" >&2
    exit 1
fi
# Debian's sources install libraries under /usr/lib/postgresql/<major>/lib
# unless the prefix names "postgres"; $PG_PREFIX does, so that everything
# stays inside it.
case $PG_PREFIX in
    *postgres*) ;;
    *) echo "build-server: the prefix must contain \"postgres\": $PG_PREFIX" >&2; exit 1 ;;
esac

mkdir -p "$IDEM_PG_CACHE"
# one build at a time per version; a second caller waits and reuses it
exec 9>"$IDEM_PG_CACHE/.lock-$(basename "$PG_PREFIX")"
flock 9

build=$IDEM_PG_CACHE/build/$(basename "$PG_PREFIX")
log=$build/build.log
aptdir=$IDEM_PG_CACHE/apt-$PG_SUITE
apt_private=(-o "Dir::Etc::sourcelist=$aptdir/sources.list"
             -o "Dir::Etc::sourceparts=-"
             -o "Dir::State::Lists=$aptdir/lists"
             -o "APT::Sandbox::User=root")
updated=

# pinned_source SOURCE-PACKAGE: the pool directory, version and .dsc
# SHA-256 of a version of the package known to build and pass here, for
# when the suite's index names a newer version whose files the archive does
# not serve (a point release announced before its files reach the mirror).
pinned_source() {
    case "$1/$PG_SUITE" in
        postgresql-17/trixie)
            echo "pool/main/p/postgresql-17 17.11-0+deb13u1" \
                 "bf148ae423a982707c3f60672c3a072ef62b701bd9f5df847d9f4b8c9b3e3b18" ;;
        postgresql-18/sid)
            echo "pool/main/p/postgresql-18 18.6-3" \
                 "a4254c4548ebeea683832de193460ee8a9f1271418e884803b44ded1aead1776" ;;
        *) return 1 ;;
    esac
}

# fetch_pinned SOURCE-PACKAGE: download the pinned version from the pool,
# check its .dsc against the pinned SHA-256 (dpkg-source checks the
# tarballs against the .dsc) and unpack it into $build.
fetch_pinned() {
    local pin dir version sum dsc f
    local mirror=${IDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
    pin=$(pinned_source "$1") || return 1
    read -r dir version sum <<<"$pin"
    dsc=${1}_$version.dsc
    echo "server: Debian $PG_SUITE does not serve the $1 its index names; using $version from the pool"
    curl -fsS -o "$build/$dsc" "$mirror/$dir/${dsc//+/%2b}" >>"$log" 2>&1 || return 1
    echo "$sum  $build/$dsc" | sha256sum -c --quiet - >>"$log" 2>&1 || return 1
    for f in $(awk '/^Checksums-Sha256:/ {f = 1; next} /^[^ ]/ {f = 0} f {print $3}' "$build/$dsc"); do
        curl -fsS -o "$build/$f" "$mirror/$dir/${f//+/%2b}" >>"$log" 2>&1 || return 1
    done
    (cd "$build" && dpkg-source -x "$dsc") >>"$log" 2>&1
}

# fetch SOURCE-PACKAGE: unpack Debian's source package of $PG_SUITE into
# $build (or the pinned version, see pinned_source); fails when the archive
# serves neither.
fetch() {
    if [ -z "$updated" ]; then
        mkdir -p "$aptdir/lists/partial"
        echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
             "${IDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian} $PG_SUITE main" \
             >"$aptdir/sources.list"
        apt-get "${apt_private[@]}" -qq update
        updated=1
    fi
    (cd "$build" && apt-get "${apt_private[@]}" -qq source "$1/$PG_SUITE") >>"$log" 2>&1 ||
        fetch_pinned "$1"
}

# run COMMAND...: run it niced, output to the log; on failure show the log.
# Without the make variables of a calling make (make test, make bench):
# PostgreSQL's build generates its headers first only in a top-level make
# (MAKELEVEL 0), and a parallel build started below another make can
# compile a file that includes one before it exists.
run() {
    if ! nice env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS "$@" >>"$log" 2>&1; then
        echo "build-server: failed: $*" >&2
        tail -n 60 "$log" >&2
        exit 1
    fi
}

# changelog_version DIR: the Debian version of an unpacked source package
changelog_version() {
    dpkg-parsechangelog -l "$1/debian/changelog" -S Version
}

jobs=$(nproc)
if [ -f "$PG_PREFIX/.complete" ]; then
    echo "server: $(cat "$PG_PREFIX/.complete") in $PG_PREFIX"
else
    started=$SECONDS
    rm -rf "$build" "$PG_PREFIX"
    mkdir -p "$build"
    echo "server: fetching postgresql-$PG from Debian $PG_SUITE"
    fetch "postgresql-$PG" || { cat "$log" >&2; exit 1; }
    src=$(find "$build" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$PG-*" | head -n 1)
    version=$(changelog_version "$src")
    echo "server: building postgresql-$PG $version (log: $log)"
    # pgcrypto is the regression suite's independent SHA-256 oracle;
    # test_decoding shows the outbox's logical messages (t/042)
    cassert=--enable-cassert
    built="assertions enabled"
    if [ "$PG_BUILD" = release ]; then
        cassert=
        built="without assertions, for benchmarks"
    fi
    run env -C "$src" ./configure --prefix="$PG_PREFIX" $cassert \
        --enable-debug --enable-tap-tests --with-openssl --without-llvm
    run make -C "$src" -j"$jobs"
    run make -C "$src/contrib/pgcrypto" -j"$jobs"
    run make -C "$src/contrib/test_decoding" -j"$jobs"
    run make -C "$src" install
    run make -C "$src/contrib/pgcrypto" install
    run make -C "$src/contrib/test_decoding" install
    chmod -R a+rX "$PG_PREFIX"
    echo "postgresql-$PG $version (Debian $PG_SUITE, $built)" >"$PG_PREFIX/.complete"
    rm -rf "$build"
    echo "server: $(cat "$PG_PREFIX/.complete") built in $((SECONDS - started)) s"
fi

if [ -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]; then
    echo "server: pg_cron installed"
else
    started=$SECONDS
    rm -rf "$build"
    mkdir -p "$build"
    if fetch pg-cron; then
        src=$(find "$build" -mindepth 1 -maxdepth 1 -type d -name 'pg-cron-*' | head -n 1)
        echo "server: building pg-cron $(changelog_version "$src")"
        run make -C "$src" -j"$jobs" PG_CONFIG="$PG_CONFIG"
        run make -C "$src" install PG_CONFIG="$PG_CONFIG"
        chmod -R a+rX "$PG_PREFIX"
        echo "server: pg_cron built in $((SECONDS - started)) s"
    else
        grep -E '^(E|W):' "$log" >&2 || true
        echo "server: WARNING: Debian's archive did not serve pg-cron's source;" \
             "PostgreSQL $PG runs without pg_cron and the tests that need it are skipped" >&2
    fi
    rm -rf "$build"
fi
