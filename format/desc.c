/* SPDX-License-Identifier: MIT */
/* desc.c - the save descriptor: build (client) and validate (daemon). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "format/desc.h"
#include "format/dtype.h"
#include "format/errmsg.h"
#include "format/jbuf.h"
#include "format/names.h"
#include "format/nameset.h"

/* Reasons from helpers (name checks, layout_add) before they get a prefix. */
#define SUBERR_LEN 256

int desc_build(const struct layout *l, char **ret_text, size_t *ret_len)
{
	struct jbuf b;

	jbuf_init(&b, 512 + l->n_items * 128, DESC_MAX_BYTES);
	jbuf_lit(&b, "{\"v\":");
	jbuf_u64(&b, DESC_VERSION);
	jbuf_lit(&b, ",\"name\":");
	jbuf_str(&b, l->name);
	jbuf_lit(&b, ",\"root\":");
	jbuf_str(&b, l->root ? l->root : "");
	jbuf_lit(&b, ",\"step\":");
	jbuf_u64(&b, l->step);
	jbuf_lit(&b, ",\"file_size\":");
	jbuf_u64(&b, l->file_size);
	jbuf_lit(&b, ",\"data_start\":");
	jbuf_u64(&b, l->data_start);
	jbuf_lit(&b, ",\"meta\":");
	jbuf_json(&b, l->meta);
	jbuf_lit(&b, ",\"metrics\":");
	jbuf_json(&b, l->metrics);
	jbuf_lit(&b, ",\"items\":[");
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		const char *dn = ckpt_dtype_name(it->dtype);

		if (i)
			jbuf_ch(&b, ',');
		jbuf_ch(&b, '[');
		jbuf_str(&b, it->name);
		jbuf_ch(&b, ',');
		jbuf_u64(&b, it->kind);
		jbuf_lit(&b, ",\"");
		jbuf_mem(&b, dn, strlen(dn));
		jbuf_lit(&b, "\",");
		jbuf_u64_array(&b, layout_shape(l, it), it->ndim);
		if (it->sharded) {
			jbuf_ch(&b, ',');
			jbuf_u64_array(&b, layout_gshape(l, it), it->ndim);
			jbuf_ch(&b, ',');
			jbuf_u64_array(&b, layout_offs(l, it), it->ndim);
		} else {
			jbuf_lit(&b, ",null,null");
		}
		jbuf_ch(&b, ',');
		jbuf_u64(&b, it->begin);
		jbuf_ch(&b, ',');
		jbuf_u64(&b, it->end);
		jbuf_ch(&b, ']');
	}
	jbuf_lit(&b, "]}");
	return jbuf_finish(&b, false, ret_text, ret_len);
}

#define bad(err, errlen, ...) errmsg_set((err), (errlen), -EBADMSG, __VA_ARGS__)

