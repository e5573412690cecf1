/* SPDX-License-Identifier: MIT */
/*
 * spill.c - the spill tier (store_spill.h): an S3 root written through the
 * node's own disk.
 *
 * Without it, an S3 part holds its arena slot until S3 acknowledged it, so
 * a slow or failing store holds the trainer's staging memory (and its next
 * save).  With it, a shard of an S3 root is written with the local backend
 * (io_uring, O_DIRECT) into a work area on the node's disk, and its slots
 * are free as soon as the file has them.  shard_finish makes the file
 * durable; that is the local-durable point the daemon reports.  Then
 * shard_forward uploads the file as the S3 backend uploads an arena: the
 * file is mapped, and each part, checked block by block against the CRCs
 * the daemon computed from the arena, goes up from the mapping with the
 * CRC32C of the bytes checked: bytes that change on the node's disk after
 * the check are refused by S3 (BadDigest), never committed.  Everything
 * else (indexes, the claim, the manifest, failure markers, reading) is the
 * S3 backend's, unchanged: the spill tier changes where the bytes wait,
 * never what commits.
 *
 * Durable means it.  Once shard_finish returned, the file is the only copy
 * the daemon promised to commit (daemon/save.h, daemon/pending.h): a
 * forward that S3 does not take is retried by the daemon for as long as it
 * takes, and this file never removes the copy but for the attempt's
 * failure (attempt_fail) or its commit (the restore cache).  So a forward
 * may run many times: each round after a failed one gives up the failed
 * round's multipart upload and makes a new S3 shard (the rank's marker in
 * S3 is this daemon's: shard_create takes it over), and checks every block
 * again; only a copy that check() refuses, or that is gone, is an error no
 * retry mends (-EBADMSG).  A later life of the daemon finds the attempt
 * again with attempt_resume (the S3 work area joined, not replaced: the
 * manifest looked at first, a commit that landed before the crash is
 * final) and each spilled rank with shard_resume; the local area is then
 * held by fds of its own, not the local backend's.
 *
 * Layout of spill_dir (made by the daemon, not writable by others):
 *
 *   <spill_dir>/<uid>/                     the user's, mode 0700
 *   <spill_dir>/<uid>/work/.ckpt-work-<id>/  a local work area per attempt
 *   <spill_dir>/<uid>/cache/<roothash>/<name>/  a committed checkpoint's
 *       shards of this node's ranks, named as in the store, and
 *       source.json (root, name, attempt, commit time): the restore cache.
 *       The newest `keep` names of each root are kept.
 *
 * The cache is never a checkpoint by itself: it has no manifest, and holds
 * only the ranks this node saved.  A reader takes the manifest from the
 * store and may take the bytes of a shard from here, checking every block
 * against the manifest as it does for any read.
 */
#include "store/store_spill.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/crc32c.h"
#include "format/index.h"
#include "store/fsutil.h"
#include "store/store_local.h"
#include "store/store_s3.h"

#define SOURCE_FILE "source.json"
#define FORWARD_WINDOW 16     /* parts checked and handed to S3 ahead */
#define PRUNE_MAX 4096        /* cache entries of one root looked at */

/* Set at start-up, read-only afterwards. */
static char *g_dir;
static unsigned g_keep;
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;

int store_spill_start(const char *dir, unsigned keep, char *err, size_t errlen)
{
	struct stat st;
	int fd, r;

	if (!dir || dir[0] != '/') {
		snprintf(err, errlen, "the spill directory must be an absolute path");
		return -EINVAL;
	}
	r = fs_mkdir_p(dir, 0755);
	if (r < 0) {
		snprintf(err, errlen, "cannot create the spill directory '%s': %s", dir,
			 strerror(-r));
		return r;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open the spill directory '%s': %s", dir,
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		return r;
	}
	close(fd);
	/* Others must not be able to plant a user's directory (or a symlink
	 * in its place) before the daemon makes it. */
	if (st.st_uid != geteuid() || (st.st_mode & 022)) {
		snprintf(err, errlen, "the spill directory '%s' must belong to ckptd (uid %u) "
				      "and not be writable by group or others (it is uid %u, "
				      "mode %04o)",
			 dir, (unsigned)geteuid(), (unsigned)st.st_uid,
			 (unsigned)(st.st_mode & 07777));
		return -EACCES;
	}
	free(g_dir);
	g_dir = strdup(dir);
	if (!g_dir)
		return -ENOMEM;
	g_keep = keep;
	return 0;
}

