/* SPDX-License-Identifier: MIT */
/*
 * check_load_hostile.c - integration: loads from damaged and hand-edited
 * checkpoints.
 *
 * A real ckptd saves small checkpoints and is stopped; then the files are
 * changed on disk behind the library's back: a byte flipped in every region
 * of a shard, shards cut short or grown, the shards of two checkpoints of
 * one layout swapped, a shard replaced after the reader opened it or turned
 * into a FIFO, manifest.json edited so that two chunks claim the same bytes
 * or a tensor is cut into many row blocks.  Every load must either hand back
 * exactly the saved bytes or fail with the errno and a message naming what
 * is wrong.  Destinations sit between PROT_NONE guard pages, flush against
 * one of them, so that a byte written (or read) outside a box kills the
 * test, and every byte of a destination outside its box must keep its
 * padding value.  Then the contracts around the load: a failure says when
 * destinations were written, a caller's newer (longer) struct ckpt_load_dst
 * is stepped through by its own size, strides that reach past the address
 * space are refused, a FIFO in a shard's or a manifest's place never hangs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "format/crc32c.h"
#include "format/layout.h"
#include "tests/lib/testd.h"

#define MiB    (1024ull * 1024ull)
#define PAD    0xA5
#define SHARD0 "rank-00000.safetensors"
#define SHARD1 "rank-00001.safetensors"
#define ARENA  (32 * MiB)

/* ---- the saved checkpoints ---- */

enum { W, E, S, Z, B, N_ITEMS };

/* What a base checkpoint holds: w is cut into one row block per saving
 * rank, the rest is rank 0's. */
static const struct bitem {
	const char *name;
	bool blob;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[2];
} base[N_ITEMS] = {
	[W] = { "w", false, CKPT_F32, 2, { 512, 1024 } }, /* 2 MiB: three CRC pieces */
	[E] = { "e", false, CKPT_I64, 2, { 3, 5 } },
	[S] = { "s", false, CKPT_F64, 0, { 0 } },         /* 0-D */
	[Z] = { "z", false, CKPT_F32, 2, { 0, 7 } },      /* no element */
	[B] = { "b", true, CKPT_U8, 1, { 100 } },
};

static const uint64_t zeros[2];

static uint64_t item_seed(uint64_t seed, unsigned i)
{
	return seed * 16 + i;
}

static size_t item_esize(unsigned i)
{
	return td_dtype_size(base[i].dt);
}

static size_t item_bytes(unsigned i)
{
	return (size_t)td_nbytes(item_esize(i), base[i].ndim, base[i].shape);
}

/* The bytes of item i of a checkpoint of `seed`: the global stream. */
static void *item_data(unsigned i, uint64_t seed)
{
	void *p = malloc(item_bytes(i) + 1);

	ck_assert_ptr_nonnull(p);
	td_fill_chunk(p, item_esize(i), base[i].ndim, base[i].shape, zeros, base[i].shape,
		      item_seed(seed, i));
	return p;
}

/*
 * Saves the base items as checkpoint `name` of step `seed` (its streams
 * derive from seed) through daemon 0, as `world` (1 or 2) ranks of this
 * process: each rank one row block of w.
 */
static void save_base(struct testd *t, const char *name, uint64_t seed, uint32_t world)
{
	struct ckpt_client *c[2];
	struct ckpt_save *sv[2];
	struct ckpt_future *fs[2], *fc[2];
	void *data[N_ITEMS];
	uint64_t offs[2][2], blk[2][2];
	static const uint64_t one[1] = { 1 };

	ck_assert(world == 1 || world == 2);
	for (unsigned i = 0; i < N_ITEMS; i++)
		data[i] = item_data(i, seed);
	for (uint32_t r = 0; r < world; r++) {
		c[r] = td_connect(td_sock(t, 0), "hostile", r, world, ARENA);
		ck_assert_int_eq(ckpt_save_begin(c[r], t->root, name, seed, &sv[r]), 0);
		offs[r][0] = 512 * r / world;
		offs[r][1] = 0;
		blk[r][0] = 512 * (r + 1) / world - offs[r][0];
		blk[r][1] = 1024;
		struct ckpt_tensor tw = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32,
					  .ndim = 2, .shape = blk[r],
					  .data = (char *)data[W] + offs[r][0] * 4096,
					  .global_shape = base[W].shape, .offsets = offs[r] };
		ck_assert_msg(ckpt_save_add_tensor(sv[r], &tw) == 0, "%s", ckpt_last_error());
	}
	for (unsigned i = E; i <= Z; i++) {
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = base[i].name,
					  .dtype = base[i].dt, .ndim = base[i].ndim,
					  .shape = base[i].ndim ? base[i].shape : one,
					  .data = data[i] };
		ck_assert_msg(ckpt_save_add_tensor(sv[0], &tn) == 0, "%s: %s", base[i].name,
			      ckpt_last_error());
	}
	ck_assert_int_eq(ckpt_save_add_blob(sv[0], "b", data[B], item_bytes(B)), 0);
	for (uint32_t r = 0; r < world; r++)
		ck_assert_int_eq(ckpt_save_commit(sv[r], &fs[r], &fc[r]), 0);
	for (uint32_t r = 0; r < world; r++) {
		int st = td_future_wait(fs[r], 60000), cm = td_future_wait(fc[r], 60000);
		ck_assert_msg(st == 0 && cm == 0, "rank %u: staged %d, committed %d: %s", r, st,
			      cm, ckpt_future_error(fc[r]));
		ckpt_save_free(sv[r]);
		ckpt_disconnect(c[r]);
	}
	for (unsigned i = 0; i < N_ITEMS; i++)
		free(data[i]);
}

/* Starts daemon 0, saves the checkpoints name[0..n) (seeds 1, 2, ...) and
 * stops the daemon: what follows needs no daemon, and a load that crashes
 * or hangs leaves none behind. */
static void setup(struct testd *t, const char *test, const char *const *names, unsigned n,
		  uint32_t world)
{
	td_init(t, test);
	ck_assert_int_eq(td_daemon_start(t, 0, "arena_max = 32M\ncommit_deadline = 60s\n"), 0);
	for (unsigned i = 0; i < n; i++)
		save_base(t, names[i], i + 1, world);
	ck_assert_int_eq(td_daemon_stop(t, 0), 0);
}

static char *ckpt_path(const struct testd *t, const char *name, char *buf, size_t len)
{
	return td_path(buf, len, "%s/%s", t->root, name);
}

static char *file_path(const struct testd *t, const char *name, const char *file, char *buf,
		       size_t len)
{
	return td_path(buf, len, "%s/%s/%s", t->root, name, file);
}

/* ---- destinations between guard pages ---- */

struct gbuf {
	uint8_t *map;    /* a guard page, the usable pages, a guard page */
	size_t map_len;
	uint8_t *mem;    /* [mem, mem + len): the usable bytes asked for */
	size_t len;
};

/* len usable bytes set to PAD, flush against the upper guard page (at_end)
 * or the lower one. */
static void gbuf_alloc(struct gbuf *g, size_t len, bool at_end)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (len + pg - 1) / pg * pg;

	if (body == 0)
		body = pg;
	g->map_len = body + 2 * pg;
	g->map = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		      0);
	ck_assert(g->map != MAP_FAILED);
	ck_assert_int_eq(mprotect(g->map, pg, PROT_NONE), 0);
	ck_assert_int_eq(mprotect(g->map + pg + body, pg, PROT_NONE), 0);
	memset(g->map + pg, PAD, body);
	g->mem = at_end ? g->map + pg + body - len : g->map + pg;
	g->len = len;
}

static void gbuf_free(struct gbuf *g)
{
	if (g->map)
		ck_assert_int_eq(munmap(g->map, g->map_len), 0);
	memset(g, 0, sizeof(*g));
}

/* One destination box of a base item: row-major over shape + pad (pad
 * elements after each dimension make it strided), in its own guarded
 * buffer that ends (at_end) or starts with the box's bytes. */
struct dbox {
	unsigned item;
	uint64_t offs[2], shape[2];
	uint64_t pad[2];
	bool at_end;
	bool null_data;   /* data NULL: a box of no element */
	/* set by dbox_alloc() */
	int64_t strides[2];
	bool strided;
	struct gbuf g;
	void *data;
};

/* A whole item, contiguous. */
static struct dbox whole(unsigned i, bool at_end)
{
	return (struct dbox){ .item = i, .shape = { base[i].shape[0], base[i].shape[1] },
			      .at_end = at_end };
}

static struct dbox box2(unsigned i, uint64_t r, uint64_t c, uint64_t nr, uint64_t nc,
			uint64_t pr, uint64_t pc, bool at_end)
{
	return (struct dbox){ .item = i, .offs = { r, c }, .shape = { nr, nc },
			      .pad = { pr, pc }, .at_end = at_end };
}

