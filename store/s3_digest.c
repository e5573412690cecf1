/* SPDX-License-Identifier: MIT */
/*
 * s3_digest.c - base64 and MD5 for S3 request headers (s3_digest.h).
 *
 * MD5 follows RFC 1321: 64-byte blocks, four rounds of sixteen steps, each
 * step adding a round function of three state words, a constant from the
 * sine table and a message word, rotating, and adding the next state word.
 * The message is padded with 0x80, zeros, and its bit length (64 bits,
 * little-endian) to a whole number of blocks.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/crc32c.h"
#include "store/s3_digest.h"
#include "store/s3_xml.h"

void s3_b64(const uint8_t *in, size_t n, char *out)
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;

	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;
		size_t left = n - i;

		if (left > 1)
			v |= (uint32_t)in[i + 1] << 8;
		if (left > 2)
			v |= in[i + 2];
		out[o++] = tab[(v >> 18) & 63];
		out[o++] = tab[(v >> 12) & 63];
		out[o++] = left > 1 ? tab[(v >> 6) & 63] : '=';
		out[o++] = left > 2 ? tab[v & 63] : '=';
	}
	out[o] = '\0';
}

/* Per-step left rotations, by round (each round repeats its four). */
static const uint8_t rot[4][4] = {
	{ 7, 12, 17, 22 }, { 5, 9, 14, 20 }, { 4, 11, 16, 23 }, { 6, 10, 15, 21 }
};

/* floor(2^32 * |sin(i + 1)|), i = 0..63 (RFC 1321, section 3.4). */
static const uint32_t sine[64] = {
	0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
	0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
	0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
	0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
	0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
	0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
	0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
	0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
	0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
	0xeb86d391,
};

static void md5_block(uint32_t st[4], const uint8_t *p)
{
	uint32_t w[16], a = st[0], b = st[1], c = st[2], d = st[3];

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
		       (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
	for (int i = 0; i < 64; i++) {
		int round = i / 16;
		uint32_t f;
		int g;

		switch (round) {
		case 0: f = (b & c) | (~b & d); g = i; break;
		case 1: f = (d & b) | (~d & c); g = (5 * i + 1) % 16; break;
		case 2: f = b ^ c ^ d; g = (3 * i + 5) % 16; break;
		default: f = c ^ (b | ~d); g = (7 * i) % 16; break;
		}
		uint32_t t = a + f + sine[i] + w[g];
		unsigned s = rot[round][i % 4];

		a = d;
		d = c;
		c = b;
		b += (t << s) | (t >> (32 - s));
	}
	st[0] += a;
	st[1] += b;
	st[2] += c;
	st[3] += d;
}

void s3_md5(const void *data, size_t len, uint8_t out[16])
{
	uint32_t st[4] = { 0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476 };
	const uint8_t *p = data;
	uint8_t tail[128];
	size_t full = len & ~(size_t)63, rest = len - full, tlen;
	uint64_t bits = (uint64_t)len * 8;

	for (size_t off = 0; off < full; off += 64)
		md5_block(st, p + off);
	memset(tail, 0, sizeof(tail));
	if (rest)
		memcpy(tail, p + full, rest);
	tail[rest] = 0x80;
	tlen = rest < 56 ? 64 : 128;
	for (int i = 0; i < 8; i++)
		tail[tlen - 8 + i] = (uint8_t)(bits >> (8 * i));
	md5_block(st, tail);
	if (tlen == 128)
		md5_block(st, tail + 64);
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 4; j++)
			out[4 * i + j] = (uint8_t)(st[i] >> (8 * j));
}

void s3_content_md5_hdr(const void *data, size_t len, char *hdr, size_t hdrlen)
{
	uint8_t md[16];
	char b64[25];

	s3_md5(data, len, md);
	s3_b64(md, sizeof(md), b64);
	snprintf(hdr, hdrlen, "Content-MD5: %s", b64);
}

int s3_sum_check(const void *body, size_t len, const char *sum, const char *s3sum, char *why,
		 size_t whylen)
{
	char got[9];
	const char *bad = NULL, *badname = NULL;

	if (s3sum && strchr(s3sum, '-'))
		s3sum = NULL; /* a multipart object's: not of these bytes */
	if (!sum && !s3sum)
		return 0;
	s3_crc32c_b64(crc32c(len ? body : "", len, 0), got);
	if (sum && strcmp(sum, got)) {
		bad = sum;
		badname = S3_SUM_HEADER;
	} else if (s3sum && strcmp(s3sum, got)) {
		bad = s3sum;
		badname = S3_CRC32C_HEADER;
	}
	if (!bad)
		return 1;
	snprintf(why, whylen, "checksum mismatch: the %zu bytes received have CRC32C %s, the "
			      "object's %s is '%.16s'", len, got, badname, bad);
	return -EBADMSG;
}
