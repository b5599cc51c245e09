-- fingerprint.c reads numerics in their on-disk format (numeric.c keeps its
-- macros private; pg_upgrade keeps numerics as they are, so the format is
-- fixed).  Were it ever to change, the canonical numbers would stop
-- reading back as the double nearest the numeric: this compares both over
-- numbers of every shape (short and long header forms, weights from -50 to
-- 50 base-10000 digits, up to 40 significant digits, both signs).
WITH nums AS (
    SELECT CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END
           * ((g * 7919) % 1000003)::numeric
           * CASE WHEN g % 3 = 0 THEN 1234567890123456789012345678901234::numeric ELSE 1 END
           * power(10::numeric, (g % 401) - 200) AS n
      FROM generate_series(1, 20000) AS g
)
SELECT count(*) AS numbers,
       count(*) FILTER (WHERE idem_canonical(to_jsonb(n))::float8 <> n::float8) AS differences
  FROM nums;
-- and the special shapes: zero, integers at the base boundaries, tiny and huge
SELECT idem_canonical(to_jsonb(n)) AS canonical,
       idem_canonical(to_jsonb(n))::float8 = n::float8 AS same_double
  FROM unnest(ARRAY[0, -0.0, 1, 9999, 10000, 10001, 99999999, 100000000,
                    0.0001, 0.00001, 123456789012345678901234567890,
                    1e-300, 1.7976931348623157e308, -2.5e-5]::numeric[]) AS n;