static uint64_t dbox_vol(const struct dbox *d)
{
	uint64_t v = 1;

	for (unsigned k = 0; k < base[d->item].ndim; k++)
		v *= d->shape[k];
	return v;
}

static void dbox_alloc(struct dbox *d)
{
	unsigned n = base[d->item].ndim;
	size_t es = item_esize(d->item);
	uint64_t len = 1, far = 0;

	d->strided = false;
	for (unsigned k = n; k-- > 0;) {
		d->strides[k] = (int64_t)len;
		len *= d->shape[k] + d->pad[k];
		d->strided |= d->pad[k] != 0;
	}
	if (dbox_vol(d)) {
		far = es;
		for (unsigned k = 0; k < n; k++)
			far += (d->shape[k] - 1) * (uint64_t)d->strides[k] * es;
	}
	gbuf_alloc(&d->g, (size_t)far, d->at_end);
	d->data = d->null_data ? NULL : d->g.mem;
}

/* The box holds item `item` of the checkpoint of `seed` at its offsets,
 * and every other byte of its buffer is still PAD. */
static void dbox_verify(const struct dbox *d, uint64_t seed, const char *who)
{
	unsigned n = base[d->item].ndim;
	size_t es = item_esize(d->item);
	uint64_t v = dbox_vol(d), idx[2] = { 0 };
	uint8_t *want = malloc(v * es + 1), *seen = calloc(d->g.len + 1, 1);

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(seen);
	td_fill_chunk(want, es, n, base[d->item].shape, d->offs, d->shape,
		      item_seed(seed, d->item));
	for (uint64_t e = 0; e < v; e++) {
		uint64_t off = 0;

		for (unsigned k = 0; k < n; k++)
			off += idx[k] * (uint64_t)d->strides[k] * es;
		if (memcmp(d->g.mem + off, want + e * es, es))
			ck_abort_msg("%s: '%s' box at [%llu, %llu]: element %llu differs", who,
				     base[d->item].name, (unsigned long long)d->offs[0],
				     (unsigned long long)d->offs[1], (unsigned long long)e);
		memset(seen + off, 1, es);
		for (unsigned k = n; k-- > 0;) {
			if (++idx[k] < d->shape[k])
				break;
			idx[k] = 0;
		}
	}
	for (size_t b = 0; b < d->g.len; b++)
		if (!seen[b] && d->g.mem[b] != PAD)
			ck_abort_msg("%s: '%s': byte %zu of the buffer, outside the box, was written",
				     who, base[d->item].name, b);
	free(want);
	free(seen);
}

/* Whether any byte of the box's buffer was written. */
static bool dbox_touched(const struct dbox *d)
{
	for (size_t b = 0; b < d->g.len; b++)
		if (d->g.mem[b] != PAD)
			return true;
	return false;
}

static void dboxes_free(struct dbox *bx, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gbuf_free(&bx[i].g);
}

/* ---- loading ---- */

enum stage { AT_OPEN, AT_ADD, AT_START, AT_DONE };

/*
 * Loads boxes bx[0..n) (allocated) from rd, one add call per item with all
 * its boxes.  Returns 0, or the errno of the add call, of ckpt_load_start()
 * or of the done future (*ret_stage says which); msg gets the message.
 */
static int load_rd(struct ckpt_reader *rd, struct dbox *bx, size_t n, enum stage *ret_stage,
		   char *msg, size_t len)
{
	struct ckpt_load_dst *dst = calloc(n + 1, sizeof(*dst));
	struct ckpt_load *ld;
	struct ckpt_future *done;
	int rc = 0;

	ck_assert_ptr_nonnull(dst);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	*ret_stage = AT_ADD;
	for (unsigned it = 0; it < N_ITEMS && !rc; it++) {
		const struct bitem *b = &base[it];
		uint32_t k = 0;

		for (size_t i = 0; i < n; i++) {
			if (bx[i].item != it)
				continue;
			dst[k++] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT,
							   .offsets = b->ndim ? bx[i].offs : NULL,
							   .shape = b->ndim ? bx[i].shape : NULL,
							   .strides = bx[i].strided ? bx[i].strides :
										      NULL,
							   .data = bx[i].data };
		}
		if (!k)
			continue;
		if (b->blob) {
			ck_assert_uint_eq(k, 1);
			rc = ckpt_load_add_blob(ld, b->name, dst[0].data, item_bytes(it));
		} else {
			struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = b->dt,
						       .name = b->name,
						       .global_shape = b->ndim ? b->shape : NULL,
						       .ndim = b->ndim, .n_dsts = k, .dsts = dst };
			rc = ckpt_load_add_tensor(ld, &lt);
		}
		if (rc)
			snprintf(msg, len, "%s", ckpt_last_error());
	}
	if (!rc) {
		*ret_stage = AT_START;
		rc = ckpt_load_start(ld, &done);
		if (rc) {
			snprintf(msg, len, "%s", ckpt_last_error());
		} else {
			*ret_stage = AT_DONE;
			rc = td_future_wait(done, 60000);
			snprintf(msg, len, "%s", ckpt_future_error(done));
		}
	}
	ckpt_load_free(ld);
	free(dst);
	return rc;
}

/* Opens checkpoint `path`, allocates the boxes and loads them. */
static int load_path(const char *path, struct dbox *bx, size_t n, enum stage *ret_stage,
		     char *msg, size_t len)
{
	struct ckpt_reader *rd;
	int rc = ckpt_reader_open(path, &rd);

	ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, ckpt_last_error());
	for (size_t i = 0; i < n; i++)
		dbox_alloc(&bx[i]);
	rc = load_rd(rd, bx, n, ret_stage, msg, len);
	ckpt_reader_close(rd);
	return rc;
}

/* The load succeeds and every box holds the checkpoint of `seed`. */
static void load_ok(const char *path, struct dbox *bx, size_t n, uint64_t seed, const char *who)
{
	enum stage st;
	char msg[1024] = "";
	int rc = load_path(path, bx, n, &st, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "%s: load failed (stage %d): %d %s", who, (int)st, rc, msg);
	for (size_t i = 0; i < n; i++)
		dbox_verify(&bx[i], seed, who);
	dboxes_free(bx, n);
}

/* The load fails with `err` after it started (the future), and its
 * message holds both substrings (NULL: not checked). */
static void load_fails(const char *path, struct dbox *bx, size_t n, int err, enum stage stage,
		       const char *s1, const char *s2, const char *who)
{
	enum stage st;
	char msg[1024] = "";
	int rc = load_path(path, bx, n, &st, msg, sizeof(msg));

	ck_assert_msg(rc == err && st == stage, "%s: load gave %d at stage %d, want %d at %d: %s",
		      who, rc, (int)st, err, (int)stage, msg);
	ck_assert_msg((!s1 || strstr(msg, s1)) && (!s2 || strstr(msg, s2)),
		      "%s: the message does not say '%s' and '%s': %s", who, s1 ? s1 : "",
		      s2 ? s2 : "", msg);
	dboxes_free(bx, n);
}

/* ---- the files ---- */

static void flip(const char *file, uint64_t off)
{
	int fd = open(file, O_RDWR | O_CLOEXEC);
	uint8_t c;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, (off_t)off), 1);
	c ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &c, 1, (off_t)off), 1);
	close(fd);
}

static uint64_t file_size(const char *file)
{
	struct stat sb;

	ck_assert_int_eq(stat(file, &sb), 0);
	return (uint64_t)sb.st_size;
}

/* Copies src over dst through a new file renamed into place (a new
 * inode, as a re-save would make). */
static void replace_file(const char *src, const char *dst)
{
	char tmp[TD_PATH], *text = NULL;
	size_t len = 0;
	FILE *f;

	ck_assert_int_eq(td_read_file(src, 1ull << 30, &text, &len), 0);
	td_path(tmp, sizeof(tmp), "%s.tmp", dst);
	f = fopen(tmp, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(text, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, dst), 0);
	free(text);
}

static void swap_files(const char *a, const char *b)
{
	char tmp[TD_PATH];

	td_path(tmp, sizeof(tmp), "%s.swap", a);
	ck_assert_int_eq(rename(a, tmp), 0);
	ck_assert_int_eq(rename(b, a), 0);
	ck_assert_int_eq(rename(tmp, b), 0);
}

/* ---- manifest.json by hand ---- */

static json_t *mf_read(const struct testd *t, const char *name)
{
	char p[TD_PATH];
	json_error_t e;
	json_t *m;

	td_path(p, sizeof(p), "%s/%s/manifest.json", t->root, name);
	m = json_load_file(p, JSON_REJECT_DUPLICATES, &e);
	ck_assert_msg(m != NULL, "%s: %s", p, e.text);
	return m;
}

