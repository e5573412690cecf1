/* SPDX-License-Identifier: MIT */
/*
 * dataloader.c - the data-loader table (ckpt_dl_*, ckpt_save_add_dl_table).
 *
 * The deal itself is format/dlstate.c (pure, shared with its unit tests);
 * this file reads the table and its saved blocks out of a checkpoint and
 * hands a rank its rows.  The saved blocks are the table's chunks: every DP
 * rank writes its block, even an empty one, so the chunks sorted by first
 * row (an empty block before a non-empty one starting at the same row) are
 * the saved DP ranks in order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/internal.h"
#include "format/dlstate.h"

_Static_assert(CKPT_DL_COL_ID == DL_COL_ID && CKPT_DL_COL_CURSOR == DL_COL_CURSOR &&
		       CKPT_DL_COL_DONE == DL_COL_DONE && CKPT_DL_MIN_COLS == DL_MIN_COLS &&
		       CKPT_DL_MAX_COLS == DL_MAX_COLS,
	       "the public and internal table layouts agree");

int ckpt_dl_first(uint64_t n_shards, uint32_t dp_world, uint32_t dp_rank, int64_t **ret_ids,
		  uint64_t *ret_n, uint64_t *ret_row0)
{
	char err[256] = "";
	int r;

	if (!ret_ids || !ret_n || !ret_row0) {
		cli_set_error("ckpt_dl_first: NULL argument");
		return -EINVAL;
	}
	r = dl_first(n_shards, dp_world, dp_rank, ret_ids, ret_n, ret_row0, err, sizeof(err));
	if (r)
		cli_set_error("ckpt_dl_first: %s", err[0] ? err : strerror(-r));
	return r;
}

int ckpt_save_add_dl_table(struct ckpt_save *save, const char *name, const int64_t *rows,
			   uint64_t n, uint32_t k, uint64_t row0, uint64_t n_shards,
			   uint32_t replica)
{
	uint64_t shape[2] = { n, k }, gshape[2] = { n_shards, k }, offs[2] = { row0, 0 };
	/* An empty block still needs a pointer the save accepts. */
	static const int64_t none;
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .dtype = CKPT_I64, .name = name,
				 .shape = shape, .data = n ? (const void *)rows : &none,
				 .global_shape = gshape, .offsets = offs, .ndim = 2,
				 .replica = replica };

	if (k < CKPT_DL_MIN_COLS || k > CKPT_DL_MAX_COLS) {
		cli_set_error("ckpt_save_add_dl_table: '%s': %u columns (%d..%d)",
			      name ? name : "(null)", k, CKPT_DL_MIN_COLS, CKPT_DL_MAX_COLS);
		return -EINVAL;
	}
	return ckpt_save_add_tensor(save, &t);
}

struct block {
	uint64_t first, rows;
};

static int by_block(const void *pa, const void *pb)
{
	const struct block *a = pa, *b = pb;

	if (a->first != b->first)
		return a->first < b->first ? -1 : 1;
	return a->rows < b->rows ? -1 : a->rows > b->rows;
}

int ckpt_dl_restore(struct ckpt_reader *reader, const char *name, uint32_t dp_world,
		    uint32_t dp_rank, int64_t **ret_rows, uint64_t *ret_n, uint32_t *ret_k,
		    uint64_t *ret_row0, bool *ret_same_topology)
{
	static const char fn[] = "ckpt_dl_restore";
	const struct manifest_tensor *t;
	struct block *blk = NULL;
	uint64_t *bounds = NULL, *idx = NULL, n_rows, n = 0, row0 = 0;
	int64_t *table = NULL, *out = NULL;
	char err[512] = "";
	uint32_t k;
	int r;

	if (!reader || !name || !ret_rows || !ret_n || !ret_k || !ret_row0 || !ret_same_topology) {
		cli_set_error("%s: NULL argument", fn);
		return -EINVAL;
	}
	t = manifest_find(&reader->m, ITEM_TENSOR, name);
	if (!t) {
		cli_set_error("%s: the checkpoint has no data-loader table '%s'", fn, name);
		return -ENOENT;
	}
	if (t->dtype != CKPT_I64 || t->ndim != 2 || t->shape[1] < CKPT_DL_MIN_COLS ||
	    t->shape[1] > CKPT_DL_MAX_COLS || t->n_chunks == 0 || t->n_chunks > DL_MAX_WORLD) {
		cli_set_error("%s: '%s' is not a data-loader table (an I64 tensor [n, %d..%d] "
			      "saved by 1..%u ranks)", fn, name, CKPT_DL_MIN_COLS, CKPT_DL_MAX_COLS,
			      DL_MAX_WORLD);
		return -EBADMSG;
	}
	n_rows = t->shape[0];
	k = (uint32_t)t->shape[1];
	if (n_rows > DL_MAX_ROWS) {
		cli_set_error("%s: '%s' has %llu rows (at most %llu)", fn, name,
			      (unsigned long long)n_rows, (unsigned long long)DL_MAX_ROWS);
		return -E2BIG;
	}
	blk = malloc(t->n_chunks * sizeof(*blk));
	bounds = malloc((t->n_chunks + 1) * sizeof(*bounds));
	table = malloc(n_rows * k * sizeof(int64_t) + 1);
	if (!blk || !bounds || !table)
		goto nomem;
	for (size_t c = 0; c < t->n_chunks; c++) {
		const struct manifest_chunk *ch = &t->chunks[c];
		if (ch->offsets[1] != 0 || ch->shape[1] != k) {
			cli_set_error("%s: '%s': chunk %zu is not a block of whole rows", fn, name, c);
			r = -EBADMSG;
			goto out;
		}
		blk[c] = (struct block){ ch->offsets[0], ch->shape[0] };
	}
	qsort(blk, t->n_chunks, sizeof(*blk), by_block);
	bounds[0] = 0;
	for (size_t c = 0; c < t->n_chunks; c++) {
		if (blk[c].first != bounds[c]) {
			cli_set_error("%s: '%s': the saved blocks do not follow each other at row "
				      "%llu", fn, name, (unsigned long long)bounds[c]);
			r = -EBADMSG;
			goto out;
		}
		bounds[c + 1] = blk[c].first + blk[c].rows;
	}
	r = ckpt_reader_read_tensor(reader, name, table, n_rows * k * sizeof(int64_t));
	if (r)
		goto out; /* the reader's message stands */
	struct dl_saved sv = { .table = table, .n_rows = n_rows, .k = k,
			       .n_saved = (uint32_t)t->n_chunks, .bounds = bounds };
	r = dl_assign(&sv, dp_world, dp_rank, &idx, &n, &row0, err, sizeof(err));
	if (r) {
		cli_set_error("%s: '%s': %s", fn, name, err);
		goto out;
	}
	out = malloc(n * k * sizeof(int64_t) + 1);
	if (!out)
		goto nomem;
	for (uint64_t i = 0; i < n; i++)
		memcpy(out + i * k, table + idx[i] * k, k * sizeof(int64_t));
	*ret_rows = out;
	*ret_n = n;
	*ret_k = k;
	*ret_row0 = row0;
	*ret_same_topology = t->n_chunks == dp_world;
	out = NULL;
	r = 0;
	goto out;
nomem:
	cli_set_error("%s: out of memory", fn);
	r = -ENOMEM;
out:
	free(out);
	free(idx);
	free(table);
	free(bounds);
	free(blk);
	return r;
}
