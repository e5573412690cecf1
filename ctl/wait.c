/* SPDX-License-Identifier: MIT */
/*
 * wait.c - ckptctl wait ROOT NAME | ROOT --step N: returns once a
 * checkpoint directly in ROOT is committed, for scripts that act on it
 * (evaluate, copy, resume elsewhere).
 *
 * "Committed" is list's rule (ctl_manifest_judge): a directory (never a
 * symbolic link, never a hidden name, so never a .ckpt-work-* area) whose
 * manifest.json reads and parses.  The commit writes the manifest before
 * it renames the work area into place (S3: the manifest is the commit), so
 * a name seen committed is whole.  Nothing is written; no daemon is asked.
 *
 * Polling, since neither a directory nor a bucket can be watched the same
 * way (and inotify would miss other nodes' commits on a shared file
 * system): at once, then after 0.2 s, doubling up to every 2 s (S3: from
 * 1 s up to every 4 s, as each look costs requests).  So a commit is seen
 * at most a poll interval late.  --step reads each checkpoint's manifest
 * once: it remembers what each one said, and reads it again only when the
 * manifest.json is another file (inode, size or time changed; on S3, a
 * name that left the listing and came back).
 *
 * ROOT must exist when the wait begins and go on existing (exit 1
 * otherwise): a mistyped root must not wait forever.  To wait for the
 * first checkpoint of a job whose directory the daemon has not made yet,
 * make it first (mkdir -p); the daemon saves into an existing directory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl/ctl.h"
#include "format/index.h"
#include "format/names.h"
#include "store/fsutil.h"
#include "store/s3_addr.h"
#include "store/store.h"
#include "store/store_s3.h"

#define POLL_FIRST_S    0.2
#define POLL_MAX_S      2.0
#define POLL_S3_FIRST_S 1.0
#define POLL_S3_MAX_S   4.0

/* What one checkpoint directory's manifest said, for --step. */
struct seen {
	char *name;
	bool here;                  /* in the latest look */
	dev_t dev;                  /* the manifest file (directories) */
	ino_t ino;
	off_t size;
	struct timespec mtime;
	int state;                  /* CTL_CKPT_* */
	uint64_t step;
};

struct waiter {
	const char *root;           /* as given (messages) */
	char base[PATH_MAX];        /* root without trailing '/'; S3: canonical */
	const char *name;           /* NULL: --step */
	uint64_t step;
	bool s3;
	struct seen *v;
	size_t n, cap;
	char why[600];              /* why the last candidate did not count */
	char found[CKPT_MAX_NAME_LEN + 1];
	uint64_t found_step;
};

static void waiter_free(struct waiter *W)
{
	for (size_t i = 0; i < W->n; i++)
		free(W->v[i].name);
	free(W->v);
}

/* The entry of `name`, or a new one (its state unknown), or NULL. */
static struct seen *seen_get(struct waiter *W, const char *name)
{
	struct seen *e;

	for (size_t i = 0; i < W->n; i++)
		if (!strcmp(W->v[i].name, name))
			return &W->v[i];
	if (W->n == W->cap) {
		size_t ncap = W->cap ? 2 * W->cap : 32;
		struct seen *nv = realloc(W->v, ncap * sizeof(*nv));
		if (!nv)
			return NULL;
		W->v = nv;
		W->cap = ncap;
	}
	e = &W->v[W->n];
	memset(e, 0, sizeof(*e));
	e->name = strdup(name);
	if (!e->name)
		return NULL;
	e->state = -1;
	W->n++;
	return e;
}

/* Forgets the names the latest look did not find. */
static void seen_sweep(struct waiter *W)
{
	size_t k = 0;

	for (size_t i = 0; i < W->n; i++) {
		if (!W->v[i].here) {
			free(W->v[i].name);
			continue;
		}
		W->v[i].here = false;
		W->v[k++] = W->v[i];
	}
	W->n = k;
}

/* A committed checkpoint of the wanted name or step: kept if it is the
 * first by name (several of one step: the answer does not depend on the
 * order of a directory). */
static void candidate(struct waiter *W, const char *name, uint64_t step)
{
	size_t n = strlen(name);

	if (n >= sizeof(W->found) || (W->found[0] && strcmp(name, W->found) >= 0))
		return;
	memcpy(W->found, name, n + 1);
	W->found_step = step;
}

/* Judges the manifest text of checkpoint `name` (r: the read's result).
 * Returns its CTL_CKPT_* state with *ret_step, or -ENOMEM. */
