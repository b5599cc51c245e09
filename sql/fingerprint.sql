--
-- Request fingerprints: what makes two requests the same, ignore
-- pointers, errors, and deep or large input.
--

-- pgcrypto is the independent oracle (quietly: another file may have made it)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgcrypto;
RESET client_min_messages;

-- Equivalent retries have the same fingerprint: key order, whitespace,
-- number spelling (4.50 / 4.5, 1E30 / 1e+30), escapes of the same string.
SELECT idem_fingerprint('{"amount": 4.50, "currency": "EUR", "card": {"last4": "4242", "exp": "12/29"}, "big": 1E30}')
     = idem_fingerprint('{ "big" : 1e+30, "card" : { "exp" : "12\/29", "last4" : "4242" },
                          "currency" : "\u0045UR", "amount" : 4.5 }') AS retry_matches;
SELECT idem_canonical('{"amount": 4.50, "currency": "EUR", "card": {"last4": "4242", "exp": "12/29"}, "big": 1E30}');
SELECT idem_fingerprint('[1, 1.0, 1e0, 10e-1, 0.1e1]') = idem_fingerprint('[1,1,1,1,1]') AS same_numbers;

-- Different requests differ: amount, currency, nesting, array order, type.
SELECT a, b, idem_fingerprint(a::jsonb) = idem_fingerprint(b::jsonb) AS same
  FROM (VALUES ('{"amount": 4.50, "currency": "EUR"}', '{"amount": 4.51, "currency": "EUR"}'),
               ('{"amount": 4.50, "currency": "EUR"}', '{"amount": 4.50, "currency": "USD"}'),
               ('{"amount": 4.50, "currency": "EUR"}', '{"payment": {"amount": 4.50, "currency": "EUR"}}'),
               ('{"amount": 4.50, "currency": "EUR"}', '{"amount": 4.50, "currency": ["EUR"]}'),
               ('{"amount": 4.50, "currency": "EUR"}', '{"amount": "4.50", "currency": "EUR"}'),
               ('{"amount": 4.50, "currency": "EUR"}', '{"amount": 4.50, "currency": "EUR", "x": null}'),
               ('[1, 2]', '[2, 1]'),
               ('{"a": "x"}', '{"a": "x "}'),
               ('{"a": "\u00e9"}', '{"a": "e\u0301"}')) AS t(a, b);

-- A fingerprint is 32 bytes: SHA-256 of the canonical UTF-8 text.
SELECT octet_length(idem_fingerprint('{}')) AS len,
       idem_fingerprint('{}') = sha256(convert_to('{}', 'UTF8')) AS empty_object,
       idem_fingerprint('{"a":[true,false,null]}')
         = sha256(convert_to('{"a":[true,false,null]}', 'UTF8')) AS literals;

-- Scalars at the top level are documents too.
SELECT idem_canonical('"x"') AS string, idem_canonical('-0') AS zero,
       idem_canonical('null') AS null_doc, idem_canonical('[]') AS empty_array;

-- Numbers whose shortest form lies exactly half-way between two doubles:
-- ECMAScript takes it when the double's significand is even (reading it
-- back rounds half to even), so 1e23 is written "1e+23" although
-- PostgreSQL's float8 output writes that double 9.999999999999999e+22.
-- The expected texts are Number.prototype.toString's (V8).
SELECT num, idem_canonical(num::jsonb) AS canonical
  FROM unnest(ARRAY['1e23', '9.999999999999999e22', '99999999999999991611392', '-1e23',
                    '34930000965983366', '-65076360921375456', '295147905179352825856',
                    '73786976294838206464', '49999999999999995805696',
                    '9007199254740993']) AS num;

-- Integers beyond 2^53 lose digits to the double (README): two ids that
-- differ in their last digits share a fingerprint; sent as strings, they
-- do not.
SELECT idem_fingerprint('{"to": 1234567890123456789}') = idem_fingerprint('{"to": 1234567890123456700}') AS numbers_match,
       idem_fingerprint('{"to": "1234567890123456789"}') = idem_fingerprint('{"to": "1234567890123456700"}') AS strings_match;

-- String escapes: only '"', '\' and U+0000..U+001F, \b \t \n \f \r named,
-- others as lower-case \u00xx; U+007F, '/' and non-ASCII are kept as they are.
SELECT idem_canonical(to_jsonb(E'q"b\\s/\b\t\n\f\r\x01\x1f\x7f' || chr(233) || chr(128514)));

