/* SPDX-License-Identifier: MIT */
/*
 * route.c - one ops table over every backend, chosen by the root:
 * "s3://..." is S3 (when this process set S3 up), anything else a local
 * directory.
 *
 * The daemon attaches one arena per connection before it knows where the
 * connection's saves go, and one connection may save to a directory and to
 * a bucket in turn.  So an arena here is attached to each backend that can
 * be used (local always, S3 once started), and its fd is an epoll fd over
 * theirs: readable when either has completions.  Attempts and shards carry
 * the backend that made them, and every later hook goes to it.
 */
#include "store/store_route.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "store/s3_addr.h"
#include "store/store_s3.h"
#include "store/store_spill.h"

const struct store_ops *store_for_root(const char *root)
{
	return s3_is_url(root) ? &store_s3 : &store_local;
}

struct rarena {
	struct store_arena *local, *s3;
	int epfd;
};

struct rattempt {
	const struct store_ops *ops;
	struct store_attempt *a;
};

struct rshard {
	const struct store_ops *ops;
	struct store_shard *s;
};

#define RA(x) ((struct rarena *)(void *)(x))
#define RT(x) ((struct rattempt *)(void *)(x))
#define RS(x) ((struct rshard *)(void *)(x))

static void r_arena_detach(struct store_arena *x)
{
	struct rarena *ra = RA(x);

	if (!ra)
		return;
	store_local.arena_detach(ra->local);
	store_s3.arena_detach(ra->s3);
	if (ra->epfd >= 0)
		close(ra->epfd);
	free(ra);
}

static int watch(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int r_arena_attach(void *base, uint64_t len, unsigned depth, struct store_arena **ret,
			  char *err, size_t errlen)
{
	struct rarena *ra = calloc(1, sizeof(*ra));
	int r;

	if (!ra)
		return -ENOMEM;
	ra->epfd = -1;
	/* The local attach may leave a warning in err with success. */
	r = store_local.arena_attach(base, len, depth, &ra->local, err, errlen);
	if (r < 0)
		goto fail;
	if (store_s3_client()) {
		char e2[256];
		r = store_s3.arena_attach(base, len, depth, &ra->s3, e2, sizeof(e2));
		if (r < 0) {
			snprintf(err, errlen, "%s", e2);
			goto fail;
		}
	}
	ra->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ra->epfd < 0) {
		r = -errno;
		snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
		goto fail;
	}
	r = watch(ra->epfd, store_local.arena_fd(ra->local));
	if (r == 0 && ra->s3)
		r = watch(ra->epfd, store_s3.arena_fd(ra->s3));
	if (r < 0) {
		snprintf(err, errlen, "epoll_ctl: %s", strerror(-r));
		goto fail;
	}
	*ret = (struct store_arena *)(void *)ra;
	return 0;

fail:
	r_arena_detach((struct store_arena *)(void *)ra);
	return r;
}

static int r_arena_fd(const struct store_arena *x)
{
	return ((const struct rarena *)(const void *)x)->epfd;
}

static void r_arena_reap(struct store_arena *x)
{
	struct rarena *ra = RA(x);

	store_local.arena_reap(ra->local);
	if (ra->s3)
		store_s3.arena_reap(ra->s3);
}

static void r_arena_read(struct store_arena *x, int fd, uint64_t arena_off, uint64_t file_off,
			 uint64_t len, store_io_cb cb, void *ud)
{
	/* Reads for loads are local files (S3 loads are ranged GETs by the
	 * client). */
	store_local.arena_read(RA(x)->local, fd, arena_off, file_off, len, cb, ud);
}

static unsigned r_arena_busy(const struct store_arena *x)
{
	const struct rarena *ra = (const struct rarena *)(const void *)x;

	return store_local.arena_busy(ra->local) + (ra->s3 ? store_s3.arena_busy(ra->s3) : 0);
}

static void r_set_disk_depth(unsigned depth)
{
	store_local.set_disk_depth(depth);
}

static int r_root_open(const char *base, const char *root, int *ret_fd, char *err,
		       size_t errlen)
{
	/* (where the root is: the spill tier has no say in it) */
	return store_for_root(root)->root_open(base, root, ret_fd, err, errlen);
}

static int r_attempt_open(const char *root, int rootfd, const struct store_key *k,
			  const char *id, const struct store_writer *self, uid_t uid,
			  struct store_attempt **ret, bool *ret_created, char *err, size_t errlen)
{
	struct rattempt *rt = calloc(1, sizeof(*rt));
	int r;

