/* SPDX-License-Identifier: MIT */
/*
 * index.c - per-rank indexes and their merge into the manifest (index.h).
 *
 * The merge reads what other daemons wrote on shared storage, so it checks
 * every index as input it did not make: a bad one fails the commit with a
 * reason, never a crash or a manifest that lies.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "format/boxcheck.h"
#include "format/dtype.h"
#include "format/errmsg.h"
#include "format/grow.h"
#include "format/index.h"
#include "store/fsutil.h"
#include "format/jbuf.h"
#include "format/jread.h"
#include "format/names.h"
#include "format/nameset.h"

/* Cap on one index file: ~200 bytes an item plus 11 a CRC. */
/* Indexes are parsed by up to this many threads at once. */
#define MERGE_MAX_THREADS 16

#define bad(...) errmsg_set(err, errlen, -EBADMSG, __VA_ARGS__)

void index_shard_name(uint32_t rank, char *buf, size_t len)
{
	snprintf(buf, len, "rank-%05u.safetensors", rank);
}

void index_shard_name_tag(uint32_t rank, const char *tag, char *buf, size_t len)
{
	if (tag && *tag)
		snprintf(buf, len, "rank-%05u.%s.safetensors", rank, tag);
	else
		index_shard_name(rank, buf, len);
}

void index_index_name(uint32_t rank, char *buf, size_t len)
{
	snprintf(buf, len, "rank-%05u.index.json", rank);
}

int index_build(const struct layout *l, const uint32_t *crcs, const char *job, uint32_t rank,
		uint32_t world, char **ret_text)
{
	return index_build_origin(l, crcs, job, rank, world, NULL, ret_text);
}

int index_build_origin(const struct layout *l, const uint32_t *crcs, const char *job,
		       uint32_t rank, uint32_t world, const struct index_origin *o,
		       char **ret_text)
{
	char file[INDEX_SHARD_NAME_MAX];
	struct jbuf b;
	int ret;

	index_shard_name_tag(rank, o ? o->shard_tag : NULL, file, sizeof(file));
	jbuf_init(&b, 512 + l->n_items * 192 + (size_t)l->n_crcs * 11, 0);
	jbuf_lit(&b, "{\"format\":\"" INDEX_FORMAT "\",\"job\":");
	jbuf_str(&b, job);
	jbuf_lit(&b, ",\"name\":");
	jbuf_str(&b, l->name);
	jbuf_lit(&b, ",\"step\":");
	jbuf_u64(&b, l->step);
	jbuf_lit(&b, ",\"rank\":");
	jbuf_u64(&b, rank);
	jbuf_lit(&b, ",\"world\":");
	jbuf_u64(&b, world);
	if (o) {
		jbuf_lit(&b, ",\"attempt\":");
		jbuf_str(&b, o->attempt);
		jbuf_lit(&b, ",\"writer\":{\"id\":");
		jbuf_str(&b, o->writer_id);
		jbuf_lit(&b, ",\"instance\":");
		jbuf_str(&b, o->instance);
		jbuf_lit(&b, "},\"to\":");
		jbuf_str(&b, o->to ? o->to : "");
	}
	jbuf_lit(&b, ",\"file\":");
	jbuf_str(&b, file);
	jbuf_lit(&b, ",\"file_size\":");
	jbuf_u64(&b, l->file_size);
	jbuf_lit(&b, ",\"crc_block\":");
	jbuf_u64(&b, LAYOUT_CRC_BLOCK);
	jbuf_lit(&b, ",\"meta\":");
	jbuf_json(&b, l->meta);
	jbuf_lit(&b, ",\"metrics\":");
	jbuf_json(&b, l->metrics);
	jbuf_lit(&b, ",\"items\":[");
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		const char *dn = ckpt_dtype_name(it->dtype);
		uint32_t nc = layout_crc_count(it->begin, it->end);

		if (i)
			jbuf_ch(&b, ',');
		jbuf_lit(&b, "{\"name\":");
		jbuf_str(&b, it->name);
		if (it->kind == ITEM_BLOB)
			jbuf_lit(&b, ",\"kind\":\"blob\",\"dtype\":\"");
		else
			jbuf_lit(&b, ",\"kind\":\"tensor\",\"dtype\":\"");
		jbuf_mem(&b, dn, strlen(dn));
		jbuf_lit(&b, "\",\"shape\":");
		jbuf_u64_array(&b, layout_shape(l, it), it->ndim);
		jbuf_lit(&b, ",\"global_shape\":");
		jbuf_u64_array(&b, layout_gshape(l, it), it->ndim);
		jbuf_lit(&b, ",\"offsets\":");
		jbuf_u64_array(&b, layout_offs(l, it), it->ndim);
		jbuf_lit(&b, ",\"begin\":");
		jbuf_u64(&b, it->begin);
		jbuf_lit(&b, ",\"end\":");
		jbuf_u64(&b, it->end);
		jbuf_lit(&b, ",\"crc32c\":[");
		for (uint32_t c = 0; c < nc; c++) {
			if (c)
				jbuf_ch(&b, ',');
			jbuf_u64(&b, crcs[it->crc0 + c]);
		}
		jbuf_lit(&b, "]}");
	}
	jbuf_lit(&b, "]}");
	ret = jbuf_finish(&b, true, ret_text, NULL);
	return ret == -E2BIG ? -ENOMEM : ret;
}

