
/* ---- maintenance.c: reaper, sweeper, pg_cron scheduling ---- */
