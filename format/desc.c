/* SPDX-License-Identifier: MIT */
/*
 * desc.c - the save descriptor: build (client) and validate (daemon).
 *
 * The encoding is described in desc.h.  The parser reads every field with
 * memcpy (the buffer has no alignment guarantee), checks each count, offset
 * and length against the bytes that are really there before it reads what
 * they point at, and does its sums in 64 bits from 32-bit fields so nothing
 * can wrap.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/desc.h"
#include "format/errmsg.h"
#include "format/jbuf.h"
#include "format/names.h"
#include "format/nameset.h"

/* Reasons from helpers (name checks, layout_add) before they get a prefix. */
#define SUBERR_LEN 256

#define DESC_MAGIC "CKDS"
#define DESC_FLAG_SHARDED 0x01u

/*
 * More than any valid meta section can take: per object CKPT_MAX_META_KEYS
 * keys and values of at most CKPT_MAX_ITEM_NAME and CKPT_MAX_META_LEN bytes,
 * each byte at most 6 once escaped ("\u001f"), plus room for quotes,
 * punctuation and a number.  Keeps jansson's work (which allocates per
 * value) small whatever the peer sends.
 */
#define META_MAX_BYTES \
	(2u * CKPT_MAX_META_KEYS * (6u * (CKPT_MAX_ITEM_NAME + CKPT_MAX_META_LEN) + 64u) + 64u)

/* The fixed header, as it lies at offset 0 (see desc.h). */
struct desc_hdr {
	char magic[4];
	uint32_t version;
	uint64_t total_len;
	uint64_t step;
	uint64_t file_size;
	uint64_t data_start;
	uint32_t n_items;
	uint32_t n_dims;
	uint32_t strings_len;
	uint32_t meta_len;
	uint32_t name_len;
	uint32_t root_len;
};

/* One record of the item table. */
struct desc_rec {
	uint32_t name_off;
	uint32_t name_len;
	uint8_t kind;
	uint8_t dtype;
	uint8_t ndim;
	uint8_t flags;
	uint32_t dims;
	uint64_t begin;
	uint64_t end;
};

/* The wire layout is these structs' memory image: no padding anywhere. */
_Static_assert(sizeof(struct desc_hdr) == 64, "descriptor header is 64 bytes");
_Static_assert(offsetof(struct desc_hdr, step) == 16 && offsetof(struct desc_hdr, n_items) == 40 &&
		       offsetof(struct desc_hdr, root_len) == 60,
	       "descriptor header fields where desc.h says");
_Static_assert(sizeof(struct desc_rec) == 32, "descriptor item record is 32 bytes");
_Static_assert(offsetof(struct desc_rec, kind) == 8 && offsetof(struct desc_rec, dims) == 12 &&
		       offsetof(struct desc_rec, begin) == 16,
	       "descriptor item fields where desc.h says");

/* u64 entries an item has in the dims array. */
static uint32_t wire_dims(unsigned ndim, bool sharded)
{
	return sharded ? 3u * ndim : ndim;
}

