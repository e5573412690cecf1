/* SPDX-License-Identifier: MIT */
/*
 * gc.c - ckptctl gc ROOT: gives back the space of saves that will never
 * commit.  What it removes carries our own marker and is older than the
 * grace period:
 *
 *   .ckpt-work-<32 hex>   a save's work area (and .partial-* of older
 *                         daemons) in which nothing changed for the grace
 *                         period: the save died (a live one writes, and
 *                         fails at the daemon's commit deadline long before)
 *   .ckpt-trash-*         a removal a crash cut short (remove.h)
 *
 * A work area is first renamed into the trash, atomically: if the daemon
 * commits it at that moment (renames it to the checkpoint's name), one of
 * the two renames fails and nothing committed is touched.  Anything else
 * -- a directory of shard files without a manifest, a corrupt checkpoint --
 * is reported, never removed.  The walk goes 8 levels deep (the daemon's
 * per-job directories), never through symbolic links and never into a
 * checkpoint.  Only the caller's own directories are removed (any, for
 * root).  On S3 (no owners: the credentials decide) a work area's age is
 * that of its last activity: its newest object, the heartbeat each daemon
 * of a live save renews every s3_heartbeat included, by S3's own clock.  A
 * dead one goes with the attempt's unfinished multipart uploads and, unless
 * a manifest names a checkpoint there, its tagged shards
 * (store_s3_gc_work).  Then every unfinished multipart upload under the
 * root is listed and reported: one of our shards whose work area is gone,
 * older than the grace period, is aborted; one whose work area is there is
 * kept; any other is reported only (store_s3_gc_uploads).  And readers'
 * leases (remove.h) under a prefix that holds no checkpoint, ended more
 * than the grace period ago (store_s3_gc_lease).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "format/index.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store.h"
#include "store/store_s3.h"

#define GC_DEPTH      8
#define GC_AGE_DEPTH  4 /* levels inside a work area searched for its newest change */

struct gc {
	int64_t grace_s;
	bool dry_run, json;
	time_t now;
	size_t removed, would, young, unknown, failed, foreign;
	long long open_uploads;      /* S3: multipart uploads found (-1: not S3) */
};

static bool is_work(const char *name)
{
	size_t n = sizeof(STORE_WORK_PREFIX) - 1;

	if (!strncmp(name, ".partial-", 9))
		return true;
	if (strncmp(name, STORE_WORK_PREFIX, n) || strlen(name) != n + STORE_ID_LEN)
		return false;
	for (size_t i = n; name[i]; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
			return false;
	return true;
}

/* The newest modification time of dir fd and what it holds (mtime: the
 * daemon's writes move it; ctime could not be aged by a test). */
static time_t newest(int fd, unsigned depth)
{
	struct stat st;
	struct dirent *de;
	time_t t = 0;
	DIR *d;

	if (fstat(fd, &st) == 0)
		t = st.st_mtime;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return t;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (st.st_mtime > t)
			t = st.st_mtime;
		if (S_ISDIR(st.st_mode) && depth) {
			int sub = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			time_t s = sub >= 0 ? newest(sub, depth - 1) : 0;

			if (s > t)
				t = s;
		}
	}
	closedir(d);
	return t;
}

static void say(struct gc *g, const char *rel, const char *action, const char *why,
		long long age_s)
{
	char *shown = ctl_display(rel);

	if (!shown)
		return;
	if (g->json) {
		json_t *o = json_pack("{s:s, s:s, s:s}", "path", shown, "action", action, "why",
				      why);

		if (o && age_s >= 0)
			json_object_set_new(o, "age_s", json_integer(age_s));
		if (o)
			(void)ctl_json_line(o);
		json_decref(o);
	} else {
		printf("%-8s  %s  (%s)\n", action, shown, why);
	}
	free(shown);
}

static void gc_warn(void *ud, const char *msg)
{
	(void)ud;
	ctl_err("gc: %s", msg);
}

