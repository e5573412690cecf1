/* SPDX-License-Identifier: MIT */
/*
 * manifest.c - parsing manifest.json for readers and ckptctl (index.h).
 *
 * Everything a reader will trust later is checked here once: chunk ranges
 * inside their files, byte counts against shapes, CRC counts against the
 * grid, chunk boxes inside the global shape, and that each tensor's chunks
 * tile it (no two overlap, none missing: boxcheck.h, as the merge checks).
 * A reader copies each chunk into its box and nothing else, so a manifest
 * that passed here never leaves an element unwritten or written twice.
 * The parsed form lives in a few pooled blocks, not one allocation per
 * chunk, so a manifest of 10,000+ tensors is cheap to open and free.
 *
 * The manifest is untrusted input (hand-written, or whatever a bucket
 * holds): every count it states is checked against what it holds, and what
 * it makes us allocate is proportional to its text.
 */
#include <errno.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/boxcheck.h"
#include "format/dtype.h"
#include "format/errmsg.h"
#include "format/index.h"
#include "format/jread.h"
#include "format/names.h"

#define bad(...) errmsg_set(err, errlen, -EBADMSG, __VA_ARGS__)

#define POOL_FIRST (16u << 10)
#define POOL_MAX   (1u << 20)
#define PATH_MAX_LEN 255

struct pool_blk {
	struct pool_blk *next;
	size_t used, cap;
	alignas(16) unsigned char data[];
};

/* Bump allocation from the newest block; oversized requests get a block of
 * their own.  Everything is freed at once by manifest_free(). */
static void *pool_alloc(struct manifest *m, size_t n)
{
	struct pool_blk *b = m->pool;
	void *p;

	n = (n + 15) & ~(size_t)15;
	if (!b || b->cap - b->used < n) {
		size_t cap = b ? b->cap * 2 : POOL_FIRST;

		if (cap > POOL_MAX)
			cap = POOL_MAX;
		if (cap < n)
			cap = n;
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->cap = cap;
		b->used = 0;
		b->next = m->pool;
		m->pool = b;
	}
	p = b->data + b->used;
	b->used += n;
	return p;
}

