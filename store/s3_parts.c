/* SPDX-License-Identifier: MIT */
/* s3_parts.c - cutting a file into multipart-upload parts (s3_parts.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "store/s3_parts.h"

static uint64_t round_up(uint64_t v, uint64_t unit)
{
	return (v + unit - 1) / unit * unit;
}

int s3_part_plan(uint64_t size, uint64_t unit, uint64_t want, struct s3_plan *ret, char *err,
		 size_t errlen)
{
	uint64_t part;

	if (unit == 0 || (unit & (unit - 1))) {
		snprintf(err, errlen, "internal error: part unit %" PRIu64 " is not a power of two",
			 unit);
		return -EINVAL;
	}
	if (size > S3_MAX_OBJECT) {
		snprintf(err, errlen,
			 "a shard of %" PRIu64 " bytes is larger than S3's largest object (5 TiB)",
			 size);
		return -EFBIG;
	}
	part = want > S3_MIN_PART ? want : S3_MIN_PART;
	if (part < (size + S3_MAX_PARTS - 1) / S3_MAX_PARTS)
		part = (size + S3_MAX_PARTS - 1) / S3_MAX_PARTS;
	part = round_up(part, unit);
	if (part > S3_MAX_PART) {
		snprintf(err, errlen,
			 "a shard of %" PRIu64 " bytes would need parts of %" PRIu64
			 " bytes, more than S3's 5 GiB", size, part);
		return -EFBIG;
	}
	ret->size = size;
	ret->part_bytes = part;
	ret->single = size <= part;
	ret->n_parts = ret->single ? 1 : (uint32_t)((size + part - 1) / part);
	return 0;
}

void s3_part_range(const struct s3_plan *p, uint32_t i, uint64_t *ret_off, uint64_t *ret_len)
{
	uint64_t off = (uint64_t)i * p->part_bytes;

	*ret_off = off;
	*ret_len = p->size - off < p->part_bytes ? p->size - off : p->part_bytes;
}

uint32_t s3_part_of(const struct s3_plan *p, uint64_t off)
{
	return (uint32_t)(off / p->part_bytes);
}
