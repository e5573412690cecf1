/* SPDX-License-Identifier: MIT */
/*
 * plan.c - turning destination boxes into CRC-checkable reads (plan.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/crc32c.h"
#include "format/errmsg.h"
#include "format/grow.h"
#include "format/plan.h"

#define bad(...) errmsg_set(err, errlen, -EINVAL, __VA_ARGS__)

/* A tensor gets a sorted index once this many boxes asked about it. */
#define INDEX_AFTER_QUERIES 4
#define INDEX_MIN_CHUNKS    16

/* ---- the chunk index ---- */

struct item_ix {
	uint32_t queries;
	bool built;
	uint8_t dim;        /* the dimension the chunks are sorted by */
	uint64_t maxext;    /* the largest chunk extent in that dimension */
	uint32_t *order;    /* non-empty chunks by offsets[dim] */
	size_t n;
};

struct plan_index {
	const struct manifest *m;
	struct item_ix *items; /* m->n_items */
};

int plan_index_new(const struct manifest *m, struct plan_index **ret_ix)
{
	struct plan_index *ix = calloc(1, sizeof(*ix));

	if (!ix)
		return -ENOMEM;
	ix->m = m;
	ix->items = calloc(m->n_items ? m->n_items : 1, sizeof(*ix->items));
	if (!ix->items) {
		free(ix);
		return -ENOMEM;
	}
	*ret_ix = ix;
	return 0;
}

void plan_index_free(struct plan_index *ix)
{
	if (!ix)
		return;
	if (ix->items)
		for (size_t i = 0; i < ix->m->n_items; i++)
			free(ix->items[i].order);
	free(ix->items);
	free(ix);
}

static uint64_t chunk_volume(const struct manifest_tensor *t, const struct manifest_chunk *c)
{
	uint64_t v = 1;

	for (unsigned d = 0; d < t->ndim; d++)
		v *= c->shape[d];
	return v;
}

struct sort_ctx {
	const struct manifest_tensor *t;
	unsigned dim;
};

static int by_start(const void *a, const void *b, void *ctx)
{
	const struct sort_ctx *s = ctx;
	uint64_t x = s->t->chunks[*(const uint32_t *)a].offsets[s->dim];
	uint64_t y = s->t->chunks[*(const uint32_t *)b].offsets[s->dim];

	return x < y ? -1 : x > y;
}

/* Sorts t's non-empty chunks along the dimension in which they are thinnest
 * relative to the tensor (the one they are split along). */
static int ix_build(struct item_ix *x, const struct manifest_tensor *t)
{
	struct sort_ctx s = { t, 0 };
	double best = -1;

	x->order = malloc(t->n_chunks * sizeof(*x->order));
	if (!x->order)
		return -ENOMEM;
	x->n = 0;
	for (size_t k = 0; k < t->n_chunks; k++)
		if (chunk_volume(t, &t->chunks[k]))
			x->order[x->n++] = (uint32_t)k;
	for (unsigned d = 0; d < t->ndim; d++) {
		double span = 0;

		for (size_t k = 0; k < x->n; k++)
			span += (double)t->chunks[x->order[k]].shape[d];
		span /= (double)t->shape[d];
		if (best < 0 || span < best) {
			best = span;
			s.dim = d;
		}
	}
	x->dim = (uint8_t)s.dim;
	x->maxext = 0;
	for (size_t k = 0; k < x->n; k++)
		if (t->chunks[x->order[k]].shape[s.dim] > x->maxext)
			x->maxext = t->chunks[x->order[k]].shape[s.dim];
	qsort_r(x->order, x->n, sizeof(*x->order), by_start, &s);
	x->built = true;
	return 0;
}

/* ---- building ---- */

struct seg {
	uint32_t file;
	uint32_t item, chunk;
	uint64_t begin, end; /* widened to CRC pieces */
	size_t copy;         /* its copy, in the build's copy array */
};

struct build {
	const struct manifest *m;
	uint64_t merge_gap, seg_max;
	struct seg *segs;
	size_t n_segs, cap_segs;
	struct plan_copy *copies;
	size_t n_copies, cap_copies;
	uint64_t *dims; /* copies' offsets and shapes, by index until done */
	size_t n_dims, cap_dims;
};