static char *pool_strdup(struct manifest *m, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = pool_alloc(m, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

void manifest_free(struct manifest *m)
{
	struct pool_blk *b, *next;

	if (!m)
		return;
	for (b = m->pool; b; b = next) {
		next = b->next;
		free(b);
	}
	json_decref(m->json);
	memset(m, 0, sizeof(*m));
}

/* An array of exactly `n` non-negative integers (n <= CKPT_MAX_NDIM). */
static bool get_dims_n(const json_t *j, uint64_t *out, size_t n)
{
	if (!json_is_array(j) || json_array_size(j) != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!jread_u64(json_array_get(j, i), &out[i]))
			return false;
	return true;
}

/* Reads a CRC list of exactly the grid's count for [begin, end). */
static int get_crcs(struct manifest *m, const json_t *j, uint64_t begin, uint64_t end,
		    uint32_t **ret)
{
	uint64_t n = end > begin ? (end - 1) / LAYOUT_CRC_BLOCK - begin / LAYOUT_CRC_BLOCK + 1 : 0;
	uint32_t *c;

	if (!json_is_array(j) || json_array_size(j) != n)
		return -EBADMSG;
	c = pool_alloc(m, (n ? n : 1) * sizeof(*c));
	if (!c)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		uint64_t v;

		if (!jread_u64(json_array_get(j, i), &v) || v > UINT32_MAX)
			return -EBADMSG;
		c[i] = (uint32_t)v;
	}
	*ret = c;
	return 0;
}

static bool plain_file_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > PATH_MAX_LEN || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' || (unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int parse_files(struct manifest *m, json_t *files, char *err, size_t errlen)
{
	uint64_t total = 0, want;

	if (!json_is_array(files) || json_array_size(files) > CKPT_MAX_WORLD)
		return bad("manifest files is not an array of at most %d", CKPT_MAX_WORLD);
	m->n_files = json_array_size(files);
	m->files = pool_alloc(m, (m->n_files ? m->n_files : 1) * sizeof(*m->files));
	if (!m->files)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_files; i++) {
		json_t *f = json_array_get(files, i);
		const char *path = json_string_value(json_object_get(f, "path"));
		uint64_t rank, size;

		if (!jread_u64(json_object_get(f, "rank"), &rank) || rank >= m->world)
			return bad("manifest file %zu: rank is not an integer below %u", i, m->world);
		if (!jread_u64(json_object_get(f, "size"), &size))
			return bad("manifest file %zu: size is not a non-negative integer", i);
		if (!path || !plain_file_name(path))
			return bad("manifest file %zu: path is not a plain file name", i);
		if (__builtin_add_overflow(total, size, &total))
			return bad("manifest file sizes overflow");
		m->files[i].rank = (uint32_t)rank;
		m->files[i].size = size;
		m->files[i].path = pool_strdup(m, path);
		if (!m->files[i].path)
			return -ENOMEM;
	}
	/* Chunks are told apart by file index: one file named twice would let
	 * two chunks share its bytes, unseen by the overlap check. */
	if (m->n_files > 1) {
		const char **v = malloc(m->n_files * sizeof(*v));
		int dup = 0;

		if (!v)
			return -ENOMEM;
		for (size_t i = 0; i < m->n_files; i++)
			v[i] = m->files[i].path;
		qsort(v, m->n_files, sizeof(*v), str_cmp);
		for (size_t i = 1; i < m->n_files && !dup; i++)
			dup = !strcmp(v[i - 1], v[i]);
		if (dup) {
			char sb[ERRMSG_SAFE_LEN];
			const char *name = NULL;

			for (size_t i = 1; i < m->n_files && !name; i++)
				if (!strcmp(v[i - 1], v[i]))
					name = v[i];
			free(v);
			return bad("manifest lists the file '%s' more than once",
				   errmsg_safe(name, sb));
		}
		free(v);
	}
	if (!jread_u64(json_object_get(m->json, "total_bytes"), &want) || want != total)
		return bad("manifest total_bytes is not the sum of the file sizes (%llu)",
			   (unsigned long long)total);
	m->total_bytes = total;
	return 0;
}

/* Checks one chunk's byte range against its file and fills the range and
 * CRCs of *c. */
static int parse_range(struct manifest *m, const char *what, const char *name, size_t k,
		       json_t *jc, uint64_t nbytes, struct manifest_chunk *c, char *err,
		       size_t errlen)
{
	uint64_t file, begin, end;
	int ret;

	if (!jread_u64(json_object_get(jc, "file"), &file) || file >= m->n_files)
		return bad("%s '%s' chunk %zu: file is not an index below %zu", what, name, k,
			   m->n_files);
	if (!jread_u64(json_object_get(jc, "begin"), &begin) ||
	    !jread_u64(json_object_get(jc, "end"), &end) || begin > end ||
	    end > m->files[file].size)
		return bad("%s '%s' chunk %zu: [begin, end) is not a range inside %s (%llu bytes)",
			   what, name, k, m->files[file].path,
			   (unsigned long long)m->files[file].size);
	if (end - begin != nbytes)
		return bad("%s '%s' chunk %zu: range of %llu bytes for %llu bytes of data", what,
			   name, k, (unsigned long long)(end - begin), (unsigned long long)nbytes);
	ret = get_crcs(m, json_object_get(jc, "crc32c"), begin, end, &c->crcs);
	if (ret == -EBADMSG)
		return bad("%s '%s' chunk %zu: crc32c is not a list of %u 32-bit values", what, name,
			   k, layout_crc_count(begin, end));
	if (ret)
		return ret;
	c->file = (uint32_t)file;
	c->begin = begin;
	c->end = end;
	return 0;
}

