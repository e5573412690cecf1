/* SPDX-License-Identifier: MIT */
/*
 * testgate.h - pauses at named steps of a save, for tests only.
 *
 * Races between daemons that share a root (a loser's cleanup against a
 * winner's commit, say) cannot be made to happen by waiting for time.  With
 * CKPTD_TEST_GATE=DIR in ckptd's environment, a worker thread about to take
 * step S first looks for DIR/S.hold; if it is there, it creates
 * DIR/S.waiting and waits until DIR/S.hold is gone (polled every 20 ms, at
 * most TESTGATE_MAX_S seconds, then it logs and goes on).  A test creates
 * the .hold files it wants, waits for .waiting, does what must come first,
 * and removes .hold.  Without the variable (every real deployment) a gate
 * costs one branch.  Only worker threads ever wait here, never the event
 * loop.
 *
 * Steps: "root-open" (a save's root checked and opened, its work area not
 * made yet), "shard" (before a rank's shard is created), "commit" (before the
 * coordinator merges and commits), "cleanup" (before a failed save's
 * cleanup deletes or marks anything), and every step of store/remove.c's
 * removals (store_remove_hook), e.g. "discard-data" (a work area renamed
 * to the trash, before its files go).
 */
#ifndef CKPTD_TESTGATE_H
#define CKPTD_TESTGATE_H

#define TESTGATE_MAX_S 120

/* [startup] Reads CKPTD_TEST_GATE once. */
void testgate_init(void);

/* [worker] Waits at step `step` if a test holds it (see above). */
void testgate(const char *step);

#endif