int desc_build(const struct layout *l, char **ret_text, size_t *ret_len)
{
	const char *root = l->root ? l->root : "";
	struct desc_hdr h;
	struct jbuf mb;
	char *meta, *out, *dims, *pool;
	size_t meta_len, name_len = strlen(l->name), root_len = strlen(root);
	uint64_t n_dims = 0, strings = (uint64_t)name_len + root_len, total;
	uint32_t dpos = 0, spos;
	int ret;

	/* Layouts come from layout_add, which caps the item count, name
	 * lengths and ndim; with those caps no sum below can wrap. */
	if (l->n_items > CKPT_MAX_ITEMS || root_len > PATH_MAX)
		return -E2BIG;
	for (size_t i = 0; i < l->n_items; i++) {
		n_dims += wire_dims(l->items[i].ndim, l->items[i].sharded);
		strings += strlen(l->items[i].name);
	}

	jbuf_init(&mb, 64, DESC_MAX_BYTES);
	jbuf_lit(&mb, "{\"meta\":");
	jbuf_json(&mb, l->meta);
	jbuf_lit(&mb, ",\"metrics\":");
	jbuf_json(&mb, l->metrics);
	jbuf_ch(&mb, '}');
	ret = jbuf_finish(&mb, false, &meta, &meta_len);
	if (ret)
		return ret;

	total = sizeof(h) + (uint64_t)l->n_items * sizeof(struct desc_rec) + n_dims * 8 + strings +
		meta_len;
	if (total > DESC_MAX_BYTES) {
		ret = -E2BIG;
		goto out_meta;
	}
	out = malloc(total);
	if (!out) {
		ret = -ENOMEM;
		goto out_meta;
	}

	memcpy(h.magic, DESC_MAGIC, sizeof(h.magic));
	h.version = DESC_VERSION;
	h.total_len = total;
	h.step = l->step;
	h.file_size = l->file_size;
	h.data_start = l->data_start;
	h.n_items = (uint32_t)l->n_items;
	h.n_dims = (uint32_t)n_dims;
	h.strings_len = (uint32_t)strings;
	h.meta_len = (uint32_t)meta_len;
	h.name_len = (uint32_t)name_len;
	h.root_len = (uint32_t)root_len;
	memcpy(out, &h, sizeof(h));

	dims = out + sizeof(h) + l->n_items * sizeof(struct desc_rec);
	pool = dims + n_dims * sizeof(uint64_t);
	memcpy(pool, l->name, name_len);
	memcpy(pool + name_len, root, root_len);
	spos = (uint32_t)(name_len + root_len);
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		size_t nl = strlen(it->name);
		uint32_t nd = wire_dims(it->ndim, it->sharded);
		struct desc_rec r = {
			.name_off = spos,
			.name_len = (uint32_t)nl,
			.kind = it->kind,
			.dtype = it->dtype,
			.ndim = it->ndim,
			.flags = it->sharded ? DESC_FLAG_SHARDED : 0,
			.dims = dpos,
			.begin = it->begin,
			.end = it->end,
		};

		memcpy(out + sizeof(h) + i * sizeof(r), &r, sizeof(r));
		/* The layout keeps shape, gshape, offs in a row: the first nd
		 * entries are exactly what goes on the wire.  (A layout of
		 * scalars only has no dims array: nothing to copy.) */
		if (nd)
			memcpy(dims + (size_t)dpos * sizeof(uint64_t), layout_shape(l, it),
			       nd * sizeof(uint64_t));
		dpos += nd;
		memcpy(pool + spos, it->name, nl);
		spos += (uint32_t)nl;
	}
	memcpy(pool + strings, meta, meta_len);
	*ret_text = out;
	*ret_len = total;
	ret = 0;
out_meta:
	free(meta);
	return ret;
}

#define bad(err, errlen, ...) errmsg_set((err), (errlen), -EBADMSG, __VA_ARGS__)

/* "[2,3]" for messages; cut short if it does not fit. */
/* Validates meta (string values) or metrics (finite numbers) and returns a
 * reference to keep: meta as it is, metrics rebuilt with every value a
 * real, so integers written by a peer compare equal to what we build. */
static int check_dict(json_t *obj, bool metrics, json_t **ret, char *err, size_t errlen)
{
	const char *what = metrics ? "metrics" : "meta";
	char sub[SUBERR_LEN];
	json_t *out = NULL, *val;
	const char *key;

	if (!json_is_object(obj))
		return bad(err, errlen, "descriptor %s is not an object", what);
	if (json_object_size(obj) > CKPT_MAX_META_KEYS)
		return bad(err, errlen, "descriptor %s has %zu keys (at most %d)", what,
			   json_object_size(obj), CKPT_MAX_META_KEYS);
	if (metrics) {
		out = json_object();
		if (!out)
			return -ENOMEM;
	}
	json_object_foreach(obj, key, val) {
		if (!name_item_ok(key, sub, sizeof(sub))) {
			json_decref(out);
			return bad(err, errlen, "descriptor %s key: %s", what, sub);
		}
		if (!metrics) {
			if (!json_is_string(val) || json_string_length(val) > CKPT_MAX_META_LEN)
				return bad(err, errlen,
					   "meta '%s' is not a string of at most %d bytes", key,
					   CKPT_MAX_META_LEN);
			continue;
		}
		if (!json_is_number(val) || !isfinite(json_number_value(val))) {
			json_decref(out);
			return bad(err, errlen, "metric '%s' is not a finite number", key);
		}
		if (json_object_set_new(out, key, json_real(json_number_value(val)))) {
			json_decref(out);
			return -ENOMEM;
		}
	}
	*ret = metrics ? out : json_incref(obj);
	return 0;
}

