/* SPDX-License-Identifier: MIT */
/*
 * client.c - a client's life: connecting to ckptd, the receiver thread, and
 * disconnecting.
 *
 * The receiver is the only reader of the socket.  It never blocks on
 * anything but recvmsg() and the client lock, so slots come back to the copy
 * threads as fast as the daemon releases them.  It only routes: RELEASE goes
 * to the slot allocator, SAVE_ACK and SAVE_DONE to save.c, which owns every
 * change of a save's state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/internal.h"
#include "format/names.h"

static void broadcast_all(struct ckpt_client *c)
{
	pthread_cond_broadcast(&c->slot_cv);
	pthread_cond_broadcast(&c->copy_cv);
	pthread_cond_broadcast(&c->save_cv);
	pthread_cond_broadcast(&c->res_cv);
}

void cli_conn_dead_locked(struct ckpt_client *c, const char *detail)
{
	if (c->dead)
		return;
	c->dead = true;
	snprintf(c->dead_msg, sizeof(c->dead_msg), "connection to ckptd lost: %s", detail);
	if (!c->stopping)
		cli_log(CKPT_LOG_ERROR, "%s", c->dead_msg);
	saves_conn_lost_locked(c);
	/* Tell the daemon too, and make the receiver's recvmsg() return. */
	shutdown(c->sock, SHUT_RDWR);
	broadcast_all(c);
}

/* ---- the receiver ---- */

/* Handles one valid message.  Returns 0, or -EBADMSG with the reason in
 * detail: the daemon broke the protocol and the connection must die. */
static int handle_msg(struct ckpt_client *c, int type, const void *buf, char *detail, size_t dlen)
{
	switch (type) {
	case PROTO_RELEASE: {
		const struct proto_release *m = buf;
		if (m->arena_off % c->slot_bytes || m->arena_off >= c->arena_bytes ||
		    arena_slots_put(&c->slots, (uint32_t)(m->arena_off / c->slot_bytes), 1) < 0) {
			snprintf(detail, dlen, "RELEASE of arena offset %llu, which is not a slot "
				 "the client handed over", (unsigned long long)m->arena_off);
			return -EBADMSG;
		}
		pthread_cond_broadcast(&c->slot_cv);
		return 0;
	}
	case PROTO_SAVE_ACK:
		return save_on_ack_locked(c, buf, detail, dlen);
	case PROTO_SAVE_DONE:
		return save_on_done_locked(c, buf, detail, dlen);
	case PROTO_SAVE_DURABLE:
		return save_on_durable_locked(c, buf, detail, dlen);
	case PROTO_ERROR: {
		const struct proto_error *m = buf;
		snprintf(detail, dlen, "ckptd: %.490s", m->msg[0] ? m->msg : strerror(-m->err));
		return -EBADMSG;
	}
	default:
		snprintf(detail, dlen, "unexpected message type %d", type);
		return -EBADMSG;
	}
}

/* Maps a pool the daemon sent (fd taken). */
static struct cli_pool *pool_map_locked(struct ckpt_client *c, uint32_t gen, int fd)
{
	struct cli_pool *p = calloc(1, sizeof(*p));
	struct stat st;
	void *map = MAP_FAILED;

	if (p && fstat(fd, &st) == 0 && st.st_size > 0)
		map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		close(fd);
		free(p);
		return NULL;
	}
	p->fd = fd;
	p->gen = gen;
	p->map = map;
	p->size = (uint64_t)st.st_size;
	p->next = c->pools;
	c->pools = p;
	/* An older pool nobody reads any more goes now. */
	for (struct cli_pool **pp = &p->next; *pp;) {
		struct cli_pool *o = *pp;
		if (o->users == 0) {
			*pp = o->next;
			munmap((void *)o->map, o->size);
			close(o->fd);
			free(o);
		} else {
			pp = &o->next;
		}
	}
	return p;
}

