/* SPDX-License-Identifier: MIT */
/* remove.c - removing local checkpoints crash-safely, and leases (remove.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
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
#include "store/store.h"

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

bool store_is_lease_name(const char *name)
{
	return !strncmp(name, STORE_S3_LEASE_PREFIX, sizeof(STORE_S3_LEASE_PREFIX) - 1);
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

bool store_tombstone_deleting(const char *text, size_t len)
{
	json_t *j;
	const char *phase;
	bool yes;

	if (!store_is_tombstone(text, len))
		return false;
	j = json_loadb(text, len, 0, NULL);
	phase = json_string_value(json_object_get(json_object_get(j, STORE_TOMBSTONE_KEY),
						  "phase"));
	yes = phase && !strcmp(phase, STORE_TOMBSTONE_DELETING);
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
 * most, never into another file system (dev: the checkpoint's); the
 * directory itself stays.  0 or -errno (err). */
static int empty_dir(int fd, dev_t dev, unsigned depth, bool top, char *err, size_t errlen)
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
		/* The marker goes last (rm_dir): a trash directory a crash
		 * left half empty is still known for a removal's. */
		if (top && !strcmp(de->d_name, STORE_RM_MARKER))
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
			if (sub >= 0 && (fstat(sub, &st) < 0 || st.st_dev != dev)) {
				/* A mount point: another file system's files are
				 * not the checkpoint's. */
				close(sub);
				snprintf(err, errlen, "'%.100s' is a mount point (not removed)",
					 de->d_name);
				r = -EXDEV;
				break;
			}
			r = sub < 0 ? sub : empty_dir(sub, dev, depth - 1, false, err, errlen);
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

/*
 * Whether the checkpoint directory fd holds, at most depth levels down
 * and on its own file system, a checkpoint of its own (a directory with a
 * manifest.json) or a save in progress (a work area): 1 with its path
 * (relative to fd) in what, 0 if none, or -errno.  Such a thing is not
 * the checkpoint's to remove: saves refuse a root inside a checkpoint
 * (store.h, root_open), but an older daemon or a hand may have made one.
 */