static int judge(struct waiter *W, const char *name, int r, char *text, size_t len,
		 uint64_t *ret_step)
{
	char err[512] = "";
	struct manifest m;
	int st;

	st = ctl_manifest_judge(r, text, len, &m, err, sizeof(err));
	if (st < 0)
		return st;
	if (st == CTL_CKPT_COMMITTED) {
		*ret_step = m.step;
		manifest_free(&m);
	} else if (W->name) {
		/* (--step: some other checkpoint may be the corrupt one.) */
		snprintf(W->why, sizeof(W->why), "'%s' is there but not committed: %s", name, err);
	}
	return st;
}

/* ---- directories ---- */

/* A read error of a manifest that no later look can mend (permissions, an
 * I/O error) ends the wait; one that says "not a manifest" does not. */
static bool read_fatal(int r)
{
	return r < 0 && r != -ENOENT && r != -EFBIG && r != -EINVAL && r != -EISDIR &&
	       r != -ELOOP;
}

/* Opens checkpoint directory `name` of rootfd: the fd, -ENOENT when it is
 * not a directory there (yet), or -errno. */
static int open_ckpt_dir(int rootfd, const char *name)
{
	int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0 && (errno == ENOTDIR || errno == ELOOP))
		return -ENOENT; /* a file or a symlink: never a checkpoint */
	return fd < 0 ? -errno : fd;
}

static int look_dir_name(struct waiter *W, int rootfd)
{
	char *text = NULL;
	size_t len = 0;
	uint64_t step;
	int cfd, r;

	cfd = open_ckpt_dir(rootfd, W->name);
	if (cfd == -ENOENT)
		return 0;
	if (cfd < 0) {
		ctl_err("wait: '%s/%s': %s", W->root, W->name, strerror(-cfd));
		return cfd;
	}
	r = fs_read_file_at(cfd, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len);
	close(cfd);
	if (r == -ENOENT) {
		snprintf(W->why, sizeof(W->why), "'%s' is there but has no %s", W->name,
			 MANIFEST_FILE);
		return 0;
	}
	if (read_fatal(r) || r == -ENOMEM) {
		ctl_err("wait: reading '%s/%s/%s': %s", W->root, W->name, MANIFEST_FILE,
			strerror(-r));
		return r;
	}
	r = judge(W, W->name, r, text, len, &step);
	if (r < 0)
		return r;
	if (r == CTL_CKPT_COMMITTED)
		candidate(W, W->name, step);
	return 0;
}

/* One checkpoint directory of the root, for --step: its manifest read
 * again only if it is not the file read last time. */