/* ---- merge ---------------------------------------------------------------- */

/*
 * The merge runs in two phases.  First each rank's index is read, parsed,
 * checked and boiled down to plain arrays (struct part), and its JSON tree
 * is freed at once.  Parsing is most of the cost (jansson builds a tree of
 * small allocations: ~30 ms for 10,000 items here), and ranks are
 * independent, so this phase runs on a few threads.  Then, on the calling
 * thread, the parts are gathered, chunks grouped by name and checked, and
 * the manifest written.  Errors are reported for the lowest failing rank,
 * so the message does not depend on thread timing.
 */

#define NONE UINT32_MAX

/* One item of one rank's index, validated. */
struct chunk {
	const char *name;  /* in the rank's name pool */
	uint8_t kind, dtype, ndim;
	uint32_t rank;
	uint32_t next;     /* next chunk of the same tensor, or NONE */
	size_t dims;       /* into dims: shape, gshape, offs (ndim each) */
	size_t crc0;       /* into crcs: layout_crc_count(begin, end) entries */
	uint64_t begin, end;
};

/* What one rank's index contributes. */
struct part {
	int ret;
	char err[256];
	uint64_t file_size, step;
	json_t *meta, *metrics;  /* kept for rank 0 only */
	char *names;             /* name pool: at most the file's size */
	size_t names_used;
	struct chunk *chunks;
	size_t n_chunks, cap_chunks;
	uint64_t *dims;
	size_t n_dims, cap_dims;
	uint32_t *crcs;
	size_t n_crcs, cap_crcs;
};

/* One tensor or blob of the checkpoint; its first chunk gives the kind,
 * dtype and global shape every other chunk must repeat. */
struct entry {
	uint32_t first, last;
	uint32_t n_chunks;
};

struct merge {
	int dirfd;
	index_fetch_fn fetch;    /* instead of dirfd when set */
	void *fetch_ud;
	const char *job, *name;
	const struct index_origin *origin; /* NULL: no attempt checks */
	uint32_t world;
	const struct index_local *local; /* ranks given in memory */
	size_t n_local;
	atomic_uint next_rank;   /* work queue of the parse phase */
	struct part *parts;      /* per rank */
	/* Gathered from the parts. */
	struct chunk *chunks;
	size_t n_chunks;
	uint64_t *dims;
	uint32_t *crcs;
	struct entry *entries;
	size_t n_entries;
};

static bool get_dims(const json_t *j, uint64_t *out, size_t *ret_n)
{
	size_t n;

	if (!json_is_array(j))
		return false;
	n = json_array_size(j);
	if (n > CKPT_MAX_NDIM)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!jread_u64(json_array_get(j, i), &out[i]))
			return false;
	*ret_n = n;
	return true;
}

/* Reads rank r's index file whole and parses it; *ret_size is the file's
 * size (a bound on the bytes of all names in it). */
