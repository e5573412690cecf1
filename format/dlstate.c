/* SPDX-License-Identifier: MIT */
/*
 * dlstate.c - dealing data-loader rows to a new DP world (see dlstate.h).
 *
 * dl_assign() and dl_map() share one core, prepare(): it checks the saved
 * table and sorts its rows into the deal sequence (unfinished by id, then
 * finished by id).  Both then read the answer off that sequence with the
 * same two formulas, block_start() and the t mod M / t div M deal, so the
 * one-rank and all-ranks answers agree by construction.
 *
 * Memory: one allocation per call, of 4 words a row.  The sort uses it as
 * two arrays of (key, row) pairs; the sorted rows are then packed into its
 * first quarter, the rest serves dl_map() as room for the gather list, and
 * the allocation is shrunk to what is returned.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "format/dlstate.h"
#include "format/errmsg.h"

#define TOP (1ull << 63) /* in a sort key: the row is finished */

#define inval(...) errmsg_set(err, errlen, -EINVAL, __VA_ARGS__)
#define bad(...)   errmsg_set(err, errlen, -EBADMSG, __VA_ARGS__)

/* Where new rank d's block starts when n rows are dealt to m ranks: the
 * first n % m ranks hold one row more than the others. */
static uint64_t block_start(uint64_t n, uint32_t m, uint32_t d)
{
	uint64_t extra = n % m;

	return (uint64_t)d * (n / m) + (d < extra ? d : extra);
}

/* The saved rank whose block holds `row`: the last d with bounds[d] <= row
 * (with empty blocks several start at the same row; the last of them is
 * the non-empty one).  Only for messages, after the bounds were checked. */
