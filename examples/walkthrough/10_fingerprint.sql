SET ROLE shop_app;
\echo '== Request fingerprints: a retry must hash the same as the original'
\echo '-- idem_canonical shows the RFC 8785 canonical text that is hashed:'
\echo '-- members sorted, no whitespace, numbers in their shortest form'
SELECT idem_canonical('{"currency": "EUR", "amount": 4.50, "card": {"last4": "4242"}, "limit": 1E30}');

\echo '-- the client retries with other key order, spacing and number spelling:'
\echo '-- same fingerprint (SHA-256 of the canonical text)'
SELECT encode(idem_fingerprint('{"currency": "EUR", "amount": 4.50, "card": {"last4": "4242"}}'), 'hex') AS original,
       encode(idem_fingerprint('{ "amount" : 4.5, "card" : { "last4" : "4242" }, "currency" : "EUR" }'), 'hex') AS retry;

\echo '-- a different amount is a different request: idem_reserve will answer mismatch'
SELECT idem_fingerprint('{"amount": 4.50, "currency": "EUR"}')
     = idem_fingerprint('{"amount": 4.51, "currency": "EUR"}') AS same_request;

\echo '-- ignore pointers (RFC 6901) leave out members that change on every retry'
SELECT idem_canonical('{"amount": 10, "metadata": {"sent_at": "2024-05-01T12:00:00Z", "client": "ios"}}',
                      ARRAY['/metadata/sent_at']) AS canonical,
       idem_fingerprint('{"amount": 10, "metadata": {"sent_at": "2024-05-01T12:00:00Z"}}', ARRAY['/metadata/sent_at'])
     = idem_fingerprint('{"amount": 10, "metadata": {"sent_at": "2024-05-01T12:00:07Z"}}', ARRAY['/metadata/sent_at'])
       AS retry_matches;
