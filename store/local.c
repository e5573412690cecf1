/* SPDX-License-Identifier: MIT */
/*
 * local.c - the local-directory backend (a local or shared file system).
 *
 * Layout under a save's root:
 *
 *   <root>/.ckpt-work-<id>/attempt.json        the attempt's key, who made it
 *   <root>/.ckpt-work-<id>/rank-NNNNN.safetensors
 *   <root>/.ckpt-work-<id>/coordinator.json    rank 0's daemon's claim (nonce)
 *   <root>/.ckpt-work-<id>/rank-NNNNN.index.json  written last for a rank,
 *                                              addressed to the claim
 *   <root>/.ckpt-work-<id>/failed              a daemon failed the attempt
 *   <root>/<name>/                             the work area, once committed
 *
 * Writes go from the client's arena to the shard with io_uring, O_DIRECT and
 * the arena registered as fixed buffers: no copy, and pages pinned once per
 * connection instead of on every write.  A fixed buffer may be at most
 * 1 GiB (a kernel limit), so the arena is registered as consecutive 1 GiB
 * pieces; slots (<= 8 MiB, aligned) never straddle two.
 *
 * Commit order (each fsync before the step that makes its data reachable):
 *   shard: ftruncate to its size -> fsync -> index (fsync, atomic rename);
 *   coordinator: manifest.json (fsync, atomic rename) -> fsync the work dir
 *   -> rename it to <root>/<name> (RENAME_NOREPLACE) -> fsync <root>.
 * After a crash a visible <root>/<name> always has a complete manifest and
 * complete shards; anything less is a work area the owner's daemon removes.
 */
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "format/index.h"
#include "store/attempt.h"
#include "store/fsutil.h"
#include "store/remove.h"
#include "store/store_local.h"

#define FIXED_MAX (1ull << 30)
#define FAILED_MARKER "failed"
#define CLAIM_FILE STORE_CLAIM_FILE
#define ATTEMPT_MAX_BYTES (64u << 10)
#define MANIFEST_MAX_BYTES (1ull << 30)
#define JOIN_WAIT_MS 2000 /* for attempt.json of a work area being made */

/* ---- ids ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void store_hash_hex(const void *buf, size_t len, char ret[STORE_ID_LEN + 1])
{
	const unsigned char *p = buf;
	uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull ^ len;

	for (size_t i = 0; i < len; i++) {
		a = (a ^ p[i]) * 0x100000001b3ull;
		b = (b ^ p[i]) * 0x9e3779b97f4a7c15ull;
		b ^= b >> 29;
	}
	snprintf(ret, STORE_ID_LEN + 1, "%016llx%016llx", (unsigned long long)mix64(a ^ mix64(b)),
		 (unsigned long long)mix64(b + 0x632be59bd9b4e019ull));
}

void store_key_id(const struct store_key *k, char ret[STORE_ID_LEN + 1])
{
	char buf[CKPT_MAX_JOB_LEN + CKPT_MAX_RUN_LEN + CKPT_MAX_NAME_LEN + 96];
	int n;

	/* The strings cannot hold a NUL: NUL-separated, the fields are
	 * unambiguous. */
	n = snprintf(buf, sizeof(buf), "ckpt-attempt-1%c%s%c%s%c%s%c%llu%c%u%c%u", 0, k->job, 0,
		     k->run, 0, k->name, 0, (unsigned long long)k->step, 0, k->attempt, 0,
		     k->world);
	store_hash_hex(buf, (size_t)n, ret);
}

/* ---- arenas ---------------------------------------------------------------- */

struct wr {
	int fd;
	bool read;         /* a read into the arena (arena_read), not a write */
	bool nofixed;      /* read: crosses two registered buffers */
	uint64_t done;     /* read: bytes read so far */
	unsigned buf_index;
	uint8_t *buf;
	uint64_t file_off, len;
	store_io_cb cb;
	void *ud;
	struct wr *next;
};

struct store_arena {
	struct io_uring ring;
	uint8_t *base;
	uint64_t len;
	bool fixed;
	int efd;
	unsigned depth, inflight, queued;
	struct wr *q_head, *q_tail; /* waiting for ring room */
	bool waiting;               /* in disk.wait_head's list */
	struct store_arena *wnext;
};

