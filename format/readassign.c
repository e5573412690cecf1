/* SPDX-License-Identifier: MIT */
/*
 * readassign.c - read-once assignment across replicas (see readassign.h).
 *
 * Steps: validate and copy the non-empty ranges; sort them by (rank, file,
 * begin) and merge each rank's into spans; order the spans by where they
 * begin and by where they end; sweep both orders once to count the regions
 * (so the cap is checked before anything is allocated for them) and once to
 * cut and assign them; then index the plan for its accessors.
 *
 * Everything is integer arithmetic and every sort key is a total order
 * (ties broken by span index, i.e. by rank), so every rank that runs this
 * on the same set of requests computes the same plan byte for byte.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "format/errmsg.h"
#include "format/readassign.h"

/* What the plan keeps per rank; one more entry holds the ends of the last
 * rank's spans and reads. */
struct rank_info {
	uint32_t id;
	uint32_t read0;   /* its reads: plan.reads[read0 .. next rank's read0) */
	size_t span0;     /* its spans: plan.spans[span0 .. next rank's span0) */
	uint64_t wanted;
	uint64_t load;    /* bytes read */
};

struct ra_plan {
	struct ra_region *regions; /* sorted by (file, begin) */
	size_t n_regions;
	struct ra_span *spans;     /* sorted by (rank, file, begin) */
	size_t n_spans;
	struct rank_info *ranks;   /* n_ranks + 1, ascending id */
	uint32_t *ids;             /* the same ids, for ra_plan_ranks() */
	size_t n_ranks;
	uint32_t *reads;           /* region indexes grouped by reader */
	/* The span index behind ra_plan_wanting() (see below): a tree of
	 * 2^levels leaves; node k's spans are by_lo[node0[k] .. node0[k + 1])
	 * by first region, and the same in by_hi by last region, descending. */
	unsigned levels;
	uint32_t *node0;
	uint32_t *by_lo, *by_hi;
};

/* A span's begin or end, for the sweep. */
struct bound {
	uint64_t pos;
	uint32_t file;
	uint32_t span;
};

/* ---- sort keys ---- */

static int cmp_u64(uint64_t a, uint64_t b)
{
	return (a > b) - (a < b);
}

static int by_owner(const void *pa, const void *pb)
{
	const struct ra_span *a = pa, *b = pb;

	if (a->rank != b->rank)
		return cmp_u64(a->rank, b->rank);
	if (a->file != b->file)
		return cmp_u64(a->file, b->file);
	if (a->begin != b->begin)
		return cmp_u64(a->begin, b->begin);
	return cmp_u64(a->end, b->end);
}

static int by_bound(const void *pa, const void *pb)
{
	const struct bound *a = pa, *b = pb;

	if (a->file != b->file)
		return cmp_u64(a->file, b->file);
	if (a->pos != b->pos)
		return cmp_u64(a->pos, b->pos);
	return cmp_u64(a->span, b->span);
}

static int cmp_u32(const void *pa, const void *pb)
{
	return cmp_u64(*(const uint32_t *)pa, *(const uint32_t *)pb);
}

/* ---- the span index ----
 *
 * A span covers the regions lo = first .. hi = first + count - 1.  Think of
 * a complete binary tree over region numbers, numbered as a heap (the root
 * 1, leaf j at 2^levels + j): a span belongs to the lowest node whose range
 * holds all of [lo, hi].  That node's level L (0 for the leaves) is one more
 * than the highest bit in which lo and hi differ, 0 if lo == hi, and its
 * number is 2^(levels - L) + (lo >> L).  At level L >= 1 every span of the
 * node contains the node's middle: its right half begins at c = (lo >> L
 * << L) | 2^(L - 1), and lo < c <= hi.  Region j lies below exactly one
 * node per level, the one for prefix j >> L, and the spans containing j are
 * at those nodes: before c, those with lo <= j (a prefix of by_lo's slice);
 * from c on, those with hi >= j (a prefix of by_hi's slice); at a leaf, all
 * of them.  So a query costs one step per level plus its answer.
 *
 * The slices are made by stable counting sorts by node of the spans in
 * sweep order: by begin, first regions ascend; by end, backwards, last
 * regions descend.
 */