static void mf_write(const struct testd *t, const char *name, json_t *m)
{
	char p[TD_PATH];

	td_path(p, sizeof(p), "%s/%s/manifest.json", t->root, name);
	ck_assert_int_eq(json_dump_file(m, p, JSON_COMPACT), 0);
	json_decref(m);
}

/* The object of item i (chunk k of a tensor; a blob is its own chunk). */
static json_t *mf_chunk(json_t *m, unsigned i, size_t k)
{
	json_t *o = json_object_get(json_object_get(m, base[i].blob ? "blobs" : "tensors"),
				    base[i].name);

	ck_assert_ptr_nonnull(o);
	if (!base[i].blob)
		o = json_array_get(json_object_get(o, "chunks"), k);
	ck_assert_ptr_nonnull(o);
	return o;
}

static uint64_t ju(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	ck_assert_msg(json_is_integer(v), "no integer '%s'", key);
	return (uint64_t)json_integer_value(v);
}

/* The byte range of item i's chunk k in checkpoint `name`. */
static void item_range(const struct testd *t, const char *name, unsigned i, size_t k,
		       uint64_t *ret_begin, uint64_t *ret_end)
{
	json_t *m = mf_read(t, name), *c = mf_chunk(m, i, k);

	*ret_begin = ju(c, "begin");
	*ret_end = ju(c, "end");
	json_decref(m);
}

/* CRC32C of the bytes [begin, end) of a file's image, in pieces cut on the
 * absolute grid (layout.h). */
static json_t *crcs_of(const uint8_t *img, uint64_t begin, uint64_t end)
{
	json_t *a = json_array();

	for (uint64_t pos = begin; pos < end;) {
		uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
		uint64_t stop = grid < end ? grid : end;

		json_array_append_new(a, json_integer(crc32c(img + pos, (size_t)(stop - pos), 0)));
		pos = stop;
	}
	return a;
}

/* A chunk object of file 0 for rows [r0, r0 + nr) of an [*, cols] tensor
 * of esize-byte elements whose row r0 starts at file offset begin. */
static json_t *row_chunk(const uint8_t *img, uint64_t r0, uint64_t nr, uint64_t cols,
			 uint64_t esize, uint64_t begin)
{
	uint64_t end = begin + nr * cols * esize;

	return json_pack("{sis[II]s[II]sIsIso}", "file", 0, "offsets", (json_int_t)r0, (json_int_t)0,
			 "shape", (json_int_t)nr, (json_int_t)cols, "begin", (json_int_t)begin,
			 "end", (json_int_t)end, "crc32c", crcs_of(img, begin, end));
}

static uint8_t *read_image(const char *file, size_t *ret_len)
{
	char *img = NULL;

	ck_assert_int_eq(td_read_file(file, 1ull << 30, &img, ret_len), 0);
	return (uint8_t *)img;
}

/* ---- 1. a flipped byte anywhere in the shard ---- */

/* The two ways every item is loaded: whole and contiguous (the direct
 * path: straight into the destinations, verified there), or in strided
 * boxes that together cover every CRC piece (the bounce path). */
static size_t flip_boxes(int mode, struct dbox *bx)
{
	size_t n = 0;

	if (mode == 0) {
		for (unsigned i = 0; i < N_ITEMS; i++)
			bx[n++] = whole(i, i % 2);
		return n;
	}
	bx[n++] = box2(W, 0, 0, 300, 1000, 1, 3, true);
	bx[n++] = box2(W, 300, 5, 212, 1019, 0, 1, false);
	bx[n++] = box2(E, 0, 0, 3, 5, 2, 1, true);
	bx[n++] = whole(S, true);
	bx[n++] = whole(Z, false);
	bx[n++] = whole(B, true);
	return n;
}

/* A byte flipped in each region of the shard in turn: inside an item, the
 * load fails with the CRC message naming the file, the item and the
 * offset of the bad piece; in the safetensors header and its padding
 * (which no load reads) the load is exact. */
START_TEST(test_flip)
{
	static const char *const names[] = { "c" };
	struct testd t;
	struct dbox bx[16];
	char path[TD_PATH], file[TD_PATH], who[128], piece[64];
	uint64_t rb[N_ITEMS], re[N_ITEMS], regions[16], data_start, hdr;
	const char *what[16];
	size_t nr = 0;
	int fd;

	setup(&t, _i ? "flip_boxes" : "flip_whole", names, 1, 1);
	ckpt_path(&t, "c", path, sizeof(path));
	file_path(&t, "c", SHARD0, file, sizeof(file));
	for (unsigned i = 0; i < N_ITEMS; i++)
		item_range(&t, "c", i, 0, &rb[i], &re[i]);
	fd = open(file, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &hdr, 8, 0), 8);
	data_start = 8 + hdr; /* little-endian host */
	uint8_t last_pad = 0;
	ck_assert_int_eq(pread(fd, &last_pad, 1, (off_t)data_start - 1), 1);
	close(fd);
	ck_assert_uint_eq(data_start % LAYOUT_ALIGN, 0);
	ck_assert_uint_eq(rb[W], data_start);
	ck_assert_uint_lt(rb[W] + MiB, re[W]);

	what[nr] = "the header's length", regions[nr++] = 3;
	what[nr] = "the safetensors header", regions[nr++] = 8;
	if (last_pad == ' ')
		what[nr] = "the header's padding", regions[nr++] = data_start - 1;
	what[nr] = "w's first byte", regions[nr++] = rb[W];
	what[nr] = "w before a grid line", regions[nr++] = MiB - 1;
	what[nr] = "w at a grid line", regions[nr++] = MiB;
	what[nr] = "w's last byte", regions[nr++] = re[W] - 1;
	what[nr] = "e", regions[nr++] = (rb[E] + re[E]) / 2;
	what[nr] = "s", regions[nr++] = rb[S];
	what[nr] = "b's first byte", regions[nr++] = rb[B];
	what[nr] = "b's last byte", regions[nr++] = re[B] - 1;
	ck_assert_uint_eq(re[B], file_size(file)); /* the blob ends the file */

	for (size_t k = 0; k < nr; k++) {
		uint64_t off = regions[k];
		int owner = -1;

		for (unsigned i = 0; i < N_ITEMS; i++)
			if (off >= rb[i] && off < re[i])
				owner = (int)i;
		snprintf(who, sizeof(who), "%s, byte %llu flipped (%s)", _i ? "boxes" : "whole",
			 (unsigned long long)off, what[k]);
		flip(file, off);
		size_t n = flip_boxes(_i, bx);
		if (owner < 0) {
			load_ok(path, bx, n, 1, who);
		} else {
			uint64_t p = off / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
			char nm[16];

			if (p < rb[owner])
				p = rb[owner];
			snprintf(piece, sizeof(piece), "offset %llu ", (unsigned long long)p);
			snprintf(nm, sizeof(nm), "'%s'", base[owner].name);
			load_fails(path, bx, n, -EBADMSG, AT_DONE, "CRC mismatch", piece, who);
			n = flip_boxes(_i, bx);
			load_fails(path, bx, n, -EBADMSG, AT_DONE, nm, SHARD0, who);
		}
		flip(file, off);
	}
	size_t n = flip_boxes(_i, bx);
	load_ok(path, bx, n, 1, "all flipped back");
	td_fini(&t);
}
END_TEST

/* ---- 2. boxes against guard pages ---- */

/* Each case: boxes that together are exact (verified) and leave every
 * other byte of their buffers alone.  Duplicate boxes, boxes of no
 * element (one with a NULL pointer), single columns, corners, 0-D. */
static size_t guard_boxes(int c, struct dbox *bx)
{
	size_t n = 0;

	switch (c) {
	case 0:
	case 1:
		for (unsigned i = 0; i < N_ITEMS; i++)
			bx[n++] = whole(i, c == 0);
		break;
	case 2:
		bx[n++] = box2(W, 0, 0, 256, 512, 0, 0, true);
		bx[n++] = box2(W, 0, 512, 256, 512, 3, 0, false);
		bx[n++] = box2(W, 256, 0, 256, 512, 0, 7, true);
		bx[n++] = box2(W, 256, 512, 256, 512, 1, 1, false);
		bx[n++] = box2(E, 0, 0, 1, 1, 0, 0, true);
		bx[n++] = box2(E, 2, 4, 1, 1, 0, 0, false);
		bx[n++] = box2(E, 0, 4, 1, 1, 0, 0, true);
		bx[n++] = box2(E, 2, 0, 1, 1, 0, 0, true);
		bx[n++] = whole(S, false);
		bx[n] = whole(Z, true);
		bx[n++].null_data = true;
		bx[n++] = whole(B, false);
		break;
	case 3:
		/* The same box three times, one of no element at the end of
		 * the rows (NULL data), a single column, a single row, the
		 * last element. */
		for (int k = 0; k < 3; k++)
			bx[n++] = box2(W, 100, 200, 37, 300, (uint64_t)k, 0, k == 1);
		bx[n] = box2(W, 512, 0, 0, 1024, 0, 0, true);
		bx[n++].null_data = true;
		bx[n++] = box2(W, 0, 1023, 512, 1, 0, 5, true);
		bx[n++] = box2(W, 511, 0, 1, 1024, 0, 0, true);
		bx[n++] = box2(W, 511, 1023, 1, 1, 0, 0, false);
		bx[n++] = box2(E, 0, 2, 3, 1, 4, 0, true);
		bx[n++] = box2(E, 1, 0, 1, 5, 0, 0, false);
		bx[n++] = box2(Z, 0, 3, 0, 4, 0, 2, true);
		break;
	}
	return n;
}

