/* SPDX-License-Identifier: MIT */
/*
 * attempt.h - the small JSON documents of a work area, one reader and one
 * writer for every backend (store.h explains what they are for):
 * attempt.json (the key and the daemon that made the area), the
 * coordinator's claim, and the addressee of a rank's index.
 */
#ifndef CKPT_STORE_ATTEMPT_H
#define CKPT_STORE_ATTEMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "format/index.h"
#include "store/store.h"

/* attempt.json for key k, attempt id, daemon self and the owner's uid:
 * malloc'd text, NULL if out of memory. */
char *store_attempt_text(const struct store_key *k, const char *id,
			 const struct store_writer *self, uid_t uid);

/*
 * Judges an attempt.json found in a work area: -EEXIST if it is not this
 * key's (or not valid), -EPERM if check_uid and it names another uid, 1 if
 * an earlier life of daemon self made it (a leftover to replace), 0 to
 * join it.
 */
int store_attempt_judge(const char *text, size_t len, const struct store_key *k, const char *id,
			const struct store_writer *self, bool check_uid, uid_t uid);

/* A fresh claim by self: its nonce (32 hex digits) into nonce and the
 * claim's text (malloc'd) into *ret.  0, -EIO (no randomness), -ENOMEM. */
int store_claim_new(const struct store_writer *self, char nonce[STORE_ID_LEN + 1], char **ret);

/* The nonce of claim text.  0 or -EBADMSG. */
int store_claim_nonce(const char *text, size_t len, char ret[STORE_ID_LEN + 1]);

/* True if claim text (len bytes) was made by another daemon than self_id
 * (or cannot be read as a claim): then the work area is that coordinator's
 * to remove, not the area's creator's (store.h, attempt_fail). */
bool store_claim_foreign(const char *text, size_t len, const char *self_id);

/* True if index text is addressed ("to") to nonce. */
bool store_index_addressed(const char *text, size_t len, const char *nonce);

/*
 * store_ops.attempt_count for any backend: counts up from *io_n the ranks
 * whose index, read with fetch(ud, rank, ...) (-ENOENT: none yet), is
 * addressed to nonce; ranks in local[n_local] (sorted) count without a
 * read.  Returns 0 or fetch's error (err: "rank N: " and fetch's reason).
 */
int store_count_delivered(index_fetch_fn fetch, void *ud, uint32_t world, const char *nonce,
			  const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			  size_t errlen);

#endif
