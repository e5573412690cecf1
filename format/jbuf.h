/* SPDX-License-Identifier: MIT */
/*
 * jbuf.h - a growing output buffer for writing JSON by hand.
 *
 * The shard header, the descriptor and the index hold one entry per item
 * (10,000 and more); building them as jansson trees would cost several
 * allocations per number.  These appenders write text straight into one
 * buffer that doubles when full.
 *
 * Errors are sticky: after the first failure (-ENOMEM, or -E2BIG when the
 * text would pass `max` bytes, the NUL jbuf_finish() may add not counted)
 * every append is a no-op, and jbuf_finish() reports it.  Callers therefore
 * append without checking and check once at the end.
 */
#ifndef CKPT_FORMAT_JBUF_H
#define CKPT_FORMAT_JBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct jbuf {
	char *buf;
	size_t len, cap;
	size_t max;   /* the text may not grow past this many bytes */
	int err;      /* 0, or the first error */
};

/* Starts an empty buffer; `hint` is the expected size (a first allocation),
 * `max` the cap (0: no cap). */
void jbuf_init(struct jbuf *b, size_t hint, size_t max);

/* Slow path of jbuf_reserve(). */
bool jbuf_grow(struct jbuf *b, size_t n);

/* Makes room for n more bytes.  Returns false (and records the error) if
 * that is impossible. */
static inline bool jbuf_reserve(struct jbuf *b, size_t n)
{
	if (!b->err && b->cap - b->len >= n)
		return true;
	return jbuf_grow(b, n);
}

static inline void jbuf_mem(struct jbuf *b, const void *p, size_t n)
{
	if (n && jbuf_reserve(b, n)) {
		memcpy(b->buf + b->len, p, n);
		b->len += n;
	}
}

static inline void jbuf_ch(struct jbuf *b, char c)
{
	if (jbuf_reserve(b, 1))
		b->buf[b->len++] = c;
}

/* A string literal, copied without escaping. */
#define jbuf_lit(b, s) jbuf_mem((b), "" s, sizeof(s) - 1)

/* A decimal unsigned integer. */
void jbuf_u64(struct jbuf *b, uint64_t v);

/* A JSON string: quoted, with '"', '\\' and control characters escaped.
 * Other bytes pass as they are (the input is ASCII or UTF-8). */
void jbuf_str(struct jbuf *b, const char *s);

/* "[v0,v1,...]" */
void jbuf_u64_array(struct jbuf *b, const uint64_t *v, size_t n);

/* A jansson value (json_t *) in compact form, keys in insertion order;
 * NULL writes "{}". */
void jbuf_json(struct jbuf *b, const void *json);

/*
 * Ends the text.  On success hands the buffer to the caller: *ret_text
 * (malloc'd; NUL-terminated if `nul`, the NUL not counted in *ret_len) and
 * returns 0.  On failure frees it and returns the recorded error.
 * ret_len may be NULL.
 */
int jbuf_finish(struct jbuf *b, bool nul, char **ret_text, size_t *ret_len);

/* Frees the buffer (after a failure elsewhere).  Accepts a zeroed jbuf. */
void jbuf_free(struct jbuf *b);

#endif