static uint32_t saver(const struct dl_saved *s, uint64_t row)
{
	uint32_t lo = 0, hi = s->n_saved; /* bounds[lo] <= row < bounds[hi] */

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (s->bounds[mid] <= row)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

static int check_world(uint32_t new_world, char *err, size_t errlen)
{
	if (new_world == 0 || new_world > DL_MAX_WORLD)
		return inval("new DP world of %u ranks (1 to %u)", new_world, DL_MAX_WORLD);
	return 0;
}

static int check_bounds(const struct dl_saved *s, char *err, size_t errlen)
{
	const uint64_t *b = s->bounds;

	if (s->n_saved == 0 || s->n_saved > DL_MAX_WORLD)
		return bad("table saved by %u DP ranks (1 to %u)", s->n_saved, DL_MAX_WORLD);
	if (b[0] != 0)
		return bad("saved rank 0's block starts at row %llu, not at row 0",
			   (unsigned long long)b[0]);
	for (uint32_t d = 0; d < s->n_saved; d++)
		if (b[d + 1] < b[d])
			return bad("saved rank %u's block ends at row %llu, "
				   "before it starts (row %llu)",
				   d, (unsigned long long)b[d + 1], (unsigned long long)b[d]);
	if (b[s->n_saved] != s->n_rows)
		return bad("saved rank %u's block ends at row %llu, the table has %llu rows",
			   s->n_saved - 1, (unsigned long long)b[s->n_saved],
			   (unsigned long long)s->n_rows);
	return 0;
}

/* Checks every row's id, cursor and done, and writes the (key, row) pairs
 * into p: key = id, with TOP set for a finished row, so that ascending keys
 * are the deal sequence.  Sets *ret_unfinished. */
static int check_rows(const struct dl_saved *s, uint64_t *p, uint64_t *ret_unfinished, char *err,
		      size_t errlen)
{
	uint64_t unfinished = 0;

	for (uint64_t i = 0; i < s->n_rows; i++) {
		const int64_t *row = s->table + i * s->k;
		int64_t id = row[DL_COL_ID], cursor = row[DL_COL_CURSOR], done = row[DL_COL_DONE];

		if (id < 0)
			return bad("row %llu (saved by rank %u): shard id %lld is negative",
				   (unsigned long long)i, saver(s, i), (long long)id);
		if (cursor < 0)
			return bad("row %llu (saved by rank %u): cursor %lld is negative",
				   (unsigned long long)i, saver(s, i), (long long)cursor);
		if (done != 0 && done != 1)
			return bad("row %llu (saved by rank %u): done is %lld, not 0 or 1",
				   (unsigned long long)i, saver(s, i), (long long)done);
		p[2 * i] = (uint64_t)id | (done ? TOP : 0);
		p[2 * i + 1] = i;
		unfinished += !done;
	}
	*ret_unfinished = unfinished;
	return 0;
}

/*
 * Sorts the n (key, row) pairs of a by key, stably (rows with the same key
 * stay in row order), using tmp (as large as a) for the passes; returns
 * whichever of the two holds the result.  LSD radix sort, one byte of the
 * key a pass; a byte that is the same in every key (the high bytes of small
 * ids, say) costs no pass.  At most 8 passes: linear in n, whatever the ids.
 */
static uint64_t *sort_pairs(uint64_t *a, uint64_t *tmp, uint64_t n)
{
	uint64_t hist[8][256], key0;
	uint64_t *src = a, *dst = tmp;

	if (n == 0)
		return a;
	key0 = a[0];
	memset(hist, 0, sizeof(hist));
	for (uint64_t i = 0; i < n; i++)
		for (unsigned d = 0; d < 8; d++)
			hist[d][(a[2 * i] >> (8 * d)) & 0xff]++;
	for (unsigned d = 0; d < 8; d++) {
		uint64_t *h = hist[d], sum = 0, *t;

		/* Every key has key0's byte here: the pass would change nothing. */
		if (h[(key0 >> (8 * d)) & 0xff] == n)
			continue;
		for (unsigned v = 0; v < 256; v++) {
			uint64_t c = h[v];

			h[v] = sum;
			sum += c;
		}
		for (uint64_t i = 0; i < n; i++) {
			uint64_t key = src[2 * i], at = h[(key >> (8 * d)) & 0xff]++;

			dst[2 * at] = key;
			dst[2 * at + 1] = src[2 * i + 1];
		}
		t = src;
		src = dst;
		dst = t;
	}
	return src;
}

/*
 * Refuses a shard id held by two rows.  p is sorted: pairs [0, u) are the
 * unfinished rows, [u, n) the finished ones, each run by id.  A repeat
 * inside a run sits next to its twin; one across the runs is found by
 * walking both runs together.  The message names the smallest repeated id
 * and its two lowest rows, so it does not depend on where the repeat was
 * found.
 */
static int check_unique(const struct dl_saved *s, const uint64_t *p, uint64_t n, uint64_t u,
			char *err, size_t errlen)
{
	uint64_t dup = UINT64_MAX, r1 = UINT64_MAX, r2 = UINT64_MAX;

	/* In each run the first repeat is that run's smallest. */
	for (uint64_t t = 1; t < u; t++)
		if (p[2 * t] == p[2 * t - 2]) {
			dup = p[2 * t];
			break;
		}
	for (uint64_t t = u + 1; t < n; t++)
		if (p[2 * t] == p[2 * t - 2]) {
			if ((p[2 * t] & ~TOP) < dup)
				dup = p[2 * t] & ~TOP;
			break;
		}
	for (uint64_t i = 0, j = u; i < u && j < n;) {
		uint64_t a = p[2 * i], b = p[2 * j] & ~TOP;

		if (a < b) {
			i++;
		} else if (b < a) {
			j++;
		} else {
			if (a < dup)
				dup = a;
			break;
		}
	}
	if (dup == UINT64_MAX)
		return 0;
	for (uint64_t t = 0; t < n; t++) {
		uint64_t row = p[2 * t + 1];

		if ((p[2 * t] & ~TOP) != dup)
			continue;
		if (row < r1) {
			r2 = r1;
			r1 = row;
		} else if (row < r2) {
			r2 = row;
		}
	}
	return bad("shard id %lld is on two rows: "
		   "%llu (saved by rank %u) and %llu (saved by rank %u)",
		   (long long)dup, (unsigned long long)r1, saver(s, r1), (unsigned long long)r2,
		   saver(s, r2));
}

/*
 * The shared core.  Checks s against new_world, then returns in *ret_buf a
 * malloc'd array of 4 * max(n_rows, 1) words whose first n_rows hold the
 * deal sequence (seq[t] = the saved row dealt t-th); the rest is free for
 * the caller.  Nothing is returned on failure.
 */
static int prepare(const struct dl_saved *s, uint32_t new_world, uint64_t **ret_buf, char *err,
		   size_t errlen)
{
	uint64_t n, words, u = 0, *buf, *sorted;
	int ret;

	ret = check_world(new_world, err, errlen);
	if (ret < 0)
		return ret;
	if (!s || !s->bounds || (!s->table && s->n_rows))
		return inval("no saved table or no bounds");
	if (s->k < DL_MIN_COLS || s->k > DL_MAX_COLS)
		return inval("table of %u columns (%u to %u)", s->k, DL_MIN_COLS, DL_MAX_COLS);
	n = s->n_rows;
	/* The second test only matters where size_t is 32 bits. */
	if (n > DL_MAX_ROWS || n > SIZE_MAX / (4 * sizeof(uint64_t)) / DL_MAX_COLS)
		return errmsg_set(err, errlen, -E2BIG, "table of %llu rows (at most %llu)",
				  (unsigned long long)n, (unsigned long long)DL_MAX_ROWS);
	ret = check_bounds(s, err, errlen);
	if (ret < 0)
		return ret;

	words = 4 * (n ? n : 1);
	buf = malloc(words * sizeof(*buf));
	if (!buf)
		return -ENOMEM;
	ret = check_rows(s, buf, &u, err, errlen);
	if (ret < 0)
		goto out_free;
	sorted = sort_pairs(buf, buf + 2 * n, n);
	ret = check_unique(s, sorted, n, u, err, errlen);
	if (ret < 0)
		goto out_free;
	/* Keep only the rows.  Going up, the write at t never passes the
	 * read at 2t + 1 (sorted == buf), and when sorted is the upper half
	 * the two do not overlap. */
	for (uint64_t t = 0; t < n; t++)
		buf[t] = sorted[2 * t + 1];
	*ret_buf = buf;
	return 0;

out_free:
	free(buf);
	return ret;
}

/* Gives back what the caller does not keep of buf; a failed shrink leaves
 * the larger block, which is as good. */
static uint64_t *shrink(uint64_t *buf, uint64_t n)
{
	uint64_t *p = realloc(buf, (n ? n : 1) * sizeof(*buf));

	return p ? p : buf;
}

int dl_assign(const struct dl_saved *s, uint32_t new_world, uint32_t rank, uint64_t **ret_rows,
	      uint64_t *ret_n, uint64_t *ret_row0, char *err, size_t errlen)
{
	uint64_t *buf, cnt, row0;
	int ret;

	if (!ret_rows || !ret_n || !ret_row0)
		return inval("no output for the rows");
	ret = check_world(new_world, err, errlen);
	if (ret < 0)
		return ret;
	if (rank >= new_world)
		return inval("rank %u is not in a DP world of %u ranks", rank, new_world);
	ret = prepare(s, new_world, &buf, err, errlen);
	if (ret < 0)
		return ret;

	if (new_world == s->n_saved) {
		row0 = s->bounds[rank];
		cnt = s->bounds[rank + 1] - row0;
		for (uint64_t j = 0; j < cnt; j++)
			buf[j] = row0 + j;
	} else {
		row0 = block_start(s->n_rows, new_world, rank);
		cnt = block_start(s->n_rows, new_world, rank + 1) - row0;
		/* In place: rank + j * new_world >= j. */
		for (uint64_t j = 0; j < cnt; j++)
			buf[j] = buf[rank + j * new_world];
	}
	*ret_rows = shrink(buf, cnt);
	*ret_n = cnt;
	*ret_row0 = row0;
	return 0;
}

int dl_map(const struct dl_saved *s, uint32_t new_world, uint64_t **ret_order,
	   uint64_t *ret_bounds, uint32_t *ret_owner, char *err, size_t errlen)
{
	uint64_t *buf, *order, n;
	int ret;

	if (!ret_order || !ret_bounds)
		return inval("no output for the map");
	ret = prepare(s, new_world, &buf, err, errlen);
	if (ret < 0)
		return ret;
	n = s->n_rows;

	if (new_world == s->n_saved) {
		for (uint64_t j = 0; j < n; j++)
			buf[j] = j;
		memcpy(ret_bounds, s->bounds, ((size_t)new_world + 1) * sizeof(*ret_bounds));
	} else {
		/* Row t of the sequence becomes row t / M of rank t mod M; the
		 * gather list is built in the free words after the sequence,
		 * then moved to the front. */
		order = buf + n;
		for (uint64_t t = 0; t < n; t++) {
			uint32_t d = (uint32_t)(t % new_world);

			order[block_start(n, new_world, d) + t / new_world] = buf[t];
		}
		memcpy(buf, order, n * sizeof(*buf));
		for (uint32_t d = 0; d <= new_world; d++)
			ret_bounds[d] = block_start(n, new_world, d);
	}
	if (ret_owner)
		for (uint32_t d = 0; d < new_world; d++)
			for (uint64_t j = ret_bounds[d]; j < ret_bounds[d + 1]; j++)
				ret_owner[buf[j]] = d;
	*ret_order = shrink(buf, n);
	return 0;
}

int dl_first(uint64_t n_shards, uint32_t new_world, uint32_t rank, int64_t **ret_ids,
	     uint64_t *ret_n, uint64_t *ret_row0, char *err, size_t errlen)
{
	uint64_t row0, cnt;
	int64_t *ids;
	int ret;

	if (!ret_ids || !ret_n || !ret_row0)
		return inval("no output for the shard ids");
	ret = check_world(new_world, err, errlen);
	if (ret < 0)
		return ret;
	if (rank >= new_world)
		return inval("rank %u is not in a DP world of %u ranks", rank, new_world);
	if (n_shards > DL_MAX_ROWS)
		return errmsg_set(err, errlen, -E2BIG, "%llu shards (at most %llu)",
				  (unsigned long long)n_shards, (unsigned long long)DL_MAX_ROWS);
	row0 = block_start(n_shards, new_world, rank);
	cnt = block_start(n_shards, new_world, rank + 1) - row0;
	ids = malloc((cnt ? cnt : 1) * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	/* Shard t is row t of the deal sequence (all rows unfinished, by id),
	 * so it goes to rank t mod M, as dl_assign() would deal it. */
	for (uint64_t j = 0; j < cnt; j++)
		ids[j] = (int64_t)(rank + j * new_world);
	*ret_ids = ids;
	*ret_n = cnt;
	*ret_row0 = row0;
	return 0;
}
