/* SPDX-License-Identifier: MIT */
/* layout.c - building and placing a shard file's layout (see layout.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/errmsg.h"
#include "format/grow.h"
#include "format/layout.h"
#include "format/names.h"

/* Name pool blocks start small and double up to this size, so a save with a
 * handful of items stays small and one with a million makes ~50 blocks. */
#define POOL_FIRST_BLOCK (16u << 10)
#define POOL_MAX_BLOCK   (1u << 20)

#define fail(err, errlen, ...) errmsg_set((err), (errlen), -EINVAL, __VA_ARGS__)

uint32_t layout_crc_count(uint64_t begin, uint64_t end)
{
	if (end <= begin)
		return 0;
	return (uint32_t)((end - 1) / LAYOUT_CRC_BLOCK - begin / LAYOUT_CRC_BLOCK + 1);
}

int layout_init(struct layout *l, const char *root, const char *name, uint64_t step)
{
	memset(l, 0, sizeof(*l));
	/* Callers validate names first (name_checkpoint_ok); one that does not
	 * fit the fixed buffer is refused rather than cut. */
	if (!name || strlen(name) > CKPT_MAX_NAME_LEN)
		return -EINVAL;
	strcpy(l->name, name);
	l->root = strdup(root ? root : "");
	l->meta = json_object();
	l->metrics = json_object();
	if (!l->root || !l->meta || !l->metrics) {
		layout_free(l);
		return -ENOMEM;
	}
	l->step = step;
	return 0;
}

void layout_free(struct layout *l)
{
	if (!l)
		return;
	free(l->root);
	json_decref(l->meta);
	json_decref(l->metrics);
	free(l->items);
	free(l->dims);
	for (size_t i = 0; i < l->n_blocks; i++)
		free(l->blocks[i]);
	free(l->blocks);
	memset(l, 0, sizeof(*l));
}

/* Copies a string into the pool.  Blocks never move, so item names stay
 * valid for the layout's lifetime. */
static char *pool_strdup(struct layout *l, const char *s, size_t n)
{
	char *dst;

	if (l->n_blocks == 0 || l->block_cap - l->block_used < n + 1) {
		size_t cap = l->block_cap ? l->block_cap * 2 : POOL_FIRST_BLOCK;
		char *blk;

		if (cap > POOL_MAX_BLOCK)
			cap = POOL_MAX_BLOCK;
		if (cap < n + 1)
			cap = n + 1;
		/* The block array doubles whenever its count reaches a power
		 * of two (it has no capacity field of its own). */
		if ((l->n_blocks & (l->n_blocks - 1)) == 0) {
			size_t want = l->n_blocks ? l->n_blocks * 2 : 4;
			char **b = realloc(l->blocks, want * sizeof(*b));

			if (!b)
				return NULL;
			l->blocks = b;
		}
		blk = malloc(cap);
		if (!blk)
			return NULL;
		l->blocks[l->n_blocks++] = blk;
		l->block_cap = cap;
		l->block_used = 0;
	}
	dst = l->blocks[l->n_blocks - 1] + l->block_used;
	memcpy(dst, s, n);
	dst[n] = '\0';
	l->block_used += n + 1;
	return dst;
}