/* The current intersection being cut into segments. */
struct cut {
	const struct plan_want *w;
	uint32_t want, item, chunk;
	const struct manifest_tensor *t;
	const struct manifest_chunk *c;
	unsigned n;                  /* ndim */
	uint64_t esize;
	uint64_t S[CKPT_MAX_NDIM];   /* chunk strides, bytes */
	uint64_t E[CKPT_MAX_NDIM];   /* intersection extents */
	uint64_t span[CKPT_MAX_NDIM + 1]; /* span[d]: bytes from the first to
					    * past the last byte of dims d.. */
	uint64_t lo[CKPT_MAX_NDIM];  /* current sub-box, chunk-local */
	uint64_t ext[CKPT_MAX_NDIM];
};

static uint64_t grid_down(uint64_t x)
{
	return x / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
}

static uint64_t grid_up(uint64_t x)
{
	return (x + LAYOUT_CRC_BLOCK - 1) / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
}

/* Emits the current sub-box (lo, ext) as one segment and its copy. */
static int emit(struct build *b, struct cut *x)
{
	uint64_t first = x->c->begin, last = x->c->begin, vol = 1;
	struct plan_copy *cp;
	struct seg *s;

	for (unsigned d = 0; d < x->n; d++) {
		first += x->lo[d] * x->S[d];
		last += (x->lo[d] + x->ext[d] - 1) * x->S[d];
		vol *= x->ext[d];
	}
	last += x->esize;
	if (grow_array((void **)&b->segs, &b->cap_segs, b->n_segs + 1, sizeof(*b->segs)) ||
	    grow_array((void **)&b->copies, &b->cap_copies, b->n_copies + 1, sizeof(*b->copies)) ||
	    grow_array((void **)&b->dims, &b->cap_dims, b->n_dims + 2u * x->n, sizeof(*b->dims)))
		return -ENOMEM;
	cp = &b->copies[b->n_copies];
	*cp = (struct plan_copy){ .want = x->want, .tag = x->w->tag, .item = x->item,
				  .chunk = x->chunk, .src = first, .bytes = vol * x->esize };
	/* Pointers are fixed up once the dims array stops moving. */
	cp->offsets = (uint64_t *)(uintptr_t)b->n_dims;
	for (unsigned d = 0; d < x->n; d++) {
		b->dims[b->n_dims + d] = x->c->offsets[d] + x->lo[d];
		b->dims[b->n_dims + x->n + d] = x->ext[d];
	}
	b->n_dims += 2u * x->n;
	s = &b->segs[b->n_segs++];
	*s = (struct seg){ .file = x->c->file, .item = x->item, .chunk = x->chunk,
			   .begin = grid_down(first), .end = grid_up(last), .copy = b->n_copies++ };
	if (s->begin < x->c->begin)
		s->begin = x->c->begin;
	if (s->end > x->c->end)
		s->end = x->c->end;
	return 0;
}

/* Bytes from the first to past the last byte of the sub-box's dims d..,
 * with extents ext. */
static uint64_t sub_span(const struct cut *x, unsigned d)
{
	uint64_t s = x->esize;

	for (unsigned k = x->n; k-- > d;)
		s += (x->ext[k] - 1) * x->S[k];
	return s;
}

/* Emits the sub-box whose dims < d are fixed (extent 1) and dims >= d are
 * at the intersection's extents from lo[d], cutting it along dim d (and
 * deeper, if one index of d alone is too large) into segments of at most
 * seg_max bytes. */
static int split(struct build *b, struct cut *x, unsigned d)
{
	uint64_t lo0 = x->lo[d], e0 = x->ext[d], inner, g;
	int r = 0;

	if (d == x->n || sub_span(x, d) <= b->seg_max)
		return emit(b, x);
	/* One index of d spans `inner` bytes. */
	x->ext[d] = 1;
	inner = sub_span(x, d);
	if (inner > b->seg_max) {
		for (uint64_t i = 0; i < e0 && !r; i++) {
			x->lo[d] = lo0 + i;
			r = split(b, x, d + 1);
		}
	} else {
		g = (b->seg_max - inner) / x->S[d] + 1;
		for (uint64_t i = 0; i < e0 && !r; i += g) {
			x->lo[d] = lo0 + i;
			x->ext[d] = e0 - i < g ? e0 - i : g;
			r = emit(b, x);
		}
	}
	x->lo[d] = lo0;
	x->ext[d] = e0;
	return r;
}

