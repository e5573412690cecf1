/* SPDX-License-Identifier: MIT */
/* crc32c.h - CRC32C (Castagnoli), hardware accelerated through ISA-L. */
#ifndef CKPT_FORMAT_CRC32C_H
#define CKPT_FORMAT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * Returns the standard CRC32C of `len` bytes appended to data whose CRC32C is
 * `prev` (0 for no prior data): crc32c(buf, len, crc32c(a, n, 0)) equals the
 * CRC32C of a followed by buf.  crc32c("123456789", 9, 0) == 0xE3069283.
 * Any length, including more than INT_MAX.
 */
uint32_t crc32c(const void *buf, size_t len, uint32_t prev);

/*
 * The CRC32C of A followed by B, from crc_a = CRC32C(A), crc_b = CRC32C(B)
 * and B's length alone, without B's bytes: a part's checksum can be built
 * from the checksums of its pieces.  Costs O(log len_b) small steps.
 */
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif
