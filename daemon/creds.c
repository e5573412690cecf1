/* SPDX-License-Identifier: MIT */
/* creds.c - see creds.h. */
#include "daemon/creds.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

int creds_from_peer(int sock, struct creds *ret, pid_t *ret_pid)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	gid_t groups[CREDS_MAX_GROUPS];
	socklen_t glen = sizeof(groups);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	memset(ret, 0, sizeof(*ret));
	ret->uid = uc.uid;
	ret->gid = uc.gid;
	ret->umask = 022;
	if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
		ret->n_groups = (uint32_t)(glen / sizeof(gid_t));
	} else if (errno == ERANGE) {
		/* More groups than we keep: the first ones only (fewer rights). */
		glen = sizeof(groups);
		ret->n_groups = CREDS_MAX_GROUPS;
		if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) < 0 && errno != ERANGE)
			ret->n_groups = 0;
	} else {
		ret->n_groups = 0; /* an old kernel: the primary group only */
	}
	memcpy(ret->groups, groups, ret->n_groups * sizeof(gid_t));
	*ret_pid = uc.pid;
	return 0;
}

/* The daemon's own credentials, read once at start-up: a worker's
 * getgroups() would return whatever groups it acts with at that moment. */
static struct creds self;
static bool self_known;

void creds_init(void)
{
	int n;

	memset(&self, 0, sizeof(self));
	self.uid = geteuid();
	self.gid = getegid();
	self.umask = 022;
	n = getgroups(CREDS_MAX_GROUPS, self.groups);
	self.n_groups = n > 0 ? (uint32_t)n : 0;
	self_known = true;
}

void creds_self(struct creds *ret)
{
	if (!self_known)
		creds_init();
	*ret = self;
}

int creds_thread_init(void)
{
	return unshare(CLONE_FS) < 0 ? -errno : 0;
}

bool creds_is_self(const struct creds *c)
{
	return c->uid == geteuid() && c->gid == getegid();
}

int creds_apply(const struct creds *c, char *err, size_t errlen)
{
	uid_t euid = geteuid();

	umask(c->umask & 0777);
	if (creds_is_self(c)) {
		/* Back to ourselves, groups included (also when the daemon is
		 * not root: it switched with CAP_SETGID and returns with it).
		 * A daemon without CAP_SETGID never switched: nothing to undo. */
		if (!self_known)
			creds_init();
		(void)syscall(SYS_setgroups, (size_t)self.n_groups, self.groups);
		setfsgid(c->gid);
		setfsuid(c->uid);
		return 0;
	}
	/* Per-thread: the raw system call, not glibc's process-wide wrapper. */
	if (syscall(SYS_setgroups, (size_t)c->n_groups, c->groups) < 0) {
		snprintf(err, errlen,
			 "ckptd (uid %u) cannot act as uid %u on the file system: it needs "
			 "CAP_SETUID and CAP_SETGID (setgroups: %s)",
			 (unsigned)euid, (unsigned)c->uid, strerror(errno));
		return -EPERM;
	}
	setfsgid(c->gid);
	setfsuid(c->uid);
	/* setfsuid() reports no error: read the ids back (an invalid id only
	 * returns the current one). */
	if ((uid_t)setfsuid((uid_t)-1) != c->uid || (gid_t)setfsgid((gid_t)-1) != c->gid) {
		snprintf(err, errlen,
			 "ckptd (uid %u) cannot act as uid %u/gid %u on the file system: it "
			 "needs CAP_SETUID and CAP_SETGID",
			 (unsigned)euid, (unsigned)c->uid, (unsigned)c->gid);
		return -EPERM;
	}
	return 0;
}
