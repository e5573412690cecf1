/* SPDX-License-Identifier: MIT */
/*
 * s3_addr.c - S3 locations, key checks and the percent-encoding that
 * libcurl 7.88's SigV4 signing needs from its caller (s3_addr.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store/s3_addr.h"

#define S3_SCHEME "s3://"

bool s3_is_url(const char *url)
{
	return url && !strncmp(url, S3_SCHEME, strlen(S3_SCHEME));
}

static bool lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* S3's bucket naming rules (general purpose buckets). */
static int bucket_check(const char *b, size_t n, char *err, size_t errlen)
{
	unsigned dots = 0, digits_only_labels = 0, labels = 1;
	bool label_digits = true;

	if (n < 3 || n > S3_BUCKET_MAX) {
		snprintf(err, errlen, "bucket name '%.*s' must have 3 to %d characters", (int)n, b,
			 S3_BUCKET_MAX);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		char c = b[i];

		if (c == '.') {
			dots++;
			labels++;
			if (label_digits)
				digits_only_labels++;
			label_digits = true;
			if (i + 1 < n && b[i + 1] == '.') {
				snprintf(err, errlen, "bucket name '%.*s' contains '..'", (int)n, b);
				return -EINVAL;
			}
		} else if (c == '-' || lower_alnum(c)) {
			if (c < '0' || c > '9')
				label_digits = false;
		} else {
			snprintf(err, errlen,
				 "bucket name '%.*s': only lowercase letters, digits, '.' and '-' "
				 "are allowed", (int)n, b);
			return -EINVAL;
		}
	}
	if (label_digits)
		digits_only_labels++;
	if (!lower_alnum(b[0]) || !lower_alnum(b[n - 1])) {
		snprintf(err, errlen, "bucket name '%.*s' must start and end with a letter or digit",
			 (int)n, b);
		return -EINVAL;
	}
	if (dots == 3 && labels == 4 && digits_only_labels == 4) {
		snprintf(err, errlen, "bucket name '%.*s' looks like an IP address", (int)n, b);
		return -EINVAL;
	}
	return 0;
}

/* Printable ASCII, no empty / "." / ".." segment.  what: for messages. */
static int segments_check(const char *s, size_t n, const char *what, char *err, size_t errlen)
{
	size_t seg = 0;

	for (size_t i = 0; i <= n; i++) {
		if (i == n || s[i] == '/') {
			size_t len = i - seg;

			if (len == 0 || (len == 1 && s[seg] == '.') ||
			    (len == 2 && s[seg] == '.' && s[seg + 1] == '.')) {
				snprintf(err, errlen, "%s '%.*s' has an empty, '.' or '..' segment",
					 what, (int)n, s);
				return -EINVAL;
			}
			seg = i + 1;
			continue;
		}
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
			snprintf(err, errlen,
				 "%s contains byte 0x%02x: only printable ASCII is accepted", what,
				 (unsigned char)s[i]);
			return -EINVAL;
		}
	}
	return 0;
}

int s3_url_parse(const char *url, struct s3_loc *ret, char *err, size_t errlen)
{
	const char *b, *slash;
	size_t bn, pn;
	int r;

	if (!s3_is_url(url)) {
		snprintf(err, errlen, "'%s' is not an s3:// URL", url ? url : "(null)");
		return -EINVAL;
	}
	b = url + strlen(S3_SCHEME);
	slash = strchr(b, '/');
	bn = slash ? (size_t)(slash - b) : strlen(b);
	r = bucket_check(b, bn, err, errlen);
	if (r < 0)
		return r;
	pn = 0;
	if (slash) {
		pn = strlen(slash + 1);
		/* One trailing '/' is how people write a prefix: allow it. */
		if (pn > 0 && slash[pn] == '/')
			pn--;
	}
	if (pn > S3_PREFIX_MAX) {
		snprintf(err, errlen, "prefix of '%.64s...' is longer than %d bytes", url,
			 S3_PREFIX_MAX);
		return -EINVAL;
	}
	if (pn > 0) {
		r = segments_check(slash + 1, pn, "prefix", err, errlen);
		if (r < 0)
			return r;
	} else if (slash && slash[1] == '/') {
		snprintf(err, errlen, "'%s': the prefix starts with '/'", url);
		return -EINVAL;
	}
	memcpy(ret->bucket, b, bn);
	ret->bucket[bn] = '\0';
	if (pn)
		memcpy(ret->prefix, slash + 1, pn);
	ret->prefix[pn] = '\0';
	return 0;
}

