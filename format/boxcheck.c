/* SPDX-License-Identifier: MIT */
/*
 * boxcheck.c - do a tensor's chunks tile its global shape (boxcheck.h).
 *
 * Two boxes overlap when their intervals [offs, offs + shape) intersect in
 * every dimension.  Sorted by (start in dimension d, start in dimension e),
 * a box A can only overlap a later box B if B starts before A ends in d; and
 * within one run of boxes that share their start in d, sorted by their start
 * in e, once one starts at or past A's end in e so do all after it.  The
 * sweep below therefore visits, for each A, the runs that start inside A in
 * d, and in each run only the boxes that start before A's end in e.  Every
 * overlapping pair is one (A, B) with A before B in that order and B among
 * the boxes visited from A, so none is missed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "format/boxcheck.h"
#include "format/grow.h"

struct boxcheck_ent {
	uint64_t k0, k1;            /* start in the sweep dimensions d and e */
	const uint64_t *offs, *shape;
	size_t id;                  /* number in order of boxcheck_add() */
};

int boxcheck_start(struct boxcheck *bc, unsigned ndim, const uint64_t *gshape)
{
	uint64_t total = 1;

	for (unsigned d = 0; d < ndim; d++)
		if (__builtin_mul_overflow(total, gshape[d], &total))
			return -EOVERFLOW;
	bc->n = 0;
	bc->n_added = 0;
	bc->ndim = ndim;
	bc->gshape = gshape;
	bc->total = total;
	bc->sum = 0;
	return 0;
}

int boxcheck_add(struct boxcheck *bc, const uint64_t *offs, const uint64_t *shape)
{
	uint64_t vol = 1;

	/* Inside the global shape, no product overflows; outside, a wrapped
	 * volume only makes the (then meaningless) total wrong. */
	for (unsigned d = 0; d < bc->ndim; d++)
		vol *= shape[d];
	if (vol) {
		if (grow_array((void **)&bc->ent, &bc->cap, bc->n + 1, sizeof(*bc->ent)))
			return -ENOMEM;
		bc->ent[bc->n++] = (struct boxcheck_ent){
			.offs = offs,
			.shape = shape,
			.id = bc->n_added,
		};
	}
	bc->sum += vol;
	bc->n_added++;
	return 0;
}

/* The order of the sweep; the number breaks ties, so that the order (and so
 * the pair reported) does not depend on the sort algorithm. */
static bool ent_less(const struct boxcheck_ent *a, const struct boxcheck_ent *b)
{
	if (a->k0 != b->k0)
		return a->k0 < b->k0;
	if (a->k1 != b->k1)
		return a->k1 < b->k1;
	return a->id < b->id;
}

static void sift_down(struct boxcheck_ent *v, size_t root, size_t n)
{
	struct boxcheck_ent x = v[root];

	for (;;) {
		size_t c = 2 * root + 1;

		if (c >= n)
			break;
		if (c + 1 < n && ent_less(&v[c], &v[c + 1]))
			c++;
		if (!ent_less(&x, &v[c]))
			break;
		v[root] = v[c];
		root = c;
	}
	v[root] = x;
}

/* In place and O(n log n) whatever the input: glibc's qsort allocates a
 * buffer for arrays past a few hundred bytes, once per tensor here. */
static void sort_ents(struct boxcheck_ent *v, size_t n)
{
	size_t i;

	for (i = 1; i < n && !ent_less(&v[i], &v[i - 1]); i++)
		;
	if (i >= n)
		return; /* the merge writes most layouts in order already */
	for (i = n / 2; i-- > 0;)
		sift_down(v, i, n);
	for (i = n; i-- > 1;) {
		struct boxcheck_ent t = v[0];

		v[0] = v[i];
		v[i] = t;
		sift_down(v, 0, i);
	}
}

/* First index in [lo, n) whose start in d is past k0 (n if none). */
static size_t next_run(const struct boxcheck_ent *v, size_t lo, size_t n, uint64_t k0)
{
	size_t hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].k0 > k0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static bool meet(const struct boxcheck_ent *a, const struct boxcheck_ent *b, unsigned ndim)
{
	for (unsigned d = 0; d < ndim; d++)
		if (a->offs[d] >= b->offs[d] + b->shape[d] || b->offs[d] >= a->offs[d] + a->shape[d])
			return false;
	return true;
}

/*
 * The sweep dimensions: d, in which the boxes are thinnest relative to the
 * tensor (their extents there add up to the fewest multiples of the global
 * extent), and e, the next thinnest.  Those are the dimensions the tensor
 * is split along: for a split along one dimension that one is d, for a grid
 * d and e are its two.  With one dimension, e = d.  Ties go to the lower
 * dimension, so the choice depends only on the boxes.
 */
static void pick_dims(const struct boxcheck *bc, unsigned *ret_d, unsigned *ret_e)
{
	double best = 0, second = 0;
	unsigned d0 = 0, e0 = 0;

	for (unsigned d = 0; d < bc->ndim; d++) {
		double span = 0;

		for (size_t k = 0; k < bc->n; k++)
			span += (double)bc->ent[k].shape[d];
		/* Non-zero boxes inside the shape make gshape[d] >= 1. */
		span /= bc->gshape[d] ? (double)bc->gshape[d] : 1.0;
		if (d == 0 || span < best) {
			second = best;
			e0 = d0;
			best = span;
			d0 = d;
		} else if (d == 1 || span < second) {
			second = span;
			e0 = d;
		}
	}
	if (bc->ndim < 2)
		e0 = d0;
	*ret_d = d0;
	*ret_e = e0;
}

static enum boxcheck_verdict found(struct boxcheck_result *r, size_t x, size_t y)
{
	r->first = x < y ? x : y;
	r->second = x < y ? y : x;
	return BOXCHECK_OVERLAP;
}

enum boxcheck_verdict boxcheck_verdict(struct boxcheck *bc, struct boxcheck_result *ret)
{
	struct boxcheck_ent *v = bc->ent;
	size_t n = bc->n;
	unsigned ndim = bc->ndim, d, e;

	*ret = (struct boxcheck_result){
		.covered = bc->sum > UINT64_MAX ? UINT64_MAX : (uint64_t)bc->sum,
		.total = bc->total,
	};
	if (n < 2)
		goto count;
	if (ndim == 0)
		return found(ret, v[0].id, v[1].id); /* scalars: all one element */
	pick_dims(bc, &d, &e);
	for (size_t k = 0; k < n; k++) {
		v[k].k0 = v[k].offs[d];
		v[k].k1 = v[k].offs[e];
	}
	sort_ents(v, n);
	for (size_t a = 0; a < n; a++) {
		uint64_t end_d = v[a].k0 + v[a].shape[d];
		uint64_t end_e = v[a].k1 + v[a].shape[e];
		size_t b = a + 1;

		while (b < n && v[b].k0 < end_d) {
			if (v[b].k1 >= end_e) {
				/* So do the rest of b's run: on to the next. */
				b = next_run(v, b + 1, n, v[b].k0);
				continue;
			}
			if (meet(&v[a], &v[b], ndim))
				return found(ret, v[a].id, v[b].id);
			b++;
		}
	}
count:
	return bc->sum == bc->total ? BOXCHECK_TILES : BOXCHECK_HOLE;
}

void boxcheck_free(struct boxcheck *bc)
{
	if (!bc)
		return;
	free(bc->ent);
	*bc = (struct boxcheck)BOXCHECK_INIT;
}