/*
 * The trailing JSON section: exactly {"meta":{...},"metrics":{...}}.  On
 * success *ret_meta and *ret_metrics hold one reference each.
 */
static int parse_meta(const char *text, size_t len, json_t **ret_meta, json_t **ret_metrics,
		      char *err, size_t errlen)
{
	json_t *root, *meta = NULL, *metrics = NULL;
	json_error_t jerr;
	int ret;

	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		/* jansson may quote the peer's bytes in its message. */
		for (char *p = jerr.text; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
		return bad(err, errlen, "descriptor meta section is not valid JSON: %s (at byte %d)",
			   jerr.text, jerr.position);
	}
	if (!json_is_object(root) || json_object_size(root) != 2 ||
	    !json_object_get(root, "meta") || !json_object_get(root, "metrics")) {
		ret = bad(err, errlen,
			  "descriptor meta section is not an object of exactly \"meta\" and \"metrics\"");
		goto out;
	}
	ret = check_dict(json_object_get(root, "meta"), false, &meta, err, errlen);
	if (ret)
		goto out;
	ret = check_dict(json_object_get(root, "metrics"), true, &metrics, err, errlen);
	if (ret) {
		json_decref(meta);
		goto out;
	}
	*ret_meta = meta;
	*ret_metrics = metrics;
out:
	json_decref(root);
	return ret;
}

/*
 * Checks the header's section sizes against len: every section lies inside
 * the buffer and they fill it exactly.  The sizes come from 32-bit fields,
 * so their 64-bit sum cannot wrap.
 */
static int check_sections(const struct desc_hdr *h, size_t len, char *err, size_t errlen)
{
	uint64_t at = sizeof(*h), n;

	n = (uint64_t)h->n_items * sizeof(struct desc_rec);
	if (n > len - at)
		return bad(err, errlen,
			   "descriptor item table (%u items, %llu bytes) runs past its end (%zu bytes)",
			   h->n_items, (unsigned long long)n, len);
	at += n;
	n = (uint64_t)h->n_dims * sizeof(uint64_t);
	if (n > len - at)
		return bad(err, errlen,
			   "descriptor dims array (%u entries) runs past its end (%zu bytes)",
			   h->n_dims, len);
	at += n;
	if (h->strings_len > len - at)
		return bad(err, errlen,
			   "descriptor string pool (%u bytes) runs past its end (%zu bytes)",
			   h->strings_len, len);
	at += h->strings_len;
	if (h->meta_len > len - at)
		return bad(err, errlen,
			   "descriptor meta section (%u bytes) runs past its end (%zu bytes)",
			   h->meta_len, len);
	at += h->meta_len;
	if (at != len)
		return bad(err, errlen, "descriptor has %llu trailing bytes after its meta section",
			   (unsigned long long)(len - at));
	return 0;
}

/*
 * A string of the pool as a C string in buf (max + 1 bytes).  Refused, with
 * a reason in err, if it is longer than max or holds a NUL byte (the names
 * rules would never see what follows one).  The caller checked the bounds.
 */
