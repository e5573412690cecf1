/* SPDX-License-Identifier: MIT */
/* share.c - the per-uid pools of pieces loads read (see share.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/loadio.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/share.h"
#include "daemon/users.h"
#include "shm/arena.h"
#include "shm/proto.h"

/* Entries of one pool, at most (lookups scan them). */
#define SHARE_MAX_ENTRIES 4096u

struct pool {
	struct list link;        /* server.pools, or server.dead_pools */
	struct server *srv;
	uid_t uid;
	char job[CKPT_MAX_JOB_LEN + 1];
	uint32_t gen;            /* never 0; new for every pool made */
	uint64_t size;
	int fd, ro_fd;           /* read-write (ours) and the read-only one clients get */
	uint8_t *map;
	struct store_arena *io;
	struct ev ev;
	bool ready, in_epoll, failed, dead;
	struct work make_job;    /* making it */
	char err[PROTO_MSG_LEN];
	struct list entries;     /* by pool offset */
	struct list lru;         /* READY, unpinned: least recently used first */
	uint32_t n_entries;
	uint32_t pins;           /* pins on entries + entries reading */
	uint64_t evicted;        /* entries dropped for room (status) */
	uint64_t refused;        /* reads it could not take: no room, or
	                          * across cells (status) */
	int64_t last_ms;
};

/* A file some client of (uid, job) has lent (share_lend). */
struct sfile {
	struct sfile *next;      /* in its server.sfiles bucket */
	uid_t uid;
	char job[CKPT_MAX_JOB_LEN + 1];
	dev_t dev;
	ino_t ino;
	uint32_t lenders;
};

struct pentry {
	struct list by_off;      /* pool.entries */
	struct sfile *sf;        /* NULL once no client has the file lent:
	                          * freed when unpinned */
	struct list lru;         /* pool.lru while unpinned and READY */
	bool in_lru, ready;
	struct pool *p;
	off_t fsize;             /* with the times, what fstat said of the file
	                          * (its device and inode are sf's) */
	struct timespec mtime, ctime;
	uint64_t file_off;       /* its cell's first byte */
	uint64_t len;            /* the cell up to the end of the file (on
	                          * the O_DIRECT grid): its room at `off` */
	uint64_t off;
	uint64_t got;
	uint32_t reader_id;      /* the connection whose request read it */
	uint32_t refs;
	struct share_wait *waiters;
};

static struct pool *pool_of(struct server *srv, uid_t uid, const char *job)
{
	struct list *l;

	list_for_each(l, &srv->pools)
	{
		struct pool *p = list_entry(l, struct pool, link);
		if (p->uid == uid && strcmp(p->job, job) == 0)
			return p;
	}
	return NULL;
}

static unsigned sfile_bucket(uid_t uid, const char *job, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)uid * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)dev * 0xc2b2ae3d27d4eb4full) ^
		     ((uint64_t)ino * 0x165667b19e3779f9ull);

	for (const char *s = job; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return (unsigned)((h ^ (h >> 29)) % (sizeof(((struct server *)0)->sfiles) /
					     sizeof(((struct server *)0)->sfiles[0])));
}

/* ---- making and freeing ---- */

static void make_run(struct work *w)
{
	struct pool *p = (struct pool *)((char *)w - offsetof(struct pool, make_job));
	char name[64], path[64], err[PROTO_MSG_LEN] = "";
	void *addr;
	int fd, r;

	snprintf(name, sizeof(name), "ckptd-share-%u", (unsigned)p->uid);
	fd = arena_create_sealed(name, p->size, F_SEAL_FUTURE_WRITE, &addr);
	if (fd < 0) {
		w->res = fd;
		snprintf(w->err, sizeof(w->err), "cannot make a %llu-byte pool: %s",
			 (unsigned long long)p->size, strerror(-fd));
		return;
	}
	p->fd = fd;
	p->map = addr;
	/* Any descriptor of a memfd can be reopened read-write through /proc;
	 * the seal is what keeps this one from writing. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	p->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (p->ro_fd < 0) {
		w->res = -errno;
		snprintf(w->err, sizeof(w->err), "cannot reopen the pool read-only: %s",
			 strerror(errno));
		return;
	}
	r = p->srv->store->arena_attach(addr, p->size, p->srv->cfg.uring_depth, &p->io, err,
					sizeof(err));
	if (r < 0) {
		w->res = r;
		snprintf(w->err, sizeof(w->err), "%s", err);
	}
}

struct unmap_job {
	struct work w;
	const struct store_ops *store;
	struct store_arena *io;
	uint8_t *map;
	uint64_t size;
	int fd, ro_fd;
};

static void unmap_run(struct work *w)
{
	struct unmap_job *j = (struct unmap_job *)w;

	/* Detach first: the ring's registration pins the pages. */
	if (j->io)
		j->store->arena_detach(j->io);
	if (j->map)
		munmap(j->map, j->size);
	if (j->fd >= 0)
		close(j->fd);
	if (j->ro_fd >= 0)
		close(j->ro_fd);
}

