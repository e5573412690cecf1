/* SPDX-License-Identifier: MIT */
/* check_plan.c - load planning: boxes against saved chunks, byte runs,
 * CRC widening, merged reads (format/plan.c). */
#include <check.h>
#include <errno.h>
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
		if (r > 0 && p->reads[r - 1].file == rd->file)
			need((p->reads[r - 1].end) <= (rd->begin));
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