	if (!rt)
		return -ENOMEM;
	/* Attempts on S3 go through the node's disk when the spill tier is
	 * on; tools (list, read, remove) use S3 itself either way. */
	rt->ops = s3_is_url(root) && store_spill_on() ? &store_spill : store_for_root(root);
	r = rt->ops->attempt_open(root, rootfd, k, id, self, uid, &rt->a, ret_created, err,
				  errlen);
	if (r < 0) {
		free(rt);
		return r;
	}
	*ret = (struct store_attempt *)(void *)rt;
	return 0;
}

static int r_attempt_resume(const char *root, const struct store_key *k, const char *id,
			    const struct store_writer *self, uid_t uid, bool coordinator,
			    struct store_attempt **ret, char *err, size_t errlen)
{
	struct rattempt *rt;
	int r;

	/* Only the spill tier leaves anything a later life resumes. */
	if (!s3_is_url(root) || !store_spill_on()) {
		snprintf(err, errlen, "the spill tier is off: '%s' cannot be resumed", root);
		return -ENOTSUP;
	}
	rt = calloc(1, sizeof(*rt));
	if (!rt)
		return -ENOMEM;
	rt->ops = &store_spill;
	r = rt->ops->attempt_resume(root, k, id, self, uid, coordinator, &rt->a, err, errlen);
	if (r < 0) {
		free(rt);
		return r;
	}
	*ret = (struct store_attempt *)(void *)rt;
	return r;
}

static int r_shard_resume(struct store_attempt *x, uint32_t rank, uint64_t size, uint64_t extent,
			  struct store_shard **ret, char *err, size_t errlen)
{
	struct rattempt *rt = RT(x);
	struct rshard *rs;
	int r;

	if (!rt->ops->shard_resume) {
		snprintf(err, errlen, "the %s backend resumes nothing", rt->ops->name);
		return -ENOTSUP;
	}
	rs = calloc(1, sizeof(*rs));
	if (!rs)
		return -ENOMEM;
	rs->ops = rt->ops;
	r = rt->ops->shard_resume(rt->a, rank, size, extent, &rs->s, err, errlen);
	if (r < 0) {
		free(rs);
		return r;
	}
	*ret = (struct store_shard *)(void *)rs;
	return 0;
}

static int r_shard_create(struct store_attempt *x, uint32_t rank, uint64_t size, uint64_t extent,
			  bool direct, struct store_shard **ret, char *err, size_t errlen)
{
	struct rattempt *rt = RT(x);
	struct rshard *rs = calloc(1, sizeof(*rs));
	int r;

	if (!rs)
		return -ENOMEM;
	rs->ops = rt->ops;
	r = rt->ops->shard_create(rt->a, rank, size, extent, direct, &rs->s, err, errlen);
	if (r < 0) {
		free(rs);
		return r;
	}
	*ret = (struct store_shard *)(void *)rs;
	return 0;
}

static const char *r_attempt_tag(const struct store_attempt *x)
{
	const struct rattempt *rt = (const struct rattempt *)(const void *)x;

	return rt->ops->attempt_tag(rt->a);
}

static void r_shard_write(struct store_shard *x, struct store_arena *ax, uint64_t arena_off,
			  uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	struct rshard *rs = RS(x);
	struct rarena *ra = RA(ax);
	struct store_arena *a = rs->ops == &store_s3 ? ra->s3 : ra->local;

	if (!a) {
		cb(ud, -ENOTSUP);
		return;
	}
	rs->ops->shard_write(rs->s, a, arena_off, file_off, len, cb, ud);
}

static bool r_shard_wants_crc(const struct store_shard *x)
{
	const struct rshard *rs = (const struct rshard *)(const void *)x;

	return rs->ops->shard_wants_crc && rs->ops->shard_wants_crc(rs->s);
}

static void r_shard_write_crc(struct store_shard *x, struct store_arena *ax, uint64_t arena_off,
			      uint64_t file_off, uint64_t len, uint32_t crc, store_io_cb cb,
			      void *ud)
{
	struct rshard *rs = RS(x);
	struct rarena *ra = RA(ax);
	struct store_arena *a = rs->ops == &store_s3 ? ra->s3 : ra->local;

	if (!a || !rs->ops->shard_write_crc) {
		cb(ud, -ENOTSUP);
		return;
	}
	rs->ops->shard_write_crc(rs->s, a, arena_off, file_off, len, crc, cb, ud);
}

static const char *r_shard_error(const struct store_shard *x)
{
	const struct store_ops *o = RS(x)->ops;

	return o->shard_error ? o->shard_error(RS(x)->s) : NULL;
}

static bool r_shard_spills(const struct store_shard *x)
{
	const struct rshard *rs = (const struct rshard *)(const void *)x;

	return rs->ops->shard_spills && rs->ops->shard_spills(rs->s);
}

