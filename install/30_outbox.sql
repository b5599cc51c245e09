
/* ---- outbox.c: transactional outbox ---- */
