/* SPDX-License-Identifier: MIT */
/* check_dlstate.c - data-loader state dealt to a new DP world (dlstate.h). */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/dlstate.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* For loops over every row: Check's ck_assert_* record each passing check
 * (_mark_point), which costs a write per call; this costs nothing unless
 * it fails. */
#define need(cond)                                                      \
	do {                                                            \
		if (!(cond))                                            \
			ck_abort_msg("'%s' failed", #cond);             \
	} while (0)

/* xorshift64*: the same tables on every run. */
static uint64_t rnd(uint64_t *st)
{
	*st ^= *st >> 12;
	*st ^= *st << 25;
	*st ^= *st >> 27;
	return *st * 0x2545F4914F6CDD1Dull;
}

static uint64_t below(uint64_t *st, uint64_t n)
{
	return n ? rnd(st) % n : 0;
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	ck_assert_ptr_nonnull(p);
	return p;
}

/* A saved table and the memory behind it. */
struct tbl {
	int64_t *rows;
	uint64_t n;
	uint32_t k;
	uint32_t n_saved;
	uint64_t *bounds;
};

static struct dl_saved saved(const struct tbl *t)
{
	return (struct dl_saved){ .table = t->rows, .n_rows = t->n, .k = t->k,
				  .n_saved = t->n_saved, .bounds = t->bounds };
}

static void free_table(struct tbl *t)
{
	free(t->rows);
	free(t->bounds);
	memset(t, 0, sizeof(*t));
}

static int by_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Block bounds for n rows saved by n_saved ranks: random cuts, and about a
 * quarter of the blocks forced empty. */
static uint64_t *random_bounds(uint64_t n, uint32_t n_saved, uint64_t *st)
{
	uint64_t *b = xcalloc((size_t)n_saved + 1, sizeof(*b));

	for (uint32_t d = 1; d < n_saved; d++)
		b[d] = below(st, n + 1);
	qsort(b + 1, n_saved ? n_saved - 1 : 0, sizeof(*b), by_u64);
	for (uint32_t d = 2; d < n_saved; d++)
		if (below(st, 4) == 0)
			b[d] = b[d - 1];
	b[n_saved] = n;
	return b;
}

/* n rows of k columns: distinct ids spread over [3, 5n + 3) in random
 * order, random cursors, about a third finished, user columns random
 * (negative ones too: they are not the module's to check). */
static void make_table(struct tbl *t, uint64_t n, uint32_t k, uint32_t n_saved, uint64_t seed)
{
	uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
	uint64_t *perm = xcalloc(n, sizeof(*perm));

	for (uint64_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = below(&st, i), x = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = x;
	}
	t->n = n;
	t->k = k;
	t->n_saved = n_saved;
	t->rows = xcalloc(n * k, sizeof(*t->rows));
	for (uint64_t i = 0; i < n; i++) {
		int64_t *r = t->rows + i * k;

		r[DL_COL_ID] = (int64_t)(perm[i] * 5 + 3);
		r[DL_COL_CURSOR] = (int64_t)below(&st, 1000);
		r[DL_COL_DONE] = below(&st, 3) == 0;
		for (uint32_t c = 3; c < k; c++)
			r[c] = (int64_t)rnd(&st);
	}
	t->bounds = random_bounds(n, n_saved, &st);
	free(perm);
}

/* The oracle for a change of topology: saved rows sorted by (done, id). */
static const int64_t *sort_rows;
static uint32_t sort_k;

static int by_done_id(const void *a, const void *b)
{
	const int64_t *x = sort_rows + *(const uint64_t *)a * sort_k;
	const int64_t *y = sort_rows + *(const uint64_t *)b * sort_k;

	if (x[DL_COL_DONE] != y[DL_COL_DONE])
		return x[DL_COL_DONE] < y[DL_COL_DONE] ? -1 : 1;
	return x[DL_COL_ID] < y[DL_COL_ID] ? -1 : x[DL_COL_ID] > y[DL_COL_ID];
}

/* dl_assign() for rank r returns rank r's part of the map. */
static void check_rank(const struct dl_saved *s, uint32_t m, uint32_t r, const uint64_t *order,
		       const uint64_t *nb)
{
	uint64_t *rows = NULL, cnt = 0, row0 = 0;
	char err[256] = "";

	ck_assert_msg(dl_assign(s, m, r, &rows, &cnt, &row0, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ptr_nonnull(rows);
	ck_assert_uint_eq(row0, nb[r]);
	ck_assert_uint_eq(cnt, nb[r + 1] - nb[r]);
	if (cnt)
		ck_assert_mem_eq(rows, order + nb[r], cnt * sizeof(*rows));
	free(rows);
}

/*
 * Restores t onto m ranks with dl_map() and checks what any such restore
 * must give: every saved row in the new table exactly once, owner[] and the
 * new bounds agreeing with it, the identity for m == N, and otherwise the
 * deal (against a sort done here), balanced unfinished and finished counts,
 * each rank's rows unfinished first, by id.  Then dl_assign() for every
 * assign_step-th rank (and the last) must return exactly that rank's part.
 * Returns the gather list; *nb gets the new bounds (m + 1 entries).
 */
static uint64_t *check_map(const struct tbl *t, uint32_t m, uint32_t assign_step, uint64_t *nb)
{
	struct dl_saved s = saved(t);
	uint32_t *owner = xcalloc(t->n, sizeof(*owner));
	bool *seen = xcalloc(t->n, sizeof(*seen));
	uint64_t *order = NULL, umin = UINT64_MAX, umax = 0, fmin = UINT64_MAX, fmax = 0;
	char err[256] = "";

	ck_assert_msg(dl_map(&s, m, &order, nb, owner, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ptr_nonnull(order);
	ck_assert_uint_eq(nb[0], 0);
	ck_assert_uint_eq(nb[m], t->n);
	for (uint32_t d = 0; d < m; d++) {
		ck_assert_uint_le(nb[d], nb[d + 1]);
		for (uint64_t j = nb[d]; j < nb[d + 1]; j++) {
			need(order[j] < t->n);
			need(!seen[order[j]]);
			seen[order[j]] = true;
			need(owner[order[j]] == d);
		}
	}

	if (m == t->n_saved) {
		for (uint64_t j = 0; j < t->n; j++)
			need(order[j] == j);
		ck_assert_mem_eq(nb, t->bounds, ((size_t)m + 1) * sizeof(*nb));
	} else {
		uint64_t *want = xcalloc(t->n, sizeof(*want));

		for (uint64_t i = 0; i < t->n; i++)
			want[i] = i;
		sort_rows = t->rows;
		sort_k = t->k;
		qsort(want, t->n, sizeof(*want), by_done_id);
		/* Blocks of n / m rows, the first n % m of them one longer. */
		for (uint32_t d = 0; d < m; d++)
			need(nb[d + 1] - nb[d] == t->n / m + (d < t->n % m));
		for (uint64_t q = 0; q < t->n; q++)
			need(order[nb[q % m] + q / m] == want[q]);
		free(want);

		for (uint32_t d = 0; d < m; d++) {
			uint64_t u = 0, f = 0;

			for (uint64_t j = nb[d]; j < nb[d + 1]; j++) {
				const int64_t *r = t->rows + order[j] * t->k;

				if (r[DL_COL_DONE])
					f++;
				else
					u++;
				if (j > nb[d]) {
					const int64_t *p = t->rows + order[j - 1] * t->k;

					need(p[DL_COL_DONE] <= r[DL_COL_DONE]);
					need(p[DL_COL_DONE] < r[DL_COL_DONE] ||
					     p[DL_COL_ID] < r[DL_COL_ID]);
				}
			}
			umin = u < umin ? u : umin;
			umax = u > umax ? u : umax;
			fmin = f < fmin ? f : fmin;
			fmax = f > fmax ? f : fmax;
		}
		ck_assert_uint_le(umax - umin, 1);
		ck_assert_uint_le(fmax - fmin, 1);
	}

	for (uint32_t r = 0; r < m; r += assign_step)
		check_rank(&s, m, r, order, nb);
	if ((m - 1) % assign_step)
		check_rank(&s, m, m - 1, order, nb);
	free(seen);
	free(owner);
	return order;
}

/* The same rows in another order, saved by n_saved ranks with new bounds. */
static void shuffled(const struct tbl *t, uint32_t n_saved, uint64_t seed, struct tbl *out)
{
	uint64_t st = seed, *perm = xcalloc(t->n, sizeof(*perm));

	for (uint64_t i = 0; i < t->n; i++)
		perm[i] = i;
	for (uint64_t i = t->n; i > 1; i--) {
		uint64_t j = below(&st, i), x = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = x;
	}
	out->n = t->n;
	out->k = t->k;
	out->n_saved = n_saved;
	out->rows = xcalloc(t->n * t->k, sizeof(*out->rows));
	for (uint64_t i = 0; i < t->n; i++)
		memcpy(out->rows + i * t->k, t->rows + perm[i] * t->k, t->k * sizeof(*t->rows));
	out->bounds = random_bounds(t->n, n_saved, &st);
	free(perm);
}

/* ---- same topology ----------------------------------------------------- */

START_TEST(test_same_is_identity)
{
	for (uint64_t seed = 1; seed <= 40; seed++) {
		uint64_t st = seed;
		uint32_t n_saved = 1 + (uint32_t)below(&st, 9);
		uint64_t n = below(&st, 300);
		uint64_t *nb = xcalloc((size_t)n_saved + 1, sizeof(*nb)), *order;
		struct tbl t;

		make_table(&t, n, 3 + (uint32_t)below(&st, 6), n_saved, seed);
		order = check_map(&t, n_saved, 1, nb);
		/* And rank by rank, against the saved blocks themselves. */
		for (uint32_t r = 0; r < n_saved; r++) {
			struct dl_saved s = saved(&t);
			uint64_t *rows, cnt, row0;

			ck_assert_int_eq(dl_assign(&s, n_saved, r, &rows, &cnt, &row0, NULL, 0), 0);
			ck_assert_uint_eq(row0, t.bounds[r]);
			ck_assert_uint_eq(cnt, t.bounds[r + 1] - t.bounds[r]);
			for (uint64_t j = 0; j < cnt; j++)
				need(rows[j] == t.bounds[r] + j);
			free(rows);
		}
		free(order);
		free(nb);
		free_table(&t);
	}
}
END_TEST

/* The identity holds even when the saved blocks are far from balanced:
 * M == N keeps each rank's rows, matching its per-rank blobs. */
START_TEST(test_same_unbalanced)
{
	uint64_t bounds[4] = { 0, 0, 9, 9 }, *rows, cnt, row0;
	struct tbl t;
	struct dl_saved s;

	make_table(&t, 9, 4, 3, 7);
	memcpy(t.bounds, bounds, sizeof(bounds));
	s = saved(&t);
	ck_assert_int_eq(dl_assign(&s, 3, 0, &rows, &cnt, &row0, NULL, 0), 0);
	ck_assert_uint_eq(cnt, 0);
	ck_assert_uint_eq(row0, 0);
	ck_assert_ptr_nonnull(rows);
	free(rows);
	ck_assert_int_eq(dl_assign(&s, 3, 1, &rows, &cnt, &row0, NULL, 0), 0);
	ck_assert_uint_eq(cnt, 9);
	ck_assert_uint_eq(row0, 0);
	ck_assert_uint_eq(rows[8], 8);
	free(rows);
	ck_assert_int_eq(dl_assign(&s, 3, 2, &rows, &cnt, &row0, NULL, 0), 0);
	ck_assert_uint_eq(cnt, 0);
	ck_assert_uint_eq(row0, 9);
	free(rows);
	free_table(&t);
}
END_TEST

/* ---- another topology ------------------------------------------------- */

/* The rule on a table small enough to work out by hand: 7 rows saved by 2
 * ranks, restored by 3.  Unfinished by id: 20 (row 3), 40 (row 2), 50
 * (row 0), 60 (row 5), 70 (row 6); then finished: 10 (row 1), 30 (row 4).
 * Dealt in turn: rank 0 gets rows 3, 5, 4; rank 1 rows 2, 6; rank 2 rows
 * 0, 1; blocks of 3, 2, 2 rows. */
START_TEST(test_seven_over_three)
{
	int64_t table[7][3] = {
		{ 50, 5, 0 }, { 10, 9, 1 }, { 40, 0, 0 }, { 20, 2, 0 },
		{ 30, 7, 1 }, { 60, 1, 0 }, { 70, 0, 0 },
	};
	uint64_t bounds[3] = { 0, 4, 7 }, nb[4], *order;
	static const uint64_t want[3][3] = { { 3, 5, 4 }, { 2, 6 }, { 0, 1 } };
	static const uint64_t want_n[3] = { 3, 2, 2 }, want_row0[3] = { 0, 3, 5 };
	static const uint32_t want_owner[7] = { 2, 2, 1, 0, 0, 0, 1 };
	struct dl_saved s = { .table = &table[0][0], .n_rows = 7, .k = 3, .n_saved = 2,
			      .bounds = bounds };
	uint32_t owner[7];

	for (uint32_t r = 0; r < 3; r++) {
		uint64_t *rows, cnt, row0;

		ck_assert_int_eq(dl_assign(&s, 3, r, &rows, &cnt, &row0, NULL, 0), 0);
		ck_assert_uint_eq(cnt, want_n[r]);
		ck_assert_uint_eq(row0, want_row0[r]);
		ck_assert_mem_eq(rows, want[r], cnt * sizeof(*rows));
		free(rows);
	}
	ck_assert_int_eq(dl_map(&s, 3, &order, nb, owner, NULL, 0), 0);
	ck_assert_mem_eq(owner, want_owner, sizeof(owner));
	ck_assert_uint_eq(nb[1], 3);
	ck_assert_uint_eq(nb[2], 5);
	ck_assert_uint_eq(nb[3], 7);
	free(order);
}
END_TEST

static const struct reshard {
	uint32_t n_saved, m;
	uint64_t rows;
	uint32_t k;
} reshards[] = {
	{ 4, 3, 1000, 5 },  { 4, 6, 1000, 5 },  { 4, 1, 1000, 3 },  { 4, 4, 1000, 7 },
	{ 4, 7, 1000, 5 },  { 4, 64, 1000, 4 }, { 4, 64, 10, 5 },   /* more ranks than rows */
	{ 4, 3, 0, 3 },     { 1, 3, 7, 3 },     { 3, 1, 1, 64 },    { 4, 1000, 37, 3 },
	{ 64, 3, 5000, 6 }, { 2, 65536, 3, 3 }, { 7, 5, 7919, 4 },
};

/* N -> M on random tables: every row dealt once by the rule, the ranks
 * agreeing with the map; and the same deal from the same rows saved in
 * another order by another number of ranks. */
START_TEST(test_reshard)
{
	const struct reshard *c = &reshards[_i];
	uint64_t *nb = xcalloc((size_t)c->m + 1, sizeof(*nb)), *nb2, *order, *order2;
	uint32_t step = c->m > 100 ? c->m / 7 : 1;
	struct tbl t, t2;

	make_table(&t, c->rows, c->k, c->n_saved, 100 + (uint64_t)_i);
	order = check_map(&t, c->m, step, nb);
	if (c->m != c->n_saved) {
		for (uint32_t n2 = 1; n2 <= 9; n2 += 2) {
			if (n2 == c->m)
				continue;
			nb2 = xcalloc((size_t)c->m + 1, sizeof(*nb2));
			shuffled(&t, n2, 1000 + n2, &t2);
			order2 = check_map(&t2, c->m, step, nb2);
			ck_assert_mem_eq(nb2, nb, ((size_t)c->m + 1) * sizeof(*nb));
			for (uint64_t j = 0; j < t.n; j++)
				need(memcmp(t2.rows + order2[j] * t.k, t.rows + order[j] * t.k,
					    t.k * sizeof(*t.rows)) == 0);
			free(order2);
			free(nb2);
			free_table(&t2);
		}
	}
	free(order);
	free(nb);
	free_table(&t);
}
END_TEST

/* Two TP peers of one DP rank compute from their own copies of the same
 * checkpoint, and get the same rows. */
START_TEST(test_tp_peers)
{
	struct tbl a, b;

	make_table(&a, 777, 5, 4, 31);
	b = a;
	b.rows = xcalloc(a.n * a.k, sizeof(*b.rows));
	b.bounds = xcalloc(a.n_saved + 1, sizeof(*b.bounds));
	memcpy(b.rows, a.rows, a.n * a.k * sizeof(*a.rows));
	memcpy(b.bounds, a.bounds, (a.n_saved + 1) * sizeof(*a.bounds));
	for (uint32_t m = 1; m <= 8; m++) {
		for (uint32_t r = 0; r < m; r++) {
			struct dl_saved sa = saved(&a), sb = saved(&b);
			uint64_t *ra, *rb, na, nb, r0a, r0b;

			ck_assert_int_eq(dl_assign(&sa, m, r, &ra, &na, &r0a, NULL, 0), 0);
			ck_assert_int_eq(dl_assign(&sb, m, r, &rb, &nb, &r0b, NULL, 0), 0);
			ck_assert_uint_eq(na, nb);
			ck_assert_uint_eq(r0a, r0b);
			ck_assert_mem_eq(ra, rb, na * sizeof(*ra));
			free(ra);
			free(rb);
		}
	}
	free_table(&a);
	free_table(&b);
}
END_TEST

/* ---- a chain of restores ---------------------------------------------- */

enum { COL_EPOCH = 3, COL_LEN = 4, CHAIN_K = 6 };

/* Training between saves: each rank takes a few samples from its
 * unfinished shards; ref[id] follows every row as the loader would. */
static void train(struct tbl *t, int64_t *ref, uint64_t *st)
{
	for (uint64_t i = 0; i < t->n; i++) {
		int64_t *r = t->rows + i * t->k;

		if (!r[DL_COL_DONE]) {
			r[DL_COL_CURSOR] += (int64_t)below(st, 25);
			if (r[DL_COL_CURSOR] >= r[COL_LEN]) {
				r[DL_COL_CURSOR] = r[COL_LEN];
				r[DL_COL_DONE] = 1;
			}
		}
		memcpy(ref + r[DL_COL_ID] * t->k, r, t->k * sizeof(*r));
	}
}

/* Each new rank restores on its own (dl_assign), builds its block in the
 * order given and saves it at its row0; the blocks make the next table. */
static void restore(const struct tbl *t, uint32_t m, struct tbl *out)
{
	struct dl_saved s = saved(t);
	uint64_t next = 0;

	out->n = t->n;
	out->k = t->k;
	out->n_saved = m;
	out->rows = xcalloc(t->n * t->k, sizeof(*out->rows));
	out->bounds = xcalloc((size_t)m + 1, sizeof(*out->bounds));
	for (uint32_t r = 0; r < m; r++) {
		uint64_t *rows, cnt, row0;
		char err[256] = "";

		ck_assert_msg(dl_assign(&s, m, r, &rows, &cnt, &row0, err, sizeof(err)) == 0, "%s",
			      err);
		ck_assert_uint_eq(row0, next);
		out->bounds[r] = row0;
		for (uint64_t j = 0; j < cnt; j++)
			memcpy(out->rows + (row0 + j) * t->k, t->rows + rows[j] * t->k,
			       t->k * sizeof(*t->rows));
		next = row0 + cnt;
		free(rows);
	}
	ck_assert_uint_eq(next, t->n);
	out->bounds[m] = next;
}

/* Every shard exactly once, each row as the loader last left it. */
static void check_against(const struct tbl *t, const int64_t *ref, uint64_t n_shards)
{
	bool *seen = xcalloc(n_shards, sizeof(*seen));

	ck_assert_uint_eq(t->n, n_shards);
	for (uint64_t i = 0; i < t->n; i++) {
		const int64_t *r = t->rows + i * t->k;

		need(r[DL_COL_ID] >= 0 && r[DL_COL_ID] < (int64_t)n_shards);
		need(!seen[r[DL_COL_ID]]);
		seen[r[DL_COL_ID]] = true;
		need(memcmp(r, ref + r[DL_COL_ID] * t->k, t->k * sizeof(*r)) == 0);
	}
	free(seen);
}

START_TEST(test_chain)
{
	enum { SHARDS = 1001 };
	static const uint32_t worlds[] = { 4, 3, 6, 4 };
	int64_t *ref = xcalloc(SHARDS * CHAIN_K, sizeof(*ref));
	uint64_t st = 12345, next = 0;
	struct tbl t = { 0 }, t2;

	/* The first run, by four ranks. */
	t.n = SHARDS;
	t.k = CHAIN_K;
	t.n_saved = worlds[0];
	t.rows = xcalloc(SHARDS * CHAIN_K, sizeof(*t.rows));
	t.bounds = xcalloc(worlds[0] + 1, sizeof(*t.bounds));
	for (uint32_t r = 0; r < worlds[0]; r++) {
		int64_t *ids;
		uint64_t cnt, row0;

		ck_assert_int_eq(dl_first(SHARDS, worlds[0], r, &ids, &cnt, &row0, NULL, 0), 0);
		ck_assert_uint_eq(row0, next);
		t.bounds[r] = row0;
		for (uint64_t j = 0; j < cnt; j++) {
			int64_t *row = t.rows + (row0 + j) * CHAIN_K;

			row[DL_COL_ID] = ids[j];
			row[COL_EPOCH] = 2;
			row[COL_LEN] = 1 + (int64_t)below(&st, 60);
			row[5] = -ids[j] * 1000003; /* a seed, say */
		}
		next += cnt;
		free(ids);
	}
	t.bounds[worlds[0]] = next;
	ck_assert_uint_eq(next, SHARDS);

	train(&t, ref, &st);
	for (int w = 1; w < N(worlds); w++) {
		restore(&t, worlds[w], &t2);
		check_against(&t2, ref, SHARDS);
		free_table(&t);
		t = t2;
		train(&t, ref, &st);
	}
	/* And again with no training in between: the deal of an already dealt
	 * table, one more time round. */
	restore(&t, 5, &t2);
	check_against(&t2, ref, SHARDS);
	free_table(&t2);
	free_table(&t);
	free(ref);
}
END_TEST

/* ---- the first run ------------------------------------------------------ */

START_TEST(test_first)
{
	static const struct {
		uint64_t n;
		uint32_t m;
	} c[] = {
		{ 0, 1 }, { 7, 3 }, { 3, 8 }, { 1000, 4 }, { 1000, 6 }, { 12, 12 }, { 5, 65536 },
	};

	for (int i = 0; i < N(c); i++) {
		uint64_t next = 0;
		/* A table of the first run, as the ranks would build it. */
		struct tbl t = { .n = c[i].n, .k = 3, .n_saved = c[i].m };

		t.rows = xcalloc(c[i].n * 3, sizeof(*t.rows));
		t.bounds = xcalloc((size_t)c[i].m + 1, sizeof(*t.bounds));
		for (uint32_t r = 0; r < c[i].m; r++) {
			int64_t *ids;
			uint64_t cnt, row0;

			need(dl_first(c[i].n, c[i].m, r, &ids, &cnt, &row0, NULL, 0) == 0);
			need(ids != NULL);
			need(row0 == next);
			need(cnt == c[i].n / c[i].m + (r < c[i].n % c[i].m));
			for (uint64_t j = 0; j < cnt; j++) {
				need(ids[j] == (int64_t)(r + j * c[i].m));
				t.rows[(row0 + j) * 3] = ids[j];
			}
			t.bounds[r] = row0;
			next += cnt;
			free(ids);
		}
		ck_assert_uint_eq(next, c[i].n);
		t.bounds[c[i].m] = next;
		/* Restoring it elsewhere deals as a first run there would. */
		for (uint32_t m2 = 1; m2 <= 9 && c[i].m < 1000; m2++) {
			struct dl_saved s = saved(&t);

			for (uint32_t r = 0; r < m2; r++) {
				uint64_t *rows, cnt, row0, cnt2, row02;
				int64_t *ids;

				need(dl_assign(&s, m2, r, &rows, &cnt, &row0, NULL, 0) == 0);
				need(dl_first(c[i].n, m2, r, &ids, &cnt2, &row02, NULL, 0) == 0);
				ck_assert_uint_eq(cnt, cnt2);
				ck_assert_uint_eq(row0, row02);
				for (uint64_t j = 0; j < cnt; j++)
					need(t.rows[rows[j] * 3] == ids[j]);
				free(rows);
				free(ids);
			}
		}
		free_table(&t);
	}
}
END_TEST

/* ---- refusals ----------------------------------------------------------- */

/* The base table: 6 rows of 4 columns, ids 10..15, rows 1 and 3 finished,
 * saved by 2 ranks as rows [0, 3) and [3, 6).  A case changes up to two
 * cells and/or the arguments. */
struct cell {
	int row, col;
	int64_t val;
};

static const struct bad_case {
	const char *what;
	uint32_t k;            /* 0: 4 */
	uint32_t world;        /* new world; 0 is a case, so... */
	bool world_set;        /* ...false: 3, and 2 (== N) as well */
	uint32_t rank;
	uint32_t n_saved;      /* 0 with bounds_set false: 2, {0, 3, 6} */
	bool bounds_set;
	uint64_t bounds[4];
	uint64_t n_rows;       /* 0: 6 */
	bool no_table;
	struct cell cells[2];  /* all zero: none */
	int want;
	const char *says[2];
} bad_cases[] = {
	{ "k too small", .k = 2, .want = -EINVAL, .says = { "2 columns" } },
	{ "k too large", .k = 65, .want = -EINVAL, .says = { "65 columns" } },
	{ "world 0", .world_set = true, .world = 0, .want = -EINVAL, .says = { "0 ranks" } },
	{ "world too large", .world_set = true, .world = 65537, .want = -EINVAL,
	  .says = { "65537 ranks" } },
	{ "rank outside the world", .world_set = true, .world = 3, .rank = 3, .want = -EINVAL,
	  .says = { "rank 3", "3 ranks" } },
	{ "no table", .no_table = true, .want = -EINVAL, .says = { "no saved table" } },
	{ "too many rows", .n_rows = DL_MAX_ROWS + 1, .want = -E2BIG,
	  .says = { "268435457 rows" } },
	{ "saved by no rank", .bounds_set = true, .n_saved = 0, .want = -EBADMSG,
	  .says = { "0 DP ranks" } },
	{ "saved by too many ranks", .bounds_set = true, .n_saved = 65537, .want = -EBADMSG,
	  .says = { "65537 DP ranks" } },
	{ "bounds start late", .bounds_set = true, .n_saved = 2, .bounds = { 1, 3, 6 },
	  .want = -EBADMSG, .says = { "rank 0", "row 1" } },
	{ "bounds decrease", .bounds_set = true, .n_saved = 3, .bounds = { 0, 4, 3, 6 },
	  .want = -EBADMSG, .says = { "rank 1", "ends at row 3" } },
	{ "bounds end early", .bounds_set = true, .n_saved = 2, .bounds = { 0, 3, 5 },
	  .want = -EBADMSG, .says = { "rank 1", "6 rows" } },
	{ "bounds end late", .bounds_set = true, .n_saved = 2, .bounds = { 0, 3, 7 },
	  .want = -EBADMSG, .says = { "rank 1", "row 7" } },
	{ "negative id", .cells = { { 4, DL_COL_ID, -1 } }, .want = -EBADMSG,
	  .says = { "row 4 (saved by rank 1)", "shard id -1" } },
	{ "negative id after an empty block", .bounds_set = true, .n_saved = 3,
	  .bounds = { 0, 3, 3, 6 }, .cells = { { 3, DL_COL_ID, INT64_MIN } }, .want = -EBADMSG,
	  .says = { "row 3 (saved by rank 2)", "-9223372036854775808" } },
	{ "negative cursor", .cells = { { 2, DL_COL_CURSOR, -7 } }, .want = -EBADMSG,
	  .says = { "row 2 (saved by rank 0)", "cursor -7" } },
	{ "done 2", .cells = { { 5, DL_COL_DONE, 2 } }, .want = -EBADMSG,
	  .says = { "row 5 (saved by rank 1)", "done is 2" } },
	{ "done -1", .cells = { { 0, DL_COL_DONE, -1 } }, .want = -EBADMSG,
	  .says = { "row 0 (saved by rank 0)", "done is -1" } },
	{ "repeat among unfinished", .cells = { { 4, DL_COL_ID, 10 } }, .want = -EBADMSG,
	  .says = { "shard id 10", "0 (saved by rank 0) and 4 (saved by rank 1)" } },
	{ "repeat among finished", .cells = { { 3, DL_COL_ID, 11 } }, .want = -EBADMSG,
	  .says = { "shard id 11", "1 (saved by rank 0) and 3 (saved by rank 1)" } },
	{ "repeat across unfinished and finished", .cells = { { 3, DL_COL_ID, 12 } },
	  .want = -EBADMSG,
	  .says = { "shard id 12", "2 (saved by rank 0) and 3 (saved by rank 1)" } },
	/* 12 repeats among the unfinished, 11 across: the smaller is named. */
	{ "two repeats", .cells = { { 5, DL_COL_ID, 11 }, { 4, DL_COL_ID, 12 } }, .want = -EBADMSG,
	  .says = { "shard id 11", "1 (saved by rank 0) and 5 (saved by rank 1)" } },
	/* Rows 2, 3 and 5 (3 finished): the two lowest are named. */
	{ "three rows", .cells = { { 5, DL_COL_ID, 12 }, { 3, DL_COL_ID, 12 } }, .want = -EBADMSG,
	  .says = { "shard id 12", "2 (saved by rank 0) and 3 (saved by rank 1)" } },
};

/* One call of dl_assign and (unless the case is about the rank) dl_map:
 * the errno, the reason, and outputs left alone. */
static void expect_refusal(const struct bad_case *c, const struct dl_saved *s, uint32_t world)
{
	uint64_t poison = 0xDEADBEEFull;
	uint64_t *rows = &poison, cnt = poison, row0 = poison, *order = rows;
	uint64_t nb[8];
	uint32_t owner[8];
	char err[256] = "";

	ck_assert_int_eq(dl_assign(s, world, c->rank, &rows, &cnt, &row0, err, sizeof(err)),
			 c->want);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(!c->says[i] || strstr(err, c->says[i]), "%s: '%s' does not say '%s'",
			      c->what, err, c->says[i]);
	ck_assert_ptr_eq(rows, &poison);
	ck_assert_uint_eq(cnt, poison);
	ck_assert_uint_eq(row0, poison);
	if (c->rank)
		return;
	memset(nb, 0xAB, sizeof(nb));
	memset(owner, 0xAB, sizeof(owner));
	err[0] = '\0';
	/* nb has room for the worlds of the cases that get as far as writing. */
	ck_assert_int_eq(dl_map(s, world, &order, nb, owner, err, sizeof(err)), c->want);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(!c->says[i] || strstr(err, c->says[i]), "%s: '%s' does not say '%s'",
			      c->what, err, c->says[i]);
	ck_assert_ptr_eq(order, &poison);
	for (int i = 0; i < 8; i++) {
		ck_assert_uint_eq(nb[i], 0xABABABABABABABABull);
		ck_assert_uint_eq(owner[i], 0xABABABABu);
	}
}

START_TEST(test_refusals)
{
	const struct bad_case *c = &bad_cases[_i];
	static const uint64_t base_bounds[3] = { 0, 3, 6 };
	uint32_t k = c->k ? c->k : 4;
	/* Room for the base rows' three columns even when k is below 3. */
	int64_t *table = xcalloc(6 * (size_t)k + DL_MIN_COLS, sizeof(*table));
	struct dl_saved s = {
		.table = c->no_table ? NULL : table,
		.n_rows = c->n_rows ? c->n_rows : 6,
		.k = k,
		.n_saved = c->bounds_set ? c->n_saved : 2,
		.bounds = c->bounds_set ? c->bounds : base_bounds,
	};

	for (int i = 0; i < 6; i++) {
		table[i * k + DL_COL_ID] = 10 + i;
		table[i * k + DL_COL_CURSOR] = i;
		table[i * k + DL_COL_DONE] = i == 1 || i == 3;
	}
	for (int i = 0; i < 2; i++)
		if (c->cells[i].row || c->cells[i].col || c->cells[i].val)
			table[c->cells[i].row * k + c->cells[i].col] = c->cells[i].val;
	if (c->world_set) {
		expect_refusal(c, &s, c->world);
	} else {
		expect_refusal(c, &s, 3);
		/* Checked the same way when the topology stays. */
		if (s.n_saved >= 1 && s.n_saved <= 8)
			expect_refusal(c, &s, s.n_saved);
	}
	free(table);
}
END_TEST

/* The untouched base table passes, so each refusal above is its own. */
START_TEST(test_base_accepted)
{
	int64_t table[6][4] = { { 0 } };
	uint64_t bounds[3] = { 0, 3, 6 }, *rows, cnt, row0;
	struct dl_saved s = { .table = &table[0][0], .n_rows = 6, .k = 4, .n_saved = 2,
			      .bounds = bounds };

	for (int i = 0; i < 6; i++) {
		table[i][DL_COL_ID] = 10 + i;
		table[i][DL_COL_CURSOR] = i;
		table[i][DL_COL_DONE] = i == 1 || i == 3;
	}
	for (uint32_t m = 1; m <= 3; m++) {
		ck_assert_int_eq(dl_assign(&s, m, m - 1, &rows, &cnt, &row0, NULL, 0), 0);
		free(rows);
	}
	/* So is an empty table, with empty blocks. */
	s.n_rows = 0;
	bounds[1] = bounds[2] = 0;
	s.table = NULL;
	ck_assert_int_eq(dl_assign(&s, 5, 4, &rows, &cnt, &row0, NULL, 0), 0);
	ck_assert_uint_eq(cnt, 0);
	ck_assert_uint_eq(row0, 0);
	free(rows);
}
END_TEST

START_TEST(test_null_outputs)
{
	int64_t table[1][3] = { { 1, 0, 0 } };
	uint64_t bounds[2] = { 0, 1 }, *p, n, r0, nb[3];
	struct dl_saved s = { .table = &table[0][0], .n_rows = 1, .k = 3, .n_saved = 1,
			      .bounds = bounds };
	char err[128];

	ck_assert_int_eq(dl_assign(&s, 2, 0, NULL, &n, &r0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_assign(&s, 2, 0, &p, NULL, &r0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_assign(&s, 2, 0, &p, &n, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_assign(NULL, 2, 0, &p, &n, &r0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_map(&s, 2, NULL, nb, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_map(&s, 2, &p, NULL, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dl_first(1, 2, 0, NULL, &n, &r0, err, sizeof(err)), -EINVAL);
	/* owner is optional. */
	ck_assert_int_eq(dl_map(&s, 2, &p, nb, NULL, err, sizeof(err)), 0);
	ck_assert_uint_eq(nb[2], 1);
	free(p);
}
END_TEST

static const struct bad_first {
	const char *what;
	uint64_t n;
	uint32_t m, rank;
	int want;
	const char *says;
} bad_firsts[] = {
	{ "world 0", 5, 0, 0, -EINVAL, "0 ranks" },
	{ "world too large", 5, 65537, 0, -EINVAL, "65537 ranks" },
	{ "rank outside", 5, 4, 4, -EINVAL, "rank 4" },
	{ "too many shards", DL_MAX_ROWS + 1, 4, 0, -E2BIG, "268435457 shards" },
};

START_TEST(test_first_refusals)
{
	const struct bad_first *c = &bad_firsts[_i];
	int64_t poison = 7, *ids = &poison;
	uint64_t n = 9, row0 = 9;
	char err[256] = "";

	ck_assert_int_eq(dl_first(c->n, c->m, c->rank, &ids, &n, &row0, err, sizeof(err)),
			 c->want);
	ck_assert_msg(strstr(err, c->says), "%s: '%s'", c->what, err);
	ck_assert_ptr_eq(ids, &poison);
	ck_assert_uint_eq(n, 9);
	ck_assert_uint_eq(row0, 9);
}
END_TEST

/* ---- size --------------------------------------------------------------- */

/* 10^6 rows saved by 1024 ranks, restored by 1000: the whole map checked,
 * a few ranks on their own, and the same deal from a shuffled copy.  The
 * sort is a radix sort, linear by construction; this is here to run the
 * size the module is for, not to time it. */
START_TEST(test_large)
{
	struct tbl t, t2;
	uint64_t *nb = xcalloc(1001, sizeof(*nb)), *nb2 = xcalloc(1001, sizeof(*nb2));
	uint64_t *order, *order2;

	make_table(&t, 1000000, 3, 1024, 99);
	order = check_map(&t, 1000, 333, nb);
	shuffled(&t, 1024, 5, &t2);
	order2 = check_map(&t2, 1000, 999, nb2);
	ck_assert_mem_eq(nb, nb2, 1001 * sizeof(*nb));
	for (uint64_t j = 0; j < t.n; j++)
		need(t.rows[order[j] * 3] == t2.rows[order2[j] * 3]);
	free(order);
	free(order2);
	free(nb);
	free(nb2);
	free_table(&t);
	free_table(&t2);
}
END_TEST

static Suite *dlstate_suite(void)
{
	Suite *s = suite_create("dlstate");
	TCase *tc;

	tc = tcase_create("same_topology");
	tcase_add_test(tc, test_same_is_identity);
	tcase_add_test(tc, test_same_unbalanced);
	suite_add_tcase(s, tc);
	tc = tcase_create("reshard");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_seven_over_three);
	tcase_add_loop_test(tc, test_reshard, 0, N(reshards));
	tcase_add_test(tc, test_tp_peers);
	suite_add_tcase(s, tc);
	tc = tcase_create("chain");
	tcase_add_test(tc, test_chain);
	suite_add_tcase(s, tc);
	tc = tcase_create("first_run");
	tcase_add_test(tc, test_first);
	tcase_add_loop_test(tc, test_first_refusals, 0, N(bad_firsts));
	suite_add_tcase(s, tc);
	tc = tcase_create("refusals");
	tcase_add_loop_test(tc, test_refusals, 0, N(bad_cases));
	tcase_add_test(tc, test_base_accepted);
	tcase_add_test(tc, test_null_outputs);
	suite_add_tcase(s, tc);
	tc = tcase_create("large");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_large);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(dlstate_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
