/* SPDX-License-Identifier: MIT */
/* safetensors.h - the safetensors header of a shard file. */
#ifndef CKPT_FORMAT_SAFETENSORS_H
#define CKPT_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "format/layout.h"

/*
 * Builds the JSON header of the shard described by `l`: one entry per item
 * {"dtype", "shape" (the chunk's shape), "data_offsets" [begin - data_start,
 * end - data_start]}, in item order, plus "__metadata__" {"format": "pt",
 * "ckpt.rank": rank}.  Names are JSON-escaped.  No padding.
 *
 * Returns 0 and a malloc'd buffer *ret_json (not NUL-terminated; free()) of
 * *ret_len bytes, or -ENOMEM, -E2BIG (over LAYOUT_MAX_HEADER).
 */
int st_header_json(const struct layout *l, uint32_t rank, char **ret_json, size_t *ret_len);

/*
 * Writes the file prefix [0, l->data_start): the 8-byte length, the JSON and
 * space padding, into `out` (l->data_start bytes).  l must be placed.
 */
void st_header_write(const struct layout *l, const char *json, size_t json_len, void *out);

#endif
