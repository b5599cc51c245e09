/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  RFC 8785 (JSON Canonicalization Scheme) canonical form of a jsonb
 *	  value, and the SHA-256 request fingerprint computed over it.
 *
 * A retried request must produce the same fingerprint as the original even
 * when the client serialised it differently: other key order, other
 * whitespace, "4.50" instead of "4.5", "1E30" instead of "1e+30".  RFC 8785
 * defines one byte string per JSON value for exactly that purpose:
 *
 *	- object members sorted by their names compared as UTF-16 code units;
 *	- numbers written as ECMAScript's Number.prototype.toString writes the
 *	  nearest IEEE 754 double;
 *	- strings escaped minimally (only '"', '\' and U+0000..U+001F), with no
 *	  Unicode normalisation;
 *	- no insignificant whitespace.
 *
 * The walker reads the jsonb binary format directly (JEntry arrays) rather
 * than through JsonbIterator: it needs the members of an object in an order
 * jsonb does not keep (jsonb sorts keys by length first), and it avoids the
 * iterator's per-value copies.  Canonical bytes go into a small fixed buffer
 * that is flushed into the hash (idem_fingerprint) or into a StringInfo
 * (idem_canonical), so a fingerprint never materialises the canonical text.
 *
 * Numbers: a jsonb number is a numeric.  When it has at most 15 significant
 * decimal digits and a moderate exponent it survives a round trip through a
 * double unchanged (DBL_DIG), so the shortest representation of the nearest
 * double has exactly the numeric's own significant digits and is formatted
 * from them directly.  Longer numbers are converted with strtod() and
 * printed with PostgreSQL's shortest round-trip printer (Ryu), then
 * reformatted into ECMAScript notation; where a decimal exactly half-way to
 * the next double is shorter still, ECMAScript writes that one, and so does
 * this file (shorter_boundary).  A number whose nearest double is
 * infinite, or zero while the number is not, is an error: two different
 * amounts must never share a fingerprint silently.
 *
 * Ignore pointers: RFC 6901 JSON Pointers name members (or array elements)
 * left out of the canonical form, e.g. a client timestamp that changes on
 * every retry.  A removed array element is dropped from the array, so the
 * elements after it move up.  A pointer naming nothing removes nothing.
 *
 * Encodings: canonical JSON is UTF-8.  In a database whose encoding is not
 * UTF8 (nor SQL_ASCII, whose bytes are taken as they are), member names
 * are converted to UTF-8 to be sorted and every string is converted before
 * it is hashed, so a fingerprint is the same in every database and equals
 * one computed by the client.  idem_canonical's text stays in the database
 * encoding (a text datum must), in the same order.
 *
 * No catalog access, no locks, no SPI: the functions here are IMMUTABLE and
 * PARALLEL SAFE.  Everything allocated is freed before returning, so callers
 * on a hot path (idem_reserve) do not accumulate memory per call.
 *
 * IDENTIFICATION
 *	  fingerprint.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#ifdef USE_OPENSSL
#include <openssl/evp.h>
#endif

#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "common/shortest_dec.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_canonical);
PG_FUNCTION_INFO_V1(idem_fingerprint);

/*
 * Size of the buffer canonical bytes are gathered in before they are handed
 * to the hash.  Large enough that hashing runs on whole blocks, small enough
 * to live on the stack.
 */
#define CANON_BUFSIZE 4096

/* Longest text a number can take in ECMAScript notation, plus slack. */
#define NUMBER_TEXT_LEN 40

/*
 * Numbers with at most this many significant digits are formatted from
 * their own digits (see the file header), provided their decimal exponent is
 * well inside the range of normal doubles.
 */
#define FAST_MAX_DIGITS 15
#define FAST_MAX_EXPONENT 290

/* ----------------------------------------------------------------
 * The numeric on-disk format.  numeric.c keeps it private, but it is a
 * storage format (pg_upgrade keeps numerics as they are), so it cannot
 * change between releases.  A value is a varlena holding a 16-bit header,
 * for the long form a 16-bit weight, then base-10000 digits, most
 * significant first, the first one at the given weight.
 * ----------------------------------------------------------------
 */
#define NUM_NBASE			10000
#define NUM_DEC_DIGITS		4
#define NUM_SIGN_MASK		0xC000
#define NUM_NEG				0x4000
#define NUM_SHORT			0x8000
#define NUM_SPECIAL			0xC000
#define NUM_SHORT_SIGN_MASK 0x2000
#define NUM_SHORT_WEIGHT_SIGN_MASK 0x0040
#define NUM_SHORT_WEIGHT_MASK 0x003F

/* ----------------------------------------------------------------
 * Output sink: a fixed buffer flushed into a hash or a StringInfo
 * ----------------------------------------------------------------
 */
typedef struct CanonSink
{
	int			len;			/* bytes used in buf */
	Size		written;		/* bytes handed to the destination */
	StringInfo	canon;			/* destination when building text */
#ifdef USE_OPENSSL
	EVP_MD_CTX *hash;			/* destination when fingerprinting */
#else
	pg_cryptohash_ctx *hash;	/* destination when fingerprinting */
#endif
	char		buf[CANON_BUFSIZE];
} CanonSink;

/* One JSON Pointer reference token, unescaped. */
typedef struct PointerToken
{
	char	   *name;
	int			len;
	int32		index;			/* array index it names, or -1 if none */
} PointerToken;

/* One parsed ignore pointer. */
typedef struct IgnorePointer
{
	int			ntokens;
	PointerToken *tokens;
} IgnorePointer;

/* An object member: where its name and value are in the container. */
typedef struct MemberRef
{
	const char *key;			/* in the database encoding */
	uint32		keylen;
	const char *ukey;			/* in UTF-8: the same unless converted */
	uint32		ukeylen;
	JEntry		ventry;			/* the value's JEntry */
	uint32		voffset;		/* the value's offset in the data area */
	uint32		vlen;
} MemberRef;

/*
 * The location being written, as a chain of stack frames; used only to name
 * the place of an offending number in an error message.
 */
typedef struct PathStep
{
	const struct PathStep *parent;
	const char *key;			/* member name, or NULL for an array element */
	int			keylen;
	int			index;
} PathStep;

typedef struct CanonState
{
	CanonSink  *sink;

	/*
	 * In a database whose encoding is neither UTF8 nor SQL_ASCII, names are
	 * converted to UTF-8 to be sorted, and for hashing strings are too;
	 * conversions are allocated in convert_cxt, dropped at the end.
	 */
	bool		convert;
	MemoryContext convert_cxt;

	/* ignore pointers */
	int			npointers;
	IgnorePointer *pointers;
	int			maxtokens;
	int		   *active;			/* maxtokens + 1 slices of npointers */

	/* members of the objects on the current path, innermost last */
	MemberRef  *members;
	int			members_used;
	int			members_size;
} CanonState;

/*
 * What a string byte turns into: 0 for itself, else the character after the
 * backslash ('u' for the \u00xx form).
 */
static const char json_escape[256] = {
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	'b', 't', 'n', 'u', 'f', 'r', 'u', 'u',
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	0, 0, '"', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '\\', 0, 0, 0,
	/* the rest are zero */
};

static const char hex_digits[] = "0123456789abcdef";

static void emit_container(CanonState *st, JsonbContainer *jc, int depth,
						   const int *active, int nactive,
						   const PathStep *path);

/* ----------------------------------------------------------------
 * Hash wrappers: SHA-256
 *
 * With OpenSSL (as PostgreSQL is built on every common platform), the
 * digest is fetched and one context allocated once per backend, then
 * reset for each fingerprint: PostgreSQL's cryptohash API fetches the
 * digest and allocates a context on every call, which costs more than
 * hashing a typical request.  A fingerprint never nests in another, and
 * an error in the middle of one leaves the context to be reset by the
 * next.  Without OpenSSL, PostgreSQL's own SHA-256 through cryptohash.
 * ----------------------------------------------------------------
 */
#ifdef USE_OPENSSL
static EVP_MD_CTX *sha256_ctx = NULL;
static const EVP_MD *sha256_md = NULL;

static void
hash_begin(CanonSink *sink)
{
	if (sha256_ctx == NULL)
	{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
		/* explicit fetch: EVP_sha256() would be fetched again per init */
		const EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
		const EVP_MD *md = EVP_sha256();
#endif

		if (md == NULL)
			elog(ERROR, "could not fetch the SHA-256 digest");
		sha256_ctx = EVP_MD_CTX_new();
		if (sha256_ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		sha256_md = md;
	}
	if (EVP_DigestInit_ex(sha256_ctx, sha256_md, NULL) != 1)
		elog(ERROR, "could not initialize SHA-256 context");
	sink->hash = sha256_ctx;
}

static inline void
hash_update(CanonSink *sink, const char *data, size_t len)
{
	if (EVP_DigestUpdate(sink->hash, data, len) != 1)
		elog(ERROR, "could not update SHA-256 context");
}

static void
hash_end(CanonSink *sink, uint8 *result)
{
	unsigned int len = 0;

	if (EVP_DigestFinal_ex(sink->hash, result, &len) != 1 ||
		len != IDEM_FINGERPRINT_LEN)
		elog(ERROR, "could not finalize SHA-256 context");
	sink->hash = NULL;
}
#else
static void
hash_begin(CanonSink *sink)
{
	sink->hash = pg_cryptohash_create(PG_SHA256);
	if (sink->hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (pg_cryptohash_init(sink->hash) < 0)
		elog(ERROR, "could not initialize SHA-256 context");
}

static inline void
hash_update(CanonSink *sink, const char *data, size_t len)
{
	if (pg_cryptohash_update(sink->hash, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update SHA-256 context");
}

static void
hash_end(CanonSink *sink, uint8 *result)
{
	if (pg_cryptohash_final(sink->hash, result, IDEM_FINGERPRINT_LEN) < 0)
		elog(ERROR, "could not finalize SHA-256 context");
	pg_cryptohash_free(sink->hash);
	sink->hash = NULL;
}
#endif

/* ----------------------------------------------------------------
 * Sink primitives
 * ----------------------------------------------------------------
 */

/* Hand "len" bytes to the destination, bypassing the buffer. */
static void
sink_write(CanonSink *sink, const char *data, size_t len)
{
	sink->written += len;
	if (sink->canon != NULL)
	{
		/* a text value holds less than 1 GB: say so before StringInfo does */
		if (len >= (size_t) (MaxAllocSize - sink->canon->len))
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("canonical text of the request is too large"),
					 errdetail("It would exceed 1 GB, the most a text value holds."),
					 errhint("idem_fingerprint hashes the request without building its text; idem_reserve takes requests up to idempotency.max_request_size.")));
		appendBinaryStringInfo(sink->canon, data, (int) len);
	}
	else
		hash_update(sink, data, len);
}

static void
sink_flush(CanonSink *sink)
{
	if (sink->len > 0)
		sink_write(sink, sink->buf, sink->len);
	sink->len = 0;
}

static pg_noinline void
sink_put_slow(CanonSink *sink, const char *data, size_t len)
{
	sink_flush(sink);
	if (len >= CANON_BUFSIZE)
		sink_write(sink, data, len);
	else
	{
		memcpy(sink->buf, data, len);
		sink->len = (int) len;
	}
}

static inline void
sink_put(CanonSink *sink, const char *data, size_t len)
{
	if (likely(len <= (size_t) (CANON_BUFSIZE - sink->len)))
	{
		memcpy(sink->buf + sink->len, data, len);
		sink->len += (int) len;
	}
	else
		sink_put_slow(sink, data, len);
}

static inline void
sink_putc(CanonSink *sink, char c)
{
	if (unlikely(sink->len >= CANON_BUFSIZE))
		sink_flush(sink);
	sink->buf[sink->len++] = c;
}

/* ----------------------------------------------------------------
 * Strings
 * ----------------------------------------------------------------
 */

/*
 * emit_string
 *		Write a JSON string literal escaped as RFC 8785 (section 3.2.2.2)
 *		requires.  The input is the UTF-8 jsonb already validated; runs of
 *		bytes needing no escape are copied in one piece.
 */
static void
emit_string(CanonSink *sink, const char *str, uint32 len)
{
	const char *end = str + len;
	const char *run = str;
	const char *p;

	sink_putc(sink, '"');
	for (p = str; p < end; p++)
	{
		char		esc = json_escape[(unsigned char) *p];
		char		seq[6];

		if (likely(esc == 0))
			continue;
		if (p > run)
			sink_put(sink, run, p - run);
		seq[0] = '\\';
		seq[1] = esc;
		if (esc == 'u')
		{
			seq[2] = '0';
			seq[3] = '0';
			seq[4] = hex_digits[((unsigned char) *p) >> 4];
			seq[5] = hex_digits[((unsigned char) *p) & 0x0F];
			sink_put(sink, seq, 6);
		}
		else
			sink_put(sink, seq, 2);
		run = p + 1;
	}
	if (end > run)
		sink_put(sink, run, end - run);
	sink_putc(sink, '"');
}

/*
 * compare_member_names
 *		Order two UTF-8 member names as RFC 8785 requires: by their UTF-16
 *		code units.  UTF-8 byte order is code point order, which agrees with
 *		UTF-16 order except that a character above U+FFFF (a surrogate pair
 *		in UTF-16, D800..DFFF) sorts before U+E000..U+FFFF.  In UTF-8 those
 *		are the lead bytes F0..F4 and EE..EF; the first differing byte of two
 *		names is either a lead byte in both or a continuation byte in both.
 */
static inline int
compare_member_names(const char *a, uint32 alen, const char *b, uint32 blen)
{
	uint32		n = Min(alen, blen);
	uint32		i;

	for (i = 0; i < n; i++)
	{
		unsigned char ca = (unsigned char) a[i];
		unsigned char cb = (unsigned char) b[i];

		if (ca != cb)
		{
			if (ca >= 0xEE && cb >= 0xEE && (ca >= 0xF0) != (cb >= 0xF0))
				return (ca >= 0xF0) ? -1 : 1;
			return (ca < cb) ? -1 : 1;
		}
	}
	if (alen == blen)
		return 0;
	return (alen < blen) ? -1 : 1;
}

static int
member_qsort_cmp(const void *a, const void *b)
{
	const MemberRef *ma = (const MemberRef *) a;
	const MemberRef *mb = (const MemberRef *) b;

	return compare_member_names(ma->ukey, ma->ukeylen, mb->ukey, mb->ukeylen);
}

/*
 * Sort members into canonical order.  Objects in requests are small, where
 * insertion sort beats qsort's call overhead.
 */
static void
sort_members(MemberRef *m, int n)
{
	int			i,
				j;

	if (n > 16)
	{
		qsort(m, n, sizeof(MemberRef), member_qsort_cmp);
		return;
	}
	for (i = 1; i < n; i++)
	{
		MemberRef	tmp = m[i];

		for (j = i; j > 0 &&
			 compare_member_names(m[j - 1].ukey, m[j - 1].ukeylen,
								  tmp.ukey, tmp.ukeylen) > 0; j--)
			m[j] = m[j - 1];
		m[j] = tmp;
	}
}

/* ----------------------------------------------------------------
 * Numbers
 * ----------------------------------------------------------------
 */

/*
 * format_es_number
 *		Write a number in ECMAScript Number.prototype.toString notation.
 *		The value is 0.D x 10^n where D ("digits", k of them, no leading or
 *		trailing zero) are its shortest round-trip significant digits.
 *		Returns the length written into out (at least NUMBER_TEXT_LEN bytes;
 *		not terminated).
 */
static int
format_es_number(char *out, bool negative, const char *digits, int k, int n)
{
	char	   *p = out;

	Assert(k >= 1 && k <= 20);
	if (negative)
		*p++ = '-';
	if (k <= n && n <= 21)
	{
		/* an integer: the digits, then zeros */
		memcpy(p, digits, k);
		p += k;
		memset(p, '0', n - k);
		p += n - k;
	}
	else if (0 < n && n <= 21)
	{
		memcpy(p, digits, n);
		p += n;
		*p++ = '.';
		memcpy(p, digits + n, k - n);
		p += k - n;
	}
	else if (-6 < n && n <= 0)
	{
		*p++ = '0';
		*p++ = '.';
		memset(p, '0', -n);
		p += -n;
		memcpy(p, digits, k);
		p += k;
	}
	else
	{
		int			e = n - 1;
		char		ebuf[12];
		int			elen = 0;

		*p++ = digits[0];
		if (k > 1)
		{
			*p++ = '.';
			memcpy(p, digits + 1, k - 1);
			p += k - 1;
		}
		*p++ = 'e';
		*p++ = (e < 0) ? '-' : '+';
		if (e < 0)
			e = -e;
		do
		{
			ebuf[elen++] = '0' + e % 10;
			e /= 10;
		} while (e > 0);
		while (elen > 0)
			*p++ = ebuf[--elen];
	}
	return (int) (p - out);
}

/*
 * Significant digits of a numeric, decoded from its on-disk form.
 */
typedef struct NumericDigits
{
	bool		negative;
	bool		special;		/* NaN or an infinity */
	int			ngroups;		/* base-10000 digits, zero groups trimmed */
	const char *groups;			/* first group, possibly unaligned */
	int			lead;			/* leading zeros in the first group */
	int			trail;			/* trailing zeros in the last group */
	int			nsig;			/* significant decimal digits; 0 for zero */
	int			exponent;		/* value = 0.DIGITS x 10^exponent */
} NumericDigits;

static inline int16
numeric_group(const char *groups, int i)
{
	int16		g;

	memcpy(&g, groups + i * sizeof(int16), sizeof(int16));
	return g;
}

static void
decode_numeric(Numeric num, NumericDigits *nd)
{
	const char *data = VARDATA_ANY(num);
	int			size = VARSIZE_ANY_EXHDR(num);
	uint16		header;
	int			weight;
	int			hdrlen;
	int			first;
	int16		g;

	memset(nd, 0, sizeof(NumericDigits));
	memcpy(&header, data, sizeof(uint16));
	if ((header & NUM_SIGN_MASK) == NUM_SPECIAL)
	{
		nd->special = true;
		return;
	}
	if (header & NUM_SHORT)
	{
		nd->negative = (header & NUM_SHORT_SIGN_MASK) != 0;
		weight = (header & NUM_SHORT_WEIGHT_SIGN_MASK) ?
			(int) (~NUM_SHORT_WEIGHT_MASK | (header & NUM_SHORT_WEIGHT_MASK)) :
			(int) (header & NUM_SHORT_WEIGHT_MASK);
		hdrlen = sizeof(uint16);
	}
	else
	{
		int16		w;

		nd->negative = (header & NUM_SIGN_MASK) == NUM_NEG;
		memcpy(&w, data + sizeof(uint16), sizeof(int16));
		weight = w;
		hdrlen = sizeof(uint16) + sizeof(int16);
	}
	nd->groups = data + hdrlen;
	nd->ngroups = (size - hdrlen) / sizeof(int16);

	/* stored numerics have no zero groups at either end; be safe anyway */
	first = 0;
	while (first < nd->ngroups && numeric_group(nd->groups, first) == 0)
	{
		first++;
		weight--;
	}
	nd->groups += first * sizeof(int16);
	nd->ngroups -= first;
	while (nd->ngroups > 0 &&
		   numeric_group(nd->groups, nd->ngroups - 1) == 0)
		nd->ngroups--;
	if (nd->ngroups == 0)
	{
		nd->negative = false;	/* JSON -0 is 0 */
		return;
	}

	g = numeric_group(nd->groups, 0);
	nd->lead = (g >= 1000) ? 0 : (g >= 100) ? 1 : (g >= 10) ? 2 : 3;
	g = numeric_group(nd->groups, nd->ngroups - 1);
	while (g % 10 == 0)
	{
		nd->trail++;
		g /= 10;
	}
	nd->nsig = nd->ngroups * NUM_DEC_DIGITS - nd->lead - nd->trail;
	nd->exponent = (weight + 1) * NUM_DEC_DIGITS - nd->lead;
}

/*
 * Write all decimal digits of the groups (4 per group, zero-padded) into
 * out, which has room for 4 * ngroups bytes.
 */
static void
numeric_digits_text(const NumericDigits *nd, char *out)
{
	int			i;

	for (i = 0; i < nd->ngroups; i++)
	{
		int			g = numeric_group(nd->groups, i);

		out[3] = '0' + g % 10;
		g /= 10;
		out[2] = '0' + g % 10;
		g /= 10;
		out[1] = '0' + g % 10;
		out[0] = '0' + g / 10;
		out += NUM_DEC_DIGITS;
	}
}

/* JSON Pointer of a PathStep chain, for messages. */
static char *
path_to_pointer(const PathStep *path)
{
	StringInfoData buf;
	const PathStep *steps[64];
	int			nsteps = 0;
	const PathStep *s;
	bool		elided = false;

	initStringInfo(&buf);
	/* innermost 64 steps are enough to find the value */
	for (s = path; s != NULL; s = s->parent)
	{
		if (nsteps == lengthof(steps))
		{
			elided = true;
			break;
		}
		steps[nsteps++] = s;
	}
	if (elided)
		appendStringInfoString(&buf, "/...");
	while (nsteps > 0)
	{
		s = steps[--nsteps];
		appendStringInfoChar(&buf, '/');
		if (s->key == NULL)
			appendStringInfo(&buf, "%d", s->index);
		else
		{
			int			i;

			for (i = 0; i < s->keylen; i++)
			{
				unsigned char c = (unsigned char) s->key[i];

				/*
				 * RFC 6901 escapes, then escaped as a JSON string, as the
				 * messages quote it: a member name's quotes and control
				 * characters cannot break the message or the log line
				 */
				if (c == '~')
					appendStringInfoString(&buf, "~0");
				else if (c == '/')
					appendStringInfoString(&buf, "~1");
				else if (c == '"' || c == '\\')
				{
					appendStringInfoChar(&buf, '\\');
					appendStringInfoChar(&buf, (char) c);
				}
				else if (c < 0x20)
					appendStringInfo(&buf, "\\u%04x", c);
				else
					appendStringInfoChar(&buf, (char) c);
			}
		}
	}
	return buf.data;
}

static pg_noinline void
report_number_out_of_range(const NumericDigits *nd, const char *digits,
						   const PathStep *path)
{
	char		shown[NUMBER_TEXT_LEN];
	int			k = Min(nd->nsig, 17);
	int			len;

	len = format_es_number(shown, nd->negative, digits, k, nd->exponent);
	shown[len] = '\0';
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("number %s%s in the request is out of range for a fingerprint",
					shown, (k < nd->nsig) ? "..." : ""),
			 errdetail("The number is at JSON pointer \"%s\".  Canonical JSON (RFC 8785) holds IEEE 754 double precision numbers: at most about 1.8e+308 in magnitude, and none that is not zero but rounds to zero (below about 4.9e-324).",
					   path_to_pointer(path)),
			 errhint("Send the value %s%s as a JSON string, or as a number within the double precision range.",
					 shown, (k < nd->nsig) ? "..." : "")));
}

/*
 * shorter_boundary
 *		ECMAScript's shortest digits of d when they are shorter than Ryu's k.
 *
 * Number.prototype.toString takes the fewest digits whose value reads back
 * as d, reading with round-half-to-even.  A decimal exactly half-way
 * between d and a neighbouring double reads back as d when d's significand
 * is even, and may have fewer digits than anything strictly between the
 * two: 1e23 is the midpoint between 99999999999999991611392 (even) and the
 * next double, so ECMAScript writes that double "1e+23".  Ryu never takes
 * an upper midpoint (nor a lower one above 2^53), and writes it
 * "9.999999999999999e+22".
 *
 * A midpoint is (2m + 1) * 2^(e - 1) for d = m * 2^e (the lower one at a
 * power of two is (4m - 1) * 2^(e - 2)): an odd number times a power of
 * two.  With a negative power its decimal expansion ends in an odd digit
 * and has at least 17 significant digits, never fewer than Ryu's; with a
 * power q >= 0 it is an integer whose trailing zeros come from the factors
 * 5 of the odd part, as many as min(q, those factors).  So the midpoints
 * worth a look are p * 2^q = s * 10^t with s small, computed exactly in 64
 * bits.  Returns the number of digits written into "digits" (0 when
 * neither midpoint is shorter than k) and sets *n so that the value is
 * 0.DIGITS x 10^n.
 */
static int
shorter_boundary(double d, int k, char *digits, int *n)
{
	int			e2;
	uint64		m2;
	int			best = 0;
	int			side;

	/* d = m2 * 2^e2, m2 the 53-bit significand */
	(void) frexp(fabs(d), &e2);
	if (e2 < DBL_MIN_EXP)
		return 0;				/* subnormal: midpoints are fractions */
	m2 = (uint64) ldexp(fabs(d), 53 - e2);
	e2 -= 53;
	if ((m2 & 1) != 0 || e2 < 1)
		return 0;				/* odd significand, or fractional midpoints */

	for (side = 0; side < 2; side++)
	{
		uint64		p;
		int			q;
		int			t = 0;
		uint64		s;
		char		buf[24];
		int			len;

		if (side == 0)
		{
			p = 2 * m2 + 1;		/* upper midpoint */
			q = e2 - 1;
		}
		else if (m2 == (UINT64CONST(1) << 52))
		{
			p = 4 * m2 - 1;		/* lower midpoint at a power of two */
			q = e2 - 2;
		}
		else
		{
			p = 2 * m2 - 1;
			q = e2 - 1;
		}
		if (q < 0)
			continue;
		while (t < q && p % 5 == 0)
		{
			p /= 5;
			t++;
		}
		/* s = p * 2^(q - t) must have fewer than k <= 17 digits */
		if (q - t >= 64 || p > (UINT64CONST(9999999999999999) >> (q - t)))
			continue;
		s = p << (q - t);
		len = snprintf(buf, sizeof(buf), UINT64_FORMAT, s);
		if (len >= k || (best != 0 && len >= best))
			continue;
		memcpy(digits, buf, len);
		*n = len + t;
		best = len;
	}
	return best;
}

/*
 * number_via_double
 *		The general case: the nearest double by strtod() (correctly rounded),
 *		its shortest round-trip digits by Ryu, in ECMAScript notation.
 */
static int
number_via_double(const NumericDigits *nd, char *out, const PathStep *path)
{
	char		localbuf[128];
	char	   *dectext;
	int			ndigits = nd->ngroups * NUM_DEC_DIGITS;
	int			textlen = ndigits + 32;
	char	   *p;
	char	   *end;
	double		d;
	char		shortest[DOUBLE_SHORTEST_DECIMAL_LEN + 1];
	int			slen;
	char		digits[DOUBLE_SHORTEST_DECIMAL_LEN];
	int			k = 0;
	int			intdigits = -1;
	int			exp10 = 0;
	int			i;

	dectext = (textlen <= (int) sizeof(localbuf)) ? localbuf : palloc(textlen);
	p = dectext;
	*p++ = '0';
	*p++ = '.';
	numeric_digits_text(nd, p);
	p += ndigits;
	sprintf(p, "e%d", nd->exponent + nd->lead);

	errno = 0;
	d = strtod(dectext, &end);
	Assert(*end == '\0');
	if (isinf(d) || d == 0.0)
		report_number_out_of_range(nd, dectext + 2 + nd->lead, path);
	if (dectext != localbuf)
		pfree(dectext);

	/* Ryu gives e.g. "1.2345e+30", "1e-07", "123.45" or "0.001" */
	slen = double_to_shortest_decimal_buf(d, shortest);
	for (i = 0; i < slen; i++)
	{
		char		c = shortest[i];

		if (c >= '0' && c <= '9')
			digits[k++] = c;
		else if (c == '.')
			intdigits = k;
		else if (c == 'e' || c == 'E')
		{
			exp10 = atoi(shortest + i + 1);
			break;
		}
	}
	if (intdigits < 0)
		intdigits = k;

	/* normalise to 0.DIGITS x 10^n without leading or trailing zeros */
	{
		int			lead = 0;
		int			n = intdigits + exp10;

		while (lead < k - 1 && digits[lead] == '0')
		{
			lead++;
			n--;
		}
		while (k > lead + 1 && digits[k - 1] == '0')
			k--;
		{
			char		mid[DOUBLE_SHORTEST_DECIMAL_LEN];
			int			midn;
			int			midk = shorter_boundary(d, k - lead, mid, &midn);

			if (midk > 0)
				return format_es_number(out, nd->negative, mid, midk, midn);
		}
		return format_es_number(out, nd->negative, digits + lead, k - lead, n);
	}
}

/*
 * format_number
 *		The canonical text of a jsonb numeric into out (NUMBER_TEXT_LEN
 *		bytes); returns its length.  Raises 22003 for a number with no finite,
 *		non-zero double.
 */
static int
format_number(Numeric num, char *out, const PathStep *path)
{
	NumericDigits nd;
	char		digits[(FAST_MAX_DIGITS / NUM_DEC_DIGITS + 2) * NUM_DEC_DIGITS];

	decode_numeric(num, &nd);
	if (unlikely(nd.special))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("NaN or infinity in the request cannot be fingerprinted"),
				 errdetail("The value is at JSON pointer \"%s\".",
						   path_to_pointer(path)),
				 errhint("Send the value as a JSON string.")));
	if (nd.nsig == 0)
	{
		out[0] = '0';
		return 1;
	}
	if (nd.nsig <= FAST_MAX_DIGITS &&
		nd.exponent >= -FAST_MAX_EXPONENT && nd.exponent <= FAST_MAX_EXPONENT)
	{
		/* at most 15 digits span at most 5 groups */
		Assert(nd.ngroups * NUM_DEC_DIGITS <= (int) sizeof(digits));
		numeric_digits_text(&nd, digits);
		return format_es_number(out, nd.negative, digits + nd.lead, nd.nsig,
								nd.exponent);
	}
	return number_via_double(&nd, out, path);
}

