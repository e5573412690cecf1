/* SPDX-License-Identifier: MIT */
/*
 * s3_digest.h - the digests S3 checks on request bodies, in the form its
 * headers carry them: base64 (RFC 4648, with padding) and MD5 (RFC 1321,
 * for Content-MD5 on requests that take no x-amz-checksum-*: a
 * CompleteMultipartUpload's body, whose x-amz-checksum-* would describe
 * the object instead).  MD5 here is an integrity check against bytes
 * damaged in transit, not a defence against anyone.
 */
#ifndef CKPT_STORE_S3_DIGEST_H
#define CKPT_STORE_S3_DIGEST_H

#include <stddef.h>
#include <stdint.h>

/* Base64 of n bytes into out (4 * ((n + 2) / 3) + 1 bytes, NUL-ended). */
void s3_b64(const uint8_t *in, size_t n, char *out);

void s3_md5(const void *data, size_t len, uint8_t out[16]);

/* "Content-MD5: <base64>" of a body, into hdr (at least 40 bytes). */
void s3_content_md5_hdr(const void *data, size_t len, char *hdr, size_t hdrlen);

/*
 * The checksum ckptd stores with every small object it PUTs (attempt files,
 * indexes, claims, markers, manifests, tombstones, pins, leases): the
 * CRC32C of the body in x-amz-checksum-crc32c's form, as user metadata.
 * S3 returns user metadata with every GET and HEAD, unasked, and so do moto
 * and the S3-compatible stores; S3's own checksum comes back only on a GET
 * that asks for it (x-amz-checksum-mode: ENABLED), and moto 5.2.5 returns
 * it only when the PUT also said x-amz-sdk-checksum-algorithm.  So ours is
 * the one every store keeps, and S3's, where it comes, is checked as well.
 */
#define S3_SUM_HEADER "x-amz-meta-ckpt-crc32c"
#define S3_CRC32C_HEADER "x-amz-checksum-crc32c"

/*
 * Checks the body of a GET of a whole object against the checksums its
 * answer carried: `sum`, the value of S3_SUM_HEADER, and `s3sum`, S3's
 * x-amz-checksum-crc32c; NULL where the answer had none.  S3's value for
 * an object uploaded in parts ("<base64>-<parts>") is a checksum of the
 * parts' checksums, not of the bytes, and is left out.  Returns 1 if every
 * checksum there matches (and there was one), 0 if there was none, or
 * -EBADMSG with why ("checksum mismatch: ...") if one does not.
 */
int s3_sum_check(const void *body, size_t len, const char *sum, const char *s3sum, char *why,
		 size_t whylen);

#endif