static void walk(struct gc *g, int dfd, const char *rel, unsigned depth)
{
	int fd = dup(dfd);
	struct dirent *de;
	bool trashed = false;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		say(g, rel[0] ? rel : ".", "ERROR", strerror(errno), -1);
		g->failed++;
		return;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		char child[PATH_MAX], why[128];
		struct stat st;
		int sub;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) >=
		    (int)sizeof(child))
			continue;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
			continue;
		if (store_is_trash_name(de->d_name)) {
			trashed = true;
			continue; /* the sweep below */
		}
		sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0)
			continue;
		if (is_work(de->d_name)) {
			int dup_fd = dup(sub);
			time_t t = dup_fd >= 0 ? newest(dup_fd, GC_AGE_DEPTH) : g->now;
			long long age = (long long)(g->now - t);

			close(sub);
			if (age < g->grace_s) {
				snprintf(why, sizeof(why), "a save's work area, changed %llds ago: "
					 "within the grace period", age);
				say(g, child, "KEEP", why, age);
				g->young++;
			} else if (geteuid() != 0 && st.st_uid != geteuid()) {
				snprintf(why, sizeof(why), "a dead save's work area, but uid %u's",
					 (unsigned)st.st_uid);
				say(g, child, "SKIP", why, age);
				g->foreign++;
			} else if (g->dry_run) {
				say(g, child, "REMOVE", "a dead save's work area", age);
				g->would++;
			} else {
				char err[256];
				int r = store_local_trash(dfd, de->d_name, geteuid(), err,
							  sizeof(err));

				if (r == -ENOENT)
					continue; /* committed or removed meanwhile */
				if (r < 0) {
					say(g, child, "FAILED", err, age);
					g->failed++;
					continue;
				}
				say(g, child, "REMOVED", "a dead save's work area", age);
				trashed = true;
				g->removed++;
			}
			continue;
		}
		if (faccessat(sub, MANIFEST_FILE, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
			close(sub);
			continue; /* a checkpoint: prune's, never gc's */
		}
		if (de->d_name[0] != '.' && depth) {
			/* Shard files and no manifest: not ours to judge. */
			struct dirent *e;
			DIR *sd;
			bool shards = false;
			int look = dup(sub);

			if (look >= 0 && (sd = fdopendir(look))) {
				while (!shards && (e = readdir(sd)))
					shards = !strncmp(e->d_name, "rank-", 5);
				closedir(sd);
			} else if (look >= 0) {
				close(look);
			}
			if (shards) {
				say(g, child, "UNKNOWN",
				    "shard files without a manifest: reported, never removed", -1);
				g->unknown++;
			} else {
				walk(g, sub, child, depth - 1);
			}
		}
		close(sub);
	}
	closedir(d);
	if (trashed && !g->dry_run) {
		size_t problems = 0;
		long n = store_local_trash_sweep(dfd, geteuid(), gc_warn, g, &problems);

		if (n < 0) {
			say(g, rel[0] ? rel : ".", "FAILED", strerror((int)-n), -1);
			g->failed++;
		}
		g->unknown += problems;
	}
}

/* ---- S3 roots ---- */

struct s3_level {
	struct gc *g;
	const char *root;
	const char *rel;
	unsigned depth;
	char **sub;          /* names to search below (OTHER entries) */
	size_t n_sub;
	int res;
};

/* Says and counts what became of S3 entry `child` by a gc step's result
 * r: 0 kept (young: keep_why), 1 removed (removed_why), -EBADMSG not ours
 * (err), else failed (err). */
static void s3_result(struct gc *g, const char *child, int r, int64_t age, const char *keep_why,
		      const char *removed_why, const char *err)
{
	if (r == 0) {
		say(g, child, "KEEP", keep_why, age);
		g->young++;
	} else if (r == 1) {
		say(g, child, g->dry_run ? "REMOVE" : "REMOVED", removed_why, age);
		if (g->dry_run)
			g->would++;
		else
			g->removed++;
	} else if (r == -EBADMSG) {
		say(g, child, "UNKNOWN", err, -1);
		g->unknown++;
	} else {
		say(g, child, "FAILED", err, -1);
		g->failed++;
	}
}

static int s3_entry(void *ud, const char *name, enum store_entry kind)
{
	struct s3_level *L = ud;
	struct gc *g = L->g;
	char child[PATH_MAX], dir[PATH_MAX + 1100], err[512], why[160];
	int64_t age = -1;
	int r;

	snprintf(child, sizeof(child), "%s%s%s", L->rel, L->rel[0] ? "/" : "", name);
	if (kind == STORE_ENTRY_WORK) {
		if (!is_work(name) || !strncmp(name, ".partial-", 9))
			return 0;
		snprintf(dir, sizeof(dir), "%s%s%s", L->root, L->rel[0] ? "/" : "", L->rel);
		r = store_s3_gc_work(dir, name + sizeof(STORE_WORK_PREFIX) - 1, g->grace_s,
				     g->dry_run, &age, err, sizeof(err));
		if (r == -ENOENT)
			return 0; /* committed or cleaned up meanwhile */
		snprintf(why, sizeof(why), "a save's work area, last active %llds ago: within the "
			 "grace period", (long long)age);
		s3_result(g, child, r, age, why,
			  "a dead save's work area (its uploads and tagged shards too)", err);
		return 0;
	}
	if (kind == STORE_ENTRY_FILE && L->rel[0] &&
	    store_is_lease_name(name)) {
		/* A reader's lease in a prefix that holds no checkpoint (a
		 * checkpoint's own prefix is not walked into): left by a
		 * reader that crashed. */
		snprintf(dir, sizeof(dir), "%s/%s", L->root, L->rel);
		r = store_s3_gc_lease(dir, name, g->grace_s, g->dry_run, &age, err, sizeof(err));
		s3_result(g, child, r, age, age < 0 ? "a reader's lease, live" :
			  "a reader's lease under no checkpoint, ended within the grace period",
			  "a dead reader's lease under no checkpoint", err);
		return 0;
	}
	if (kind == STORE_ENTRY_OTHER && L->depth && name[0] != '.') {
		char **v = realloc(L->sub, (L->n_sub + 1) * sizeof(*v));

		if (!v || !(v[L->n_sub] = strdup(name))) {
			if (v)
				L->sub = v;
			return L->res = -ENOMEM;
		}
		L->sub = v;
		L->n_sub++;
	}
	return 0; /* checkpoints are prune's; files are not looked into */
}