/* A LOAD_DONE, and the pool's descriptor if one came (taken). */
static int on_load_done_locked(struct ckpt_client *c, const struct proto_load_done *m, int fd,
			       char *detail, size_t dlen)
{
	struct cli_pool *p = NULL;

	if (fd >= 0 && !(m->flags & PROTO_DONE_POOL)) {
		close(fd);
		snprintf(detail, dlen, "LOAD_DONE outside the pool carries a descriptor");
		return -EBADMSG;
	}
	if (m->flags & PROTO_DONE_POOL) {
		if (fd >= 0) {
			p = pool_map_locked(c, m->pool_gen, fd);
			if (!p) {
				snprintf(detail, dlen, "cannot map ckptd's pool: %s", strerror(errno));
				return -EBADMSG;
			}
		} else {
			for (p = c->pools; p && p->gen != m->pool_gen; p = p->next)
				;
		}
		if (!p || m->pool_off > p->size || m->got > p->size - m->pool_off) {
			snprintf(detail, dlen, "LOAD_DONE for token %u names %s", m->token,
				 p ? "bytes outside the pool" : "a pool it never sent");
			return -EBADMSG;
		}
	}
	for (struct cli_lread *w = c->lwaits; w; w = w->next) {
		if (w->token == m->token && !w->done) {
			if (m->got > w->len) {
				snprintf(detail, dlen, "LOAD_DONE for token %u says %llu bytes of a "
					 "%llu-byte read", m->token, (unsigned long long)m->got,
					 (unsigned long long)w->len);
				return -EBADMSG;
			}
			if (p && !w->offered) {
				snprintf(detail, dlen, "LOAD_DONE in the pool for token %u, which "
					 "did not offer it", m->token);
				return -EBADMSG;
			}
			w->done = true;
			w->err = m->err;
			w->got = m->got;
			if (p) {
				p->users++;
				w->pool = p;
				w->pool_off = m->pool_off;
				w->bytes = (const char *)p->map + m->pool_off;
				w->shared = m->flags & PROTO_DONE_SHARED;
			}
			pthread_cond_broadcast(&c->res_cv);
			return 0;
		}
	}
	snprintf(detail, dlen, "LOAD_DONE for token %u, which no read awaits", m->token);
	return -EBADMSG;
}

void cli_load_release(struct ckpt_client *c, struct cli_lread *lr)
{
	struct proto_load_release m;

	if (!lr->pool)
		return;
	memset(&m, 0, sizeof(m));
	proto_init(&m.h, PROTO_LOAD_RELEASE, sizeof(m));
	m.token = lr->token;
	(void)proto_send(c->sock, &m, sizeof(m), -1);
	pthread_mutex_lock(&c->lock);
	lr->pool->users--;
	if (lr->pool->users == 0 && lr->pool != c->pools) {
		for (struct cli_pool **pp = &c->pools; *pp; pp = &(*pp)->next) {
			if (*pp == lr->pool) {
				*pp = lr->pool->next;
				munmap((void *)lr->pool->map, lr->pool->size);
				close(lr->pool->fd);
				free(lr->pool);
				break;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	lr->pool = NULL;
	lr->bytes = NULL;
}

static void abs_deadline(struct timespec *dl, int64_t timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, dl);
	dl->tv_sec += timeout_ms / 1000;
	dl->tv_nsec += (timeout_ms % 1000) * 1000000;
	if (dl->tv_nsec >= 1000000000) {
		dl->tv_sec++;
		dl->tv_nsec -= 1000000000;
	}
}

/* A free handle, marked taken: 0, -EMFILE or -ECONNRESET. */
static int lhandle_take(struct ckpt_client *c, uint32_t *ret)
{
	uint32_t h = PROTO_LOAD_FILES;
	int r;

	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < PROTO_LOAD_FILES / 64 && h == PROTO_LOAD_FILES; i++)
		if (~c->lhandles[i])
			h = i * 64 + (uint32_t)__builtin_ctzll(~c->lhandles[i]);
	if (h < PROTO_LOAD_FILES)
		c->lhandles[h / 64] |= 1ull << (h % 64);
	r = c->dead ? -ECONNRESET : h == PROTO_LOAD_FILES ? -EMFILE : 0;
	pthread_mutex_unlock(&c->lock);
	if (r == -ECONNRESET) {
		cli_load_unlend(c, h);
		return r;
	}
	*ret = h;
	return r;
}

/* Sends the lending message of handle h (taken); the handle is free
 * again if it cannot be sent. */
static int lhandle_send(struct ckpt_client *c, uint32_t h, const void *m, size_t len, int fd,
			uint32_t *ret_handle)
{
	int r = proto_send(c->sock, m, len, fd);

	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		c->lhandles[h / 64] &= ~(1ull << (h % 64));
		pthread_mutex_unlock(&c->lock);
		return r;
	}
	*ret_handle = h;
	return 0;
}

