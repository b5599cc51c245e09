CALL bench_pgmq_one(:rounds);
