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

#endif
