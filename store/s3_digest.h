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

#endif