static void walk_s3(struct gc *g, const char *root, const char *rel, unsigned depth)
{
	struct s3_level L = { g, root, rel, depth, NULL, 0, 0 };
	int r = store_s3.list(root, rel, s3_entry, &L);

	if (r < 0 || L.res < 0) {
		say(g, rel[0] ? rel : ".", "ERROR", strerror(-(r < 0 ? r : L.res)), -1);
		g->failed++;
	}
	for (size_t i = 0; i < L.n_sub; i++) {
		char child[PATH_MAX];

		if (!g->failed || r >= 0) {
			snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "", L.sub[i]);
			walk_s3(g, root, child, depth - 1);
		}
		free(L.sub[i]);
	}
	free(L.sub);
}

static void upload_seen(void *ud, const char *rel, const char *action, const char *why,
			int64_t age_s)
{
	struct gc *g = ud;

	say(g, rel, action, why, age_s);
	if (!strcmp(action, "REMOVE"))
		g->would++;
	else if (!strcmp(action, "REMOVED"))
		g->removed++;
	else if (!strcmp(action, "KEEP"))
		g->young++;
	else if (!strcmp(action, "UNKNOWN"))
		g->unknown++;
	else
		g->failed++;
}

int ctl_gc(const char *root, int64_t grace_s, bool dry_run, bool json)
{
	struct gc g = { .grace_s = grace_s, .dry_run = dry_run, .json = json,
			.now = time(NULL), .open_uploads = -1 };
	int fd;

	if (s3_is_url(root)) {
		char err[512];
		int n;

		if (ctl_s3_start(root) < 0)
			return CTL_EXIT_ERROR;
		walk_s3(&g, root, "", GC_DEPTH);
		/* Then every upload still open (a live save's, one whose work
		 * area is gone after a crash or an abort that failed, one whose
		 * Create answer was lost, another tool's): each is reported. */
		n = store_s3_gc_uploads(root, grace_s, dry_run, upload_seen, &g, err, sizeof(err));
		if (n < 0) {
			say(&g, ".", "ERROR", err, -1);
			g.failed++;
		} else {
			g.open_uploads = n;
		}
		goto summary;
	}
	fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		ctl_err("gc: cannot open root '%s': %s", root, strerror(errno));
		return CTL_EXIT_ERROR;
	}
	walk(&g, fd, "", GC_DEPTH);
	close(fd);
summary:
	if (json) {
		json_t *o = json_pack("{s:{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}", "summary",
				      "root", root, "dry_run", dry_run, "grace_s",
				      (json_int_t)grace_s, "removed", (json_int_t)g.removed,
				      "would_remove", (json_int_t)g.would, "kept_young",
				      (json_int_t)g.young, "unknown", (json_int_t)g.unknown,
				      "not_yours", (json_int_t)g.foreign, "failed",
				      (json_int_t)g.failed);

		if (o && g.open_uploads >= 0)
			json_object_set_new(json_object_get(o, "summary"), "open_uploads",
					    json_integer(g.open_uploads));
		if (o)
			(void)ctl_json_line(o);
		json_decref(o);
	} else {
		char ups[64] = "";

		if (g.open_uploads >= 0)
			snprintf(ups, sizeof(ups), "; %lld unfinished multipart upload%s found",
				 g.open_uploads, g.open_uploads == 1 ? "" : "s");
		printf("%s: %zu leftover%s %s, %zu within the grace period, %zu unknown "
		       "(reported only), %zu not yours, %zu failed%s\n", dry_run ? "dry run" : "gc",
		       dry_run ? g.would : g.removed, (dry_run ? g.would : g.removed) == 1 ? "" : "s",
		       dry_run ? "would be removed" : "removed", g.young, g.unknown, g.foreign,
		       g.failed, ups);
	}
	return g.failed ? CTL_EXIT_ERROR : 0;
}
