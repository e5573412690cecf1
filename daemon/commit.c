/* SPDX-License-Identifier: MIT */
/*
 * commit.c - saves, their ranks, and the atomic commit.
 *
 * Every rank writes <root>/.partial-<name>-<job>/rank-NNNNN.safetensors.
 * When its last extent is written: truncate (the tail was padded for
 * O_DIRECT) -> fsync -> write rank-NNNNN.index.json (fsync, atomic rename).
 * The daemon of rank 0 (the coordinator) then waits until all `world`
 * indexes are in the work directory, merges them into manifest.json, and:
 *
 *   fsync manifest.json -> fsync the work dir -> rename the work dir to
 *   <root>/<name> (RENAME_NOREPLACE) -> fsync <root>
 *
 * Each fsync comes before the step that makes its data reachable: after a
 * crash, a visible <root>/<name> always has a complete manifest and complete
 * shards; anything less is still a .partial directory, which the sweep
 * removes.  Ranks on other daemons (nodes sharing the root) learn of the
 * commit by seeing <root>/<name>/manifest.json with their job, and of a
 * failure by the "failed" marker the failing daemon leaves in the work dir
 * (or the work dir disappearing).  No daemon talks to another.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/fsutil.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "format/index.h"

#define FAILED_MARKER "failed"

static struct save *find_save(struct server *srv, const char *job, const char *name)
{
	for (struct list *p = srv->saves.next; p != &srv->saves; p = p->next) {
		struct save *s = list_entry(p, struct save, link);
		if (!strcmp(s->job, job) && !strcmp(s->name, name))
			return s;
	}
	return NULL;
}

static bool stat_age_ms(int dirfd, const char *name, int64_t *ret_age)
{
	struct stat st;
	struct timespec now;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	*ret_age = ((int64_t)now.tv_sec - st.st_mtim.tv_sec) * 1000 +
		   ((int64_t)now.tv_nsec - st.st_mtim.tv_nsec) / 1000000;
	return true;
}

/* The failure another daemon recorded for this save, if any (and recent:
 * an old marker belongs to an earlier attempt the sweep has not removed). */
static bool read_marker(struct save *s, char *msg, size_t len)
{
	int64_t age;
	char *text;
	size_t n;

	if (s->workfd < 0 || !stat_age_ms(s->workfd, FAILED_MARKER, &age) ||
	    age > (int64_t)s->srv->cfg.commit_deadline_ms)
		return false;
	if (fs_read_file_at(s->workfd, FAILED_MARKER, 4096, &text, &n) < 0)
		return false;
	snprintf(msg, len, "%s", n ? text : "another daemon failed the save");
	free(text);
	return true;
}