void store_spill_stop(void)
{
	free(g_dir);
	g_dir = NULL;
}

bool store_spill_on(void)
{
	return g_dir != NULL;
}

int store_spill_work_root(uid_t uid, char *buf, size_t len)
{
	if (!g_dir)
		return -ENOENT;
	if ((size_t)snprintf(buf, len, "%s/%u/work", g_dir, (unsigned)uid) >= len)
		return -ENAMETOOLONG;
	return 0;
}

int store_spill_prepare(uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char path[PATH_MAX];
	struct stat st;
	bool made = false;
	int fd, r = 0;

	if (!g_dir)
		return 0;
	if ((size_t)snprintf(path, sizeof(path), "%s/%u", g_dir, (unsigned)uid) >= sizeof(path)) {
		snprintf(err, errlen, "the spill directory's path is too long");
		return -ENAMETOOLONG;
	}
	if (mkdir(path, 0700) == 0)
		made = true;
	else if (errno != EEXIST)
		goto fail;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		goto fail;
	if (made && uid != geteuid() && fchown(fd, uid, gid) < 0) {
		close(fd);
		goto fail;
	}
	if (fstat(fd, &st) < 0) {
		close(fd);
		goto fail;
	}
	close(fd);
	if (st.st_uid != uid || (st.st_mode & 077)) {
		snprintf(err, errlen, "spill directory '%s' must belong to uid %u with mode 0700 "
				      "(it is uid %u, mode %04o)",
			 path, (unsigned)uid, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
		return -EACCES;
	}
	return 0;

fail:
	r = -errno;
	snprintf(err, errlen, "cannot prepare spill directory '%s': %s", path, strerror(errno));
	return r;
}

/* ---- attempts ------------------------------------------------------------------ */

struct spattempt {
	struct store_attempt *s3, *loc; /* loc: NULL when resumed */
	bool loc_created, kept;
	int rootfd, workfd;        /* resumed: the local area found again */
	char work[sizeof(STORE_WORK_PREFIX) + STORE_ID_LEN];
	uid_t uid;
	char root[PATH_MAX];       /* the S3 root, canonical */
	char name[CKPT_MAX_NAME_LEN + 1];
	char id[STORE_ID_LEN + 1];
};

struct spshard {
	struct spattempt *at;
	struct store_shard *s3;    /* NULL until an upload round makes it */
	struct store_shard *loc;   /* NULL once resumed */
	uint32_t rank;
	uint64_t size, extent;
	bool s3_failed;            /* the last round failed: a new one starts
	                            * with a new S3 shard */
	bool cancel;               /* atomically: set on the loop, read on a worker */
};

#define SA(x) ((struct spattempt *)(void *)(x))
#define SS(x) ((struct spshard *)(void *)(x))

/* The attempt's local work area: the local backend's, or (resumed) the
 * one found again. */
static void sp_area(const struct spattempt *at, int *rootfd, int *workfd, const char **work)
{
	if (at->loc) {
		store_local_area(at->loc, rootfd, workfd, work);
		return;
	}
	*rootfd = at->rootfd;
	*workfd = at->workfd;
	*work = at->work;
}

/* An attempt of the tier with its names set and nothing open, or NULL. */
static struct spattempt *spattempt_new(const char *root, const struct store_key *k,
				       const char *id, uid_t uid)
{
	struct spattempt *at = calloc(1, sizeof(*at));

	if (!at)
		return NULL;
	at->rootfd = at->workfd = -1;
	at->uid = uid;
	snprintf(at->root, sizeof(at->root), "%s", root);
	snprintf(at->name, sizeof(at->name), "%s", k->name);
	snprintf(at->id, sizeof(at->id), "%s", id);
	return at;
}

static int sp_attempt_open(const char *root, int rootfd, const struct store_key *k,
			   const char *id, const struct store_writer *self, uid_t uid,
			   struct store_attempt **ret, bool *ret_created, char *err, size_t errlen)
{
	struct spattempt *at = spattempt_new(root, k, id, uid);
	char work[PATH_MAX];
	int r;

	if (!at)
		return -ENOMEM;
	r = store_spill_work_root(uid, work, sizeof(work));
	if (r == 0)
		r = fs_mkdir_p(work, 0700);
	if (r < 0) {
		snprintf(err, errlen, "cannot make the spill work directory for uid %u: %s",
			 (unsigned)uid, strerror(-r));
		free(at);
		return r;
	}
	/* (the daemon's own spill directory, opened by path) */
	r = store_local.attempt_open(work, -1, k, id, self, uid, &at->loc, &at->loc_created, err,
				     errlen);
	if (r < 0) {
		free(at);
		return r;
	}
	r = store_s3.attempt_open(root, rootfd, k, id, self, uid, &at->s3, ret_created, err,
				  errlen);
	if (r < 0) {
		struct store_fail lf = { .coordinator = at->loc_created, .msg = "" };

		store_local.attempt_fail(at->loc, &lf);
		store_local.attempt_close(at->loc);
		free(at);
		return r;
	}
	*ret = (struct store_attempt *)(void *)at;
	return 0;
}

static int sp_shard_create(struct store_attempt *x, uint32_t rank, uint64_t size, uint64_t extent,
			   bool direct, struct store_shard **ret, char *err, size_t errlen)
{
	struct spattempt *at = SA(x);
	struct spshard *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->at = at;
	s->rank = rank;
	s->size = size;
	s->extent = extent;
	r = store_local.shard_create(at->loc, rank, size, extent, direct, &s->loc, err, errlen);
	if (r == 0)
		r = store_s3.shard_create(at->s3, rank, size, extent, direct, &s->s3, err, errlen);
	if (r < 0) {
		/* The attempt's failure removes the local file. */
		store_local.shard_close(s->loc);
		free(s);
		return r;
	}
	*ret = (struct store_shard *)(void *)s;
	return 0;
}

static const char *sp_attempt_tag(const struct store_attempt *x)
{
	return store_s3.attempt_tag(SA(x)->s3);
}

static void sp_shard_write(struct store_shard *x, struct store_arena *a, uint64_t arena_off,
			   uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	store_local.shard_write(SS(x)->loc, a, arena_off, file_off, len, cb, ud);
}

static const char *sp_shard_error(const struct store_shard *x)
{
	const struct spshard *s = (const struct spshard *)(const void *)x;

	return store_local.shard_error ? store_local.shard_error(s->loc) : NULL;
}

static int sp_shard_finish(struct store_shard *x, uint64_t size, char *err, size_t errlen)
{
	struct spattempt *at = SS(x)->at;
	const char *work;
	int rootfd, workfd, r;

	r = store_local.shard_finish(SS(x)->loc, size, err, errlen);
	if (r < 0)
		return r;
	/* Durable on the node means the file's name too, and its area's: a
	 * later life of the daemon must find them after a power loss. */
	sp_area(at, &rootfd, &workfd, &work);
	if (fsync(workfd) < 0 || fsync(rootfd) < 0) {
		r = -errno;
		snprintf(err, errlen, "making the spill area '%s' durable: %s", work,
			 strerror(errno));
	}
	return r;
}

static bool sp_shard_spills(const struct store_shard *x)
{
	(void)x;
	return true;
}

static void sp_shard_cancel(struct store_shard *x)
{
	__atomic_store_n(&SS(x)->cancel, true, __ATOMIC_RELAXED);
}

/* One forward: parts in flight and the first failure. */
struct fwd {
	unsigned inflight;
	int res;
	uint64_t acked;
	uint64_t *progress;
};

struct fwd_part {
	struct fwd *f;
	uint64_t len;
};

static void fwd_done(void *ud, int res)
{
	struct fwd_part *p = ud;
	struct fwd *f = p->f;

	f->inflight--;
	if (res < 0 && !f->res)
		f->res = res;
	if (res == 0) {
		f->acked += p->len;
		__atomic_store_n(f->progress, f->acked, __ATOMIC_RELAXED);
	}
}

/* An S3 failure as shard_forward reports it: BadDigest after every retry
 * means the bytes changed after they were checked (or the way corrupts
 * them); the next round checks them again and decides.  -EBADMSG is kept
 * for a copy that can never be moved. */
static int s3_trouble(int r)
{
	return r == -EBADMSG ? -EIO : r;
}

/* A new S3 shard for this round: the failed round's upload is given up
 * first (a rank marker of ours is taken over by shard_create). */
static int new_s3_shard(struct spshard *s, char *err, size_t errlen)
{
	int r;

	if (s->s3) {
		store_s3_shard_abort(s->s3);
		store_s3.shard_close(s->s3);
		s->s3 = NULL;
	}
	r = store_s3_shard_create_again(s->at->s3, s->rank, s->size, s->extent, &s->s3, err,
					errlen);
	if (r < 0)
		return r == -EEXIST ? r : s3_trouble(r);
	s->s3_failed = false;
	return 0;
}

static int sp_shard_forward(struct store_shard *x, store_check_fn check, void *check_ud,
			    uint64_t *progress, char *err, size_t errlen)
{
	struct spshard *s = SS(x);
	struct spattempt *at = s->at;
	struct store_arena *arena = NULL;
	struct fwd f = { .progress = progress };
	struct fwd_part *parts = NULL;
	uint64_t n = 0, next = 0;
	char name[64], tagged[INDEX_SHARD_NAME_MAX], why[384] = "";
	const char *work;
	int rootfd, workfd, fd;
	uint8_t *map = NULL;
	int r;

	sp_area(at, &rootfd, &workfd, &work);
	index_shard_name(s->rank, name, sizeof(name));
	fd = openat(workfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		r = errno == ENOENT || errno == ELOOP ? -EBADMSG : -errno;
		snprintf(err, errlen, "reopening the spilled shard of rank %u: %s", s->rank,
			 strerror(errno));
		return r;
	}
	if (s->size) {
		map = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			r = -errno;
			snprintf(err, errlen, "mapping the spilled shard of rank %u: %s", s->rank,
				 strerror(errno));
			close(fd);
			return r;
		}
		madvise(map, s->size, MADV_SEQUENTIAL);
	}
	close(fd);
	/* The first round uses the S3 shard made with the local one (its
	 * marker claimed the rank then); a round after a failure, or after a
	 * restart, makes a new one, unless an earlier round (or life) sent
	 * the shard whole and delivered its index: then nothing is sent again
	 * (another daemon may be committing that shard), and the index goes
	 * to the current claim. */
	if (!s->s3 || s->s3_failed) {
		r = store_s3_rank_stored(at->s3, s->rank, s->size, err, errlen);
		if (r < 0) {
			r = s3_trouble(r);
			goto out;
		}
		if (r == 1) {
			__atomic_store_n(progress, s->size, __ATOMIC_RELAXED);
			r = 0;
			goto out;
		}
	}
	if (!s->s3 || s->s3_failed) {
		r = new_s3_shard(s, err, errlen);
		if (r < 0) {
			s->s3_failed = true;
			goto out;
		}
	}
	/* The mapping is the arena the S3 backend sends the parts from. */
	r = store_s3.arena_attach(map, s->size, 0, &arena, err, errlen);
	if (r < 0)
		goto out;
	n = s->size ? (s->size + s->extent - 1) / s->extent : 0;
	parts = calloc(n ? n : 1, sizeof(*parts));
	if (!parts) {
		r = -ENOMEM;
		goto out;
	}
	__atomic_store_n(progress, 0, __ATOMIC_RELAXED);
	for (;;) {
		bool cancel = __atomic_load_n(&s->cancel, __ATOMIC_RELAXED);

		while (!cancel && !f.res && next < n && f.inflight < FORWARD_WINDOW) {
			uint64_t off = next * s->extent;
			uint64_t len = s->size - off < s->extent ? s->size - off : s->extent;

			/* Read ahead the part after this one while this one is
			 * checked. */
			if (off + len < s->size) {
				uint64_t l2 = s->size - off - len;
				madvise(map + off + len, l2 < s->extent ? l2 : s->extent,
					MADV_WILLNEED);
			}
			r = check(check_ud, map + off, off, len, why, sizeof(why));
			if (r < 0) {
				f.res = -EBADMSG;
				break;
			}
			/* The part's checksum from the bytes just checked, not
			 * from what the transport reads later: if the file
			 * changes in between, S3 refuses the part. */
			uint32_t crc = crc32c(map + off, len, 0);
			parts[next] = (struct fwd_part){ &f, len };
			f.inflight++;
			store_s3_shard_write_crc(s->s3, arena, off, off, len, crc, fwd_done,
						 &parts[next]);
			next++;
		}
		if (!f.inflight && (cancel || f.res || next == n))
			break;
		if (f.inflight) {
			struct pollfd pfd = { .fd = store_s3.arena_fd(arena), .events = POLLIN };
			/* Woken by a finished part; the timeout only notices a
			 * cancel. */
			poll(&pfd, 1, 200);
			store_s3.arena_reap(arena);
		}
	}
	if (f.res) {
		const char *e = store_s3.shard_error ? store_s3.shard_error(s->s3) : NULL;
		if (why[0]) {
			r = -EBADMSG;
			snprintf(err, errlen, "%s", why);
		} else {
			r = s3_trouble(f.res);
			snprintf(err, errlen, "uploading the spilled shard of rank %u: %s", s->rank,
				 e ? e : strerror(-f.res));
		}
		s->s3_failed = true;
		goto out;
	}
	if (next < n) {
		r = -ECANCELED;
		snprintf(err, errlen, "the upload of rank %u was cancelled (the save failed)",
			 s->rank);
		goto out;
	}
	r = store_s3.shard_finish(s->s3, s->size, err, errlen);
	if (r < 0) {
		r = s3_trouble(r);
		s->s3_failed = true;
	} else {
		/* Named as in the store, for the restore cache.  A failure costs
		 * only the cache: the file keeps its first name. */
		index_shard_name_tag(s->rank, store_s3.attempt_tag(at->s3), tagged, sizeof(tagged));
		if (renameat(workfd, name, workfd, tagged) < 0) {
			/* nothing to undo */
		}
	}
out:
	free(parts);
	store_s3.arena_detach(arena);
	if (map)
		munmap(map, s->size);
	return r;
}