static int load_index(const struct merge *m, uint32_t r, json_t **ret, size_t *ret_size,
		      char *err, size_t errlen)
{
	char fname[32], why[384] = "";
	json_error_t jerr;
	char *buf = NULL;
	size_t got = 0;
	json_t *root;
	int ret_err;

	index_index_name(r, fname, sizeof(fname));
	ret_err = m->fetch ? m->fetch(m->fetch_ud, r, &buf, &got, why, sizeof(why)) :
			   fs_read_file_at(m->dirfd, fname, INDEX_MAX_BYTES, &buf, &got);
	if (ret_err == -ENOENT)
		return errmsg_set(err, errlen, -ENOENT, "rank %u: index missing", r);
	if (ret_err == -EFBIG || ret_err == -EISDIR || ret_err == -EINVAL)
		return bad("rank %u: %s is not a regular file of at most %llu bytes", r, fname,
			   INDEX_MAX_BYTES);
	if (ret_err < 0)
		return errmsg_set(err, errlen, ret_err, "rank %u: reading %s: %s", r, fname,
				  why[0] ? why : strerror(-ret_err));
	root = json_loadb(buf, got, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		for (char *p = jerr.text; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
		ret_err = bad("rank %u: %s is not valid JSON: %s (line %d)", r, fname, jerr.text,
			      jerr.line);
		free(buf);
		return ret_err;
	}
	free(buf);
	*ret = root;
	*ret_size = got;
	return 0;
}

/* Checks that a string field of rank r's index equals `want`. */
static int check_str(json_t *root, const char *key, const char *want, uint32_t r, char *err,
		     size_t errlen)
{
	const char *v = json_string_value(json_object_get(root, key));
	char sb[ERRMSG_SAFE_LEN];

	if (!v)
		return bad("rank %u: index has no string '%s'", r, key);
	if (strcmp(v, want) != 0)
		return bad("rank %u: index says %s '%s', expected '%s'", r, key, errmsg_safe(v, sb),
			   want);
	return 0;
}

static int check_u64(json_t *root, const char *key, uint64_t want, uint32_t r, char *err,
		     size_t errlen)
{
	uint64_t v;

	if (!jread_u64(json_object_get(root, key), &v))
		return bad("rank %u: index has no integer '%s'", r, key);
	if (v != want)
		return bad("rank %u: index says %s %llu, expected %llu", r, key,
			   (unsigned long long)v, (unsigned long long)want);
	return 0;
}

/* Validates one index item and appends it to the part as a chunk. */
static int add_chunk(struct part *p, uint32_t r, size_t i, json_t *it, char *err, size_t errlen)
{
	uint64_t shape[CKPT_MAX_NDIM], gshape[CKPT_MAX_NDIM], offs[CKPT_MAX_NDIM];
	uint64_t begin, end, vol, gvol, ncrc;
	size_t nd, ngd, nod, esize, nlen;
	const char *name, *kind;
	const json_t *crcs;
	struct chunk *c;
	char sub[256];
	int dtype;

	if (!json_is_object(it))
		return bad("rank %u: item %zu is not an object", r, i);
	name = json_string_value(json_object_get(it, "name"));
	if (!name || !name_item_ok(name, sub, sizeof(sub)))
		return bad("rank %u: item %zu: %s", r, i, name ? sub : "no name");
	kind = json_string_value(json_object_get(it, "kind"));
	if (!kind || (strcmp(kind, "tensor") != 0 && strcmp(kind, "blob") != 0))
		return bad("rank %u: item '%s': kind is not \"tensor\" or \"blob\"", r, name);
	dtype = dtype_from_name(json_string_value(json_object_get(it, "dtype")));
	if (dtype < 0)
		return bad("rank %u: item '%s': unknown dtype", r, name);
	if (!get_dims(json_object_get(it, "shape"), shape, &nd) ||
	    !get_dims(json_object_get(it, "global_shape"), gshape, &ngd) ||
	    !get_dims(json_object_get(it, "offsets"), offs, &nod) || ngd != nd || nod != nd)
		return bad("rank %u: item '%s': shape, global_shape and offsets must be arrays of one length <= %d",
			   r, name, CKPT_MAX_NDIM);
	esize = ckpt_dtype_size((enum ckpt_dtype)dtype);
	vol = gvol = 1;
	for (size_t d = 0; d < nd; d++) {
		if (offs[d] > gshape[d] || shape[d] > gshape[d] - offs[d])
			return bad("rank %u: item '%s': dimension %zu: offset %llu + size %llu exceeds %llu",
				   r, name, d, (unsigned long long)offs[d],
				   (unsigned long long)shape[d], (unsigned long long)gshape[d]);
		if (__builtin_mul_overflow(vol, shape[d], &vol) ||
		    __builtin_mul_overflow(gvol, gshape[d], &gvol))
			return bad("rank %u: item '%s': size overflows", r, name);
	}
	if (__builtin_mul_overflow(vol, (uint64_t)esize, &vol) ||
	    __builtin_mul_overflow(gvol, (uint64_t)esize, &gvol))
		return bad("rank %u: item '%s': size overflows", r, name);
	if (kind[0] == 'b' && (dtype != CKPT_U8 || nd != 1 || offs[0] != 0 || gshape[0] != shape[0]))
		return bad("rank %u: blob '%s' is not a whole 1-D U8 array", r, name);
	if (!jread_u64(json_object_get(it, "begin"), &begin) ||
	    !jread_u64(json_object_get(it, "end"), &end) || begin > end || end > p->file_size)
		return bad("rank %u: item '%s': begin/end not a range inside the file (%llu bytes)", r,
			   name, (unsigned long long)p->file_size);
	if (end - begin != vol)
		return bad("rank %u: item '%s': %llu bytes for a chunk of %llu", r, name,
			   (unsigned long long)(end - begin), (unsigned long long)vol);
	crcs = json_object_get(it, "crc32c");
	ncrc = end > begin ? (end - 1) / LAYOUT_CRC_BLOCK - begin / LAYOUT_CRC_BLOCK + 1 : 0;
	if (!json_is_array(crcs) || json_array_size(crcs) != ncrc)
		return bad("rank %u: item '%s': crc32c is not an array of %llu CRCs", r, name,
			   (unsigned long long)ncrc);
	if (grow_array((void **)&p->chunks, &p->cap_chunks, p->n_chunks + 1, sizeof(*p->chunks)) ||
	    grow_array((void **)&p->dims, &p->cap_dims, p->n_dims + 3 * nd, sizeof(*p->dims)) ||
	    grow_array((void **)&p->crcs, &p->cap_crcs, p->n_crcs + ncrc, sizeof(*p->crcs)))
		return -ENOMEM;
	for (size_t k = 0; k < ncrc; k++) {
		uint64_t v;

		if (!jread_u64(json_array_get(crcs, k), &v) || v > UINT32_MAX)
			return bad("rank %u: item '%s': crc32c[%zu] is not a 32-bit value", r, name,
				   k);
		p->crcs[p->n_crcs + k] = (uint32_t)v;
	}

	/* Each name occupies at least its length + 2 bytes of the file, so
	 * the pool (the file's size) cannot run out. */
	nlen = strlen(name) + 1;
	c = &p->chunks[p->n_chunks++];
	*c = (struct chunk){
		.name = memcpy(p->names + p->names_used, name, nlen),
		.kind = kind[0] == 'b' ? ITEM_BLOB : ITEM_TENSOR,
		.dtype = (uint8_t)dtype,
		.ndim = (uint8_t)nd,
		.rank = r,
		.next = NONE,
		.dims = p->n_dims,
		.crc0 = p->n_crcs,
		.begin = begin,
		.end = end,
	};
	p->names_used += nlen;
	for (size_t d = 0; d < nd; d++) {
		p->dims[p->n_dims + d] = shape[d];
		p->dims[p->n_dims + nd + d] = gshape[d];
		p->dims[p->n_dims + 2 * nd + d] = offs[d];
	}
	p->n_dims += 3 * nd;
	p->n_crcs += ncrc;
	return 0;
}

/* Loads, checks and extracts rank r's index into its part. */
static int load_part(struct merge *m, uint32_t r, char *err, size_t errlen)
{
	struct part *p = &m->parts[r];
	char file[INDEX_SHARD_NAME_MAX];
	json_t *root = NULL, *items;
	size_t fsize = 0;
	int ret;

	ret = load_index(m, r, &root, &fsize, err, errlen);
	if (ret)
		return ret;
	if (!json_is_object(root)) {
		ret = bad("rank %u: index is not a JSON object", r);
		goto out;
	}
	index_shard_name_tag(r, m->origin ? m->origin->shard_tag : NULL, file, sizeof(file));
	if ((ret = check_str(root, "format", INDEX_FORMAT, r, err, errlen)) ||
	    (ret = check_str(root, "job", m->job, r, err, errlen)) ||
	    (ret = check_str(root, "name", m->name, r, err, errlen)) ||
	    (ret = check_str(root, "file", file, r, err, errlen)) ||
	    (ret = check_u64(root, "rank", r, r, err, errlen)) ||
	    (ret = check_u64(root, "world", m->world, r, err, errlen)) ||
	    (ret = check_u64(root, "crc_block", LAYOUT_CRC_BLOCK, r, err, errlen)))
		goto out;
	if (m->origin) {
		/* Only this attempt's indexes count; and never one an earlier
		 * life of this daemon wrote (it cannot be part of this one). */
		json_t *w = json_object_get(root, "writer");
		const char *wid = json_string_value(json_object_get(w, "id"));
		const char *inst = json_string_value(json_object_get(w, "instance"));

		if ((ret = check_str(root, "attempt", m->origin->attempt, r, err, errlen)) ||
		    (ret = check_str(root, "to", m->origin->to, r, err, errlen)))
			goto out;
		if (!wid || !inst) {
			ret = bad("rank %u: index names no writer", r);
			goto out;
		}
		if (!strcmp(wid, m->origin->writer_id) && strcmp(inst, m->origin->instance)) {
			ret = bad("rank %u: index was written by this daemon before a restart, "
				  "not by this attempt", r);
			goto out;
		}
	}
	if (!jread_u64(json_object_get(root, "file_size"), &p->file_size) ||
	    p->file_size > INT64_MAX) {
		ret = bad("rank %u: index has no integer 'file_size'", r);
		goto out;
	}
	if (!jread_u64(json_object_get(root, "step"), &p->step)) {
		ret = bad("rank %u: index has no integer 'step'", r);
		goto out;
	}
	if (!json_is_object(json_object_get(root, "meta")) ||
	    !json_is_object(json_object_get(root, "metrics"))) {
		ret = bad("rank %u: index meta or metrics is not an object", r);
		goto out;
	}
	items = json_object_get(root, "items");
	if (!json_is_array(items) || json_array_size(items) > CKPT_MAX_ITEMS) {
		ret = bad("rank %u: index items is not an array of at most %d", r, CKPT_MAX_ITEMS);
		goto out;
	}
	p->names = malloc(fsize + 1);
	if (!p->names) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < json_array_size(items); i++) {
		ret = add_chunk(p, r, i, json_array_get(items, i), err, errlen);
		if (ret)
			goto out;
	}
	if (r == 0) {
		p->meta = json_incref(json_object_get(root, "meta"));
		p->metrics = json_incref(json_object_get(root, "metrics"));
	}
out:
	json_decref(root);
	return ret;
}

