/* SPDX-License-Identifier: MIT */
/* check_plan.c - load planning: boxes against saved chunks, byte runs,
 * CRC widening, merged reads (format/plan.c). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/crc32c.h"
#include "format/index.h"
#include "format/plan.h"

#define MiB (1ull << 20)

/* Per-element checks: ck_assert records every passing check (a write per
 * call), far too slow for loops over millions of elements. */
#define need(c)                                                                 \
	do {                                                                     \
		if (!(c))                                                        \
			ck_abort_msg("%s:%d: failed: %s", __FILE__, __LINE__, #c); \
	} while (0)
#define MAX_T 12
#define MAX_C 64
#define MAX_F 4

/* ---- a synthetic checkpoint: chunk grids placed in simulated files ---- */

struct gchunk {
	uint64_t offs[4], shape[4];
	uint32_t file;
	uint64_t begin, end;
};

struct gtensor {
	char name[32];
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[4];
	size_t n;
	struct gchunk c[MAX_C];
};

struct gen {
	struct gtensor t[MAX_T];
	size_t n_t;
	uint64_t fsize[MAX_F];
	uint8_t *fbuf[MAX_F];
	size_t n_f;
};

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* The byte at offset o of simulated file f. */
static uint8_t fbyte(uint32_t f, uint64_t o)
{
	uint64_t x = (o + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(f + 1) * 0xC2B2AE3D27D4EB4Full;

	x ^= x >> 29;
	return (uint8_t)(x ^ (x >> 17));
}

static uint64_t vol(const uint64_t *s, unsigned n)
{
	uint64_t v = 1;

	for (unsigned d = 0; d < n; d++)
		v *= s[d];
	return v;
}

/* Cuts each dimension into parts[d] pieces at random points. */
static void grid(struct gtensor *t, const unsigned *parts)
{
	uint64_t cuts[4][8];
	unsigned idx[4] = { 0 };

	for (unsigned d = 0; d < t->ndim; d++) {
		cuts[d][0] = 0;
		cuts[d][parts[d]] = t->shape[d];
		for (unsigned k = 1; k < parts[d]; k++)
			cuts[d][k] = below(t->shape[d] + 1);
		/* sort the inner cuts */
		for (unsigned a = 1; a < parts[d]; a++)
			for (unsigned b = a + 1; b < parts[d]; b++)
				if (cuts[d][b] < cuts[d][a]) {
					uint64_t x = cuts[d][a];
					cuts[d][a] = cuts[d][b];
					cuts[d][b] = x;
				}
	}
	t->n = 0;
	for (;;) {
		struct gchunk *c = &t->c[t->n++];
		for (unsigned d = 0; d < t->ndim; d++) {
			c->offs[d] = cuts[d][idx[d]];
			c->shape[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
		}
		unsigned d = t->ndim;
		while (d > 0) {
			d--;
			if (++idx[d] < parts[d])
				break;
			idx[d] = 0;
			if (d == 0)
				return;
		}
		if (t->ndim == 0)
			return;
	}
}

static void gen_files(struct gen *g)
{
	for (size_t f = 0; f < g->n_f; f++)
		g->fsize[f] = 4096;
	for (size_t i = 0; i < g->n_t; i++) {
		struct gtensor *t = &g->t[i];
		size_t es = ckpt_dtype_size(t->dt);
		for (size_t k = 0; k < t->n; k++) {
			struct gchunk *c = &t->c[k];
			c->file = (uint32_t)below(g->n_f);
			c->begin = g->fsize[c->file];
			c->end = c->begin + vol(c->shape, t->ndim) * es;
			g->fsize[c->file] = c->end;
		}
	}
	for (size_t f = 0; f < g->n_f; f++) {
		g->fbuf[f] = malloc(g->fsize[f]);
		ck_assert_ptr_nonnull(g->fbuf[f]);
		for (uint64_t o = 0; o < g->fsize[f]; o++)
			g->fbuf[f][o] = fbyte((uint32_t)f, o);
	}
}

static json_t *dims_json(const uint64_t *d, unsigned n)
{
	json_t *a = json_array();

	for (unsigned k = 0; k < n; k++)
		json_array_append_new(a, json_integer((json_int_t)d[k]));
	return a;
}

static json_t *crcs_json(const struct gen *g, const struct gchunk *c)
{
	json_t *a = json_array();
	uint64_t pos = c->begin;

	while (pos < c->end) {
		uint64_t grid_end = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
		uint64_t stop = grid_end < c->end ? grid_end : c->end;
		json_array_append_new(a, json_integer(crc32c(g->fbuf[c->file] + pos, stop - pos, 0)));
		pos = stop;
	}
	return a;
}

/* The manifest of g, parsed. */
static void gen_manifest(const struct gen *g, struct manifest *m)
{
	json_t *root = json_object(), *files = json_array(), *tensors = json_object();
	uint64_t total = 0;
	char err[512] = "", *text;
	int r;

	json_object_set_new(root, "format", json_string(MANIFEST_FORMAT));
	json_object_set_new(root, "name", json_string("plan-test"));
	json_object_set_new(root, "step", json_integer(7));
	json_object_set_new(root, "time", json_string("2026-11-25T00:00:00Z"));
	json_object_set_new(root, "job", json_string("job"));
	json_object_set_new(root, "world_size", json_integer((json_int_t)g->n_f));
	json_object_set_new(root, "crc_block", json_integer(LAYOUT_CRC_BLOCK));
	json_object_set_new(root, "metadata", json_object());
	json_object_set_new(root, "metrics", json_object());
	for (size_t f = 0; f < g->n_f; f++) {
		char p[64];
		json_t *o = json_object();
		snprintf(p, sizeof(p), "rank-%05zu.safetensors", f);
		json_object_set_new(o, "rank", json_integer((json_int_t)f));
		json_object_set_new(o, "path", json_string(p));
		json_object_set_new(o, "size", json_integer((json_int_t)g->fsize[f]));
		json_array_append_new(files, o);
		total += g->fsize[f];
	}
	json_object_set_new(root, "files", files);
	json_object_set_new(root, "total_bytes", json_integer((json_int_t)total));
	for (size_t i = 0; i < g->n_t; i++) {
		const struct gtensor *t = &g->t[i];
		json_t *o = json_object(), *chunks = json_array();
		json_object_set_new(o, "dtype", json_string(ckpt_dtype_name(t->dt)));
		json_object_set_new(o, "shape", dims_json(t->shape, t->ndim));
		for (size_t k = 0; k < t->n; k++) {
			const struct gchunk *c = &t->c[k];
			json_t *jc = json_object();
			json_object_set_new(jc, "file", json_integer(c->file));
			json_object_set_new(jc, "offsets", dims_json(c->offs, t->ndim));
			json_object_set_new(jc, "shape", dims_json(c->shape, t->ndim));
			json_object_set_new(jc, "begin", json_integer((json_int_t)c->begin));
			json_object_set_new(jc, "end", json_integer((json_int_t)c->end));
			json_object_set_new(jc, "crc32c", crcs_json(g, c));
			json_array_append_new(chunks, jc);
		}
		json_object_set_new(o, "chunks", chunks);
		json_object_set_new(tensors, t->name, o);
	}
	json_object_set_new(root, "tensors", tensors);
	json_object_set_new(root, "blobs", json_object());
	text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	memset(m, 0, sizeof(*m));
	r = manifest_parse(text, strlen(text), m, err, sizeof(err));
	free(text);
	ck_assert_msg(r == 0, "manifest_parse: %d %s", r, err);
}

static void gen_free(struct gen *g)
{
	for (size_t f = 0; f < g->n_f; f++)
		free(g->fbuf[f]);
}

/* A random checkpoint: n_t tensors of 0 to 4 dimensions, every dtype,
 * grids of up to 5 parts per dimension. */
static void gen_random(struct gen *g)
{
	memset(g, 0, sizeof(*g));
	g->n_f = 1 + below(MAX_F);
	g->n_t = 1 + below(MAX_T);
	for (size_t i = 0; i < g->n_t; i++) {
		struct gtensor *t = &g->t[i];
		unsigned parts[4] = { 1, 1, 1, 1 };
		uint64_t maxv = below(4) == 0 ? 600000 : 5000;

		snprintf(t->name, sizeof(t->name), "t%02zu", i);
		t->dt = (enum ckpt_dtype)below(CKPT_DTYPE_COUNT);
		t->ndim = (unsigned)below(5);
		for (unsigned d = 0; d < t->ndim; d++) {
			t->shape[d] = 1 + below(40);
			if (below(12) == 0)
				t->shape[d] = 0;
		}
		/* grow a few to cross CRC blocks, within maxv elements */
		while (t->ndim && vol(t->shape, t->ndim) * 3 < maxv && below(3)) {
			unsigned d = (unsigned)below(t->ndim);
			t->shape[d] = t->shape[d] * 2 + 1;
		}
		size_t budget = MAX_C;
		for (unsigned d = 0; d < t->ndim; d++) {
			unsigned p = 1 + (unsigned)below(5);
			while (p > 1 && budget / p < 1)
				p--;
			if (budget / p == 0)
				p = 1;
			parts[d] = p;
			budget /= p;
		}
		grid(t, parts);
	}
	gen_files(g);
}

/* ---- checking a plan against the manifest, independently ---- */

/* The file offset of global element gi of tensor t, from the generator's
 * own chunk list. */
static uint64_t elem_off(const struct gtensor *t, const uint64_t *gi, uint32_t *ret_file)
{
	size_t es = ckpt_dtype_size(t->dt);

	for (size_t k = 0; k < t->n; k++) {
		const struct gchunk *c = &t->c[k];
		uint64_t o = 0;
		bool in = true;
		for (unsigned d = 0; d < t->ndim && in; d++) {
			in = gi[d] >= c->offs[d] && gi[d] < c->offs[d] + c->shape[d];
			o = o * c->shape[d] + (gi[d] - c->offs[d]);
		}
		if (in) {
			*ret_file = c->file;
			return c->begin + o * es;
		}
	}
	ck_abort_msg("element outside every chunk");
	return 0;
}

struct wantbuf {
	uint64_t offs[4], shape[4];
	uint8_t *data;   /* row-major box */
	uint8_t *cover;  /* per element */
};

/* Runs plan p as an executor would, against the simulated files, checking
 * every invariant on the way, then compares every destination byte with
 * the generator's own idea of where that element lives. */
static void run_plan(const struct gen *g, const struct manifest *m, const struct plan *p,
		     const struct plan_want *wants, struct wantbuf *wb, size_t n_wants,
		     uint64_t max_read)
{
	uint64_t read_total = 0;

	for (size_t r = 0; r < p->n_reads; r++) {
		const struct plan_read *rd = &p->reads[r];
		const uint8_t *fb;

		need((rd->file) < (g->n_f));
		need((rd->end) <= (g->fsize[rd->file]));
		need((rd->begin) < (rd->end));
		need((rd->end - rd->begin) <= (max_read));
		/* Reads of one file are in order of their start.  Two may
		 * overlap (boxes that share a CRC piece, cut apart by
		 * max_read): each verifies what it serves on its own. */
		if (r > 0 && p->reads[r - 1].file == rd->file)
			need((p->reads[r - 1].begin) <= (rd->begin));
		if (r > 0)
			need((p->reads[r - 1].file) <= (rd->file));
		read_total += rd->end - rd->begin;
		fb = g->fbuf[rd->file];
		for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++) {
			const struct plan_check *ck = &p->checks[k];
			const struct manifest_chunk *c = &m->items[ck->item].chunks[ck->chunk];
			uint64_t bad = 0;

			need((c->file) == (rd->file));
			need((ck->begin) >= (rd->begin));
			need((ck->end) <= (rd->end));
			need((ck->begin) >= (c->begin));
			need((ck->end) <= (c->end));
			need(ck->begin == c->begin || ck->begin % LAYOUT_CRC_BLOCK == 0);
			need(ck->end == c->end || ck->end % LAYOUT_CRC_BLOCK == 0);
			need(plan_check_span(m, ck, fb + rd->begin, rd->begin, &bad) == 0);
			/* A read's spans are in file order and disjoint: the
			 * direct path checksums them in one forward pass over
			 * the destinations. */
			if (k > rd->check0)
				need((p->checks[k - 1].end) <= (ck->begin));
		}
		for (size_t i = rd->copy0; i < rd->copy0 + rd->n_copies; i++) {
			const struct plan_copy *cp = &p->copies[i];
			const struct manifest_tensor *t = &m->items[cp->item];
			const struct manifest_chunk *c = &t->chunks[cp->chunk];
			const struct plan_want *w = &wants[cp->want];
			struct wantbuf *b = &wb[cp->want];
			size_t es = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
			uint64_t S[CKPT_MAX_NDIM], idx[4] = { 0 }, n = vol(cp->shape, t->ndim);

			need((cp->item) == (w->item));
			need((cp->tag) == (w->tag));
			need((cp->bytes) == (n * es));
			plan_chunk_strides(t, c, es, S);
			for (uint64_t e = 0; e < n; e++) {
				uint64_t src = cp->src, di = 0;
				bool checked = false;

				for (unsigned d = 0; d < t->ndim; d++) {
					uint64_t gi = cp->offsets[d] + idx[d];
					need((gi) >= (w->offsets[d]));
					need((gi) < (w->offsets[d] + w->shape[d]));
					need((gi) >= (c->offsets[d]));
					need((gi) < (c->offsets[d] + c->shape[d]));
					src += idx[d] * S[d];
					di = di * w->shape[d] + (gi - w->offsets[d]);
				}
				need((src) >= (rd->begin));
				need((src + es) <= (rd->end));
				for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++)
					if (p->checks[k].item == cp->item &&
					    p->checks[k].chunk == cp->chunk &&
					    src >= p->checks[k].begin && src + es <= p->checks[k].end)
						checked = true;
				need(checked);
				memcpy(b->data + di * es, fb + src, es);
				b->cover[di]++;
				for (unsigned d = t->ndim; d-- > 0;) {
					if (++idx[d] < cp->shape[d])
						break;
					idx[d] = 0;
				}
			}
		}
	}
	need((read_total) == (p->bytes_read));

	/* Every element exactly once, with the right bytes. */
	uint64_t wanted = 0;
	for (size_t i = 0; i < n_wants; i++) {
		const struct gtensor *t = NULL;
		const struct manifest_tensor *mt = &m->items[wants[i].item];
		for (size_t k = 0; k < g->n_t; k++)
			if (!strcmp(g->t[k].name, mt->name))
				t = &g->t[k];
		ck_assert_ptr_nonnull(t);
		size_t es = ckpt_dtype_size(t->dt);
		uint64_t n = vol(wb[i].shape, t->ndim), idx[4] = { 0 };
		wanted += n * es;
		for (uint64_t e = 0; e < n; e++) {
			uint64_t gi[4];
			uint32_t f;
			for (unsigned d = 0; d < t->ndim; d++)
				gi[d] = wb[i].offs[d] + idx[d];
			if (wb[i].cover[e] != 1)
				ck_abort_msg("'%s' want %zu element %llu covered %u times", t->name,
					     i, (unsigned long long)e, wb[i].cover[e]);
			uint64_t o = elem_off(t, gi, &f);
			for (size_t b = 0; b < es; b++)
				need((wb[i].data[e * es + b]) == (fbyte(f, o + b)));
			for (unsigned d = t->ndim; d-- > 0;) {
				if (++idx[d] < wb[i].shape[d])
					break;
				idx[d] = 0;
			}
		}
	}
	need((wanted) == (p->bytes_wanted));
}

/* A random box of tensor t (sometimes the whole tensor, sometimes empty). */
static void random_box(const struct manifest_tensor *t, uint64_t *offs, uint64_t *shape)
{
	unsigned kind = (unsigned)below(5);

	for (unsigned d = 0; d < t->ndim; d++) {
		if (kind == 0 || t->shape[d] == 0) {
			offs[d] = 0;
			shape[d] = t->shape[d];
		} else {
			offs[d] = below(t->shape[d]);
			shape[d] = 1 + below(t->shape[d] - offs[d]);
			if (kind == 1 && below(8) == 0)
				shape[d] = 0;
		}
	}
}

START_TEST(test_random)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;

	rng_state = 0x5EED0000u + (uint64_t)_i;
	gen_random(&g);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	/* Several plans against one index: later ones use the sorted index
	 * of tensors asked about often. */
	for (int round = 0; round < 4; round++) {
		struct plan_want wants[96];
		struct wantbuf wb[96];
		size_t n = 1 + below(96);
		struct plan_opts o = { 0 };
		struct plan *p = NULL;
		char err[256] = "";
		uint64_t maxr;

		static const uint64_t gaps[] = { 0, 1, 4096, 2 * MiB };
		static const uint64_t reads[] = { 0, 4 * MiB, 5 * MiB + 17 };
		o.merge_gap = gaps[below(4)];
		o.max_read = reads[below(3)];
		maxr = o.max_read ? o.max_read : PLAN_DEFAULT_MAX_READ;
		for (size_t i = 0; i < n; i++) {
			uint32_t item = (uint32_t)below(m.n_items);
			const struct manifest_tensor *t = &m.items[item];
			random_box(t, wb[i].offs, wb[i].shape);
			uint64_t v = vol(wb[i].shape, t->ndim);
			wb[i].data = malloc(v * ckpt_dtype_size((enum ckpt_dtype)t->dtype) + 1);
			wb[i].cover = calloc(v + 1, 1);
			wants[i] = (struct plan_want){ .item = item, .tag = (uint32_t)(1000 + i),
						       .offsets = wb[i].offs, .shape = wb[i].shape };
		}
		ck_assert_msg(plan_build(ix, wants, n, &o, &p, err, sizeof(err)) == 0, "%s", err);
		run_plan(&g, &m, p, wants, wb, n, maxr);
		plan_free(p);
		for (size_t i = 0; i < n; i++) {
			free(wb[i].data);
			free(wb[i].cover);
		}
	}
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

/* A checkpoint of one 2-D F32 tensor, rows x cols, cut into `parts` row
 * blocks, all in one file. */
static void gen_rows(struct gen *g, uint64_t rows, uint64_t cols, unsigned parts)
{
	memset(g, 0, sizeof(*g));
	g->n_f = 1;
	g->n_t = 1;
	struct gtensor *t = &g->t[0];
	snprintf(t->name, sizeof(t->name), "w");
	t->dt = CKPT_F32;
	t->ndim = 2;
	t->shape[0] = rows;
	t->shape[1] = cols;
	t->n = parts;
	for (unsigned k = 0; k < parts; k++) {
		t->c[k].offs[0] = rows * k / parts;
		t->c[k].shape[0] = rows * (k + 1) / parts - t->c[k].offs[0];
		t->c[k].shape[1] = cols;
	}
	gen_files(g);
}

/* Same layout: a box that is one saved chunk reads exactly its bytes; the
 * whole tensor is one read. */
START_TEST(test_same_layout)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	struct plan *p;
	char err[256];

	gen_rows(&g, 1024, 1000, 8);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	for (unsigned k = 0; k < 8; k++) {
		struct plan_want w = { .item = 0, .offsets = g.t[0].c[k].offs,
				       .shape = g.t[0].c[k].shape };
		ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), 0);
		ck_assert_uint_eq(p->n_reads, 1);
		ck_assert_uint_eq(p->n_copies, 1);
		ck_assert_uint_eq(p->bytes_read, p->bytes_wanted);
		ck_assert_uint_eq(p->reads[0].begin, g.t[0].c[k].begin);
		ck_assert_uint_eq(p->reads[0].end, g.t[0].c[k].end);
		plan_free(p);
	}
	struct plan_want all = { .item = 0, .offsets = (uint64_t[]){ 0, 0 },
				 .shape = g.t[0].shape };
	ck_assert_int_eq(plan_build(ix, &all, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_reads, 1);
	ck_assert_uint_eq(p->n_copies, 8);
	ck_assert_uint_eq(p->bytes_read, 1024 * 1000 * 4);
	plan_free(p);
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

/* Column bands of row blocks: short rows are read whole (a CRC piece holds
 * many rows), long rows only around the band. */
START_TEST(test_column_band)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	struct plan *p;
	char err[256];
	uint64_t offs[2] = { 0, 0 }, shape[2];

	/* 2 KiB rows: each chunk is one segment, the file is read whole. */
	gen_rows(&g, 4096, 512, 8);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	offs[1] = 171;
	shape[0] = 4096;
	shape[1] = 170;
	struct plan_want w = { .item = 0, .offsets = offs, .shape = shape };
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->bytes_wanted, 4096 * 170 * 4);
	ck_assert_uint_eq(p->n_copies, 8);
	ck_assert_uint_eq(p->n_reads, 1);
	plan_free(p);
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);

	/* 4 MiB rows, a band of the first 256 KiB of each: one segment per
	 * row (the gap is far above merge_gap), each widened to its first
	 * CRC piece at most. */
	gen_rows(&g, 8, 1 << 20, 2);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	offs[1] = 0;
	shape[0] = 8;
	shape[1] = 65536;
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_copies, 8);
	ck_assert_uint_eq(p->n_reads, 8);
	ck_assert_uint_le(p->bytes_read, 8 * 2 * MiB);
	ck_assert_uint_ge(p->bytes_read, 8 * 256 * 1024);
	plan_free(p);
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

