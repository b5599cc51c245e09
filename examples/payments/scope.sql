-- Policy of the "charges" scope, set by the operations role (payments_ops,
-- granted idempotency_admin): keys are kept for a day; a reservation
-- stuck for 30 seconds (none in the atomic flow service.py uses) is
-- flagged for an operator rather than handed to the next attempt.
SELECT scope, ttl, lock_timeout, stale_action
  FROM idem_configure_scope('charges',
       '{"ttl": "24 hours", "lock_timeout": "30 seconds", "stale_action": "fail"}');
