/* SPDX-License-Identifier: MIT */
/*
 * s3_xml.c - a bounded scanner for S3's XML answers and the writer of the
 * CompleteMultipartUpload body (s3_xml.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "store/s3_digest.h"
#include "store/s3_xml.h"

/* One element seen by the scanner. */
struct elem {
	const char *name;
	size_t name_len;
	const char *inner; /* content start */
};

/* What the walk calls for each element that ends: its path depth, the
 * names of its ancestors and itself (stack[0..depth]), and its inner
 * content [inner, end). */
typedef int (*visit_fn)(void *ud, const struct elem *stack, unsigned depth, const char *end);

static bool name_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-' || c == '.' || c == ':';
}

/* Finds `what` in [p, end); NULL if absent. */
static const char *find(const char *p, const char *end, const char *what)
{
	size_t n = strlen(what);

	for (; p + n <= end; p++)
		if (!memcmp(p, what, n))
			return p;
	return NULL;
}

/* The '>' that ends the tag starting at p (quoted values skipped), or NULL
 * if there is none or a '<' comes first. */
static const char *tag_end(const char *p, const char *end)
{
	char quote = 0;

	for (const char *q = p + 1; q < end; q++) {
		if (quote) {
			if (*q == quote)
				quote = 0;
		} else if (*q == '"' || *q == '\'') {
			quote = *q;
		} else if (*q == '<') {
			return NULL;
		} else if (*q == '>') {
			return q;
		}
	}
	return NULL;
}

/* Walks a document or a fragment (the content of an element: several
 * sibling elements and text between them), calling fn when an element
 * ends.  Returns 0, fn's first non-zero return, or -EBADMSG. */
static int walk(const char *p, size_t len, visit_fn fn, void *ud)
{
	const char *end = p + len;
	struct elem stack[S3_XML_DEPTH];
	unsigned depth = 0;

	while (p < end) {
		if (*p != '<') {
			p++;
			continue;
		}
		if (end - p >= 4 && !memcmp(p, "<!--", 4)) {
			const char *q = find(p + 4, end, "-->");

			if (!q)
				return -EBADMSG;
			p = q + 3;
			continue;
		}
		if (end - p >= 9 && !memcmp(p, "<![CDATA[", 9)) {
			const char *q = find(p + 9, end, "]]>");

			if (!q)
				return -EBADMSG;
			p = q + 3;
			continue;
		}
		if (end - p >= 2 && p[1] == '?') {
			const char *q = find(p + 2, end, "?>");

			if (!q || depth > 0)
				return -EBADMSG;
			p = q + 2;
			continue;
		}
		if (end - p >= 2 && p[1] == '!')
			return -EBADMSG; /* DOCTYPE and the like: S3 sends none */
		if (end - p >= 2 && p[1] == '/') {
			/* An end tag: must close the innermost element. */
			const char *n = p + 2, *q = n;
			int r;

			while (q < end && name_char(*q))
				q++;
			if (depth == 0 || (size_t)(q - n) != stack[depth - 1].name_len ||
			    memcmp(n, stack[depth - 1].name, (size_t)(q - n)))
				return -EBADMSG;
			while (q < end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
				q++;
			if (q >= end || *q != '>')
				return -EBADMSG;
			r = fn(ud, stack, depth - 1, p);
			if (r)
				return r;
			depth--;
			p = q + 1;
			continue;
		}
		/* A start tag (attributes skipped: S3 puts only xmlns there). */
		{
			const char *n = p + 1, *q = n;
			bool empty;

			while (q < end && name_char(*q))
				q++;
			if (q == n)
				return -EBADMSG;
			if (depth == S3_XML_DEPTH)
				return -EBADMSG;
			stack[depth].name = n;
			stack[depth].name_len = (size_t)(q - n);
			q = tag_end(p, end);
			if (!q)
				return -EBADMSG;
			empty = q[-1] == '/';
			stack[depth].inner = q + 1;
			if (empty) {
				int r = fn(ud, stack, depth, q + 1);

				if (r)
					return r;
			} else {
				depth++;
			}
			p = q + 1;
		}
	}
	return depth == 0 ? 0 : -EBADMSG;
}

/* Whether stack[0..depth] spells path. */
static bool path_is(const struct elem *stack, unsigned depth, const char *path)
{
	const char *p = path;

	for (unsigned i = 0; i <= depth; i++) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (n != stack[i].name_len || memcmp(p, stack[i].name, n))
			return false;
		if (i == depth)
			return !slash;
		if (!slash)
			return false;
		p = slash + 1;
	}
	return false;
}