int cli_load_lend(struct ckpt_client *c, int fd, uint32_t *ret_handle)
{
	struct proto_load_file m;
	uint32_t h;
	int r = lhandle_take(c, &h);

	if (r)
		return r;
	proto_init(&m.h, PROTO_LOAD_FILE, sizeof(m));
	m.handle = h;
	return lhandle_send(c, h, &m, sizeof(m), fd, ret_handle);
}

int cli_load_lend_object(struct ckpt_client *c, const char *ckpt, const char *file,
			 uint64_t size, uint32_t *ret_handle)
{
	struct proto_load_object m;
	uint32_t h;
	int r;

	if (strlen(ckpt) >= sizeof(m.ckpt) || strlen(file) >= sizeof(m.file))
		return -ENAMETOOLONG;
	r = lhandle_take(c, &h);
	if (r)
		return r;
	proto_init(&m.h, PROTO_LOAD_OBJECT, sizeof(m));
	m.handle = h;
	m.size = size;
	snprintf(m.ckpt, sizeof(m.ckpt), "%s", ckpt);
	snprintf(m.file, sizeof(m.file), "%s", file);
	return lhandle_send(c, h, &m, sizeof(m), -1, ret_handle);
}

void cli_load_unlend(struct ckpt_client *c, uint32_t handle)
{
	struct proto_load_close m;

	if (handle >= PROTO_LOAD_FILES)
		return;
	proto_init(&m.h, PROTO_LOAD_CLOSE, sizeof(m));
	m.handle = handle;
	/* Sent before the handle is free again: the daemon closes the old
	 * descriptor before any LOAD_FILE that reuses the handle arrives. */
	(void)proto_send(c->sock, &m, sizeof(m), -1);
	pthread_mutex_lock(&c->lock);
	c->lhandles[handle / 64] &= ~(1ull << (handle % 64));
	pthread_mutex_unlock(&c->lock);
}

int64_t cli_arena_take(struct ckpt_client *c, uint32_t count, int64_t timeout_ms)
{
	struct timespec dl;
	int64_t first;
	int w = 0;

	if (count == 0 || count > c->slots.n_slots)
		return -E2BIG;
	abs_deadline(&dl, timeout_ms);
	pthread_mutex_lock(&c->lock);
	while ((first = arena_slots_take(&c->slots, count)) < 0 && !c->dead && w != ETIMEDOUT)
		w = pthread_cond_timedwait(&c->slot_cv, &c->lock, &dl);
	if (first < 0)
		first = c->dead ? -ECONNRESET : -ETIMEDOUT;
	pthread_mutex_unlock(&c->lock);
	return first;
}

void cli_arena_put(struct ckpt_client *c, uint32_t first, uint32_t count)
{
	pthread_mutex_lock(&c->lock);
	(void)arena_slots_put(&c->slots, first, count);
	pthread_cond_broadcast(&c->slot_cv);
	pthread_mutex_unlock(&c->lock);
}

int cli_load_reserve(struct ckpt_client *c, uint32_t n)
{
	int r = 0;

	if (n > PROTO_LOAD_INFLIGHT)
		return -E2BIG;
	pthread_mutex_lock(&c->lock);
	while (c->lreads_held + n > PROTO_LOAD_INFLIGHT && !c->dead)
		pthread_cond_wait(&c->res_cv, &c->lock);
	if (c->dead)
		r = -ECONNRESET;
	else
		c->lreads_held += n;
	pthread_mutex_unlock(&c->lock);
	return r;
}