static struct save *save_new(struct server *srv, struct client *c, const struct layout *l,
			     char *err, size_t errlen, int *ret_err)
{
	char canon[PATH_MAX];
	struct save *s;
	int64_t age;
	int r;

	if (!config_root_allowed(&srv->cfg, l->root)) {
		snprintf(err, errlen, "root '%s' is not inside an allowed root of this ckptd",
			 l->root);
		*ret_err = -EACCES;
		return NULL;
	}
	r = fs_mkdir_p(l->root, srv->euid_root && c->uid != 0, c->uid, c->gid);
	if (r < 0) {
		snprintf(err, errlen, "cannot create root '%s': %s", l->root, strerror(-r));
		*ret_err = r;
		return NULL;
	}
	/* Symlinks below an allowed root must not lead out of it. */
	if (!realpath(l->root, canon) || !config_root_allowed(&srv->cfg, canon)) {
		snprintf(err, errlen, "root '%s' resolves outside the allowed roots", l->root);
		*ret_err = -EACCES;
		return NULL;
	}

	s = calloc(1, sizeof(*s));
	if (!s || !(s->root = strdup(canon))) {
		free(s);
		*ret_err = -ENOMEM;
		return NULL;
	}
	s->srv = srv;
	s->workfd = -1;
	list_init(&s->ranks);
	snprintf(s->job, sizeof(s->job), "%s", c->job);
	snprintf(s->name, sizeof(s->name), "%s", l->name);
	snprintf(s->work, sizeof(s->work), ".partial-%s-%s", l->name, c->job);
	s->world = c->world;
	s->started_ms = now_ms();
	s->deadline_ms = s->started_ms + (int64_t)srv->cfg.commit_deadline_ms;

	s->rootfd = open(canon, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->rootfd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open root '%s': %s", canon, strerror(errno));
		goto fail;
	}
	if (faccessat(s->rootfd, s->name, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		r = -EEXIST;
		snprintf(err, errlen, "checkpoint '%s/%s' already exists", canon, s->name);
		goto fail;
	}
	/* A work dir older than the deadline cannot belong to a live attempt
	 * (that one would have failed by now): it is a crash's leftover. */
	if (stat_age_ms(s->rootfd, s->work, &age) && age > (int64_t)srv->cfg.commit_deadline_ms) {
		log_info("removing stale work directory '%s/%s'", canon, s->work);
		fs_rm_rf_at(s->rootfd, s->work);
	}
	if (mkdirat(s->rootfd, s->work, 0755) == 0) {
		if (srv->euid_root && c->uid != 0 &&
		    fchownat(s->rootfd, s->work, c->uid, c->gid, AT_SYMLINK_NOFOLLOW) < 0)
			log_warn("chown '%s/%s': %s", canon, s->work, strerror(errno));
	} else if (errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "cannot create '%s/%s': %s", canon, s->work, strerror(errno));
		goto fail;
	}
	s->workfd = openat(s->rootfd, s->work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s->workfd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open '%s/%s': %s", canon, s->work, strerror(errno));
		goto fail;
	}
	list_add_tail(&srv->saves, &s->link);
	return s;

fail:
	if (s->rootfd >= 0)
		close(s->rootfd);
	free(s->root);
	free(s);
	*ret_err = r;
	return NULL;
}

static int open_shard(struct save *s, struct rank_save *rs, struct client *c, char *err,
		      size_t errlen)
{
	struct server *srv = s->srv;
	char shard[64], index[64];
	int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW;

	index_shard_name(rs->rank, shard, sizeof(shard));
	index_index_name(rs->rank, index, sizeof(index));
	/* An index left by an earlier attempt must not be merged with this
	 * attempt's shard. */
	unlinkat(s->workfd, index, 0);

	rs->direct = srv->cfg.o_direct;
	rs->fd = openat(s->workfd, shard, flags | (rs->direct ? O_DIRECT : 0), 0644);
	if (rs->fd < 0 && errno == EINVAL && rs->direct) {
		/* tmpfs and some network file systems refuse O_DIRECT. */
		log_warn("'%s': O_DIRECT not supported here; writing through the page cache",
			 s->root);
		rs->direct = false;
		rs->fd = openat(s->workfd, shard, flags, 0644);
	}
	if (rs->fd < 0) {
		int r = -errno;
		snprintf(err, errlen, "cannot create '%s/%s/%s': %s", s->root, s->work, shard,
			 strerror(errno));
		return r;
	}
	if (srv->euid_root && c->uid != 0 && fchown(rs->fd, c->uid, c->gid) < 0)
		log_warn("chown '%s/%s/%s': %s", s->root, s->work, shard, strerror(errno));
	/* Reserve the space now: a full disk (or a quota, or a file size
	 * limit) is reported at once, not after gigabytes were staged.  A file
	 * system without fallocate is fine: the writes find out instead.  (Not
	 * posix_fallocate: its fallback writes every block.) */
	if (rs->layout.file_size) {
		int r;

		do
			r = fallocate(rs->fd, 0, 0, (off_t)rs->layout.file_size);
		while (r < 0 && errno == EINTR);
		if (r < 0 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)) {
			r = -errno;
			snprintf(err, errlen, "no room for the %llu-byte shard of rank %u in '%s': %s",
				 (unsigned long long)rs->layout.file_size, rs->rank, s->root,
				 strerror(-r));
			return r;
		}
		if (r < 0 && errno != EOPNOTSUPP && errno != ENOSYS)
			log_warn("'%s': reserving %llu bytes for the shard of rank %u: %s (going on; "
				 "the writes will tell)", s->root,
				 (unsigned long long)rs->layout.file_size, rs->rank, strerror(errno));
	}
	return 0;
}