START_TEST(test_guard)
{
	static const char *const names[] = { "g" };
	struct testd t;
	struct dbox bx[32];
	char path[TD_PATH], who[64];
	size_t n;

	setup(&t, "guard", names, 1, _i >= 4 ? 2 : 1);
	ckpt_path(&t, "g", path, sizeof(path));
	snprintf(who, sizeof(who), "case %d of %s", _i % 4, _i >= 4 ? "2 ranks" : "1 rank");
	n = guard_boxes(_i % 4, bx);
	load_ok(path, bx, n, 1, who);
	td_fini(&t);
}
END_TEST

/* ---- 3. a tensor re-cut into many row blocks: the chunk index ---- */

static uint64_t lcg(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 33;
}

/* The manifest of `name` with w (one chunk) cut into 37 row blocks of
 * uneven heights, some of no row, each with its CRCs: another valid
 * description of the same bytes. */
static void recut_w(const struct testd *t, const char *name, uint64_t *cuts)
{
	char file[TD_PATH];
	size_t len;
	uint8_t *img = read_image(file_path(t, name, SHARD0, file, sizeof(file)), &len);
	json_t *m = mf_read(t, name), *chunks = json_array();
	uint64_t wb = ju(mf_chunk(m, W, 0), "begin"), s = 77;

	cuts[0] = 0;
	cuts[37] = 512;
	for (int k = 1; k < 37; k++)
		cuts[k] = lcg(&s) % 513;
	for (int a = 1; a < 37; a++)
		for (int b = a + 1; b < 37; b++)
			if (cuts[b] < cuts[a]) {
				uint64_t x = cuts[a];
				cuts[a] = cuts[b];
				cuts[b] = x;
			}
	cuts[5] = cuts[4]; /* at least one empty block */
	for (int k = 0; k < 37; k++)
		json_array_append_new(chunks, row_chunk(img, cuts[k], cuts[k + 1] - cuts[k], 1024, 4,
							wb + cuts[k] * 4096));
	/* Blocks in shuffled order: the manifest need not list them sorted. */
	for (size_t k = json_array_size(chunks); k > 1; k--) {
		size_t j = lcg(&s) % k;
		json_t *a = json_incref(json_array_get(chunks, k - 1));
		json_array_set(chunks, k - 1, json_array_get(chunks, j));
		json_array_set_new(chunks, j, a);
	}
	json_object_set_new(json_object_get(json_object_get(m, "tensors"), "w"), "chunks", chunks);
	mf_write(t, name, m);
	free(img);
}

START_TEST(test_many_boxes)
{
	static const char *const names[] = { "m" };
	struct testd t;
	struct ckpt_reader *rd;
	uint64_t cuts[38], s = 1234;
	char path[TD_PATH];
	struct dbox *bx = calloc(400, sizeof(*bx));
	void *all = item_data(W, 1), *back = malloc(item_bytes(W));
	size_t n = 0;

	ck_assert_ptr_nonnull(bx);
	ck_assert_ptr_nonnull(back);
	setup(&t, "many_boxes", names, 1, 1);
	recut_w(&t, "m", cuts);
	ckpt_path(&t, "m", path, sizeof(path));
	/* The reader takes the new cut and reads the same tensor. */
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "w", back, item_bytes(W)), 0);
	ck_assert_int_eq(memcmp(back, all, item_bytes(W)), 0);
	ckpt_reader_close(rd);

	/* One element on each side of every cut, at both ends of the row;
	 * then random boxes of up to 64 x 256. */
	for (int k = 0; k <= 37; k++)
		for (int side = 0; side < 2; side++) {
			uint64_t r = cuts[k] - (uint64_t)side;
			if (r >= 512)
				continue;
			bx[n++] = box2(W, r, 0, 1, 1, 0, 0, side);
			bx[n++] = box2(W, r, 1023, 1, 1, 0, 0, !side);
		}
	while (n < 400) {
		uint64_t r = lcg(&s) % 512, c = lcg(&s) % 1024;
		uint64_t nr = 1 + lcg(&s) % (512 - r < 64 ? 512 - r : 64);
		uint64_t nc = 1 + lcg(&s) % (1024 - c < 256 ? 1024 - c : 256);
		bx[n++] = box2(W, r, c, nr, nc, lcg(&s) % 3, lcg(&s) % 3, lcg(&s) % 2);
	}
	load_ok(path, bx, n, 1, "400 boxes over 37 blocks");
	free(bx);
	free(all);
	free(back);
	td_fini(&t);
}
END_TEST

/* ---- 4. chunks that claim the same bytes ---- */

/*
 * Hand-made manifests in which two chunks claim the same bytes of a shard,
 * each with CRCs that match them:
 *   y   a U8 tensor whose one chunk lies inside w's bytes, from 512 KiB
 *       into them to w's end;
 *   w2  w again under another name (the same chunk);
 *   w   itself cut into two row blocks, the second starting 256 KiB after
 *       the first.
 * Such a manifest is corrupt.  Loading w's first A_ROWS rows together with
 * y's elements from the byte where they end makes one read holding both
 * back to back, whose CRC spans overlap (w's last one ends at the next
 * grid line, y's first begins at the previous one): a verifier making one
 * forward pass over the destinations would read before y's destination,
 * which starts at a guard page.  The load must be refused, when the
 * reader opens the manifest or when the load starts, with -EBADMSG naming
 * both items; a load of one item alone either is refused the same way or
 * hands back exactly the bytes its chunk names.
 */
#define A_ROWS 300ull

enum shared_kind { SH_Y, SH_W2, SH_BLOCKS };

/* Rewrites the manifest of `name` from `orig` with one of the edits. */
static void edit_shared(const struct testd *t, const char *name, const json_t *orig,
			enum shared_kind kind, uint64_t *ret_yb, uint64_t *ret_ylen)
{
	char file[TD_PATH];
	size_t len;
	uint8_t *img = read_image(file_path(t, name, SHARD0, file, sizeof(file)), &len);
	json_t *m = json_deep_copy(orig), *tensors = json_object_get(m, "tensors");
	uint64_t wb = ju(mf_chunk(m, W, 0), "begin"), we = ju(mf_chunk(m, W, 0), "end");
	uint64_t yb = wb + MiB / 2, ylen = we - yb;

	ck_assert_uint_lt(wb + A_ROWS * 4096, 2 * MiB);
	ck_assert_uint_gt(wb + A_ROWS * 4096, MiB);
	ck_assert_uint_le(yb, MiB);
	switch (kind) {
	case SH_Y:
		json_object_set_new(tensors, "y",
				    json_pack("{sss[I]s[{sis[i]s[I]sIsIso}]}", "dtype", "U8",
					      "shape", (json_int_t)ylen, "chunks", "file", 0,
					      "offsets", 0, "shape", (json_int_t)ylen, "begin",
					      (json_int_t)yb, "end", (json_int_t)we, "crc32c",
					      crcs_of(img, yb, we)));
		break;
	case SH_W2:
		json_object_set_new(tensors, "w2", json_deep_copy(json_object_get(tensors, "w")));
		break;
	case SH_BLOCKS: {
		json_t *chunks = json_array();
		json_array_append_new(chunks, row_chunk(img, 0, 256, 1024, 4, wb));
		json_array_append_new(chunks, row_chunk(img, 256, 256, 1024, 4, wb + MiB / 4));
		json_object_set_new(json_object_get(tensors, "w"), "chunks", chunks);
		break;
	}
	}
	mf_write(t, name, m);
	free(img);
	*ret_yb = yb;
	*ret_ylen = ylen;
}

/* A box of a tensor by name, in its own guarded buffer that starts with
 * the box's bytes (a read before them faults). */
struct rawbox {
	const char *name;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t gshape[2], offs[2], shape[2];
	struct gbuf g;
};