void cli_load_unreserve(struct ckpt_client *c, uint32_t n)
{
	pthread_mutex_lock(&c->lock);
	c->lreads_held -= n;
	pthread_cond_broadcast(&c->res_cv);
	pthread_mutex_unlock(&c->lock);
}

void cli_load_send(struct ckpt_client *c, uint32_t handle, uint64_t file_off, uint64_t len,
		   uint64_t arena_off, bool offer, struct cli_lread *w)
{
	struct proto_load_read m;

	memset(&m, 0, sizeof(m));
	memset(w, 0, sizeof(*w));
	proto_init(&m.h, PROTO_LOAD_READ, sizeof(m));
	if (c->share && offer)
		m.flags = PROTO_LOAD_SHARE;
	w->offered = c->share && offer;
	pthread_mutex_lock(&c->lock);
	if (c->dead) {
		w->send_err = -ECONNRESET;
		pthread_mutex_unlock(&c->lock);
		return;
	}
	w->len = len;
	w->token = ++c->lread_next;
	w->next = c->lwaits;
	c->lwaits = w;
	w->listed = true;
	pthread_mutex_unlock(&c->lock);
	m.token = w->token;
	m.handle = handle;
	m.file_off = file_off;
	m.len = len;
	m.arena_off = arena_off;
	w->send_err = proto_send(c->sock, &m, sizeof(m), -1);
}

int64_t cli_load_wait(struct ckpt_client *c, struct cli_lread *w)
{
	int64_t r = w->send_err;

	if (!w->listed)
		return r;
	pthread_mutex_lock(&c->lock);
	/* No timeout: the daemon answers every read (a disk that hangs
	 * hangs the read as it would a pread); a dead connection ends it. */
	while (r == 0 && !w->done && !c->dead)
		pthread_cond_wait(&c->res_cv, &c->lock);
	for (struct cli_lread **pp = &c->lwaits; *pp; pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	}
	w->listed = false;
	if (r == 0)
		r = !w->done ? -ECONNRESET : w->err ? w->err : (int64_t)w->got;
	pthread_mutex_unlock(&c->lock);
	return r;
}

/* A RESIDENT_REPLY and the fd that came with it (taken or closed). */
static int on_resident_locked(struct ckpt_client *c, const struct proto_resident_reply *m,
			      int fd, char *detail, size_t dlen)
{
	if ((m->err == 0) != (fd >= 0)) {
		if (fd >= 0)
			close(fd);
		snprintf(detail, dlen, "RESIDENT_REPLY %s a descriptor",
			 m->err ? "with an error carries" : "lacks");
		return -EBADMSG;
	}
	if (m->token == 0 || m->token != c->res_token) {
		/* The answer to a request that timed out. */
		if (fd >= 0)
			close(fd);
		return 0;
	}
	c->res_token = 0;
	c->res_done = true;
	c->res_err = m->err;
	c->res_fd = fd;
	c->res_size = m->size;
	snprintf(c->res_msg, sizeof(c->res_msg), "%s", m->msg);
	pthread_cond_broadcast(&c->res_cv);
	return 0;
}

int cli_resident_get(struct ckpt_client *c, const char *attempt, const char *where,
		     uint32_t rank, int64_t timeout_ms, int *ret_fd, uint64_t *ret_size)
{
	struct proto_resident_req req;
	struct timespec dl;
	int r = 0;

	if (strlen(attempt) >= sizeof(req.attempt) || strlen(where) >= sizeof(req.where))
		return -EINVAL;
	abs_deadline(&dl, timeout_ms);
	pthread_mutex_lock(&c->lock);
	while (c->res_busy && !c->dead && r == 0)
		r = -pthread_cond_timedwait(&c->res_cv, &c->lock, &dl);
	if (c->dead || r) {
		pthread_mutex_unlock(&c->lock);
		return c->dead ? -ECONNRESET : -ETIMEDOUT;
	}
	c->res_busy = true;
	c->res_done = false;
	c->res_token = ++c->res_next ? c->res_next : ++c->res_next;
	proto_init(&req.h, PROTO_RESIDENT_REQ, sizeof(req));
	req.token = c->res_token;
	req.rank = rank;
	snprintf(req.attempt, sizeof(req.attempt), "%s", attempt);
	snprintf(req.where, sizeof(req.where), "%s", where);
	pthread_mutex_unlock(&c->lock);

	/* Saves send on this socket from other threads too: a SEQPACKET
	 * message goes out whole, never interleaved. */
	r = proto_send(c->sock, &req, sizeof(req), -1);

	pthread_mutex_lock(&c->lock);
	while (r == 0 && !c->res_done && !c->dead) {
		int w = pthread_cond_timedwait(&c->res_cv, &c->lock, &dl);
		if (w == ETIMEDOUT && !c->res_done)
			r = -ETIMEDOUT;
	}
	if (r == 0 && !c->res_done)
		r = -ECONNRESET;
	if (r == 0) {
		r = c->res_err;
		*ret_fd = c->res_fd;
		*ret_size = c->res_size;
	}
	c->res_fd = -1;
	c->res_token = 0;
	c->res_busy = false;
	pthread_cond_broadcast(&c->res_cv);
	pthread_mutex_unlock(&c->lock);
	return r;
}

