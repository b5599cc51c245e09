--
-- RFC 8785 test vectors (data/jcs, see data/jcs/SOURCE.md): each input gives
-- exactly the expected canonical text and bytes, and its fingerprint is the
-- SHA-256 of those bytes.  pg_regress runs from the build tree's root, so
-- the vectors are read from there.
--
-- Canonical JSON is UTF-8: these vectors need a UTF8 database.
SELECT getdatabaseencoding() AS encoding;
-- pgcrypto is the independent oracle (quietly: another file may have made it)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgcrypto;
RESET client_min_messages;

CREATE TEMP TABLE jcs_vector (name text, input text, output text, outhex text);

\set input `cat data/jcs/input/arrays.json`
\set output `cat data/jcs/output/arrays.json`
\set outhex `cat data/jcs/outhex/arrays.txt`
INSERT INTO jcs_vector VALUES ('arrays', :'input', :'output', :'outhex');
\set input `cat data/jcs/input/french.json`
\set output `cat data/jcs/output/french.json`
\set outhex `cat data/jcs/outhex/french.txt`
INSERT INTO jcs_vector VALUES ('french', :'input', :'output', :'outhex');
\set input `cat data/jcs/input/structures.json`
\set output `cat data/jcs/output/structures.json`
\set outhex `cat data/jcs/outhex/structures.txt`
INSERT INTO jcs_vector VALUES ('structures', :'input', :'output', :'outhex');
\set input `cat data/jcs/input/unicode.json`
\set output `cat data/jcs/output/unicode.json`
\set outhex `cat data/jcs/outhex/unicode.txt`
INSERT INTO jcs_vector VALUES ('unicode', :'input', :'output', :'outhex');
\set input `cat data/jcs/input/values.json`
\set output `cat data/jcs/output/values.json`
\set outhex `cat data/jcs/outhex/values.txt`
INSERT INTO jcs_vector VALUES ('values', :'input', :'output', :'outhex');
\set input `cat data/jcs/input/weird.json`
\set output `cat data/jcs/output/weird.json`
\set outhex `cat data/jcs/outhex/weird.txt`
INSERT INTO jcs_vector VALUES ('weird', :'input', :'output', :'outhex');

-- every vector was read, none is empty
SELECT name, length(input) > 0 AS has_input, length(output) > 0 AS has_output,
       length(outhex) > 0 AS has_outhex
  FROM jcs_vector ORDER BY name;

-- text, bytes (against the hex file) and fingerprint of each vector
SELECT name,
       idem_canonical(input::jsonb) = output AS text_ok,
       encode(convert_to(idem_canonical(input::jsonb), 'UTF8'), 'hex')
         = regexp_replace(outhex, '\s', '', 'g') AS bytes_ok,
       idem_fingerprint(input::jsonb)
         = digest(convert_to(output, 'UTF8'), 'sha256') AS fingerprint_ok
  FROM jcs_vector ORDER BY name;

-- the canonical text itself, for the reader
SELECT name, idem_canonical(input::jsonb) FROM jcs_vector ORDER BY name;

-- weird.json puts a key with an astral character (U+1F602) before U+FB33:
-- UTF-16 order, not UTF-8 byte order (where U+FB33 would come first)
SELECT idem_canonical('{"\ufb33": 1, "\ud83d\ude02": 2, "\u20ac": 3}');

-- What jsonb changes before the fingerprint sees it, stated rather than
-- skipped.  None of the vectors above depends on these.
-- 1. jsonb keeps the last of duplicate keys (RFC 8785 leaves duplicates
--    undefined; I-JSON forbids them).
SELECT idem_canonical('{"a": 1, "a": 2}');
-- 2. jsonb cannot hold \u0000 at all.
SELECT '"\u0000"'::jsonb;
-- 3. numbers are held exactly as numeric, then rounded to the nearest
--    double for the canonical form, as JSON.parse would.
SELECT idem_canonical('[333333333.33333329, 0.1000000000000000055511151231257827]');

DROP TABLE jcs_vector;