static int sp_rank_publish(struct store_attempt *x, uint32_t rank, const char *text, char *err,
			   size_t errlen)
{
	return store_s3.rank_publish(SA(x)->s3, rank, text, err, errlen);
}

static int sp_attempt_claim(struct store_attempt *x, const struct store_writer *self,
			    char ret[STORE_ID_LEN + 1], char *err, size_t errlen)
{
	return store_s3.attempt_claim(SA(x)->s3, self, ret, err, errlen);
}

static int sp_attempt_addressee(struct store_attempt *x, char ret[STORE_ID_LEN + 1])
{
	return store_s3.attempt_addressee(SA(x)->s3, ret);
}

static void sp_shard_close(struct store_shard *x)
{
	if (!x)
		return;
	store_local.shard_close(SS(x)->loc);
	store_s3.shard_close(SS(x)->s3);
	free(SS(x));
}

static int sp_attempt_count(struct store_attempt *x, uint32_t world, const char *nonce,
			    const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			    size_t errlen)
{
	return store_s3.attempt_count(SA(x)->s3, world, nonce, local, n_local, io_n, err, errlen);
}

/* Newest first by source.json's time; entries without one are oldest. */
struct cached {
	char name[CKPT_MAX_NAME_LEN + 1];
	struct timespec t;
};