int save_begin_rank(struct server *srv, struct client *c, uint32_t token, struct layout *l,
		    struct rank_save **ret_rs, char *err, size_t errlen)
{
	struct save *s = find_save(srv, c->job, l->name);
	struct rank_save *rs;
	char marker[PROTO_MSG_LEN];
	int r = 0;

	if (srv->stopping) {
		snprintf(err, errlen, "ckptd is shutting down");
		return -ESHUTDOWN;
	}
	if (s && s->state != SAVE_ACTIVE) {
		snprintf(err, errlen, "save '%s' already failed: %s", s->name, s->msg);
		return s->err ? s->err : -ECANCELED;
	}
	if (!s) {
		s = save_new(srv, c, l, err, errlen, &r);
		if (!s)
			return r;
	} else {
		char canon[PATH_MAX];
		if (s->world != c->world) {
			snprintf(err, errlen,
				 "ranks disagree on the world size of job '%s': %u and %u", c->job,
				 s->world, c->world);
			save_fail(s, -EINVAL, "%s", err);
			return -EINVAL;
		}
		if (!realpath(l->root, canon) || strcmp(canon, s->root)) {
			snprintf(err, errlen, "rank %u saves '%s' to '%s', other ranks to '%s'",
				 c->rank, s->name, l->root, s->root);
			return -EINVAL;
		}
		for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
			if (list_entry(p, struct rank_save, slink)->rank == c->rank) {
				snprintf(err, errlen, "rank %u of job '%s' is already saving '%s'",
					 c->rank, c->job, s->name);
				return -EEXIST;
			}
		}
	}

	rs = calloc(1, sizeof(*rs));
	if (!rs)
		return -ENOMEM;
	rs->save = s;
	rs->client = c;
	rs->rank = c->rank;
	rs->token = token;
	rs->fd = -1;
	rs->layout = *l;
	memset(l, 0, sizeof(*l));
	rs->n_extents = (uint32_t)((rs->layout.file_size + c->slot_bytes - 1) / c->slot_bytes);
	rs->crcs = calloc(rs->layout.n_crcs ? rs->layout.n_crcs : 1, sizeof(uint32_t));
	rs->got = calloc(rs->n_extents / 8 + 1, 1);
	list_add_tail(&s->ranks, &rs->slink);
	list_add_tail(&c->ranks, &rs->clink);
	if (rs->rank == 0)
		s->coordinator = true;
	if (!rs->crcs || !rs->got) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	r = open_shard(s, rs, c, err, errlen);
	if (r < 0)
		goto fail;
	if (read_marker(s, marker, sizeof(marker))) {
		snprintf(err, errlen, "%s", marker);
		r = -ECANCELED;
		goto fail;
	}
	s->bytes += rs->layout.file_size;
	log_info("save '%s/%s' (job '%s'): rank %u/%u began, %llu bytes, %zu items", s->root,
		 s->name, s->job, rs->rank, s->world, (unsigned long long)rs->layout.file_size,
		 rs->layout.n_items);
	*ret_rs = rs;
	return 0;

fail:
	/* This rank never started: take it out quietly, then fail the save
	 * for the ranks that did (their files must not be committed). */
	rs->told = true;
	rs->failed = true;
	rs->err = r;
	if (s->ranks.next == &rs->slink && s->ranks.prev == &rs->slink) /* the only rank */
		save_fail(s, r, "%s", err);
	else
		save_fail(s, -ECANCELED, "rank %u: %s", rs->rank, err);
	return r;
}

/* Writes the marker other daemons look for, and removes what this daemon
 * wrote (all of the work dir, if it coordinates). */
static void save_cleanup_files(struct save *s)
{
	if (s->workfd < 0)
		return;
	if (s->coordinator) {
		int r = fs_rm_rf_at(s->rootfd, s->work);
		if (r < 0)
			log_warn("cannot remove '%s/%s': %s", s->root, s->work, strerror(-r));
		return;
	}
	fs_write_file_at(s->workfd, FAILED_MARKER, s->msg, strlen(s->msg), 1);
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
		struct rank_save *rs = list_entry(p, struct rank_save, slink);
		char name[64];
		index_shard_name(rs->rank, name, sizeof(name));
		unlinkat(s->workfd, name, 0);
		index_index_name(rs->rank, name, sizeof(name));
		unlinkat(s->workfd, name, 0);
	}
}

