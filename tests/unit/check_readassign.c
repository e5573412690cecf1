/* SPDX-License-Identifier: MIT */
/* check_readassign.c - read-once assignment of regions to reader ranks:
 * cover, readers, per-rank views, determinism, balance, errors, scale. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "format/readassign.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MiB (1ull << 20)

/*
 * Check 0.15's ck_assert_* record their location on every check that
 * passes (a write to the result pipe); the loops over every byte, region and
 * rank below use these instead, which report only a failure.
 */
#define expect_msg(c, ...) \
	do { \
		if (!(c)) \
			ck_abort_msg(__VA_ARGS__); \
	} while (0)
#define expect(c) expect_msg(c, "failed: %s", #c)
#define expect_op(a, op, b) \
	do { \
		uintmax_t a_ = (a), b_ = (b); \
		expect_msg(a_ op b_, "failed: %s %s %s (%ju, %ju)", #a, #op, #b, a_, b_); \
	} while (0)
#define expect_int(a, b) \
	do { \
		intmax_t a_ = (a), b_ = (b); \
		expect_msg(a_ == b_, "failed: %s == %s (%jd, %jd)", #a, #b, a_, b_); \
	} while (0)

/* ---- a small deterministic generator (splitmix64) ---- */

static uint64_t rnd_state;

static uint64_t rnd(void)
{
	uint64_t z = (rnd_state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t rnd_below(uint64_t n)
{
	return rnd() % n;
}

/* ---- test inputs: requests with owned range arrays ---- */

#define MAX_REQS 256

struct tin {
	size_t n;
	uint32_t rank[MAX_REQS];
	struct ra_range *r[MAX_REQS];
	size_t nr[MAX_REQS];
	struct ra_request reqs[MAX_REQS];
};

static size_t tin_req(struct tin *t, uint32_t rank)
{
	ck_assert_uint_lt(t->n, MAX_REQS);
	t->rank[t->n] = rank;
	t->r[t->n] = NULL;
	t->nr[t->n] = 0;
	return t->n++;
}

static void tin_add(struct tin *t, size_t q, uint32_t file, uint64_t begin, uint64_t end)
{
	t->r[q] = realloc(t->r[q], (t->nr[q] + 1) * sizeof(*t->r[q]));
	ck_assert_ptr_nonnull(t->r[q]);
	t->r[q][t->nr[q]++] = (struct ra_range){ .file = file, .begin = begin, .end = end };
}

static void tin_free(struct tin *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->r[i]);
	t->n = 0;
}

static void tin_copy(struct tin *dst, const struct tin *src)
{
	dst->n = 0;
	for (size_t i = 0; i < src->n; i++) {
		size_t q = tin_req(dst, src->rank[i]);

		for (size_t k = 0; k < src->nr[i]; k++)
			tin_add(dst, q, src->r[i][k].file, src->r[i][k].begin, src->r[i][k].end);
	}
}

static const struct ra_request *tin_reqs(struct tin *t)
{
	for (size_t i = 0; i < t->n; i++)
		t->reqs[i] = (struct ra_request){ .rank = t->rank[i], .ranges = t->r[i],
						  .n_ranges = t->nr[i] };
	return t->reqs;
}

static struct ra_plan *assign(struct tin *t, uint64_t max_region)
{
	struct ra_plan *p = NULL;
	char err[256] = "";
	int ret = ra_assign(tin_reqs(t), t->n, max_region, &p, err, sizeof(err));

	ck_assert_msg(ret == 0, "ra_assign: %d (%s)", ret, err);
	ck_assert_ptr_nonnull(p);
	return p;
}

static void shuffle_ranges(struct ra_range *r, size_t n)
{
	for (size_t i = n; i > 1; i--) {
		size_t k = rnd_below(i);
		struct ra_range x = r[i - 1];

		r[i - 1] = r[k];
		r[k] = x;
	}
}

/*
 * Random requests over NF files of SPACE bytes: 1..64 ranks with sparse
 * ids, up to 10 ranges each, many empty, overlapping or taken from other
 * ranks, and about a third of the ranks replicas of an earlier one (the
 * same ranges in another order).
 */
#define NF    3
#define SPACE 1024u

static void gen_random(struct tin *t, uint64_t seed)
{
	uint32_t ids[64];
	size_t n_ranks;

	rnd_state = seed * 7919 + 1;
	n_ranks = 1 + rnd_below(64);
	t->n = 0;
	for (size_t i = 0; i < n_ranks; i++) {
		bool fresh;

		do {
			ids[i] = rnd_below(8) == 0 ? UINT32_MAX - (uint32_t)rnd_below(4)
						   : (uint32_t)rnd_below(100000);
			fresh = true;
			for (size_t k = 0; k < i; k++)
				fresh = fresh && ids[k] != ids[i];
		} while (!fresh);
	}
	for (size_t i = 0; i < n_ranks; i++) {
		size_t q = tin_req(t, ids[i]);

		if (i > 0 && rnd_below(3) == 0) {
			size_t src = rnd_below(i);

			for (size_t k = 0; k < t->nr[src]; k++)
				tin_add(t, q, t->r[src][k].file, t->r[src][k].begin,
					t->r[src][k].end);
			shuffle_ranges(t->r[q], t->nr[q]);
			continue;
		}
		for (size_t n = 1 + rnd_below(10); n > 0; n--) {
			uint32_t file = (uint32_t)rnd_below(NF);
			uint64_t b = rnd_below(SPACE), len = rnd_below(4) ? rnd_below(300) : 0;

			if (i > 0 && rnd_below(2) == 0) {
				/* Someone else's range, perhaps shifted. */
				size_t src = rnd_below(i);

				if (t->nr[src]) {
					const struct ra_range *x =
						&t->r[src][rnd_below(t->nr[src])];

					file = x->file;
					b = x->begin;
					len = x->end - x->begin;
					if (rnd_below(2))
						b += rnd_below(50);
				}
			}
			if (b > SPACE)
				b = SPACE;
			tin_add(t, q, file, b, b + len > SPACE ? SPACE : b + len);
		}
	}
}

/* ---- checking a plan against the bytes each rank asked for ----
 *
 * want[f][b] has bit i set iff the i-th rank (of the ranks that want bytes,
 * ascending) wants byte b of file f.
 */
struct truth {
	uint32_t ids[64];
	size_t n_ids;
	uint64_t want[NF][SPACE];
};

static int bit_of(const struct truth *tr, uint32_t id)
{
	for (size_t i = 0; i < tr->n_ids; i++)
		if (tr->ids[i] == id)
			return (int)i;
	return -1;
}

static void make_truth(const struct tin *t, struct truth *tr)
{
	memset(tr, 0, sizeof(*tr));
	for (size_t i = 0; i < t->n; i++) {
		bool has = false;

		for (size_t k = 0; k < t->nr[i]; k++)
			has = has || t->r[i][k].end > t->r[i][k].begin;
		if (!has || bit_of(tr, t->rank[i]) >= 0)
			continue;
		expect_op(tr->n_ids, <, 64);
		tr->ids[tr->n_ids++] = t->rank[i];
	}
	/* Ascending, as the plan numbers them. */
	for (size_t i = 1; i < tr->n_ids; i++)
		for (size_t k = i; k > 0 && tr->ids[k - 1] > tr->ids[k]; k--) {
			uint32_t x = tr->ids[k];

			tr->ids[k] = tr->ids[k - 1];
			tr->ids[k - 1] = x;
		}
	for (size_t i = 0; i < t->n; i++) {
		int bit = bit_of(tr, t->rank[i]);

		for (size_t k = 0; k < t->nr[i]; k++)
			for (uint64_t b = t->r[i][k].begin; b < t->r[i][k].end; b++)
				tr->want[t->r[i][k].file][b] |= 1ull << bit;
	}
}

static uint64_t rsize(const struct ra_region *g)
{
	return g->end - g->begin;
}

/* Checks the regions: sorted, disjoint, each wanted by one fixed set that
 * its reader belongs to, together exactly the wanted bytes, as large as
 * allowed. */
static void check_regions(const struct ra_plan *p, const struct truth *tr, uint64_t max_region)
{
	static uint8_t cover[NF][SPACE];
	const struct ra_region *g;
	size_t n = ra_plan_regions(p, &g);

	memset(cover, 0, sizeof(cover));
	for (size_t j = 0; j < n; j++) {
		uint64_t mask;
		int bit = bit_of(tr, g[j].reader);

		expect_op(g[j].file, <, NF);
		expect_op(g[j].begin, <, g[j].end);
		expect_op(g[j].end, <=, SPACE);
		if (j > 0)
			expect_msg(g[j - 1].file < g[j].file ||
				   (g[j - 1].file == g[j].file && g[j - 1].end <= g[j].begin),
				   "regions %zu and %zu out of order or overlapping", j - 1, j);
		mask = tr->want[g[j].file][g[j].begin];
		expect_msg(mask != 0, "region %zu is wanted by nobody", j);
		for (uint64_t b = g[j].begin; b < g[j].end; b++) {
			expect_msg(tr->want[g[j].file][b] == mask,
				   "region %zu: byte %llu wanted by another set", j,
				   (unsigned long long)b);
			cover[g[j].file][b]++;
		}
		expect_msg(bit >= 0 && (mask >> bit & 1), "region %zu: reader %u does not want it",
			   j, g[j].reader);
		expect_op(g[j].n_wanting, ==, (unsigned)__builtin_popcountll(mask));
		if (max_region)
			expect_op((g[j].end - 1) / max_region, ==, g[j].begin / max_region);
		/* Maximal: a neighbour wanted by the same set is only there
		 * because of a max_region cut. */
		if (j > 0 && g[j - 1].file == g[j].file && g[j - 1].end == g[j].begin &&
		    tr->want[g[j].file][g[j - 1].begin] == mask)
			expect_msg(max_region && g[j].begin % max_region == 0,
				   "regions %zu and %zu should be one", j - 1, j);
	}
	for (unsigned f = 0; f < NF; f++)
		for (unsigned b = 0; b < SPACE; b++)
			expect_msg(cover[f][b] == (tr->want[f][b] != 0),
				   "file %u byte %u: in %u regions, wanted by %#llx", f, b,
				   cover[f][b], (unsigned long long)tr->want[f][b]);
}

/* Checks one rank's view: its spans are exactly its bytes, tiled by the
 * regions; what it reads and what it receives add up to its bytes. */
static void check_rank(const struct ra_plan *p, const struct truth *tr, size_t bit)
{
	const struct ra_region *g;
	size_t n_regions = ra_plan_regions(p, &g), n_spans = 0, n_reads = 0;
	uint64_t wanted = 0, read = 0;
	struct ra_rank v;

	expect_int(ra_plan_rank(p, tr->ids[bit], &v), 0);
	expect_op(v.rank, ==, tr->ids[bit]);
	for (unsigned f = 0; f < NF; f++)
		for (unsigned b = 0; b < SPACE; b++) {
			bool in = tr->want[f][b] >> bit & 1;
			const struct ra_span *s;

			wanted += in;
			if (!in || (b > 0 && (tr->want[f][b - 1] >> bit & 1)))
				continue;
			/* A run of this rank's bytes begins: the next span. */
			expect_op(n_spans, <, v.n_spans);
			s = &v.spans[n_spans++];
			expect_op(s->file, ==, f);
			expect_op(s->begin, ==, b);
			expect_op(s->rank, ==, tr->ids[bit]);
			expect_op(s->count, >=, 1);
			expect_op((uint64_t)s->first + s->count, <=, n_regions);
			for (uint32_t k = s->first; k < s->first + s->count; k++) {
				expect_op(g[k].file, ==, f);
				expect_op(g[k].begin, ==, k == s->first ? s->begin : g[k - 1].end);
				if (g[k].reader == v.rank) {
					expect_op(n_reads, <, v.n_reads);
					expect_op(v.reads[n_reads++], ==, k);
					read += rsize(&g[k]);
				} else {
					/* Received from a rank that wants it. */
					int from = bit_of(tr, g[k].reader);

					expect(from >= 0 && (tr->want[f][g[k].begin] >> from & 1));
				}
			}
			expect_op(g[s->first + s->count - 1].end, ==, s->end);
			expect(s->end == SPACE || !(tr->want[f][s->end] >> bit & 1));
		}
	expect_op(n_spans, ==, v.n_spans);
	expect_op(n_reads, ==, v.n_reads);
	expect_op(v.bytes_wanted, ==, wanted);
	expect_op(v.bytes_read, ==, read);
}

/* For each rank, the last region it reads: no rank that wants it had read
 * fewer bytes (so none has fewer at the end). */
static void check_greedy(const struct ra_plan *p)
{
	const struct ra_region *g;
	const uint32_t *ids;
	size_t n_ranks = ra_plan_ranks(p, &ids);
	uint32_t *who = malloc((n_ranks ? n_ranks : 1) * sizeof(*who));

	ra_plan_regions(p, &g);
	ck_assert_ptr_nonnull(who);
	for (size_t i = 0; i < n_ranks; i++) {
		struct ra_rank v, w;
		uint32_t last;
		int n;

		expect_int(ra_plan_rank(p, ids[i], &v), 0);
		if (v.n_reads == 0)
			continue;
		last = v.reads[v.n_reads - 1];
		n = ra_plan_wanting(p, last, who, n_ranks);
		expect_int(n, (int)g[last].n_wanting);
		for (int k = 0; k < n; k++) {
			expect_int(ra_plan_rank(p, who[k], &w), 0);
			expect_msg(v.bytes_read <= w.bytes_read + rsize(&g[last]),
				   "rank %u reads %llu, rank %u %llu, region %u has %llu", v.rank,
				   (unsigned long long)v.bytes_read, w.rank,
				   (unsigned long long)w.bytes_read, last,
				   (unsigned long long)rsize(&g[last]));
		}
	}
	free(who);
}

static void check_plan(struct tin *t, const struct ra_plan *p, uint64_t max_region)
{
	static struct truth tr;
	const struct ra_region *g;
	const uint32_t *ids;
	size_t n_regions = ra_plan_regions(p, &g);
	uint32_t who[64];

	make_truth(t, &tr);
	check_regions(p, &tr, max_region);

	expect_op(ra_plan_ranks(p, &ids), ==, tr.n_ids);
	for (size_t i = 0; i < tr.n_ids; i++) {
		expect_op(ids[i], ==, tr.ids[i]);
		check_rank(p, &tr, i);
	}
	for (size_t i = 0; i < t->n; i++) {
		struct ra_rank v;

		if (bit_of(&tr, t->rank[i]) < 0)
			expect_int(ra_plan_rank(p, t->rank[i], &v), -ENOENT);
	}

	/* Who wants each region, as the truth says. */
	for (size_t j = 0; j < n_regions; j++) {
		uint64_t mask = tr.want[g[j].file][g[j].begin];
		int n = ra_plan_wanting(p, (uint32_t)j, who, 64), k = 0;

		expect_int(n, (int)g[j].n_wanting);
		for (size_t i = 0; i < tr.n_ids; i++)
			if (mask >> i & 1) {
				expect_op(k, <, n);
				expect_op(who[k++], ==, tr.ids[i]);
			}
		expect_int(k, n);
		expect_int(ra_plan_wanting(p, (uint32_t)j, who, g[j].n_wanting - 1), -ERANGE);
	}
	expect_int(ra_plan_wanting(p, (uint32_t)n_regions, who, 64), -EINVAL);

	/* Every range as given maps to the regions that serve it. */
	for (size_t i = 0; i < t->n; i++)
		for (size_t k = 0; k < t->nr[i]; k++) {
			const struct ra_range *r = &t->r[i][k];
			uint32_t first = 7, count = 7;

			expect_int(ra_plan_find(p, r->file, r->begin, r->end, &first, &count), 0);
			if (r->begin == r->end) {
				expect_op(count, ==, 0);
				continue;
			}
			expect_op(count, >=, 1);
			expect_op(g[first].file, ==, r->file);
			expect_op(g[first].begin, <=, r->begin);
			expect_op(g[first].end, >, r->begin);
			for (uint32_t x = first + 1; x < first + count; x++)
				expect_op(g[x].begin, ==, g[x - 1].end);
			expect_op(g[first + count - 1].end, >=, r->end);
			expect_op(g[first + count - 1].begin, <, r->end);
		}
	/* And a byte nobody wants maps to nothing. */
	for (unsigned f = 0; f < NF; f++)
		for (unsigned b = 0; b < SPACE; b++)
			if (!tr.want[f][b]) {
				uint32_t first = 7, count = 7;

				expect_int(ra_plan_find(p, f, b, b + 1, &first, &count), -ENOENT);
				expect_op(first, ==, 7);
				f = NF;
				break;
			}
	check_greedy(p);
}

/* ---- hand-worked cases ---- */

START_TEST(test_exact)
{
	struct tin t = { 0 };
	struct ra_plan *p;
	const struct ra_region *g;
	struct ra_rank v;
	uint32_t who[4], first = 0, count = 0;
	size_t q;

	tin_add(&t, tin_req(&t, 7), 0, 0, 100);
	tin_add(&t, tin_req(&t, 3), 0, 50, 150);
	q = tin_req(&t, 5);
	tin_add(&t, q, 1, 0, 10);
	tin_add(&t, q, 0, 50, 100);
	p = assign(&t, 0);

	/* [0,50) only rank 7 wants; [50,100) all three, and rank 3 has read
	 * nothing yet; [100,150) only 3; file 1 only 5. */
	ck_assert_uint_eq(ra_plan_regions(p, &g), 4);
	static const struct ra_region want[] = {
		{ 0, 50, 0, 7, 1 }, { 50, 100, 0, 3, 3 }, { 100, 150, 0, 3, 1 }, { 0, 10, 1, 5, 1 },
	};
	for (int j = 0; j < N(want); j++) {
		ck_assert_uint_eq(g[j].begin, want[j].begin);
		ck_assert_uint_eq(g[j].end, want[j].end);
		ck_assert_uint_eq(g[j].file, want[j].file);
		ck_assert_uint_eq(g[j].reader, want[j].reader);
		ck_assert_uint_eq(g[j].n_wanting, want[j].n_wanting);
	}

	ck_assert_int_eq(ra_plan_rank(p, 3, &v), 0);
	ck_assert_uint_eq(v.bytes_wanted, 100);
	ck_assert_uint_eq(v.bytes_read, 100);
	ck_assert_uint_eq(v.n_spans, 1);
	ck_assert_uint_eq(v.spans[0].first, 1);
	ck_assert_uint_eq(v.spans[0].count, 2);
	ck_assert_uint_eq(v.n_reads, 2);
	ck_assert_uint_eq(v.reads[0], 1);
	ck_assert_uint_eq(v.reads[1], 2);

	ck_assert_int_eq(ra_plan_rank(p, 5, &v), 0);
	ck_assert_uint_eq(v.bytes_wanted, 60);
	ck_assert_uint_eq(v.bytes_read, 10);
	ck_assert_uint_eq(v.n_spans, 2);
	ck_assert_uint_eq(v.spans[0].file, 0);
	ck_assert_uint_eq(v.spans[0].first, 1);
	ck_assert_uint_eq(v.spans[0].count, 1);
	ck_assert_uint_eq(v.spans[1].file, 1);
	ck_assert_uint_eq(v.spans[1].first, 3);
	ck_assert_uint_eq(v.n_reads, 1);
	ck_assert_uint_eq(v.reads[0], 3);

	ck_assert_int_eq(ra_plan_rank(p, 7, &v), 0);
	ck_assert_uint_eq(v.bytes_read, 50);
	ck_assert_uint_eq(v.spans[0].first, 0);
	ck_assert_uint_eq(v.spans[0].count, 2);
	ck_assert_int_eq(ra_plan_rank(p, 4, &v), -ENOENT);

	ck_assert_int_eq(ra_plan_wanting(p, 1, who, 4), 3);
	ck_assert_uint_eq(who[0], 3);
	ck_assert_uint_eq(who[1], 5);
	ck_assert_uint_eq(who[2], 7);
	ck_assert_int_eq(ra_plan_wanting(p, 1, who, 2), -ERANGE);
	ck_assert_int_eq(ra_plan_wanting(p, 4, who, 4), -EINVAL);

	ck_assert_int_eq(ra_plan_find(p, 0, 20, 120, &first, &count), 0);
	ck_assert_uint_eq(first, 0);
	ck_assert_uint_eq(count, 3);
	ck_assert_int_eq(ra_plan_find(p, 0, 150, 150, &first, &count), 0);
	ck_assert_uint_eq(count, 0);
	first = count = 9;
	ck_assert_int_eq(ra_plan_find(p, 0, 140, 160, &first, &count), -ENOENT);
	ck_assert_int_eq(ra_plan_find(p, 2, 0, 1, &first, &count), -ENOENT);
	ck_assert_int_eq(ra_plan_find(p, 0, 10, 5, &first, &count), -EINVAL);
	ck_assert_uint_eq(first, 9);
	ck_assert_uint_eq(count, 9);
	ra_plan_free(p);
	tin_free(&t);
}
END_TEST

/* Touching and overlapping ranges of one rank make one region; a change of
 * the wanting set makes a cut; max_region cuts on its grid. */
START_TEST(test_join_and_cut)
{
	struct tin t = { 0 };
	struct ra_plan *p;
	const struct ra_region *g;
	size_t q;

	q = tin_req(&t, 1);
	tin_add(&t, q, 0, 10, 20);
	tin_add(&t, q, 0, 0, 10);
	tin_add(&t, q, 0, 5, 8);
	tin_add(&t, q, 0, 20, 30);
	tin_add(&t, tin_req(&t, 2), 0, 0, 20);
	p = assign(&t, 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 2);
	ck_assert_uint_eq(g[0].begin, 0);
	ck_assert_uint_eq(g[0].end, 20);
	ck_assert_uint_eq(g[0].n_wanting, 2);
	ck_assert_uint_eq(g[0].reader, 1);
	ck_assert_uint_eq(g[1].begin, 20);
	ck_assert_uint_eq(g[1].end, 30);
	ck_assert_uint_eq(g[1].n_wanting, 1);
	ck_assert_uint_eq(g[1].reader, 1);
	ra_plan_free(p);
	tin_free(&t);

	/* The same bytes in two files stay two regions. */
	tin_add(&t, tin_req(&t, 1), 0, 0, 10);
	tin_add(&t, tin_req(&t, 1), 1, 0, 10);
	p = assign(&t, 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 2);
	ra_plan_free(p);
	tin_free(&t);

	/* Grid cuts at absolute multiples; the two readers alternate, each
	 * region to whoever has read less. */
	tin_add(&t, tin_req(&t, 1), 0, 10, 300);
	tin_add(&t, tin_req(&t, 2), 0, 10, 300);
	p = assign(&t, 100);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 3);
	ck_assert_uint_eq(g[0].begin, 10);
	ck_assert_uint_eq(g[0].end, 100);
	ck_assert_uint_eq(g[0].reader, 1);
	ck_assert_uint_eq(g[1].end, 200);
	ck_assert_uint_eq(g[1].reader, 2);
	ck_assert_uint_eq(g[2].end, 300);
	ck_assert_uint_eq(g[2].reader, 1); /* 90 bytes against 100 */
	ra_plan_free(p);
	tin_free(&t);
}
END_TEST

START_TEST(test_empty)
{
	struct tin t = { 0 };
	struct ra_plan *p = NULL;
	const struct ra_region *g;
	const uint32_t *ids;
	struct ra_rank v;
	uint32_t first, count;

	ck_assert_int_eq(ra_assign(NULL, 0, 0, &p, NULL, 0), 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 0);
	ck_assert_uint_eq(ra_plan_ranks(p, &ids), 0);
	ck_assert_int_eq(ra_plan_rank(p, 0, &v), -ENOENT);
	ck_assert_int_eq(ra_plan_find(p, 0, 0, 1, &first, &count), -ENOENT);
	ck_assert_int_eq(ra_plan_find(p, 0, 5, 5, &first, &count), 0);
	ck_assert_uint_eq(count, 0);
	ra_plan_free(p);

	/* Ranks with only empty ranges (or none) want nothing. */
	tin_add(&t, tin_req(&t, 4), 0, 7, 7);
	tin_req(&t, 5);
	p = assign(&t, 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 0);
	ck_assert_uint_eq(ra_plan_ranks(p, &ids), 0);
	ck_assert_int_eq(ra_plan_rank(p, 4, &v), -ENOENT);
	ra_plan_free(p);
	ra_plan_free(NULL);
	tin_free(&t);
}
END_TEST

/* ---- random requests against the byte-level truth ---- */

START_TEST(test_random)
{
	static const uint64_t caps[] = { 0, 0, 64, 100, 1 };
	struct tin t = { 0 };
	struct ra_plan *p;
	uint64_t max_region = caps[_i % N(caps)];

	gen_random(&t, (uint64_t)_i);
	p = assign(&t, max_region);
	check_plan(&t, p, max_region);
	ra_plan_free(p);
	tin_free(&t);
}
END_TEST

/* ---- determinism ---- */

static void assert_same(const struct ra_plan *a, const struct ra_plan *b, const char *what)
{
	const struct ra_region *ga, *gb;
	const uint32_t *ia, *ib;
	size_t n = ra_plan_regions(a, &ga), n_ranks = ra_plan_ranks(a, &ia);

	expect_msg(ra_plan_regions(b, &gb) == n, "%s: region count differs", what);
	for (size_t j = 0; j < n; j++)
		expect_msg(ga[j].file == gb[j].file && ga[j].begin == gb[j].begin &&
			   ga[j].end == gb[j].end && ga[j].reader == gb[j].reader &&
			   ga[j].n_wanting == gb[j].n_wanting,
			   "%s: region %zu differs", what, j);
	expect_msg(ra_plan_ranks(b, &ib) == n_ranks, "%s: rank count differs", what);
	for (size_t i = 0; i < n_ranks; i++) {
		struct ra_rank va, vb;

		expect_op(ia[i], ==, ib[i]);
		expect_int(ra_plan_rank(a, ia[i], &va), 0);
		expect_int(ra_plan_rank(b, ia[i], &vb), 0);
		expect_msg(va.bytes_wanted == vb.bytes_wanted && va.bytes_read == vb.bytes_read &&
			   va.n_spans == vb.n_spans && va.n_reads == vb.n_reads,
			   "%s: rank %u differs", what, ia[i]);
		for (size_t k = 0; k < va.n_spans; k++)
			expect_msg(va.spans[k].file == vb.spans[k].file &&
				   va.spans[k].begin == vb.spans[k].begin &&
				   va.spans[k].end == vb.spans[k].end &&
				   va.spans[k].first == vb.spans[k].first &&
				   va.spans[k].count == vb.spans[k].count,
				   "%s: rank %u span %zu differs", what, ia[i], k);
		for (size_t k = 0; k < va.n_reads; k++)
			expect_op(va.reads[k], ==, vb.reads[k]);
	}
}

/* A range of at least two bytes of some request (its number in *ret_q), or
 * NULL. */
static struct ra_range *some_range(struct tin *t, size_t *ret_q)
{
	for (int tries = 0; tries < 100; tries++) {
		size_t q = rnd_below(t->n);

		if (t->nr[q] == 0)
			continue;
		struct ra_range *r = &t->r[q][rnd_below(t->nr[q])];

		if (r->end - r->begin >= 2) {
			*ret_q = q;
			return r;
		}
	}
	return NULL;
}

enum variant {
	V_PERMUTE_REQS,
	V_PERMUTE_RANGES,
	V_SPLIT,
	V_DUPLICATE,
	V_OVERLAP,
	V_SPLIT_RANK,
	V_EMPTY_RANK,
	V_ALL,
	V_COUNT
};

static const char *const variant_names[] = {
	"permuted requests", "permuted ranges", "a range split in two", "a duplicate range",
	"an overlapping range", "a rank in two requests", "a rank with empty ranges",
	"all at once",
};

/* Changes t in a way that keeps the set of (rank, byte) pairs. */
static void apply(struct tin *t, enum variant v)
{
	struct ra_range *r, x;
	size_t q;

	switch (v) {
	case V_PERMUTE_REQS:
		for (size_t i = t->n; i > 1; i--) {
			size_t k = rnd_below(i);
			uint32_t rk = t->rank[i - 1];
			struct ra_range *rr = t->r[i - 1];
			size_t nr = t->nr[i - 1];

			t->rank[i - 1] = t->rank[k];
			t->r[i - 1] = t->r[k];
			t->nr[i - 1] = t->nr[k];
			t->rank[k] = rk;
			t->r[k] = rr;
			t->nr[k] = nr;
		}
		break;
	case V_PERMUTE_RANGES:
		for (size_t i = 0; i < t->n; i++)
			shuffle_ranges(t->r[i], t->nr[i]);
		break;
	case V_SPLIT:
		r = some_range(t, &q);
		if (r) {
			uint64_t mid = r->begin + 1 + rnd_below(r->end - r->begin - 1);

			x = *r;
			r->end = mid;
			tin_add(t, q, x.file, mid, x.end);
		}
		break;
	case V_DUPLICATE:
		r = some_range(t, &q);
		if (r) {
			x = *r;
			tin_add(t, q, x.file, x.begin, x.end);
		}
		break;
	case V_OVERLAP:
		r = some_range(t, &q);
		if (r) {
			x = *r;
			tin_add(t, q, x.file, x.begin + 1, x.end);
		}
		break;
	case V_SPLIT_RANK:
		q = rnd_below(t->n);
		if (t->nr[q] >= 2) {
			size_t q2 = tin_req(t, t->rank[q]);

			x = t->r[q][--t->nr[q]];
			tin_add(t, q2, x.file, x.begin, x.end);
		}
		break;
	case V_EMPTY_RANK:
		tin_add(t, tin_req(t, 123456789), 1, 5, 5);
		break;
	case V_ALL:
		for (int k = 0; k < V_ALL; k++)
			apply(t, (enum variant)(V_ALL - 1 - k));
		break;
	case V_COUNT:
		break;
	}
}

START_TEST(test_determinism)
{
	uint64_t max_region = _i % 2 ? 100 : 0;
	struct tin base = { 0 };
	struct ra_plan *pb;

	gen_random(&base, 1000 + (uint64_t)_i);
	pb = assign(&base, max_region);
	for (int v = 0; v < V_COUNT; v++) {
		struct tin t = { 0 };
		struct ra_plan *p;

		tin_copy(&t, &base);
		apply(&t, (enum variant)v);
		p = assign(&t, max_region);
		assert_same(pb, p, variant_names[v]);
		ra_plan_free(p);
		tin_free(&t);
	}
	ra_plan_free(pb);
	tin_free(&base);
}
END_TEST

/* ---- balance ---- */

/* k replicas wanting the same bytes (which nobody else wants): their reads
 * differ by at most the largest region, and the largest read is at most
 * bytes / k + the largest region. */
static void check_replicas(const struct ra_plan *p, const uint32_t *ids, size_t k,
			   uint64_t *ret_max)
{
	const struct ra_region *g;
	size_t n = ra_plan_regions(p, &g);
	uint64_t total = 0, largest = 0, lo = UINT64_MAX, hi = 0, sum = 0;

	for (size_t i = 0; i < k; i++) {
		struct ra_rank v;

		expect_int(ra_plan_rank(p, ids[i], &v), 0);
		total = v.bytes_wanted;
		for (size_t s = 0; s < v.n_spans; s++)
			for (uint32_t j = v.spans[s].first; j < v.spans[s].first + v.spans[s].count;
			     j++) {
				expect_op(g[j].n_wanting, ==, k);
				if (rsize(&g[j]) > largest)
					largest = rsize(&g[j]);
			}
		lo = v.bytes_read < lo ? v.bytes_read : lo;
		hi = v.bytes_read > hi ? v.bytes_read : hi;
		sum += v.bytes_read;
	}
	(void)n;
	expect_op(sum, ==, total);
	expect_msg(hi - lo <= largest, "reads from %llu to %llu, largest region %llu",
		   (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)largest);
	expect_msg(k * hi <= total + k * largest, "largest read %llu of %llu bytes over %zu ranks",
		   (unsigned long long)hi, (unsigned long long)total, k);
	if (ret_max)
		*ret_max = hi;
}

/* 8 replicas want the same 1 GiB as 64 ranges of 16 MiB. */
START_TEST(test_replicas_1gib)
{
	const uint32_t ids[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	const uint64_t eighth = (1ull << 30) / 8;
	struct tin t = { 0 };
	struct ra_plan *p;
	const struct ra_region *g;
	struct ra_rank v;
	uint64_t hi;

	rnd_state = 42;
	/* With gaps between the ranges: 64 regions, 8 for each rank. */
	for (uint32_t r = 0; r < 8; r++) {
		size_t q = tin_req(&t, ids[r]);

		for (uint64_t k = 0; k < 64; k++)
			tin_add(&t, q, (uint32_t)(k % 4), k / 4 * 32 * MiB,
				k / 4 * 32 * MiB + 16 * MiB);
		shuffle_ranges(t.r[q], t.nr[q]);
	}
	p = assign(&t, 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 64);
	check_replicas(p, ids, 8, &hi);
	ck_assert_uint_eq(hi, eighth);
	for (uint32_t r = 0; r < 8; r++) {
		ck_assert_int_eq(ra_plan_rank(p, r, &v), 0);
		ck_assert_uint_eq(v.bytes_read, eighth);
		ck_assert_uint_eq(v.n_reads, 8);
	}
	ra_plan_free(p);
	tin_free(&t);

	/* Back to back: one region, which max_region cuts. */
	for (uint32_t r = 0; r < 8; r++) {
		size_t q = tin_req(&t, ids[r]);

		for (uint64_t k = 0; k < 64; k++)
			tin_add(&t, q, 0, k * 16 * MiB, (k + 1) * 16 * MiB);
		shuffle_ranges(t.r[q], t.nr[q]);
	}
	p = assign(&t, 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 1);
	ck_assert_uint_eq(g[0].reader, 0);
	ck_assert_uint_eq(g[0].n_wanting, 8);
	ra_plan_free(p);

	p = assign(&t, 64 * MiB);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 16);
	check_replicas(p, ids, 8, &hi);
	ck_assert_uint_eq(hi, eighth);
	ra_plan_free(p);

	/* A max_region that does not divide: 21 regions of 48 MiB and one
	 * of 16 MiB; within the bound, not exact. */
	p = assign(&t, 48 * MiB);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 22);
	check_replicas(p, ids, 8, &hi);
	ra_plan_free(p);
	tin_free(&t);

	/* Uneven tensors, 1..32 MiB, with gaps. */
	for (uint32_t r = 0; r < 8; r++)
		tin_req(&t, ids[r]);
	for (uint64_t k = 0, pos = 0; k < 64; k++) {
		uint64_t len = (1 + rnd_below(32)) * MiB;

		for (uint32_t r = 0; r < 8; r++)
			tin_add(&t, r, 0, pos, pos + len);
		pos += len + MiB;
	}
	for (uint32_t r = 0; r < 8; r++)
		shuffle_ranges(t.r[r], t.nr[r]);
	p = assign(&t, 0);
	check_replicas(p, ids, 8, NULL);
	ra_plan_free(p);
	tin_free(&t);
}
END_TEST

/*
 * Random groups of replicas, each group on files of its own: the replica
 * bound holds in every group.  Then the same requests with ranks that want
 * a bit of every group's files: the general rule (check_greedy) holds.
 */
START_TEST(test_balance_random)
{
	struct tin t = { 0 };
	struct ra_plan *p;
	size_t n_groups, k[6];
	uint32_t ids[6][10], next = 0;

	rnd_state = 5000 + (uint64_t)_i;
	n_groups = 1 + rnd_below(6);
	for (size_t gi = 0; gi < n_groups; gi++) {
		size_t first = t.n, n_ranges = 1 + rnd_below(20);

		k[gi] = 1 + rnd_below(10);
		for (size_t i = 0; i < k[gi]; i++) {
			ids[gi][i] = next;
			next += 1 + (uint32_t)rnd_below(3);
			tin_req(&t, ids[gi][i]);
		}
		for (size_t r = 0; r < n_ranges; r++) {
			uint32_t file = (uint32_t)(2 * gi + rnd_below(2));
			uint64_t b = rnd_below(1000) * 4096, len = (1 + rnd_below(100)) * 4096;

			for (size_t i = 0; i < k[gi]; i++)
				tin_add(&t, first + i, file, b, b + len);
		}
		for (size_t i = 0; i < k[gi]; i++)
			shuffle_ranges(t.r[first + i], t.nr[first + i]);
	}
	p = assign(&t, _i % 3 ? 0 : 64 * 4096);
	for (size_t gi = 0; gi < n_groups; gi++)
		check_replicas(p, ids[gi], k[gi], NULL);
	check_greedy(p);
	ra_plan_free(p);

	for (int x = 0; x < 4; x++) {
		size_t q = tin_req(&t, 1000 + (uint32_t)x);

		for (size_t gi = 0; gi < n_groups; gi++) {
			uint64_t b = rnd_below(1000) * 4096;

			tin_add(&t, q, (uint32_t)(2 * gi), b, b + (1 + rnd_below(200)) * 4096);
		}
	}
	p = assign(&t, 0);
	check_greedy(p);
	ra_plan_free(p);
	tin_free(&t);
}
END_TEST

/* ---- errors and caps ---- */

struct bad_case {
	const char *what;
	size_t n_reqs;
	bool null_reqs;
	size_t n_ranges[2];
	bool null_ranges[2];
	struct ra_range ranges[2][2];
	uint64_t max_region;
	int want;
};

#define HALF (1ull << 63)

static const struct bad_case bad_cases[] = {
	{ "end before begin", 1, false, { 1 }, { false }, { { { 0, 10, 5 } } }, 0, -EINVAL },
	{ "end before begin, second range", 1, false, { 2 }, { false },
	  { { { 0, 0, 10 }, { 1, 20, 19 } } }, 0, -EINVAL },
	{ "end before begin, second request", 2, false, { 1, 1 }, { false },
	  { { { 0, 0, 10 } }, { { 0, 1, 0 } } }, 0, -EINVAL },
	{ "no range array", 1, false, { 2 }, { true }, { { { 0 } } }, 0, -EINVAL },
	{ "no request array", 1, true, { 0 }, { false }, { { { 0 } } }, 0, -EINVAL },
	{ "too many ranges", 1, false, { RA_MAX_RANGES + 1 }, { false }, { { { 0 } } }, 0, -E2BIG },
	{ "too many ranges in all", 2, false, { RA_MAX_RANGES / 2 + 1, RA_MAX_RANGES / 2 },
	  { false }, { { { 0 } } }, 0, -E2BIG },
	{ "a count that would wrap", 2, false, { 1, SIZE_MAX }, { false }, { { { 0 } } }, 0,
	  -E2BIG },
	/* The cap is checked first, wherever the bad range is. */
	{ "too many ranges and a bad range", 2, false, { 1, RA_MAX_RANGES }, { false },
	  { { { 0, 10, 5 } } }, 0, -E2BIG },
	{ "2^64 bytes", 1, false, { 2 }, { false }, { { { 0, 0, HALF }, { 1, 0, HALF } } }, 0,
	  -EOVERFLOW },
	{ "2^64 bytes over two ranks", 2, false, { 1, 1 }, { false },
	  { { { 0, 0, HALF } }, { { 0, 0, HALF } } }, 0, -EOVERFLOW },
	{ "too many regions", 1, false, { 1 }, { false }, { { { 0, 0, RA_MAX_REGIONS + 1ull } } },
	  1, -E2BIG },
	{ "nearly 2^64 regions", 1, false, { 2 }, { false },
	  { { { 0, 0, 1 }, { 1, 1, UINT64_MAX } } }, 1, -E2BIG },
};

START_TEST(test_bad)
{
	const struct bad_case *c = &bad_cases[_i];
	struct ra_request reqs[2];
	struct ra_plan *sentinel = (struct ra_plan *)&reqs, *p = sentinel;
	char err[256] = "";

	for (size_t i = 0; i < 2; i++)
		reqs[i] = (struct ra_request){ .rank = (uint32_t)i,
					       .ranges = c->null_ranges[i] ? NULL : c->ranges[i],
					       .n_ranges = c->n_ranges[i] };
	ck_assert_int_eq(ra_assign(c->null_reqs ? NULL : reqs, c->n_reqs, c->max_region, &p, err,
				   sizeof(err)),
			 c->want);
	ck_assert_msg(err[0] != '\0', "%s: no reason given", c->what);
	ck_assert_ptr_eq(p, sentinel);
	/* No err buffer: the same answer. */
	ck_assert_int_eq(ra_assign(c->null_reqs ? NULL : reqs, c->n_reqs, c->max_region, &p, NULL,
				   0),
			 c->want);
}
END_TEST

/* Good inputs at the edges of the caps. */
START_TEST(test_edges)
{
	struct ra_plan *p = NULL;
	const struct ra_region *g;
	struct ra_range whole = { 0, 0, UINT64_MAX };
	struct ra_range half[2] = { { 0, 0, HALF - 1 }, { 1, 0, HALF } };
	struct ra_request r = { 9, &whole, 1 };

	/* All of a 2^64 - 1 byte file. */
	ck_assert_int_eq(ra_assign(&r, 1, 0, &p, NULL, 0), 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 1);
	ck_assert_uint_eq(g[0].end, UINT64_MAX);
	ra_plan_free(p);
	/* Cut near the top of the offsets without overflowing. */
	ck_assert_int_eq(ra_assign(&r, 1, HALF, &p, NULL, 0), 0);
	ck_assert_uint_eq(ra_plan_regions(p, &g), 2);
	ck_assert_uint_eq(g[0].end, HALF);
	ck_assert_uint_eq(g[1].end, UINT64_MAX);
	ra_plan_free(p);
	/* 2^64 - 1 bytes in all. */
	r.ranges = half;
	r.n_ranges = 2;
	ck_assert_int_eq(ra_assign(&r, 1, 0, &p, NULL, 0), 0);
	ra_plan_free(p);
}
END_TEST

/* RA_MAX_RANKS ranks that want bytes are fine, one more is not; ranks given
 * twice count once and ranks that want nothing do not count. */
START_TEST(test_rank_cap)
{
	size_t n = RA_MAX_RANKS + 1;
	struct ra_request *reqs = calloc(n, sizeof(*reqs));
	struct ra_range *ranges = calloc(n, sizeof(*ranges));
	struct ra_plan *p = NULL;
	const uint32_t *ids;
	char err[256] = "";

	ck_assert(reqs && ranges);
	for (size_t i = 0; i < n; i++) {
		ranges[i] = (struct ra_range){ (uint32_t)(i % 7), i * 10, i * 10 + 10 };
		reqs[i] = (struct ra_request){ (uint32_t)i * 3, &ranges[i], 1 };
	}
	ck_assert_int_eq(ra_assign(reqs, n, 0, &p, err, sizeof(err)), -E2BIG);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(ra_assign(reqs, n - 1, 0, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(ra_plan_ranks(p, &ids), RA_MAX_RANKS);
	ra_plan_free(p);
	p = NULL;

	reqs[n - 1].rank = reqs[0].rank;
	ck_assert_int_eq(ra_assign(reqs, n, 0, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(ra_plan_ranks(p, &ids), RA_MAX_RANKS);
	ra_plan_free(p);
	p = NULL;

	reqs[n - 1].rank = 7;
	ranges[n - 1].end = ranges[n - 1].begin;
	ck_assert_int_eq(ra_assign(reqs, n, 0, &p, err, sizeof(err)), 0);
	ra_plan_free(p);
	free(reqs);
	free(ranges);
}
END_TEST

/* ---- scale: 1,024 ranks x 512 ranges (not timed) ---- */

/* 8 tensor-parallel groups of 128 replicas: each group wants 480 ranges of
 * its own file, and every rank wants the same 32 ranges of a shared file. */
START_TEST(test_scale_replicas)
{
	enum { TP = 8, DP = 128, OWN = 480, SHARED = 32 };
	struct ra_range *all = malloc((size_t)TP * DP * (OWN + SHARED) * sizeof(*all));
	struct ra_request *reqs = malloc((size_t)TP * DP * sizeof(*reqs));
	uint64_t own_b[OWN], own_e[OWN], sh_b[SHARED], sh_e[SHARED], pos = 0;
	struct ra_plan *p = NULL;
	const struct ra_region *g;
	uint32_t ids[DP];
	char err[256] = "";
	int ret;

	expect(all && reqs);
	rnd_state = 77;
	for (int k = 0; k < OWN; k++) {
		own_b[k] = pos;
		own_e[k] = pos + (1 + rnd_below(16)) * MiB;
		pos = own_e[k] + MiB;
	}
	for (int k = 0, x = 0; k < SHARED; k++, x += 3) {
		sh_b[k] = (uint64_t)x * MiB;
		sh_e[k] = (uint64_t)(x + 2) * MiB;
	}
	for (uint32_t r = 0; r < TP * DP; r++) {
		struct ra_range *rr = all + (size_t)r * (OWN + SHARED);
		uint32_t tp = r % TP;

		for (int k = 0; k < OWN; k++)
			rr[k] = (struct ra_range){ tp, own_b[k], own_e[k] };
		for (int k = 0; k < SHARED; k++)
			rr[OWN + k] = (struct ra_range){ TP, sh_b[k], sh_e[k] };
		shuffle_ranges(rr, OWN + SHARED);
		reqs[r] = (struct ra_request){ r, rr, OWN + SHARED };
	}
	ret = ra_assign(reqs, TP * DP, 0, &p, err, sizeof(err));
	expect_msg(ret == 0, "%d: %s", ret, err);
	expect_op(ra_plan_regions(p, &g), ==, TP * OWN + SHARED);
	for (uint32_t tp = 0; tp < TP; tp++) {
		struct ra_rank v;
		uint64_t lo = UINT64_MAX, hi = 0;

		for (uint32_t i = 0; i < DP; i++) {
			ids[i] = tp + i * TP;
			expect_int(ra_plan_rank(p, ids[i], &v), 0);
			expect_op(v.n_spans, ==, OWN + SHARED);
			lo = v.bytes_read < lo ? v.bytes_read : lo;
			hi = v.bytes_read > hi ? v.bytes_read : hi;
		}
		/* 480 regions over 128 ranks (plus the shared ones): each
		 * reads 3 or 4 of its own group's; at most 16 MiB apart. */
		expect_op(hi - lo, <=, 16 * MiB + 2 * MiB);
	}
	check_greedy(p);
	ra_plan_free(p);
	free(all);
	free(reqs);
}
END_TEST

/* Every rank with its own random, overlapping ranges in one file: many
 * small regions with large wanting sets.  Checked by totals: every region
 * is read once, and the bytes wanted add up region by region. */
START_TEST(test_scale_random)
{
	enum { RANKS = 1024, PER = 512 };
	struct ra_range *all = malloc((size_t)RANKS * PER * sizeof(*all));
	struct ra_request *reqs = malloc(RANKS * sizeof(*reqs));
	struct ra_plan *p = NULL;
	const struct ra_region *g;
	const uint32_t *ids;
	uint64_t read = 0, wanted = 0, by_region = 0, bytes = 0;
	size_t n, n_reads = 0;
	char err[256] = "";
	int ret;

	expect(all && reqs);
	rnd_state = 99;
	for (uint32_t r = 0; r < RANKS; r++) {
		for (int k = 0; k < PER; k++) {
			uint32_t file = (uint32_t)rnd_below(4);
			uint64_t b = rnd_below(1ull << 30) & ~(uint64_t)4095;
			uint64_t len = (1 + rnd_below(64)) * 4096;

			all[(size_t)r * PER + k] = (struct ra_range){ file, b, b + len };
		}
		reqs[r] = (struct ra_request){ r * 2 + 1, all + (size_t)r * PER, PER };
	}
	ret = ra_assign(reqs, RANKS, 0, &p, err, sizeof(err));
	expect_msg(ret == 0, "%d: %s", ret, err);
	n = ra_plan_regions(p, &g);
	for (size_t j = 0; j < n; j++) {
		by_region += rsize(&g[j]) * g[j].n_wanting;
		bytes += rsize(&g[j]);
	}
	expect_op(ra_plan_ranks(p, &ids), ==, RANKS);
	for (size_t i = 0; i < RANKS; i++) {
		struct ra_rank v;

		expect_int(ra_plan_rank(p, ids[i], &v), 0);
		read += v.bytes_read;
		wanted += v.bytes_wanted;
		n_reads += v.n_reads;
		for (size_t k = 0; k < v.n_reads; k++)
			expect_op(g[v.reads[k]].reader, ==, v.rank);
	}
	expect_op(n_reads, ==, n);
	expect_op(read, ==, bytes);
	expect_op(wanted, ==, by_region);
	check_greedy(p);
	ra_plan_free(p);
	free(all);
	free(reqs);
}
END_TEST

static Suite *readassign_suite(void)
{
	Suite *s = suite_create("readassign");
	TCase *tc;

	tc = tcase_create("exact");
	tcase_add_test(tc, test_exact);
	tcase_add_test(tc, test_join_and_cut);
	tcase_add_test(tc, test_empty);
	suite_add_tcase(s, tc);
	tc = tcase_create("random");
	tcase_add_loop_test(tc, test_random, 0, 200);
	suite_add_tcase(s, tc);
	tc = tcase_create("determinism");
	tcase_add_loop_test(tc, test_determinism, 0, 60);
	suite_add_tcase(s, tc);
	tc = tcase_create("balance");
	tcase_add_test(tc, test_replicas_1gib);
	tcase_add_loop_test(tc, test_balance_random, 0, 100);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_loop_test(tc, test_bad, 0, N(bad_cases));
	tcase_add_test(tc, test_edges);
	tcase_add_test(tc, test_rank_cap);
	suite_add_tcase(s, tc);
	tc = tcase_create("scale");
	tcase_add_test(tc, test_scale_replicas);
	tcase_add_test(tc, test_scale_random);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(readassign_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