static int nested_in(int fd, dev_t dev, unsigned depth, char *what, size_t whatlen)
{
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;
	struct dirent *de;
	DIR *d;

	if (dfd < 0)
		return -errno;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	while (r == 0 && (errno = 0, de = readdir(d))) {
		struct stat st;
		int sub;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
			continue;
		if (!strncmp(de->d_name, STORE_WORK_PREFIX, sizeof(STORE_WORK_PREFIX) - 1)) {
			snprintf(what, whatlen, "%s", de->d_name);
			r = 1;
			break;
		}
		sub = open_dir(dirfd(d), de->d_name);
		if (sub == -ENOTDIR || sub == -ENOENT)
			continue; /* not a directory after all, or gone */
		if (sub < 0) {
			r = sub;
			break;
		}
		if (fstat(sub, &st) == 0 && st.st_dev == dev) {
			if (faccessat(sub, MANIFEST_FILE, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
				snprintf(what, whatlen, "%s", de->d_name);
				r = 1;
			} else if (depth) {
				char below[256];

				r = nested_in(sub, dev, depth - 1, below, sizeof(below));
				if (r == 1)
					snprintf(what, whatlen, "%.100s/%.150s", de->d_name, below);
			}
		}
		close(sub);
	}
	if (r == 0 && errno)
		r = -errno;
	closedir(d);
	return r;
}

/* Renames `name` of rootfd to `trash` and checks that the rename, which
 * looked the name up again, moved the directory st describes; if it moved
 * another, that one is put back.  0, -ESTALE (another directory: put
 * back), or -errno of the rename. */
static int rename_checked(int rootfd, const char *name, const char *trash, const struct stat *st)
{
	struct stat moved;

	if (renameat2(rootfd, name, rootfd, trash, RENAME_NOREPLACE) < 0)
		return -errno;
	if (fstatat(rootfd, trash, &moved, AT_SYMLINK_NOFOLLOW) < 0 ||
	    moved.st_dev != st->st_dev || moved.st_ino != st->st_ino) {
		(void)renameat2(rootfd, trash, rootfd, name, RENAME_NOREPLACE);
		return -ESTALE;
	}
	return 0;
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

/* Empties trash directory fd (named name in rootfd; fd is closed here),
 * its marker last, and removes it.  0 or -errno (err). */
static int rm_dir(int rootfd, int fd, const char *name, dev_t dev, char *err, size_t errlen)
{
	int keep = dup(fd), r;

	if (keep < 0) {
		close(fd);
		snprintf(err, errlen, "%s", strerror(errno));
		return -errno;
	}
	r = empty_dir(fd, dev, RM_MAX_DEPTH, true, err, errlen);
	if (r == 0 && unlinkat(keep, STORE_RM_MARKER, 0) < 0 && errno != ENOENT) {
		r = -errno;
		snprintf(err, errlen, "removing the marker: %s", strerror(-r));
	}
	close(keep);
	if (r == 0) {
		step("rmdir");
		if (unlinkat(rootfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
			r = -errno;
			snprintf(err, errlen, "removing its directory: %s", strerror(-r));
		}
	}
	return r;
}

struct rm_one {
	int fd;        /* the checkpoint directory, locked; -1 when done */
	dev_t dev;
	char trash[sizeof(STORE_TRASH_PREFIX) + 32];
};

static int fail(struct store_rm_result *r, int res, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct store_rm_result *r, int res, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->err, sizeof(r->err), fmt, ap);
	va_end(ap);
	return r->res = res;
}

/* Writes the marker naming trash into the directory fd (remove.h). */
static int write_marker(int fd, const char *trash, uid_t uid)
{
	char text[128];
	int mfd, n, r = 0;

	n = snprintf(text, sizeof(text), "trash=%s\nuid=%u\n", trash, (unsigned)uid);
	/* A fresh file (one left by a crash goes first): never through a
	 * link someone planted there. */
	if (unlinkat(fd, STORE_RM_MARKER, 0) < 0 && errno != ENOENT)
		return -errno;
	mfd = openat(fd, STORE_RM_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		     0600);
	if (mfd < 0)
		return -errno;
	if (write(mfd, text, (size_t)n) != n)
		r = errno ? -errno : -EIO;
	close(mfd);
	return r;
}

/* Locks t's directory exclusively, checks it is the one planned and its
 * owner, marks it and renames it into the trash.  0, or -errno with r set. */
static int rm_begin(int rootfd, const struct store_rm_target *t, uid_t owner, struct rm_one *o,
		    struct store_rm_result *r)
{
	const char *name = t->name;
	struct stat st;
	int e;

	o->fd = -1;
	if (!*name || store_is_trash_name(name) || strchr(name, '/') || !strcmp(name, ".") ||
	    !strcmp(name, ".."))
		return fail(r, -EINVAL, "not a checkpoint's name");
	step("lock");
	o->fd = open_dir(rootfd, name);
	if (o->fd < 0) {
		e = o->fd;
		o->fd = -1;
		return fail(r, e, "%s", strerror(-e));
	}
	if (fstat(o->fd, &st) < 0) {
		e = -errno;
		goto out;
	}
	o->dev = st.st_dev;
	if ((t->dev || t->ino) && ((uint64_t)st.st_dev != t->dev || (uint64_t)st.st_ino != t->ino)) {
		fail(r, -ESTALE, "not the checkpoint planned: the name was reused meanwhile (kept)");
		goto close;
	}
	if (owner != STORE_NO_OWNER && owner != 0 && st.st_uid != owner) {
		fail(r, -EPERM, "owned by uid %u, not by uid %u", (unsigned)st.st_uid,
		     (unsigned)owner);
		goto close;
	}
	if (flock(o->fd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK) {
			e = -errno;
			goto out;
		}
		r->in_use = true;
		fail(r, -EBUSY, "in use (a reader holds its lease): kept");
		goto close;
	}
	{
		char what[256] = "";

		e = nested_in(o->fd, o->dev, RM_MAX_DEPTH, what, sizeof(what));
		if (e < 0) {
			fail(r, e, "looking inside it: %s", strerror(-e));
			goto close;
		}
		if (e == 1) {
			fail(r, -ENOTEMPTY, "'%s' inside it is a checkpoint or a save of its own: "
			     "kept whole (move that out, or remove it first)", what);
			goto close;
		}
	}
	if (trash_name(o->trash) < 0) {
		fail(r, -EIO, "no random bytes for a trash name");
		goto close;
	}
	e = write_marker(o->fd, o->trash, owner == STORE_NO_OWNER ? geteuid() : owner);
	if (e < 0) {
		fail(r, e, "writing its removal marker: %s", strerror(-e));
		goto close;
	}
	step("rename");
	/* The directory locked above, or nothing. */
	e = rename_checked(rootfd, name, o->trash, &st);
	if (e == -ESTALE) {
		fail(r, e, "the directory changed under the removal (kept)");
		goto close;
	}
	if (e < 0) {
		fail(r, e, "renaming it to the trash: %s", strerror(-e));
		goto close;
	}
	return 0;
out:
	fail(r, e, "%s", strerror(-e));
close:
	close(o->fd);
	o->fd = -1;
	return r->res;
}

int store_local_discard(int rootfd, const char *name, int expect_fd, uid_t uid, bool now,
			char *err, size_t errlen)
{
	char trash[sizeof(STORE_TRASH_PREFIX) + 32];
	struct stat st;
	int fd = expect_fd >= 0 ? dup(expect_fd) : open_dir(rootfd, name), r;

	if (fd < 0) {
		r = expect_fd >= 0 ? -errno : fd;
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	r = fstat(fd, &st) < 0 ? -errno : trash_name(trash);
	/* The rename comes first and decides: once the name is ours (a trash
	 * name nobody else uses), nothing else can make this directory a
	 * checkpoint, and if another rename came first (a commit), ours finds
	 * nothing and nothing is touched.  Writing the marker before it could
	 * leave the marker inside a checkpoint committed in between. */
	if (r == 0)
		r = rename_checked(rootfd, name, trash, &st);
	if (r == -ESTALE)
		r = -ENOENT; /* (someone else's rename won) */
	if (r < 0) {
		close(fd);
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	/* A crash right here leaves an unmarked trash directory: reported by
	 * the trash sweep, never taken for a checkpoint.  The marker matters
	 * only after a crash: removing now, a marker that cannot be written
	 * (a full disk, most likely when saves fail) does not stop it; left
	 * for the sweep, the directory goes back under its name. */
	r = write_marker(fd, trash, uid);
	if (r < 0 && !now) {
		close(fd);
		snprintf(err, errlen, "writing the removal marker into '%s': %s", trash,
			 strerror(-r));
		(void)renameat2(rootfd, trash, rootfd, name, RENAME_NOREPLACE);
		return r;
	}
	if (!now) {
		close(fd);
		return 0;
	}
	step("discard-data");
	return rm_dir(rootfd, fd, trash, st.st_dev, err, errlen);
}

int store_local_trash(int rootfd, const char *name, uid_t uid, char *err, size_t errlen)
{
	return store_local_discard(rootfd, name, -1, uid, false, err, errlen);
}

/* After ROOT's fsync: the manifest goes (synced), and the lock. */
static int rm_unlist(struct rm_one *o, struct store_rm_result *r)
{
	int e;

	step("unlink-manifest");
	if (unlinkat(o->fd, MANIFEST_FILE, 0) < 0 && errno != ENOENT) {
		e = -errno;
		fail(r, e, "removing its manifest: %s", strerror(-e));
		goto close;
	}
	step("fsync-trash");
	if (fsync(o->fd) < 0) {
		e = -errno;
		fail(r, e, "fsync: %s", strerror(-e));
		goto close;
	}
	/* A reader waiting for its lease now finds no manifest. */
	flock(o->fd, LOCK_UN);
	return 0;
close:
	close(o->fd);
	o->fd = -1;
	return r->res;
}

/* Then the data and the directory (the marker last but one). */
static int rm_finish(int rootfd, struct rm_one *o, struct store_rm_result *r)
{
	int fd = o->fd;

	o->fd = -1;
	r->res = rm_dir(rootfd, fd, o->trash, o->dev, r->err, sizeof(r->err));
	return r->res;
}

long store_local_remove(int rootfd, const struct store_rm_target *t, size_t n, uid_t owner,
			struct store_rm_result *res)
{
	struct rm_one batch[RM_BATCH];
	long removed = 0;

	for (size_t i = 0; i < n; i++) {
		res[i].res = -ECANCELED;
		res[i].in_use = false;
		snprintf(res[i].err, sizeof(res[i].err), "not reached");
	}
	for (size_t at = 0; at < n; at += RM_BATCH) {
		size_t k = n - at < RM_BATCH ? n - at : RM_BATCH, renamed = 0;

		for (size_t i = 0; i < k; i++) {
			res[at + i].err[0] = '\0';
			res[at + i].res = 0;
			if (rm_begin(rootfd, &t[at + i], owner, &batch[i], &res[at + i]) == 0)
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
					fail(&res[at + i], e, "fsync of the root: %s", strerror(-e));
				}
				return e;
			}
		}
		/* Every one of the batch unlisted and unlocked first, so no
		 * reader waits for the others' data to go. */
		for (size_t i = 0; i < k; i++)
			if (batch[i].fd >= 0)
				(void)rm_unlist(&batch[i], &res[at + i]);
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

/* Whether trash directory fd (named name) carries a marker naming it,
 * written by owner (any, for STORE_NO_OWNER or 0). */
static bool marked(int fd, const char *name, uid_t owner)
{
	char text[NAME_MAX + 64], want[NAME_MAX + 16];
	int mfd = openat(fd, STORE_RM_MARKER, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t n;
	unsigned uid;

	if (mfd < 0)
		return false;
	n = read(mfd, text, sizeof(text) - 1);
	close(mfd);
	if (n <= 0)
		return false;
	text[n] = '\0';
	snprintf(want, sizeof(want), "trash=%s\n", name);
	if (strncmp(text, want, strlen(want)) ||
	    sscanf(text + strlen(want), "uid=%u\n", &uid) != 1)
		return false;
	return owner == STORE_NO_OWNER || owner == 0 || uid == (unsigned)owner;
}

static void say(void (*warn)(void *, const char *), void *ud, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void say(void (*warn)(void *, const char *), void *ud, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!warn)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	warn(ud, msg);
}

long store_local_trash_sweep(int rootfd, uid_t owner, void (*warn)(void *ud, const char *msg),
			     void *ud, size_t *ret_problems)
{
	int fd = dup(rootfd);
	struct dirent *de;
	size_t problems = 0;
	long removed = 0;
	int r = 0;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		r = -errno;
		if (fd >= 0)
			close(fd);
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
			continue; /* another user's removal */
		sub = open_dir(rootfd, de->d_name);
		if (sub < 0) {
			say(warn, ud, "'%.100s': %s", de->d_name, strerror(-sub));
			problems++;
			continue;
		}
		/* A removal still running holds the lock: leave it be. */
		if (flock(sub, LOCK_EX | LOCK_NB) < 0) {
			close(sub);
			continue;
		}
		if (!marked(sub, de->d_name, owner)) {
			close(sub);
			/* Empty (a crash just before the last rmdir): nothing to
			 * lose.  Else not ours to judge. */
			if (unlinkat(rootfd, de->d_name, AT_REMOVEDIR) == 0) {
				removed++;
				continue;
			}
			say(warn, ud, "'%.100s' looks like trash but no removal marked it: left "
			    "alone", de->d_name);
			problems++;
			continue;
		}
		step("sweep-manifest");
		if (unlinkat(sub, MANIFEST_FILE, 0) < 0 && errno != ENOENT) {
			say(warn, ud, "'%.100s/%s': %s", de->d_name, MANIFEST_FILE, strerror(errno));
			close(sub);
			problems++;
			continue;
		}
		r = rm_dir(rootfd, sub, de->d_name, st.st_dev, e, sizeof(e));
		if (r < 0) {
			say(warn, ud, "finishing the removal '%.100s': %s", de->d_name, e);
			problems++;
			r = 0;
			continue;
		}
		removed++;
	}
	if (errno)
		r = -errno;
	closedir(d);
	if (removed)
		(void)fsync(rootfd);
	if (ret_problems)
		*ret_problems = problems;
	return r < 0 ? r : removed;
}