/* Cuts the intersection of want w with chunk c (global [lo, hi)) into
 * segments. */
static int cut_intersection(struct build *b, struct cut *x, const uint64_t *glo,
			    const uint64_t *ghi)
{
	unsigned n = x->n, d0, J;
	uint64_t idx[CKPT_MAX_NDIM], base[CKPT_MAX_NDIM];
	int r = 0;

	if (n == 0)
		return emit(b, x);
	plan_chunk_strides(x->t, x->c, x->esize, x->S);
	for (unsigned d = 0; d < n; d++) {
		x->E[d] = ghi[d] - glo[d];
		base[d] = glo[d] - x->c->offsets[d];
	}
	/* d0: the outermost dim the runs start at; dims after it are whole. */
	d0 = n - 1;
	while (d0 > 0 && x->E[d0] == x->c->shape[d0])
		d0--;
	x->span[n] = x->esize;
	for (unsigned d = n; d-- > 0;)
		x->span[d] = (x->E[d] - 1) * x->S[d] + x->span[d + 1];
	/* Join the units of dims J.. while the gap between consecutive ones
	 * is small. */
	J = d0;
	while (J > 0 && x->S[J - 1] - x->span[J] <= b->merge_gap)
		J--;
	/* Iterate the units: every index of dims < J. */
	for (unsigned d = 0; d < n; d++) {
		x->lo[d] = base[d];
		x->ext[d] = d < J ? 1 : x->E[d];
		idx[d] = 0;
	}
	for (;;) {
		r = split(b, x, J);
		if (r)
			return r;
		unsigned d = J;
		while (d > 0) {
			d--;
			if (++idx[d] < x->E[d]) {
				x->lo[d] = base[d] + idx[d];
				break;
			}
			idx[d] = 0;
			x->lo[d] = base[d];
			if (d == 0)
				return 0;
		}
		if (J == 0)
			return 0;
	}
}

/* Intersects want w with chunk k of its item; cuts what they share. */
static int meet(struct build *b, struct cut *x, uint32_t k)
{
	const struct manifest_chunk *c = &x->t->chunks[k];
	uint64_t lo[CKPT_MAX_NDIM], hi[CKPT_MAX_NDIM];

	for (unsigned d = 0; d < x->n; d++) {
		uint64_t a = x->w->offsets[d], e = a + x->w->shape[d];
		uint64_t ca = c->offsets[d], ce = ca + c->shape[d];

		lo[d] = a > ca ? a : ca;
		hi[d] = e < ce ? e : ce;
		if (lo[d] >= hi[d])
			return 0;
	}
	x->c = c;
	x->chunk = k;
	return cut_intersection(b, x, lo, hi);
}

static int plan_want(struct plan_index *ix, struct build *b, uint32_t wi,
		     const struct plan_want *w, uint64_t *wanted, char *err, size_t errlen)
{
	const struct manifest *m = ix->m;
	const struct manifest_tensor *t;
	struct item_ix *x;
	struct cut cut;
	uint64_t vol = 1;
	int r = 0;

	if (w->item >= m->n_items)
		return bad("want %u: item %u out of range (%zu items)", wi, w->item, m->n_items);
	t = &m->items[w->item];
	if (t->ndim && (!w->offsets || !w->shape))
		return bad("'%s': box without offsets or shape", t->name);
	for (unsigned d = 0; d < t->ndim; d++) {
		if (w->offsets[d] > t->shape[d] || w->shape[d] > t->shape[d] - w->offsets[d])
			return bad("'%s': dimension %u: box offset %llu + size %llu exceeds %llu",
				   t->name, d, (unsigned long long)w->offsets[d],
				   (unsigned long long)w->shape[d],
				   (unsigned long long)t->shape[d]);
		vol *= w->shape[d];
	}
	memset(&cut, 0, sizeof(cut));
	cut.w = w;
	cut.want = wi;
	cut.item = w->item;
	cut.t = t;
	cut.n = t->ndim;
	cut.esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	*wanted += vol * cut.esize;
	if (vol == 0)
		return 0;

	x = &ix->items[w->item];
	if (!x->built && ++x->queries >= INDEX_AFTER_QUERIES && t->n_chunks >= INDEX_MIN_CHUNKS &&
	    t->ndim > 0) {
		r = ix_build(x, t);
		if (r)
			return r;
	}
	if (!x->built) {
		for (size_t k = 0; k < t->n_chunks && !r; k++)
			r = meet(b, &cut, (uint32_t)k);
		return r;
	}
	/* Chunks starting in (box start - maxext, box end) along x->dim. */
	uint64_t a = w->offsets[x->dim], e = a + w->shape[x->dim];
	size_t lo = 0, hi = x->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->chunks[x->order[mid]].offsets[x->dim] + x->maxext <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t k = lo; k < x->n && !r; k++) {
		if (t->chunks[x->order[k]].offsets[x->dim] >= e)
			break;
		r = meet(b, &cut, x->order[k]);
	}
	return r;
}