void save_fail(struct save *s, int err, const char *fmt, ...)
{
	va_list ap;

	if (s->state != SAVE_ACTIVE)
		return;
	s->state = SAVE_FAILED;
	s->err = err < 0 ? err : -EIO;
	va_start(ap, fmt);
	vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
	va_end(ap);
	s->srv->saves_failed++;
	log_warn("save '%s/%s' (job '%s') failed: %s", s->root, s->name, s->job, s->msg);
	save_cleanup_files(s);
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next)
		rank_tell(list_entry(p, struct rank_save, slink));
}

void rank_fail(struct rank_save *rs, int err, const char *fmt, ...)
{
	char msg[PROTO_MSG_LEN];
	va_list ap;

	if (rs->failed)
		return;
	rs->failed = true;
	rs->err = err;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* The rank's own client (if it is still there) gets its own errno;
	 * every other rank learns that this one failed. */
	save_fail(rs->save, -ECANCELED, "%s", msg);
}

static void save_committed(struct save *s)
{
	s->state = SAVE_COMMITTED;
	s->srv->saves_committed++;
	log_info("committed '%s/%s' (job '%s', %u ranks, %llu bytes here) in %lld ms", s->root,
		 s->name, s->job, s->world, (unsigned long long)s->bytes,
		 (long long)(now_ms() - s->started_ms));
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next)
		rank_tell(list_entry(p, struct rank_save, slink));
}

/* An index counts once it is newer than its shard: an index an earlier
 * attempt left behind is older than the shard this attempt truncated. */
static bool index_present(struct save *s, uint32_t rank)
{
	char shard[64], index[64];
	struct stat a, b;

	index_shard_name(rank, shard, sizeof(shard));
	index_index_name(rank, index, sizeof(index));
	if (fstatat(s->workfd, index, &a, 0) < 0 || fstatat(s->workfd, shard, &b, 0) < 0)
		return false;
	return a.st_mtim.tv_sec > b.st_mtim.tv_sec ||
	       (a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec >= b.st_mtim.tv_nsec);
}

static bool local_ranks_durable(struct save *s)
{
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next)
		if (!list_entry(p, struct rank_save, slink)->durable)
			return false;
	return !list_empty(&s->ranks);
}

static void save_try_commit(struct save *s)
{
	char err[PROTO_MSG_LEN] = "";
	char *manifest = NULL;
	int64_t t0;
	int r;

	if (s->state != SAVE_ACTIVE || !s->coordinator || !local_ranks_durable(s))
		return;
	t0 = now_us();
	while (s->n_present < s->world && index_present(s, s->n_present))
		s->n_present++;
	if (s->n_present < s->world)
		return;

	/* This daemon's ranks come from memory: no need to parse back the
	 * indexes it just wrote (for 10,000 tensors that is most of the
	 * commit's CPU time). */
	size_t n_local = 0;
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next)
		n_local++;
	struct index_local *local = calloc(n_local, sizeof(*local));
	if (!local) {
		save_fail(s, -ENOMEM, "out of memory merging the rank indexes");
		return;
	}
	n_local = 0;
	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
		const struct rank_save *rs = list_entry(p, struct rank_save, slink);
		local[n_local++] = (struct index_local){ rs->rank, &rs->layout, rs->crcs };
	}
	r = index_merge(s->workfd, s->job, s->name, s->world, (int64_t)time(NULL), local, n_local,
			&manifest, err, sizeof(err));
	free(local);
	if (r < 0) {
		save_fail(s, r, "cannot merge the rank indexes: %s", err);
		return;
	}
	r = fs_write_file_at(s->workfd, MANIFEST_FILE, manifest, strlen(manifest), 0);
	free(manifest);
	if (r < 0) {
		save_fail(s, r, "writing '%s/%s/%s': %s", s->root, s->work, MANIFEST_FILE,
			  strerror(-r));
		return;
	}
	if (fsync(s->workfd) < 0) {
		save_fail(s, -errno, "fsync '%s/%s': %s", s->root, s->work, strerror(errno));
		return;
	}
	if (renameat2(s->rootfd, s->work, s->rootfd, s->name, RENAME_NOREPLACE) < 0) {
		r = -errno;
		save_fail(s, r, r == -EEXIST ? "checkpoint '%s/%s' already exists" :
					       "cannot rename the work dir to '%s/%s'",
			  s->root, s->name);
		return;
	}
	/* The rename is durable only once the parent directory is. */
	if (fsync(s->rootfd) < 0)
		log_warn("fsync '%s': %s", s->root, strerror(errno));
	log_debug("save '%s/%s': merged, manifest written and renamed in %.1f ms", s->root, s->name,
		  (double)(now_us() - t0) / 1000.0);
	save_committed(s);
}