static uint32_t node_of(const struct ra_span *s, unsigned levels)
{
	uint32_t lo = s->first, hi = s->first + s->count - 1;
	unsigned level = lo == hi ? 0 : 32 - (unsigned)__builtin_clz(lo ^ hi);

	return (1u << (levels - level)) + (lo >> level);
}

/* ---- the heap of wanting ranks ----
 *
 * A binary min-heap of rank numbers (indexes into plan.ranks, so comparing
 * numbers compares rank ids) ordered by (bytes read so far, rank): its top
 * is the reader the rule picks.  pos[] finds a rank in the heap so that a
 * span's end removes it in O(log n).
 */
struct heap {
	const struct rank_info *ranks;
	uint32_t *h;
	uint32_t *pos;
	size_t n;
};

static bool before(const struct heap *hp, uint32_t a, uint32_t b)
{
	if (hp->ranks[a].load != hp->ranks[b].load)
		return hp->ranks[a].load < hp->ranks[b].load;
	return a < b;
}

static void heap_set(struct heap *hp, size_t i, uint32_t r)
{
	hp->h[i] = r;
	hp->pos[r] = (uint32_t)i;
}

static void heap_up(struct heap *hp, size_t i)
{
	uint32_t r = hp->h[i];

	while (i > 0 && before(hp, r, hp->h[(i - 1) / 2])) {
		heap_set(hp, i, hp->h[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	heap_set(hp, i, r);
}

static void heap_down(struct heap *hp, size_t i)
{
	uint32_t r = hp->h[i];

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= hp->n)
			break;
		if (c + 1 < hp->n && before(hp, hp->h[c + 1], hp->h[c]))
			c++;
		if (!before(hp, hp->h[c], r))
			break;
		heap_set(hp, i, hp->h[c]);
		i = c;
	}
	heap_set(hp, i, r);
}

static void heap_push(struct heap *hp, uint32_t r)
{
	hp->h[hp->n] = r;
	heap_up(hp, hp->n++);
}

static void heap_remove(struct heap *hp, uint32_t r)
{
	size_t i = hp->pos[r];
	uint32_t last = hp->h[--hp->n];

	if (i == hp->n)
		return;
	heap_set(hp, i, last);
	heap_up(hp, i);
	heap_down(hp, hp->pos[last]);
}

/* ---- the sweep ---- */

struct sweep {
	struct ra_plan *p;
	const struct bound *begins, *ends; /* sorted by (file, pos, span) */
	const uint32_t *owner;             /* span number -> rank number */
	uint64_t max_region;
	struct heap *heap;                 /* NULL: count the regions only */
	uint64_t n_regions;
};

/* Regions [b, e) of one piece between cuts, with `active` wanting ranks. */
static int emit(struct sweep *sw, uint32_t file, uint64_t b, uint64_t e, size_t active)
{
	struct ra_plan *p = sw->p;
	uint64_t m = sw->max_region;

	if (!sw->heap) {
		/* The pieces: the multiples of m inside (b, e), plus one.  A
		 * small m can make that nearly 2^64: compared, not added. */
		uint64_t pieces = m ? (e - 1) / m - b / m + 1 : 1;

		if (pieces > RA_MAX_REGIONS - sw->n_regions)
			return -E2BIG;
		sw->n_regions += pieces;
		return 0;
	}
	while (b < e) {
		uint64_t cut = e;
		uint32_t r = sw->heap->h[0];
		struct ra_region *g = &p->regions[sw->n_regions++];

		/* Written as a distance so that it cannot overflow. */
		if (m && e - b > m - b % m)
			cut = b + (m - b % m);
		*g = (struct ra_region){ .begin = b, .end = cut, .file = file,
					 .reader = p->ranks[r].id, .n_wanting = (uint32_t)active };
		p->ranks[r].load += cut - b;
		p->ranks[r].read0++; /* a count until the reads are placed */
		heap_down(sw->heap, 0);
		b = cut;
	}
	return 0;
}

/*
 * Walks the span boundaries in (file, offset) order, merging the two sorted
 * orders.  At each boundary the spans that end there leave the wanting set
 * and those that begin there join it; if the set is not empty, the bytes up
 * to the next boundary are wanted by exactly that set.  The next boundary is
 * then in the same file: a span of the set ends there at the latest.
 */
static int sweep_run(struct sweep *sw)
{
	const struct bound *bb = sw->begins, *be = sw->ends;
	struct ra_span *sp = sw->p->spans;
	size_t n = sw->p->n_spans, si = 0, ei = 0, active = 0;
	int ret;

	sw->n_regions = 0;
	while (ei < n) {
		uint32_t file = be[ei].file;
		uint64_t pos = be[ei].pos, next;

		if (si < n && (bb[si].file < file || (bb[si].file == file && bb[si].pos < pos))) {
			file = bb[si].file;
			pos = bb[si].pos;
		}
		for (; ei < n && be[ei].file == file && be[ei].pos == pos; ei++) {
			active--;
			if (sw->heap) {
				struct ra_span *x = &sp[be[ei].span];

				heap_remove(sw->heap, sw->owner[be[ei].span]);
				x->count = (uint32_t)(sw->n_regions - x->first);
			}
		}
		for (; si < n && bb[si].file == file && bb[si].pos == pos; si++) {
			active++;
			if (sw->heap) {
				sp[bb[si].span].first = (uint32_t)sw->n_regions;
				heap_push(sw->heap, sw->owner[bb[si].span]);
			}
		}
		if (!active)
			continue;
		next = be[ei].pos;
		if (si < n && bb[si].file == file && bb[si].pos < next)
			next = bb[si].pos;
		ret = emit(sw, file, pos, next, active);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* ---- building the plan ---- */

static size_t rank_number(const struct ra_plan *p, uint32_t id)
{
	size_t lo = 0, hi = p->n_ranks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->ranks[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Copies the non-empty ranges into p->spans, after checking them all. */
static int copy_ranges(struct ra_plan *p, const struct ra_request *reqs, size_t n_reqs, char *err,
		       size_t errlen)
{
	size_t total = 0, n = 0;

	if (n_reqs && !reqs)
		return errmsg_set(err, errlen, -EINVAL, "%zu requests and no request array",
				  n_reqs);
	/* The count first, so that a too large input is -E2BIG whatever else
	 * is wrong with it and wherever that is. */
	for (size_t i = 0; i < n_reqs; i++) {
		if (reqs[i].n_ranges > RA_MAX_RANGES - total)
			return errmsg_set(err, errlen, -E2BIG, "more than %u ranges in all",
					  RA_MAX_RANGES);
		total += reqs[i].n_ranges;
	}
	for (size_t i = 0; i < n_reqs; i++) {
		const struct ra_request *q = &reqs[i];

		if (q->n_ranges && !q->ranges)
			return errmsg_set(err, errlen, -EINVAL,
					  "rank %u: %zu ranges and no range array", q->rank,
					  q->n_ranges);
		for (size_t k = 0; k < q->n_ranges; k++) {
			const struct ra_range *r = &q->ranges[k];

			if (r->end < r->begin)
				return errmsg_set(err, errlen, -EINVAL,
						  "rank %u: range %zu of file %u ends before it "
						  "begins ([%llu, %llu))",
						  q->rank, k, r->file, (unsigned long long)r->begin,
						  (unsigned long long)r->end);
			n += r->end > r->begin;
		}
	}
	p->spans = malloc((n ? n : 1) * sizeof(*p->spans));
	if (!p->spans)
		return -ENOMEM;
	for (size_t i = 0; i < n_reqs; i++)
		for (size_t k = 0; k < reqs[i].n_ranges; k++) {
			const struct ra_range *r = &reqs[i].ranges[k];

			if (r->end > r->begin)
				p->spans[p->n_spans++] = (struct ra_span){
					.begin = r->begin, .end = r->end, .file = r->file,
					.rank = reqs[i].rank };
		}
	return 0;
}

/* Sorts the ranges by owner and merges each rank's into spans; fills
 * p->ranks and owner[] (span -> rank number). */
static int make_spans(struct ra_plan *p, uint32_t **ret_owner, char *err, size_t errlen)
{
	struct ra_span *sp = p->spans;
	size_t n = 0, n_ranks = 0;
	uint64_t total = 0;
	uint32_t *owner;

	qsort(sp, p->n_spans, sizeof(*sp), by_owner);
	for (size_t i = 0; i < p->n_spans; i++) {
		struct ra_span *last = n ? &sp[n - 1] : NULL;

		/* Touching spans are merged too: a cut where the wanting set
		 * does not change would only make regions smaller. */
		if (last && last->rank == sp[i].rank && last->file == sp[i].file &&
		    sp[i].begin <= last->end) {
			if (sp[i].end > last->end)
				last->end = sp[i].end;
			continue;
		}
		n_ranks += !last || last->rank != sp[i].rank;
		sp[n++] = sp[i];
	}
	p->n_spans = n;
	if (n_ranks > RA_MAX_RANKS)
		return errmsg_set(err, errlen, -E2BIG, "%zu ranks want bytes (at most %u)", n_ranks,
				  RA_MAX_RANKS);
	for (size_t i = 0; i < n; i++)
		if (__builtin_add_overflow(total, sp[i].end - sp[i].begin, &total))
			return errmsg_set(err, errlen, -EOVERFLOW,
					  "the ranks want more than %llu bytes in all",
					  (unsigned long long)UINT64_MAX);

	p->ranks = calloc(n_ranks + 1, sizeof(*p->ranks));
	p->ids = malloc((n_ranks ? n_ranks : 1) * sizeof(*p->ids));
	owner = malloc((n ? n : 1) * sizeof(*owner));
	if (!p->ranks || !p->ids || !owner) {
		free(owner);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (i == 0 || sp[i].rank != sp[i - 1].rank) {
			p->ranks[p->n_ranks].id = sp[i].rank;
			p->ids[p->n_ranks] = sp[i].rank;
			p->ranks[p->n_ranks].span0 = i;
			p->n_ranks++;
		}
		p->ranks[p->n_ranks - 1].wanted += sp[i].end - sp[i].begin;
		owner[i] = (uint32_t)(p->n_ranks - 1);
	}
	p->ranks[p->n_ranks].span0 = n;
	*ret_owner = owner;
	return 0;
}

/* Groups the region numbers by reader (ascending within each); on entry
 * ranks[].read0 holds each rank's count. */
static int place_reads(struct ra_plan *p)
{
	uint32_t sum = 0;

	p->reads = malloc((p->n_regions ? p->n_regions : 1) * sizeof(*p->reads));
	if (!p->reads)
		return -ENOMEM;
	for (size_t i = 0; i <= p->n_ranks; i++) {
		uint32_t c = p->ranks[i].read0;

		p->ranks[i].read0 = sum;
		sum += c;
	}
	/* read0 serves as each rank's next free slot, which leaves it at the
	 * next rank's start; shifted back by one rank afterwards. */
	for (size_t j = 0; j < p->n_regions; j++) {
		struct rank_info *ri = &p->ranks[rank_number(p, p->regions[j].reader)];

		p->reads[ri->read0++] = (uint32_t)j;
	}
	for (size_t i = p->n_ranks; i > 0; i--)
		p->ranks[i].read0 = p->ranks[i - 1].read0;
	p->ranks[0].read0 = 0;
	return 0;
}

static int make_index(struct ra_plan *p, const struct bound *begins, const struct bound *ends)
{
	size_t n = p->n_spans, nodes;
	uint32_t *next;

	while (((size_t)1 << p->levels) < p->n_regions)
		p->levels++;
	nodes = (size_t)2 << p->levels; /* numbers 1 .. nodes - 1 */
	p->node0 = calloc(nodes + 1, sizeof(*p->node0));
	p->by_lo = malloc((n ? n : 1) * sizeof(*p->by_lo));
	p->by_hi = malloc((n ? n : 1) * sizeof(*p->by_hi));
	next = malloc(nodes * sizeof(*next));
	if (!p->node0 || !p->by_lo || !p->by_hi || !next) {
		free(next);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		p->node0[node_of(&p->spans[i], p->levels) + 1]++;
	for (size_t k = 1; k <= nodes; k++)
		p->node0[k] += p->node0[k - 1];

	memcpy(next, p->node0, nodes * sizeof(*next));
	for (size_t i = 0; i < n; i++) {
		uint32_t s = begins[i].span;

		p->by_lo[next[node_of(&p->spans[s], p->levels)]++] = s;
	}
	memcpy(next, p->node0, nodes * sizeof(*next));
	for (size_t i = n; i > 0; i--) {
		uint32_t s = ends[i - 1].span;

		p->by_hi[next[node_of(&p->spans[s], p->levels)]++] = s;
	}
	free(next);
	return 0;
}

int ra_assign(const struct ra_request *reqs, size_t n_reqs, uint64_t max_region,
	      struct ra_plan **ret_plan, char *err, size_t errlen)
{
	uint32_t *owner = NULL, *heap_mem = NULL;
	struct bound *bounds = NULL;
	struct ra_plan *p;
	struct heap hp;
	struct sweep sw;
	size_t n;
	int ret;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	ret = copy_ranges(p, reqs, n_reqs, err, errlen);
	if (ret < 0)
		goto out_free;
	ret = make_spans(p, &owner, err, errlen);
	if (ret < 0)
		goto out_free;

	ret = -ENOMEM;
	n = p->n_spans;
	bounds = malloc((n ? 2 * n : 1) * sizeof(*bounds));
	heap_mem = malloc((p->n_ranks ? 2 * p->n_ranks : 1) * sizeof(*heap_mem));
	if (!bounds || !heap_mem)
		goto out_free;
	for (size_t i = 0; i < n; i++) {
		const struct ra_span *s = &p->spans[i];

		bounds[i] = (struct bound){ s->begin, s->file, (uint32_t)i };
		bounds[n + i] = (struct bound){ s->end, s->file, (uint32_t)i };
	}
	qsort(bounds, n, sizeof(*bounds), by_bound);
	qsort(bounds + n, n, sizeof(*bounds), by_bound);

	sw = (struct sweep){ .p = p, .begins = bounds, .ends = bounds + n, .owner = owner,
			     .max_region = max_region };
	ret = sweep_run(&sw);
	if (ret < 0) {
		errmsg_set(err, errlen, ret, "more than %u regions (max_region %llu)",
			   RA_MAX_REGIONS, (unsigned long long)max_region);
		goto out_free;
	}
	ret = -ENOMEM;
	p->regions = malloc((sw.n_regions ? sw.n_regions : 1) * sizeof(*p->regions));
	if (!p->regions)
		goto out_free;
	hp = (struct heap){ .ranks = p->ranks, .h = heap_mem, .pos = heap_mem + p->n_ranks };
	sw.heap = &hp;
	ret = sweep_run(&sw);
	if (ret < 0)
		goto out_free;
	p->n_regions = sw.n_regions;

	ret = place_reads(p);
	if (ret < 0)
		goto out_free;
	ret = make_index(p, bounds, bounds + n);
	if (ret < 0)
		goto out_free;
	free(owner);
	free(bounds);
	free(heap_mem);
	*ret_plan = p;
	return 0;

out_free:
	free(owner);
	free(bounds);
	free(heap_mem);
	ra_plan_free(p);
	return ret;
}

void ra_plan_free(struct ra_plan *p)
{
	if (!p)
		return;
	free(p->regions);
	free(p->spans);
	free(p->ranks);
	free(p->ids);
	free(p->reads);
	free(p->node0);
	free(p->by_lo);
	free(p->by_hi);
	free(p);
}

size_t ra_plan_regions(const struct ra_plan *p, const struct ra_region **ret_regions)
{
	*ret_regions = p->regions;
	return p->n_regions;
}

size_t ra_plan_ranks(const struct ra_plan *p, const uint32_t **ret_ranks)
{
	*ret_ranks = p->ids;
	return p->n_ranks;
}

int ra_plan_rank(const struct ra_plan *p, uint32_t rank, struct ra_rank *ret)
{
	size_t i = rank_number(p, rank);
	const struct rank_info *ri = &p->ranks[i];

	if (i == p->n_ranks || ri->id != rank)
		return -ENOENT;
	*ret = (struct ra_rank){
		.rank = rank,
		.bytes_wanted = ri->wanted,
		.bytes_read = ri->load,
		.spans = p->spans + ri->span0,
		.n_spans = ri[1].span0 - ri->span0,
		.reads = p->reads + ri->read0,
		.n_reads = ri[1].read0 - ri->read0,
	};
	return 0;
}

int ra_plan_find(const struct ra_plan *p, uint32_t file, uint64_t begin, uint64_t end,
		 uint32_t *ret_first, uint32_t *ret_count)
{
	size_t lo = 0, hi = p->n_regions, j;
	uint64_t pos = begin;

	if (end < begin)
		return -EINVAL;
	/* The first region of a later file, or of this file ending after
	 * `begin`: the one holding `begin` if any. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct ra_region *g = &p->regions[mid];

		if (g->file < file || (g->file == file && g->end <= begin))
			lo = mid + 1;
		else
			hi = mid;
	}
	for (j = lo; pos < end; j++) {
		const struct ra_region *g = &p->regions[j];

		if (j == p->n_regions || g->file != file || g->begin > pos)
			return -ENOENT;
		pos = g->end;
	}
	*ret_first = (uint32_t)lo;
	*ret_count = (uint32_t)(j - lo);
	return 0;
}

int ra_plan_wanting(const struct ra_plan *p, uint32_t region, uint32_t *ranks, size_t cap)
{
	size_t n = 0;

	if (region >= p->n_regions)
		return -EINVAL;
	if (cap < p->regions[region].n_wanting)
		return -ERANGE;
	for (unsigned level = 0; level <= p->levels; level++) {
		uint32_t node = (1u << (p->levels - level)) + (region >> level);
		uint32_t a = p->node0[node], b = p->node0[node + 1];

		if (level == 0) {
			for (uint32_t k = a; k < b; k++)
				ranks[n++] = p->spans[p->by_lo[k]].rank;
		} else if (region < ((region >> level << level) | 1u << (level - 1))) {
			for (uint32_t k = a; k < b && p->spans[p->by_lo[k]].first <= region; k++)
				ranks[n++] = p->spans[p->by_lo[k]].rank;
		} else {
			for (uint32_t k = a; k < b; k++) {
				const struct ra_span *s = &p->spans[p->by_hi[k]];

				if (s->first + s->count <= region)
					break;
				ranks[n++] = s->rank;
			}
		}
	}
	qsort(ranks, n, sizeof(*ranks), cmp_u32);
	return (int)n;
}