START_TEST(test_errors)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	struct plan *p = NULL;
	char err[256] = "";
	uint64_t offs[2] = { 0, 0 }, shape[2] = { 65, 10 };

	gen_rows(&g, 64, 10, 2);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	struct plan_want w = { .item = 0, .offsets = offs, .shape = shape };
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(err, "'w'") && strstr(err, "exceeds 64"), "%s", err);
	shape[0] = 1;
	offs[1] = 11;
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), -EINVAL);
	offs[1] = 0;
	w.item = 1;
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "out of range"), "%s", err);
	ck_assert_int_eq(plan_build(ix, &w, (size_t)PLAN_MAX_WANTS + 1, NULL, &p, err, sizeof(err)),
			 -E2BIG);
	ck_assert_ptr_null(p);
	/* Nothing wanted: an empty plan. */
	ck_assert_int_eq(plan_build(ix, &w, 0, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_reads, 0);
	plan_free(p);
	plan_free(NULL);
	plan_index_free(NULL);
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

/* A flipped byte fails its piece's check, at that piece's offset. */
START_TEST(test_check_span)
{
	struct gen g;
	struct manifest m;
	struct plan_check k = { 0 };
	uint64_t bad = 0;

	gen_rows(&g, 1024, 1024, 1); /* 4 MiB, from 4096: five pieces */
	gen_manifest(&g, &m);
	k.begin = m.items[0].chunks[0].begin;
	k.end = m.items[0].chunks[0].end;
	ck_assert_int_eq(plan_check_span(&m, &k, g.fbuf[0], 0, &bad), 0);
	g.fbuf[0][2 * MiB + 5] ^= 0x40;
	ck_assert_int_eq(plan_check_span(&m, &k, g.fbuf[0], 0, &bad), -EBADMSG);
	ck_assert_uint_eq(bad, 2 * MiB);
	k.begin = 3 * MiB;
	ck_assert_int_eq(plan_check_span(&m, &k, g.fbuf[0] + 3 * MiB, 3 * MiB, &bad), 0);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

/* ---- hostile and extreme manifests ---- */

/* A box of a test table: item, offsets, shape (ndim entries used). */
struct box {
	uint32_t item;
	uint64_t offs[4], shape[4];
};

/* Plans boxes bx against m and, if that succeeds, runs the plan through
 * run_plan().  Returns plan_build()'s result (the plan is NULL on
 * failure). */
static int try_plan(const struct gen *g, const struct manifest *m, struct plan_index *ix,
		    const struct box *bx, size_t n, const struct plan_opts *o, char *err,
		    size_t errlen)
{
	struct plan_want *wants = calloc(n + 1, sizeof(*wants));
	struct wantbuf *wb = calloc(n + 1, sizeof(*wb));
	struct plan *p = NULL;
	int r;

	ck_assert_ptr_nonnull(wants);
	ck_assert_ptr_nonnull(wb);
	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = &m->items[bx[i].item];
		uint64_t v;

		memcpy(wb[i].offs, bx[i].offs, sizeof(wb[i].offs));
		memcpy(wb[i].shape, bx[i].shape, sizeof(wb[i].shape));
		v = vol(wb[i].shape, t->ndim);
		wb[i].data = malloc(v * ckpt_dtype_size((enum ckpt_dtype)t->dtype) + 1);
		wb[i].cover = calloc(v + 1, 1);
		ck_assert_ptr_nonnull(wb[i].data);
		ck_assert_ptr_nonnull(wb[i].cover);
		wants[i] = (struct plan_want){ .item = bx[i].item, .tag = (uint32_t)(500 + i),
					       .offsets = wb[i].offs, .shape = wb[i].shape };
	}
	r = plan_build(ix, wants, n, o, &p, err, errlen);
	if (r == 0)
		run_plan(g, m, p, wants, wb, n,
			 o && o->max_read > 4 * MiB ? o->max_read :
			 o && o->max_read ? 4 * MiB : PLAN_DEFAULT_MAX_READ);
	else
		ck_assert_ptr_null(p);
	plan_free(p);
	for (size_t i = 0; i < n; i++) {
		free(wb[i].data);
		free(wb[i].cover);
	}
	free(wants);
	free(wb);
	return r;
}

static void gen_tensor1(struct gtensor *t, const char *name, uint64_t len, unsigned parts)
{
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dt = CKPT_U8;
	t->ndim = 1;
	t->shape[0] = len;
	t->n = parts;
	for (unsigned k = 0; k < parts; k++) {
		t->c[k].offs[0] = len * k / parts;
		t->c[k].shape[0] = len * (k + 1) / parts - t->c[k].offs[0];
	}
}

/* CRC arrays of chunks moved by move_chunk(), freed by moved_free(). */
static uint32_t *moved_crcs[8];
static size_t n_moved;

/*
 * Moves chunk k of tensor ti to file offset `begin` (same length), in the
 * generator and in the parsed manifest m, with CRCs of the bytes there.
 * The manifest is changed after manifest_parse, so that the planner's own
 * defence is what is tested, whether or not the parser refuses chunks
 * that share bytes.
 */
static void move_chunk(struct gen *g, struct manifest *m, size_t ti, size_t k, uint64_t begin)
{
	struct gchunk *gc = &g->t[ti].c[k];
	const struct manifest_tensor *mt = manifest_find(m, ITEM_TENSOR, g->t[ti].name);
	struct manifest_chunk *c;
	uint64_t end = begin + (gc->end - gc->begin), pos = begin;
	uint32_t *crcs = calloc(layout_crc_count(begin, end) + 1, sizeof(*crcs));
	size_t i = 0;

	ck_assert_ptr_nonnull(mt);
	ck_assert_ptr_nonnull(crcs);
	ck_assert_uint_lt(n_moved, sizeof(moved_crcs) / sizeof(moved_crcs[0]));
	c = &mt->chunks[k];
	while (pos < end) {
		uint64_t grid_end = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
		uint64_t stop = grid_end < end ? grid_end : end;
		crcs[i++] = crc32c(g->fbuf[gc->file] + pos, stop - pos, 0);
		pos = stop;
	}
	moved_crcs[n_moved++] = crcs;
	gc->begin = c->begin = begin;
	gc->end = c->end = end;
	c->crcs = crcs;
}

static void moved_free(void)
{
	while (n_moved)
		free(moved_crcs[--n_moved]);
}

/*
 * A manifest whose chunks share file bytes (nothing the daemon writes,
 * and what a hand-made manifest can claim): "a" (3 MiB) from offset 4096;
 * "b" (1.5 MiB) lies inside a, from 512 KiB into it; "c" (2 MiB, two
 * chunks of 1 MiB) has its second chunk start 256 KiB into its first.
 * Every CRC matches the bytes, so only the sharing is wrong.
 */
static void gen_shared(struct gen *g, struct manifest *m)
{
	memset(g, 0, sizeof(*g));
	g->n_f = 1;
	g->n_t = 3;
	gen_tensor1(&g->t[0], "a", 3 * MiB, 1);
	gen_tensor1(&g->t[1], "b", 3 * MiB / 2, 1);
	gen_tensor1(&g->t[2], "c", 2 * MiB, 2);
	gen_files(g);
	gen_manifest(g, m);
	move_chunk(g, m, 1, 0, g->t[0].c[0].begin + MiB / 2);
	move_chunk(g, m, 2, 1, g->t[2].c[0].begin + MiB / 4);
}

/* Elements of a and b for a read that holds a's head and b's tail back to
 * back: a's copy ends at file offset 4096 + A_HEAD, past the first grid
 * line, and b's copy starts there, so b's first CRC span begins before it
 * (at the grid line) while a's last span ends after it (at the next one).
 * An executor that checks spans in one forward pass over the destinations
 * would step back before b's destination. */
#define A_HEAD  (300 * 4096ull)
#define B_FROM  (4096 + A_HEAD - (4096 + MiB / 2))
#define B_LEN   (3 * MiB / 2)

static const struct {
	const char *what;
	struct box bx[2];
	size_t n;
	int ret;
	const char *names[2]; /* both named in the message */
} shared_cases[] = {
	{ "a alone", { { 0, { 0 }, { 3 * MiB } } }, 1, 0, { NULL, NULL } },
	{ "b alone", { { 1, { 0 }, { B_LEN } } }, 1, 0, { NULL, NULL } },
	{ "a and b whole", { { 0, { 0 }, { 3 * MiB } }, { 1, { 0 }, { B_LEN } } }, 2, -EBADMSG,
	  { "'a'", "'b'" } },
	{ "a's head and b's tail back to back",
	  { { 0, { 0 }, { A_HEAD } }, { 1, { B_FROM }, { B_LEN - B_FROM } } }, 2, -EBADMSG,
	  { "'a'", "'b'" } },
	{ "one element of each in one piece",
	  { { 1, { 0 }, { 10 } }, { 0, { 600 * 1024 }, { 10 } } }, 2, -EBADMSG, { "'a'", "'b'" } },
	/* The bytes the boxes need are pieces apart: nothing read is
	 * claimed twice, each is verified against its own chunk. */
	{ "bytes far apart", { { 0, { 0 }, { 100 } }, { 1, { B_LEN - 100 }, { 100 } } }, 2, 0,
	  { NULL, NULL } },
	{ "c whole", { { 2, { 0 }, { 2 * MiB } } }, 1, -EBADMSG, { "'c'", "chunk 1" } },
	{ "c's first chunk", { { 2, { 0 }, { MiB } } }, 1, 0, { NULL, NULL } },
	{ "c's second chunk", { { 2, { MiB }, { MiB } } }, 1, 0, { NULL, NULL } },
	{ "c: the head of each chunk", { { 2, { 0 }, { 10 } }, { 2, { MiB }, { 10 } } }, 2, -EBADMSG,
	  { "'c'", "chunk 0" } },
};

/* Chunks that share file bytes are refused when a plan would read shared
 * bytes for two of them; boxes whose bytes are apart still load. */
START_TEST(test_shared_bytes)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	char err[512] = "";
	int r;

	gen_shared(&g, &m);
	ck_assert_str_eq(m.items[0].name, "a");
	ck_assert_str_eq(m.items[2].name, "c");
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	r = try_plan(&g, &m, ix, shared_cases[_i].bx, shared_cases[_i].n, NULL, err, sizeof(err));
	ck_assert_msg(r == shared_cases[_i].ret, "%s: %d (%s)", shared_cases[_i].what, r, err);
	for (int k = 0; k < 2 && r; k++)
		ck_assert_msg(strstr(err, shared_cases[_i].names[k]) &&
				      strstr(err, "rank-00000.safetensors"),
			      "%s: %s", shared_cases[_i].what, err);
	/* Small reads cut the same boxes otherwise; the answer stays. */
	struct plan_opts o = { .merge_gap = 1, .max_read = 4 * MiB };
	r = try_plan(&g, &m, ix, shared_cases[_i].bx, shared_cases[_i].n, &o, err, sizeof(err));
	ck_assert_msg(r == shared_cases[_i].ret, "%s (small reads): %d (%s)",
		      shared_cases[_i].what, r, err);
	plan_index_free(ix);
	manifest_free(&m);
	moved_free();
	gen_free(&g);
}
END_TEST

