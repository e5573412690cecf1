/* SPDX-License-Identifier: MIT */
/*
 * dlstate.h - data-loader state that survives a change of topology.
 *
 * The state travels as one int64 tensor, the "table", of global shape
 * [n_rows, k]: one row per logical data shard (a file, a piece of a data
 * set), k columns:
 *
 *   DL_COL_ID      shard id, >= 0, unique in the table
 *   DL_COL_CURSOR  samples of this shard the training loop has consumed in
 *                  the current epoch, >= 0
 *   DL_COL_DONE    1 when the shard is finished for this epoch, else 0
 *   3 .. k-1       the user's columns (epoch, shard length, seed, ...): this
 *                  module never reads them; a row moves as a whole
 *
 * DP rank d holds the contiguous block of rows [bounds[d], bounds[d+1]) and
 * saves exactly that block as its chunk of the tensor (offsets
 * [bounds[d], 0], shape [bounds[d+1] - bounds[d], k]).  The blocks follow
 * each other in rank order and cover the table; a block may be empty.  The
 * TP/PP ranks of one DP group hold the same rows; one of them writes.  A
 * rank writes its rows in the order it holds them, which after a restore is
 * the order this module gave it.
 *
 * What a restore gives each rank:
 *
 *   Same DP world (M == N): the identity.  Rank r gets back its own saved
 *   block, rows in the order it saved them, at the same row0.  This is the
 *   only case in which the per-rank state that is NOT in the table (below)
 *   still describes the rows the rank holds, so it must not be reshuffled.
 *
 *   Another DP world (M != N): the rows are dealt out again.  Put the rows
 *   in one sequence: the unfinished ones (done == 0) by ascending shard id,
 *   then the finished ones (done == 1) by ascending shard id.  Row t of that
 *   sequence goes to new rank t mod M, as that rank's row t / M.  So a rank
 *   holds its unfinished shards first, then its finished ones, each by id;
 *   the unfinished counts of any two ranks differ by at most 1, and so do
 *   the finished counts and the totals (no divisibility needed: 7 rows over
 *   3 ranks give 3, 2, 2).  New rank d's block starts at row
 *   d * (n_rows / M) + min(d, n_rows % M).
 *
 * The deal depends only on the set of rows (their values), M and the rank:
 * not on the saved order, the saved bounds or N.  Every rank, and every
 * TP/PP peer of a DP group, computes its part independently from the same
 * checkpoint and the parts form a partition: each row has exactly one new
 * owner.  The functions are pure: no global state, no randomness, nothing
 * that depends on timing; the only side effect is the allocation they
 * return.
 *
 * The guarantee, and what it rests on.  The loader must keep one rule: a
 * row's cursor counts the samples of that shard the training loop has
 * CONSUMED (taken off the loader by a step that the checkpoint includes),
 * never the samples its workers have produced ahead of the loop.  Then a
 * restore in any topology hands every logical shard to exactly one DP rank,
 * which resumes it at its cursor: within an epoch no shard is visited twice
 * and none is skipped.  Resuming "at the cursor" means skipping the first
 * `cursor` samples of the shard in the shard's own order, so that order must
 * follow from the row (for instance a seed and the epoch kept in user
 * columns), not from a rank's RNG.
 *
 * What is seen again after a restore, and how much:
 *   - Samples prefetched but not consumed at the save.  They were never
 *     counted, so they are read again (they were never trained on: this is
 *     repeated reading, not repeated training).  At most prefetch depth x
 *     batch size x loader workers samples per DP rank (PyTorch's
 *     prefetch_factor x batch_size x num_workers).
 *   - Samples consumed after the last committed save: the usual rollback
 *     to the checkpoint.  The job trains on them again: the steps run since
 *     that save x the per-rank batch size, per DP rank.  Nothing here is
 *     peculiar to a change of topology.
 *
 * What does not carry over to a new topology: per-rank state that is not in
 * the table -- worker iterator snapshots, shuffle buffers, RNG states.  It
 * is saved as blobs per DP rank and restored only when M == N (where the
 * identity above keeps it matched to its rows); after a change of topology
 * it is dropped and each rank starts its workers afresh from the cursors.
 *
 * Epochs are the loader's business: when it starts a new epoch it resets
 * cursor and done (and bumps an epoch column if it keeps one).  This module
 * treats all rows alike whatever their user columns say.
 */
#ifndef CKPT_FORMAT_DLSTATE_H
#define CKPT_FORMAT_DLSTATE_H

#include <stddef.h>
#include <stdint.h>