/* Reports why a tensor's chunks do not tile it (boxcheck_verdict()). */
static int tiling_error(const char *name, const struct manifest_tensor *t,
			enum boxcheck_verdict v, const struct boxcheck_result *res, char *err,
			size_t errlen)
{
	char b1[128], b2[128];

	if (v == BOXCHECK_OVERLAP)
		return bad("tensor '%s': chunks %zu and %zu overlap (at %s and %s)", name,
			   res->first, res->second,
			   errmsg_dims(t->chunks[res->first].offsets, t->ndim, b1, sizeof(b1)),
			   errmsg_dims(t->chunks[res->second].offsets, t->ndim, b2, sizeof(b2)));
	return bad("tensor '%s': chunks cover %llu of %llu elements", name,
		   (unsigned long long)res->covered, (unsigned long long)res->total);
}

/* bc is the parse's scratch for the tiling check, reused tensor to tensor. */
static int parse_tensor(struct manifest *m, const char *name, json_t *jt,
			struct manifest_tensor *t, struct boxcheck *bc, char *err, size_t errlen)
{
	json_t *shape = json_object_get(jt, "shape"), *chunks = json_object_get(jt, "chunks");
	struct boxcheck_result res;
	enum boxcheck_verdict v;
	uint64_t esize, gvol = 1;
	int dtype;
	size_t nd;

	if (!json_is_object(jt))
		return bad("tensor '%s' is not an object", name);
	dtype = dtype_from_name(json_string_value(json_object_get(jt, "dtype")));
	if (dtype < 0)
		return bad("tensor '%s': unknown dtype", name);
	nd = json_array_size(shape);
	if (!json_is_array(shape) || nd > CKPT_MAX_NDIM || !get_dims_n(shape, t->shape, nd))
		return bad("tensor '%s': shape is not an array of at most %d non-negative integers",
			   name, CKPT_MAX_NDIM);
	esize = ckpt_dtype_size((enum ckpt_dtype)dtype);
	for (size_t d = 0; d < nd; d++)
		if (__builtin_mul_overflow(gvol, t->shape[d], &gvol))
			return bad("tensor '%s': size overflows", name);
	if (gvol > INT64_MAX / esize)
		return bad("tensor '%s': size overflows", name);
	if (!json_is_array(chunks) || json_array_size(chunks) == 0)
		return bad("tensor '%s': chunks is not a non-empty array", name);
	if (boxcheck_start(bc, (unsigned)nd, t->shape))
		return bad("tensor '%s': size overflows", name); /* refused above */

	t->kind = ITEM_TENSOR;
	t->dtype = (uint8_t)dtype;
	t->ndim = (uint8_t)nd;
	t->n_chunks = json_array_size(chunks);
	t->chunks = pool_alloc(m, t->n_chunks * sizeof(*t->chunks));
	if (!t->chunks)
		return -ENOMEM;
	for (size_t k = 0; k < t->n_chunks; k++) {
		json_t *jc = json_array_get(chunks, k);
		struct manifest_chunk *c = &t->chunks[k];
		uint64_t vol = 1;
		int ret;

		c->offsets = pool_alloc(m, (nd ? 2 * nd : 1) * sizeof(uint64_t));
		if (!c->offsets)
			return -ENOMEM;
		c->shape = c->offsets + nd;
		if (!json_is_object(jc) ||
		    !get_dims_n(json_object_get(jc, "offsets"), c->offsets, nd) ||
		    !get_dims_n(json_object_get(jc, "shape"), c->shape, nd))
			return bad("tensor '%s' chunk %zu: offsets and shape must be %zu non-negative integers",
				   name, k, nd);
		for (size_t d = 0; d < nd; d++) {
			if (c->offsets[d] > t->shape[d] || c->shape[d] > t->shape[d] - c->offsets[d])
				return bad("tensor '%s' chunk %zu: dimension %zu: offset %llu + size %llu exceeds %llu",
					   name, k, d, (unsigned long long)c->offsets[d],
					   (unsigned long long)c->shape[d],
					   (unsigned long long)t->shape[d]);
			vol *= c->shape[d]; /* <= gvol: no overflow */
		}
		ret = parse_range(m, "tensor", name, k, jc, vol * esize, c, err, errlen);
		if (ret)
			return ret;
		/* Inside the global shape (checked above), as boxcheck needs. */
		ret = boxcheck_add(bc, c->offsets, c->shape);
		if (ret)
			return ret;
	}
	v = boxcheck_verdict(bc, &res);
	if (v != BOXCHECK_TILES)
		return tiling_error(name, t, v, &res, err, errlen);
	return 0;
}