/* Two boxes sharing CRC pieces, cut apart by a small max_read: the reads
 * may then overlap, each still under max_read and verifying what it
 * serves (run_plan). */
START_TEST(test_overlapping_boxes)
{
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	struct plan_opts o = { .max_read = 4 * MiB };
	char err[256] = "";
	/* File bytes [4096, 2 MiB + 100) and [2 MiB + 50, 4.5 MiB + 50). */
	struct box bx[3] = {
		{ 0, { 0 }, { 2 * MiB + 100 - 4096 } },
		{ 0, { 2 * MiB + 50 - 4096 }, { 5 * MiB / 2 } },
		{ 0, { 0 }, { 8 * MiB } },
	};

	memset(&g, 0, sizeof(g));
	g.n_f = 1;
	g.n_t = 1;
	gen_tensor1(&g.t[0], "x", 8 * MiB, 1);
	gen_files(&g);
	gen_manifest(&g, &m);
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);
	ck_assert_int_eq(try_plan(&g, &m, ix, bx, 2, &o, err, sizeof(err)), 0);
	ck_assert_int_eq(try_plan(&g, &m, ix, bx, 3, &o, err, sizeof(err)), 0);
	ck_assert_int_eq(try_plan(&g, &m, ix, bx, 3, NULL, err, sizeof(err)), 0);
	plan_index_free(ix);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

