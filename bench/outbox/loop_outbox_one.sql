CALL bench_outbox_one(:rounds);