void rank_synced(struct rank_save *rs, int res)
{
	struct save *s = rs->save;
	char name[64];
	char *text = NULL;
	int r;

	if (rs->failed || s->state != SAVE_ACTIVE)
		return;
	if (res < 0) {
		rank_fail(rs, res, "fsync of rank %u's shard in '%s/%s': %s", rs->rank, s->root,
			  s->work, strerror(-res));
		return;
	}
	r = index_build(&rs->layout, rs->crcs, s->job, rs->rank, s->world, &text);
	if (r < 0) {
		rank_fail(rs, r, "building the index of rank %u: %s", rs->rank, strerror(-r));
		return;
	}
	index_index_name(rs->rank, name, sizeof(name));
	r = fs_write_file_at(s->workfd, name, text, strlen(text), 1);
	free(text);
	if (r < 0) {
		rank_fail(rs, r, "writing '%s/%s/%s': %s", s->root, s->work, name, strerror(-r));
		return;
	}
	rs->durable = true;
	close(rs->fd);
	rs->fd = -1;
	log_debug("save '%s/%s': rank %u durable: staged after %.1f ms, written +%.1f ms, "
		  "fsync and index +%.1f ms",
		  s->root, s->name, rs->rank, (double)(rs->t_staged - rs->t_begin) / 1000.0,
		  (double)(rs->t_written - rs->t_staged) / 1000.0,
		  (double)(now_us() - rs->t_written) / 1000.0);
	save_try_commit(s);
}

/* A rank on another daemon: has the coordinator committed, or failed? */
static void save_poll_remote(struct save *s)
{
	char marker[PROTO_MSG_LEN];
	struct stat st;
	char *text;
	size_t len;
	int fd;

	if (s->coordinator || !local_ranks_durable(s))
		return;
	fd = openat(s->rootfd, s->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		if (fs_read_file_at(fd, MANIFEST_FILE, 1u << 30, &text, &len) == 0) {
			json_t *m = json_loadb(text, len, 0, NULL);
			const char *job = json_string_value(json_object_get(m, "job"));
			if (job && !strcmp(job, s->job))
				save_committed(s);
			else
				save_fail(s, -EEXIST,
					  "checkpoint '%s/%s' was committed by another job", s->root,
					  s->name);
			json_decref(m);
			free(text);
		}
		close(fd);
		if (s->state != SAVE_ACTIVE)
			return;
	}
	if (read_marker(s, marker, sizeof(marker))) {
		save_fail(s, -ECANCELED, "%s", marker);
		return;
	}
	if (fstat(s->workfd, &st) == 0 && st.st_nlink == 0)
		save_fail(s, -ECANCELED,
			  "rank 0's daemon abandoned the save (its work directory is gone)");
}

static void save_deadline(struct save *s)
{
	char missing[256] = "";
	size_t n = 0, shown = 0;

	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
		struct rank_save *rs = list_entry(p, struct rank_save, slink);
		if (!rs->staged && shown < 8) {
			n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u",
					      shown ? ", " : "", rs->rank);
			shown++;
		}
	}
	if (shown) {
		save_fail(s, -ETIMEDOUT, "rank(s) %s did not finish staging within the commit "
					 "deadline (%llu ms)",
			  missing, (unsigned long long)s->srv->cfg.commit_deadline_ms);
		return;
	}
	if (!s->coordinator) {
		save_fail(s, -ETIMEDOUT,
			  "rank 0's daemon did not commit within the commit deadline (%llu ms)",
			  (unsigned long long)s->srv->cfg.commit_deadline_ms);
		return;
	}
	for (uint32_t r = s->n_present; r < s->world && n < sizeof(missing) - 16; r++) {
		if (index_present(s, r))
			continue;
		if (shown == 8) {
			n += (size_t)snprintf(missing + n, sizeof(missing) - n, ", ...");
			break;
		}
		n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u", shown ? ", " : "",
				      r);
		shown++;
	}
	save_fail(s, -ETIMEDOUT,
		  "rank(s) %s did not save within the commit deadline (%llu ms)",
		  shown ? missing : "?", (unsigned long long)s->srv->cfg.commit_deadline_ms);
}