/* ----------------------------------------------------------------
 * The walk
 * ----------------------------------------------------------------
 */

/*
 * to_utf8
 *		The UTF-8 form of a string in the database encoding (only called when
 *		st->convert).  ASCII is the same in every server encoding, so only
 *		strings with a high-bit byte are converted.
 */
static const char *
to_utf8(CanonState *st, const char *str, uint32 len, uint32 *ulen)
{
	MemoryContext oldcxt;
	char	   *converted;
	uint32		i;

	*ulen = len;
	for (i = 0; i < len; i++)
		if (IS_HIGHBIT_SET(str[i]))
			break;
	if (i == len)
		return str;

	oldcxt = MemoryContextSwitchTo(st->convert_cxt);
	converted = pg_server_to_any(str, (int) len, PG_UTF8);
	MemoryContextSwitchTo(oldcxt);
	if (converted != str)
		*ulen = (uint32) strlen(converted);
	return converted;
}

/*
 * emit_value
 *		Write one child of a container: "entry" is its JEntry, "data" the
 *		start of its bytes (before alignment padding), "len" their length.
 */
static inline void
emit_value(CanonState *st, JEntry entry, const char *data, uint32 offset,
		   uint32 len, int depth, const int *active, int nactive,
		   const PathStep *path)
{
	CanonSink  *sink = st->sink;

	switch (entry & JENTRY_TYPEMASK)
	{
		case JENTRY_ISSTRING:
			if (unlikely(st->convert) && sink->canon == NULL)
			{
				uint32		ulen;
				const char *ustr = to_utf8(st, data + offset, len, &ulen);

				emit_string(sink, ustr, ulen);
			}
			else
				emit_string(sink, data + offset, len);
			break;
		case JENTRY_ISNUMERIC:
			{
				char		num[NUMBER_TEXT_LEN];
				int			nlen;

				nlen = format_number((Numeric) (data + INTALIGN(offset)),
									 num, path);
				sink_put(sink, num, nlen);
			}
			break;
		case JENTRY_ISBOOL_TRUE:
			sink_put(sink, "true", 4);
			break;
		case JENTRY_ISBOOL_FALSE:
			sink_put(sink, "false", 5);
			break;
		case JENTRY_ISNULL:
			sink_put(sink, "null", 4);
			break;
		case JENTRY_ISCONTAINER:
			emit_container(st, (JsonbContainer *) (data + INTALIGN(offset)),
						   depth, active, nactive, path);
			break;
		default:
			elog(ERROR, "unrecognized jsonb entry type: %08x",
				 entry & JENTRY_TYPEMASK);
	}
}

