/* SPDX-License-Identifier: MIT */
/* retention.c - ckptd's retention passes (retention.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/retention.h"
#include "daemon/server.h"
#include "store/prune.h"
#include "store/remove.h"
#include "store/s3_addr.h"

#define RET_DIRS_MAX     4096        /* directories remembered for the sweep */
#define RET_OWNERS_MAX   256         /* owners one sweep of a directory covers */
#define RET_MANIFEST_MAX (64u << 20) /* a manifest the daemon reads (its own
				      * are far smaller; a bigger one is a
				      * user's, and not parsed in ckptd) */

/* A directory a pass may cover. */
struct ret_dir {
	char *dir;              /* canonical: a save's root, or a policy's */
	const struct config_retention *rule;
	bool queued;            /* a pass of it waits */
	bool any_owner;         /* the queued pass is a sweep (every owner) */
	struct creds creds;     /* the committer's, for a pass after a commit */
};

struct retention {
	struct ret_dir *dirs;   /* known directories, in the order met */
	size_t n, next;         /* next: where the queue scan resumes */
	bool busy;              /* a pass is on the worker */
	bool full_said;         /* the table's limit was logged */
	volatile bool cancel;   /* stopping: the pass in flight ends soon */
	int64_t last_sweep_ms;
};

struct pass {
	struct work w;
	struct server *srv;
	char *dir;
	const struct ret_policy *policy;
	const volatile bool *cancel;
	bool any_owner;
	uid_t uid;
	struct creds creds;     /* the committer's (a copy: the entry may change) */
	bool gone;              /* the directory is no more: forget it */
	size_t removed, failed, busy, skipped;
	char msg[1024];
};

/* The lowest I/O priority for the calling thread (idle class): a pass
 * takes the disk only when nothing else wants it. */
static void io_idle(void)
{
#ifdef SYS_ioprio_set
	/* IOPRIO_WHO_PROCESS (1), this thread (0), IOPRIO_CLASS_IDLE (3) << 13 */
	(void)syscall(SYS_ioprio_set, 1, 0, 3 << 13);
#endif
}

/* dir (canonical: a save's root was resolved when it began) opened without
 * following any symbolic link: a directory a user swapped for a link since
 * is refused (ELOOP), never followed with the daemon's rights. */
static int open_canonical(const char *dir)
{
	struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
				.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	long fd = syscall(SYS_openat2, AT_FDCWD, dir, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS) {
		/* (kernels before 5.6: the last component at least) */
		fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	return fd < 0 ? -errno : (int)fd;
}

static void pass_warn(void *ud, const char *msg)
{
	struct pass *p = ud;

	log_warn("retention of '%s': %s", p->dir, msg);
}

static void pass_one(struct pass *p, int dirfd, uid_t only)
{
	struct prune_run pr = { .root = p->dir, .policy = p->policy, .only_uid = only,
				.remover = only, .warn = pass_warn, .ud = p,
				.dirfd = dirfd, .dirfd_set = dirfd >= 0,
				.manifest_max = RET_MANIFEST_MAX, .cancel = p->cancel };
	int r = prune_run(&pr);

	if (r == -ECANCELED) {
		/* stopping */
	} else if (r < 0) {
		p->failed++;
		snprintf(p->msg, sizeof(p->msg), "%s", pr.err);
	} else if (pr.plan_res < 0) {
		/* Refused by a safety rule: said, nothing removed. */
		p->failed++;
		snprintf(p->msg, sizeof(p->msg), "%s", pr.err);
	} else {
		p->removed += pr.removed;
		p->failed += pr.failed;
		p->busy += pr.busy;
		p->skipped += pr.skipped;
		for (size_t i = 0; i < pr.n; i++) {
			if (pr.v[i].keep && pr.v[i].why)
				log_info("retention: kept '%s/%s' after all: %s", p->dir,
					 pr.v[i].name, pr.v[i].why); /* pinned since the plan */
			if (pr.v[i].keep)
				continue;
			if (pr.v[i].res == 0)
				log_info("retention: removed '%s/%s' (step %llu, uid %d)", p->dir,
					 pr.v[i].name, (unsigned long long)pr.v[i].rc.step,
					 only == STORE_NO_OWNER ? -1 : (int)only);
			else if (pr.v[i].res != -ECANCELED)
				log_warn("retention: '%s/%s' not removed: %s", p->dir, pr.v[i].name,
					 pr.v[i].why ? pr.v[i].why : strerror(-pr.v[i].res));
		}
	}
	prune_run_free(&pr);
}

/* The owners (and a group of each) of the directories directly in dirfd,
 * at most RET_OWNERS_MAX. */
static size_t owners(int dirfd, uid_t *uids, gid_t *gids)
{
	int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		struct stat st;
		bool seen = false;

		if (de->d_name[0] == '.' ||
		    fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode))
			continue;
		for (size_t i = 0; i < n && !seen; i++)
			seen = uids[i] == st.st_uid;
		if (!seen && n < RET_OWNERS_MAX) {
			uids[n] = st.st_uid;
			gids[n++] = st.st_gid;
		}
	}
	closedir(d);
	return n;
}