static int by_seg(const void *pa, const void *pb)
{
	const struct seg *a = pa, *b = pb;

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	if (a->end != b->end)
		return a->end < b->end ? -1 : 1;
	return a->copy < b->copy ? -1 : a->copy > b->copy;
}

void plan_free(struct plan *p)
{
	if (!p)
		return;
	free(p->reads);
	free(p->copies);
	free(p->checks);
	free(p->pool);
	free(p);
}

/*
 * Groups the sorted segments into reads; copies and checks follow.
 *
 * Segments of different chunks must not share a byte.  A hand-made
 * manifest can point two chunks (of one tensor or of two) at the same
 * bytes, each with CRCs that match; each would verify on its own, but the
 * check spans of a read would then overlap and step backwards, and the
 * direct path (client/load.c) verifies them in one forward pass over the
 * destinations: it would read before a destination's start.  The planner
 * does not count on the parser having refused such a manifest; it refuses
 * the plan (-EBADMSG).  The first segment, in this order, that shares
 * bytes with an earlier one of another chunk starts before the furthest
 * end seen so far in its file, and that end is another chunk's: were it
 * its own chunk's, the segment reaching it would share bytes with that
 * other one and come earlier.
 */
static int assemble(struct build *b, uint64_t max_read, struct plan *p, char *err, size_t errlen)
{
	size_t cap_reads = 0, cap_checks = 0;
	const struct seg *far = NULL; /* the furthest-reaching segment of the file so far */

	p->copies = malloc((b->n_copies ? b->n_copies : 1) * sizeof(*p->copies));
	if (!p->copies)
		return -ENOMEM;
	p->pool = b->dims;
	b->dims = NULL;
	for (size_t i = 0; i < b->n_segs; i++) {
		const struct seg *s = &b->segs[i];
		struct plan_read *rd = p->n_reads ? &p->reads[p->n_reads - 1] : NULL;
		struct plan_copy *cp;

		if (far && far->file == s->file && s->begin < far->end &&
		    (far->item != s->item || far->chunk != s->chunk)) {
			const struct manifest *m = b->m;
			return errmsg_set(err, errlen, -EBADMSG,
					  "corrupt manifest: '%s' chunk %u and '%s' chunk %u share "
					  "bytes of %s (at offset %llu)",
					  m->items[far->item].name, far->chunk, m->items[s->item].name,
					  s->chunk, m->files[s->file].path,
					  (unsigned long long)s->begin);
		}
		if (!far || far->file != s->file || s->end > far->end)
			far = s;
		if (!rd || rd->file != s->file || s->begin > rd->end + b->merge_gap ||
		    (s->end > rd->end ? s->end : rd->end) - rd->begin > max_read) {
			if (grow_array((void **)&p->reads, &cap_reads, p->n_reads + 1, sizeof(*p->reads)))
				return -ENOMEM;
			rd = &p->reads[p->n_reads++];
			*rd = (struct plan_read){ .file = s->file, .begin = s->begin, .end = s->end,
						  .copy0 = p->n_copies, .check0 = p->n_checks };
		} else if (s->end > rd->end) {
			rd->end = s->end;
		}
		cp = &p->copies[p->n_copies++];
		*cp = b->copies[s->copy];
		if (p->pool) {
			cp->offsets = (uint64_t *)p->pool + (uintptr_t)cp->offsets;
			cp->shape = cp->offsets + b->m->items[cp->item].ndim;
		} else { /* only 0-D items */
			cp->offsets = cp->shape = NULL;
		}
		rd->n_copies++;
		/* Chunks own disjoint byte ranges (checked above), so a
		 * chunk's segments are neighbours in this order: coalesce
		 * their spans. */
		struct plan_check *k = rd->n_checks ? &p->checks[p->n_checks - 1] : NULL;
		if (k && k->item == s->item && k->chunk == s->chunk && s->begin <= k->end) {
			if (s->end > k->end)
				k->end = s->end;
		} else {
			if (grow_array((void **)&p->checks, &cap_checks, p->n_checks + 1,
				 sizeof(*p->checks)))
				return -ENOMEM;
			p->checks[p->n_checks++] = (struct plan_check){
				.item = s->item, .chunk = s->chunk, .begin = s->begin, .end = s->end
			};
			rd->n_checks++;
		}
	}
	for (size_t i = 0; i < p->n_reads; i++) {
		uint64_t n = p->reads[i].end - p->reads[i].begin;
		p->bytes_read += n;
		if (n > p->max_read)
			p->max_read = n;
	}
	return 0;
}