/*
 * Which of the pointers active at "depth" name the member "key" (or, with
 * key NULL, the array element "index")?  Pointers ending here remove the
 * child (returns true); those going deeper are copied into child_active.
 */
static bool
match_pointers(CanonState *st, int depth, const int *active, int nactive,
			   const char *key, uint32 keylen, int index,
			   int *child_active, int *nchild)
{
	bool		removed = false;
	int			i;

	/* a long list against a large request: let the statement be cancelled */
	CHECK_FOR_INTERRUPTS();
	*nchild = 0;
	for (i = 0; i < nactive; i++)
	{
		IgnorePointer *ptr = &st->pointers[active[i]];
		PointerToken *tok = &ptr->tokens[depth];
		bool		match;

		if (key != NULL)
			match = (tok->len == (int) keylen &&
					 memcmp(tok->name, key, keylen) == 0);
		else
			match = (tok->index == index);
		if (!match)
			continue;
		if (ptr->ntokens == depth + 1)
			removed = true;
		else
			child_active[(*nchild)++] = active[i];
	}
	return removed;
}

/*
 * emit_array
 *		Write the elements of array "jc" (of "count" elements), leaving out
 *		those an ignore pointer removes; a scalar request (a one-element
 *		array) is written as its element alone.  Arguments as for
 *		emit_container; "step" is the path step of the children.
 */