/* Decodes the text of [p, end), skipping child elements, comments and
 * keeping CDATA, into buf.  Returns the length or -EBADMSG / -ENAMETOOLONG. */
static int decode_text(const char *p, const char *end, char *buf, size_t buflen)
{
	size_t o = 0;
	unsigned nest = 0;

	while (p < end) {
		if (*p == '<') {
			const char *q;

			if (end - p >= 9 && !memcmp(p, "<![CDATA[", 9)) {
				q = find(p + 9, end, "]]>");
				if (!q)
					return -EBADMSG;
				if (nest == 0) {
					size_t n = (size_t)(q - (p + 9));

					if (o + n >= buflen)
						return -ENAMETOOLONG;
					memcpy(buf + o, p + 9, n);
					o += n;
				}
				p = q + 3;
				continue;
			}
			if (end - p >= 4 && !memcmp(p, "<!--", 4)) {
				q = find(p + 4, end, "-->");
				if (!q)
					return -EBADMSG;
				p = q + 3;
				continue;
			}
			q = tag_end(p, end);
			if (!q)
				return -EBADMSG;
			if (p[1] == '/')
				nest--;
			else if (q[-1] != '/')
				nest++;
			p = q + 1;
			continue;
		}
		if (nest > 0) {
			p++;
			continue;
		}
		if (*p == '&') {
			const char *semi = memchr(p, ';', (size_t)(end - p) < 12 ? (size_t)(end - p) : 12);
			unsigned long cp = 0;
			size_t n;

			if (!semi)
				return -EBADMSG;
			n = (size_t)(semi - p - 1);
			if (n == 3 && !memcmp(p + 1, "amp", 3))
				cp = '&';
			else if (n == 2 && !memcmp(p + 1, "lt", 2))
				cp = '<';
			else if (n == 2 && !memcmp(p + 1, "gt", 2))
				cp = '>';
			else if (n == 4 && !memcmp(p + 1, "quot", 4))
				cp = '"';
			else if (n == 4 && !memcmp(p + 1, "apos", 4))
				cp = '\'';
			else if (n >= 2 && p[1] == '#') {
				bool hexa = p[2] == 'x' || p[2] == 'X';

				for (const char *d = p + (hexa ? 3 : 2); d < semi; d++) {
					unsigned v;

					if (*d >= '0' && *d <= '9')
						v = (unsigned)(*d - '0');
					else if (hexa && *d >= 'a' && *d <= 'f')
						v = (unsigned)(*d - 'a' + 10);
					else if (hexa && *d >= 'A' && *d <= 'F')
						v = (unsigned)(*d - 'A' + 10);
					else
						return -EBADMSG;
					cp = cp * (hexa ? 16 : 10) + v;
					if (cp > 0x10ffff)
						return -EBADMSG;
				}
				if (semi == p + (hexa ? 3 : 2) || cp == 0)
					return -EBADMSG;
			} else {
				return -EBADMSG;
			}
			/* As UTF-8. */
			if (o + 4 >= buflen)
				return -ENAMETOOLONG;
			if (cp < 0x80) {
				buf[o++] = (char)cp;
			} else if (cp < 0x800) {
				buf[o++] = (char)(0xc0 | (cp >> 6));
				buf[o++] = (char)(0x80 | (cp & 0x3f));
			} else if (cp < 0x10000) {
				buf[o++] = (char)(0xe0 | (cp >> 12));
				buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
				buf[o++] = (char)(0x80 | (cp & 0x3f));
			} else {
				buf[o++] = (char)(0xf0 | (cp >> 18));
				buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
				buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
				buf[o++] = (char)(0x80 | (cp & 0x3f));
			}
			p = semi + 1;
			continue;
		}
		if (o + 1 >= buflen)
			return -ENAMETOOLONG;
		buf[o++] = *p++;
	}
	if (o >= buflen)
		return -ENAMETOOLONG;
	buf[o] = '\0';
	return (int)o;
}

struct text_ctx {
	const char *path;
	char *buf;
	size_t buflen;
	int res;
};

