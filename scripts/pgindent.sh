#!/usr/bin/env bash
# make pgindent: lay out the extension's C files as PostgreSQL lays out its
# own, with PostgreSQL 18's src/tools/pgindent and pg_bsd_indent, and
# PostgreSQL 18's typedefs list plus the types the extension declares.
# CHECK=1 changes nothing: it prints what would change and fails if
# anything would.  With OPTIONAL=1 (make test on PostgreSQL 18), tools that
# cannot be fetched skip the check instead of failing it.
#
# The tools come from Debian's postgresql-18 source package (suite sid,
# through an apt state of its own, as scripts/build-server.sh fetches it)
# and are built once into $IDEM_PG_CACHE/pgindent against Debian 12's
# PostgreSQL 15 headers and libraries (postgresql-server-dev-15).  Run as
# root (the first run), from the top of the tree.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

tools=$IDEM_PG_CACHE/pgindent
mkdir -p "$IDEM_PG_CACHE"
exec 9>"$IDEM_PG_CACHE/.lock-pgindent"
flock 9

if [ ! -x "$tools/pg_bsd_indent" ] || [ ! -f "$tools/typedefs.list" ] ||
   [ ! -f "$tools/pgindent" ]; then
    aptdir=$IDEM_PG_CACHE/apt-sid
    apt_private=(-o "Dir::Etc::sourcelist=$aptdir/sources.list"
                 -o "Dir::Etc::sourceparts=-"
                 -o "Dir::State::Lists=$aptdir/lists"
                 -o "APT::Sandbox::User=root")
    mkdir -p "$aptdir/lists/partial"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
         "${IDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian} sid main" \
         >"$aptdir/sources.list"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "pgindent: fetching postgresql-18's source package to build pg_bsd_indent"
    apt-get "${apt_private[@]}" -qq update || true
    (cd "$work" && apt-get "${apt_private[@]}" -qq source --download-only postgresql-18/sid) >/dev/null || true
    orig=$(find "$work" -maxdepth 1 -name 'postgresql-18_*.orig.tar.*' | head -n 1)
    if [ -z "$orig" ]; then
        echo "pgindent: Debian sid served no postgresql-18 source archive" >&2
        if [ "${OPTIONAL:-}" = 1 ]; then
            echo "pgindent: layout not checked"
            exit 0
        fi
        exit 1
    fi
    tar -C "$work" -xf "$orig" --wildcards '*/src/tools/pg_bsd_indent/*' '*/src/tools/pgindent/*'
    src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'postgresql-18*' | head -n 1)
    rm -rf "$tools"
    mkdir -p "$tools"
    # pg_bsd_indent needs only c.h and libpgport/libpgcommon; PostgreSQL
    # 15's do, given 18's spelling of "noreturn"
    cc -O2 -o "$tools/pg_bsd_indent" "$src"/src/tools/pg_bsd_indent/*.c \
        -I"$src/src/tools/pg_bsd_indent" -I/usr/include/postgresql/15/server \
        '-Dpg_noreturn=__attribute__((noreturn))' \
        -L/usr/lib/postgresql/15/lib -lpgport -lpgcommon -lm
    cp "$src/src/tools/pgindent/pgindent" "$src/src/tools/pgindent/typedefs.list" "$tools/"
    rm -rf "$work"
    trap - EXIT
fi

cd "$top"
files=$(git ls-files '*.c' '*.h')
own=$(mktemp)
typedefs=$(mktemp)
trap 'rm -f "$own" "$typedefs"' EXIT
# the extension's own types: "} Name;" closing a typedef'd struct or enum,
# "typedef ... Name;" and "typedef ... (*Name)(...)"
# shellcheck disable=SC2086
{
    sed -nE 's/^\} ([A-Za-z_][A-Za-z0-9_]*);.*/\1/p' $files
    grep -hE '^typedef [^;(]*[ *][A-Za-z_][A-Za-z0-9_]*;' $files |
        sed -E 's/.*[ *]([A-Za-z_][A-Za-z0-9_]*);.*/\1/'
    sed -nE 's/^typedef [^;]*\(\*([A-Za-z_][A-Za-z0-9_]*)\).*/\1/p' $files
} | sort -u >"$own"
sort -u "$tools/typedefs.list" "$own" >"$typedefs"

opts=()
if [ "${CHECK:-}" = 1 ]; then
    opts=(--check --diff)
fi
# shellcheck disable=SC2086
if ! PATH=$tools:$PATH perl "$tools/pgindent" --typedefs="$typedefs" "${opts[@]}" $files; then
    echo "pgindent: the files above are not laid out as pgindent lays them out; run make pgindent" >&2
    exit 1
fi
[ "${CHECK:-}" = 1 ] && echo "pgindent: $(echo "$files" | wc -l) files as pgindent lays them out"
exit 0