/* Takes rank r's part from a layout the caller holds (validated when it was
 * parsed from the descriptor), instead of reading its index file back. */
static int load_local(struct merge *m, const struct index_local *lo, char *err, size_t errlen)
{
	const struct layout *l = lo->layout;
	struct part *p = &m->parts[lo->rank];

	(void)err;
	(void)errlen;
	p->file_size = l->file_size;
	p->step = l->step;
	p->cap_chunks = l->n_items ? l->n_items : 1;
	p->cap_dims = l->n_dims ? l->n_dims : 1;
	p->cap_crcs = l->n_crcs ? l->n_crcs : 1;
	p->chunks = malloc(p->cap_chunks * sizeof(*p->chunks));
	p->dims = malloc(p->cap_dims * sizeof(*p->dims));
	p->crcs = malloc(p->cap_crcs * sizeof(*p->crcs));
	if (!p->chunks || !p->dims || !p->crcs)
		return -ENOMEM;
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];

		p->chunks[i] = (struct chunk){
			.name = it->name, /* the layout outlives the merge */
			.kind = it->kind,
			.dtype = it->dtype,
			.ndim = it->ndim,
			.rank = lo->rank,
			.next = NONE,
			.dims = p->n_dims,
			.crc0 = it->crc0,
			.begin = it->begin,
			.end = it->end,
		};
		memcpy(p->dims + p->n_dims, l->dims + it->dims, 3u * it->ndim * sizeof(*p->dims));
		p->n_dims += 3u * it->ndim;
	}
	p->n_chunks = l->n_items;
	if (l->n_crcs)
		memcpy(p->crcs, lo->crcs, l->n_crcs * sizeof(*p->crcs));
	p->n_crcs = l->n_crcs;
	if (lo->rank == 0) {
		p->meta = json_incref((json_t *)l->meta);
		p->metrics = json_incref((json_t *)l->metrics);
	}
	return 0;
}