static void
emit_array(CanonState *st, JsonbContainer *jc, uint32 count, int depth,
		   const int *active, int nactive, int *child_active,
		   const PathStep *path, PathStep *step)
{
	CanonSink  *sink = st->sink;
	const char *data = (const char *) &jc->children[count];
	int			nchild = 0;
	uint32		offset = 0;
	uint32		i;
	bool		first = true;

	Assert(!JsonContainerIsScalar(jc) || count == 1);
	if (!JsonContainerIsScalar(jc))
		sink_putc(sink, '[');
	step->key = NULL;
	step->keylen = 0;
	for (i = 0; i < count; i++)
	{
		JEntry		entry = jc->children[i];
		uint32		start = offset;

		JBE_ADVANCE_OFFSET(offset, entry);
		if (nactive > 0 &&
			match_pointers(st, depth, active, nactive, NULL, 0, (int) i,
						   child_active, &nchild))
			continue;
		if (!first)
			sink_putc(sink, ',');
		first = false;
		step->index = (int) i;
		/* a scalar request is the whole document: pointer "" */
		emit_value(st, entry, data, start, offset - start, depth + 1,
				   child_active, nchild,
				   JsonContainerIsScalar(jc) ? path : step);
	}
	if (!JsonContainerIsScalar(jc))
		sink_putc(sink, ']');
}