/*
 * Every arena writes to the same disk, and the block layer has a fixed
 * number of requests for it (128 tags on the virtio disk here; an 8 MiB
 * write from 4 KiB pages takes 8 of them).  With many arenas each at its
 * own depth (8 ranks x 16 writes) the requests run out, and the submission
 * that finds none sleeps in blk_mq_get_tag inside io_uring_enter, on the
 * event loop's thread: sampled at 100-400 ms per loop round with 8 ranks.
 * A deeper queue does not make the disk faster, so the writes in flight of
 * all arenas together are capped (`disk_depth`), and arenas that hit the
 * cap wait their turn in a FIFO, served round-robin as writes complete.
 * Only the loop thread submits and reaps, so this needs no lock.
 */
static struct {
	unsigned cap;      /* 0: no cap */
	unsigned inflight;
	struct store_arena *wait_head, *wait_tail;
} disk;

static void local_set_disk_depth(unsigned depth)
{
	disk.cap = depth;
}

static void wait_turn(struct store_arena *a)
{
	if (a->waiting)
		return;
	a->waiting = true;
	a->wnext = NULL;
	if (disk.wait_tail)
		disk.wait_tail->wnext = a;
	else
		disk.wait_head = a;
	disk.wait_tail = a;
}

static struct store_arena *next_turn(void)
{
	struct store_arena *a = disk.wait_head;

	if (a) {
		disk.wait_head = a->wnext;
		if (!disk.wait_head)
			disk.wait_tail = NULL;
		a->waiting = false;
	}
	return a;
}

static bool disk_full(void)
{
	return disk.cap && disk.inflight >= disk.cap;
}

static int local_arena_attach(void *base, uint64_t len, unsigned depth, struct store_arena **ret,
			      char *err, size_t errlen)
{
	struct store_arena *a = calloc(1, sizeof(*a));
	struct iovec *iov;
	unsigned n_iov;
	int r;

	if (!a)
		return -ENOMEM;
	a->base = base;
	a->len = len;
	a->depth = depth;
	a->efd = -1;
	r = io_uring_queue_init(depth + 8, &a->ring, 0);
	if (r < 0) {
		snprintf(err, errlen, "io_uring_queue_init: %s", strerror(-r));
		free(a);
		return r;
	}
	n_iov = (unsigned)((len + FIXED_MAX - 1) / FIXED_MAX);
	iov = calloc(n_iov, sizeof(*iov));
	if (!iov) {
		r = -ENOMEM;
		goto out_ring;
	}
	for (unsigned i = 0; i < n_iov; i++) {
		uint64_t off = (uint64_t)i * FIXED_MAX;
		iov[i].iov_base = a->base + off;
		iov[i].iov_len = len - off < FIXED_MAX ? len - off : FIXED_MAX;
	}
	/* Typically fails on RLIMIT_MEMLOCK: still correct, only slower
	 * (pages pinned per write); the caller may warn. */
	a->fixed = io_uring_register_buffers(&a->ring, iov, n_iov) == 0;
	free(iov);
	a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->efd < 0) {
		r = -errno;
		goto out_ring;
	}
	r = io_uring_register_eventfd(&a->ring, a->efd);
	if (r < 0)
		goto out_ring;
	if (!a->fixed)
		snprintf(err, errlen, "io_uring buffer registration failed: writing without "
				      "fixed buffers (raise LimitMEMLOCK)");
	*ret = a;
	return 0;

out_ring:
	snprintf(err, errlen, "io_uring setup: %s", strerror(-r));
	if (a->efd >= 0)
		close(a->efd);
	io_uring_queue_exit(&a->ring);
	free(a);
	return r;
}

static void local_arena_detach(struct store_arena *a)
{
	if (!a)
		return;
	if (a->waiting) {
		/* Not expected (nothing is queued), but never leave a freed
		 * arena in the list. */
		struct store_arena **pp = &disk.wait_head, *prev = NULL;
		while (*pp && *pp != a) {
			prev = *pp;
			pp = &(*pp)->wnext;
		}
		if (*pp)
			*pp = a->wnext;
		if (disk.wait_tail == a)
			disk.wait_tail = prev;
	}
	io_uring_queue_exit(&a->ring);
	if (a->efd >= 0)
		close(a->efd);
	free(a);
}

static int local_arena_fd(const struct store_arena *a)
{
	return a->efd;
}

static unsigned local_arena_busy(const struct store_arena *a)
{
	return a->inflight + a->queued;
}