static int look_dir_entry(struct waiter *W, int rootfd, const char *name)
{
	struct stat st;
	struct seen *e;
	char *text = NULL;
	size_t len = 0;
	int cfd, r;

	cfd = open_ckpt_dir(rootfd, name);
	if (cfd < 0) {
		if (cfd != -ENOENT)
			snprintf(W->why, sizeof(W->why), "'%s': %s", name, strerror(-cfd));
		return 0;
	}
	if (fstatat(cfd, MANIFEST_FILE, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		close(cfd);
		return 0; /* no manifest: a container or an incomplete copy */
	}
	e = seen_get(W, name);
	if (!e) {
		close(cfd);
		return -ENOMEM;
	}
	e->here = true;
	if (e->state < 0 || e->dev != st.st_dev || e->ino != st.st_ino || e->size != st.st_size ||
	    e->mtime.tv_sec != st.st_mtim.tv_sec || e->mtime.tv_nsec != st.st_mtim.tv_nsec) {
		r = fs_read_file_at(cfd, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len);
		if (r == -ENOENT || r == -ENOMEM || read_fatal(r)) {
			close(cfd);
			if (r == -ENOENT)
				return 0; /* removed since the stat */
			ctl_err("wait: reading '%s/%s/%s': %s", W->root, name, MANIFEST_FILE,
				strerror(-r));
			return r;
		}
		r = judge(W, name, r, text, len, &e->step);
		if (r < 0) {
			close(cfd);
			return r;
		}
		e->state = r;
		e->dev = st.st_dev;
		e->ino = st.st_ino;
		e->size = st.st_size;
		e->mtime = st.st_mtim;
	}
	close(cfd);
	if (e->state == CTL_CKPT_COMMITTED && e->step == W->step)
		candidate(W, name, e->step);
	return 0;
}

/* One look at a directory root: 1 found, 0 not yet, -errno (printed). */
static int look_dir(struct waiter *W)
{
	struct dirent *de;
	DIR *d;
	int rootfd, r = 0;

	rootfd = open(W->base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		int e = errno;
		ctl_err(e == ENOENT ? "wait: root '%s' does not exist (any more)" :
				      "wait: cannot open root '%s': %s",
			W->root, strerror(e));
		return -e;
	}
	if (W->name) {
		r = look_dir_name(W, rootfd);
		close(rootfd);
		return r < 0 ? r : W->found[0] != '\0';
	}
	d = fdopendir(rootfd);
	if (!d) {
		r = -errno;
		close(rootfd);
		ctl_err("wait: cannot read root '%s': %s", W->root, strerror(-r));
		return r;
	}
	while ((errno = 0, de = readdir(d)) != NULL) {
		/* Hidden (".", "..", work areas, pins) or another name the
		 * daemon never gives a checkpoint. */
		if (!name_checkpoint_ok(de->d_name, NULL, 0))
			continue;
		r = look_dir_entry(W, dirfd(d), de->d_name);
		if (r < 0)
			break;
	}
	if (r == 0 && errno) {
		r = -errno;
		ctl_err("wait: reading root '%s': %s", W->root, strerror(-r));
	}
	closedir(d);
	if (r == -ENOMEM)
		ctl_err("wait: out of memory");
	if (r < 0)
		return r;
	seen_sweep(W);
	return W->found[0] != '\0';
}

/* ---- S3 ---- */

/* GETs and judges checkpoint `name`'s manifest: its CTL_CKPT_* state with
 * *ret_step, -ENOENT (no manifest), or -errno (printed). */
static int s3_manifest(struct waiter *W, const char *name, uint64_t *ret_step)
{
	char url[PATH_MAX + CKPT_MAX_NAME_LEN + 2], err[768] = "";
	char *text = NULL;
	size_t len = 0;
	int r;

	snprintf(url, sizeof(url), "%s/%s", W->base, name);
	r = store_s3_get(url, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len, err, sizeof(err));
	if (r == -ENOENT)
		return r;
	if (r == -EACCES) {
		ctl_s3_denied(url, err);
		return r;
	}
	if (r < 0 && r != -EFBIG) {
		ctl_err("wait: cannot read '%s/%s': %s", url, MANIFEST_FILE,
			err[0] ? err : strerror(-r));
		return r;
	}
	r = judge(W, name, r, text, len, ret_step);
	if (r == -ENOMEM)
		ctl_err("wait: out of memory");
	return r;
}

static int s3_entry(void *ud, const char *name, enum store_entry kind)
{
	struct waiter *W = ud;
	struct seen *e;

	/* Hidden names (work areas) and plain objects are never one. */
	if (kind != STORE_ENTRY_CHECKPOINT || name[0] == '.' || !name_checkpoint_ok(name, NULL, 0))
		return 0;
	e = seen_get(W, name);
	if (!e)
		return -ENOMEM;
	e->here = true;
	return 0;
}

/* One look at an S3 root: 1 found, 0 not yet, -errno (printed). */
static int look_s3(struct waiter *W)
{
	uint64_t step;
	int r;

	if (W->name) {
		r = s3_manifest(W, W->name, &step);
		if (r == -ENOENT)
			return 0;
		if (r < 0)
			return r;
		if (r == CTL_CKPT_COMMITTED)
			candidate(W, W->name, step);
		return W->found[0] != '\0';
	}
	/* The listing tells which names hold a manifest.json; only those
	 * not judged before are read (a manifest is PUT once, exclusively). */
	r = store_s3.list(W->base, "", s3_entry, W);
	if (r < 0) {
		ctl_err(r == -ENOMEM ? "wait: out of memory" : "wait: listing '%s': %s", W->root,
			strerror(-r));
		return r;
	}
	seen_sweep(W);
	for (size_t i = 0; i < W->n; i++) {
		struct seen *e = &W->v[i];
		if (e->state < 0) {
			r = s3_manifest(W, e->name, &e->step);
			if (r == -ENOENT)
				continue; /* removed since the listing: asked again next time */
			if (r < 0)
				return r;
			e->state = r;
		}
		if (e->state == CTL_CKPT_COMMITTED && e->step == W->step)
			candidate(W, e->name, e->step);
	}
	return W->found[0] != '\0';
}

/* ---- the command ---- */

static int wait_setup(struct waiter *W)
{
	if (W->s3) {
		struct s3_loc loc;
		char err[512] = "";

		if (s3_url_parse(W->root, &loc, err, sizeof(err)) < 0) {
			ctl_err("wait: '%s': %s", W->root, err);
			return -EINVAL;
		}
		if (s3_url_format(&loc, W->base, sizeof(W->base)) < 0) {
			ctl_err("wait: '%s': too long", W->root);
			return -ENAMETOOLONG;
		}
		if (ctl_s3_start(W->root) < 0)
			return -EINVAL;
		/* A missing bucket or refused credentials fail now, in S3's
		 * words; an empty prefix is only a root nothing saved to yet. */
		return ctl_s3_probe(W->root, &loc) < 0 ? -EIO : 0;
	}
	size_t n = strlen(W->root);
	struct stat st;

	while (n > 1 && W->root[n - 1] == '/')
		n--;
	if (n >= sizeof(W->base)) {
		ctl_err("wait: root '%s' is too long", W->root);
		return -ENAMETOOLONG;
	}
	memcpy(W->base, W->root, n);
	W->base[n] = '\0';
	if (stat(W->base, &st) < 0) {
		int e = errno;
		ctl_err(e == ENOENT ? "wait: root '%s' does not exist" : "wait: root '%s': %s",
			W->root, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		ctl_err("wait: root '%s' is not a directory", W->root);
		return -ENOTDIR;
	}
	return 0;
}

static int wait_print(const struct waiter *W, bool json)
{
	char path[sizeof(W->base) + sizeof(W->found) + 1];
	char *shown = ctl_display(W->found);
	int r = 0;

	if (!shown) {
		ctl_err("wait: out of memory");
		return CTL_EXIT_ERROR;
	}
	snprintf(path, sizeof(path), "%s%s%s", W->base, strcmp(W->base, "/") ? "/" : "", shown);
	if (json) {
		char *p = ctl_display(path);
		json_t *o = p ? json_pack("{s:s, s:I, s:s}", "name", shown, "step",
					  (json_int_t)W->found_step, "path", p) : NULL;
		r = o ? ctl_json_line(o) : -ENOMEM;
		json_decref(o);
		free(p);
	} else {
		printf("%s\n", shown);
	}
	free(shown);
	if (r < 0) {
		ctl_err("wait: out of memory");
		return CTL_EXIT_ERROR;
	}
	return 0;
}

int ctl_wait(const char *root, const char *name, uint64_t step, double timeout_s, bool json)
{
	struct waiter W = { .root = root, .name = name, .step = step, .s3 = s3_is_url(root) };
	double start = ctl_mono_now(), deadline = timeout_s < 0 ? INFINITY : start + timeout_s;
	double every = W.s3 ? POLL_S3_FIRST_S : POLL_FIRST_S;
	double most = W.s3 ? POLL_S3_MAX_S : POLL_MAX_S;
	char err[256], what[CKPT_MAX_NAME_LEN + 64], took[32];
	int r, ret = CTL_EXIT_ERROR;

	if (name && !name_checkpoint_ok(name, err, sizeof(err))) {
		ctl_err("wait: %s", err);
		return CTL_EXIT_USAGE;
	}
	if (wait_setup(&W) < 0)
		return CTL_EXIT_ERROR;
	for (;;) {
		r = W.s3 ? look_s3(&W) : look_dir(&W);
		if (r < 0)
			goto out;
		if (r > 0) {
			ret = wait_print(&W, json);
			goto out;
		}
		double now = ctl_mono_now(), next = now + every;
		if (now >= deadline)
			break;
		ctl_sleep_until(next < deadline ? next : deadline);
		every = every * 2 < most ? every * 2 : most;
	}
	if (name)
		snprintf(what, sizeof(what), "checkpoint '%s'", name);
	else
		snprintf(what, sizeof(what), "checkpoint of step %llu", (unsigned long long)step);
	if (timeout_s == 0)
		snprintf(took, sizeof(took), "looked once");
	else
		ctl_human_duration(timeout_s, took, sizeof(took));
	ctl_err("wait: timed out (%s): no committed %s in '%s'%s%s%s", took, what, root,
		W.why[0] ? " (" : "", W.why, W.why[0] ? ")" : "");
	ret = CTL_EXIT_TIMEOUT;
out:
	waiter_free(&W);
	return ret;
}
