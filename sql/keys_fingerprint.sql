-- The jsonb overload with the canonical fingerprint: retries that differ
-- only in key order, whitespace or number spelling replay; the scope's
-- fingerprint_ignore members do not count; the scope cache sees changes.
BEGIN;
SELECT outcome FROM idem_reserve('kf_a', 'orders', 'f-1', '{"amount": 4.50, "currency": "EUR", "items": [1, 2]}'::jsonb);
SELECT idem_complete('kf_a', 'orders', 'f-1', 201, '{"id": 1}');
COMMIT;
SELECT outcome, response_body FROM idem_reserve('kf_a', 'orders', 'f-1', '{"items": [1, 2], "currency": "EUR", "amount": 4.5}'::jsonb);
SELECT outcome, response_body FROM idem_reserve('kf_a', 'orders', 'f-1', '{ "currency":"EUR","amount":4.500e0,"items":[1,2] }'::jsonb);
-- array order is significant
SELECT outcome FROM idem_reserve('kf_a', 'orders', 'f-1', '{"amount": 4.5, "currency": "EUR", "items": [2, 1]}'::jsonb);
-- the stored fingerprint is idem_fingerprint() of the request
SELECT fingerprint = idem_fingerprint('{"amount": 4.5, "currency": "EUR", "items": [1, 2]}'::jsonb) AS same_fingerprint
  FROM idem_lookup('kf_a', 'orders', 'f-1');
-- the bytea overload accepts the same fingerprint
SELECT outcome FROM idem_reserve('kf_a', 'orders', 'f-1', fingerprint => idem_fingerprint('{"amount": 4.5, "currency": "EUR", "items": [1, 2]}'::jsonb));

-- fingerprint_ignore: a scope leaves members out of the fingerprint
SELECT scope, fingerprint_ignore FROM idem_configure_scope('kf_ign', '{"fingerprint_ignore": ["/sent_at", "/meta/trace"]}');
BEGIN;
SELECT outcome FROM idem_reserve('kf_a', 'kf_ign', 'f-2', '{"amount": 1, "sent_at": "10:00", "meta": {"trace": "a", "v": 1}}'::jsonb);
SELECT idem_complete('kf_a', 'kf_ign', 'f-2', 200, '{"ok": true}');
COMMIT;
SELECT outcome FROM idem_reserve('kf_a', 'kf_ign', 'f-2', '{"amount": 1, "sent_at": "10:05", "meta": {"trace": "b", "v": 1}}'::jsonb);
SELECT outcome FROM idem_reserve('kf_a', 'kf_ign', 'f-2', '{"amount": 1, "sent_at": "10:05", "meta": {"trace": "b", "v": 2}}'::jsonb);
-- the same bodies in a scope without the option differ
BEGIN;
SELECT outcome FROM idem_reserve('kf_a', 'orders', 'f-2', '{"amount": 1, "sent_at": "10:00"}'::jsonb);
SELECT idem_complete('kf_a', 'orders', 'f-2', 200, '{"ok": true}');
COMMIT;
SELECT outcome FROM idem_reserve('kf_a', 'orders', 'f-2', '{"amount": 1, "sent_at": "10:05"}'::jsonb);
-- changing the option is seen by the next call (the cache is invalidated)
SELECT scope, fingerprint_ignore FROM idem_configure_scope('kf_ign', '{"fingerprint_ignore": null}');
SELECT outcome FROM idem_reserve('kf_a', 'kf_ign', 'f-2', '{"amount": 1, "sent_at": "10:05", "meta": {"trace": "b", "v": 1}}'::jsonb);
-- options not given keep their value
SELECT scope, ttl, fingerprint_ignore FROM idem_configure_scope('kf_ign', '{"ttl": "2 days"}');
SELECT scope, ttl, fingerprint_ignore FROM idem_configure_scope('kf_ign', '{"fingerprint_ignore": ["/x"]}');

DELETE FROM idempotency.keys WHERE tenant_id = 'kf_a';
DELETE FROM idempotency.scopes WHERE scope = 'kf_ign';
