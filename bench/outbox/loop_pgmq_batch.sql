CALL bench_pgmq_batch(:rounds);