static int text_visit(void *ud, const struct elem *stack, unsigned depth, const char *end)
{
	struct text_ctx *t = ud;

	if (t->res != -ENOENT || !path_is(stack, depth, t->path))
		return 0;
	t->res = decode_text(stack[depth].inner, end, t->buf, t->buflen);
	return 0; /* the first one counts; the rest is still checked */
}

static int nop_visit(void *ud, const struct elem *stack, unsigned depth, const char *end)
{
	(void)ud, (void)stack, (void)depth, (void)end;
	return 0;
}

int s3_xml_text(const char *body, size_t len, const char *path, char *buf, size_t buflen)
{
	struct text_ctx t = { .path = path, .buf = buf, .buflen = buflen, .res = -ENOENT };
	int r;

	if (buflen == 0)
		return -ENAMETOOLONG;
	/* A body cut short or broken anywhere is refused as a whole, even
	 * where the element asked for came before the damage. */
	r = walk(body, len, text_visit, &t);
	return r < 0 ? r : t.res;
}

struct each_ctx {
	const char *path;
	int (*fn)(void *ud, const char *inner, size_t inner_len);
	void *ud;
	int count;
	int res;
};

static int each_visit(void *ud, const struct elem *stack, unsigned depth, const char *end)
{
	struct each_ctx *e = ud;
	int r;

	if (!path_is(stack, depth, e->path))
		return 0;
	r = e->fn(e->ud, stack[depth].inner, (size_t)(end - stack[depth].inner));
	if (r) {
		e->res = r;
		return 1;
	}
	e->count++;
	return 0;
}

int s3_xml_each(const char *body, size_t len, const char *path,
		int (*fn)(void *ud, const char *inner, size_t inner_len), void *ud)
{
	struct each_ctx e = { .path = path, .fn = fn, .ud = ud };
	/* Checked whole first, so fn never sees part of a broken body. */
	int r = walk(body, len, nop_visit, NULL);

	if (r < 0)
		return r;
	r = walk(body, len, each_visit, &e);

	if (r == 1)
		return e.res;
	return r < 0 ? r : e.count;
}

static void xml_escaped(struct jbuf *b, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': jbuf_lit(b, "&amp;"); break;
		case '<': jbuf_lit(b, "&lt;"); break;
		case '>': jbuf_lit(b, "&gt;"); break;
		case '"': jbuf_lit(b, "&quot;"); break;
		case '\'': jbuf_lit(b, "&apos;"); break;
		default: jbuf_ch(b, *s);
		}
	}
}

void s3_crc32c_b64(uint32_t crc, char out[9])
{
	uint8_t b[4] = { (uint8_t)(crc >> 24), (uint8_t)(crc >> 16), (uint8_t)(crc >> 8),
			 (uint8_t)crc };

	s3_b64(b, sizeof(b), out);
}

void s3_answer_error(const char *method, long status, const char *body, size_t len, char *code,
		     size_t codelen, char *msg, size_t msglen)
{
	code[0] = msg[0] = '\0';
	if (!body || (status < 300 && !strcmp(method, "GET")))
		return;
	if (s3_xml_text(body, len, "Error/Code", code, codelen) <= 0) {
		code[0] = '\0';
		return;
	}
	if (s3_xml_text(body, len, "Error/Message", msg, msglen) < 0)
		msg[0] = '\0';
}

void s3_complete_xml(struct jbuf *b, const struct s3_part_done *parts, uint32_t n)
{
	char crc[9];

	jbuf_lit(b, "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
	for (uint32_t i = 0; i < n; i++) {
		s3_crc32c_b64(parts[i].crc32c, crc);
		jbuf_lit(b, "<Part><ETag>");
		xml_escaped(b, parts[i].etag);
		jbuf_lit(b, "</ETag><PartNumber>");
		jbuf_u64(b, parts[i].number);
		jbuf_lit(b, "</PartNumber><ChecksumCRC32C>");
		jbuf_mem(b, crc, 8);
		jbuf_lit(b, "</ChecksumCRC32C></Part>");
	}
	jbuf_lit(b, "</CompleteMultipartUpload>");
}

void s3_delete_xml(struct jbuf *b, const char *const *keys, size_t n)
{
	jbuf_lit(b, "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Quiet>true</Quiet>");
	for (size_t i = 0; i < n; i++) {
		jbuf_lit(b, "<Object><Key>");
		xml_escaped(b, keys[i]);
		jbuf_lit(b, "</Key></Object>");
	}
	jbuf_lit(b, "</Delete>");
}
