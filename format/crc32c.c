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
