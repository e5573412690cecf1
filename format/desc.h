/* SPDX-License-Identifier: MIT */
/*
 * desc.h - the save descriptor: how a client tells the daemon what a save's
 * shard file holds.  It travels as JSON through the staging arena (it can be
 * megabytes for 10,000 tensors, far more than a socket message), and the
 * daemon treats it as untrusted input.
 *
 * Format (version 1), compact on purpose:
 *
 *   {"v":1, "name":"step-100", "root":"/data/ckpt", "step":100,
 *    "file_size":N, "data_start":4096,
 *    "meta":{"k":"v",...}, "metrics":{"loss":1.25,...},
 *    "items":[[name, kind, dtype, shape, gshape|null, offs|null, begin, end], ...]}
 *
 *   kind: 0 tensor, 1 blob; dtype: the safetensors name ("F32");
 *   begin/end: absolute file offsets.
 */
#ifndef CKPT_FORMAT_DESC_H
#define CKPT_FORMAT_DESC_H

#include <stddef.h>

#include "format/layout.h"

#define DESC_VERSION 1
#define DESC_MAX_BYTES (512u << 20)

/* Serialises a placed layout.  Returns 0 and a malloc'd *ret_text (not
 * NUL-terminated) of *ret_len bytes, or -ENOMEM. */
int desc_build(const struct layout *l, char **ret_text, size_t *ret_len);

/*
 * Parses and validates a descriptor into *l (which must be zeroed; on failure
 * it is left freed).  Checks everything a peer controls:
 *   version; name (name_checkpoint_ok), root (name_root_ok); item names
 *   (name_item_ok) and their uniqueness; dtype names; ndim <= CKPT_MAX_NDIM;
 *   shape products * dtype size == end - begin without overflow;
 *   offs + shape <= gshape; blobs are 1-D U8; data_start is a multiple of
 *   LAYOUT_ALIGN, >= 8 and <= LAYOUT_MAX_HEADER + LAYOUT_ALIGN; items are
 *   packed back to back from data_start and the last ends at file_size;
 *   item count <= CKPT_MAX_ITEMS; meta values are strings <= CKPT_MAX_META_LEN,
 *   metrics are finite numbers, each at most CKPT_MAX_META_KEYS keys with valid
 *   names.  Sets crc0 and n_crcs.
 *
 * Returns 0, or -EBADMSG with the reason in err (e.g. "item 3 ('w'): shape
 * [2,3] F32 is 24 bytes but the range holds 20"), or -ENOMEM.
 */
int desc_parse(const char *text, size_t len, struct layout *l, char *err, size_t errlen);

#endif