static const struct index_local *find_local(const struct merge *m, uint32_t r)
{
	for (size_t i = 0; i < m->n_local; i++)
		if (m->local[i].rank == r)
			return &m->local[i];
	return NULL;
}

static void *parse_worker(void *arg)
{
	struct merge *m = arg;
	uint32_t r;

	while ((r = atomic_fetch_add(&m->next_rank, 1)) < m->world) {
		struct part *p = &m->parts[r];
		const struct index_local *lo = find_local(m, r);

		p->ret = lo ? load_local(m, lo, p->err, sizeof(p->err)) :
			      load_part(m, r, p->err, sizeof(p->err));
	}
	return NULL;
}

/* Runs the parse phase on up to MERGE_MAX_THREADS threads (the caller's
 * included); a thread that cannot be started just leaves more work for
 * the others. */
static void parse_all(struct merge *m)
{
	pthread_t th[MERGE_MAX_THREADS];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned want = m->world, started = 0;

	if (ncpu > 0 && want > (unsigned long)ncpu)
		want = (unsigned)ncpu;
	if (want > MERGE_MAX_THREADS)
		want = MERGE_MAX_THREADS;
	atomic_store(&m->next_rank, 0);
	/* jansson seeds its hash function when the first object is made;
	 * make one here so that never happens in two threads at once. */
	json_decref(json_object());
	for (unsigned i = 1; i < want; i++)
		if (pthread_create(&th[started], NULL, parse_worker, m) == 0)
			started++;
	parse_worker(m);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}

/* Concatenates the parts' arrays, fixing up the indexes into them. */
static int gather(struct merge *m, char *err, size_t errlen)
{
	size_t n = 0, nd = 0, nc = 0;

	for (uint32_t r = 0; r < m->world; r++) {
		n += m->parts[r].n_chunks;
		nd += m->parts[r].n_dims;
		nc += m->parts[r].n_crcs;
	}
	if (n >= NONE)
		return bad("%zu items in the checkpoint are too many", n);
	m->chunks = malloc((n ? n : 1) * sizeof(*m->chunks));
	m->dims = malloc((nd ? nd : 1) * sizeof(*m->dims));
	m->crcs = malloc((nc ? nc : 1) * sizeof(*m->crcs));
	if (!m->chunks || !m->dims || !m->crcs)
		return -ENOMEM;
	n = nd = nc = 0;
	for (uint32_t r = 0; r < m->world; r++) {
		struct part *p = &m->parts[r];

		for (size_t i = 0; i < p->n_chunks; i++) {
			m->chunks[n + i] = p->chunks[i];
			m->chunks[n + i].dims += nd;
			m->chunks[n + i].crc0 += nc;
		}
		if (p->n_dims)
			memcpy(m->dims + nd, p->dims, p->n_dims * sizeof(*p->dims));
		if (p->n_crcs)
			memcpy(m->crcs + nc, p->crcs, p->n_crcs * sizeof(*p->crcs));
		n += p->n_chunks;
		nd += p->n_dims;
		nc += p->n_crcs;
		/* Only the names are still needed from the part. */
		free(p->chunks);
		free(p->dims);
		free(p->crcs);
		p->chunks = NULL;
		p->dims = NULL;
		p->crcs = NULL;
	}
	m->n_chunks = n;
	return 0;
}