static bool pool_str(const char *s, uint32_t n, size_t max, char *buf, const char *what,
		     char *err, size_t errlen)
{
	const char *nul;

	if (n > max) {
		errmsg_set(err, errlen, 0, "%s is %u bytes (at most %zu)", what, n, max);
		return false;
	}
	nul = memchr(s, '\0', n);
	if (nul) {
		errmsg_set(err, errlen, 0, "%s holds a NUL byte at %zu", what, (size_t)(nul - s));
		return false;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	return true;
}

/* Header checks that need no allocation: magic, version, length, sections,
 * names, data_start. */
static int check_header(const char *text, size_t len, struct desc_hdr *h, char *name,
			char *root, char *err, size_t errlen)
{
	char sub[SUBERR_LEN];
	const char *pool;
	int ret;

	if (len > DESC_MAX_BYTES)
		return bad(err, errlen, "descriptor is %zu bytes (at most %u)", len, DESC_MAX_BYTES);
	if (len < sizeof(*h))
		return bad(err, errlen, "descriptor is %zu bytes, shorter than its %zu-byte header",
			   len, sizeof(*h));
	memcpy(h, text, sizeof(*h));
	if (memcmp(h->magic, DESC_MAGIC, 4) != 0)
		return bad(err, errlen,
			   "descriptor does not start with the magic \"" DESC_MAGIC
			   "\" (a client of another version?)");
	if (h->version != DESC_VERSION)
		return bad(err, errlen, "descriptor version is %u, not %d", h->version,
			   DESC_VERSION);
	if (h->total_len != len)
		return bad(err, errlen, "descriptor says it is %llu bytes but %zu arrived",
			   (unsigned long long)h->total_len, len);
	if (h->n_items > CKPT_MAX_ITEMS)
		return bad(err, errlen, "descriptor has %u items (at most %d)", h->n_items,
			   CKPT_MAX_ITEMS);
	ret = check_sections(h, len, err, errlen);
	if (ret)
		return ret;
	if (h->meta_len > META_MAX_BYTES)
		return bad(err, errlen, "descriptor meta section is %u bytes (at most %u)",
			   h->meta_len, META_MAX_BYTES);

	pool = text + (len - h->meta_len - h->strings_len);
	if (h->name_len > h->strings_len || h->root_len > h->strings_len - h->name_len)
		return bad(err, errlen,
			   "descriptor checkpoint name and root (%u + %u bytes) run past the string pool (%u bytes)",
			   h->name_len, h->root_len, h->strings_len);
	if (!pool_str(pool, h->name_len, CKPT_MAX_NAME_LEN, name, "checkpoint name", sub,
		      sizeof(sub)) ||
	    !name_checkpoint_ok(name, sub, sizeof(sub)) ||
	    !pool_str(pool + h->name_len, h->root_len, PATH_MAX - 256, root, "root directory", sub,
		      sizeof(sub)) ||
	    !name_root_ok(root, sub, sizeof(sub)))
		return bad(err, errlen, "descriptor: %s", sub);

	if (h->data_start % LAYOUT_ALIGN || h->data_start < 8 ||
	    h->data_start > (uint64_t)LAYOUT_MAX_HEADER + LAYOUT_ALIGN)
		return bad(err, errlen, "descriptor: data_start %llu is not a multiple of %u in [%u, %u]",
			   (unsigned long long)h->data_start, LAYOUT_ALIGN, LAYOUT_ALIGN,
			   LAYOUT_MAX_HEADER + LAYOUT_ALIGN);
	return 0;
}

/*
 * Sizes the layout's arrays for the item table up front, so layout_add
 * never reallocates: n_items records and 3 * ndim dims each (ndim capped
 * at CKPT_MAX_NDIM here; larger ones are refused later).  A valid
 * descriptor sends at least ndim entries per item, so the layout never
 * needs more than 3 * wire_dims: with n_items, that bounds what a peer can
 * make us allocate by a small multiple of the bytes it really sent.
 */
static int reserve(struct layout *l, const char *recs, uint32_t n_items, uint32_t wire_n_dims)
{
	size_t n_dims = 0;

	if (n_items == 0)
		return 0;
	for (uint32_t i = 0; i < n_items; i++) {
		uint8_t nd;

		memcpy(&nd, recs + (size_t)i * sizeof(struct desc_rec) +
				    offsetof(struct desc_rec, ndim), 1);
		n_dims += 3u * (nd > CKPT_MAX_NDIM ? CKPT_MAX_NDIM : nd);
	}
	if (n_dims > 3 * (size_t)wire_n_dims)
		n_dims = 3 * (size_t)wire_n_dims;
	l->items = malloc((size_t)n_items * sizeof(*l->items));
	if (!l->items)
		return -ENOMEM;
	l->cap_items = n_items;
	if (n_dims) {
		l->dims = malloc(n_dims * sizeof(*l->dims));
		if (!l->dims)
			return -ENOMEM;
		l->cap_dims = n_dims;
	}
	return 0;
}

/* Reads the item table into l (initialised, arrays reserved) and checks
 * each item: names, fields, dims, byte range, uniqueness. */
static int parse_items(const char *text, const struct desc_hdr *h, struct layout *l, char *err,
		       size_t errlen)
{
	uint64_t shape[CKPT_MAX_NDIM], gshape[CKPT_MAX_NDIM], offs[CKPT_MAX_NDIM];
	const char *recs = text + sizeof(*h);
	const char *dims = recs + (size_t)h->n_items * sizeof(struct desc_rec);
	const char *pool = dims + (size_t)h->n_dims * sizeof(uint64_t);
	uint64_t pos = h->data_start;
	uint32_t spos = h->name_len + h->root_len, dpos = 0;
	char name[CKPT_MAX_ITEM_NAME + 1], sub[SUBERR_LEN], db[128], sb[ERRMSG_SAFE_LEN];
	struct nameset set;
	int ret;

	if (nameset_init(&set, h->n_items))
		return -ENOMEM;
	for (uint32_t i = 0; i < h->n_items; i++) {
		struct desc_rec r;
		struct layout_item *li;
		bool sharded;
		uint32_t nd;
		uint64_t nbytes;
		int64_t prev;

		memcpy(&r, recs + (size_t)i * sizeof(r), sizeof(r));
		/* Names lie back to back in item order, so each offset is known;
		 * insisting on it leaves no byte of the pool unaccounted for. */
		if (r.name_off != spos) {
			ret = bad(err, errlen, "item %u: name at pool offset %u, expected %u", i,
				  r.name_off, spos);
			goto out;
		}
		if (r.name_len > h->strings_len - spos) {
			ret = bad(err, errlen,
				  "item %u: name of %u bytes at %u runs past the string pool (%u bytes)",
				  i, r.name_len, spos, h->strings_len);
			goto out;
		}
		if (!pool_str(pool + spos, r.name_len, CKPT_MAX_ITEM_NAME, name, "item name", sub,
			      sizeof(sub))) {
			ret = bad(err, errlen, "item %u: %s", i, sub);
			goto out;
		}
		spos += r.name_len;
		/* layout_add checks the name (names.h) below; until then it is
		 * shown through errmsg_safe. */
		if (r.kind > ITEM_BLOB) {
			ret = bad(err, errlen, "item %u ('%s'): bad kind %u", i,
				  errmsg_safe(name, sb), r.kind);
			goto out;
		}
		if (r.dtype >= CKPT_DTYPE_COUNT) {
			ret = bad(err, errlen, "item %u ('%s'): unknown dtype %u", i,
				  errmsg_safe(name, sb), r.dtype);
			goto out;
		}
		if (r.ndim > CKPT_MAX_NDIM) {
			ret = bad(err, errlen, "item %u ('%s'): %u dimensions (at most %d)", i,
				  errmsg_safe(name, sb), r.ndim, CKPT_MAX_NDIM);
			goto out;
		}
		if (r.flags & ~DESC_FLAG_SHARDED) {
			ret = bad(err, errlen, "item %u ('%s'): unknown flags 0x%02x", i,
				  errmsg_safe(name, sb), r.flags);
			goto out;
		}
		sharded = r.flags & DESC_FLAG_SHARDED;
		nd = wire_dims(r.ndim, sharded);
		if (r.dims != dpos) {
			ret = bad(err, errlen, "item %u ('%s'): dims at index %u, expected %u", i,
				  errmsg_safe(name, sb), r.dims, dpos);
			goto out;
		}
		if (nd > h->n_dims - dpos) {
			ret = bad(err, errlen,
				  "item %u ('%s'): %u dims at index %u run past the dims array (%u entries)",
				  i, errmsg_safe(name, sb), nd, dpos, h->n_dims);
			goto out;
		}
		memcpy(shape, dims + (size_t)dpos * 8, r.ndim * sizeof(uint64_t));
		if (sharded) {
			memcpy(gshape, dims + ((size_t)dpos + r.ndim) * 8, r.ndim * sizeof(uint64_t));
			memcpy(offs, dims + ((size_t)dpos + 2u * r.ndim) * 8,
			       r.ndim * sizeof(uint64_t));
		}
		dpos += nd;

		/* layout_add applies the rules every layout follows: offs +
		 * shape <= gshape, sizes without overflow, blobs 1-D U8. */
		ret = layout_add(l, (enum item_kind)r.kind, name, (enum ckpt_dtype)r.dtype, r.ndim,
				 shape, sharded ? gshape : NULL, sharded ? offs : NULL, sub,
				 sizeof(sub));
		if (ret == -ENOMEM)
			goto out;
		if (ret < 0) {
			ret = bad(err, errlen, "item %u: %s", i, sub);
			goto out;
		}
		/* From here on the name is printable ASCII and safe to show. */
		li = &l->items[l->n_items - 1];
		/* One encoding per layout: a whole tensor is never flagged. */
		if (sharded && !li->sharded) {
			ret = bad(err, errlen,
				  "item %u ('%s'): flagged sharded but its global shape is its shape at offset 0",
				  i, name);
			goto out;
		}
		prev = nameset_put(&set, li->name, i);
		if (prev >= 0) {
			ret = bad(err, errlen, "item %u ('%s'): name already used by item %lld", i,
				  name, (long long)prev);
			goto out;
		}
		li->begin = r.begin;
		li->end = r.end;
		nbytes = layout_item_bytes(l, li);

		if (r.begin != pos) {
			if (r.begin < h->data_start)
				ret = bad(err, errlen,
					  "item %u ('%s'): begins at %llu, before data_start %llu", i,
					  name, (unsigned long long)r.begin,
					  (unsigned long long)h->data_start);
			else
				ret = bad(err, errlen,
					  "item %u ('%s'): begins at %llu but the previous item ends at %llu (%s)",
					  i, name, (unsigned long long)r.begin, (unsigned long long)pos,
					  r.begin < pos ? "overlap" : "gap");
			goto out;
		}
		if (r.end < r.begin) {
			ret = bad(err, errlen, "item %u ('%s'): ends at %llu, before it begins at %llu",
				  i, name, (unsigned long long)r.end, (unsigned long long)r.begin);
			goto out;
		}
		if (r.end - r.begin != nbytes) {
			ret = bad(err, errlen,
				  "item %u ('%s'): shape %s %s is %llu bytes but the range holds %llu",
				  i, name, errmsg_dims(shape, r.ndim, db, sizeof(db)),
				  ckpt_dtype_name((enum ckpt_dtype)r.dtype), (unsigned long long)nbytes,
				  (unsigned long long)(r.end - r.begin));
			goto out;
		}
		pos = r.end;
	}
	if (dpos != h->n_dims) {
		ret = bad(err, errlen, "descriptor dims array has %u entries but the items use %u",
			  h->n_dims, dpos);
		goto out;
	}
	if (spos != h->strings_len) {
		ret = bad(err, errlen, "descriptor string pool has %u bytes but the names use %u",
			  h->strings_len, spos);
		goto out;
	}
	if (pos != h->file_size) {
		ret = bad(err, errlen, "items end at %llu but file_size is %llu",
			  (unsigned long long)pos, (unsigned long long)h->file_size);
		goto out;
	}
	ret = 0;
out:
	nameset_free(&set);
	return ret;
}

int desc_parse(const char *text, size_t len, struct layout *l, char *err, size_t errlen)
{
	char name[CKPT_MAX_NAME_LEN + 1], root[PATH_MAX + 1];
	json_t *meta = NULL, *metrics = NULL;
	struct desc_hdr h;
	int ret;

	ret = check_header(text, len, &h, name, root, err, errlen);
	if (ret)
		return ret;
	ret = parse_meta(text + len - h.meta_len, h.meta_len, &meta, &metrics, err, errlen);
	if (ret)
		return ret;

	ret = layout_init(l, root, name, h.step);
	if (ret) {
		json_decref(meta);
		json_decref(metrics);
		return ret;
	}
	json_decref(l->meta);
	json_decref(l->metrics);
	l->meta = meta;
	l->metrics = metrics;
	l->data_start = h.data_start;
	l->file_size = h.file_size;

	ret = reserve(l, text + sizeof(h), h.n_items, h.n_dims);
	if (ret)
		goto out_layout;
	ret = parse_items(text, &h, l, err, errlen);
	if (ret)
		goto out_layout;
	/* A header of data_start - LAYOUT_ALIGN bytes (+ 8, rounded up) places
	 * data at data_start again: this keeps every range and sets crc0 and
	 * n_crcs. */
	if (layout_place(l, h.data_start - LAYOUT_ALIGN)) {
		ret = bad(err, errlen, "descriptor: %llu bytes need more than 2^32 CRC pieces",
			  (unsigned long long)h.file_size);
		goto out_layout;
	}
	return 0;

out_layout:
	layout_free(l);
	return ret;
}