static int cached_cmp(const void *a, const void *b)
{
	const struct timespec *x = &((const struct cached *)a)->t;
	const struct timespec *y = &((const struct cached *)b)->t;

	if (x->tv_sec != y->tv_sec)
		return x->tv_sec < y->tv_sec ? 1 : -1;
	return x->tv_nsec < y->tv_nsec ? 1 : x->tv_nsec > y->tv_nsec ? -1 : 0;
}

/* Keeps the newest g_keep names of one root's cache directory. */
static void prune_cache(int dfd)
{
	struct cached *c = calloc(PRUNE_MAX, sizeof(*c));
	int fd = dup(dfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	size_t n = 0;

	if (!c || !d) {
		free(c);
		if (d)
			closedir(d);
		else if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d)) && n < PRUNE_MAX) {
		char src[CKPT_MAX_NAME_LEN + sizeof(SOURCE_FILE) + 2];
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    strlen(e->d_name) > CKPT_MAX_NAME_LEN)
			continue;
		snprintf(c[n].name, sizeof(c[n].name), "%s", e->d_name);
		snprintf(src, sizeof(src), "%s/%s", e->d_name, SOURCE_FILE);
		if (fstatat(dfd, src, &st, AT_SYMLINK_NOFOLLOW) == 0)
			c[n].t = st.st_mtim;
		n++;
	}
	closedir(d);
	qsort(c, n, sizeof(*c), cached_cmp);
	for (size_t i = g_keep; i < n; i++)
		fs_rm_rf_at(dfd, c[i].name);
	free(c);
}

