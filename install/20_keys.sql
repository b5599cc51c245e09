
/* ---- keys.c: reserve, complete, replay ---- */