/*
 * push_members
 *		Put the "count" members of object "jc" on top of the shared member
 *		stack (keys, their UTF-8 form, and where each value is), sorted in
 *		canonical key order.  Returns the stack position of the first; the
 *		caller pops them by resetting st->members_used to it.
 */
static int
push_members(CanonState *st, JsonbContainer *jc, uint32 count)
{
	const char *data = (const char *) &jc->children[count * 2];
	uint32		offset = 0;
	uint32		i;
	int			base;
	MemberRef  *m;

	if (st->members_used + (Size) count > (Size) st->members_size)
	{
		Size		need = st->members_used + (Size) count;
		Size		limit = MaxAllocSize / sizeof(MemberRef);
		int			newsize;

		/* the open objects' members, all of them at once */
		if (need > limit)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("request has too many object members to fingerprint"),
					 errdetail("The objects open at one point of the request have %zu members; at most %zu can be sorted.",
							   need, limit),
					 errhint("Split the request, or keep large collections in arrays, whose elements are not sorted.")));
		newsize = (int) Min(Max((Size) st->members_size * 2, need), limit);

		if (st->members == NULL)
			st->members = palloc(newsize * sizeof(MemberRef));
		else
			st->members = repalloc(st->members, newsize * sizeof(MemberRef));
		st->members_size = newsize;
	}
	base = st->members_used;
	st->members_used += count;
	m = st->members + base;

	/* keys come first, then values in the same order */
	for (i = 0; i < count; i++)
	{
		JEntry		entry = jc->children[i];
		uint32		start = offset;

		JBE_ADVANCE_OFFSET(offset, entry);
		m[i].key = data + start;
		m[i].keylen = offset - start;
		if (unlikely(st->convert))
			m[i].ukey = to_utf8(st, m[i].key, m[i].keylen, &m[i].ukeylen);
		else
		{
			m[i].ukey = m[i].key;
			m[i].ukeylen = m[i].keylen;
		}
	}
	for (i = 0; i < count; i++)
	{
		JEntry		entry = jc->children[count + i];
		uint32		start = offset;

		JBE_ADVANCE_OFFSET(offset, entry);
		m[i].ventry = entry;
		m[i].voffset = start;
		m[i].vlen = offset - start;
	}
	sort_members(m, count);
	return base;
}