/* Rows [r0, r0 + nr) of an F32 [512, 1024] tensor (w, or w2). */
static struct rawbox raw_rows(const char *name, uint64_t r0, uint64_t nr)
{
	return (struct rawbox){ .name = name, .dt = CKPT_F32, .ndim = 2, .gshape = { 512, 1024 },
				.offs = { r0, 0 }, .shape = { nr, 1024 } };
}

/* Bytes [from, from + n) of y, a U8 [len] tensor. */
static struct rawbox raw_y(uint64_t len, uint64_t from, uint64_t n)
{
	return (struct rawbox){ .name = "y", .dt = CKPT_U8, .ndim = 1, .gshape = { len },
				.offs = { from }, .shape = { n } };
}

/* Opens `path` and loads the boxes.  Returns 0, or the errno of the open,
 * an add call, the start or the done future (*ret_stage says which). */
static int load_raw(const char *path, struct rawbox *rb, size_t n, enum stage *ret_stage,
		    char *msg, size_t len)
{
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	int rc;

	for (size_t i = 0; i < n; i++)
		gbuf_alloc(&rb[i].g,
			   (size_t)td_nbytes(td_dtype_size(rb[i].dt), rb[i].ndim, rb[i].shape), false);
	*ret_stage = AT_OPEN;
	rc = ckpt_reader_open(path, &rd);
	if (rc) {
		snprintf(msg, len, "%s", ckpt_last_error());
		return rc;
	}
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	*ret_stage = AT_ADD;
	for (size_t i = 0; i < n && !rc; i++) {
		struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = rb[i].offs,
					   .shape = rb[i].shape, .data = rb[i].g.mem };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = rb[i].dt,
					       .name = rb[i].name, .global_shape = rb[i].gshape,
					       .ndim = rb[i].ndim, .n_dsts = 1, .dsts = &d };
		rc = ckpt_load_add_tensor(ld, &lt);
		if (rc)
			snprintf(msg, len, "%s", ckpt_last_error());
	}
	if (!rc) {
		*ret_stage = AT_START;
		rc = ckpt_load_start(ld, &done);
		if (rc) {
			snprintf(msg, len, "%s", ckpt_last_error());
		} else {
			*ret_stage = AT_DONE;
			rc = td_future_wait(done, 60000);
			snprintf(msg, len, "%s", ckpt_future_error(done));
		}
	}
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	return rc;
}

static bool raw_touched(const struct rawbox *rb, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (size_t b = 0; b < rb[i].g.len; b++)
			if (rb[i].g.mem[b] != PAD)
				return true;
	return false;
}

static void rawboxes_free(struct rawbox *rb, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gbuf_free(&rb[i].g);
}

/* The load of boxes that need shared bytes is refused, with nothing
 * written, naming both items. */
static void shared_refused(const char *path, struct rawbox *rb, size_t n, const char *n1,
			   const char *n2, const char *who)
{
	enum stage st;
	char msg[1024] = "";
	int rc = load_raw(path, rb, n, &st, msg, sizeof(msg));

	ck_assert_msg(rc == -EBADMSG && (st == AT_OPEN || st == AT_START) && strstr(msg, n1) &&
			      strstr(msg, n2) && strstr(msg, SHARD0),
		      "%s: %d at stage %d: %s", who, rc, (int)st, msg);
	ck_assert_msg(!raw_touched(rb, n), "%s: a refused load wrote into a destination", who);
	rawboxes_free(rb, n);
}

/* One box alone: refused at open as above, or exact (stream `seed` from
 * byte `at`). */
static void shared_alone(const char *path, struct rawbox *rb, uint64_t seed, uint64_t at,
			 const char *n1, const char *n2, const char *who)
{
	enum stage st;
	char msg[1024] = "";
	int rc = load_raw(path, rb, 1, &st, msg, sizeof(msg));

	if (rc == 0)
		ck_assert_msg(td_check(rb->g.mem, rb->g.len, seed, at) == -1, "%s: wrong bytes", who);
	else
		ck_assert_msg(rc == -EBADMSG && st == AT_OPEN && strstr(msg, n1) && strstr(msg, n2),
			      "%s: %d at stage %d: %s", who, rc, (int)st, msg);
	rawboxes_free(rb, 1);
}

START_TEST(test_shared_bytes)
{
	static const char *const names[] = { "sh" };
	struct testd t;
	char path[TD_PATH];
	uint64_t yb, ylen, wb, we, from;
	uint64_t seed = item_seed(1, W);
	json_t *orig;

	setup(&t, "shared_bytes", names, 1, 1);
	item_range(&t, "sh", W, 0, &wb, &we);
	ckpt_path(&t, "sh", path, sizeof(path));
	orig = mf_read(&t, "sh");

	edit_shared(&t, "sh", orig, SH_Y, &yb, &ylen);
	from = wb + A_ROWS * 4096 - yb;
	struct rawbox y = raw_y(ylen, 0, ylen);
	shared_alone(path, &y, seed, yb - wb, "'w'", "'y'", "y alone");
	struct rawbox hx[2] = { raw_rows("w", 0, A_ROWS), raw_y(ylen, from, ylen - from) };
	shared_refused(path, hx, 2, "'w'", "'y'", "w's head with y's tail");
	struct rawbox wy[2] = { raw_rows("w", 0, 512), raw_y(ylen, 0, ylen) };
	shared_refused(path, wy, 2, "'w'", "'y'", "w and y whole");

	edit_shared(&t, "sh", orig, SH_W2, &yb, &ylen);
	struct rawbox w2 = raw_rows("w2", 0, 512);
	shared_alone(path, &w2, seed, 0, "'w'", "'w2'", "w2 alone");
	struct rawbox ww[2] = { raw_rows("w", 0, 512), raw_rows("w2", 0, 512) };
	shared_refused(path, ww, 2, "'w'", "'w2'", "w with w2");

	edit_shared(&t, "sh", orig, SH_BLOCKS, &yb, &ylen);
	struct rawbox wa = raw_rows("w", 0, 512);
	shared_refused(path, &wa, 1, "'w'", "chunk 1", "w in overlapping blocks");
	struct rawbox wt = raw_rows("w", 0, 256);
	shared_alone(path, &wt, seed, 0, "'w'", "chunk 1", "w's first block alone");
	json_decref(orig);
	td_fini(&t);
}
END_TEST

/* ---- 5. shards cut short and grown ---- */

START_TEST(test_truncate_extend)
{
	static const char *const names[] = { "tr" };
	struct testd t;
	struct dbox bx[16];
	char path[TD_PATH], file[TD_PATH];
	uint64_t rb[N_ITEMS], re[N_ITEMS], size;
	size_t n;
	FILE *f;

	setup(&t, "truncate_extend", names, 1, 1);
	ckpt_path(&t, "tr", path, sizeof(path));
	file_path(&t, "tr", SHARD0, file, sizeof(file));
	for (unsigned i = 0; i < N_ITEMS; i++)
		item_range(&t, "tr", i, 0, &rb[i], &re[i]);
	size = file_size(file);
	ck_assert_uint_eq(re[B], size);
	ck_assert_uint_eq(re[W], rb[E]);

	/* Grown by 3 MiB of garbage: nothing reads past the manifest's
	 * ranges. */
	f = fopen(file, "ab");
	ck_assert_ptr_nonnull(f);
	for (int k = 0; k < 3 * 1024 * 1024; k++)
		fputc(0xEE, f);
	ck_assert_int_eq(fclose(f), 0);
	n = flip_boxes(0, bx);
	load_ok(path, bx, n, 1, "grown, whole");
	n = flip_boxes(1, bx);
	load_ok(path, bx, n, 1, "grown, boxes");

	/* One byte short: the blob (the last item) fails, the rest loads. */
	ck_assert_int_eq(truncate(file, (off_t)size - 1), 0);
	bx[0] = whole(B, true);
	load_fails(path, bx, 1, -EBADMSG, AT_DONE, "truncated", SHARD0, "one byte short");
	n = 0;
	for (unsigned i = W; i < B; i++)
		bx[n++] = whole(i, false);
	load_ok(path, bx, n, 1, "one byte short, all but the blob");

	/* Cut where e begins (where w ends): w loads, e does not. */
	ck_assert_int_eq(truncate(file, (off_t)rb[E]), 0);
	bx[0] = whole(W, true);
	load_ok(path, bx, 1, 1, "cut at w's end");
	bx[0] = box2(E, 2, 4, 1, 1, 0, 0, true);
	load_fails(path, bx, 1, -EBADMSG, AT_DONE, "truncated", NULL, "cut at w's end, e");

	/* Cut inside w's second piece: its first piece still loads. */
	ck_assert_int_eq(truncate(file, (off_t)(MiB + 4096 + 7)), 0);
	bx[0] = box2(W, 0, 0, 10, 1024, 0, 0, true);
	bx[1] = box2(W, 100, 3, 50, 17, 2, 1, false);
	load_ok(path, bx, 2, 1, "cut in w's second piece, first rows");
	bx[0] = whole(W, true);
	load_fails(path, bx, 1, -EBADMSG, AT_DONE, "truncated", NULL, "cut in w, whole");
	bx[0] = box2(W, 300, 0, 1, 1024, 1, 1, true);
	load_fails(path, bx, 1, -EBADMSG, AT_DONE, "truncated", NULL, "cut in w, a row");

	/* Empty: only what has no byte loads. */
	ck_assert_int_eq(truncate(file, 0), 0);
	bx[0] = whole(Z, true);
	bx[0].null_data = true;
	load_ok(path, bx, 1, 1, "empty file, z");
	bx[0] = whole(S, true);
	load_fails(path, bx, 1, -EBADMSG, AT_DONE, "truncated", NULL, "empty file, s");
	td_fini(&t);
}
END_TEST

