--
-- Independent oracles for the fingerprint, over generated documents.
--
-- 1. pgcrypto: idem_fingerprint(x) = digest(idem_canonical(x), 'sha256').
--    The fingerprint is streamed into the hash; the text is built whole.
-- 2. the canonical form is a fixed point: canonicalising its own text
--    again changes nothing (members already sorted, numbers already the
--    shortest form of their double).
-- 3. numbers: ECMAScript formatting checked against PostgreSQL's own
--    float8 conversion and shortest printer, reformatted in SQL, for
--    numbers on the fast path (<= 15 digits) and the general path.
--
-- pgcrypto is the independent oracle (quietly: another file may have made it)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgcrypto;
RESET client_min_messages;
SELECT setseed(0.4242);

-- a random string: ASCII, control characters, Latin-1, CJK, the private
-- use area up to U+FFFD (which sorts after astral characters in UTF-16)
-- and astral characters (emoji)
CREATE FUNCTION fp_oracle_string(maxlen int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text := '';
    r float8;
BEGIN
    FOR i IN 1 .. floor(random() * (maxlen + 1))::int LOOP
        r := random();
        s := s || CASE
            WHEN r < 0.45 THEN chr(97 + floor(random() * 26)::int)
            WHEN r < 0.55 THEN chr(32 + floor(random() * 95)::int)
            WHEN r < 0.65 THEN chr(1 + floor(random() * 31)::int)
            WHEN r < 0.72 THEN chr(128 + floor(random() * 128)::int)
            WHEN r < 0.80 THEN chr(19968 + floor(random() * 500)::int)
            WHEN r < 0.88 THEN chr(57344 + floor(random() * 8189)::int)
            ELSE chr(127744 + floor(random() * 1500)::int)
        END;
    END LOOP;
    RETURN s;
END $$;

-- a random number, as JSON text: integers, decimals with trailing zeros,
-- exponents over the whole double range, negative zero, 16-20 digit values
CREATE FUNCTION fp_oracle_number() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r float8 := random();
    sign text := CASE WHEN random() < 0.3 THEN '-' ELSE '' END;
BEGIN
    RETURN sign || CASE
        WHEN r < 0.25 THEN floor(random() * 100000)::int::text
        WHEN r < 0.45 THEN round((random() * 10000)::numeric, floor(random() * 4)::int)::text || '0'
        WHEN r < 0.60 THEN (floor(random() * 999999) + 1)::int::text || 'E'
                           || (floor(random() * 600) - 300)::int::text
        WHEN r < 0.70 THEN '0.' || repeat('0', floor(random() * 10)::int)
                           || (floor(random() * 9999) + 1)::int::text
        WHEN r < 0.75 THEN (ARRAY['0', '0.0', '0e10', '1e21', '1e20', '1e-7',
                                  '0.000001', '4.50', '1E30', '5e-324',
                                  '1.7976931348623157e308', '9007199254740993',
                                  '123456789012345678901'])[1 + floor(random() * 13)::int]
        ELSE (floor(random() * 9e15) + 1)::bigint::text || floor(random() * 10000)::int::text
             || 'e' || (floor(random() * 40) - 30)::int::text
    END;
END $$;

-- a random document, nested at most "depth" levels
CREATE FUNCTION fp_oracle_doc(depth int) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    r float8 := random();
    j text;
    n int;
BEGIN
    IF depth > 0 AND r < 0.45 THEN
        n := floor(random() * 6)::int;
        j := '{';
        FOR i IN 1 .. n LOOP
            j := j || CASE WHEN i > 1 THEN ',' ELSE '' END
                   || to_jsonb(fp_oracle_string(6))::text || ':'
                   || fp_oracle_doc(depth - 1)::text;
        END LOOP;
        RETURN (j || '}')::jsonb;
    ELSIF depth > 0 AND r < 0.65 THEN
        n := floor(random() * 5)::int;
        j := '[';
        FOR i IN 1 .. n LOOP
            j := j || CASE WHEN i > 1 THEN ',' ELSE '' END
                   || fp_oracle_doc(depth - 1)::text;
        END LOOP;
        RETURN (j || ']')::jsonb;
    ELSIF r < 0.80 THEN
        RETURN fp_oracle_number()::jsonb;
    ELSIF r < 0.95 THEN
        RETURN to_jsonb(fp_oracle_string(12));
    ELSE
        RETURN (ARRAY['true', 'false', 'null'])[1 + floor(random() * 3)::int]::jsonb;
    END IF;
END $$;

CREATE TEMP TABLE fp_oracle_docs AS
SELECT i, fp_oracle_doc(CASE WHEN i % 10 = 0 THEN 6 ELSE 4 END) AS doc
  FROM generate_series(1, 1200) AS i;

-- the set is varied: counts of what it holds
SELECT count(*) AS documents,
       count(*) FILTER (WHERE jsonb_typeof(doc) = 'object') >= 300 AS many_objects,
       count(*) FILTER (WHERE jsonb_typeof(doc) = 'array') >= 100 AS many_arrays,
       count(*) FILTER (WHERE doc::text ~ '[\U0001F300-\U0001FAFF]') >= 100 AS astral,
       count(*) FILTER (WHERE doc::text ~ '[\uE000-\uFFFD]') >= 100 AS private_use,
       count(*) FILTER (WHERE doc::text ~ '\\u00') >= 100 AS control_chars,
       count(*) FILTER (WHERE idem_canonical(doc) ~ 'e[-+]') >= 100 AS exponents,
       count(*) FILTER (WHERE idem_canonical(doc) ~ '\{\}') >= 50 AS empty_objects
  FROM fp_oracle_docs;

-- oracle 1: pgcrypto over the canonical text
SELECT count(*) AS checked,
       count(*) FILTER (WHERE idem_fingerprint(doc)
                              IS DISTINCT FROM digest(idem_canonical(doc), 'sha256')) AS mismatches
  FROM fp_oracle_docs;

-- oracle 2: the canonical form is a fixed point
SELECT count(*) FILTER (WHERE idem_canonical(idem_canonical(doc)::jsonb)
                              IS DISTINCT FROM idem_canonical(doc)) AS not_fixed_points
  FROM fp_oracle_docs;

-- oracle 1 again over whole-document nesting: an array of all of them
SELECT idem_fingerprint(jsonb_agg(doc ORDER BY i))
       = digest(idem_canonical(jsonb_agg(doc ORDER BY i)), 'sha256') AS whole_set_matches
  FROM fp_oracle_docs;

-- oracle 3: ECMAScript number formatting, from PostgreSQL's float8 text
-- (shortest round-trip digits) rewritten in SQL
CREATE FUNCTION fp_oracle_es_number(x float8) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    neg bool;
    e int := 0;
    digits text;
    point int;
    n int;
    k int;
BEGIN
    IF x = 0 THEN RETURN '0'; END IF;
    SET LOCAL extra_float_digits = 1;
    t := x::text;
    neg := left(t, 1) = '-';
    t := ltrim(t, '-');
    IF position('e' IN t) > 0 THEN
        e := split_part(t, 'e', 2)::int;
        t := split_part(t, 'e', 1);
    END IF;
    point := position('.' IN t);
    IF point = 0 THEN point := length(t) + 1; END IF;
    digits := replace(t, '.', '');
    n := point - 1 + e;
    -- strip leading zeros (moving the point) and trailing zeros
    WHILE left(digits, 1) = '0' LOOP
        digits := substr(digits, 2);
        n := n - 1;
    END LOOP;
    digits := rtrim(digits, '0');
    k := length(digits);
    t := CASE
        WHEN k <= n AND n <= 21 THEN digits || repeat('0', n - k)
        WHEN 0 < n AND n <= 21 THEN left(digits, n) || '.' || substr(digits, n + 1)
        WHEN -6 < n AND n <= 0 THEN '0.' || repeat('0', -n) || digits
        ELSE left(digits, 1)
             || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
             || 'e' || CASE WHEN n - 1 < 0 THEN '-' ELSE '+' END || abs(n - 1)::text
    END;
    RETURN CASE WHEN neg THEN '-' || t ELSE t END;
END $$;

CREATE TEMP TABLE fp_oracle_numbers AS
SELECT i, num
  FROM (SELECT i, CASE
                  -- fast path: at most 15 significant digits
                  WHEN i % 3 = 0 THEN (floor(random() * 1e15))::bigint::text || 'e'
                                      || (floor(random() * 560) - 280)::int::text
                  WHEN i % 3 = 1 THEN round((random() * 1e6)::numeric,
                                            floor(random() * 9)::int)::text
                  -- general path: 16 to 25 digits, or extreme exponents
                  ELSE (floor(random() * 9e15) + 1e15)::bigint::text
                       || floor(random() * 1e9)::bigint::text
                       || 'e' || (floor(random() * 600) - 320)::int::text
                  END AS num
          FROM generate_series(1, 3000) AS i) s;

SELECT count(*) AS numbers,
       count(*) FILTER (WHERE idem_canonical(num::jsonb)
                              IS DISTINCT FROM fp_oracle_es_number(num::float8)) AS mismatches
  FROM fp_oracle_numbers;

-- and over the edges of the formats and of the range
SELECT num, idem_canonical(num::jsonb) AS canonical,
       idem_canonical(num::jsonb) = fp_oracle_es_number(num::float8) AS agrees
  FROM unnest(ARRAY['0', '-0', '-0.0', '4.50', '1E30', '0.000001', '1e-7',
                    '123456789012345', '1234567890123456', '100000000000000000000',
                    '1e21', '999999999999999999999', '0.1', '-1.5e-300',
                    '2.2250738585072014e-308', '4.9e-324', '1e-323',
                    '1.7976931348623157e308', '9007199254740993',
                    '333333333.33333329', '12345.678900000000000000000000001']) AS num;

DROP TABLE fp_oracle_docs, fp_oracle_numbers;
DROP FUNCTION fp_oracle_doc(int), fp_oracle_number(), fp_oracle_string(int),
              fp_oracle_es_number(float8);