void rank_maybe_free(struct rank_save *rs)
{
	if (rs->inflight || rs->held || rs->save->state == SAVE_ACTIVE)
		return;
	if (!rs->told)
		rank_tell(rs);
	if (rs->fd >= 0)
		close(rs->fd);
	free(rs->crcs);
	free(rs->got);
	layout_free(&rs->layout);
	list_del(&rs->slink);
	list_del(&rs->clink);
	free(rs);
}

static void save_free(struct save *s)
{
	if (s->workfd >= 0)
		close(s->workfd);
	if (s->rootfd >= 0)
		close(s->rootfd);
	list_del(&s->link);
	free(s->root);
	free(s);
}

void saves_tick(struct server *srv)
{
	struct list *p, *t;
	int64_t now = now_ms();

	/* A client that stalls mid-save must not keep checksums (and so its
	 * slots) waiting for long. */
	list_for_each_safe(p, t, &srv->clients)
	{
		struct client *c = list_entry(p, struct client, link);
		if (!list_empty(&c->crc_q) && now - c->last_extent_ms > 200)
			writer_crc_drain(c, 0);
	}

	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		if (s->state == SAVE_ACTIVE) {
			save_try_commit(s);
			if (s->state == SAVE_ACTIVE)
				save_poll_remote(s);
			if (s->state == SAVE_ACTIVE && now > s->deadline_ms)
				save_deadline(s);
		}
	}
	server_reap(srv);
}

void server_reap(struct server *srv)
{
	struct list *p, *t, *q, *u;

	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		if (s->state == SAVE_ACTIVE)
			continue;
		list_for_each_safe(q, u, &s->ranks)
			rank_maybe_free(list_entry(q, struct rank_save, slink));
		if (list_empty(&s->ranks))
			save_free(s);
	}
	list_for_each_safe(p, t, &srv->clients)
		client_maybe_free(list_entry(p, struct client, link));
}

static void sweep_dir(struct server *srv, const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int64_t age;

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, ".partial-", 9) != 0)
			continue;
		if (!stat_age_ms(dirfd(d), de->d_name, &age) ||
		    age <= (int64_t)srv->cfg.commit_deadline_ms)
			continue;
		/* Never under a save of ours (its deadline would have hit). */
		bool live = false;
		for (struct list *p = srv->saves.next; p != &srv->saves; p = p->next) {
			struct save *s = list_entry(p, struct save, link);
			if (!strcmp(s->work, de->d_name) && !strcmp(s->root, dir))
				live = true;
		}
		if (live)
			continue;
		int r = fs_rm_rf_at(dirfd(d), de->d_name);
		if (r < 0)
			log_warn("cannot remove stale work directory '%s/%s': %s", dir, de->d_name,
				 strerror(-r));
		else
			log_info("removed stale work directory '%s/%s'", dir, de->d_name);
	}
	closedir(d);
}

void sweep_roots(struct server *srv)
{
	/* The allowed roots and their direct subdirectories (one per job, in
	 * the usual layout).  Work dirs deeper down are removed when a save of
	 * the same name and job finds them stale (save_new). */
	for (size_t i = 0; i < srv->cfg.n_roots; i++) {
		DIR *d = opendir(srv->cfg.roots[i]);
		struct dirent *de;
		char sub[PATH_MAX];

		sweep_dir(srv, srv->cfg.roots[i]);
		if (!d)
			continue;
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.' || de->d_type != DT_DIR)
				continue;
			if (snprintf(sub, sizeof(sub), "%s/%s", srv->cfg.roots[i], de->d_name) <
			    (int)sizeof(sub))
				sweep_dir(srv, sub);
		}
		closedir(d);
	}
	srv->last_sweep_ms = now_ms();
}
