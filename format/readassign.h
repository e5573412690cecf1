/* SPDX-License-Identifier: MIT */
/*
 * readassign.h - one reader per region of saved bytes, for a load in which
 * several ranks need the same bytes (data-parallel replicas).
 *
 * Every loading rank knows the byte ranges of the checkpoint's files that
 * each rank needs (already widened to CRC pieces by the load planner).
 * Reading a range from storage once per replica wastes bandwidth, so the
 * ranges of all ranks are cut into regions and each region gets ONE reader:
 * a rank that needs its bytes, reads them from storage and sends them to the
 * others that need them.  Every rank runs ra_assign() on the same input and
 * must get the same plan, so the plan is a pure function of the input, which
 * is read as a SET of (rank, byte) pairs:
 *
 *   - the order of the requests and of each request's ranges, duplicate or
 *     overlapping ranges of one rank, a range given as two touching halves,
 *     and a rank given in several requests (their ranges are merged) do not
 *     change the plan;
 *   - a rank whose ranges are all empty is the same as a rank not given: it
 *     wants nothing, reads nothing and is not in the plan.
 *
 * Regions.  Each rank's ranges are first merged into disjoint, non-touching
 * "spans" (sorted by file and begin).  The files are then cut at every span
 * boundary of every rank; each piece between two cuts is wanted by a fixed
 * set of ranks, and the pieces wanted by nobody are dropped.  The remaining
 * pieces are the regions: they are disjoint and cover exactly the union of
 * all ranges.  No two neighbouring regions are wanted by the same set of
 * ranks -- a rank's spans never touch, so at every cut some rank's span
 * begins or ends and the set changes -- so a region is as large as it can
 * be.  If max_region is not 0, a region is further cut at the multiples of
 * max_region (absolute file offsets, so the cuts do not depend on how the
 * region came about; with max_region a multiple of LAYOUT_CRC_BLOCK every
 * piece stays on the CRC grid), so that one huge tensor is read by several
 * ranks and not all by one.
 *
 * Readers.  Regions are assigned in file order (file, then offset), each to
 * the wanting rank that has been given the fewest bytes so far, ties to the
 * lowest rank.  The set of wanting ranks is kept by the sweep that cuts the
 * regions, in a heap ordered by (bytes so far, rank), so a region costs
 * O(log ranks) and never a walk over its wanting ranks.  Bound: when region
 * j goes to rank r, no rank that wants j has fewer bytes than r; so if j is
 * the last region r reads,
 *
 *     read(r) <= read(s) + size(j)   for every rank s that wants j.
 *
 * For replicas (a group of k ranks that want exactly the same bytes, which
 * no rank outside the group wants) the group's reads differ by at most the
 * largest region, so the most any of them reads is at most bytes/k + the
 * largest region (Graham's list-scheduling bound; with max_region set, no
 * region is larger than max_region).  When the wanting sets are mixed, no
 * greedy rule promises the optimum + the largest region (choosing readers
 * is then a restricted-assignment problem); the bound above still holds for
 * every rank.  Decreasing-size order (LPT) was not used: it needs every
 * region's wanting set out of file order, which costs the sum of the set
 * sizes -- quadratic in the worst case -- where the sweep has the set at
 * hand.
 *
 * Cost: O(R log R) time and O(R) memory for R ranges in all (three sorts,
 * a heap operation per region and per span boundary; 1,024 ranks of 512
 * ranges each take about 0.1 s of CPU for replicas, 0.3 s for random,
 * overlapping ranges).  The plan keeps its regions, the spans of every rank
 * with the regions that tile each, and the regions each rank reads; who
 * wants a region is found on demand (ra_plan_wanting) from an index of the
 * spans, not stored, since all the wanting sets together can be quadratic in
 * R.  The plan takes at most about 150 bytes per span, plus 32 per region
 * that a max_region cut adds, all freed by ra_plan_free().
 *
 * Caps (the input comes from every rank of a job): at most RA_MAX_RANKS
 * distinct ranks that want bytes, RA_MAX_RANGES ranges in all (counted as
 * given, empty and duplicate ones included) and RA_MAX_REGIONS regions after
 * the max_region cuts.
 */
#ifndef CKPT_FORMAT_READASSIGN_H
#define CKPT_FORMAT_READASSIGN_H

#include <stddef.h>
#include <stdint.h>

#define RA_MAX_RANKS   65536u
#define RA_MAX_RANGES  (1u << 26)
#define RA_MAX_REGIONS (1u << 27)