static int r_shard_forward(struct store_shard *x, store_check_fn check, void *ud,
			   uint64_t *progress, char *err, size_t errlen)
{
	const struct store_ops *o = RS(x)->ops;

	if (!o->shard_forward) {
		snprintf(err, errlen, "the %s backend has no second tier", o->name);
		return -ENOTSUP;
	}
	return o->shard_forward(RS(x)->s, check, ud, progress, err, errlen);
}

static void r_shard_cancel(struct store_shard *x)
{
	if (RS(x)->ops->shard_cancel)
		RS(x)->ops->shard_cancel(RS(x)->s);
}

static int r_shard_finish(struct store_shard *x, uint64_t size, char *err, size_t errlen)
{
	return RS(x)->ops->shard_finish(RS(x)->s, size, err, errlen);
}

static int r_rank_publish(struct store_attempt *x, uint32_t rank, const char *text, char *err,
			  size_t errlen)
{
	return RT(x)->ops->rank_publish(RT(x)->a, rank, text, err, errlen);
}

static int r_attempt_claim(struct store_attempt *x, const struct store_writer *self,
			   char ret[STORE_ID_LEN + 1], char *err, size_t errlen)
{
	return RT(x)->ops->attempt_claim(RT(x)->a, self, ret, err, errlen);
}

static int r_attempt_addressee(struct store_attempt *x, char ret[STORE_ID_LEN + 1])
{
	return RT(x)->ops->attempt_addressee(RT(x)->a, ret);
}

static void r_shard_close(struct store_shard *x)
{
	if (!x)
		return;
	RS(x)->ops->shard_close(RS(x)->s);
	free(RS(x));
}

static int r_attempt_count(struct store_attempt *x, uint32_t world, const char *nonce,
			   const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			   size_t errlen)
{
	return RT(x)->ops->attempt_count(RT(x)->a, world, nonce, local, n_local, io_n, err,
					 errlen);
}

static int r_attempt_commit(struct store_attempt *x, const struct store_merge *m, char *err,
			    size_t errlen)
{
	return RT(x)->ops->attempt_commit(RT(x)->a, m, err, errlen);
}

static int r_attempt_poll(struct store_attempt *x, const char *id, char *err, size_t errlen)
{
	return RT(x)->ops->attempt_poll(RT(x)->a, id, err, errlen);
}

static int r_attempt_fail(struct store_attempt *x, const struct store_fail *f)
{
	return RT(x)->ops->attempt_fail(RT(x)->a, f);
}

static int r_attempt_renew(struct store_attempt *x, const struct store_writer *self, char *err,
			   size_t errlen)
{
	const struct store_ops *o = RT(x)->ops;

	return o->attempt_renew ? o->attempt_renew(RT(x)->a, self, err, errlen) : -EOPNOTSUPP;
}

static void r_attempt_close(struct store_attempt *x)
{
	if (!x)
		return;
	RT(x)->ops->attempt_close(RT(x)->a);
	free(RT(x));
}

static int r_list(const char *root, const char *dir,
		  int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud)
{
	return store_for_root(root)->list(root, dir, fn, ud);
}

static int r_read_range(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			void *buf)
{
	return store_for_root(ckpt)->read_range(ckpt, file, off, len, buf);
}

static int r_remove(const char *root, const char *name)
{
	return store_for_root(root)->remove(root, name);
}

const struct store_ops store_routed = {
	.name = "routed",
	.arena_attach = r_arena_attach,
	.arena_detach = r_arena_detach,
	.arena_fd = r_arena_fd,
	.arena_reap = r_arena_reap,
	.arena_read = r_arena_read,
	.arena_busy = r_arena_busy,
	.set_disk_depth = r_set_disk_depth,
	.root_open = r_root_open,
	.attempt_open = r_attempt_open,
	.attempt_resume = r_attempt_resume,
	.shard_resume = r_shard_resume,
	.shard_create = r_shard_create,
	.attempt_tag = r_attempt_tag,
	.shard_write = r_shard_write,
	.shard_wants_crc = r_shard_wants_crc,
	.shard_write_crc = r_shard_write_crc,
	.shard_finish = r_shard_finish,
	.shard_error = r_shard_error,
	.shard_spills = r_shard_spills,
	.shard_forward = r_shard_forward,
	.shard_cancel = r_shard_cancel,
	.rank_publish = r_rank_publish,
	.attempt_claim = r_attempt_claim,
	.attempt_addressee = r_attempt_addressee,
	.shard_close = r_shard_close,
	.attempt_count = r_attempt_count,
	.attempt_commit = r_attempt_commit,
	.attempt_poll = r_attempt_poll,
	.attempt_fail = r_attempt_fail,
	.attempt_renew = r_attempt_renew,
	.attempt_close = r_attempt_close,
	.list = r_list,
	.read_range = r_read_range,
	.remove = r_remove,
};