/* ---- 6. a mixed checkpoint ---- */

/* Two checkpoints of one 2-rank layout, different bytes: rank 1's shards
 * swapped.  Whatever comes from a foreign shard fails its CRC check;
 * what comes only from the checkpoint's own shard loads exactly.  Then the
 * manifests are swapped as well. */
START_TEST(test_swap)
{
	static const char *const names[] = { "A", "B" };
	struct testd t;
	struct dbox bx[16];
	char pa[TD_PATH], pb[TD_PATH], fa[TD_PATH], fb[TD_PATH];
	size_t n;

	setup(&t, "swap", names, 2, 2);
	ckpt_path(&t, "A", pa, sizeof(pa));
	ckpt_path(&t, "B", pb, sizeof(pb));
	file_path(&t, "A", SHARD1, fa, sizeof(fa));
	file_path(&t, "B", SHARD1, fb, sizeof(fb));
	ck_assert_uint_eq(file_size(fa), file_size(fb));
	swap_files(fa, fb);

	for (int k = 0; k < 2; k++) {
		const char *p = k ? pb : pa;
		uint64_t seed = (uint64_t)k + 1;

		n = 0;
		bx[n++] = box2(W, 0, 0, 256, 1024, 0, 0, true); /* rank 0's block */
		bx[n++] = box2(W, 3, 7, 200, 1000, 1, 2, false);
		for (unsigned i = E; i < N_ITEMS; i++)
			bx[n++] = whole(i, true);
		load_ok(p, bx, n, seed, "swapped: rank 0's bytes");
		bx[0] = whole(W, true);
		load_fails(p, bx, 1, -EBADMSG, AT_DONE, "CRC mismatch", SHARD1, "swapped: w whole");
		bx[0] = box2(W, 255, 0, 2, 1024, 0, 0, false);
		load_fails(p, bx, 1, -EBADMSG, AT_DONE, "CRC mismatch", SHARD1,
			   "swapped: across the cut");
		bx[0] = box2(W, 511, 1023, 1, 1, 0, 0, true);
		load_fails(p, bx, 1, -EBADMSG, AT_DONE, "CRC mismatch", SHARD1,
			   "swapped: w's last element");
	}

	/* Manifests swapped too: now rank 0's shard is the foreign one. */
	td_path(fa, sizeof(fa), "%s/manifest.json", pa);
	td_path(fb, sizeof(fb), "%s/manifest.json", pb);
	swap_files(fa, fb);
	bx[0] = box2(W, 256, 0, 256, 1024, 0, 0, true);
	load_ok(pa, bx, 1, 2, "manifests swapped: rank 1's block");
	bx[0] = box2(W, 0, 0, 1, 1, 0, 0, true);
	load_fails(pa, bx, 1, -EBADMSG, AT_DONE, "CRC mismatch", SHARD0,
		   "manifests swapped: rank 0's block");
	bx[0] = whole(B, false);
	load_fails(pa, bx, 1, -EBADMSG, AT_DONE, "CRC mismatch", "'b'", "manifests swapped: b");
	td_fini(&t);
}
END_TEST

/* ---- 7. a shard replaced or cut after the reader opened ---- */

/* Rewrites `file` with every byte past the first 4 KiB changed, as a new
 * inode renamed into place. */
static void rewrite_changed(const char *file)
{
	char tmp[TD_PATH];
	size_t len;
	uint8_t *img = read_image(file, &len);
	FILE *f;

	for (size_t k = 4096; k < len; k++)
		img[k] ^= 0x5A;
	td_path(tmp, sizeof(tmp), "%s.new", file);
	f = fopen(tmp, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(img, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, file), 0);
	free(img);
}