/* The attempt committed: its local work area becomes the restore cache of
 * this name (or goes, with keep 0).  Best effort: the checkpoint is
 * committed whatever happens here. */
static void keep_cache(struct spattempt *at)
{
	char dir[PATH_MAX], hash[STORE_ID_LEN + 1];
	const char *work;
	int rootfd, workfd, dfd = -1;
	char *text = NULL;
	json_t *j;

	if (at->kept)
		return;
	at->kept = true;
	sp_area(at, &rootfd, &workfd, &work);
	if (workfd < 0)
		return; /* resumed after the area had gone to the cache */
	store_hash_hex(at->root, strlen(at->root), hash);
	hash[16] = '\0';
	if (!g_keep || (size_t)snprintf(dir, sizeof(dir), "%s/%u/cache/%s", g_dir,
					(unsigned)at->uid, hash) >= sizeof(dir))
		goto drop;
	j = json_pack("{s:s, s:s, s:s, s:I}", "root", at->root, "name", at->name, "attempt",
		      at->id, "committed", (json_int_t)time(NULL));
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text || fs_write_file_at(workfd, SOURCE_FILE, text, strlen(text), FS_ATOMIC) < 0)
		goto drop;
	unlinkat(workfd, STORE_ATTEMPT_FILE, 0);
	pthread_mutex_lock(&g_cache_lock);
	if (fs_mkdir_p(dir, 0700) < 0 ||
	    (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		pthread_mutex_unlock(&g_cache_lock);
		goto drop;
	}
	/* A cached copy of the same name belongs to a checkpoint that is no
	 * longer in the store (this one could not have committed over it). */
	fs_rm_rf_at(dfd, at->name);
	if (renameat(rootfd, work, dfd, at->name) < 0) {
		pthread_mutex_unlock(&g_cache_lock);
		goto drop;
	}
	prune_cache(dfd);
	pthread_mutex_unlock(&g_cache_lock);
	close(dfd);
	free(text);
	return;

drop:
	if (dfd >= 0)
		close(dfd);
	free(text);
	fs_rm_rf_at(rootfd, work);
}

