/* SPDX-License-Identifier: MIT */
/*
 * plan.h - planning a load: which bytes of which shard files a set of
 * destination boxes needs, as a few large, CRC-checkable reads.
 *
 * A load names, per tensor, boxes of the global tensor (global offsets and
 * sizes) that the caller wants filled.  Saved chunks tile each tensor
 * (manifest_parse checked: in bounds, no overlaps, full cover), so a box
 * inside the global shape is covered exactly once by the intersections of
 * the box with the chunks.  For each intersection the planner finds the
 * bytes it occupies in the chunk's file, as few "segments" as possible:
 *
 *   - the dimensions from the innermost one up to the first one the
 *     intersection cuts are contiguous in the chunk (one run per index of
 *     the outer dimensions);
 *   - runs whose gap is at most `merge_gap` are joined into one segment
 *     (reading the gap is cheaper than another request; and after widening
 *     to CRC pieces a gap below one piece is read anyway), so a column band
 *     of a row-major chunk with short rows is one segment, and one with
 *     rows of many MiB is one segment per row;
 *   - a segment longer than `max_read` is cut along the outermost dimension
 *     it spans (or, for one huge run, into element groups) so one read's
 *     buffer stays bounded.
 *
 * Each segment is widened to the CRC pieces it touches (layout.h: the grid
 * of LAYOUT_CRC_BLOCK bytes, cut at the chunk's ends), because a piece can
 * only be verified whole.  Segments are sorted per file and merged into
 * reads when they overlap or lie within merge_gap of each other, up to
 * max_read bytes.  Every read carries the copies it serves (a sub-box of
 * one destination box, from one chunk) and the piece spans to verify before
 * any of its bytes are used.
 *
 * Finding the chunks a box meets: a tensor's chunks are scanned linearly
 * while few boxes ask about it; a tensor asked about repeatedly (a planner
 * of many ranks' loads) gets an index: its chunks sorted by their start in
 * one dimension, so a query is a binary search plus the chunks that start
 * within the largest chunk extent before the box (for the usual shardings,
 * the chunks that meet it and a few neighbours).  The index lives in a
 * plan_index, built once per manifest and shared by every plan of it.
 *
 * All sizes come from a manifest validated by manifest_parse; the planner
 * still checks boxes against the global shape (caller input).
 */
#ifndef CKPT_FORMAT_PLAN_H
#define CKPT_FORMAT_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/index.h"

#define PLAN_DEFAULT_MERGE_GAP (256u << 10)
#define PLAN_DEFAULT_MAX_READ  (64u << 20)
#define PLAN_MAX_WANTS         (1u << 24) /* boxes in one plan */

/* One destination box: elements [offsets, offsets + shape) of item `item`
 * (an index into manifest.items) are wanted.  A blob is a 1-D byte tensor:
 * offsets/shape select a byte range of it.  `tag` is the caller's (its
 * destination's number); the planner only copies it into the copies. */
struct plan_want {
	uint32_t item;
	uint32_t tag;
	const uint64_t *offsets; /* item ndim entries */
	const uint64_t *shape;   /* item ndim entries */
};

/* Bytes of one intersection (a sub-box of one want and one chunk), all in
 * one read.  The sub-box is in global coordinates. */
struct plan_copy {
	uint32_t want;     /* index into the plan's wants */
	uint32_t tag;      /* that want's tag */
	uint32_t item;     /* manifest item */
	uint32_t chunk;    /* chunk of the item */
	uint64_t src;      /* file offset of the sub-box's first element */
	uint64_t *offsets; /* item ndim entries, global (in the plan's pool) */
	uint64_t *shape;   /* item ndim entries */
	uint64_t bytes;    /* the sub-box's volume in bytes */
};

/* A CRC-verifiable span of one chunk: piece-aligned (begins at the chunk's
 * begin or a grid line, ends at the chunk's end or a grid line). */
struct plan_check {
	uint32_t item, chunk;
	uint64_t begin, end;
};

struct plan_read {
	uint32_t file;          /* index into manifest.files */
	uint64_t begin, end;    /* the bytes to read */
	size_t copy0, n_copies; /* its copies: plan.copies[copy0 ..] */
	size_t check0, n_checks;/* spans to verify: plan.checks[check0 ..] */
};

struct plan {
	struct plan_read *reads;   /* sorted by (file, begin); two may overlap
	                            * where boxes share a CRC piece and
	                            * max_read cut them apart (each verifies
	                            * what it serves); within one read the
	                            * check spans are in file order, disjoint */
	size_t n_reads;
	struct plan_copy *copies;  /* grouped by read */
	size_t n_copies;
	struct plan_check *checks; /* grouped by read */
	size_t n_checks;
	uint64_t bytes_wanted;     /* the wants' volume in bytes */
	uint64_t bytes_read;       /* the reads' total */
	uint64_t max_read;         /* the largest read */
	void *pool;                /* private */
};

struct plan_opts {
	uint64_t merge_gap; /* 0: PLAN_DEFAULT_MERGE_GAP */
	uint64_t max_read;  /* 0: PLAN_DEFAULT_MAX_READ; at least one CRC
	                     * piece (LAYOUT_CRC_BLOCK) is always allowed */
};

/* The per-manifest chunk index.  Borrows m, which must outlive it. */
struct plan_index;
int plan_index_new(const struct manifest *m, struct plan_index **ret_ix);
void plan_index_free(struct plan_index *ix);

/*
 * Plans the wants against ix's manifest.  Checks every want: item in
 * range, box inside the item's global shape (-EINVAL, message in err
 * naming the item).  Returns 0 and *ret_plan (free with plan_free), or
 * -EINVAL, -E2BIG (more than PLAN_MAX_WANTS), -EBADMSG (the bytes the
 * wants need belong to two chunks at once: a corrupt manifest, see
 * plan.c), -ENOMEM.  Not thread-safe for one ix (it grows its index
 * lazily); use one ix per thread or a lock.
 */
int plan_build(struct plan_index *ix, const struct plan_want *wants, size_t n_wants,
	       const struct plan_opts *opts, struct plan **ret_plan, char *err, size_t errlen);
void plan_free(struct plan *p);

/* The element strides, in bytes, of chunk c of item t (row-major). */
void plan_chunk_strides(const struct manifest_tensor *t, const struct manifest_chunk *c,
			size_t esize, uint64_t *ret_strides);

/*
 * Verifies the span k against the chunk's CRC pieces, with buf holding the
 * file bytes [buf_begin, ...) that include it.  Returns 0, or -EBADMSG with
 * the file offset of the first bad piece in *ret_bad.
 */
int plan_check_span(const struct manifest *m, const struct plan_check *k, const uint8_t *buf,
		    uint64_t buf_begin, uint64_t *ret_bad);

#endif