-- NULLs: a NULL request gives NULL; a NULL ignore list ignores nothing.
SELECT idem_fingerprint(NULL) IS NULL AS null_request,
       idem_canonical(NULL) IS NULL AS null_canonical,
       idem_fingerprint('{"a":1}', NULL) = idem_fingerprint('{"a":1}') AS null_ignore,
       idem_fingerprint('{"a":1}', '{}') = idem_fingerprint('{"a":1}') AS empty_ignore;

--
-- Ignore pointers (RFC 6901)
--
SELECT idem_canonical('{"amount": 10, "metadata": {"sent_at": "2024-01-01T00:00:00Z", "client": "ios"}}',
                      ARRAY['/metadata/sent_at']);
-- retries differing only in an ignored member match
SELECT idem_fingerprint('{"amount": 10, "metadata": {"sent_at": "2024-01-01T00:00:00Z"}}', ARRAY['/metadata/sent_at'])
     = idem_fingerprint('{"metadata": {"sent_at": "2024-01-01T00:00:09Z"}, "amount": 10}', ARRAY['/metadata/sent_at'])
       AS ignored_member_matches,
       idem_fingerprint('{"amount": 10, "metadata": {"sent_at": "a"}}', ARRAY['/metadata/sent_at'])
     = idem_fingerprint('{"amount": 10, "metadata": {}}') AS same_as_removed,
       idem_fingerprint('{"amount": 11, "metadata": {"sent_at": "a"}}', ARRAY['/metadata/sent_at'])
     = idem_fingerprint('{"amount": 10, "metadata": {"sent_at": "a"}}', ARRAY['/metadata/sent_at'])
       AS other_members_still_count;
-- ~1 is '/', ~0 is '~'; a whole subtree; several pointers; absent members
SELECT idem_canonical('{"a/b": 1, "m~n": 2, "keep": 3}', ARRAY['/a~1b', '/m~0n']) AS escapes,
       idem_canonical('{"meta": {"x": [1, 2]}, "keep": 3}', ARRAY['/meta']) AS subtree,
       idem_canonical('{"a": 1}', ARRAY['/missing', '/a/deeper', '/0']) AS absent,
       idem_canonical('{"": 1, "b": 2}', ARRAY['/']) AS empty_name;
-- array elements: a removed element is dropped, the rest move up; "-",
-- out-of-range and leading-zero indexes name nothing
SELECT idem_canonical('{"items": [{"id": 1, "ts": 5}, {"id": 2, "ts": 6}]}',
                      ARRAY['/items/0/ts', '/items/1/ts']) AS per_element,
       idem_canonical('[10, 20, 30]', ARRAY['/1']) AS dropped,
       idem_canonical('[10, 20, 30]', ARRAY['/-', '/3', '/01', '/x']) AS nothing,
       idem_canonical('{"0": "member"}', ARRAY['/0']) AS index_names_member;
-- several pointers each name an element of the request as sent
SELECT idem_canonical('[10, 20, 30]', ARRAY['/0', '/2']) AS both_ends,
       idem_canonical('[10, 20, 30]', ARRAY['/1', '/1']) AS once;
-- a scalar document has no members to remove
SELECT idem_canonical('5', ARRAY['/0']) AS scalar;
-- the fingerprint with ignore pointers is the hash of the canonical text with them
SELECT idem_fingerprint(d, p) = sha256(convert_to(idem_canonical(d, p), 'UTF8')) AS consistent
  FROM (VALUES ('{"a": {"b": [1, {"c": 2, "d": 3}]}, "e": 4}'::jsonb, ARRAY['/a/b/1/c', '/e'])) AS t(d, p);

