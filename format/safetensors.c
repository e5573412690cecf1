/* SPDX-License-Identifier: MIT */
/* safetensors.c - the JSON header of a shard file (see safetensors.h). */
#include <errno.h>
#include <string.h>

#include "format/jbuf.h"
#include "format/safetensors.h"

int st_header_json(const struct layout *l, uint32_t rank, char **ret_json, size_t *ret_len)
{
	struct jbuf b;

	/* ~100 bytes an entry is typical; a good first guess saves reallocs. */
	jbuf_init(&b, 128 + l->n_items * 112, LAYOUT_MAX_HEADER);
	jbuf_ch(&b, '{');
	for (size_t i = 0; i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		const char *dn = ckpt_dtype_name(it->dtype);

		jbuf_str(&b, it->name);
		jbuf_lit(&b, ":{\"dtype\":\"");
		jbuf_mem(&b, dn, strlen(dn));
		jbuf_lit(&b, "\",\"shape\":");
		jbuf_u64_array(&b, layout_shape(l, it), it->ndim);
		jbuf_lit(&b, ",\"data_offsets\":[");
		jbuf_u64(&b, it->begin - l->data_start);
		jbuf_ch(&b, ',');
		jbuf_u64(&b, it->end - l->data_start);
		jbuf_lit(&b, "]},");
	}
	jbuf_lit(&b, "\"__metadata__\":{\"format\":\"pt\",\"ckpt.rank\":\"");
	jbuf_u64(&b, rank);
	jbuf_lit(&b, "\"}}");
	return jbuf_finish(&b, false, ret_json, ret_len);
}

void st_header_write(const struct layout *l, const char *json, size_t json_len, void *out)
{
	unsigned char *p = out;
	uint64_t n = l->data_start - 8;

	/* The length is little-endian whatever the host. */
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(n >> (8 * i));
	memcpy(p + 8, json, json_len);
	memset(p + 8 + json_len, ' ', l->data_start - 8 - json_len);
}
