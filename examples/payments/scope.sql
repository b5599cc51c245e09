-- Policy of the "charges" scope, set by the operations role (payments_ops,
-- granted idempotency_admin): keys are kept for a day; a reservation
-- stuck for 30 seconds (none in the atomic flow service.py uses) is
-- flagged for an operator rather than handed to the next attempt.  As at
-- Stripe, a server error is stored and replayed like any answer (the
-- request may have had effects before it failed): the failures service.py
-- knows to be safe to run again (the provider timed out or answered 5xx)
-- it completes with retryable => true, which releases the key.
SELECT scope, ttl, lock_timeout, stale_action, cache_server_errors
  FROM idem_configure_scope('charges',
       '{"ttl": "24 hours", "lock_timeout": "30 seconds", "stale_action": "fail",
         "cache_server_errors": true}');
