
/* ---- fingerprint.c: canonical JSON and request fingerprints ---- */