/* "[2,3]" for messages; cut short if it does not fit. */
static const char *dims_str(const uint64_t *d, unsigned n, char *buf, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(buf, len, "[");
	for (unsigned i = 0; i < n && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? "," : "",
				      (unsigned long long)d[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}

/* A non-negative JSON integer (jansson keeps integers as int64: values past
 * INT64_MAX already fail to parse). */
static bool get_u64(const json_t *j, uint64_t *ret)
{
	json_int_t v;

	if (!json_is_integer(j))
		return false;
	v = json_integer_value(j);
	if (v < 0)
		return false;
	*ret = (uint64_t)v;
	return true;
}

/* An array of at most CKPT_MAX_NDIM non-negative integers. */
static bool get_dims(const json_t *j, uint64_t *out, size_t *ret_n)
{
	size_t n;

	if (!json_is_array(j))
		return false;
	n = json_array_size(j);
	if (n > CKPT_MAX_NDIM)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!get_u64(json_array_get(j, i), &out[i]))
			return false;
	*ret_n = n;
	return true;
}

static const char *const desc_fields[] = {
	"v", "name", "root", "step", "file_size", "data_start", "meta", "metrics", "items",
};

static int check_fields(json_t *root, char *err, size_t errlen)
{
	const size_t n = sizeof(desc_fields) / sizeof(desc_fields[0]);
	const char *key;
	json_t *val;
	char sb[ERRMSG_SAFE_LEN];

	json_object_foreach(root, key, val) {
		size_t i;

		for (i = 0; i < n; i++)
			if (strcmp(key, desc_fields[i]) == 0)
				break;
		if (i == n)
			return bad(err, errlen, "descriptor has an unknown field '%s'", errmsg_safe(key, sb));
	}
	for (size_t i = 0; i < n; i++)
		if (!json_object_get(root, desc_fields[i]))
			return bad(err, errlen, "descriptor lacks the field '%s'", desc_fields[i]);
	return 0;
}

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

/* Parses items[] into l (already initialised) and checks each item's range. */
static int parse_items(json_t *items, struct layout *l, char *err, size_t errlen)
{
	uint64_t shape[CKPT_MAX_NDIM], gshape[CKPT_MAX_NDIM], offs[CKPT_MAX_NDIM];
	uint64_t pos = l->data_start;
	char sub[SUBERR_LEN], db[128];
	size_t n = json_array_size(items);

	for (size_t i = 0; i < n; i++) {
		json_t *it = json_array_get(items, i), *jg, *jo;
		uint64_t kind, begin, end, nbytes;
		size_t nd, ngd, nod;
		const char *name;
		struct layout_item *li;
		int dtype, ret;

		if (!json_is_array(it) || json_array_size(it) != 8)
			return bad(err, errlen, "item %zu is not an array of 8 fields", i);
		name = json_string_value(json_array_get(it, 0));
		if (!name)
			return bad(err, errlen, "item %zu: the name is not a string", i);
		if (!name_item_ok(name, sub, sizeof(sub)))
			return bad(err, errlen, "item %zu: %s", i, sub);
		/* From here on the name is printable ASCII and safe to show. */
		if (!get_u64(json_array_get(it, 1), &kind) || kind > ITEM_BLOB)
			return bad(err, errlen, "item %zu ('%s'): bad kind", i, name);
		dtype = dtype_from_name(json_string_value(json_array_get(it, 2)));
		if (dtype < 0)
			return bad(err, errlen, "item %zu ('%s'): unknown dtype", i, name);
		if (!get_dims(json_array_get(it, 3), shape, &nd))
			return bad(err, errlen,
				   "item %zu ('%s'): shape is not an array of at most %d non-negative integers",
				   i, name, CKPT_MAX_NDIM);
		jg = json_array_get(it, 4);
		jo = json_array_get(it, 5);
		if (json_is_null(jg) != json_is_null(jo))
			return bad(err, errlen,
				   "item %zu ('%s'): global shape and offsets must both be null or both arrays",
				   i, name);
		if (!json_is_null(jg) &&
		    (!get_dims(jg, gshape, &ngd) || !get_dims(jo, offs, &nod) || ngd != nd ||
		     nod != nd))
			return bad(err, errlen,
				   "item %zu ('%s'): global shape and offsets must be arrays of %zu non-negative integers",
				   i, name, nd);
		if (!get_u64(json_array_get(it, 6), &begin) || !get_u64(json_array_get(it, 7), &end))
			return bad(err, errlen,
				   "item %zu ('%s'): begin and end must be non-negative integers", i,
				   name);

		ret = layout_add(l, (enum item_kind)kind, name, (enum ckpt_dtype)dtype,
				 (unsigned)nd, shape, json_is_null(jg) ? NULL : gshape,
				 json_is_null(jo) ? NULL : offs, sub, sizeof(sub));
		if (ret == -ENOMEM)
			return ret;
		if (ret < 0)
			return bad(err, errlen, "item %zu: %s", i, sub);
		li = &l->items[l->n_items - 1];
		li->begin = begin;
		li->end = end;
		nbytes = layout_item_bytes(l, li);

		if (begin != pos) {
			if (begin < l->data_start)
				return bad(err, errlen,
					   "item %zu ('%s'): begins at %llu, before data_start %llu", i,
					   name, (unsigned long long)begin,
					   (unsigned long long)l->data_start);
			return bad(err, errlen,
				   "item %zu ('%s'): begins at %llu but the previous item ends at %llu (%s)",
				   i, name, (unsigned long long)begin, (unsigned long long)pos,
				   begin < pos ? "overlap" : "gap");
		}
		if (end < begin)
			return bad(err, errlen, "item %zu ('%s'): ends at %llu, before it begins at %llu",
				   i, name, (unsigned long long)end, (unsigned long long)begin);
		if (end - begin != nbytes)
			return bad(err, errlen, "item %zu ('%s'): shape %s %s is %llu bytes but the range holds %llu",
				   i, name, dims_str(shape, (unsigned)nd, db, sizeof(db)),
				   ckpt_dtype_name((enum ckpt_dtype)dtype),
				   (unsigned long long)nbytes, (unsigned long long)(end - begin));
		pos = end;
	}
	if (pos != l->file_size)
		return bad(err, errlen, "items end at %llu but file_size is %llu",
			   (unsigned long long)pos, (unsigned long long)l->file_size);
	return 0;
}

static int check_unique(const struct layout *l, char *err, size_t errlen)
{
	struct nameset set;
	int ret = 0;

	if (nameset_init(&set, l->n_items))
		return -ENOMEM;
	for (size_t i = 0; i < l->n_items; i++) {
		int64_t prev = nameset_put(&set, l->items[i].name, (uint32_t)i);

		if (prev >= 0) {
			ret = bad(err, errlen, "item %zu ('%s'): name already used by item %lld", i,
				  l->items[i].name, (long long)prev);
			break;
		}
	}
	nameset_free(&set);
	return ret;
}

int desc_parse(const char *text, size_t len, struct layout *l, char *err, size_t errlen)
{
	char sub[SUBERR_LEN];
	json_error_t jerr;
	json_t *root, *items;
	const char *name, *rootdir;
	uint64_t step, file_size, data_start;
	json_t *meta = NULL, *metrics = NULL;
	int ret;

	if (len > DESC_MAX_BYTES)
		return bad(err, errlen, "descriptor is %zu bytes (at most %u)", len, DESC_MAX_BYTES);
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		/* jansson may quote the peer's bytes in its message. */
		for (char *p = jerr.text; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
		return bad(err, errlen, "descriptor is not valid JSON: %s (line %d, column %d)",
			   jerr.text, jerr.line, jerr.column);
	}
	if (!json_is_object(root)) {
		ret = bad(err, errlen, "descriptor is not a JSON object");
		goto out_root;
	}
	ret = check_fields(root, err, errlen);
	if (ret)
		goto out_root;
	if (!json_is_integer(json_object_get(root, "v")) ||
	    json_integer_value(json_object_get(root, "v")) != DESC_VERSION) {
		ret = bad(err, errlen, "descriptor version is not %d", DESC_VERSION);
		goto out_root;
	}
	name = json_string_value(json_object_get(root, "name"));
	rootdir = json_string_value(json_object_get(root, "root"));
	if (!name || !name_checkpoint_ok(name, sub, sizeof(sub)) || !rootdir ||
	    !name_root_ok(rootdir, sub, sizeof(sub))) {
		ret = bad(err, errlen, "descriptor: %s",
			  name && rootdir ? sub : "name and root must be strings");
		goto out_root;
	}
	if (!get_u64(json_object_get(root, "step"), &step) ||
	    !get_u64(json_object_get(root, "file_size"), &file_size) ||
	    !get_u64(json_object_get(root, "data_start"), &data_start)) {
		ret = bad(err, errlen, "descriptor: step, file_size and data_start must be non-negative integers");
		goto out_root;
	}
	if (data_start % LAYOUT_ALIGN || data_start < 8 ||
	    data_start > (uint64_t)LAYOUT_MAX_HEADER + LAYOUT_ALIGN) {
		ret = bad(err, errlen, "descriptor: data_start %llu is not a multiple of %u in [%u, %u]",
			  (unsigned long long)data_start, LAYOUT_ALIGN, LAYOUT_ALIGN,
			  LAYOUT_MAX_HEADER + LAYOUT_ALIGN);
		goto out_root;
	}
	items = json_object_get(root, "items");
	if (!json_is_array(items) || json_array_size(items) > CKPT_MAX_ITEMS) {
		ret = bad(err, errlen, "descriptor items is not an array of at most %d entries",
			  CKPT_MAX_ITEMS);
		goto out_root;
	}
	ret = check_dict(json_object_get(root, "meta"), false, &meta, err, errlen);
	if (ret)
		goto out_root;
	ret = check_dict(json_object_get(root, "metrics"), true, &metrics, err, errlen);
	if (ret)
		goto out_meta;

	ret = layout_init(l, rootdir, name, step);
	if (ret)
		goto out_metrics;
	json_decref(l->meta);
	json_decref(l->metrics);
	l->meta = meta;
	l->metrics = metrics;
	meta = metrics = NULL;
	l->data_start = data_start;
	l->file_size = file_size;

	ret = parse_items(items, l, err, errlen);
	if (ret)
		goto out_layout;
	ret = check_unique(l, err, errlen);
	if (ret)
		goto out_layout;
	/* A header of data_start - LAYOUT_ALIGN bytes (+ 8, rounded up) places
	 * data at data_start again: this keeps every range and sets crc0 and
	 * n_crcs. */
	if (layout_place(l, data_start - LAYOUT_ALIGN)) {
		ret = bad(err, errlen, "descriptor: %llu bytes need more than 2^32 CRC pieces",
			  (unsigned long long)file_size);
		goto out_layout;
	}
	json_decref(root);
	return 0;

out_layout:
	layout_free(l);
out_metrics:
	json_decref(metrics);
out_meta:
	json_decref(meta);
out_root:
	json_decref(root);
	return ret;
}