static void unmap_done(struct work *w)
{
	free(w);
}

/* Frees a pool nobody pins and nothing reads (entries included).  Its
 * bytes count as free at once; a worker unmaps them. */
static void pool_free(struct server *srv, struct pool *p, bool now)
{
	struct list *l, *t;
	struct unmap_job *j;

	list_for_each_safe(l, t, &p->entries)
	{
		struct pentry *e = list_entry(l, struct pentry, by_off);
		free(e);
	}
	if (p->in_epoll)
		epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->store->arena_fd(p->io), NULL);
	j = now ? NULL : calloc(1, sizeof(*j));
	if (j) {
		*j = (struct unmap_job){ .w = { .run = unmap_run, .done = unmap_done },
					 .store = srv->store, .io = p->io, .map = p->map,
					 .size = p->size, .fd = p->fd, .ro_fd = p->ro_fd };
		workers_submit(&srv->arenas, &j->w);
	} else {
		struct unmap_job one = { .store = srv->store, .io = p->io, .map = p->map,
					 .size = p->size, .fd = p->fd, .ro_fd = p->ro_fd };
		unmap_run(&one.w);
	}
	srv->share_bytes -= p->size;
	list_del(&p->link);
	if (now) {
		free(p);
		return;
	}
	/* An epoll event of this round may still name it: freed by
	 * share_reap, after the round. */
	p->io = NULL;
	p->dead = true;
	list_add_tail(&srv->dead_pools, &p->link);
}

void share_reap(struct server *srv)
{
	while (!list_empty(&srv->dead_pools)) {
		struct list *l = srv->dead_pools.next;
		list_del(l);
		free(list_entry(l, struct pool, link));
	}
}

static void make_done(struct work *w)
{
	struct pool *p = (struct pool *)((char *)w - offsetof(struct pool, make_job));
	struct server *srv = p->srv;

	if (w->res == 0) {
		struct epoll_event ee = { .events = EPOLLIN, .data.ptr = &p->ev };
		if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->store->arena_fd(p->io), &ee) < 0) {
			w->res = -errno;
			snprintf(w->err, sizeof(w->err), "epoll: %s", strerror(errno));
		} else {
			p->in_epoll = true;
		}
	}
	p->make_job.run = NULL;
	p->last_ms = now_ms();
	if (w->res < 0) {
		/* Kept (as failed, holding no memory) so that every read of
		 * the uid does not try again at once; share_tick drops it. */
		log_warn("share: no pool for uid %u, loads read on their own: %s",
			 (unsigned)p->uid, w->err);
		p->failed = true;
		if (p->io)
			srv->store->arena_detach(p->io);
		if (p->map)
			munmap(p->map, p->size);
		if (p->fd >= 0)
			close(p->fd);
		if (p->ro_fd >= 0)
			close(p->ro_fd);
		p->io = NULL;
		p->map = NULL;
		p->fd = p->ro_fd = -1;
		srv->share_bytes -= p->size;
		p->size = 0;
		return;
	}
	p->ready = true;
	log_info("share: a %llu MiB pool for the loads of uid %u job '%s'",
		 (unsigned long long)(p->size >> 20), (unsigned)p->uid, p->job);
}

/* The pool of sf's (uid, job) if it is ready; else, if sf is lent by two
 * clients or more (there is something to share), starts making one when
 * there is room, and returns NULL. */
static struct pool *pool_get(struct server *srv, const struct sfile *sf)
{
	struct pool *p = pool_of(srv, sf->uid, sf->job);
	uint64_t size = srv->cfg.load_share;

	if (size > srv->cfg.arena_total / 2)
		size = srv->cfg.arena_total / 2;
	size = size / (1ull << 20) * (1ull << 20);