/* Bytes [begin, end) of file `file` (the caller's file number, e.g. an index
 * into manifest.files).  begin == end is an empty range and is ignored. */
struct ra_range {
	uint32_t file;
	uint64_t begin, end;
};

/* The ranges one rank needs.  Borrowed for the call only. */
struct ra_request {
	uint32_t rank;
	const struct ra_range *ranges;
	size_t n_ranges;
};

/* Bytes [begin, end) of `file`, read from storage by `reader` and sent to
 * the other n_wanting - 1 ranks that want them. */
struct ra_region {
	uint64_t begin, end;
	uint32_t file;
	uint32_t reader;    /* a rank that wants the region */
	uint32_t n_wanting; /* ranks that want it, the reader included (>= 1) */
};

/* A span: bytes [begin, end) of `file` that `rank` wants, the union of its
 * ranges merged where they overlap or touch.  Regions first .. first +
 * count - 1 tile it exactly (count >= 1). */
struct ra_span {
	uint64_t begin, end;
	uint32_t file;
	uint32_t rank;
	uint32_t first;
	uint32_t count;
};

/* One rank's part of a plan; the pointers borrow the plan. */
struct ra_rank {
	uint32_t rank;
	uint64_t bytes_wanted;        /* the bytes of its spans */
	uint64_t bytes_read;          /* the bytes of the regions it reads */
	const struct ra_span *spans;  /* its spans, sorted by (file, begin) */
	size_t n_spans;
	const uint32_t *reads;        /* the regions it reads, ascending */
	size_t n_reads;
};

/* A plan: built by ra_assign(), then only read (its accessors change
 * nothing), so threads may share it. */
struct ra_plan;

/*
 * Cuts the requested bytes into regions and gives each region a reader (see
 * above).  max_region: 0 for no limit, else regions are cut at its
 * multiples.  err (errlen bytes, may be NULL) receives the reason of a
 * failure.
 *
 * Returns 0 and *ret_plan (free with ra_plan_free), or
 *   -EINVAL    a range ends before it begins, or an array is NULL while
 *              its count is not 0;
 *   -E2BIG     more than RA_MAX_RANGES ranges, RA_MAX_RANKS ranks or
 *              RA_MAX_REGIONS regions;
 *   -EOVERFLOW the spans of all ranks add up to more than UINT64_MAX bytes;
 *   -ENOMEM.
 * Which of these a bad input gets does not depend on the input's order.
 */
int ra_assign(const struct ra_request *reqs, size_t n_reqs, uint64_t max_region,
	      struct ra_plan **ret_plan, char *err, size_t errlen);

/* Frees a plan.  Accepts NULL. */
void ra_plan_free(struct ra_plan *p);

/* The regions, sorted by (file, begin), and their number.  They borrow p. */
size_t ra_plan_regions(const struct ra_plan *p, const struct ra_region **ret_regions);

/* The ranks that want bytes, ascending, and their number.  Borrows p. */
size_t ra_plan_ranks(const struct ra_plan *p, const uint32_t **ret_ranks);

/*
 * Rank `rank`'s part of the plan.  It reads the regions in ret->reads and
 * receives every other region of its spans from that region's reader (never
 * from itself).  Returns 0, or -ENOENT if the rank wants no bytes.
 */
int ra_plan_rank(const struct ra_plan *p, uint32_t rank, struct ra_rank *ret);

/*
 * The regions that hold bytes [begin, end) of `file`, for mapping one of the
 * caller's own ranges (as given, before merging) to the regions that serve
 * it: regions *ret_first .. *ret_first + *ret_count - 1, in order and
 * without gaps; the first may begin before `begin` and the last end after
 * `end`.  An empty range has count 0.  Returns 0, -ENOENT if some byte of
 * the range is in no region (no rank asked for it), -EINVAL if end < begin.
 * O(log regions + count).
 */
int ra_plan_find(const struct ra_plan *p, uint32_t file, uint64_t begin, uint64_t end,
		 uint32_t *ret_first, uint32_t *ret_count);

/*
 * The ranks that want region `region` (its reader among them), ascending,
 * into ranks[0 .. n_wanting - 1], for the reader to know where to send it.
 * Returns n_wanting, -EINVAL if there is no such region, -ERANGE if cap <
 * n_wanting (nothing written).  O(log R + n_wanting log n_wanting).
 */
int ra_plan_wanting(const struct ra_plan *p, uint32_t region, uint32_t *ranks, size_t cap);

#endif