/* Parses a manifest of one file of `fsize` bytes and the given tensors
 * object body (hand-written: sizes no generated file can have). */
static void parse_handmade(uint64_t fsize, const char *tensors, struct manifest *m)
{
	char *text, err[512] = "";
	int r;

	ck_assert_int_gt(asprintf(&text,
				  "{\"format\":\"ckpt-1\",\"name\":\"plan-test\",\"step\":1,"
				  "\"time\":\"2026-11-25T00:00:00Z\",\"job\":\"job\","
				  "\"world_size\":1,\"crc_block\":1048576,\"metadata\":{},"
				  "\"metrics\":{},\"files\":[{\"rank\":0,\"path\":"
				  "\"rank-00000.safetensors\",\"size\":%llu}],\"total_bytes\":%llu,"
				  "\"tensors\":{%s},\"blobs\":{}}",
				  (unsigned long long)fsize, (unsigned long long)fsize, tensors),
			 0);
	memset(m, 0, sizeof(*m));
	r = manifest_parse(text, strlen(text), m, err, sizeof(err));
	free(text);
	ck_assert_msg(r == 0, "manifest_parse: %d %s", r, err);
}

#define TWO62 4611686018427387904ull

/* Offsets near the top of the 63-bit range, a tensor of volume 0 whose
 * other dimensions are 2^62, a 0-D tensor: every box either plans exactly
 * or is refused with -EINVAL, nothing wraps. */