static void *recv_thread_main(void *arg)
{
	struct ckpt_client *c = arg;
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
	} buf;
	char detail[PROTO_MSG_LEN];

	pthread_setname_np(pthread_self(), "ckpt-recv");
	for (;;) {
		int fd = -1;
		ssize_t n = proto_recv(c->sock, buf.b, &fd);
		int type, r;

		if (n <= 0) {
			pthread_mutex_lock(&c->lock);
			if (!c->stopping) {
				if (n == 0)
					snprintf(detail, sizeof(detail), "ckptd closed the connection");
				else
					snprintf(detail, sizeof(detail), "receiving: %s",
						 strerror((int)-n));
				cli_conn_dead_locked(c, detail);
			}
			pthread_mutex_unlock(&c->lock);
			break;
		}
		type = proto_check(buf.b, (size_t)n, detail, sizeof(detail));
		pthread_mutex_lock(&c->lock);
		if (type == PROTO_RESIDENT_REPLY) {
			r = on_resident_locked(c, (const void *)buf.b, fd, detail, sizeof(detail));
		} else if (type == PROTO_LOAD_DONE) {
			r = on_load_done_locked(c, (const void *)buf.b, fd, detail, sizeof(detail));
		} else {
			/* Only a resident reply carries a descriptor. */
			if (fd >= 0)
				close(fd);
			r = type < 0 ? type : handle_msg(c, type, buf.b, detail, sizeof(detail));
		}
		if (r < 0 && !c->stopping) {
			char why[PROTO_MSG_LEN + 32];
			snprintf(why, sizeof(why), "bad message from ckptd: %s", detail);
			if (type == PROTO_ERROR)
				snprintf(why, sizeof(why), "%s", detail);
			cli_conn_dead_locked(c, why);
		}
		pthread_mutex_unlock(&c->lock);
		if (r < 0)
			break;
	}
	return NULL;
}

/* ---- connect / disconnect ---- */

static int cond_init_monotonic(pthread_cond_t *cv)
{
	pthread_condattr_t ca;
	int r = pthread_condattr_init(&ca);

	if (r)
		return -r;
	r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
	return -r;
}

/* Stops and joins every started thread, then frees the client.  Pending
 * committed futures fail with -ECONNABORTED. */
