/* SPDX-License-Identifier: MIT */
/*
 * creds.h - acting as the client on the file system.
 *
 * ckptd may run with privileges, but every file of a save is created, written
 * and renamed with the rights of the client that asked for it: a user can
 * only save where they could write themselves, and what ckptd creates is
 * theirs, with their umask.  The alternative -- the client opening every
 * file and passing the fds -- cannot cover the steps that happen after the
 * trainer is gone (the coordinator's manifest and rename, the sweep), so the
 * daemon switches identity instead.
 *
 * Only worker threads switch (worker.h), and only their own identity: the
 * file-system ids (setfsuid/setfsgid) and the supplementary groups are
 * per-thread in the kernel, and each worker has its own umask after
 * unshare(CLONE_FS).  glibc's setgroups() changes every thread of the
 * process, so the raw system call is used.  Changing the fsuid away from 0
 * also drops CAP_DAC_OVERRIDE and friends for that thread (capabilities(7)),
 * so the kernel checks every path exactly as it would for the user.
 */
#ifndef CKPTD_CREDS_H
#define CKPTD_CREDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CREDS_MAX_GROUPS 256

struct creds {
	uid_t uid;
	gid_t gid;
	mode_t umask;
	uint32_t n_groups;
	gid_t groups[CREDS_MAX_GROUPS];
};

/*
 * The credentials of the peer of a connected Unix socket (SO_PEERCRED and
 * SO_PEERGROUPS), with umask 022 until the client tells its own.  A peer with
 * more than CREDS_MAX_GROUPS groups keeps only the first ones (it can then do
 * less, never more).  Returns 0 or -errno; *ret_pid gets the peer's pid.
 */
int creds_from_peer(int sock, struct creds *ret, pid_t *ret_pid);

/* Records the daemon's own credentials; call once at start-up, before any
 * thread switches.  (creds_self calls it if nobody did.) */
void creds_init(void);

/* The daemon's own credentials (what worker threads return to). */
void creds_self(struct creds *ret);

/* Makes this thread's umask its own (call once at the start of a worker). */
int creds_thread_init(void);

/*
 * Makes the calling thread act as `c` on the file system: groups, fsgid,
 * fsuid, umask.  Returns 0, or -EPERM with the reason in err when the daemon
 * may not switch (it lacks CAP_SETUID/CAP_SETGID and c is not itself).
 */
int creds_apply(const struct creds *c, char *err, size_t errlen);

/* True if c names the same user and group as the daemon itself. */
bool creds_is_self(const struct creds *c);

#endif
