/* SPDX-License-Identifier: MIT */
/*
 * s3_parts.h - how a shard file is cut into the parts of a multipart
 * upload.
 *
 * S3's rules: at most 10,000 parts; every part but the last between 5 MiB
 * and 5 GiB; an object of at most 5 TiB.  Ours: a part is a whole number of
 * arena extents (the unit), so that it is sent straight from the extents
 * that hold it, and at least the size asked for in the config.  A file no
 * larger than one part goes up as one PUT.
 */
#ifndef CKPT_STORE_S3_PARTS_H
#define CKPT_STORE_S3_PARTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define S3_MAX_PARTS 10000u
#define S3_MIN_PART (5ull << 20)
#define S3_MAX_PART (5ull << 30)
#define S3_MAX_OBJECT (5ull << 40)

struct s3_plan {
	uint64_t size;       /* of the file */
	uint64_t part_bytes; /* every part but the last */
	uint32_t n_parts;    /* 1 for a single PUT */
	bool single;         /* one PUT, no multipart upload */
};

/*
 * Plans the upload of `size` bytes in parts that are multiples of `unit`
 * (a power of two, the arena's extent size) and at least `want` bytes.
 * Returns 0 and *ret, or -EFBIG with the reason in err (larger than S3
 * takes, or parts that would pass 5 GiB).
 */
int s3_part_plan(uint64_t size, uint64_t unit, uint64_t want, struct s3_plan *ret, char *err,
		 size_t errlen);

/* Part i's (0-based) offset and length in the file. */
void s3_part_range(const struct s3_plan *p, uint32_t i, uint64_t *ret_off, uint64_t *ret_len);

/* The part (0-based) holding file offset off (< size). */
uint32_t s3_part_of(const struct s3_plan *p, uint64_t off);

#endif
