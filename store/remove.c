/* SPDX-License-Identifier: MIT */
/* remove.c - removing local checkpoints crash-safely, and leases (remove.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/index.h"
#include "store/remove.h"

#define RM_BATCH      64 /* checkpoints renamed per fsync of ROOT */
#define RM_MAX_DEPTH  8  /* directory levels inside a checkpoint */

void (*store_remove_hook)(const char *step);

static void step(const char *what)
{
	if (store_remove_hook)
		store_remove_hook(what);
}

bool store_is_trash_name(const char *name)
{
	return !strncmp(name, STORE_TRASH_PREFIX, sizeof(STORE_TRASH_PREFIX) - 1);
}

bool store_is_tombstone(const char *text, size_t len)
{
	json_t *j;
	bool yes;

	/* Cheap first: a manifest never holds the key at all. */
	if (!memmem(text, len, STORE_TOMBSTONE_KEY, sizeof(STORE_TOMBSTONE_KEY) - 1))
		return false;
	j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
	yes = json_is_object(j) && json_object_get(j, STORE_TOMBSTONE_KEY) &&
	      !json_object_get(j, "format");
	json_decref(j);
	return yes;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int store_lease_take(int dirfd, unsigned timeout_ms)
{
	unsigned waited = 0, pause = 1;

	for (;;) {
		if (flock(dirfd, LOCK_SH | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (waited >= timeout_ms)
			return -EBUSY;
		sleep_ms(pause);
		waited += pause;
		pause = pause < 64 ? pause * 2 : 64;
	}
}

/* The checkpoint directory `name` of rootfd, never through a symbolic
 * link. */
static int open_dir(int rootfd, const char *name)
{
	int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? (errno == ELOOP ? -ENOTDIR : -errno) : fd;
}

int store_lease_busy(int rootfd, const char *name)
{
	int fd = open_dir(rootfd, name), r = 0;

	if (fd < 0)
		return fd;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		r = errno == EWOULDBLOCK ? 1 : -errno;
	close(fd); /* (drops the probe's lock) */
	return r;
}

/* Everything inside the directory fd (closed here), depth levels deep at
 * most; the directory itself stays.  0 or -errno (err). */
static int empty_dir(int fd, unsigned depth, char *err, size_t errlen)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	int r = 0;

	if (!d) {
		r = -errno;
		close(fd);
		snprintf(err, errlen, "opening a directory: %s", strerror(-r));
		return r;
	}
	while (r == 0 && (errno = 0, de = readdir(d))) {
		bool isdir = de->d_type == DT_DIR;
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (de->d_type == DT_UNKNOWN) {
			if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
				r = -errno;
				snprintf(err, errlen, "'%.100s': %s", de->d_name, strerror(-r));
				break;
			}
			isdir = S_ISDIR(st.st_mode);
		}
		if (isdir) {
			int sub;

			if (!depth) {
				snprintf(err, errlen, "directories nested more than %d deep",
					 RM_MAX_DEPTH);
				r = -ELOOP;
				break;
			}
			sub = open_dir(dirfd(d), de->d_name);
			r = sub < 0 ? sub : empty_dir(sub, depth - 1, err, errlen);
			if (r < 0) {
				if (sub < 0)
					snprintf(err, errlen, "'%.100s': %s", de->d_name, strerror(-r));
				break;
			}
		}
		step("unlink-data");
		if (unlinkat(dirfd(d), de->d_name, isdir ? AT_REMOVEDIR : 0) < 0 &&
		    errno != ENOENT) {
			r = -errno;
			snprintf(err, errlen, "removing '%.100s': %s", de->d_name, strerror(-r));
		}
	}
	if (r == 0 && errno) {
		r = -errno;
		snprintf(err, errlen, "reading a directory: %s", strerror(-r));
	}
	closedir(d);
	return r;
}

static int trash_name(char buf[sizeof(STORE_TRASH_PREFIX) + 32])
{
	unsigned char rnd[16];

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EIO;
	memcpy(buf, STORE_TRASH_PREFIX, sizeof(STORE_TRASH_PREFIX) - 1);
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(buf + sizeof(STORE_TRASH_PREFIX) - 1 + 2 * i, 3, "%02x", rnd[i]);
	return 0;
}

struct rm_one {
	int fd;        /* the checkpoint directory, locked; -1 when done */
	char trash[sizeof(STORE_TRASH_PREFIX) + 32];
};

/* Locks names's directory exclusively, checks its owner and renames it
 * into the trash.  0, or -errno with r->err set. */
static int rm_begin(int rootfd, const char *name, uid_t owner, struct rm_one *o,
		    struct store_rm_result *r)
{
	struct stat st;

	o->fd = -1;
	if (!*name || store_is_trash_name(name) || strchr(name, '/') || !strcmp(name, ".") ||
	    !strcmp(name, "..")) {
		snprintf(r->err, sizeof(r->err), "not a checkpoint's name");
		return r->res = -EINVAL;
	}
	step("lock");
	o->fd = open_dir(rootfd, name);
	if (o->fd < 0) {
		r->res = o->fd;
		o->fd = -1;
		snprintf(r->err, sizeof(r->err), "%s", strerror(-r->res));
		return r->res;
	}
	if (fstat(o->fd, &st) < 0) {
		r->res = -errno;
		snprintf(r->err, sizeof(r->err), "%s", strerror(-r->res));
		goto fail;
	}
	if (owner != STORE_NO_OWNER && owner != 0 && st.st_uid != owner) {
		snprintf(r->err, sizeof(r->err), "owned by uid %u, not by uid %u",
			 (unsigned)st.st_uid, (unsigned)owner);
		r->res = -EPERM;
		goto fail;
	}
	if (flock(o->fd, LOCK_EX | LOCK_NB) < 0) {
		r->res = errno == EWOULDBLOCK ? -EBUSY : -errno;
		snprintf(r->err, sizeof(r->err), "%s", r->res == -EBUSY ?
			 "in use (a reader holds its lease): kept" : strerror(-r->res));
		goto fail;
	}
	if (trash_name(o->trash) < 0) {
		snprintf(r->err, sizeof(r->err), "no random bytes for a trash name");
		r->res = -EIO;
		goto fail;
	}
	step("rename");
	if (renameat2(rootfd, name, rootfd, o->trash, RENAME_NOREPLACE) < 0) {
		r->res = -errno;
		snprintf(r->err, sizeof(r->err), "renaming it to the trash: %s",
			 strerror(-r->res));
		goto fail;
	}
	return 0;
fail:
	close(o->fd);
	o->fd = -1;
	return r->res;
}

/* After ROOT's fsync: the manifest goes first (synced), then the lock,
 * then the rest. */
static int rm_finish(int rootfd, struct rm_one *o, struct store_rm_result *r)
{
	int fd;

	step("unlink-manifest");
	if (unlinkat(o->fd, MANIFEST_FILE, 0) < 0 && errno != ENOENT) {
		r->res = -errno;
		snprintf(r->err, sizeof(r->err), "removing its manifest: %s", strerror(-r->res));
		goto out;
	}
	step("fsync-trash");
	if (fsync(o->fd) < 0) {
		r->res = -errno;
		snprintf(r->err, sizeof(r->err), "fsync: %s", strerror(-r->res));
		goto out;
	}
	/* A reader waiting for its lease now finds no manifest. */
	flock(o->fd, LOCK_UN);
	fd = o->fd;
	o->fd = -1;
	r->res = empty_dir(fd, RM_MAX_DEPTH, r->err, sizeof(r->err));
	if (r->res == 0) {
		step("rmdir");
		if (unlinkat(rootfd, o->trash, AT_REMOVEDIR) < 0 && errno != ENOENT) {
			r->res = -errno;
			snprintf(r->err, sizeof(r->err), "removing its directory: %s",
				 strerror(-r->res));
		}
	}
	return r->res;
out:
	close(o->fd);
	o->fd = -1;
	return r->res;
}

long store_local_remove(int rootfd, const char *const *names, size_t n, uid_t owner,
			struct store_rm_result *res)
{
	struct rm_one batch[RM_BATCH];
	long removed = 0;

	for (size_t i = 0; i < n; i++) {
		res[i].res = -ECANCELED;
		snprintf(res[i].err, sizeof(res[i].err), "not reached");
	}
	for (size_t at = 0; at < n; at += RM_BATCH) {
		size_t k = n - at < RM_BATCH ? n - at : RM_BATCH, renamed = 0;

		for (size_t i = 0; i < k; i++) {
			res[at + i].err[0] = '\0';
			res[at + i].res = 0;
			if (rm_begin(rootfd, names[at + i], owner, &batch[i], &res[at + i]) == 0)
				renamed++;
		}
		if (renamed) {
			/* The renames durable before any data goes. */
			step("fsync-root");
			if (fsync(rootfd) < 0) {
				int e = -errno;

				for (size_t i = 0; i < k; i++) {
					if (batch[i].fd < 0)
						continue;
					close(batch[i].fd);
					res[at + i].res = e;
					snprintf(res[at + i].err, sizeof(res[at + i].err),
						 "fsync of the root: %s", strerror(-e));
				}
				return e;
			}
		}
		for (size_t i = 0; i < k; i++) {
			if (batch[i].fd < 0)
				continue;
			if (rm_finish(rootfd, &batch[i], &res[at + i]) == 0)
				removed++;
		}
		if (renamed) {
			step("fsync-root-end");
			(void)fsync(rootfd); /* (a lost rmdir leaves an empty trash dir) */
		}
	}
	return removed;
}

long store_local_trash_sweep(int rootfd, uid_t owner, char *err, size_t errlen)
{
	int fd = dup(rootfd);
	struct dirent *de;
	long removed = 0;
	int r = 0;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		snprintf(err, errlen, "reading the root: %s", strerror(-r));
		return r;
	}
	rewinddir(d);
	while ((errno = 0, de = readdir(d))) {
		struct stat st;
		char e[256];
		int sub;

		if (!store_is_trash_name(de->d_name))
			continue;
		if (fstatat(rootfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode))
			continue; /* not ours to touch */
		if (owner != STORE_NO_OWNER && owner != 0 && st.st_uid != owner)
			continue;
		sub = open_dir(rootfd, de->d_name);
		if (sub < 0) {
			r = sub;
			snprintf(err, errlen, "'%.100s': %s", de->d_name, strerror(-r));
			break;
		}
		/* A removal still running holds the lock: leave it be. */
		if (flock(sub, LOCK_EX | LOCK_NB) < 0) {
			close(sub);
			continue;
		}
		step("sweep-manifest");
		if (unlinkat(sub, MANIFEST_FILE, 0) < 0 && errno != ENOENT) {
			r = -errno;
			snprintf(err, errlen, "'%.100s/%s': %s", de->d_name, MANIFEST_FILE,
				 strerror(-r));
			close(sub);
			break;
		}
		r = empty_dir(sub, RM_MAX_DEPTH, e, sizeof(e));
		if (r == 0 && unlinkat(rootfd, de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
			r = -errno;
			snprintf(e, sizeof(e), "%s", strerror(-r));
		}
		if (r < 0) {
			snprintf(err, errlen, "'%.100s': %s", de->d_name, e);
			break;
		}
		removed++;
	}
	if (r == 0 && errno) {
		r = -errno;
		snprintf(err, errlen, "reading the root: %s", strerror(-r));
	}
	closedir(d);
	if (r == 0 && removed && fsync(rootfd) < 0) {
		r = -errno;
		snprintf(err, errlen, "fsync of the root: %s", strerror(-r));
	}
	return r < 0 ? r : removed;
}
