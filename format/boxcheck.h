/* SPDX-License-Identifier: MIT */
/*
 * boxcheck.h - do a tensor's chunks tile its global shape?
 *
 * A chunk is a box: a corner (offsets) and an extent (shape) in each of the
 * tensor's ndim dimensions.  The chunks of a tensor must tile the global
 * shape: no element in two chunks, none in no chunk.  Both the merge that
 * writes a manifest (index.c) and the parser that reads one back
 * (manifest.c) ask this question, of input they did not make, and must
 * give the same answer: a manifest the merge writes is one the reader opens.
 *
 * Usage, for each tensor:
 *
 *   boxcheck_start(&bc, ndim, gshape);
 *   for each chunk: boxcheck_add(&bc, offs, shape);   (numbered 0, 1, ...)
 *   switch (boxcheck_verdict(&bc, &res)) ...
 *
 * One struct boxcheck is meant to be reused for every tensor of a manifest:
 * its scratch grows to the largest tensor's chunk count and is kept, so a
 * manifest of many tensors costs no allocation per tensor.
 */
#ifndef CKPT_FORMAT_BOXCHECK_H
#define CKPT_FORMAT_BOXCHECK_H

#include <stddef.h>
#include <stdint.h>

struct boxcheck_ent; /* private */

struct boxcheck {
	/* private */
	struct boxcheck_ent *ent; /* the boxes of non-zero volume */
	size_t n, cap;
	size_t n_added;           /* every box added, zero-volume ones too */
	unsigned ndim;
	const uint64_t *gshape;
	uint64_t total;
	unsigned __int128 sum;
};

#define BOXCHECK_INIT { 0 }

enum boxcheck_verdict {
	BOXCHECK_TILES = 0,   /* no two boxes overlap and their volumes add up
	                       * to the whole: every element in exactly one */
	BOXCHECK_OVERLAP = 1, /* boxes `first` and `second` share an element */
	BOXCHECK_HOLE = 2,    /* no two overlap, but the volumes add up to
	                       * `covered` != `total`: some element is in no box
	                       * (or, if a box lay outside, too much is covered) */
};

struct boxcheck_result {
	uint64_t covered;     /* the boxes' volumes added up, overlaps counted
	                       * twice; UINT64_MAX if the sum passes it */
	uint64_t total;       /* the global shape's volume */
	size_t first, second; /* BOXCHECK_OVERLAP: two boxes that overlap, by
	                       * their number in order of boxcheck_add(), first <
	                       * second; 0 otherwise */
};

/*
 * Starts the check of one tensor: forgets the boxes of the previous one.
 * gshape (ndim entries; ndim 0 is a scalar, of volume 1) is borrowed until
 * boxcheck_verdict() returns.  Returns 0, or -EOVERFLOW if the global
 * volume does not fit in 64 bits (the callers refuse such tensors first).
 */
int boxcheck_start(struct boxcheck *bc, unsigned ndim, const uint64_t *gshape);

/*
 * Adds the next box (ndim offsets and ndim sizes, borrowed until
 * boxcheck_verdict() returns).  The caller has checked that it lies inside
 * the global shape (offs[d] + shape[d] <= gshape[d]); the answer is
 * meaningless for a box that does not, though never unsafe.  A box of volume
 * 0 holds no element: it is numbered but never reported as overlapping.
 * Returns 0, or -ENOMEM (the box is not added).
 */
int boxcheck_add(struct boxcheck *bc, const uint64_t *offs, const uint64_t *shape);

/*
 * Decides, for the boxes added since boxcheck_start(), and fills *ret (always,
 * whatever the verdict).  An overlap is reported before a wrong total, so
 * two overlapping boxes plus a hole of the same size are an overlap.  When
 * several pairs overlap, which one is reported depends only on the boxes and
 * the order they were added in.
 *
 * Cost: the boxes are sorted by their offsets in two "sweep" dimensions,
 * the ones in which they are thinnest relative to the tensor (the ones it is
 * split along).  Then each box A is compared only with later boxes that
 * start inside A in the first sweep dimension and before A's end in the
 * second: a run of boxes that share their start in the first dimension is
 * left, by a binary search, at its first box starting at or past A's end in
 * the second.  That is O(n log n) for a split along any one dimension, for
 * grids in two dimensions (a row split of a column split, cuts even or not),
 * for identical boxes (the first comparison finds them) and for boxes of
 * volume 0 (never sorted).  Other layouts cost more:
 *  - a 2-D split whose cuts in one dimension differ from column to column
 *    costs up to O(n k log n), k the number of columns;
 *  - a grid in three or more dimensions costs O(n k), k the number of boxes
 *    that share their start in both sweep dimensions;
 *  - the worst case is quadratic, O(n^2 log n): e.g. T columns of full
 *    height beside 3T rows far wider than all the columns, which makes the
 *    rows the first sweep dimension and every column meet every row's start
 *    (16,000 such boxes take half a second).  A chunk is one rank's shard, so
 *    this takes thousands of ranks sharded that strangely, or a hand-made
 *    manifest: a hostile manifest can cost CPU time, though never memory
 *    beyond one entry per box.
 * Never allocates: the sort is an in-place heapsort, skipped when the boxes
 * come in order already.
 */
enum boxcheck_verdict boxcheck_verdict(struct boxcheck *bc, struct boxcheck_result *ret);

/* Frees the scratch.  Accepts a zeroed (BOXCHECK_INIT) or freed struct; it
 * can be started again afterwards. */
void boxcheck_free(struct boxcheck *bc);

#endif