static void client_destroy(struct ckpt_client *c)
{
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	broadcast_all(c);
	pthread_mutex_unlock(&c->lock);
	if (c->sock >= 0)
		shutdown(c->sock, SHUT_RDWR);

	if (c->recv_started)
		pthread_join(c->recv_thread, NULL);
	if (c->save_started)
		pthread_join(c->save_thread, NULL);
	for (unsigned i = 0; i < c->n_copy; i++)
		pthread_join(c->copy_threads[i], NULL);

	pthread_mutex_lock(&c->lock);
	saves_abandon_locked(c);
	pthread_mutex_unlock(&c->lock);

	if (c->sock >= 0)
		close(c->sock);
	/* Unpinned before it is unmapped. */
	cli_cuda_close(c);
	if (c->arena)
		munmap(c->arena, c->arena_bytes);
	while (c->pools) {
		struct cli_pool *p = c->pools;
		c->pools = p->next;
		munmap((void *)p->map, p->size);
		close(p->fd);
		free(p);
	}
	arena_slots_free(&c->slots);
	free(c->parked);
	pthread_cond_destroy(&c->slot_cv);
	pthread_cond_destroy(&c->copy_cv);
	pthread_cond_destroy(&c->save_cv);
	pthread_cond_destroy(&c->res_cv);
	if (c->res_fd >= 0)
		close(c->res_fd);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Checks the options (already copied in by abi_copy_in). */
static int check_opts(const struct ckpt_connect_opts *o)
{
	char err[256];

	if (!name_job_ok(o->job, err, sizeof(err))) {
		cli_set_error("ckpt_connect: %s", err);
		return -EINVAL;
	}
	if (o->world < 1 || o->world > CKPT_MAX_WORLD) {
		cli_set_error("ckpt_connect: world size %u is outside 1..%u", o->world,
			      CKPT_MAX_WORLD);
		return -EINVAL;
	}
	if (o->rank >= o->world) {
		cli_set_error("ckpt_connect: rank %u is not below the world size %u", o->rank,
			      o->world);
		return -EINVAL;
	}
	if (o->cuda_pin != CKPT_CUDA_PIN_AUTO && o->cuda_pin != CKPT_CUDA_PIN_ON &&
	    o->cuda_pin != CKPT_CUDA_PIN_OFF) {
		cli_set_error("ckpt_connect: cuda_pin %d is not a CKPT_CUDA_PIN_* value",
			      (int)o->cuda_pin);
		return -EINVAL;
	}
	if (o->flags & ~CKPT_CONNECT_RESIDENT) {
		cli_set_error("ckpt_connect: unknown flags 0x%x", o->flags & ~CKPT_CONNECT_RESIDENT);
		return -EINVAL;
	}
	if (o->copy_threads > CLI_MAX_COPY_THREADS) {
		cli_set_error("ckpt_connect: %u copy threads, at most %u", o->copy_threads,
			      CLI_MAX_COPY_THREADS);
		return -EINVAL;
	}
	return 0;
}

/* Builds HELLO: the options plus what the process tells (umask, run id). */
static int make_hello(struct ckpt_client *c, const struct ckpt_connect_opts *o,
		      struct proto_hello *hello)
{
	const char *source;
	char err[256];
	unsigned mask;
	int r;

	r = env_run_id(o->run, getenv, c->run, &source, err, sizeof(err));
	if (r < 0) {
		cli_set_error("ckpt_connect: %s", err);
		return r;
	}
	if (strcmp(source, "options") != 0 && strcmp(source, "none") != 0)
		cli_log(CKPT_LOG_DEBUG, "run id '%s' from $%s", c->run, source);
	r = env_umask(&mask);
	if (r < 0) {
		/* The daemon creates the save's files with this mask; 022 is
		 * the usual default and never makes them group/world
		 * writable. */
		mask = 022;
		cli_log(CKPT_LOG_WARNING, "cannot read the umask from /proc/self/status (%s): "
			"telling ckptd 022", strerror(-r));
	}
	proto_init(&hello->h, PROTO_HELLO, sizeof(*hello));
	hello->role = PROTO_ROLE_CLIENT;
	hello->rank = o->rank;
	hello->world = o->world;
	hello->umask = mask;
	hello->flags = o->flags & CKPT_CONNECT_RESIDENT ? PROTO_HELLO_RESIDENT : 0;
	hello->arena_bytes = o->arena_bytes ? o->arena_bytes : CLI_DEFAULT_ARENA;
	snprintf(hello->job, sizeof(hello->job), "%s", o->job);
	snprintf(hello->run, sizeof(hello->run), "%s", c->run);
	return 0;
}

/* Checks what HELLO_OK granted.  The slot size must cut the arena evenly, be
 * a power of two and lie on the CRC grid (proto.h); anything else would
 * corrupt the file image. */
static int check_grant(struct ckpt_client *c, const struct proto_hello_ok *ok)
{
	uint64_t ab = ok->arena_bytes, sb = ok->slot_bytes;

	if (sb == 0 || (sb & (sb - 1)) || sb % LAYOUT_CRC_BLOCK || ab < sb || ab % sb ||
	    ab / sb > INT32_MAX || ab > (uint64_t)SIZE_MAX / 2) {
		cli_set_error("ckpt_connect: ckptd granted an unusable arena (%llu bytes, "
			      "%llu-byte slots)", (unsigned long long)ab, (unsigned long long)sb);
		return -EPROTO;
	}
	c->arena_bytes = ab;
	c->slot_bytes = sb;
	c->client_id = ok->client_id;
	snprintf(c->spill_dir, sizeof(c->spill_dir), "%s", ok->spill_dir);
	return 0;
}

int ckpt_connect(const struct ckpt_connect_opts *opts, struct ckpt_client **ret_client)
{
	struct ckpt_connect_opts o;
	struct proto_hello hello;
	struct proto_hello_ok ok;
	struct ckpt_client *c;
	const char *path;
	char why[160];
	uint64_t t0 = cli_now_ns(), t_hello;
	int64_t timeout_ms;
	int fd = -1, r;

	if (!opts || !ret_client) {
		cli_set_error("ckpt_connect: %s is NULL", opts ? "ret_client" : "opts");
		return -EINVAL;
	}
	r = abi_copy_in(&abi_connect_opts, &o, opts, "ckpt_connect");
	if (r < 0)
		return r;
	r = check_opts(&o);
	if (r < 0)
		return r;
	path = o.socket_path;
	if (!path)
		path = getenv("CKPTD_SOCKET");
	if (!path || !path[0])
		path = CKPT_DEFAULT_SOCKET;
	timeout_ms = o.timeout_ms ? o.timeout_ms : CKPT_DEFAULT_CONNECT_TIMEOUT_MS;

	c = calloc(1, sizeof(*c));
	if (!c) {
		cli_set_error("ckpt_connect: out of memory");
		return -ENOMEM;
	}
	c->sock = -1;
	c->rank = o.rank;
	c->world = o.world;
	c->next_token = 1;
	c->res_fd = -1;
	/* Reads through the daemon may come in its pool, read once for every
	 * loader of the uid (daemon/share.h); CKPT_LOAD_SHARE=0 asks for each
	 * read into the arena instead. */
	c->share = !getenv("CKPT_LOAD_SHARE") || strcmp(getenv("CKPT_LOAD_SHARE"), "0") != 0;
	snprintf(c->job, sizeof(c->job), "%s", o.job);
	r = make_hello(c, &o, &hello);
	if (r < 0) {
		free(c);
		return r;
	}
	r = -pthread_mutex_init(&c->lock, NULL);
	if (r < 0) {
		free(c);
		cli_set_error("ckpt_connect: pthread_mutex_init: %s", strerror(-r));
		return r;
	}
	if ((r = cond_init_monotonic(&c->slot_cv)) < 0 ||
	    (r = cond_init_monotonic(&c->copy_cv)) < 0 ||
	    (r = cond_init_monotonic(&c->save_cv)) < 0 ||
	    (r = cond_init_monotonic(&c->res_cv)) < 0) {
		/* Unreachable in practice (glibc cannot fail here). */
		cli_set_error("ckpt_connect: pthread_cond_init: %s", strerror(-r));
		pthread_mutex_destroy(&c->lock);
		free(c);
		return r;
	}

	r = conn_open(path, &hello, timeout_ms, &c->sock, &ok, &fd);
	if (r < 0)
		goto out_destroy;
	t_hello = cli_now_ns();
	r = check_grant(c, &ok);
	if (r < 0) {
		close(fd);
		goto out_destroy;
	}
	r = arena_map(fd, c->arena_bytes, &c->arena);
	close(fd);
	if (r < 0) {
		cli_set_error("ckpt_connect: mapping the %llu-byte arena: %s",
			      (unsigned long long)c->arena_bytes, strerror(-r));
		/* A memfd of the wrong size is the daemon breaking the protocol;
		 * anything else means the memory is not there. */
		r = r == -EBADMSG ? -EPROTO : -ENOMEM;
		goto out_destroy;
	}
	r = arena_slots_init(&c->slots, c->arena_bytes, c->slot_bytes);
	if (r < 0) {
		cli_set_error("ckpt_connect: slot table: %s", strerror(-r));
		goto out_destroy;
	}
	c->parked = calloc(c->slots.n_slots ? c->slots.n_slots : 1, sizeof(*c->parked));
	if (!c->parked) {
		r = -ENOMEM;
		cli_set_error("ckpt_connect: slot table: %s", strerror(-r));
		goto out_destroy;
	}
	{
		char cerr[512];

		r = cli_cuda_open(c, o.cuda_pin, cerr, sizeof(cerr));
		if (r < 0) {
			cli_set_error("ckpt_connect: %s", cerr);
			goto out_destroy;
		}
	}

	r = -pthread_create(&c->recv_thread, NULL, recv_thread_main, c);
	if (r < 0)
		goto out_thread;
	c->recv_started = true;
	r = -pthread_create(&c->save_thread, NULL, save_thread_main, c);
	if (r < 0)
		goto out_thread;
	c->save_started = true;
	unsigned want = o.copy_threads;
	if (want)
		snprintf(why, sizeof(why), "from the options");
	else
		want = env_copy_threads_default(env_cpu_count(), getenv("LOCAL_WORLD_SIZE"), why,
						sizeof(why));
	c->copy_nice = env_copy_nice(getenv("CKPT_COPY_NICE"));
	for (; c->n_copy < want; c->n_copy++) {
		r = -pthread_create(&c->copy_threads[c->n_copy], NULL, copy_thread_main, c);
		if (r < 0)
			goto out_thread;
	}
	cli_log(CKPT_LOG_INFO, "connected to ckptd at '%s' as rank %u of %u of job '%s' (run "
		"'%s', umask %03o): arena %llu MiB of %llu asked, %llu KiB slots, %u copy "
		"threads", path, c->rank, c->world, c->job, c->run, hello.umask,
		(unsigned long long)(c->arena_bytes >> 20),
		(unsigned long long)(hello.arena_bytes >> 20),
		(unsigned long long)(c->slot_bytes >> 10), c->n_copy);
	cli_log(CKPT_LOG_DEBUG, "copy threads: %s; connect took %.1f ms (%.1f ms until HELLO_OK, "
		"%.1f ms mapping and touching the arena)", why, (double)(cli_now_ns() - t0) / 1e6,
		(double)(t_hello - t0) / 1e6, (double)(cli_now_ns() - t_hello) / 1e6);
	*ret_client = c;
	return 0;

out_thread:
	cli_set_error("ckpt_connect: starting threads: %s", strerror(-r));
out_destroy:
	client_destroy(c);
	return r;
}

/* ---- attempts ---- */

uint32_t cli_attempt_locked(struct ckpt_client *c, const char *name)
{
	struct attempt_entry *e = NULL, *oldest = &c->attempts[0];

	for (size_t i = 0; i < CLI_ATTEMPT_NAMES; i++) {
		struct attempt_entry *a = &c->attempts[i];
		if (a->used && strcmp(a->name, name) == 0) {
			e = a;
			break;
		}
		if (a->used < oldest->used)
			oldest = a;
	}
	if (!e) {
		/* Unused entries have used == 0 and are taken first. */
		e = oldest;
		snprintf(e->name, sizeof(e->name), "%s", name);
		e->count = 0;
	}
	e->used = ++c->attempt_clock;
	return e->count++;
}

void ckpt_disconnect(struct ckpt_client *client)
{
	if (!client)
		return;
	/* Every committed save must reach "staged" first: from then on the
	 * daemon holds all its bytes and finishes it without us. */
	pthread_mutex_lock(&client->lock);
	while (client->staging > 0)
		pthread_cond_wait(&client->save_cv, &client->lock);
	pthread_mutex_unlock(&client->lock);
	client_destroy(client);
}

uint64_t ckpt_client_arena_bytes(const struct ckpt_client *client)
{
	return client ? client->arena_bytes : 0;
}
