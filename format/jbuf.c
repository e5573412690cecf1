/* SPDX-License-Identifier: MIT */
/* jbuf.c - the JSON text appender (see jbuf.h). */
#include <errno.h>
#include <stdlib.h>

#include <jansson.h>

#include "format/jbuf.h"

/*
 * Invariant: cap <= max, and buf (when not NULL) has cap + 1 bytes, the one
 * past cap kept for the NUL jbuf_finish may add.  Keeping cap within max is
 * what makes the cap hold: jbuf_reserve's fast path checks only cap.
 */
void jbuf_init(struct jbuf *b, size_t hint, size_t max)
{
	b->buf = NULL;
	b->len = 0;
	b->cap = 0;
	b->max = max ? max : SIZE_MAX - 1;
	b->err = 0;
	if (hint > b->max)
		hint = b->max;
	if (hint) {
		b->buf = malloc(hint + 1);
		if (b->buf)
			b->cap = hint;
	}
}

bool jbuf_grow(struct jbuf *b, size_t n)
{
	size_t need, cap;
	char *p;

	if (b->err)
		return false;
	if (n > b->max - b->len) {
		b->err = -E2BIG;
		return false;
	}
	need = b->len + n;
	if (need <= b->cap)
		return true;
	cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = cap > SIZE_MAX / 4 ? need : cap * 2;
	if (cap > b->max)
		cap = b->max;
	p = realloc(b->buf, cap + 1);
	if (!p) {
		b->err = -ENOMEM;
		return false;
	}
	b->buf = p;
	b->cap = cap;
	return true;
}

void jbuf_u64(struct jbuf *b, uint64_t v)
{
	char tmp[20];
	size_t i = sizeof(tmp);

	do {
		tmp[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	jbuf_mem(b, tmp + i, sizeof(tmp) - i);
}

void jbuf_u64_array(struct jbuf *b, const uint64_t *v, size_t n)
{
	jbuf_ch(b, '[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			jbuf_ch(b, ',');
		jbuf_u64(b, v[i]);
	}
	jbuf_ch(b, ']');
}

void jbuf_str(struct jbuf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const char *run = s;

	jbuf_ch(b, '"');
	for (;; s++) {
		unsigned char c = (unsigned char)*s;

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		/* Copy the plain run before the special byte in one go. */
		jbuf_mem(b, run, (size_t)(s - run));
		run = s + 1;
		if (c == 0)
			break;
		if (c == '"' || c == '\\') {
			char esc[2] = { '\\', (char)c };

			jbuf_mem(b, esc, 2);
		} else {
			char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };

			jbuf_mem(b, esc, 6);
		}
	}
	jbuf_ch(b, '"');
}

void jbuf_json(struct jbuf *b, const void *json)
{
	const json_t *j = json;
	size_t n;

	if (!j) {
		jbuf_lit(b, "{}");
		return;
	}
	/* Reals keep jansson's default 17 significant digits, which read
	 * back to the same double. */
	n = json_dumpb(j, NULL, 0, JSON_COMPACT);
	if (n == 0) {
		if (!b->err)
			b->err = -ENOMEM;
		return;
	}
	if (!jbuf_reserve(b, n))
		return;
	if (json_dumpb(j, b->buf + b->len, n, JSON_COMPACT) != n) {
		b->err = -ENOMEM;
		return;
	}
	b->len += n;
}

int jbuf_finish(struct jbuf *b, bool nul, char **ret_text, size_t *ret_len)
{
	/* Even an empty text is a buffer the caller can free. */
	if (!b->err && !b->buf) {
		b->buf = malloc(1);
		if (!b->buf)
			b->err = -ENOMEM;
	}
	if (b->err) {
		int err = b->err;

		jbuf_free(b);
		return err;
	}
	if (nul)
		b->buf[b->len] = '\0'; /* the byte past cap (see the invariant) */
	*ret_text = b->buf;
	if (ret_len)
		*ret_len = b->len;
	b->buf = NULL;
	b->len = b->cap = 0;
	return 0;
}

void jbuf_free(struct jbuf *b)
{
	if (!b)
		return;
	free(b->buf);
	b->buf = NULL;
	b->len = b->cap = 0;
}