/*
 * emit_object
 *		Write the members of object "jc" (of "count" members) in canonical
 *		key order, leaving out those an ignore pointer removes.  Arguments
 *		as for emit_array.
 */
static void
emit_object(CanonState *st, JsonbContainer *jc, uint32 count, int depth,
			const int *active, int nactive, int *child_active,
			PathStep *step)
{
	CanonSink  *sink = st->sink;
	const char *data = (const char *) &jc->children[count * 2];
	int			nchild = 0;
	int			base;
	uint32		i;
	bool		first = true;

	Assert(JsonContainerIsObject(jc));
	base = push_members(st, jc, count);

	sink_putc(sink, '{');
	for (i = 0; i < count; i++)
	{
		/* the stack may move while a child object is written */
		MemberRef	member = st->members[base + i];

		if (nactive > 0 &&
			match_pointers(st, depth, active, nactive,
						   member.key, member.keylen, -1,
						   child_active, &nchild))
			continue;
		if (!first)
			sink_putc(sink, ',');
		first = false;
		/* the text stays in the database encoding; the hash is UTF-8 */
		if (sink->canon != NULL)
			emit_string(sink, member.key, member.keylen);
		else
			emit_string(sink, member.ukey, member.ukeylen);
		sink_putc(sink, ':');
		step->key = member.key;
		step->keylen = (int) member.keylen;
		step->index = -1;
		emit_value(st, member.ventry, data, member.voffset, member.vlen,
				   depth + 1, child_active, nchild, step);
	}
	sink_putc(sink, '}');
	st->members_used = base;
}