START_TEST(test_replaced)
{
	static const char *const names[] = { "A", "B" };
	struct testd t;
	struct ckpt_reader *rd;
	struct dbox bx[4];
	char pa[TD_PATH], fa[TD_PATH], fb[TD_PATH], ma[TD_PATH], mb[TD_PATH], msg[1024];
	enum stage st;
	int rc;

	setup(&t, "replaced", names, 2, 1);
	ckpt_path(&t, "A", pa, sizeof(pa));
	file_path(&t, "A", SHARD0, fa, sizeof(fa));
	file_path(&t, "B", SHARD0, fb, sizeof(fb));
	file_path(&t, "A", "manifest.json", ma, sizeof(ma));
	file_path(&t, "B", "manifest.json", mb, sizeof(mb));

	/* Replaced by B's shard between the open and the first load (the
	 * reader opens shards when a load starts): B's bytes fail A's
	 * CRCs. */
	ck_assert_int_eq(ckpt_reader_open(pa, &rd), 0);
	replace_file(fb, fa);
	bx[0] = whole(W, true);
	dbox_alloc(&bx[0]);
	rc = load_rd(rd, bx, 1, &st, msg, sizeof(msg));
	ck_assert_msg(rc == -EBADMSG && st == AT_DONE && strstr(msg, "CRC mismatch"),
		      "replaced before the first load: %d %s", rc, msg);
	ck_assert(!dbox_touched(&bx[0]) || strstr(msg, "unverified"));
	dboxes_free(bx, 1);
	ckpt_reader_close(rd);

	/* A made a consistent copy of B (its manifest too); one load opens
	 * the shard, then the shard is rewritten with other bytes.  The
	 * next load of the same reader either reads the file it had open
	 * (B's bytes, exact) or fails its CRCs: never other bytes. */
	replace_file(mb, ma);
	ck_assert_int_eq(ckpt_reader_open(pa, &rd), 0);
	bx[0] = whole(W, false);
	dbox_alloc(&bx[0]);
	rc = load_rd(rd, bx, 1, &st, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "A as a copy of B: %d %s", rc, msg);
	dbox_verify(&bx[0], 2, "A as a copy of B");
	dboxes_free(bx, 1);
	rewrite_changed(fa);
	bx[0] = whole(W, true);
	bx[1] = box2(E, 0, 0, 3, 5, 1, 1, false);
	dbox_alloc(&bx[0]);
	dbox_alloc(&bx[1]);
	rc = load_rd(rd, bx, 2, &st, msg, sizeof(msg));
	if (rc == 0) {
		dbox_verify(&bx[0], 2, "rewritten between loads");
		dbox_verify(&bx[1], 2, "rewritten between loads");
	} else {
		ck_assert_msg(rc == -EBADMSG && strstr(msg, "CRC mismatch"),
			      "rewritten between loads: %d %s", rc, msg);
	}
	dboxes_free(bx, 2);
	ckpt_reader_close(rd);

	/* Cut in place, on the inode the reader holds open. */
	replace_file(fb, fa);
	ck_assert_int_eq(ckpt_reader_open(pa, &rd), 0);
	bx[0] = whole(W, true);
	dbox_alloc(&bx[0]);
	ck_assert_int_eq(load_rd(rd, bx, 1, &st, msg, sizeof(msg)), 0);
	dboxes_free(bx, 1);
	ck_assert_int_eq(truncate(fa, 4096 + 100), 0);
	bx[0] = box2(W, 1, 0, 2, 1024, 0, 0, false);
	dbox_alloc(&bx[0]);
	rc = load_rd(rd, bx, 1, &st, msg, sizeof(msg));
	ck_assert_msg(rc == -EBADMSG && strstr(msg, "truncated"), "cut in place: %d %s", rc, msg);
	dboxes_free(bx, 1);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- 8. the life of a load ---- */

/* Never started; freed without waiting (ckpt_load_free waits: the
 * destinations are complete when it returns); a start refused (a shard
 * missing) and made again once it is back; the reads of both shards
 * failing at once on two threads (one failure reported). */
START_TEST(test_lifecycle)
{
	static const char *const names[] = { "l" };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	struct dbox bx[8];
	struct ckpt_load_dst d[8];
	char path[TD_PATH], file[TD_PATH], moved[TD_PATH];
	size_t n;

	setup(&t, "lifecycle", names, 1, 2);
	ckpt_path(&t, "l", path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);

	/* Built, never started. */
	n = flip_boxes(1, bx);
	for (size_t i = 0; i < n; i++)
		dbox_alloc(&bx[i]);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	d[0] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .offsets = bx[0].offs,
				       .shape = bx[0].shape, .strides = bx[0].strides,
				       .data = bx[0].data };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = base[W].shape, .ndim = 2, .n_dsts = 1,
				       .dsts = d };
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ckpt_load_free(ld);
	ckpt_load_free(NULL);
	for (size_t i = 0; i < n; i++)
		ck_assert(!dbox_touched(&bx[i]));
	dboxes_free(bx, n);

	/* Started and freed at once, many times. */
	for (int rep = 0; rep < 20; rep++) {
		n = flip_boxes(rep % 2, bx);
		for (size_t i = 0; i < n; i++)
			dbox_alloc(&bx[i]);
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		for (size_t i = 0; i < 2; i++)
			d[i] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .offsets = bx[i].offs,
						       .shape = bx[i].shape,
						       .strides = bx[i].strided ? bx[i].strides :
										  NULL,
						       .data = bx[i].data };
		lt.n_dsts = bx[1].item == W ? 2 : 1;
		ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
		ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
		ckpt_load_free(ld);
		for (size_t i = 0; i < lt.n_dsts; i++)
			dbox_verify(&bx[i], 1, "freed while running");
		dboxes_free(bx, n);
	}
	lt.n_dsts = 1;
	ckpt_reader_close(rd);

	/* A start refused (rank 1's shard gone), then made again. */
	file_path(&t, "l", SHARD1, file, sizeof(file));
	td_path(moved, sizeof(moved), "%s.away", file);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(rename(file, moved), 0);
	bx[0] = whole(W, true);
	dbox_alloc(&bx[0]);
	d[0] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .data = bx[0].data };
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(), SHARD1), "%s", ckpt_last_error());
	ck_assert(!dbox_touched(&bx[0]));
	ck_assert_int_eq(rename(moved, file), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
	ck_assert_int_eq(td_future_wait(done, 60000), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), -EBUSY);
	ckpt_load_free(ld);
	dbox_verify(&bx[0], 1, "started again");
	dboxes_free(bx, 1);

	/* Every CRC piece of w bad in both shards: the reads of both fail
	 * at once, on two threads, and one failure is reported. */
	json_t *m = mf_read(&t, "l");
	for (size_t k = 0; k < 2; k++) {
		json_t *c = mf_chunk(m, W, k);
		const char *fn = json_string_value(json_object_get(
			json_array_get(json_object_get(m, "files"), (size_t)ju(c, "file")), "path"));
		char f[TD_PATH];

		ck_assert_ptr_nonnull(fn);
		file_path(&t, "l", fn, f, sizeof(f));
		for (uint64_t p = ju(c, "begin"); p < ju(c, "end"); p = (p / MiB + 1) * MiB)
			flip(f, p);
	}
	json_decref(m);
	for (int rep = 0; rep < 10; rep++) {
		n = 0;
		for (uint64_t r = 0; r < 512; r += 64)
			bx[n++] = box2(W, r, 0, 1, 1, 0, 0, r % 128 == 0);
		for (size_t i = 0; i < n; i++)
			dbox_alloc(&bx[i]);
		for (size_t i = 0; i < n; i++)
			d[i] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .offsets = bx[i].offs,
						       .shape = bx[i].shape, .data = bx[i].data };
		lt.n_dsts = (uint32_t)n;
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
		ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
		ck_assert_int_eq(td_future_wait(done, 60000), -EBADMSG);
		const char *msg = ckpt_future_error(done);
		const char *first = strstr(msg, "CRC mismatch");
		ck_assert_msg(first && !strstr(first + 1, "CRC mismatch") && strstr(msg, "'w'"),
			      "%s", msg);
		ckpt_load_free(ld);
		dboxes_free(bx, n);
	}
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- 9. hostile arguments ---- */

#define BIG UINT64_MAX

/* A box the caller describes: refused at add time with `ret`, and the
 * start then refused with the same errno; or accepted (ret 0). */
static const struct {
	const char *what;
	unsigned item;
	bool no_offsets, no_shape, null_data;
	uint64_t offs[2], shape[2];
	int64_t strides[2];  /* {0, 0}: none given */
	int ret;
} bad_args[] = {
	{ "offset near 2^64", W, false, false, false, { BIG, 0 }, { 1, 1 }, { 0 }, -EINVAL },
	{ "extent wrapping past 2^64", W, false, false, false, { 1, 0 }, { BIG, 1 }, { 0 },
	  -EINVAL },
	{ "extent wrapping, inner", W, false, false, false, { 0, 2 }, { 1, BIG - 1 }, { 0 },
	  -EINVAL },
	{ "offset at the end, one row", W, false, false, false, { 512, 0 }, { 1, 1 }, { 0 },
	  -EINVAL },
	{ "negative stride", W, false, false, false, { 0, 0 }, { 2, 2 }, { -1, 1 }, -EINVAL },
	{ "stride of 2^63 elements", W, false, false, false, { 0, 0 }, { 2, 2 },
	  { INT64_MAX, 1 }, -EINVAL },
	{ "NULL data for elements", W, false, false, true, { 0, 0 }, { 1, 1 }, { 0 }, -EINVAL },
	{ "offsets without a shape", W, false, true, false, { 0, 0 }, { 0 }, { 0 }, -EINVAL },
	{ "NULL data, no element", W, false, false, true, { 7, 0 }, { 0, 1024 }, { 0 }, 0 },
	{ "no element, at the far corner", W, false, false, true, { 512, 1024 }, { 0, 0 }, { 0 },
	  0 },
	{ "zero-size tensor, 2^64 - 1 columns", Z, false, false, true, { 0, 0 }, { 0, BIG },
	  { 0 }, -EINVAL },
	{ "zero-size tensor, past its columns", Z, false, false, true, { 0, 8 }, { 0, 0 }, { 0 },
	  -EINVAL },
	{ "zero-size tensor, at its end", Z, false, false, true, { 0, 7 }, { 0, 0 }, { 0 }, 0 },
	{ "0-D, NULL data", S, true, true, true, { 0 }, { 0 }, { 0 }, -EINVAL },
};

START_TEST(test_bad_args)
{
	static const char *const names[] = { "a" };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	char path[TD_PATH];
	float buf[16];
	const struct bitem *b = &base[bad_args[_i].item];

	setup(&t, "bad_args", names, 1, 1);
	ckpt_path(&t, "a", path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	struct ckpt_load_dst d = {
		CKPT_LOAD_DST_INIT,
		.offsets = bad_args[_i].no_offsets ? NULL : bad_args[_i].offs,
		.shape = bad_args[_i].no_shape ? NULL : bad_args[_i].shape,
		.strides = bad_args[_i].strides[0] || bad_args[_i].strides[1] ?
				   bad_args[_i].strides : NULL,
		.data = bad_args[_i].null_data ? NULL : buf,
	};
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = b->dt, .name = b->name,
				       .global_shape = b->ndim ? b->shape : NULL, .ndim = b->ndim,
				       .n_dsts = 1, .dsts = &d };
	int rc = ckpt_load_add_tensor(ld, &lt);
	ck_assert_msg(rc == bad_args[_i].ret, "%s: add gave %d (%s)", bad_args[_i].what, rc,
		      ckpt_last_error());
	if (rc)
		ck_assert_msg(strstr(ckpt_last_error(), b->name), "%s: %s", bad_args[_i].what,
			      ckpt_last_error());
	rc = ckpt_load_start(ld, &done);
	ck_assert_msg(rc == bad_args[_i].ret, "%s: start gave %d (%s)", bad_args[_i].what, rc,
		      ckpt_last_error());
	if (!rc) {
		ck_assert_int_eq(td_future_wait(done, 60000), 0);
		struct ckpt_load_stats stats = { CKPT_LOAD_STATS_INIT };
		ck_assert_int_eq(ckpt_load_stats(ld, &stats), 0);
		ck_assert_uint_eq(stats.bytes_wanted, 0);
		ck_assert_uint_eq(stats.reads, 0);
	}
	ckpt_load_free(ld);

	/* More boxes than one tensor may have, and a wrong rank. */
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	lt = (struct ckpt_load_tensor){ CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
					.global_shape = base[W].shape, .ndim = 2,
					.n_dsts = CKPT_LOAD_MAX_DSTS + 1, .dsts = &d };
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EINVAL);
	lt.n_dsts = 1;
	lt.ndim = 1;
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EINVAL);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- 10. contracts around the load ---- */