#define DL_COL_ID     0
#define DL_COL_CURSOR 1
#define DL_COL_DONE   2
#define DL_MIN_COLS   3u
#define DL_MAX_COLS   64u
#define DL_MAX_WORLD  65536u
/* Cap on table rows: 26x the 10^7 shards the design is sized for.  Working
 * memory is 32 bytes a row (the table itself is at least 24 a row). */
#define DL_MAX_ROWS   (1ull << 28)

/* A saved table as read back: all rows, and who saved which block.  Borrowed
 * by the functions below for the duration of the call. */
struct dl_saved {
	const int64_t *table;   /* n_rows * k int64, row-major; may be NULL if
	                         * n_rows == 0 */
	uint64_t n_rows;
	uint32_t k;             /* columns, DL_MIN_COLS..DL_MAX_COLS */
	uint32_t n_saved;       /* DP ranks that saved it (N), 1..DL_MAX_WORLD */
	const uint64_t *bounds; /* n_saved + 1 entries: saved rank d held rows
	                         * [bounds[d], bounds[d+1]); bounds[0] = 0,
	                         * bounds[n_saved] = n_rows, non-decreasing */
};

/*
 * What new DP rank `rank` of `new_world` holds after restoring `s` (the rule
 * is in the comment at the top): *ret_rows gets a malloc'd array (the
 * caller frees it; never NULL on success, even when *ret_n is 0) of the
 * saved row indices it now owns, in the order it holds and will save them;
 * *ret_n their count; *ret_row0 the row at which its block starts in the
 * table it saves next.
 *
 * Checks the whole table every call, since it comes from storage.  Time is
 * linear in n_rows: one pass to check the rows, a radix sort on (done, id)
 * of at most 8 passes (no comparisons, so no bad case), one pass to dedupe
 * and deal.  Memory is 32 bytes a row while it runs, in the one array it
 * returns, which is shrunk to *ret_n entries first.
 *
 * Returns 0; -EINVAL (bad arguments: k outside DL_MIN_COLS..DL_MAX_COLS,
 * new_world 0 or above DL_MAX_WORLD, rank >= new_world, a NULL pointer);
 * -E2BIG (more than DL_MAX_ROWS rows); -EBADMSG (a bad table or bounds: N
 * is 0 or above DL_MAX_WORLD, bounds not starting at 0, decreasing or not
 * ending at n_rows, a negative id or cursor, done not 0 or 1, a shard id on
 * two rows); -ENOMEM.  Every refusal but -ENOMEM puts a reason in err,
 * naming the row (and the saved rank whose block holds it) or the rank.
 * The ret_ outputs are written only on success.
 */
int dl_assign(const struct dl_saved *s, uint32_t new_world, uint32_t rank, uint64_t **ret_rows,
	      uint64_t *ret_n, uint64_t *ret_row0, char *err, size_t errlen);

/*
 * The same restore for all new_world ranks at once, from the same code as
 * dl_assign(), so that the two cannot disagree.  *ret_order gets a malloc'd
 * array of n_rows entries (never NULL on success; the caller frees it): the
 * saved row index of each row of the next table, that is the lists
 * dl_assign() returns for ranks 0, 1, ..., new_world - 1, one after the
 * other.  ret_bounds (caller's, new_world + 1 entries) gets the new blocks:
 * rank d's list is ret_order[ret_bounds[d] .. ret_bounds[d+1]).  ret_owner
 * (caller's, n_rows entries, or NULL) gets the new rank of every saved row.
 *
 * Same checks, errors and cost as dl_assign() (no rank to check); the
 * outputs are written only on success.
 */
int dl_map(const struct dl_saved *s, uint32_t new_world, uint64_t **ret_order,
	   uint64_t *ret_bounds, uint32_t *ret_owner, char *err, size_t errlen);

/*
 * The first run, with no checkpoint yet: n_shards shards with ids
 * 0..n_shards-1, all unfinished, dealt to new_world ranks by the same rule
 * as dl_assign(), which gives rank r the ids r, r + new_world,
 * r + 2 * new_world, ...  *ret_ids gets them in a malloc'd array (never
 * NULL on success; the caller frees it), *ret_n their count and *ret_row0
 * where rank r's block starts.  The caller builds its rows from them
 * ({id, 0, 0, user columns...}); a restore of that table in any topology
 * deals them exactly as dl_first() would have for that topology.
 *
 * Returns 0, -EINVAL (new_world 0 or above DL_MAX_WORLD, rank >= new_world,
 * a NULL pointer), -E2BIG (more than DL_MAX_ROWS shards), -ENOMEM; the
 * outputs are written only on success.
 */
int dl_first(uint64_t n_shards, uint32_t new_world, uint32_t rank, int64_t **ret_ids,
	     uint64_t *ret_n, uint64_t *ret_row0, char *err, size_t errlen);

#endif
