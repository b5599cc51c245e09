CALL bench_plain_one_delete(:rounds);
