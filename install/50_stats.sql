
/* ---- stats.c: counters and health ---- */