static int sp_attempt_commit(struct store_attempt *x, const struct store_merge *m, char *err,
			     size_t errlen)
{
	int r = store_s3.attempt_commit(SA(x)->s3, m, err, errlen);

	if (r == 0)
		keep_cache(SA(x));
	return r;
}

static int sp_attempt_poll(struct store_attempt *x, const char *id, char *err, size_t errlen)
{
	int r = store_s3.attempt_poll(SA(x)->s3, id, err, errlen);

	if (r == 1)
		keep_cache(SA(x));
	return r;
}

static int sp_attempt_fail(struct store_attempt *x, const struct store_fail *f)
{
	struct spattempt *at = SA(x);
	int r = store_s3.attempt_fail(at->s3, f);

	/* The local area is this daemon's own (a spill directory is never
	 * shared): all of it goes. */
	if (at->kept)
		return r;
	if (at->loc) {
		struct store_fail lf = { .coordinator = at->loc_created, .made = f->made,
					 .n_made = f->n_made, .msg = f->msg };

		(void)store_local.attempt_fail(at->loc, &lf);
	} else if (at->workfd >= 0) {
		fs_rm_rf_at(at->rootfd, at->work);
	}
	return r;
}

/* The S3 side's work area is the shared one: its heartbeat is S3's. */
static int sp_attempt_renew(struct store_attempt *x, const struct store_writer *self, char *err,
			    size_t errlen)
{
	return store_s3.attempt_renew(SA(x)->s3, self, err, errlen);
}

static void sp_attempt_close(struct store_attempt *x)
{
	if (!x)
		return;
	store_s3.attempt_close(SA(x)->s3);
	store_local.attempt_close(SA(x)->loc);
	if (SA(x)->workfd >= 0)
		close(SA(x)->workfd);
	if (SA(x)->rootfd >= 0)
		close(SA(x)->rootfd);
	free(SA(x));
}

/* ---- resuming (a later life of the daemon) ------------------------------------- */

/*
 * The S3 attempt is found again first: a commit that landed before the
 * earlier life ended needs nothing from the node's disk (its area may be
 * the restore cache already).  Otherwise the local area must be there: it
 * holds the only copy of the bytes.
 */