/* [worker] */
static void pass_run(struct work *w)
{
	struct pass *p = (struct pass *)w;
	struct creds self;
	int fd;

	io_idle();
	if (s3_is_url(p->dir)) {
		/* S3 keeps no owner: the manifests record whose each is, and a
		 * pass after a commit covers the committer's only. */
		pass_one(p, -1, p->any_owner ? STORE_NO_OWNER : p->uid);
		w->res = p->failed ? -EIO : 0;
		return;
	}
	fd = open_canonical(p->dir);
	if (fd < 0) {
		if (fd == -ENOENT)
			p->gone = true;
		else
			snprintf(p->msg, sizeof(p->msg), "%s", fd == -ELOOP ?
				 "a symbolic link is in its path now: not pruned" : strerror(-fd));
		if (fd != -ENOENT)
			p->failed++;
		w->res = fd == -ENOENT ? 0 : fd;
		return;
	}
	if (!p->any_owner) {
		/* (on this thread as the committer: worker.h) */
		pass_one(p, fd, p->uid);
	} else {
		uid_t uids[RET_OWNERS_MAX];
		gid_t gids[RET_OWNERS_MAX];
		size_t n = owners(fd, uids, gids);

		/* A sweep: each owner's checkpoints apart, with that owner's
		 * rights, so the kernel checks every removal. */
		creds_self(&self);
		for (size_t i = 0; i < n && !*p->cancel; i++) {
			struct creds c = { .uid = uids[i], .gid = gids[i], .umask = 022 };
			char err[256];

			if (creds_apply(&c, err, sizeof(err)) < 0) {
				snprintf(p->msg, sizeof(p->msg), "cannot act as uid %u: %s",
					 (unsigned)uids[i], err);
				p->failed++;
				continue;
			}
			pass_one(p, fd, uids[i]);
		}
		(void)creds_apply(&self, NULL, 0);
	}
	close(fd);
	w->res = p->failed ? -EIO : 0;
}

static void kick(struct server *srv);
static bool rule_is_root(const struct server *srv, const char *dir);

static void forget(struct retention *rt, const char *dir)
{
	for (size_t i = 0; i < rt->n; i++) {
		if (strcmp(rt->dirs[i].dir, dir) || rt->dirs[i].queued)
			continue;
		free(rt->dirs[i].dir);
		rt->dirs[i] = rt->dirs[--rt->n];
		if (rt->next >= rt->n)
			rt->next = 0;
		return;
	}
}

/* [loop] */
static void pass_done(struct work *w)
{
	struct pass *p = (struct pass *)w;
	struct server *srv = p->srv;

	srv->prune_deleted += p->removed;
	srv->prune_errors += p->failed;
	if (w->res < 0 && !p->msg[0])
		snprintf(p->msg, sizeof(p->msg), "%s", w->err);
	if (p->msg[0])
		log_warn("retention of '%s': %s", p->dir, p->msg);
	srv->retention->busy = false;
	/* A directory that is gone is forgotten, unless a policy names it. */
	if (p->gone && !(p->policy && srv->retention && rule_is_root(srv, p->dir)))
		forget(srv->retention, p->dir);
	free(p->dir);
	free(p);
	if (!srv->stopping)
		kick(srv);
}

/* Starts the next queued pass, if none runs. */
static void kick(struct server *srv)
{
	struct retention *rt = srv->retention;

	if (!rt || rt->busy || !rt->n)
		return;
	for (size_t k = 0; k < rt->n; k++) {
		struct ret_dir *d = &rt->dirs[(rt->next + k) % rt->n];
		struct pass *p;

		if (!d->queued)
			continue;
		p = calloc(1, sizeof(*p));
		if (p)
			p->dir = strdup(d->dir);
		if (!p || !p->dir) {
			free(p);
			return; /* tried again at the next commit or tick */
		}
		d->queued = false;
		rt->next = (rt->next + k + 1) % rt->n;
		p->w.run = pass_run;
		p->w.done = pass_done;
		p->srv = srv;
		p->policy = &d->rule->policy;
		p->cancel = &rt->cancel;
		p->any_owner = d->any_owner;
		p->uid = d->creds.uid;
		/* After a commit: as the committer.  A sweep: as each owner
		 * in turn (pass_run). */
		if (!d->any_owner && !s3_is_url(d->dir)) {
			p->creds = d->creds;
			p->w.creds = &p->creds;
		}
		rt->busy = true;
		workers_submit(&srv->prunes, &p->w);
		return;
	}
}

