CALL bench_outbox_batch(:rounds);