static int parse_blob(struct manifest *m, const char *name, json_t *jb, struct manifest_tensor *t,
		      char *err, size_t errlen)
{
	uint64_t size;

	if (!json_is_object(jb))
		return bad("blob '%s' is not an object", name);
	if (!jread_u64(json_object_get(jb, "size"), &size))
		return bad("blob '%s': size is not a non-negative integer", name);
	t->kind = ITEM_BLOB;
	t->dtype = CKPT_U8;
	t->ndim = 1;
	t->shape[0] = size;
	t->n_chunks = 1;
	t->chunks = pool_alloc(m, sizeof(*t->chunks) + 2 * sizeof(uint64_t));
	if (!t->chunks)
		return -ENOMEM;
	t->chunks[0].offsets = (uint64_t *)(t->chunks + 1);
	t->chunks[0].shape = t->chunks[0].offsets + 1;
	t->chunks[0].offsets[0] = 0;
	t->chunks[0].shape[0] = size;
	return parse_range(m, "blob", name, 0, jb, size, &t->chunks[0], err, errlen);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct manifest_tensor *)a)->name,
		      ((const struct manifest_tensor *)b)->name);
}

static int parse_items(struct manifest *m, json_t *tensors, json_t *blobs, struct boxcheck *bc,
		       char *err, size_t errlen)
{
	const char *key;
	json_t *val;
	char sub[256];
	size_t i = 0, a, b;
	int ret;

	if (!json_is_object(tensors) || !json_is_object(blobs))
		return bad("manifest tensors or blobs is not an object");
	m->n_tensors = json_object_size(tensors);
	m->n_items = m->n_tensors + json_object_size(blobs);
	m->items = pool_alloc(m, (m->n_items ? m->n_items : 1) * sizeof(*m->items));
	if (!m->items)
		return -ENOMEM;
	memset(m->items, 0, m->n_items * sizeof(*m->items));
	json_object_foreach(tensors, key, val) {
		if (!name_item_ok(key, sub, sizeof(sub)))
			return bad("manifest tensor: %s", sub);
		m->items[i].name = pool_strdup(m, key);
		if (!m->items[i].name)
			return -ENOMEM;
		ret = parse_tensor(m, key, val, &m->items[i], bc, err, errlen);
		if (ret)
			return ret;
		i++;
	}
	json_object_foreach(blobs, key, val) {
		if (!name_item_ok(key, sub, sizeof(sub)))
			return bad("manifest blob: %s", sub);
		m->items[i].name = pool_strdup(m, key);
		if (!m->items[i].name)
			return -ENOMEM;
		ret = parse_blob(m, key, val, &m->items[i], err, errlen);
		if (ret)
			return ret;
		i++;
	}
	qsort(m->items, m->n_tensors, sizeof(*m->items), by_name);
	qsort(m->items + m->n_tensors, m->n_items - m->n_tensors, sizeof(*m->items), by_name);
	/* Names are unique within each object (duplicate keys are refused at
	 * parse); a walk over both sorted lists finds a name in both. */
	for (a = 0, b = m->n_tensors; a < m->n_tensors && b < m->n_items;) {
		int c = strcmp(m->items[a].name, m->items[b].name);

		if (c == 0)
			return bad("'%s' is both a tensor and a blob", m->items[a].name);
		if (c < 0)
			a++;
		else
			b++;
	}
	return 0;
}

/* A chunk's byte range in its file, for check_file_ranges. */
struct frange {
	uint32_t file;
	uint64_t begin, end;
	uint32_t item;
	uint32_t chunk;
};

