CALL bench_plain_one(:rounds, true);