int layout_add(struct layout *l, enum item_kind kind, const char *name, enum ckpt_dtype dtype,
	       unsigned ndim, const uint64_t *shape, const uint64_t *gshape, const uint64_t *offs,
	       char *err, size_t errlen)
{
	size_t esize = ckpt_dtype_size(dtype);
	uint64_t vol = 1, gvol = 1;
	struct layout_item *it;
	uint64_t *d;
	bool sharded = false;
	char *pname;

	if (kind != ITEM_TENSOR && kind != ITEM_BLOB)
		return fail(err, errlen, "unknown item kind %d", (int)kind);
	if (!name_item_ok(name, err, errlen))
		return -EINVAL;
	if (esize == 0)
		return fail(err, errlen, "'%s': unknown dtype %d", name, (int)dtype);
	if (ndim > CKPT_MAX_NDIM)
		return fail(err, errlen, "'%s': %u dimensions (at most %d)", name, ndim, CKPT_MAX_NDIM);
	if (ndim && !shape)
		return fail(err, errlen, "'%s': no shape", name);
	if (!gshape != !offs)
		return fail(err, errlen, "'%s': global shape and offsets go together", name);
	if (kind == ITEM_BLOB && (dtype != CKPT_U8 || ndim != 1 || gshape))
		return fail(err, errlen, "blob '%s' must be a 1-D U8 array, not sharded", name);
	if (l->n_items >= CKPT_MAX_ITEMS)
		return -E2BIG;

	for (unsigned i = 0; i < ndim; i++) {
		if (__builtin_mul_overflow(vol, shape[i], &vol))
			return fail(err, errlen, "'%s': element count overflows", name);
		if (!gshape)
			continue;
		if (offs[i] > gshape[i] || shape[i] > gshape[i] - offs[i])
			return fail(err, errlen,
				    "'%s': dimension %u: offset %llu + size %llu exceeds the global size %llu",
				    name, i, (unsigned long long)offs[i], (unsigned long long)shape[i],
				    (unsigned long long)gshape[i]);
		if (offs[i] != 0 || shape[i] != gshape[i])
			sharded = true;
		if (__builtin_mul_overflow(gvol, gshape[i], &gvol))
			return fail(err, errlen, "'%s': global element count overflows", name);
	}
	if (__builtin_mul_overflow(vol, (uint64_t)esize, &vol) ||
	    __builtin_mul_overflow(gvol, (uint64_t)esize, &gvol) || vol > INT64_MAX ||
	    gvol > INT64_MAX)
		return fail(err, errlen, "'%s': byte size overflows", name);

	/* Reserve everything before changing anything, so a failure leaves
	 * the layout as it was. */
	if (grow_array((void **)&l->items, &l->cap_items, l->n_items + 1, sizeof(*l->items)) ||
	    grow_array((void **)&l->dims, &l->cap_dims, l->n_dims + 3u * ndim, sizeof(*l->dims)))
		return -ENOMEM;
	pname = pool_strdup(l, name, strlen(name));
	if (!pname)
		return -ENOMEM;

	d = l->dims + l->n_dims;
	for (unsigned i = 0; i < ndim; i++) {
		d[i] = shape[i];
		d[ndim + i] = gshape ? gshape[i] : shape[i];
		d[2 * ndim + i] = offs ? offs[i] : 0;
	}
	it = &l->items[l->n_items++];
	*it = (struct layout_item){
		.name = pname,
		.kind = (uint8_t)kind,
		.dtype = (uint8_t)dtype,
		.ndim = (uint8_t)ndim,
		.sharded = sharded,
		.dims = (uint32_t)l->n_dims,
	};
	l->n_dims += 3u * ndim;
	return 0;
}

uint64_t layout_item_bytes(const struct layout *l, const struct layout_item *it)
{
	const uint64_t *shape = layout_shape(l, it);
	uint64_t n = ckpt_dtype_size(it->dtype);

	/* layout_add() and desc_parse() checked that this does not overflow. */
	for (unsigned i = 0; i < it->ndim; i++)
		n *= shape[i];
	return n;
}

int layout_pack(struct layout *l)
{
	uint64_t pos = 0;

	for (size_t i = 0; i < l->n_items; i++)
		if (__builtin_add_overflow(pos, layout_item_bytes(l, &l->items[i]), &pos) ||
		    pos > INT64_MAX)
			return -EOVERFLOW;
	pos = 0;
	for (size_t i = 0; i < l->n_items; i++) {
		struct layout_item *it = &l->items[i];

		it->begin = pos;
		pos += layout_item_bytes(l, it);
		it->end = pos;
		it->crc0 = 0;
	}
	l->data_start = 0;
	l->file_size = 0;
	l->n_crcs = 0;
	return 0;
}

/*
 * Also used by desc_parse() on a layout that is already placed (with its
 * own data_start as header length - 8): begin/end are moved from the old
 * data_start to the new one, which is a no-op then, and the CRC indexes are
 * recomputed.
 */
int layout_place(struct layout *l, size_t header_json_len)
{
	uint64_t old = l->data_start, ds, data_bytes = 0, crcs = 0;

	if (header_json_len > LAYOUT_MAX_HEADER)
		return -EOVERFLOW;
	ds = ((uint64_t)header_json_len + 8 + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
	if (l->n_items)
		data_bytes = l->items[l->n_items - 1].end - old;
	if (data_bytes > INT64_MAX - ds)
		return -EOVERFLOW;
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		uint64_t b = it->begin - old + ds, e = it->end - old + ds;

		/* The count is computed in 64 bits: a u32 count could wrap. */
		if (e > b)
			crcs += (e - 1) / LAYOUT_CRC_BLOCK - b / LAYOUT_CRC_BLOCK + 1;
		if (crcs > UINT32_MAX)
			return -EOVERFLOW;
	}
	crcs = 0;
	for (size_t i = 0; i < l->n_items; i++) {
		struct layout_item *it = &l->items[i];

		it->begin = it->begin - old + ds;
		it->end = it->end - old + ds;
		it->crc0 = (uint32_t)crcs;
		crcs += layout_crc_count(it->begin, it->end);
	}
	l->data_start = ds;
	l->file_size = ds + data_bytes;
	l->n_crcs = (uint32_t)crcs;
	return 0;
}

size_t layout_find(const struct layout *l, uint64_t off)
{
	size_t lo = 0, hi = l->n_items;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (l->items[mid].end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}