	if (p)
		return p->ready ? p : NULL;
	if (size < (16ull << 20) || srv->stopping || sf->lenders < 2)
		return NULL;
	if (!users_fit_total(srv, size))
		return NULL; /* resident images are not evicted for a cache */
	if (!users_fit_staging(srv, sf->uid, size))
		return NULL; /* the uid's share is its arenas' first */
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->srv = srv;
	p->uid = sf->uid;
	snprintf(p->job, sizeof(p->job), "%s", sf->job);
	p->gen = ++srv->pool_gen ? srv->pool_gen : ++srv->pool_gen;
	p->size = size;
	p->fd = p->ro_fd = -1;
	p->ev = (struct ev){ .kind = EV_POOL, .ptr = p };
	list_init(&p->entries);
	list_init(&p->lru);
	srv->share_bytes += size;
	list_add_tail(&srv->pools, &p->link);
	p->make_job = (struct work){ .run = make_run, .done = make_done };
	workers_submit(&srv->arenas, &p->make_job);
	return NULL;
}

/* ---- entries ---- */

static bool same_file(const struct pentry *e, const struct stat *st)
{
	return e->fsize == st->st_size &&
	       e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec &&
	       e->ctime.tv_sec == st->st_ctim.tv_sec && e->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static void lru_out(struct pentry *e)
{
	if (e->in_lru) {
		list_del(&e->lru);
		e->in_lru = false;
	}
}

static void entry_free(struct pool *p, struct pentry *e)
{
	lru_out(e);
	list_del(&e->by_off);
	p->n_entries--;
	free(e);
}

/* Room for len bytes: the first gap between entries (by offset) that
 * holds it, evicting unpinned entries, least recently used first, until
 * one does.  Returns the entry after the gap (or the list head) in *ret_at
 * and the offset, or false. */
static bool find_gap(struct pool *p, uint64_t len, struct list **ret_at, uint64_t *ret_off)
{
	uint64_t at = 0;
	struct list *l;

	if (p->n_entries < SHARE_MAX_ENTRIES) {
		list_for_each(l, &p->entries)
		{
			struct pentry *e = list_entry(l, struct pentry, by_off);
			if (e->off - at >= len) {
				*ret_at = l;
				*ret_off = at;
				return true;
			}
			at = e->off + e->len;
		}
		if (p->size - at >= len) {
			*ret_at = &p->entries;
			*ret_off = at;
			return true;
		}
	}
	/* Evictions, least recently used first; only the gap around the
	 * evicted entry changes, so each costs O(1), not another scan. */
	while (!list_empty(&p->lru)) {
		struct pentry *e = list_entry(p->lru.next, struct pentry, lru);
		struct list *prev = e->by_off.prev, *next = e->by_off.next;
		uint64_t b = prev == &p->entries ? 0 :
			     list_entry(prev, struct pentry, by_off)->off +
				     list_entry(prev, struct pentry, by_off)->len;
		uint64_t end = next == &p->entries ? p->size :
			       list_entry(next, struct pentry, by_off)->off;

		entry_free(p, e);
		p->evicted++;
		if (end - b >= len && p->n_entries < SHARE_MAX_ENTRIES) {
			*ret_at = next;
			*ret_off = b;
			return true;
		}
	}
	return false;
}

struct sfile *share_lend(struct server *srv, uid_t uid, const char *job, const struct stat *st)
{
	unsigned b = sfile_bucket(uid, job, st->st_dev, st->st_ino);
	struct sfile *f;

	for (f = srv->sfiles[b]; f; f = f->next)
		if (f->uid == uid && f->dev == st->st_dev && f->ino == st->st_ino &&
		    strcmp(f->job, job) == 0)
			break;
	if (!f) {
		f = calloc(1, sizeof(*f));
		if (!f)
			return NULL;
		f->uid = uid;
		snprintf(f->job, sizeof(f->job), "%s", job);
		f->dev = st->st_dev;
		f->ino = st->st_ino;
		f->next = srv->sfiles[b];
		srv->sfiles[b] = f;
	}
	f->lenders++;
	return f;
}

void share_unlend(struct server *srv, struct sfile *f)
{
	struct pool *p;
	struct sfile **pp;

	if (!f || --f->lenders)
		return;
	p = pool_of(srv, f->uid, f->job);
	if (p) {
		struct list *l, *t;
		list_for_each_safe(l, t, &p->entries)
		{
			struct pentry *e = list_entry(l, struct pentry, by_off);
			if (e->sf != f)
				continue;
			e->sf = NULL;
			if (e->refs == 0 && e->ready)
				entry_free(p, e);
		}
	}
	for (pp = &srv->sfiles[sfile_bucket(f->uid, f->job, f->dev, f->ino)]; *pp;
	     pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	}
	free(f);
}

/* An entry nobody pins any more: kept (most recently used) while its file
 * is lent, else freed. */
static void unpinned(struct pool *p, struct pentry *e)
{
	if (!e->sf) {
		entry_free(p, e);
		return;
	}
	list_add_tail(&p->lru, &e->lru);
	e->in_lru = true;
}

static void notify(struct pentry *e, int res)
{
	struct share_wait *w = e->waiters;

	e->waiters = NULL;
	while (w) {
		struct share_wait *next = w->next;
		w->next = NULL;
		w->cb(w, res);
		w = next;
	}
}

static void read_done(void *owner, int err, uint64_t got)
{
	struct pentry *e = owner;
	struct pool *p = e->p;
	struct server *srv = p->srv;

	e->got = got;
	/* Short before the end of the file as it was when asked: not a
	 * piece to keep for others (each reads on its own instead). */
	if (!err && e->got < e->len && e->file_off + e->got < (uint64_t)e->fsize)
		err = -EIO;
	p->pins--; /* the read's own */
	p->last_ms = now_ms();
	if (err) {
		/* Every waiter reads on its own (and so meets the error, or
		 * not, with its own descriptor); the entry goes. */
		e->refs = 0;
		if (err != -ENOMEM)
			log_debug("share: reading %llu bytes at %llu into the pool: %s",
				  (unsigned long long)e->len, (unsigned long long)e->file_off,
				  strerror(-err));
		struct share_wait *w = e->waiters;
		e->waiters = NULL;
		entry_free(p, e);
		while (w) {
			struct share_wait *next = w->next;
			w->next = NULL;
			w->e = NULL;
			p->pins--;
			w->cb(w, err);
			w = next;
		}
		return;
	}
	srv->load_disk_bytes += e->got;
	e->ready = true;
	/* A waiter may drop its pin at once (its client left): hold the
	 * entry until every waiter has run. */
	e->refs++;
	notify(e, 0);
	if (--e->refs == 0)
		unpinned(p, e);
}

bool share_get(struct server *srv, struct sfile *sf, int fd, const struct stat *st,
	       struct share_wait *w)
{
	struct pool *p = sf ? pool_get(srv, sf) : NULL;
	uint64_t cell = w->file_off / PROTO_LOAD_CELL * PROTO_LOAD_CELL, end, len;
	struct pentry *e = NULL;
	struct list *l, *at;
	uint64_t off;

	if (!p)
		return false;
	p->last_ms = now_ms();
	/* Entries are whole cells: a read across two would need bytes of two
	 * entries side by side (the client cuts its reads at the grid). */
	if (w->len == 0 || (w->file_off + w->len - 1) / PROTO_LOAD_CELL != cell / PROTO_LOAD_CELL) {
		p->refused++;
		return false;
	}
	/* The cell up to the end of the file (on the O_DIRECT grid): a
	 * small file's cell takes only its own room.  A read that starts
	 * there or beyond (a truncated file) is answered without the pool,
	 * short, as a read of the file itself would be. */
	end = ((uint64_t)st->st_size + PROTO_LOAD_ALIGN - 1) / PROTO_LOAD_ALIGN * PROTO_LOAD_ALIGN;
	if (w->file_off >= end)
		return false;
	list_for_each(l, &p->entries)
	{
		struct pentry *x = list_entry(l, struct pentry, by_off);
		if (x->sf == sf && x->file_off == cell && same_file(x, st)) {
			e = x;
			break;
		}
	}
	if (e) {
		w->e = e;
		w->reader = e->reader_id == w->who;
		e->refs++;
		p->pins++;
		lru_out(e);
		if (e->ready) {
			/* Most recently used: to the tail when unpinned. */
			w->cb(w, 0);
		} else {
			w->next = e->waiters;
			e->waiters = w;
		}
		return true;
	}
	len = end - cell < PROTO_LOAD_CELL ? end - cell : PROTO_LOAD_CELL;
	if (len > p->size || !find_gap(p, len, &at, &off)) {
		p->refused++;
		return false;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return false;
	e->p = p;
	e->sf = sf;
	e->reader_id = w->who;
	e->fsize = st->st_size;
	e->mtime = st->st_mtim;
	e->ctime = st->st_ctim;
	e->file_off = cell;
	e->len = len;
	e->off = off;
	e->refs = 1;
	list_add_tail(at, &e->by_off); /* before `at`: keeps the offset order */
	p->n_entries++;
	p->pins += 2; /* the waiter's pin and the read's own */
	w->e = e;
	w->reader = true;
	w->next = NULL;
	e->waiters = w;
	/* read_done may run at once (an allocation failure) and answer w. */
	loadio_read_pieces(srv->store, p->io, fd, off, cell, len, read_done, e);
	return true;
}

uint64_t share_got(const struct share_wait *w, uint64_t *ret_pool_off, uint32_t *ret_gen,
		   int *ret_fd)
{
	const struct pentry *e = w->e;
	uint64_t rel = w->file_off - e->file_off;

	*ret_pool_off = e->off + rel;
	*ret_gen = e->p->gen;
	*ret_fd = e->p->ro_fd;
	if (e->got <= rel) {
		/* Nothing of the cell read reaches this piece (the file ended
		 * before it): an offset inside the entry, never past the pool,
		 * with no bytes. */
		*ret_pool_off = e->off;
		return 0;
	}
	return e->got - rel < w->len ? e->got - rel : w->len;
}

void share_put(struct server *srv, struct pentry *e)
{
	struct pool *p = e->p;

	(void)srv;
	p->pins--;
	p->last_ms = now_ms();
	if (--e->refs == 0 && e->ready)
		unpinned(p, e);
}

void share_io_event(struct pool *p)
{
	if (!p->dead)
		p->srv->store->arena_reap(p->io);
}

static bool idle(const struct pool *p)
{
	return !p->make_job.run && p->pins == 0 && (!p->io || p->srv->store->arena_busy(p->io) == 0);
}

void share_tick(struct server *srv)
{
	struct list *l, *t;

	list_for_each_safe(l, t, &srv->pools)
	{
		struct pool *p = list_entry(l, struct pool, link);
		if (idle(p) && now_ms() - p->last_ms > SHARE_IDLE_MS) {
			if (!p->failed)
				log_info("share: freed the idle pool of uid %u", (unsigned)p->uid);
			pool_free(srv, p, false);
		}
	}
}

uint64_t share_bytes_of(const struct server *srv, uid_t uid)
{
	const struct list *l;
	uint64_t n = 0;

	list_for_each(l, &srv->pools)
	{
		const struct pool *p = list_entry(l, struct pool, link);
		if (p->uid == uid)
			n += p->size;
	}
	return n;
}

void share_each(const struct server *srv, void (*fn)(void *ud, uid_t uid, uint64_t bytes),
		void *ud)
{
	const struct list *l;

	list_for_each(l, &srv->pools)
	{
		const struct pool *p = list_entry(l, struct pool, link);
		fn(ud, p->uid, p->size);
	}
}

bool share_make_room(struct server *srv, uid_t uid, uint64_t need)
{
	struct list *l, *t;

	list_for_each_safe(l, t, &srv->pools)
	{
		struct pool *p = list_entry(l, struct pool, link);
		bool total = users_fit_total(srv, need);

		if (total && users_fit_staging(srv, uid, need))
			break;
		if (!idle(p))
			continue;
		if (p->uid != uid && (total || !users_may_evict(srv, uid, need)))
			continue;
		log_info("share: freed the pool of uid %u to make room for an arena of uid %u",
			 (unsigned)p->uid, (unsigned)uid);
		pool_free(srv, p, false);
	}
	return users_fit_total(srv, need);
}

bool share_busy(struct server *srv)
{
	struct list *l;
	bool busy = false;

	list_for_each(l, &srv->pools)
	{
		struct pool *p = list_entry(l, struct pool, link);
		if (p->io && srv->store->arena_busy(p->io)) {
			srv->store->arena_reap(p->io);
			busy = true;
		}
	}
	return busy;
}

void share_free_all(struct server *srv)
{
	while (!list_empty(&srv->pools))
		pool_free(srv, list_entry(srv->pools.next, struct pool, link), true);
}

void share_status(const struct server *srv, void *arr, uid_t uid, bool all)
{
	const struct list *l;

	list_for_each(l, &srv->pools)
	{
		const struct pool *p = list_entry(l, struct pool, link);
		uint64_t held = 0;
		const struct list *k;

		if (!all && p->uid != uid)
			continue;
		list_for_each(k, &p->entries)
			held += list_entry(k, struct pentry, by_off)->len;
		json_array_append_new(
			arr, json_pack("{s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "uid",
				       (json_int_t)p->uid, "job", p->job, "bytes",
				       (json_int_t)p->size, "held_bytes", (json_int_t)held,
				       "entries", (json_int_t)p->n_entries, "pins",
				       (json_int_t)p->pins, "evicted", (json_int_t)p->evicted,
				       "refused", (json_int_t)p->refused, "ready", p->ready));
	}
}