static int by_frange(const void *pa, const void *pb)
{
	const struct frange *a = pa, *b = pb;

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	return a->end < b->end ? -1 : a->end > b->end;
}

/*
 * No two chunks (of one tensor or of two, or blobs) share a byte of a file.
 * Each chunk was checked against its file and its tensor; this is the
 * check between chunks: a manifest pointing two items at the same bytes
 * (each with matching CRCs) would load one item's bytes as another's, and
 * a reader that verifies a file's reads in one forward pass relies on
 * chunks being disjoint.  Empty chunks hold no byte and are left out.
 */
static int check_file_ranges(const struct manifest *m, char *err, size_t errlen)
{
	struct frange *r;
	size_t n = 0, cap = 0;

	for (size_t i = 0; i < m->n_items; i++)
		cap += m->items[i].n_chunks;
	if (cap < 2)
		return 0;
	r = malloc(cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_items; i++)
		for (size_t k = 0; k < m->items[i].n_chunks; k++) {
			const struct manifest_chunk *c = &m->items[i].chunks[k];
			if (c->end > c->begin)
				r[n++] = (struct frange){ c->file, c->begin, c->end, (uint32_t)i,
							  (uint32_t)k };
		}
	qsort(r, n, sizeof(*r), by_frange);
	for (size_t j = 1; j < n; j++) {
		if (r[j].file == r[j - 1].file && r[j].begin < r[j - 1].end) {
			int ret = bad("'%s' chunk %u and '%s' chunk %u share bytes of %s (from offset "
				      "%llu)", m->items[r[j - 1].item].name, r[j - 1].chunk,
				      m->items[r[j].item].name, r[j].chunk,
				      m->files[r[j].file].path, (unsigned long long)r[j].begin);
			free(r);
			return ret;
		}
	}
	free(r);
	return 0;
}

/* The N of a format "ckpt-N" (decimal, no sign, no leading zero), or NULL. */
static const char *format_version(const char *s)
{
	static const char prefix[] = "ckpt-";
	const char *v;

	if (strncmp(s, prefix, sizeof(prefix) - 1) != 0)
		return NULL;
	v = s + sizeof(prefix) - 1;
	if (*v < '1' || *v > '9')
		return NULL;
	for (const char *p = v; *p; p++)
		if (*p < '0' || *p > '9')
			return NULL;
	return v;
}

/*
 * True if s is "ckpt-N" for an N above this reader's: a manifest of a later
 * format (which may mean anything by its fields), not a corrupt one, and
 * worth telling apart.  The numbers are compared as digit strings, so no N
 * is too long to compare.
 */
static bool format_is_newer(const char *s)
{
	const char *v = format_version(s), *mine = format_version(MANIFEST_FORMAT);
	size_t lv, lm;

	if (!v || !mine)
		return false;
	lv = strlen(v);
	lm = strlen(mine);
	return lv > lm || (lv == lm && strcmp(v, mine) > 0);
}