--
-- Errors, each raised
--
-- a number with no finite double (22003)
SELECT idem_fingerprint('{"order": {"lines": [{"qty": 1e400}]}}');
SELECT idem_canonical('[-1e309]');
-- a scalar request is the whole document: its pointer is ""
SELECT idem_canonical('-1e309');
-- a number that is not zero but rounds to zero (22003)
SELECT idem_fingerprint('{"rate": 1e-400}');
-- the pointer is quoted as a JSON string: a member name's quotes, \ and
-- control characters are escaped (after RFC 6901's ~0 and ~1)
SELECT idem_fingerprint(E'{"a\\"b\\n~/": [1e400]}');
-- a malformed pointer (22P02)
SELECT idem_fingerprint('{"a": 1}', ARRAY['metadata/sent_at']);
SELECT idem_fingerprint('{"a": 1}', ARRAY['/a~2b']);
SELECT idem_fingerprint('{"a": 1}', ARRAY['/a~']);
-- the empty pointer would ignore the whole request (22023)
SELECT idem_fingerprint('{"a": 1}', ARRAY['']);
-- a NULL pointer (22004)
SELECT idem_fingerprint('{"a": 1}', ARRAY['/a', NULL]);
-- a list in two dimensions is refused, not flattened
SELECT idem_fingerprint('{"a": 1, "b": 2}', '{{/a},{/b}}');
-- pointers are checked even when the request has no such member, and
-- before the request is read
SELECT idem_fingerprint('[1e400]', ARRAY['bad']);
-- a list too large to follow (pointers times their depth past what one
-- allocation holds) is refused (54000): its size was computed in 32 bits,
-- and a list some sixteen times larger wrapped around and wrote past a
-- small allocation; one long pointer costs memory in its length only
SELECT idem_fingerprint('{"a": 1}', array_fill('/a'::text, ARRAY[270000]) || repeat('/', 999));
SELECT idem_fingerprint('{"a": 1}', ARRAY[repeat('/x', 20000)]) = idem_fingerprint('{"a": 1}')
       AS long_pointer_ignores_nothing;

--
-- Deep and large input
--
-- 1,000 levels of objects and of arrays
SELECT idem_canonical((repeat('{"a":', 1000) || '1' || repeat('}', 1000))::jsonb)
     = repeat('{"a":', 1000) || '1' || repeat('}', 1000) AS deep_objects,
       idem_fingerprint((repeat('[', 1000) || '4.50' || repeat(']', 1000))::jsonb)
     = sha256(convert_to(repeat('[', 1000) || '4.5' || repeat(']', 1000), 'UTF8')) AS deep_arrays;
-- ignore pointers reach deep members
SELECT idem_canonical((repeat('{"a":', 20) || '{"x":1,"y":2}' || repeat('}', 20))::jsonb,
                      ARRAY[repeat('/a', 20) || '/x'])
     = repeat('{"a":', 20) || '{"y":2}' || repeat('}', 20) AS deep_ignore;
-- the stack depth limit is an error, not a crash
CREATE TEMP TABLE fp_deep AS
SELECT (repeat('[', 5000) || repeat(']', 5000))::jsonb AS doc;
SET max_stack_depth = '200kB';
SELECT idem_fingerprint(doc) FROM fp_deep;
RESET max_stack_depth;
DROP TABLE fp_deep;

-- a body over 10 MiB: 50,000 line items
CREATE TEMP TABLE fp_big AS
SELECT jsonb_build_object(
         'order_id', 'ord_0001',
         'lines', jsonb_agg(jsonb_build_object(
             'sku', 'sku-' || i, 'qty', i % 7 + 1, 'price', (i % 1000) + 0.99,
             'note', repeat('x', 140), 'tags', jsonb_build_array('a', 'b', i)))) AS doc
  FROM generate_series(1, 50000) AS i;
SELECT octet_length(idem_canonical(doc)) > 10 * 1024 * 1024 AS over_10mib,
       idem_fingerprint(doc) = digest(idem_canonical(doc), 'sha256') AS matches_oracle,
       idem_fingerprint(doc) = idem_fingerprint(doc) AS stable
  FROM fp_big;
-- a member of the big body changes the fingerprint; ignoring it restores it
SELECT idem_fingerprint(doc) = idem_fingerprint(jsonb_set(doc, '{lines,49999,qty}', '99')) AS changed_same,
       idem_fingerprint(doc, ARRAY['/lines/49999/qty'])
       = idem_fingerprint(jsonb_set(doc, '{lines,49999,qty}', '99'), ARRAY['/lines/49999/qty']) AS ignored_same
  FROM fp_big;
DROP TABLE fp_big;

-- the functions are what the contract says
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       p.prorettype::regtype AS returns, p.provolatile, p.proparallel,
       p.proisstrict, p.prosecdef
  FROM pg_proc p
 WHERE p.proname IN ('idem_canonical', 'idem_fingerprint')
 ORDER BY 1;
