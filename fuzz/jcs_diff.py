#!/usr/bin/python3
"""Fingerprint differential: idem_canonical / idem_fingerprint against the
RFC 8785 reference implementation (npm "canonicalize", see jcs_gen.mjs).

    jcs_diff.py [--docs N] [--batch N] [--seed S]

Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE, ...) to a
database where the extension is installed.  jcs_gen.mjs writes random
documents with the reference canonical text and its SHA-256 straight into
COPY; the server canonicalises and hashes the same text and compares:

  - idem_canonical(doc) = the reference canonical text
  - idem_fingerprint(doc) = the reference SHA-256 (node's crypto)
  - sha256(convert_to(idem_canonical(doc), 'UTF8')) = idem_fingerprint(doc)

Documents the server must refuse (a number with no finite, non-zero double;
what jsonb cannot hold) must fail with the expected SQLSTATE; they are
counted apart.  Exit status 1 when anything differs.  FUZZ_SEED (or --seed)
reproduces a run; document i depends only on (seed, i).
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))

SETUP = r"""
CREATE TEMP TABLE jcs_docs (id bigint, expect text, doc text, canon text, hash text);

-- every document alone, each in its own subtransaction: what it raised
CREATE FUNCTION pg_temp.jcs_each(only_ok bool)
RETURNS TABLE (id bigint, expect text, got text, canon_ok bool, hash_ok bool,
               self_ok bool, server_canon text, message text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    j jsonb;
    c text;
    f bytea;
BEGIN
    FOR r IN SELECT * FROM jcs_docs d WHERE (d.expect = 'ok') = only_ok ORDER BY d.id LOOP
        id := r.id;
        expect := r.expect;
        message := NULL;
        server_canon := NULL;
        BEGIN
            j := r.doc::jsonb;
            c := idem_canonical(j);
            f := idem_fingerprint(j);
            got := 'ok';
            server_canon := c;
            canon_ok := c IS NOT DISTINCT FROM r.canon;
            hash_ok := f IS NOT DISTINCT FROM decode(r.hash, 'hex');
            self_ok := sha256(convert_to(c, 'UTF8')) = f;
        EXCEPTION WHEN OTHERS THEN
            got := SQLSTATE;
            message := SQLERRM;
            canon_ok := NULL;
            hash_ok := NULL;
            self_ok := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END $$;
"""

# all documents that must canonicalise, in one statement
FAST = r"""
SELECT count(*),
       count(*) FILTER (WHERE c IS DISTINCT FROM canon),
       count(*) FILTER (WHERE f IS DISTINCT FROM decode(hash, 'hex')),
       count(*) FILTER (WHERE sha256(convert_to(c, 'UTF8')) IS DISTINCT FROM f)
  FROM (SELECT canon, hash, idem_canonical(j) AS c, idem_fingerprint(j) AS f
          FROM (SELECT canon, hash, doc::jsonb AS j FROM jcs_docs
                 WHERE expect = 'ok' OFFSET 0) AS parsed) AS computed
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--seed", type=int,
                    default=int(os.environ.get("FUZZ_SEED") or random.randrange(1, 2**31)))
    ap.add_argument("--show", type=int, default=5, help="differences shown in full")
    args = ap.parse_args()
    seed = args.seed % 2**32
    print(f"jcs: seed {seed} (FUZZ_SEED={seed} reproduces), {args.docs} documents", flush=True)

    node = os.environ.get("NODE", "node")
    gen = os.path.join(HERE, "jcs_gen.mjs")
    t0 = time.monotonic()
    compared = canon_diff = hash_diff = self_diff = 0
    expected_errors = {}      # sqlstate -> count raised as expected
    failures = []             # (id, what, detail)

    with psycopg.connect(autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute(SETUP)
        # the generator writes the next batch to a file while the server
        # checks this one
        tmpdir = tempfile.mkdtemp(prefix="jcs_diff.")
        starts = list(range(0, args.docs, args.batch))

        def generate(start):
            count = min(args.batch, args.docs - start)
            path = os.path.join(tmpdir, f"{start}.tsv")
            with open(path, "wb") as out:
                proc = subprocess.Popen([node, gen, str(seed), str(start), str(count)], stdout=out)
            return proc, path, count

        pending = generate(starts[0])
        for n_batch, start in enumerate(starts):
            proc, path, count = pending
            if proc.wait() != 0:
                sys.exit(f"jcs: {gen} failed (exit {proc.returncode})")
            if n_batch + 1 < len(starts):
                pending = generate(starts[n_batch + 1])
            conn.execute("TRUNCATE jcs_docs")
            with conn.cursor() as cur, open(path, "rb") as data:
                with cur.copy("COPY jcs_docs FROM STDIN") as copy:
                    while True:
                        chunk = data.read(1 << 16)
                        if not chunk:
                            break
                        copy.write(chunk)
            os.unlink(path)

            try:
                n, cd, hd, sd = conn.execute(FAST).fetchone()
                clean = cd == 0 and hd == 0 and sd == 0
            except psycopg.Error as e:
                print(f"jcs: batch at {start}: {e.sqlstate} {e}".rstrip(), flush=True)
                clean = False
            if clean:
                compared += n
            else:
                # document by document, to name the ones that differ
                for (i, expect, got, cok, hok, sok, server_canon, msg) in \
                        conn.execute("SELECT * FROM pg_temp.jcs_each(true)"):
                    if got != "ok":
                        failures.append((i, f"raised {got}", msg))
                        continue
                    compared += 1
                    if not cok:
                        canon_diff += 1
                        canon = conn.execute("SELECT canon FROM jcs_docs WHERE id = %s",
                                             (i,)).fetchone()[0]
                        failures.append((i, "canonical text differs",
                                         f"reference {canon[:300]!r}\n    server    {server_canon[:300]!r}"))
                    if not hok:
                        hash_diff += 1
                        failures.append((i, "fingerprint differs", ""))
                    if not sok:
                        self_diff += 1
                        failures.append((i, "fingerprint is not the SHA-256 of the canonical text", ""))

            for (i, expect, got, _c, _h, _s, _sc, msg) in \
                    conn.execute("SELECT * FROM pg_temp.jcs_each(false)"):
                if got == expect:
                    expected_errors[expect] = expected_errors.get(expect, 0) + 1
                else:
                    failures.append((i, f"expected {expect}, got {got}", msg or ""))
            done = start + count
            if args.docs > args.batch:
                print(f"jcs: {done}/{args.docs} documents, {len(failures)} differences, "
                      f"{time.monotonic() - t0:.0f} s", flush=True)

    shutil.rmtree(tmpdir, ignore_errors=True)
    elapsed = time.monotonic() - t0
    errs = ", ".join(f"{k} {v}" for k, v in sorted(expected_errors.items())) or "none"
    print(f"jcs: {args.docs} documents in {elapsed:.1f} s: {compared} compared with canonicalize, "
          f"{canon_diff} canonical text differences, {hash_diff} fingerprint differences, "
          f"{self_diff} fingerprint/canonical inconsistencies; "
          f"refused as expected ({sum(expected_errors.values())}): {errs}; "
          f"{len(failures)} differences in all")
    for (i, what, detail) in failures[:args.show]:
        print(f"jcs: document {i}: {what}\n    {detail}\n"
              f"    regenerate: node {gen} {seed} {i} 1")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