static bool prep(struct store_arena *a, struct wr *w)
{
	struct io_uring_sqe *sqe;

	if (a->inflight >= a->depth || disk_full() || !(sqe = io_uring_get_sqe(&a->ring)))
		return false;
	if (w->read && a->fixed && !w->nofixed)
		io_uring_prep_read_fixed(sqe, w->fd, w->buf, (unsigned)w->len, w->file_off,
					 (int)w->buf_index);
	else if (w->read)
		io_uring_prep_read(sqe, w->fd, w->buf, (unsigned)w->len, w->file_off);
	else if (a->fixed)
		io_uring_prep_write_fixed(sqe, w->fd, w->buf, (unsigned)w->len, w->file_off,
					  (int)w->buf_index);
	else
		io_uring_prep_write(sqe, w->fd, w->buf, (unsigned)w->len, w->file_off);
	io_uring_sqe_set_data(sqe, w);
	a->inflight++;
	disk.inflight++;
	return true;
}

static void flush(struct store_arena *a)
{
	/* -EBUSY/-EAGAIN: the kernel is short of room; the SQEs stay queued
	 * and go with the next submit (after completions are reaped). */
	(void)io_uring_submit(&a->ring);
}

/* Hands the disk's free room to the arenas waiting for it, one write each
 * in turn (without a cap: until each is at its own depth).  An arena
 * stopped by its own depth leaves the queue: its next completion brings it
 * back. */
static void serve_waiting(void)
{
	while (!disk_full() && disk.wait_head) {
		struct store_arena *a = next_turn();
		struct wr *w = a->q_head;

		if (!w || !prep(a, w))
			continue;
		a->q_head = w->next;
		if (!a->q_head)
			a->q_tail = NULL;
		a->queued--;
		flush(a);
		if (a->q_head)
			wait_turn(a);
	}
}

static void enqueue(struct store_arena *a, struct wr *w)
{
	if (a->q_head || disk.wait_head || !prep(a, w)) {
		w->next = NULL;
		if (a->q_tail)
			a->q_tail->next = w;
		else
			a->q_head = w;
		a->q_tail = w;
		a->queued++;
		if (a->inflight < a->depth)
			wait_turn(a); /* held back by the disk's cap */
		serve_waiting();
		return;
	}
	flush(a);
}

struct store_shard {
	struct store_attempt *att;
	uint32_t rank;
	int fd;
};

/* Queues one transfer between the arena at arena_off and fd at file_off;
 * cb(ud, -ENOMEM) at once if it cannot. */
static void queue_io(struct store_arena *a, int fd, bool read, uint64_t arena_off,
		     uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	struct wr *w = calloc(1, sizeof(*w));

	if (!w) {
		cb(ud, -ENOMEM);
		return;
	}
	w->fd = fd;
	w->read = read;
	/* A fixed buffer is one registered iovec (<= FIXED_MAX bytes); a
	 * read may cross two (writes are slots, which never do). */
	w->nofixed = arena_off / FIXED_MAX != (arena_off + len - 1) / FIXED_MAX;
	w->buf_index = (unsigned)(arena_off / FIXED_MAX);
	w->buf = a->base + arena_off;
	w->file_off = file_off;
	w->len = len;
	w->cb = cb;
	w->ud = ud;
	enqueue(a, w);
}

static void local_shard_write(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			      uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	queue_io(a, s->fd, false, arena_off, file_off, len, cb, ud);
}

static void local_arena_read(struct store_arena *a, int fd, uint64_t arena_off,
			     uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	/* One SQE reads at most INT_MAX bytes. */
	if (len == 0 || len > FIXED_MAX || arena_off > a->len || len > a->len - arena_off) {
		cb(ud, -EINVAL);
		return;
	}
	queue_io(a, fd, true, arena_off, file_off, len, cb, ud);
}