/*
 * emit_container
 *		Write an object or array.  "active" lists the ignore pointers that
 *		match the path down to this container (their tokens[depth] applies
 *		to its children).
 */
static void
emit_container(CanonState *st, JsonbContainer *jc, int depth,
			   const int *active, int nactive, const PathStep *path)
{
	uint32		count = JsonContainerSize(jc);
	int		   *child_active = NULL;
	PathStep	step;

	check_stack_depth();
	CHECK_FOR_INTERRUPTS();

	/* a scalar request is stored as a one-element array: nothing to remove */
	if (JsonContainerIsScalar(jc))
		nactive = 0;
	if (nactive > 0)
		child_active = st->active + (depth + 1) * st->npointers;
	step.parent = path;

	if (JsonContainerIsArray(jc))
		emit_array(st, jc, count, depth, active, nactive, child_active,
				   path, &step);
	else
		emit_object(st, jc, count, depth, active, nactive, child_active,
					&step);
}

/* ----------------------------------------------------------------
 * Ignore pointers
 * ----------------------------------------------------------------
 */

/*
 * parse_pointer
 *		Parse one RFC 6901 JSON Pointer into unescaped reference tokens.
 *		Raises 22023 for the empty pointer (the whole request) and 22P02 for
 *		a pointer not starting with '/' or with a '~' not followed by '0' or
 *		'1'.  Allocates in the current memory context.
 */
static void
parse_pointer(const char *ptext, int len, IgnorePointer *ptr)
{
	char	   *names;
	int			ntokens = 0;
	int			i;
	int			t;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fingerprint ignore pointer \"\" names the whole request"),
				 errdetail("Ignoring the whole request would give every request the same fingerprint."),
				 errhint("Name the members to leave out, e.g. \"/metadata/sent_at\".")));
	if (ptext[0] != '/')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
				 errmsg("invalid JSON pointer \"%.*s\"", len, ptext),
				 errdetail("A JSON pointer (RFC 6901) starts with \"/\"."),
				 errhint("Write the member's path from the top of the request, e.g. \"/metadata/sent_at\".")));

	for (i = 0; i < len; i++)
	{
		if (ptext[i] == '/')
			ntokens++;
		else if (ptext[i] == '~' &&
				 (i + 1 >= len || (ptext[i + 1] != '0' && ptext[i + 1] != '1')))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
					 errmsg("invalid JSON pointer \"%.*s\"", len, ptext),
					 errdetail("In a JSON pointer (RFC 6901) \"~\" must be followed by \"0\" or \"1\"."),
					 errhint("Write \"~0\" for \"~\" and \"~1\" for \"/\" inside a member name.")));
	}

	ptr->ntokens = ntokens;
	ptr->tokens = palloc(ntokens * sizeof(PointerToken));
	/* the tokens' names, one after the other: no longer than the pointer */
	names = palloc(len + 1);
	i = 1;						/* after the leading '/' */
	for (t = 0; t < ntokens; t++)
	{
		PointerToken *tok = &ptr->tokens[t];
		char	   *out = names;
		int			olen = 0;
		bool		is_index;
		int			c;

		while (i < len && ptext[i] != '/')
		{
			if (ptext[i] == '~')
			{
				out[olen++] = (ptext[i + 1] == '0') ? '~' : '/';
				i += 2;
			}
			else
				out[olen++] = ptext[i++];
		}
		i++;					/* skip the '/' */
		out[olen] = '\0';
		tok->name = out;
		tok->len = olen;
		names += olen + 1;

		/* an array index is "0" or digits without a leading zero */
		is_index = olen > 0 && olen <= 9 && (olen == 1 || out[0] != '0');
		for (c = 0; is_index && c < olen; c++)
			is_index = (out[c] >= '0' && out[c] <= '9');
		tok->index = is_index ? atoi(out) : -1;
	}
}

/*
 * Parse the ignore array into st.  NULL means nothing to ignore.  Errors are
 * raised here, before anything is written.
 */
