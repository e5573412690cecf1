/* SPDX-License-Identifier: MIT */
/* crc32c.c - CRC32C through ISA-L's crc32_iscsi(). */
#include <isa-l/crc.h>

#include "format/crc32c.h"

/*
 * crc32_iscsi() works on the raw register: it neither pre- nor post-inverts.
 * The standard CRC32C inverts both, so the running value is un-inverted on
 * the way in and inverted again on the way out; that makes `prev` the plain
 * CRC32C of the preceding bytes and chaining exact.
 *
 * Its length is an int: feed it at most 1 GiB at a time.
 */
#define CRC_STEP ((size_t)1 << 30)

uint32_t crc32c(const void *buf, size_t len, uint32_t prev)
{
	/* ISA-L takes a non-const pointer but does not write through it. */
	unsigned char *p = (unsigned char *)(uintptr_t)buf;
	uint32_t reg = prev ^ 0xFFFFFFFFu;

	while (len > 0) {
		size_t n = len < CRC_STEP ? len : CRC_STEP;

		reg = crc32_iscsi(p, (int)n, reg);
		p += n;
		len -= n;
	}
	return reg ^ 0xFFFFFFFFu;
}

/*
 * Combining works in GF(2)[x] modulo CRC32C's polynomial, with each value
 * held bit-reversed as the register holds it: bit 31 is x^0, bit 0 is x^31.
 * Appending n bytes to A multiplies A's CRC by x^(8n); the inversions at
 * both ends cancel out (they are the same for any A), so
 * CRC(A || B) = CRC(A) * x^(8 |B|) + CRC(B).
 */
#define CRC32C_POLY_REV 0x82F63B78u

/* a * b mod the polynomial. */
static uint32_t gf2_mulmod(uint32_t a, uint32_t b)
{
	uint32_t prod = 0;

	/* For each power x^i in a (from x^0 up), add b * x^i; b is multiplied
	 * by x as i grows, folding x^32 back in through the polynomial. */
	for (uint32_t bit = 0x80000000u; bit; bit >>= 1) {
		if (a & bit)
			prod ^= b;
		b = (b & 1) ? (b >> 1) ^ CRC32C_POLY_REV : b >> 1;
	}
	return prod;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	uint32_t shift = 0x80000000u; /* x^0 */
	uint32_t sq = 0x00800000u;    /* x^8: one byte */

	/* x^(8 len_b) by squaring: sq runs through x^(8 * 2^k). */
	for (; len_b; len_b >>= 1) {
		if (len_b & 1)
			shift = gf2_mulmod(shift, sq);
		sq = gf2_mulmod(sq, sq);
	}
	return gf2_mulmod(shift, crc_a) ^ crc_b;
}