int s3_url_format(const struct s3_loc *loc, char *buf, size_t len)
{
	int n = loc->prefix[0] ? snprintf(buf, len, S3_SCHEME "%s/%s", loc->bucket, loc->prefix) :
				 snprintf(buf, len, S3_SCHEME "%s", loc->bucket);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int s3_key_check(const char *key, char *err, size_t errlen)
{
	size_t n = strlen(key);

	if (n == 0 || n > S3_KEY_MAX) {
		snprintf(err, errlen, "object key of %zu bytes (1..%d)", n, S3_KEY_MAX);
		return -EINVAL;
	}
	return segments_check(key, n, "object key", err, errlen);
}

static bool unreserved(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '.' || c == '_' || c == '~';
}

static int encode(const char *s, bool keep_slash, char *buf, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (unreserved(*p) || (keep_slash && *p == '/')) {
			if (o + 1 >= len)
				return -ENAMETOOLONG;
			buf[o++] = (char)*p;
		} else {
			if (o + 3 >= len)
				return -ENAMETOOLONG;
			buf[o++] = '%';
			buf[o++] = hex[*p >> 4];
			buf[o++] = hex[*p & 15];
		}
	}
	if (o >= len)
		return -ENAMETOOLONG;
	buf[o] = '\0';
	return (int)o;
}

int s3_encode_path(const char *key, char *buf, size_t len)
{
	return encode(key, true, buf, len);
}

int s3_encode_query(const char *val, char *buf, size_t len)
{
	return encode(val, false, buf, len);
}

int s3_key_join(const struct s3_loc *loc, const char *rel, char *buf, size_t len, char *err,
		size_t errlen)
{
	int n = loc->prefix[0] ? snprintf(buf, len, "%s/%s", loc->prefix, rel) :
				 snprintf(buf, len, "%s", rel);

	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return s3_key_check(buf, err, errlen);
}

/* scheme://host[:port] with nothing after it; host of [A-Za-z0-9.-] or a
 * bracketed IPv6 literal. */
static int endpoint_split(const char *ep, size_t *scheme_len, size_t *total, char *err,
			  size_t errlen)
{
	size_t n = strlen(ep), s;
	const char *h;

	if (!strncmp(ep, "https://", 8))
		s = 8;
	else if (!strncmp(ep, "http://", 7))
		s = 7;
	else {
		snprintf(err, errlen, "endpoint '%s' must start with http:// or https://", ep);
		return -EINVAL;
	}
	if (n > s && ep[n - 1] == '/')
		n--;
	if (n == s) {
		snprintf(err, errlen, "endpoint '%s' has no host", ep);
		return -EINVAL;
	}
	h = ep + s;
	for (size_t i = 0; i < n - s; i++) {
		char c = h[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '-' || c == ':' || c == '[' || c == ']')) {
			snprintf(err, errlen,
				 "endpoint '%s': only scheme://host[:port] is accepted (no path, "
				 "query or user)", ep);
			return -EINVAL;
		}
	}
	*scheme_len = s;
	*total = n;
	return 0;
}

int s3_object_url(const char *endpoint, bool virtual_host, const char *bucket, const char *key,
		  const char *query, char *buf, size_t len, char *err, size_t errlen)
{
	char path[3 * S3_KEY_MAX + 1];
	size_t sl, n;
	int r, w;

	r = endpoint_split(endpoint, &sl, &n, err, errlen);
	if (r < 0)
		return r;
	r = s3_encode_path(key, path, sizeof(path));
	if (r < 0)
		return r;
	if (virtual_host) {
		if (strchr(bucket, '.') && sl == 8) {
			snprintf(err, errlen,
				 "bucket '%s' has a '.': its virtual-host name does not match the "
				 "server's TLS certificate; use path-style addressing", bucket);
			return -EINVAL;
		}
		w = snprintf(buf, len, "%.*s%s.%.*s/%s%s%s", (int)sl, endpoint, bucket,
			     (int)(n - sl), endpoint + sl, path, query && *query ? "?" : "",
			     query ? query : "");
	} else {
		w = snprintf(buf, len, "%.*s/%s%s%s%s%s", (int)n, endpoint, bucket, *key ? "/" : "",
			     path, query && *query ? "?" : "", query ? query : "");
	}
	return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : 0;
}