static void
parse_ignore(CanonState *st, ArrayType *ignore)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			i;
	Size		total_tokens = 0;

	if (ignore == NULL)
		return;
	if (ARR_ELEMTYPE(ignore) != TEXTOID)
		elog(ERROR, "fingerprint ignore list must be a text array");
	if (ARR_NDIM(ignore) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fingerprint ignore list must be a one-dimensional array"),
				 errhint("List the JSON Pointers in one dimension, such as '{/timestamp,/meta/trace_id}'.")));
	deconstruct_array(ignore, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	if (nelems == 0)
		return;

	st->pointers = palloc(nelems * sizeof(IgnorePointer));
	for (i = 0; i < nelems; i++)
	{
		text	   *t;
		const char *p;
		int			len;
		int			ntokens = 0;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("fingerprint ignore list must not contain nulls"),
					 errhint("Remove the null elements, or pass NULL instead of the whole list to ignore nothing.")));
		t = DatumGetTextPP(elems[i]);
		p = VARDATA_ANY(t);
		len = VARSIZE_ANY_EXHDR(t);

		/*
		 * What following the list takes, before it is taken: each pointer's
		 * members, and the pointers still matching at each depth (past 1 GB
		 * the sizes would not even be allocated)
		 */
		for (int c = 0; c < len; c++)
			ntokens += (p[c] == '/');
		total_tokens += ntokens;
		if ((Size) Max(st->maxtokens, ntokens) + 1 >
			MaxAllocSize / sizeof(int) / (Size) nelems ||
			total_tokens > MaxAllocSize / sizeof(PointerToken))
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("fingerprint ignore list is too large"),
					 errdetail("It has %d pointers, the longest of %d members.",
							   nelems, Max(st->maxtokens, ntokens)),
					 errhint("List the few members that change between retries of a request, such as \"/metadata/sent_at\".")));
		parse_pointer(p, len, &st->pointers[i]);
		st->maxtokens = Max(st->maxtokens, st->pointers[i].ntokens);
		if ((Pointer) t != DatumGetPointer(elems[i]))
			pfree(t);
	}
	st->npointers = nelems;
	/* the pointers still matching at each depth (in size, checked above) */
	st->active = palloc(((Size) st->maxtokens + 1) * (Size) nelems * sizeof(int));
	for (i = 0; i < nelems; i++)
		st->active[i] = i;
	pfree(elems);
	pfree(nulls);
}

/*
 * Set up st for one call: ignore pointers parsed (raising on bad ones), and
 * the conversion context when the database is not UTF8.
 */
static void
init_state(CanonState *st, ArrayType *ignore)
{
	int			encoding = GetDatabaseEncoding();

	memset(st, 0, sizeof(CanonState));
	parse_ignore(st, ignore);
	if (encoding != PG_UTF8 && encoding != PG_SQL_ASCII)
	{
		st->convert = true;
		st->convert_cxt = AllocSetContextCreate(CurrentMemoryContext,
												"idempotency fingerprint conversion",
												ALLOCSET_DEFAULT_SIZES);
	}
}

static void
free_state(CanonState *st)
{
	int			i;

	for (i = 0; i < st->npointers; i++)
	{
		/* the tokens' names share one allocation, the first one's */
		if (st->pointers[i].ntokens > 0)
			pfree(st->pointers[i].tokens[0].name);
		if (st->pointers[i].tokens)
			pfree(st->pointers[i].tokens);
	}
	if (st->pointers)
		pfree(st->pointers);
	if (st->active)
		pfree(st->active);
	if (st->members)
		pfree(st->members);
	if (st->convert_cxt)
		MemoryContextDelete(st->convert_cxt);
}

/* Walk the whole request into the sink. */
static void
write_canonical(CanonState *st, Jsonb *request)
{
	emit_container(st, &request->root, 0, st->active, st->npointers, NULL);
	sink_flush(st->sink);
}

/* ----------------------------------------------------------------
 * C API (idempotency.h)
 * ----------------------------------------------------------------
 */

/*
 * idem_compute_fingerprint
 *		SHA-256 of the canonical form of "request" without the members named
 *		by "ignore" (text[] of JSON Pointers, or NULL), into result
 *		(IDEM_FINGERPRINT_LEN bytes); returns the length of the canonical
 *		text hashed.  Pointers are checked before anything is hashed.  Takes
 *		no locks, writes nothing but result; memory it allocates is freed
 *		before it returns.
 */
Size
idem_compute_fingerprint(Jsonb *request, ArrayType *ignore, uint8 *result)
{
	CanonState	st;
	CanonSink	sink;

	init_state(&st, ignore);

	sink.len = 0;
	sink.written = 0;
	sink.canon = NULL;
	hash_begin(&sink);
	st.sink = &sink;
	write_canonical(&st, request);
	hash_end(&sink, result);
	free_state(&st);
	return sink.written;
}

/*
 * Canonical text into buf (which may already hold a prefix).
 */
static void
canonical_into(Jsonb *request, ArrayType *ignore, StringInfo buf)
{
	CanonState	st;
	CanonSink	sink;

	init_state(&st, ignore);

	sink.len = 0;
	sink.written = 0;
	sink.canon = buf;
	sink.hash = NULL;
	st.sink = &sink;
	write_canonical(&st, request);
	free_state(&st);
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * idem_canonical(request jsonb, ignore text[] DEFAULT NULL) RETURNS text
 *		NULL request gives NULL; NULL ignore ignores nothing.
 */
Datum
idem_canonical(PG_FUNCTION_ARGS)
{
	Jsonb	   *request;
	ArrayType  *ignore = NULL;
	StringInfoData buf;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	request = PG_GETARG_JSONB_P(0);
	if (PG_NARGS() > 1 && !PG_ARGISNULL(1))
		ignore = PG_GETARG_ARRAYTYPE_P(1);

	/* build the text datum in place: room for its header first */
	initStringInfo(&buf);
	appendStringInfoSpaces(&buf, VARHDRSZ);
	canonical_into(request, ignore, &buf);
	SET_VARSIZE(buf.data, buf.len);

	PG_FREE_IF_COPY(request, 0);
	PG_RETURN_TEXT_P((text *) buf.data);
}

/*
 * idem_fingerprint(request jsonb, ignore text[] DEFAULT NULL) RETURNS bytea
 *		The 32-byte SHA-256 of idem_canonical(request, ignore).
 */
Datum
idem_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *request;
	ArrayType  *ignore = NULL;
	bytea	   *result;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	request = PG_GETARG_JSONB_P(0);
	if (PG_NARGS() > 1 && !PG_ARGISNULL(1))
		ignore = PG_GETARG_ARRAYTYPE_P(1);

	result = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);
	SET_VARSIZE(result, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	idem_compute_fingerprint(request, ignore, (uint8 *) VARDATA(result));

	PG_FREE_IF_COPY(request, 0);
	if (ignore != NULL)
		PG_FREE_IF_COPY(ignore, 1);
	PG_RETURN_BYTEA_P(result);
}