int plan_build(struct plan_index *ix, const struct plan_want *wants, size_t n_wants,
	       const struct plan_opts *opts, struct plan **ret_plan, char *err, size_t errlen)
{
	struct build b = { .m = ix->m };
	uint64_t max_read = opts && opts->max_read ? opts->max_read : PLAN_DEFAULT_MAX_READ;
	struct plan *p;
	int r = 0;

	if (n_wants > PLAN_MAX_WANTS)
		return errmsg_set(err, errlen, -E2BIG, "%zu boxes in one load (at most %u)",
				  n_wants, PLAN_MAX_WANTS);
	/* Room for a segment widened by a piece at each end. */
	if (max_read < 4ull * LAYOUT_CRC_BLOCK)
		max_read = 4ull * LAYOUT_CRC_BLOCK;
	b.seg_max = max_read - 2ull * LAYOUT_CRC_BLOCK;
	b.merge_gap = opts && opts->merge_gap ? opts->merge_gap : PLAN_DEFAULT_MERGE_GAP;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < n_wants && !r; i++)
		r = plan_want(ix, &b, (uint32_t)i, &wants[i], &p->bytes_wanted, err, errlen);
	if (!r) {
		/* segs is NULL when nothing is read (qsort's pointer must not be). */
		if (b.n_segs)
			qsort(b.segs, b.n_segs, sizeof(*b.segs), by_seg);
		r = assemble(&b, max_read, p, err, errlen);
	}
	free(b.segs);
	free(b.copies);
	free(b.dims);
	if (r) {
		if (r == -ENOMEM)
			errmsg_set(err, errlen, r, "out of memory planning the load");
		plan_free(p);
		return r;
	}
	*ret_plan = p;
	return 0;
}

void plan_chunk_strides(const struct manifest_tensor *t, const struct manifest_chunk *c,
			size_t esize, uint64_t *ret_strides)
{
	uint64_t s = esize;

	for (unsigned d = t->ndim; d-- > 0;) {
		ret_strides[d] = s;
		s *= c->shape[d];
	}
}

int plan_check_span(const struct manifest *m, const struct plan_check *k, const uint8_t *buf,
		    uint64_t buf_begin, uint64_t *ret_bad)
{
	const struct manifest_chunk *c = &m->items[k->item].chunks[k->chunk];
	uint64_t pos = k->begin;

	while (pos < k->end) {
		uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
		uint64_t stop = grid < k->end ? grid : k->end;
		uint64_t piece = pos / LAYOUT_CRC_BLOCK - c->begin / LAYOUT_CRC_BLOCK;

		if (crc32c(buf + (pos - buf_begin), (size_t)(stop - pos), 0) != c->crcs[piece]) {
			*ret_bad = pos;
			return -EBADMSG;
		}
		pos = stop;
	}
	return 0;
}
