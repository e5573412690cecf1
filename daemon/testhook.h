/* SPDX-License-Identifier: MIT */
/*
 * testhook.h - a pause at a named step of the daemon, for tests only.
 *
 * Races between the daemon and someone changing the file system under it
 * are made deterministic by stopping the daemon at the step in question
 * while the test changes the world, rather than by sleeping and hoping.
 *
 *   CKPTD_TEST_PAUSE=STEP:DIR   (read once, at start-up)
 *
 * When a worker reaches STEP it creates DIR/STEP.paused and waits until
 * DIR/STEP.go exists (at most TESTHOOK_WAIT_S seconds, then it goes on),
 * each time it passes there (as the client it acts for: DIR must be
 * writable by the saving user).  Steps:
 *
 *   root-open   a save's root has been checked and opened (root_open),
 *               its work area is not made yet (daemon/save.c open_run)
 *
 * Without the variable (production) a pause is one untaken branch.  Never
 * set it on a daemon that serves anyone.
 */
#ifndef CKPT_DAEMON_TESTHOOK_H
#define CKPT_DAEMON_TESTHOOK_H

#define TESTHOOK_WAIT_S 120

/* Reads CKPTD_TEST_PAUSE; warns (logs) when it is set. */
void testhook_init(void);

/* Pauses here if step is the one named (worker threads only: it blocks). */
void testhook_pause(const char *step);

#endif