int manifest_parse(const char *text, size_t len, struct manifest *m, char *err, size_t errlen)
{
	char sub[256], sb[ERRMSG_SAFE_LEN];
	struct boxcheck bc = BOXCHECK_INIT;
	json_error_t jerr;
	const char *s, *name, *job, *tm;
	uint64_t v;
	json_t *root;
	int ret;

	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		for (char *p = jerr.text; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
		return bad("manifest is not valid JSON: %s (line %d, column %d)", jerr.text,
			   jerr.line, jerr.column);
	}
	m->json = root;
	if (!json_is_object(root)) {
		ret = bad("manifest is not a JSON object");
		goto fail;
	}
	s = json_string_value(json_object_get(root, "format"));
	if (!s && json_object_get(root, MANIFEST_TOMBSTONE_KEY)) {
		ret = errmsg_set(err, errlen, -ENOENT, "the checkpoint is being removed (a tombstone "
				 "stands in for its manifest): not a committed checkpoint");
		goto fail;
	}
	if (s && format_is_newer(s)) {
		ret = errmsg_set(err, errlen, -EPROTONOSUPPORT,
				 "manifest format '%s' is newer than this reader knows (it reads %s): "
				 "read it with a newer libckpt and ckptctl",
				 errmsg_safe(s, sb), MANIFEST_FORMAT);
		goto fail;
	}
	if (!s || strcmp(s, MANIFEST_FORMAT) != 0) {
		ret = bad("manifest format is '%s', expected '%s'", s ? errmsg_safe(s, sb) : "",
			  MANIFEST_FORMAT);
		goto fail;
	}
	name = json_string_value(json_object_get(root, "name"));
	job = json_string_value(json_object_get(root, "job"));
	tm = json_string_value(json_object_get(root, "time"));
	if (!name || !name_checkpoint_ok(name, sub, sizeof(sub)) || !job ||
	    !name_job_ok(job, sub, sizeof(sub))) {
		ret = bad("manifest: %s", name && job ? sub : "name and job must be strings");
		goto fail;
	}
	if (!tm || strlen(tm) >= sizeof(m->time)) {
		ret = bad("manifest time is not a string of under %zu bytes", sizeof(m->time));
		goto fail;
	}
	strcpy(m->name, name);
	strcpy(m->job, job);
	strcpy(m->time, tm);
	/* Optional (older manifests have none): the attempt that committed. */
	s = json_string_value(json_object_get(root, "attempt"));
	if (s && strlen(s) < sizeof(m->attempt))
		strcpy(m->attempt, s);
	/* Optional: the committing user, where the store keeps no owner. */
	if (json_object_get(root, "uid")) {
		if (!jread_u64(json_object_get(root, "uid"), &v) || v >= UINT32_MAX) {
			ret = bad("manifest uid is not a user id");
			goto fail;
		}
		m->has_uid = true;
		m->uid = (uint32_t)v;
	}
	if (!jread_u64(json_object_get(root, "step"), &m->step)) {
		ret = bad("manifest step is not a non-negative integer");
		goto fail;
	}
	if (!jread_u64(json_object_get(root, "world_size"), &v) || v == 0 || v > CKPT_MAX_WORLD) {
		ret = bad("manifest world_size is not in [1, %d]", CKPT_MAX_WORLD);
		goto fail;
	}
	m->world = (uint32_t)v;
	if (!jread_u64(json_object_get(root, "crc_block"), &v) || v != LAYOUT_CRC_BLOCK) {
		ret = bad("manifest crc_block is not %u", LAYOUT_CRC_BLOCK);
		goto fail;
	}
	if (!json_is_object(json_object_get(root, "metadata")) ||
	    !json_is_object(json_object_get(root, "metrics"))) {
		ret = bad("manifest metadata or metrics is not an object");
		goto fail;
	}
	ret = parse_files(m, json_object_get(root, "files"), err, errlen);
	if (ret)
		goto fail;
	ret = parse_items(m, json_object_get(root, "tensors"), json_object_get(root, "blobs"), &bc,
			  err, errlen);
	boxcheck_free(&bc);
	if (ret == 0)
		ret = check_file_ranges(m, err, errlen);
	if (ret)
		goto fail;
	/* Everything else now lives in the pool: keep only what m->json is
	 * for, and let the big tree go (it is ~10x the text in memory). */
	m->json = json_pack("{sOsO}", "metadata", json_object_get(root, "metadata"), "metrics",
			    json_object_get(root, "metrics"));
	json_decref(root);
	if (!m->json) {
		ret = -ENOMEM;
		goto fail;
	}
	return 0;

fail:
	manifest_free(m);
	return ret;
}

const struct manifest_tensor *manifest_find(const struct manifest *m, enum item_kind kind,
					    const char *name)
{
	size_t lo = kind == ITEM_BLOB ? m->n_tensors : 0;
	size_t hi = kind == ITEM_BLOB ? m->n_items : m->n_tensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, m->items[mid].name);

		if (c == 0)
			return &m->items[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}