/* Groups chunks by name into entries and checks that they agree. */
static int group(struct merge *m, char *err, size_t errlen)
{
	struct nameset set;
	char b1[128], b2[128];
	int ret = 0;

	m->entries = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof(*m->entries));
	if (!m->entries || nameset_init(&set, m->n_chunks))
		return -ENOMEM;
	for (size_t i = 0; i < m->n_chunks; i++) {
		struct chunk *c = &m->chunks[i], *f;
		int64_t e = nameset_put(&set, c->name, (uint32_t)m->n_entries);
		struct entry *en;

		if (e < 0) {
			m->entries[m->n_entries++] = (struct entry){ (uint32_t)i, (uint32_t)i, 1 };
			continue;
		}
		en = &m->entries[e];
		f = &m->chunks[en->first];
		if (f->kind != c->kind) {
			ret = bad("'%s' is a %s in rank %u and a %s in rank %u", c->name,
				  f->kind == ITEM_BLOB ? "blob" : "tensor", f->rank,
				  c->kind == ITEM_BLOB ? "blob" : "tensor", c->rank);
			break;
		}
		if (c->kind == ITEM_BLOB) {
			ret = bad("blob '%s' is saved by rank %u and by rank %u", c->name, f->rank,
				  c->rank);
			break;
		}
		if (f->dtype != c->dtype) {
			ret = bad("tensor '%s': rank %u says %s, rank %u says %s", c->name, c->rank,
				  ckpt_dtype_name((enum ckpt_dtype)c->dtype), f->rank,
				  ckpt_dtype_name((enum ckpt_dtype)f->dtype));
			break;
		}
		if (f->ndim != c->ndim ||
		    memcmp(m->dims + f->dims + f->ndim, m->dims + c->dims + c->ndim,
			   f->ndim * sizeof(uint64_t)) != 0) {
			ret = bad("tensor '%s': rank %u says global shape %s, rank %u says %s",
				  c->name, c->rank,
				  errmsg_dims(m->dims + c->dims + c->ndim, c->ndim, b1, sizeof(b1)),
				  f->rank,
				  errmsg_dims(m->dims + f->dims + f->ndim, f->ndim, b2, sizeof(b2)));
			break;
		}
		m->chunks[en->last].next = (uint32_t)i;
		en->last = (uint32_t)i;
		en->n_chunks++;
	}
	nameset_free(&set);
	return ret;
}

/*
 * Checks that a tensor's chunks tile its global shape: no two overlap and
 * their volumes add up to the whole (boxcheck.h, which manifest_parse also
 * asks, so that a manifest the merge writes is one readers accept).  tmp
 * holds the chunks' indexes in the order given to bc, to name their ranks.
 */
static int check_cover(struct merge *m, const struct entry *en, struct boxcheck *bc,
		       uint32_t *tmp, char *err, size_t errlen)
{
	const struct chunk *f = &m->chunks[en->first];
	const uint64_t *gshape = m->dims + f->dims + f->ndim;
	unsigned ndim = f->ndim;
	struct boxcheck_result res;
	size_t n = 0;
	char b1[128], b2[128];
	int ret;

	/* add_chunk refused a global volume past 2^64, in bytes even. */
	ret = boxcheck_start(bc, ndim, gshape);
	if (ret)
		return bad("tensor '%s': size overflows", f->name);
	for (uint32_t i = en->first; i != NONE; i = m->chunks[i].next) {
		const struct chunk *c = &m->chunks[i];

		ret = boxcheck_add(bc, m->dims + c->dims + 2u * ndim, m->dims + c->dims);
		if (ret)
			return ret;
		tmp[n++] = i;
	}
	switch (boxcheck_verdict(bc, &res)) {
	case BOXCHECK_OVERLAP: {
		const struct chunk *ca = &m->chunks[tmp[res.first]];
		const struct chunk *cb = &m->chunks[tmp[res.second]];

		return bad("tensor '%s': the chunk of rank %u at %s and the chunk of rank %u at %s overlap",
			   f->name, ca->rank,
			   errmsg_dims(m->dims + ca->dims + 2u * ndim, ndim, b1, sizeof(b1)),
			   cb->rank,
			   errmsg_dims(m->dims + cb->dims + 2u * ndim, ndim, b2, sizeof(b2)));
	}
	case BOXCHECK_HOLE:
		return bad("tensor '%s': chunks cover %llu of %llu elements", f->name,
			   (unsigned long long)res.covered, (unsigned long long)res.total);
	case BOXCHECK_TILES:
		break;
	}
	return 0;
}