static void local_arena_reap(struct store_arena *a)
{
	struct io_uring_cqe *cqe;
	uint64_t junk;

	if (read(a->efd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
		junk = 0;
	for (;;) {
		struct wr *done[64];
		int res[64];
		unsigned head, n = 0;

		io_uring_for_each_cqe(&a->ring, head, cqe)
		{
			done[n] = io_uring_cqe_get_data(cqe);
			res[n] = cqe->res;
			if (++n == 64)
				break;
		}
		if (n == 0)
			break;
		io_uring_cq_advance(&a->ring, n);
		for (unsigned i = 0; i < n; i++) {
			struct wr *w = done[i];
			a->inflight--;
			disk.inflight--;
			if (w->read) {
				/* A short read goes on from where it stopped if
				 * that is on a block (O_DIRECT could not go on
				 * elsewhere: a short read off the grid is the end
				 * of the file); 0 is the end, and reports what
				 * came. */
				if (res[i] > 0 && (uint64_t)res[i] < w->len &&
				    (w->file_off + (uint64_t)res[i]) % 4096 == 0) {
					w->done += (uint64_t)res[i];
					w->file_off += (uint64_t)res[i];
					w->buf += res[i];
					w->len -= (uint64_t)res[i];
					enqueue(a, w);
					continue;
				}
				w->done += res[i] > 0 ? (uint64_t)res[i] : 0;
				w->cb(w->ud, res[i] < 0 ? res[i] :
					     w->done > INT32_MAX ? INT32_MAX : (int)w->done);
				free(w);
				continue;
			}
			if (res[i] > 0 && (uint64_t)res[i] < w->len) {
				/* Short write (a signal; a full disk about to say
				 * ENOSPC): go on from where it stopped. */
				w->file_off += (uint64_t)res[i];
				w->buf += res[i];
				w->len -= (uint64_t)res[i];
				enqueue(a, w);
				continue;
			}
			w->cb(w->ud, res[i] < 0 ? res[i] : res[i] == 0 ? -EIO : 0);
			free(w);
		}
		/* Completions made room: queued writes go on, this arena's
		 * in turn with the others waiting for the disk. */
		if (a->q_head)
			wait_turn(a);
		serve_waiting();
	}
}

/* ---- attempts -------------------------------------------------------------- */

struct store_attempt {
	int rootfd, workfd;
	uid_t uid;                 /* the saving user (the trash marker's) */
	char *root;
	char work[sizeof(STORE_WORK_PREFIX) + STORE_ID_LEN];
	char name[CKPT_MAX_NAME_LEN + 1];
};

static void local_attempt_close(struct store_attempt *a)
{
	if (!a)
		return;
	if (a->workfd >= 0)
		close(a->workfd);
	if (a->rootfd >= 0)
		close(a->rootfd);
	free(a->root);
	free(a);
}

/* Checks an existing work area: 0 to join it, 1 if it is a leftover of an
 * earlier life of this daemon (to be replaced), or -errno with err set. */
static int check_existing(int workfd, const char *where, const struct store_key *k,
			  const char *id, const struct store_writer *self, uid_t uid, char *err,
			  size_t errlen)
{
	struct stat st;
	char *text = NULL;
	size_t len;
	int r;

	if (fstat(workfd, &st) < 0)
		return -errno;
	if (st.st_uid != uid) {
		snprintf(err, errlen, "work area '%s' belongs to uid %u, not to uid %u", where,
			 (unsigned)st.st_uid, (unsigned)uid);
		return -EEXIST;
	}
	/* Another daemon of the attempt may have made it a moment ago and not
	 * yet written attempt.json (it renames it into place). */
	for (int waited = 0;; waited += 50) {
		r = fs_read_file_at(workfd, STORE_ATTEMPT_FILE, ATTEMPT_MAX_BYTES, &text, &len);
		if (r != -ENOENT || waited >= JOIN_WAIT_MS)
			break;
		struct timespec ts = { 0, 50 * 1000000L };
		nanosleep(&ts, NULL);
	}
	if (r < 0) {
		snprintf(err, errlen, "work area '%s' has no readable %s (%s): not an attempt of "
				      "this save", where, STORE_ATTEMPT_FILE, strerror(-r));
		return -EEXIST;
	}
	r = store_attempt_judge(text, len, k, id, self, false, 0);
	free(text);
	if (r < 0) {
		snprintf(err, errlen, "work area '%s' belongs to another save (its %s differs)",
			 where, STORE_ATTEMPT_FILE);
		return -EEXIST;
	}
	if (r == 0) {
		char *msg = NULL;
		if (fs_read_file_at(workfd, FAILED_MARKER, 4096, &msg, &len) == 0) {
			snprintf(err, errlen, "this attempt already failed: %s",
				 len ? msg : "(no reason given)");
			free(msg);
			return -ECANCELED;
		}
	}
	return r;
}

static int local_attempt_open(const char *root, int rootfd, const struct store_key *k,
			      const char *id, const struct store_writer *self, uid_t uid,
			      struct store_attempt **ret, bool *ret_created, char *err,
			      size_t errlen)
{
	struct store_attempt *a = calloc(1, sizeof(*a));
	char where[PATH_MAX];
	bool created = false;
	int r;

	if (!a || !(a->root = strdup(root))) {
		free(a);
		return -ENOMEM;
	}
	a->workfd = -1;
	a->uid = uid;
	snprintf(a->work, sizeof(a->work), "%s%s", STORE_WORK_PREFIX, id);
	snprintf(a->name, sizeof(a->name), "%s", k->name);
	snprintf(where, sizeof(where), "%s/%s", root, a->work);
	/* The directory root_open checked, never the path resolved again. */
	a->rootfd = rootfd >= 0 ? fcntl(rootfd, F_DUPFD_CLOEXEC, 0) :
				  open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (a->rootfd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open root '%s': %s", root, strerror(errno));
		goto fail;
	}
	if (faccessat(a->rootfd, k->name, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		r = -EEXIST;
		snprintf(err, errlen, "checkpoint '%s/%s' already exists", root, k->name);
		goto fail;
	}
	for (int tries = 0; tries < 2; tries++) {
		/* 0755 and 0644 below, less the client's umask: a checkpoint is
		 * never writable by others, even with umask 000 (another user
		 * could otherwise plant an index or rewrite a shard). */
		if (mkdirat(a->rootfd, a->work, 0755) == 0) {
			char *text = store_attempt_text(k, id, self, uid);
			created = true;
			a->workfd = openat(a->rootfd, a->work,
					   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			r = a->workfd < 0 ? -errno : !text ? -ENOMEM : 0;
			if (r == 0)
				/* No fsync (see fs_write_file_at): it only
				 * matters while daemons of the attempt live. */
				r = fs_write_file_at(a->workfd, STORE_ATTEMPT_FILE, text,
						     strlen(text), FS_ATOMIC | FS_NOSYNC);
			free(text);
			if (r < 0) {
				char e2[256];

				snprintf(err, errlen, "cannot set up work area '%s': %s", where,
					 strerror(-r));
				/* Ours, just made, and never joined (nobody joins
				 * an area without attempt.json); still, removed
				 * only by renaming it away first. */
				if (a->workfd >= 0)
					store_local_discard(a->rootfd, a->work, a->workfd, uid, true,
							    e2, sizeof(e2));
				else
					unlinkat(a->rootfd, a->work, AT_REMOVEDIR);
				goto fail;
			}
			break;
		}
		if (errno != EEXIST) {
			r = -errno;
			snprintf(err, errlen, "cannot create work area '%s': %s", where,
				 strerror(errno));
			goto fail;
		}
		a->workfd = openat(a->rootfd, a->work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (a->workfd < 0) {
			r = errno == ENOTDIR || errno == ELOOP ? -EEXIST : -errno;
			snprintf(err, errlen, "cannot open work area '%s': %s", where,
				 strerror(errno));
			goto fail;
		}
		r = check_existing(a->workfd, where, k, id, self, uid, err, errlen);
		if (r < 0)
			goto fail;
		if (r == 0)
			break;
		/* A leftover of this daemon before a restart: none of it may be
		 * used by this attempt.  Remove it and make a fresh one, unless
		 * another daemon claimed it: then it is that coordinator's,
		 * which may be committing it. */
		{
			char *claim;
			size_t clen;

			if (fs_read_file_at(a->workfd, CLAIM_FILE, ATTEMPT_MAX_BYTES, &claim,
					    &clen) == 0) {
				bool foreign = store_claim_foreign(claim, clen, self->id);

				free(claim);
				if (foreign) {
					snprintf(err, errlen, "work area '%s', of an earlier life of "
						 "this daemon, is claimed by another daemon's save: "
						 "save as a new attempt (or set a run id)", where);
					r = -EEXIST;
					goto fail;
				}
			}
		}
		r = store_local_discard(a->rootfd, a->work, a->workfd, uid, true, err, errlen);
		close(a->workfd);
		a->workfd = -1;
		if (r == -ENOENT)
			r = 0; /* committed or removed meanwhile: try again */
		if (r < 0) {
			snprintf(err, errlen, "cannot remove the stale work area '%s': %s", where,
				 strerror(-r));
			goto fail;
		}
	}
	if (a->workfd < 0) {
		r = -EEXIST;
		snprintf(err, errlen, "work area '%s' keeps coming back", where);
		goto fail;
	}
	*ret = a;
	*ret_created = created;
	return 0;

fail:
	local_attempt_close(a);
	return r;
}

static int local_shard_create(struct store_attempt *a, uint32_t rank, uint64_t size,
			      uint64_t extent, bool direct, struct store_shard **ret, char *err,
			      size_t errlen)
{
	int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
	struct store_shard *s;
	char shard[64];
	int fd, r;

	(void)extent; /* a file takes extents of any size at any offset */
	index_shard_name(rank, shard, sizeof(shard));
	fd = openat(a->workfd, shard, flags | (direct ? O_DIRECT : 0), 0644);
	if (fd < 0 && errno == EINVAL && direct) {
		/* tmpfs and some network file systems refuse O_DIRECT: the
		 * exclusive create happened or not; try again without. */
		fd = openat(a->workfd, shard, flags, 0644);
	}
	if (fd < 0) {
		r = -errno;
		if (r == -EEXIST)
			snprintf(err, errlen, "rank %u of this attempt is already being saved "
					      "(its shard exists in '%s/%s')", rank, a->root, a->work);
		else
			snprintf(err, errlen, "cannot create '%s/%s/%s': %s", a->root, a->work,
				 shard, strerror(-r));
		return r;
	}
	/* Reserve the space now: a full disk (or a quota, or a file size
	 * limit) is reported at once, not after gigabytes were staged.  A file
	 * system without fallocate is fine: the writes find out instead.  (Not
	 * posix_fallocate: its fallback writes every block.) */
	if (size) {
		do
			r = fallocate(fd, 0, 0, (off_t)size);
		while (r < 0 && errno == EINTR);
		if (r < 0 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)) {
			r = -errno;
			snprintf(err, errlen, "no room for the %llu-byte shard of rank %u in '%s': %s",
				 (unsigned long long)size, rank, a->root, strerror(-r));
			close(fd);
			unlinkat(a->workfd, shard, 0);
			return r;
		}
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		unlinkat(a->workfd, shard, 0);
		return -ENOMEM;
	}
	s->att = a;
	s->rank = rank;
	s->fd = fd;
	*ret = s;
	return 0;
}

static const char *local_attempt_tag(const struct store_attempt *a)
{
	(void)a;
	return NULL; /* shards are renamed into place with their work area */
}

static int local_shard_finish(struct store_shard *s, uint64_t size, char *err, size_t errlen)
{
	struct store_attempt *a = s->att;
	int r;

	/* The last extent was padded for O_DIRECT: cut the file to its real
	 * length before making it durable; the index goes after the fsync. */
	if (ftruncate(s->fd, (off_t)size) < 0 || fsync(s->fd) < 0) {
		r = -errno;
		snprintf(err, errlen, "making the shard of rank %u in '%s/%s' durable: %s", s->rank,
			 a->root, a->work, strerror(errno));
		return r;
	}
	return 0;
}

static int local_rank_publish(struct store_attempt *a, uint32_t rank, const char *index_text,
			      char *err, size_t errlen)
{
	char name[64];
	int r;

	index_index_name(rank, name, sizeof(name));
	r = fs_write_file_at(a->workfd, name, index_text, strlen(index_text), FS_ATOMIC);
	if (r < 0)
		snprintf(err, errlen, "writing '%s/%s/%s': %s", a->root, a->work, name,
			 strerror(-r));
	return r;
}

static int local_attempt_claim(struct store_attempt *a, const struct store_writer *self,
			       char ret[STORE_ID_LEN + 1], char *err, size_t errlen)
{
	char nonce[STORE_ID_LEN + 1];
	char *text;
	int r;

	r = store_claim_new(self, nonce, &text);
	if (r < 0) {
		snprintf(err, errlen, "claiming '%s/%s': %s", a->root, a->work, strerror(-r));
		return r;
	}
	/* Atomic: an earlier claim (a crashed coordinator's) is replaced
	 * whole, and with it every delivery addressed to it. */
	r = fs_write_file_at(a->workfd, CLAIM_FILE, text, strlen(text), FS_ATOMIC | FS_NOSYNC);
	free(text);
	if (r < 0) {
		snprintf(err, errlen, "claiming '%s/%s': %s", a->root, a->work, strerror(-r));
		return r;
	}
	memcpy(ret, nonce, sizeof(nonce));
	return 0;
}

static int local_attempt_addressee(struct store_attempt *a, char ret[STORE_ID_LEN + 1])
{
	char *text;
	size_t len;
	int r;

	r = fs_read_file_at(a->workfd, CLAIM_FILE, ATTEMPT_MAX_BYTES, &text, &len);
	if (r < 0)
		return r;
	r = store_claim_nonce(text, len, ret);
	free(text);
	return r;
}

static void local_shard_close(struct store_shard *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}

static int fetch_index(void *ud, uint32_t rank, char **ret, size_t *ret_len, char *err,
		       size_t errlen)
{
	const struct store_attempt *a = ud;
	char name[64];

	(void)err;
	(void)errlen;
	index_index_name(rank, name, sizeof(name));
	return fs_read_file_at(a->workfd, name, INDEX_MAX_BYTES, ret, ret_len);
}

static int local_attempt_count(struct store_attempt *a, uint32_t world, const char *nonce,
			       const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			       size_t errlen)
{
	int r = store_count_delivered(fetch_index, a, world, nonce, local, n_local, io_n, err,
				      errlen);

	/* After the count, whatever it found (store.h). */
	if (r == 0 && faccessat(a->workfd, FAILED_MARKER, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return -ECANCELED;
	return r;
}

static int local_attempt_commit(struct store_attempt *a, const struct store_merge *m, char *err,
				size_t errlen)
{
	struct stat mine, placed;
	char *manifest = NULL;
	int r;

	struct index_origin o = { m->attempt_id, m->self->id, m->self->instance, m->nonce, NULL,
				  false, 0 };

	r = index_merge_origin(a->workfd, m->key->job, m->key->name, m->key->world, m->time_utc,
			       &o, m->local, m->n_local, &manifest, err, errlen);
	if (r < 0)
		return r;
	r = fs_write_file_at(a->workfd, MANIFEST_FILE, manifest, strlen(manifest), FS_ATOMIC);
	free(manifest);
	if (r < 0) {
		snprintf(err, errlen, "writing '%s/%s/%s': %s", a->root, a->work, MANIFEST_FILE,
			 strerror(-r));
		return r;
	}
	if (fsync(a->workfd) < 0) {
		r = -errno;
		snprintf(err, errlen, "fsync '%s/%s': %s", a->root, a->work, strerror(errno));
		return r;
	}
	if (renameat2(a->rootfd, a->work, a->rootfd, a->name, RENAME_NOREPLACE) < 0) {
		r = -errno;
		snprintf(err, errlen, r == -EEXIST ? "checkpoint '%s/%s' already exists" :
			 r == -ENOENT ? "the work area of '%s/%s' was removed before the commit "
					"(another daemon's sweep or a failed save's cleanup)" :
						     "cannot rename the work area to '%s/%s': %s",
			 a->root, a->name, strerror(-r));
		return r;
	}
	/* The rename looked the work area's name up again: if our area was
	 * removed (renamed to the trash) and another made under the same name
	 * meanwhile, the rename moved that one, without our manifest.  Put
	 * it back and fail: committed must mean our directory. */
	if (fstat(a->workfd, &mine) < 0 ||
	    fstatat(a->rootfd, a->name, &placed, AT_SYMLINK_NOFOLLOW) < 0 ||
	    mine.st_dev != placed.st_dev || mine.st_ino != placed.st_ino) {
		(void)renameat2(a->rootfd, a->name, a->rootfd, a->work, RENAME_NOREPLACE);
		snprintf(err, errlen, "the work area of '%s/%s' was removed and made again by "
				      "another save before the commit", a->root, a->name);
		return -ESTALE;
	}
	/* The rename is durable only once the parent directory is. */
	if (fsync(a->rootfd) < 0) {
		r = -errno;
		snprintf(err, errlen, "fsync '%s' after the commit: %s", a->root, strerror(errno));
		return r;
	}
	return 0;
}

static int local_attempt_poll(struct store_attempt *a, const char *id, char *err, size_t errlen)
{
	char path[CKPT_MAX_NAME_LEN + 32];
	struct stat st;
	char *text;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/%s", a->name, MANIFEST_FILE);
	r = fs_read_file_at(a->rootfd, path, MANIFEST_MAX_BYTES, &text, &len);
	if (r == 0) {
		struct manifest m;
		char why[256];
		bool ours;

		memset(&m, 0, sizeof(m));
		r = manifest_parse(text, len, &m, why, sizeof(why));
		free(text);
		ours = r == 0 && strcmp(m.attempt, id) == 0;
		if (r == 0)
			manifest_free(&m);
		if (ours)
			return 1;
		snprintf(err, errlen, "checkpoint '%s/%s' was committed by another save", a->root,
			 a->name);
		return -EEXIST;
	}
	if (fs_read_file_at(a->workfd, FAILED_MARKER, 4096, &text, &len) == 0) {
		snprintf(err, errlen, "%s", len ? text : "another daemon failed the save");
		free(text);
		return -ECANCELED;
	}
	if (fstat(a->workfd, &st) == 0 && st.st_nlink == 0) {
		snprintf(err, errlen, "rank 0's daemon abandoned the save (its work area is gone)");
		return -ECANCELED;
	}
	return 0;
}

static int local_attempt_fail(struct store_attempt *a, const struct store_fail *f)
{
	char name[64], err[256];
	int r;

	if (f->coordinator) {
		/* -ENOENT: committed (renamed into place) or already gone:
		 * either way nothing of it is ours to delete any more. */
		r = store_local_discard(a->rootfd, a->work, a->workfd, a->uid, true, err,
					sizeof(err));
		return r == -ENOENT ? 0 : r;
	}
	if (f->delivered)
		return 0;
	/* The marker first, while our shards still hold their ranks: the
	 * coordinator cannot count a rank of ours re-created by someone else
	 * without seeing it (attempt_count). */
	if (f->mark)
		fs_write_file_at(a->workfd, FAILED_MARKER, f->msg, strlen(f->msg), FS_ATOMIC);
	for (size_t i = 0; i < f->n_made; i++) {
		index_shard_name(f->made[i], name, sizeof(name));
		unlinkat(a->workfd, name, 0);
	}
	/* Our area, failed by our own marker, and no coordinator to remove
	 * it (a claim that lands after this look finds the area renamed away
	 * and fails, as it would on the marker). */
	if (f->mark && f->created &&
	    faccessat(a->workfd, CLAIM_FILE, F_OK, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT) {
		r = store_local_discard(a->rootfd, a->work, a->workfd, a->uid, true, err,
					sizeof(err));
		return r == -ENOENT ? 0 : r;
	}
	return 0;
}

/* ---- for the spill tier (store_local.h) ------------------------------------ */

void store_local_area(const struct store_attempt *a, int *rootfd, int *workfd, const char **work)
{
	*rootfd = a->rootfd;
	*workfd = a->workfd;
	*work = a->work;
}

/* ---- tools ----------------------------------------------------------------- */

static int local_list(const char *root, const char *dir,
		      int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (snprintf(path, sizeof(path), "%s%s%s", root, dir[0] ? "/" : "", dir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	d = opendir(path);
	if (!d)
		return -errno;
	while (r == 0 && (errno = 0, de = readdir(d))) {
		enum store_entry kind = STORE_ENTRY_OTHER;
		char rel[NAME_MAX + sizeof(MANIFEST_FILE) + 2];

		/* A trash directory is a removal under way (remove.h): never
		 * a checkpoint, even while it still holds a manifest. */
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    store_is_trash_name(de->d_name))
			continue;
		snprintf(rel, sizeof(rel), "%s/%s", de->d_name, MANIFEST_FILE);
		if (!strncmp(de->d_name, STORE_WORK_PREFIX, sizeof(STORE_WORK_PREFIX) - 1))
			kind = STORE_ENTRY_WORK;
		else if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN)
			kind = STORE_ENTRY_FILE;
		else if (faccessat(dirfd(d), rel, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
			kind = STORE_ENTRY_CHECKPOINT;
		r = fn(ud, de->d_name, kind);
	}
	if (r == 0 && errno)
		r = -errno;
	closedir(d);
	return r;
}

static int local_read_range(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			    void *buf)
{
	int dfd = open(ckpt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	uint64_t done = 0;
	int fd, r = 0;

	if (dfd < 0)
		return -errno;
	fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	close(dfd);
	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0) {
			r = -EBADMSG;
			break;
		}
		done += (uint64_t)n;
	}
	close(fd);
	return r;
}

static int local_remove(const char *root, const char *name)
{
	int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int r;

	if (rfd < 0)
		return -errno;
	r = fs_rm_rf_at(rfd, name);
	if (r == 0 && fsync(rfd) < 0)
		r = -errno;
	close(rfd);
	return r;
}

const struct store_ops store_local = {
	.name = "local",
	.arena_attach = local_arena_attach,
	.arena_detach = local_arena_detach,
	.arena_fd = local_arena_fd,
	.arena_reap = local_arena_reap,
	.arena_read = local_arena_read,
	.arena_busy = local_arena_busy,
	.set_disk_depth = local_set_disk_depth,
	.root_open = store_local_root_open,
	.attempt_open = local_attempt_open,
	.shard_create = local_shard_create,
	.shard_write = local_shard_write,
	.attempt_tag = local_attempt_tag,
	.shard_finish = local_shard_finish,
	.rank_publish = local_rank_publish,
	.attempt_claim = local_attempt_claim,
	.attempt_addressee = local_attempt_addressee,
	.shard_close = local_shard_close,
	.attempt_count = local_attempt_count,
	.attempt_commit = local_attempt_commit,
	.attempt_poll = local_attempt_poll,
	.attempt_fail = local_attempt_fail,
	.attempt_close = local_attempt_close,
	.list = local_list,
	.read_range = local_read_range,
	.remove = local_remove,
};
