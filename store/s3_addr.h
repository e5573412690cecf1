/* SPDX-License-Identifier: MIT */
/*
 * s3_addr.h - where an S3 object is, and how its name goes on the wire.
 *
 * A root `s3://bucket/prefix` names a bucket and a key prefix; every object
 * of a checkpoint is `prefix/name/file`.  Requests are signed by libcurl
 * 7.88 (CURLOPT_AWS_SIGV4), which signs the path and query exactly as they
 * are written: so keys are percent-encoded here, by S3's rules (RFC 3986
 * unreserved characters and '/' stay, everything else is %XX in uppercase
 * hex), and query parameters are written already sorted and encoded
 * ('/' too).  A key with a "." or ".." segment is refused: curl would
 * collapse it, and the signature would then be over another path.
 */
#ifndef CKPT_STORE_S3_ADDR_H
#define CKPT_STORE_S3_ADDR_H

#include <stdbool.h>
#include <stddef.h>

/* S3's own limits. */
#define S3_BUCKET_MAX 63
#define S3_KEY_MAX 1024 /* bytes of UTF-8 */
/* What a root's prefix may take, leaving room for a checkpoint's names
 * ("/" name "/" work-area and file names) within S3_KEY_MAX. */
#define S3_PREFIX_MAX 512

struct s3_loc {
	char bucket[S3_BUCKET_MAX + 1];
	char prefix[S3_PREFIX_MAX + 1]; /* "" or "a/b": no leading or trailing '/' */
};

/* True if url starts with "s3://" (whether or not it is valid). */
bool s3_is_url(const char *url);

/*
 * Parses "s3://bucket" or "s3://bucket/prefix[/]".  The bucket follows S3's
 * naming rules (3..63 of [a-z0-9.-], starting and ending with a letter or
 * digit, no "..", not an IPv4 address); the prefix is at most S3_PREFIX_MAX
 * bytes of printable ASCII without empty, "." or ".." segments.  Returns 0
 * and *ret, or -EINVAL with the reason in err.
 */
int s3_url_parse(const char *url, struct s3_loc *ret, char *err, size_t errlen);

/* The canonical form "s3://bucket[/prefix]" into buf.  Returns 0 or
 * -ENAMETOOLONG. */
int s3_url_format(const struct s3_loc *loc, char *buf, size_t len);

/*
 * Checks a key: 1..S3_KEY_MAX bytes, no control characters, no empty, "."
 * or ".." segment, no leading '/'.  Returns 0 or -EINVAL (reason in err).
 */
int s3_key_check(const char *key, char *err, size_t errlen);

/* key percent-encoded for a request path ('/' kept).  Returns the length
 * written (without the NUL), or -ENAMETOOLONG if buf is too small. */
int s3_encode_path(const char *key, char *buf, size_t len);

/* A query value percent-encoded ('/' encoded too).  Returns the length, or
 * -ENAMETOOLONG. */
int s3_encode_query(const char *val, char *buf, size_t len);

/* The key of `rel` (a name relative to the root: "ckpt/manifest.json")
 * under loc's prefix.  Returns 0 or -ENAMETOOLONG / -EINVAL (s3_key_check,
 * reason in err). */
int s3_key_join(const struct s3_loc *loc, const char *rel, char *buf, size_t len, char *err,
		size_t errlen);

/*
 * The URL of an object (key "" for the bucket itself) at `endpoint`
 * ("https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:9000"; no path,
 * query or trailing '/'), path-style ("endpoint/bucket/key") or
 * virtual-host style ("scheme://bucket.host/key"), followed by `query`
 * (already encoded and sorted, without '?'; NULL or "" for none).  Returns
 * 0, -ENAMETOOLONG, or -EINVAL for an endpoint it cannot use (reason in
 * err).
 */
int s3_object_url(const char *endpoint, bool virtual_host, const char *bucket, const char *key,
		  const char *query, char *buf, size_t len, char *err, size_t errlen);

#endif