static void emit_crcs(struct jbuf *b, const uint32_t *crcs, uint64_t begin, uint64_t end)
{
	uint32_t n = layout_crc_count(begin, end);

	jbuf_ch(b, '[');
	for (uint32_t k = 0; k < n; k++) {
		if (k)
			jbuf_ch(b, ',');
		jbuf_u64(b, crcs[k]);
	}
	jbuf_ch(b, ']');
}

/* `,"begin":B,"end":E,"crc32c":[...]` of a chunk: the byte range in its file
 * and the CRCs of its pieces, written alike for tensors and blobs. */
static void emit_range(struct jbuf *b, const struct merge *m, const struct chunk *c)
{
	jbuf_lit(b, ",\"begin\":");
	jbuf_u64(b, c->begin);
	jbuf_lit(b, ",\"end\":");
	jbuf_u64(b, c->end);
	jbuf_lit(b, ",\"crc32c\":");
	emit_crcs(b, m->crcs + c->crc0, c->begin, c->end);
}

static int emit(const struct merge *m, int64_t time_utc, char **ret_text, char *err,
		size_t errlen)
{
	const struct part *p0 = &m->parts[0];
	uint64_t total = 0;
	char tbuf[40] = "1970-01-01T00:00:00Z", file[INDEX_SHARD_NAME_MAX];
	time_t t = (time_t)time_utc;
	struct tm tm;
	struct jbuf b;
	bool first;

	for (uint32_t r = 0; r < m->world; r++)
		if (__builtin_add_overflow(total, m->parts[r].file_size, &total))
			return bad("the shard files' sizes add up past 2^64");
	if (gmtime_r(&t, &tm))
		strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%SZ", &tm);
	jbuf_init(&b, 1024 + m->n_chunks * 160 + m->world * 64, 0);
	jbuf_lit(&b, "{\"format\":\"" MANIFEST_FORMAT "\",\"name\":");
	jbuf_str(&b, m->name);
	jbuf_lit(&b, ",\"step\":");
	jbuf_u64(&b, p0->step);
	jbuf_lit(&b, ",\"time\":");
	jbuf_str(&b, tbuf);
	jbuf_lit(&b, ",\"job\":");
	jbuf_str(&b, m->job);
	if (m->origin) {
		jbuf_lit(&b, ",\"attempt\":");
		jbuf_str(&b, m->origin->attempt);
		if (m->origin->has_uid) {
			jbuf_lit(&b, ",\"uid\":");
			jbuf_u64(&b, m->origin->uid);
		}
	}
	jbuf_lit(&b, ",\"world_size\":");
	jbuf_u64(&b, m->world);
	jbuf_lit(&b, ",\"crc_block\":");
	jbuf_u64(&b, LAYOUT_CRC_BLOCK);
	jbuf_lit(&b, ",\"metadata\":");
	jbuf_json(&b, p0->meta);
	jbuf_lit(&b, ",\"metrics\":");
	jbuf_json(&b, p0->metrics);
	jbuf_lit(&b, ",\"files\":[");
	for (uint32_t r = 0; r < m->world; r++) {
		if (r)
			jbuf_ch(&b, ',');
		index_shard_name_tag(r, m->origin ? m->origin->shard_tag : NULL, file, sizeof(file));
		jbuf_lit(&b, "{\"rank\":");
		jbuf_u64(&b, r);
		jbuf_lit(&b, ",\"path\":");
		jbuf_str(&b, file);
		jbuf_lit(&b, ",\"size\":");
		jbuf_u64(&b, m->parts[r].file_size);
		jbuf_ch(&b, '}');
	}
	jbuf_lit(&b, "],\"total_bytes\":");
	jbuf_u64(&b, total);

	jbuf_lit(&b, ",\"tensors\":{");
	first = true;
	for (size_t e = 0; e < m->n_entries; e++) {
		const struct chunk *f = &m->chunks[m->entries[e].first];

		if (f->kind != ITEM_TENSOR)
			continue;
		if (!first)
			jbuf_ch(&b, ',');
		first = false;
		jbuf_str(&b, f->name);
		jbuf_lit(&b, ":{\"dtype\":");
		jbuf_str(&b, ckpt_dtype_name((enum ckpt_dtype)f->dtype));
		jbuf_lit(&b, ",\"shape\":");
		jbuf_u64_array(&b, m->dims + f->dims + f->ndim, f->ndim);
		jbuf_lit(&b, ",\"chunks\":[");
		for (uint32_t i = m->entries[e].first; i != NONE; i = m->chunks[i].next) {
			const struct chunk *c = &m->chunks[i];

			if (i != m->entries[e].first)
				jbuf_ch(&b, ',');
			jbuf_lit(&b, "{\"file\":");
			jbuf_u64(&b, c->rank);
			jbuf_lit(&b, ",\"offsets\":");
			jbuf_u64_array(&b, m->dims + c->dims + 2u * c->ndim, c->ndim);
			jbuf_lit(&b, ",\"shape\":");
			jbuf_u64_array(&b, m->dims + c->dims, c->ndim);
			emit_range(&b, m, c);
			jbuf_ch(&b, '}');
		}
		jbuf_lit(&b, "]}");
	}
	jbuf_lit(&b, "},\"blobs\":{");
	first = true;
	for (size_t e = 0; e < m->n_entries; e++) {
		const struct chunk *c = &m->chunks[m->entries[e].first];

		if (c->kind != ITEM_BLOB)
			continue;
		if (!first)
			jbuf_ch(&b, ',');
		first = false;
		jbuf_str(&b, c->name);
		jbuf_lit(&b, ":{\"size\":");
		jbuf_u64(&b, c->end - c->begin);
		jbuf_lit(&b, ",\"file\":");
		jbuf_u64(&b, c->rank);
		emit_range(&b, m, c);
		jbuf_ch(&b, '}');
	}
	jbuf_lit(&b, "}}");
	return jbuf_finish(&b, true, ret_text, NULL) ? -ENOMEM : 0;
}