/* The rule whose root is dir or holds it (the deepest), or NULL. */
static const struct config_retention *rule_for(const struct server *srv, const char *dir)
{
	const struct config_retention *best = NULL;
	size_t best_len = 0;

	for (size_t i = 0; i < srv->cfg.n_retention; i++) {
		const struct config_retention *c = &srv->cfg.retention[i];
		size_t l = strlen(c->root);

		while (l > 1 && c->root[l - 1] == '/')
			l--;
		if (s3_is_url(c->root) != s3_is_url(dir))
			continue;
		/* On component boundaries: "/data" covers "/data/x", not
		 * "/database"; "/" covers every path. */
		if (!(l == 1 && c->root[0] == '/') &&
		    (strncmp(dir, c->root, l) || (dir[l] && dir[l] != '/')))
			continue;
		if (!best || l > best_len) {
			best = c;
			best_len = l;
		}
	}
	return best;
}

static bool rule_is_root(const struct server *srv, const char *dir)
{
	for (size_t i = 0; i < srv->cfg.n_retention; i++)
		if (!strcmp(srv->cfg.retention[i].root, dir))
			return true;
	return false;
}

const char *retention_policy_for(const struct server *srv, const char *dir)
{
	const struct config_retention *c = rule_for(srv, dir);

	return c ? c->text : NULL;
}

/* The entry of dir (added if new and there is room), or NULL. */
static struct ret_dir *dir_entry(struct server *srv, const char *dir,
				 const struct config_retention *rule)
{
	struct retention *rt = srv->retention;

	for (size_t i = 0; i < rt->n; i++)
		if (!strcmp(rt->dirs[i].dir, dir))
			return &rt->dirs[i];
	if (rt->n == RET_DIRS_MAX) {
		if (!rt->full_said)
			log_warn("retention: %d directories known: '%s' and any further ones are "
				 "pruned only by ckptctl prune until some are gone", RET_DIRS_MAX,
				 dir);
		rt->full_said = true;
		srv->prune_errors++;
		return NULL;
	}
	memset(&rt->dirs[rt->n], 0, sizeof(rt->dirs[0]));
	rt->dirs[rt->n].dir = strdup(dir);
	if (!rt->dirs[rt->n].dir)
		return NULL;
	rt->dirs[rt->n].rule = rule;
	return &rt->dirs[rt->n++];
}

void retention_after_commit(struct server *srv, const char *dir, const struct creds *creds)
{
	const struct config_retention *rule;
	struct ret_dir *d;

	if (!srv->retention || srv->stopping)
		return;
	rule = rule_for(srv, dir);
	if (!rule)
		return;
	d = dir_entry(srv, dir, rule);
	if (!d)
		return;
	if (d->queued && d->any_owner) {
		/* A sweep of it is queued already: it covers this owner. */
	} else if (d->queued && d->creds.uid != creds->uid) {
		d->any_owner = true; /* two owners waiting: sweep it */
	} else {
		d->creds = *creds;
		d->any_owner = false;
	}
	d->queued = true;
	kick(srv);
}

void retention_sweep_now(struct server *srv)
{
	struct retention *rt = srv->retention;

	if (!rt || srv->stopping)
		return;
	for (size_t i = 0; i < rt->n; i++) {
		rt->dirs[i].queued = true;
		rt->dirs[i].any_owner = true;
	}
	rt->last_sweep_ms = now_ms();
	kick(srv);
}

void retention_tick(struct server *srv, int64_t now)
{
	struct retention *rt = srv->retention;

	if (!rt || !srv->cfg.retention_sweep_ms)
		return;
	if (now - rt->last_sweep_ms >= (int64_t)srv->cfg.retention_sweep_ms)
		retention_sweep_now(srv);
}

int retention_start(struct server *srv)
{
	struct retention *rt;
	int r;

	if (!srv->cfg.n_retention)
		return 0;
	rt = calloc(1, sizeof(*rt));
	if (!rt)
		return -ENOMEM;
	rt->dirs = calloc(RET_DIRS_MAX, sizeof(*rt->dirs));
	if (!rt->dirs) {
		free(rt);
		return -ENOMEM;
	}
	/* One thread at nice 19: a pass yields the CPU to every save. */
	r = workers_start(&srv->prunes, 1, 19);
	if (r < 0) {
		free(rt->dirs);
		free(rt);
		return r;
	}
	rt->last_sweep_ms = srv->start_ms;
	srv->retention = rt;
	/* The directories the policies name come first: no number of other
	 * directories can push them out. */
	for (size_t i = 0; i < srv->cfg.n_retention; i++) {
		(void)dir_entry(srv, srv->cfg.retention[i].root, &srv->cfg.retention[i]);
		log_info("retention of '%s' and below: %s", srv->cfg.retention[i].root,
			 srv->cfg.retention[i].text);
	}
	return 0;
}

void retention_stop(struct server *srv)
{
	struct retention *rt = srv->retention;

	if (!rt)
		return;
	for (size_t i = 0; i < rt->n; i++)
		rt->dirs[i].queued = false;
	rt->cancel = true;          /* the pass in flight stops between checkpoints */
	workers_stop(&srv->prunes);
	for (size_t i = 0; i < rt->n; i++)
		free(rt->dirs[i].dir);
	free(rt->dirs);
	free(rt);
	srv->retention = NULL;
}