START_TEST(test_extremes)
{
	static const char tensors[] =
		"\"far\":{\"dtype\":\"U8\",\"shape\":[2],\"chunks\":[{\"file\":0,\"offsets\":[0],"
		"\"shape\":[2],\"begin\":9223372036854775805,\"end\":9223372036854775807,"
		"\"crc32c\":[7]}]},"
		"\"flat\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0,4611686018427387904],"
		"\"chunks\":[{\"file\":0,\"offsets\":[0,0,0],\"shape\":[4611686018427387904,0,"
		"4611686018427387904],\"begin\":4096,\"end\":4096,\"crc32c\":[]},"
		"{\"file\":0,\"offsets\":[0,0,0],\"shape\":[0,0,0],\"begin\":9223372036854775807,"
		"\"end\":9223372036854775807,\"crc32c\":[]}]},"
		"\"s\":{\"dtype\":\"F64\",\"shape\":[],\"chunks\":[{\"file\":0,\"offsets\":[],"
		"\"shape\":[],\"begin\":8192,\"end\":8200,\"crc32c\":[9]}]}";
	static const struct {
		uint64_t offs[3], shape[3];
		int ret;
	} flat[] = {
		{ { 0, 0, 0 }, { TWO62, 0, TWO62 }, 0 },
		{ { TWO62, 0, TWO62 }, { 0, 0, 0 }, 0 },
		{ { 1, 0, 0 }, { TWO62 - 1, 0, 5 }, 0 },
		{ { TWO62, 0, 0 }, { 1, 0, 0 }, -EINVAL },
		{ { 0, 0, UINT64_MAX }, { 0, 0, 1 }, -EINVAL },
		{ { 1, 0, 0 }, { UINT64_MAX, 0, 0 }, -EINVAL },
		{ { UINT64_MAX, 0, 0 }, { 1, 0, 0 }, -EINVAL },
		{ { 0, 1, 0 }, { 0, 0, 0 }, -EINVAL },
		{ { 0, 0, 0 }, { 0, UINT64_MAX, 0 }, -EINVAL },
	};
	struct manifest m;
	struct plan_index *ix;
	struct plan *p = NULL;
	char err[256] = "";
	uint64_t o1[1] = { 0 }, s1[1] = { 2 };

	parse_handmade(INT64_MAX, tensors, &m);
	ck_assert_str_eq(m.items[0].name, "far");
	ck_assert_str_eq(m.items[1].name, "flat");
	ck_assert_str_eq(m.items[2].name, "s");
	ck_assert_int_eq(plan_index_new(&m, &ix), 0);

	/* The last two bytes a file can have. */
	struct plan_want w = { .item = 0, .offsets = o1, .shape = s1 };
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_reads, 1);
	ck_assert_uint_eq(p->reads[0].begin, (uint64_t)INT64_MAX - 2);
	ck_assert_uint_eq(p->reads[0].end, (uint64_t)INT64_MAX);
	ck_assert_uint_eq(p->n_checks, 1);
	ck_assert_uint_eq(p->checks[0].begin, (uint64_t)INT64_MAX - 2);
	ck_assert_uint_eq(p->checks[0].end, (uint64_t)INT64_MAX);
	ck_assert_uint_eq(p->copies[0].src, (uint64_t)INT64_MAX - 2);
	ck_assert_uint_eq(p->bytes_wanted, 2);
	plan_free(p);
	o1[0] = 1;
	s1[0] = 1;
	ck_assert_int_eq(plan_build(ix, &w, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->copies[0].src, (uint64_t)INT64_MAX - 1);
	ck_assert_uint_eq(p->reads[0].begin, (uint64_t)INT64_MAX - 2);
	plan_free(p);

	for (size_t i = 0; i < sizeof(flat) / sizeof(flat[0]); i++) {
		struct plan_want f = { .item = 1, .offsets = flat[i].offs, .shape = flat[i].shape };
		/* Six times, as a planner of many ranks would ask. */
		struct plan_want fs[6] = { f, f, f, f, f, f };

		p = NULL;
		ck_assert_msg(plan_build(ix, fs, 6, NULL, &p, err, sizeof(err)) == flat[i].ret,
			      "flat box %zu: %s", i, err);
		if (flat[i].ret) {
			ck_assert_ptr_null(p);
			ck_assert_msg(strstr(err, "'flat'"), "%s", err);
			continue;
		}
		ck_assert_uint_eq(p->n_reads, 0);
		ck_assert_uint_eq(p->n_copies, 0);
		ck_assert_uint_eq(p->bytes_wanted, 0);
		plan_free(p);
	}

	/* 0-D: no offsets or shape; alone (no dims at all in the plan) and
	 * with a 1-D box. */
	struct plan_want z[2] = { { .item = 2, .tag = 4 }, { .item = 0, .offsets = o1, .shape = s1 } };
	ck_assert_int_eq(plan_build(ix, z, 1, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_copies, 1);
	ck_assert_uint_eq(p->copies[0].tag, 4);
	ck_assert_uint_eq(p->copies[0].src, 8192);
	ck_assert_uint_eq(p->copies[0].bytes, 8);
	ck_assert_uint_eq(p->reads[0].begin, 8192);
	ck_assert_uint_eq(p->reads[0].end, 8200);
	plan_free(p);
	ck_assert_int_eq(plan_build(ix, z, 2, NULL, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p->n_copies, 2);
	ck_assert_uint_eq(p->n_reads, 2);
	ck_assert_uint_eq(p->bytes_wanted, 9);
	ck_assert_uint_eq(p->copies[1].offsets[0], 1);
	ck_assert_uint_eq(p->copies[1].shape[0], 1);
	plan_free(p);
	/* A 1-D box without offsets is refused, not dereferenced. */
	z[1].offsets = NULL;
	ck_assert_int_eq(plan_build(ix, z, 2, NULL, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "'far'"), "%s", err);

	plan_index_free(ix);
	manifest_free(&m);
}
END_TEST

/* A 2-D grid with given cuts (cuts repeated make chunks of volume 0). */
static void grid2(struct gtensor *t, const uint64_t *rows, unsigned nr, const uint64_t *cols,
		  unsigned nc)
{
	t->ndim = 2;
	t->shape[0] = rows[nr];
	t->shape[1] = cols[nc];
	t->n = 0;
	for (unsigned i = 0; i < nr; i++)
		for (unsigned j = 0; j < nc; j++) {
			struct gchunk *c = &t->c[t->n++];
			c->offs[0] = rows[i];
			c->shape[0] = rows[i + 1] - rows[i];
			c->offs[1] = cols[j];
			c->shape[1] = cols[j + 1] - cols[j];
		}
}

/* Many boxes on one tensor of many chunks, some of volume 0 (the sorted
 * index answers after a few boxes): single elements on each side of every
 * cut, bands between cuts, the whole tensor twice, boxes of extent 0 --
 * each element of each box exactly once, with its bytes. */
START_TEST(test_many_boxes)
{
	static const uint64_t rows[] = { 0, 100, 100, 370, 640, 640, 1000 };
	static const uint64_t cols[] = { 0, 0, 300, 310, 890, 900 };
	static const struct plan_opts opts[] = { { 0 }, { .merge_gap = 1, .max_read = 4 * MiB } };
	struct gen g;
	struct manifest m;
	struct plan_index *ix;
	struct box *bx = calloc(512, sizeof(*bx));
	size_t n = 0;
	char err[256] = "";

	ck_assert_ptr_nonnull(bx);
	rng_state = 0xB0C5;
	memset(&g, 0, sizeof(g));
	g.n_f = 2;
	g.n_t = 1;
	snprintf(g.t[0].name, sizeof(g.t[0].name), "g");
	g.t[0].dt = CKPT_F64;
	grid2(&g.t[0], rows, 6, cols, 5);
	ck_assert_uint_ge(g.t[0].n, 16);
	gen_files(&g);
	gen_manifest(&g, &m);
	for (unsigned i = 0; i < 7; i++)
		for (unsigned j = 0; j < 6; j++)
			for (unsigned di = 0; di < 2; di++)
				for (unsigned dj = 0; dj < 2; dj++) {
					uint64_t r = rows[i] - di, c = cols[j] - dj;
					if (r >= 1000 || c >= 900)
						continue; /* -1 wrapped, or past the end */
					bx[n++] = (struct box){ 0, { r, c }, { 1, 1 } };
				}
	for (unsigned i = 0; i + 1 < 7; i++)
		bx[n++] = (struct box){ 0, { rows[i], 0 }, { rows[i + 1] - rows[i], 900 } };
	for (unsigned j = 0; j + 1 < 6; j++)
		bx[n++] = (struct box){ 0, { 0, cols[j] }, { 1000, cols[j + 1] - cols[j] } };
	bx[n++] = (struct box){ 0, { 0, 0 }, { 1000, 900 } };
	bx[n++] = (struct box){ 0, { 0, 0 }, { 1000, 900 } };
	bx[n++] = (struct box){ 0, { 500, 7 }, { 0, 800 } };
	bx[n++] = (struct box){ 0, { 1000, 900 }, { 0, 0 } };
	while (n < 400) {
		uint64_t r = below(1000), c = below(900);
		bx[n++] = (struct box){ 0, { r, c }, { 1 + below(1000 - r), 1 + below(900 - c) } };
	}
	for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
		ck_assert_int_eq(plan_index_new(&m, &ix), 0);
		/* First a few boxes alone (the linear scan), then all of them
		 * (the index), then again from the built index. */
		for (size_t i = 0; i < 3; i++)
			ck_assert_msg(try_plan(&g, &m, ix, &bx[i], 1, &opts[k], err, sizeof(err)) == 0,
				      "%s", err);
		ck_assert_msg(try_plan(&g, &m, ix, bx, n, &opts[k], err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(try_plan(&g, &m, ix, bx + 200, n - 200, &opts[k], err, sizeof(err)) == 0,
			      "%s", err);
		plan_index_free(ix);
	}
	free(bx);
	manifest_free(&m);
	gen_free(&g);
}
END_TEST

static Suite *plan_suite(void)
{
	Suite *s = suite_create("plan");
	TCase *tc;

	tc = tcase_create("random");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_random, 0, 60);
	suite_add_tcase(s, tc);
	tc = tcase_create("layouts");
	tcase_add_test(tc, test_same_layout);
	tcase_add_test(tc, test_column_band);
	suite_add_tcase(s, tc);
	tc = tcase_create("hostile");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_shared_bytes, 0,
			    (int)(sizeof(shared_cases) / sizeof(shared_cases[0])));
	tcase_add_test(tc, test_overlapping_boxes);
	tcase_add_test(tc, test_extremes);
	tcase_add_test(tc, test_many_boxes);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_check_span);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(plan_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