int index_merge(int dirfd, const char *job, const char *name, uint32_t world, int64_t time_utc,
		const struct index_local *local, size_t n_local, char **ret_text, char *err,
		size_t errlen)
{
	return index_merge_origin(dirfd, job, name, world, time_utc, NULL, local, n_local,
				  ret_text, err, errlen);
}

int index_merge_origin(int dirfd, const char *job, const char *name, uint32_t world,
		       int64_t time_utc, const struct index_origin *origin,
		       const struct index_local *local, size_t n_local, char **ret_text,
		       char *err, size_t errlen)
{
	return index_merge_fetch(dirfd, NULL, NULL, job, name, world, time_utc, origin, local,
				 n_local, ret_text, err, errlen);
}

int index_merge_fetch(int dirfd, index_fetch_fn fetch, void *fetch_ud, const char *job,
		      const char *name, uint32_t world, int64_t time_utc,
		      const struct index_origin *origin, const struct index_local *local,
		      size_t n_local, char **ret_text, char *err, size_t errlen)
{
	struct merge m = { .dirfd = dirfd, .fetch = fetch, .fetch_ud = fetch_ud, .job = job,
			   .name = name, .world = world, .origin = origin, .local = local,
			   .n_local = n_local };
	struct boxcheck bc = BOXCHECK_INIT;
	uint32_t *tmp = NULL;
	int ret = 0;

	if (world == 0 || world > CKPT_MAX_WORLD)
		return bad("world size %u is not in [1, %d]", world, CKPT_MAX_WORLD);
	m.parts = calloc(world, sizeof(*m.parts));
	if (!m.parts)
		return -ENOMEM;
	parse_all(&m);
	for (uint32_t r = 0; r < world && !ret; r++) {
		const struct part *p = &m.parts[r];

		if (p->ret)
			ret = errmsg_set(err, errlen, p->ret, "%s", p->err);
		else if (p->step != m.parts[0].step)
			ret = bad("rank %u says step %llu, rank 0 says step %llu", r,
				  (unsigned long long)p->step, (unsigned long long)m.parts[0].step);
	}
	if (ret)
		goto out;
	ret = gather(&m, err, errlen);
	if (ret)
		goto out;
	ret = group(&m, err, errlen);
	if (ret)
		goto out;
	tmp = malloc((m.n_chunks ? m.n_chunks : 1) * sizeof(*tmp));
	if (!tmp) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t e = 0; e < m.n_entries; e++) {
		if (m.chunks[m.entries[e].first].kind != ITEM_TENSOR)
			continue;
		ret = check_cover(&m, &m.entries[e], &bc, tmp, err, errlen);
		if (ret)
			goto out;
	}
	ret = emit(&m, time_utc, ret_text, err, errlen);
out:
	boxcheck_free(&bc);
	free(tmp);
	for (uint32_t r = 0; r < world; r++) {
		struct part *p = &m.parts[r];

		json_decref(p->meta);
		json_decref(p->metrics);
		free(p->names);
		free(p->chunks);
		free(p->dims);
		free(p->crcs);
	}
	free(m.parts);
	free(m.chunks);
	free(m.dims);
	free(m.crcs);
	free(m.entries);
	return ret;
}
