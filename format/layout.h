/* SPDX-License-Identifier: MIT */
/*
 * layout.h - the file image of one rank's shard, shared by client and daemon.
 *
 * A shard file is a safetensors file:
 *
 *   [0, 8)                 little-endian u64 n = data_start - 8
 *   [8, 8 + json_len)      the JSON header
 *   [8 + json_len, data_start)  spaces, so data starts on a 4 KiB boundary
 *   [data_start, file_size)     item bytes, packed back to back with no gap
 *                               (safetensors forbids holes), in item order
 *
 * Item byte ranges (begin, end) here are ABSOLUTE file offsets; the
 * safetensors header stores them relative to data_start, as the format says.
 *
 * Integrity: CRC32C is kept per "piece".  The file is cut on a fixed grid of
 * LAYOUT_CRC_BLOCK bytes (absolute offsets 0, B, 2B, ...); the pieces of an
 * item are its byte range cut at those grid lines.  An item of n bytes has
 * layout_crc_count() pieces.  Because staging extents are whole multiples of
 * the grid, every piece lies inside one extent and the daemon can checksum
 * extents independently and in any order.
 *
 * The client builds a layout (layout_add_*, layout_place); it travels to the
 * daemon as a descriptor (desc.h), which validates it with the same rules.
 */
#ifndef CKPT_FORMAT_LAYOUT_H
#define CKPT_FORMAT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define LAYOUT_ALIGN     4096u          /* data_start and O_DIRECT alignment */
#define LAYOUT_CRC_BLOCK (1u << 20)     /* CRC piece grid, bytes */
#define LAYOUT_MAX_HEADER (256u << 20)  /* cap on the safetensors JSON header */

enum item_kind {
	ITEM_TENSOR = 0,
	ITEM_BLOB = 1, /* stored as a 1-D U8 tensor in the shard file */
};

struct layout_item {
	char *name;        /* owned by the layout's string pool */
	uint8_t kind;      /* enum item_kind */
	uint8_t dtype;     /* enum ckpt_dtype; CKPT_U8 for blobs */
	uint8_t ndim;      /* 1 for blobs */
	bool sharded;      /* gshape/offs differ from a whole tensor */
	uint32_t dims;     /* index into layout.dims: shape[ndim], gshape[ndim], offs[ndim] */
	uint64_t begin;    /* absolute file offset of the first byte */
	uint64_t end;      /* one past the last byte; end - begin = nbytes */
	uint32_t crc0;     /* index of this item's first CRC in the crc array */
};

struct layout {
	/* Save-wide fields (the descriptor's header). */
	char name[CKPT_MAX_NAME_LEN + 1];
	char *root;             /* owned */
	uint64_t step;
	uint64_t file_size;     /* 0 until placed */
	uint64_t data_start;    /* 0 until placed */
	void *meta;             /* json_t object: string values; owned */
	void *metrics;          /* json_t object: real values; owned */

	struct layout_item *items;
	size_t n_items, cap_items;
	uint64_t *dims;         /* 3 * ndim entries per item */
	size_t n_dims, cap_dims;
	uint32_t n_crcs;        /* total CRC pieces, set by layout_place / desc_parse */

	/* private: string pool */
	char **blocks;
	size_t n_blocks;
	size_t block_used, block_cap;
};

/* Inline accessors for an item's dims. */
static inline uint64_t *layout_shape(const struct layout *l, const struct layout_item *it)
{
	return l->dims + it->dims;
}
static inline uint64_t *layout_gshape(const struct layout *l, const struct layout_item *it)
{
	return l->dims + it->dims + it->ndim;
}
static inline uint64_t *layout_offs(const struct layout *l, const struct layout_item *it)
{
	return l->dims + it->dims + 2u * it->ndim;
}

/* Number of CRC pieces of the byte range [begin, end) on the grid. */
uint32_t layout_crc_count(uint64_t begin, uint64_t end);

/* Initialises an empty layout.  Returns 0 or -ENOMEM. */
int layout_init(struct layout *l, const char *root, const char *name, uint64_t step);
/* Frees everything a layout owns.  Accepts a zeroed or half-built layout. */
void layout_free(struct layout *l);

/*
 * Appends a tensor (kind ITEM_TENSOR) or blob (ITEM_BLOB, dtype U8, ndim 1,
 * shape {len}).  gshape/offs NULL: not sharded (gshape = shape, offs = 0).
 * Validates: name (names.h), dtype, ndim, offs + shape <= gshape per dim,
 * the byte size does not overflow.  Does NOT check name uniqueness (the
 * caller keeps a set; desc_parse checks it).  begin/end stay 0 until
 * layout_place().
 *
 * Returns 0, -EINVAL (with a reason in err), -E2BIG (too many items), -ENOMEM.
 */
int layout_add(struct layout *l, enum item_kind kind, const char *name, enum ckpt_dtype dtype,
	       unsigned ndim, const uint64_t *shape, const uint64_t *gshape, const uint64_t *offs,
	       char *err, size_t errlen);

/* Index of the first item whose byte range ends after file offset `off`
 * (n_items if none).  Items are packed in order, so begin and end both grow
 * with the index: a binary search. */
size_t layout_find(const struct layout *l, uint64_t off);

/* Byte size of an item's chunk (product of shape * dtype size). */
uint64_t layout_item_bytes(const struct layout *l, const struct layout_item *it);

/*
 * Two steps, because the header holds offsets relative to data_start and
 * data_start depends on the header's length:
 *
 * layout_pack() sets data_start = 0 and packs the items back to back:
 * begin/end are then offsets relative to the data section.  The caller
 * builds the safetensors header (st_header_json(), which always writes
 * begin - data_start) and passes its length to layout_place(), which sets
 * data_start = round_up(8 + header_json_len, LAYOUT_ALIGN), shifts every
 * begin/end by it, and sets crc0, n_crcs and file_size.
 *
 * Return 0 or -EOVERFLOW.
 */
int layout_pack(struct layout *l);
int layout_place(struct layout *l, size_t header_json_len);

#endif