/*
 * ckpt.h: "If a load fails after it started ..., destination memory may
 * have been partly written: the future's error says so".  (0) The direct
 * path reads straight into the destination and a short file stops it
 * halfway: the bytes are there, and a message of only "the file is
 * truncated" would hide them.  (1) Two reads, w's rows and e's strided box
 * (far apart in the file): e's CRC mismatch is recorded while w's read goes
 * on and is copied into place (the usual order, not a certain one: the
 * check holds whenever w's buffer was written).
 */
START_TEST(test_partial_message)
{
	static const char *const names[] = { "p" };
	struct testd t;
	struct dbox bx[4];
	char path[TD_PATH], file[TD_PATH], msg[1024];
	uint64_t eb, ee;
	enum stage st;
	int rc;

	setup(&t, "partial_message", names, 1, 1);
	ckpt_path(&t, "p", path, sizeof(path));
	file_path(&t, "p", SHARD0, file, sizeof(file));
	if (_i == 0) {
		ck_assert_int_eq(truncate(file, (off_t)(MiB + 4096 + 100)), 0);
		bx[0] = whole(W, true);
	} else {
		item_range(&t, "p", E, 0, &eb, &ee);
		flip(file, eb + 9);
		bx[0] = box2(W, 0, 0, 200, 1024, 0, 0, true);
		bx[1] = box2(E, 0, 0, 3, 5, 0, 1, false); /* strided: bounces */
	}
	rc = load_path(path, bx, _i ? 2 : 1, &st, msg, sizeof(msg));
	ck_assert_msg(rc == -EBADMSG && st == AT_DONE, "%d %s", rc, msg);
	if (_i == 0)
		ck_assert_msg(dbox_touched(&bx[0]), "the direct path read nothing in");
	if (dbox_touched(&bx[0]))
		ck_assert_msg(strstr(msg, "partly written") || strstr(msg, "unverified"),
			      "w's destination was written, and the failure does not say so: %s",
			      msg);
	dboxes_free(bx, _i ? 2 : 1);
	td_fini(&t);
}
END_TEST

/*
 * ckpt.h, "ABI and versions": a struct longer than the library knows, its
 * unknown bytes zero, is accepted.  ckpt_load_tensor.dsts is an array of
 * such structs: it must be stepped through by the size the caller set
 * (dsts[0].size), not by the library's sizeof (&t.dsts[k]), which reads a
 * newer caller's second element from the middle of its first.
 */
START_TEST(test_abi_dst_stride)
{
	static const char *const names[] = { "v" };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	char path[TD_PATH];
	struct newer_dst {
		struct ckpt_load_dst d;
		uint64_t later; /* a field of a later release, left 0 */
	} nd[2];
	uint64_t offs[2][2] = { { 0, 0 }, { 256, 0 } }, shape[2] = { 256, 1024 };
	float *half[2] = { malloc(MiB), malloc(MiB) };

	setup(&t, "abi_dst_stride", names, 1, 1);
	ckpt_path(&t, "v", path, sizeof(path));
	memset(nd, 0, sizeof(nd));
	for (int k = 0; k < 2; k++) {
		nd[k].d = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .offsets = offs[k],
						  .shape = shape, .data = half[k] };
		nd[k].d.size = sizeof(struct newer_dst);
	}
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = base[W].shape, .ndim = 2, .n_dsts = 2,
				       .dsts = &nd[0].d };
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_msg(ckpt_load_add_tensor(ld, &lt) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
	ck_assert_int_eq(td_future_wait(done, 60000), 0);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	ck_assert_int_eq(td_check(half[0], MiB, item_seed(1, W), 0), -1);
	ck_assert_int_eq(td_check(half[1], MiB, item_seed(1, W), MiB), -1);
	free(half[0]);
	free(half[1]);
	td_fini(&t);
}
END_TEST

/*
 * A box whose elements lie more than PTRDIFF_MAX bytes from its start is
 * no object any caller can have (pointer arithmetic across it is
 * undefined): -EINVAL at add time, where a check against SIZE_MAX alone
 * let a started load write 8 EiB past the pointer.  The load is never
 * started here.
 */
START_TEST(test_huge_stride)
{
	static const char *const names[] = { "h" };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	char path[TD_PATH];
	uint64_t offs[2] = { 0, 0 }, shape[2] = { 2, 1024 };
	int64_t strides[2] = { INT64_C(1) << 61, 1 };
	float *buf = malloc(2 * 4096);

	setup(&t, "huge_stride", names, 1, 1);
	ckpt_path(&t, "h", path, sizeof(path));
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = offs, .shape = shape,
				   .strides = strides, .data = buf };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = base[W].shape, .ndim = 2, .n_dsts = 1,
				       .dsts = &d };
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	int rc = ckpt_load_add_tensor(ld, &lt);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	ck_assert_msg(rc == -EINVAL, "a box reaching 2^63 bytes past its pointer: %d", rc);
	free(buf);
	td_fini(&t);
}
END_TEST

/*
 * A shard that is a FIFO: the load is refused, naming the file.  A plain
 * O_RDONLY open (cli_reader_fd(), client/reader.c) blocks until a writer
 * comes and hangs ckpt_load_start(); this case then fails by its timeout.
 */
START_TEST(test_fifo_shard)
{
	static const char *const names[] = { "f" };
	struct testd t;
	struct dbox bx[1];
	char path[TD_PATH], file[TD_PATH], msg[1024];
	enum stage st;
	int rc;

	setup(&t, "fifo_shard", names, 1, 1);
	ckpt_path(&t, "f", path, sizeof(path));
	file_path(&t, "f", SHARD0, file, sizeof(file));
	ck_assert_int_eq(unlink(file), 0);
	ck_assert_int_eq(mkfifo(file, 0600), 0);
	bx[0] = whole(W, true);
	rc = load_path(path, bx, 1, &st, msg, sizeof(msg));
	ck_assert_msg(rc < 0 && strstr(msg, SHARD0), "a FIFO shard: %d %s", rc, msg);
	ck_assert(!dbox_touched(&bx[0]));
	dboxes_free(bx, 1);
	td_fini(&t);
}
END_TEST

/*
 * A manifest.json that is a FIFO: ckpt_reader_open() refuses it and
 * ckpt_reader_open_latest() skips its directory.  fs_read_file_at()
 * (store/fsutil.c) opens before it checks S_ISREG; without O_NONBLOCK the
 * open blocks, and so does every latest over the root (this case then
 * fails by its timeout).
 */
START_TEST(test_fifo_manifest)
{
	static const char *const names[] = { "good" };
	struct testd t;
	struct ckpt_reader *rd;
	char p[TD_PATH];

	setup(&t, "fifo_manifest", names, 1, 1);
	td_path(p, sizeof(p), "%s/zz", t.root);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	td_path(p, sizeof(p), "%s/zz/manifest.json", t.root);
	ck_assert_int_eq(mkfifo(p, 0600), 0);
	ck_assert_int_eq(ckpt_reader_open_latest(t.root, &rd), 0);
	ck_assert_uint_eq(ckpt_reader_step(rd), 1);
	ckpt_reader_close(rd);
	td_path(p, sizeof(p), "%s/zz", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &rd), -EBADMSG);
	td_fini(&t);
}
END_TEST

static Suite *hostile_suite(void)
{
	Suite *s = suite_create("integration_load_hostile");

	td_case(s, "flip", test_flip, 180, 0, 2);
	td_case(s, "guard", test_guard, 60, 0, 8);
	td_case(s, "many_boxes", test_many_boxes, 120, 0, 1);
	td_case(s, "shared_bytes", test_shared_bytes, 60, 0, 1);
	td_case(s, "truncate_extend", test_truncate_extend, 60, 0, 1);
	td_case(s, "swap", test_swap, 60, 0, 1);
	td_case(s, "replaced", test_replaced, 60, 0, 1);
	td_case(s, "lifecycle", test_lifecycle, 120, 0, 1);
	td_case(s, "bad_args", test_bad_args, 60, 0, (int)(sizeof(bad_args) / sizeof(bad_args[0])));
	td_case(s, "partial_message", test_partial_message, 60, 0, 2);
	td_case(s, "abi_dst_stride", test_abi_dst_stride, 60, 0, 1);
	td_case(s, "huge_stride", test_huge_stride, 60, 0, 1);
	/* Short limits: what these guard against is a hang. */
	td_case(s, "fifo_shard", test_fifo_shard, 20, 0, 1);
	td_case(s, "fifo_manifest", test_fifo_manifest, 20, 0, 1);
	return s;
}

int main(void)
{
	return td_main(hostile_suite(), "check_load_hostile");
}
