/* SPDX-License-Identifier: MIT */
/*
 * desc.h - the save descriptor: how a client tells the daemon what a save's
 * shard file holds.  It travels through the staging arena (it can be
 * megabytes for 10,000 tensors, far more than a socket message), and the
 * daemon treats it as untrusted input.
 *
 * Format (version 2): binary, so the daemon validates it without building a
 * tree of values (version 1 was JSON; parsing it took ~18 ms per 10,000
 * items on the save path).  All integers are in the host's byte order,
 * little-endian on every target ckptd supports: a descriptor only ever goes
 * from a client to the daemon on the same machine, through shared memory,
 * and is stored only in the daemon's own state directory on that machine
 * (the spill tier's records, daemon/pending.h), read back with desc_parse
 * as any other.  Readers must not assume any alignment of the buffer.
 * Five sections follow each other with no padding, and fill the descriptor
 * exactly (no trailing bytes):
 *
 *   header, 64 bytes:
 *      0  char[4] magic "CKDS"
 *      4  u32 version (2)
 *      8  u64 total_len        bytes of the whole descriptor
 *     16  u64 step
 *     24  u64 file_size
 *     32  u64 data_start
 *     40  u32 n_items          <= CKPT_MAX_ITEMS
 *     44  u32 n_dims           entries of the dims array
 *     48  u32 strings_len      bytes of the string pool
 *     52  u32 meta_len         bytes of the meta section
 *     56  u32 name_len         checkpoint name, first in the string pool
 *     60  u32 root_len         root directory, right after it
 *   item table, n_items records of 32 bytes:
 *      0  u32 name_off         in the string pool
 *      4  u32 name_len
 *      8  u8  kind             0 tensor, 1 blob
 *      9  u8  dtype            enum ckpt_dtype (ckpt.h; its values are ABI)
 *     10  u8  ndim             <= CKPT_MAX_NDIM
 *     11  u8  flags            bit 0: sharded; other bits 0
 *     12  u32 dims             index of the item's first entry in the dims array
 *     16  u64 begin            absolute file offset of the first byte
 *     24  u64 end              one past the last
 *   dims array, n_dims u64: per item, shape[ndim]; a sharded item follows it
 *      with gshape[ndim] and offs[ndim].
 *   string pool, strings_len bytes: the checkpoint name, the root, then each
 *      item's name in item order; no NULs, lengths explicit.
 *   meta section, meta_len bytes: the JSON object
 *      {"meta":{"k":"v",...},"metrics":{"loss":1.25,...}}, nothing else.
 *
 * The encoding of a layout is unique: item names and dims are packed in item
 * order, so name_off and dims must equal the running sums of the lengths
 * before them, the pool and the dims array must be used up exactly, and an
 * item is flagged sharded exactly when its gshape/offs differ from a whole
 * tensor (the test of layout_add).
 */
#ifndef CKPT_FORMAT_DESC_H
#define CKPT_FORMAT_DESC_H

#include <stddef.h>

#include "format/layout.h"

#define DESC_VERSION 2
#define DESC_MAX_BYTES (512u << 20)

/* Serialises a placed layout.  Returns 0 and a malloc'd *ret_text (binary,
 * not NUL-terminated) of *ret_len bytes, -ENOMEM, or -E2BIG if it would
 * pass DESC_MAX_BYTES. */
int desc_build(const struct layout *l, char **ret_text, size_t *ret_len);

/*
 * Parses and validates a descriptor into *l (which must be zeroed; on failure
 * it is left freed).  Checks everything a peer controls:
 *   magic and version; total_len == len, every section inside the buffer
 *   and together filling it, every offset and length inside its section
 *   (checked before what it points at is read), the unique encoding;
 *   name (name_checkpoint_ok), root (name_root_ok); item names
 *   (name_item_ok) and their uniqueness; no NUL in any string; kind, flags;
 *   dtype < CKPT_DTYPE_COUNT; ndim <= CKPT_MAX_NDIM;
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