static int sp_attempt_resume(const char *root, const struct store_key *k, const char *id,
			     const struct store_writer *self, uid_t uid, bool coordinator,
			     struct store_attempt **ret, char *err, size_t errlen)
{
	struct spattempt *at = spattempt_new(root, k, id, uid);
	char work[PATH_MAX];
	int r, committed;

	if (!at)
		return -ENOMEM;
	snprintf(at->work, sizeof(at->work), "%s%s", STORE_WORK_PREFIX, id);
	r = store_spill_work_root(uid, work, sizeof(work));
	if (r < 0) {
		snprintf(err, errlen, "the spill tier is off: its saves cannot be resumed");
		free(at);
		return r;
	}
	committed = store_s3.attempt_resume(root, k, id, self, uid, coordinator, &at->s3, err,
					    errlen);
	if (committed < 0) {
		free(at);
		return committed;
	}
	at->rootfd = open(work, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (at->rootfd >= 0)
		at->workfd = openat(at->rootfd, at->work,
				    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (at->workfd < 0 && !committed) {
		snprintf(err, errlen, "the spilled copy '%s/%s' is gone: %s", work, at->work,
			 strerror(errno));
		sp_attempt_close((struct store_attempt *)(void *)at);
		return -EBADMSG;
	}
	if (committed)
		keep_cache(at);
	*ret = (struct store_attempt *)(void *)at;
	return committed;
}

static int sp_shard_resume(struct store_attempt *x, uint32_t rank, uint64_t size, uint64_t extent,
			   struct store_shard **ret, char *err, size_t errlen)
{
	struct spattempt *at = SA(x);
	char name[64], tagged[INDEX_SHARD_NAME_MAX];
	struct spshard *s;
	struct stat st;
	int r;

	index_shard_name(rank, name, sizeof(name));
	index_shard_name_tag(rank, store_s3.attempt_tag(at->s3), tagged, sizeof(tagged));
	r = fstatat(at->workfd, name, &st, AT_SYMLINK_NOFOLLOW);
	/* An upload that finished named it as in the store. */
	if (r < 0 && errno == ENOENT && renameat(at->workfd, tagged, at->workfd, name) == 0)
		r = fstatat(at->workfd, name, &st, AT_SYMLINK_NOFOLLOW);
	if (r < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) {
		snprintf(err, errlen, "the spilled copy of rank %u in '%s' is %s", rank, at->work,
			 r < 0 ? strerror(errno) : "not the file that was made durable");
		return -EBADMSG;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->at = at;
	s->rank = rank;
	s->size = size;
	s->extent = extent;
	*ret = (struct store_shard *)(void *)s;
	return 0;
}

static int sp_list(const char *root, const char *dir,
		   int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud)
{
	return store_s3.list(root, dir, fn, ud);
}

static int sp_read_range(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			 void *buf)
{
	return store_s3.read_range(ckpt, file, off, len, buf);
}

static int sp_remove(const char *root, const char *name)
{
	return store_s3.remove(root, name);
}

static int sp_root_open(const char *base, const char *root, int *ret_fd, char *err,
			size_t errlen)
{
	return store_s3.root_open(base, root, ret_fd, err, errlen);
}

/* Arenas are the local backend's: the router hands this backend's writes
 * the local one. */
const struct store_ops store_spill = {
	.name = "s3+spill",
	.arena_attach = NULL,
	.root_open = sp_root_open,
	.attempt_open = sp_attempt_open,
	.attempt_resume = sp_attempt_resume,
	.shard_resume = sp_shard_resume,
	.shard_create = sp_shard_create,
	.attempt_tag = sp_attempt_tag,
	.shard_write = sp_shard_write,
	.shard_error = sp_shard_error,
	.shard_finish = sp_shard_finish,
	.shard_spills = sp_shard_spills,
	.shard_forward = sp_shard_forward,
	.shard_cancel = sp_shard_cancel,
	.rank_publish = sp_rank_publish,
	.attempt_claim = sp_attempt_claim,
	.attempt_addressee = sp_attempt_addressee,
	.shard_close = sp_shard_close,
	.attempt_count = sp_attempt_count,
	.attempt_commit = sp_attempt_commit,
	.attempt_poll = sp_attempt_poll,
	.attempt_fail = sp_attempt_fail,
	.attempt_renew = sp_attempt_renew,
	.attempt_close = sp_attempt_close,
	.list = sp_list,
	.read_range = sp_read_range,
	.remove = sp_remove,
};
