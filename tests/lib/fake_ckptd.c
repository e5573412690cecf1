/* SPDX-License-Identifier: MIT */
/* fake_ckptd.c - the in-process fake daemon for libckpt unit tests. */
#include "tests/lib/fake_ckptd.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "format/desc.h"
#include "shm/arena.h"
#include "shm/proto.h"

#define FAKE_MAX_CONNS 16
#define FAKE_MAX_FILE (2ull << 30)
#define FAKE_DEFAULT_ARENA (64ull << 20)

struct fsave {
	struct fake_save pub;
	struct fconn *conn;     /* NULL once the connection is gone */
	uint8_t *got;           /* per extent: received */
	uint64_t n_ext;
	uint64_t queued;        /* releases not yet sent */
};

struct release {
	uint64_t due_ns;
	uint64_t slot;
	struct fsave *save;
};

struct fconn {
	int fd;
	uint32_t id;
	void *arena;
	uint64_t arena_bytes, slot_bytes;
	uint8_t *held;          /* per slot: an extent the fake has not released */
	uint64_t n_held;
	uint64_t extents;
	bool hello_seen;
	struct release *rel;    /* FIFO of releases (due times increase) */
	size_t rel_head, rel_len, rel_cap;
};

struct fake_ckptd {
	struct fake_ckptd_opts o;
	char *path;
	int lfd, evfd;
	pthread_t thread;
	struct fconn *conns[FAKE_MAX_CONNS];
	uint32_t next_id;
	unsigned refused;       /* saves refused (the fake's thread only) */

	pthread_mutex_t lock;   /* guards saves and stats */
	pthread_cond_t cond;
	struct fsave **saves;
	size_t n_saves, cap_saves;
	size_t n_finished;
	struct fake_ckptd_stats st;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void violation(struct fake_ckptd *f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void violation(struct fake_ckptd *f, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&f->lock);
	f->st.violations++;
	va_start(ap, fmt);
	vsnprintf(f->st.violation, sizeof(f->st.violation), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&f->lock);
}

static void save_finished_locked(struct fake_ckptd *f)
{
	f->n_finished++;
	pthread_cond_broadcast(&f->cond);
}

static void send_result(struct fconn *c, enum proto_type type, uint32_t token, int err,
			const char *msg)
{
	struct proto_save_result m;

	proto_init(&m.h, type, sizeof(m));
	m.token = token;
	m.err = err;
	proto_set_msg(m.msg, msg);
	(void)proto_send(c->fd, &m, sizeof(m), -1);
}

static void conn_close(struct fake_ckptd *f, size_t idx)
{
	struct fconn *c = f->conns[idx];

	pthread_mutex_lock(&f->lock);
	for (size_t i = 0; i < f->n_saves; i++) {
		struct fsave *s = f->saves[i];
		if (s->conn != c)
			continue;
		s->conn = NULL;
		if (!s->pub.done && !s->pub.aborted) {
			s->pub.aborted = true;
			save_finished_locked(f);
		}
	}
	f->st.disconnects++;
	pthread_mutex_unlock(&f->lock);
	close(c->fd);
	if (c->arena)
		munmap(c->arena, c->arena_bytes);
	free(c->held);
	free(c->rel);
	free(c);
	f->conns[idx] = NULL;
}

static struct fsave *find_save(struct fake_ckptd *f, struct fconn *c, uint32_t token)
{
	struct fsave *found = NULL;

	pthread_mutex_lock(&f->lock);
	for (size_t i = f->n_saves; i-- > 0;) {
		struct fsave *s = f->saves[i];
		if (s->conn == c && s->pub.token == token) {
			found = s;
			break;
		}
	}
	pthread_mutex_unlock(&f->lock);
	return found;
}

/* Sends SAVE_DONE once every byte arrived and every slot went back. */
static void maybe_done(struct fake_ckptd *f, struct fconn *c, struct fsave *s)
{
	if (s->pub.done || s->pub.aborted || s->queued ||
	    s->pub.received != s->pub.layout.file_size)
		return;
	/* Record first: a test that saw the committed future complete then
	 * finds the save done (and a race detector sees the mutex order). */
	pthread_mutex_lock(&f->lock);
	s->pub.done = true;
	s->pub.done_err = f->o.done_err;
	save_finished_locked(f);
	pthread_mutex_unlock(&f->lock);
	send_result(c, PROTO_SAVE_DONE, s->pub.token, f->o.done_err,
		    f->o.done_err ? "fake ckptd: commit failed on purpose" : "");
}

static void send_release(struct fake_ckptd *f, struct fconn *c, struct release *r)
{
	struct proto_release m;

	proto_init(&m.h, PROTO_RELEASE, sizeof(m));
	m.arena_off = r->slot * c->slot_bytes;
	c->held[r->slot] = 0;
	c->n_held--;
	(void)proto_send(c->fd, &m, sizeof(m), -1);
	pthread_mutex_lock(&f->lock);
	f->st.releases++;
	pthread_mutex_unlock(&f->lock);
	if (r->save) {
		r->save->queued--;
		maybe_done(f, c, r->save);
	}
}

/* Sends every release that is due.  Returns the ns until the next one, or
 * UINT64_MAX. */
static uint64_t run_releases(struct fake_ckptd *f, struct fconn *c)
{
	uint64_t now = now_ns();

	while (c->rel_len) {
		struct release *r = &c->rel[c->rel_head];
		if (r->due_ns > now)
			return r->due_ns - now;
		struct release cur = *r;
		c->rel_head = (c->rel_head + 1) % c->rel_cap;
		c->rel_len--;
		send_release(f, c, &cur);
	}
	return UINT64_MAX;
}

static int queue_release(struct fconn *c, uint64_t slot, struct fsave *s, uint64_t delay_us)
{
	if (c->rel_len == c->rel_cap) {
		size_t cap = c->rel_cap ? c->rel_cap * 2 : 64;
		struct release *n = malloc(cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		for (size_t i = 0; i < c->rel_len; i++)
			n[i] = c->rel[(c->rel_head + i) % c->rel_cap];
		free(c->rel);
		c->rel = n;
		c->rel_cap = cap;
		c->rel_head = 0;
	}
	c->rel[(c->rel_head + c->rel_len) % c->rel_cap] = (struct release){
		.due_ns = now_ns() + delay_us * 1000ull,
		.slot = slot,
		.save = s,
	};
	c->rel_len++;
	if (s)
		s->queued++;
	return 0;
}

static int on_hello(struct fake_ckptd *f, struct fconn *c, const struct proto_hello *m)
{
	struct proto_hello_ok ok;
	uint64_t want = m->arena_bytes, cap = f->o.arena_max ? f->o.arena_max : FAKE_DEFAULT_ARENA;
	char name[64];
	int fd;

	pthread_mutex_lock(&f->lock);
	f->st.hellos++;
	f->st.hello_umask = m->umask;
	snprintf(f->st.hello_run, sizeof(f->st.hello_run), "%s", m->run);
	snprintf(f->st.hello_job, sizeof(f->st.hello_job), "%s", m->job);
	pthread_mutex_unlock(&f->lock);
	if (m->role != PROTO_ROLE_CLIENT || m->rank >= m->world) {
		violation(f, "bad HELLO (role %u rank %u world %u)", m->role, m->rank, m->world);
		return -EBADMSG;
	}
	if (f->o.silent)
		return 0;
	if (f->o.refuse_hello) {
		struct proto_error e;
		proto_init(&e.h, PROTO_ERROR, sizeof(e));
		e.err = f->o.refuse_hello;
		proto_set_msg(e.msg, "fake ckptd: connection refused on purpose");
		(void)proto_send(c->fd, &e, sizeof(e), -1);
		return -EPERM;
	}
	if (want > cap)
		want = cap;
	c->arena_bytes = arena_round(want);
	c->slot_bytes = arena_slot_bytes(c->arena_bytes);
	snprintf(name, sizeof(name), "fake-ckptd-arena-%u", c->id);
	fd = arena_create(name, c->arena_bytes, &c->arena);
	if (fd < 0) {
		c->arena = NULL;
		return fd;
	}
	c->held = calloc(c->arena_bytes / c->slot_bytes, 1);
	if (!c->held) {
		close(fd);
		return -ENOMEM;
	}
	proto_init(&ok.h, PROTO_HELLO_OK, sizeof(ok));
	ok.arena_bytes = c->arena_bytes;
	ok.slot_bytes = c->slot_bytes;
	ok.client_id = c->id;
	int r = proto_send(c->fd, &ok, sizeof(ok), fd);
	close(fd);
	if (r == 0) {
		pthread_mutex_lock(&f->lock);
		f->st.clients++;
		pthread_mutex_unlock(&f->lock);
	}
	return r;
}

static int on_begin(struct fake_ckptd *f, struct fconn *c, const struct proto_save_begin *m)
{
	struct fsave *s;
	char err[PROTO_MSG_LEN];
	int r;

	if (!c->arena || m->desc_off % c->slot_bytes || m->desc_off >= c->arena_bytes ||
	    m->desc_len == 0 || m->desc_len > c->arena_bytes - m->desc_off) {
		violation(f, "SAVE_BEGIN with descriptor [%llu, +%llu) outside the arena",
			  (unsigned long long)m->desc_off, (unsigned long long)m->desc_len);
		return -EBADMSG;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->pub.client_id = c->id;
	s->pub.token = m->token;
	s->pub.attempt = m->attempt;
	err[0] = '\0';
	r = desc_parse((const char *)c->arena + m->desc_off, m->desc_len, &s->pub.layout, err,
		       sizeof(err));
	if (r < 0) {
		free(s);
		violation(f, "descriptor rejected: %s", err);
		send_result(c, PROTO_SAVE_ACK, m->token, r, err);
		return 0;
	}
	if (f->o.ack_delay_us)
		usleep(f->o.ack_delay_us);
	bool refuse = f->o.refuse_save && (!f->o.refuse_first || f->refused < f->o.refuse_first);
	if (refuse)
		f->refused++;
	if (refuse || (!f->o.discard && s->pub.layout.file_size > FAKE_MAX_FILE)) {
		int e = refuse ? f->o.refuse_save : -E2BIG;
		layout_free(&s->pub.layout);
		free(s);
		send_result(c, PROTO_SAVE_ACK, m->token, e,
			    refuse ? "fake ckptd: save refused on purpose"
					     : "fake ckptd: file too large");
		return 0;
	}
	s->n_ext = (s->pub.layout.file_size + c->slot_bytes - 1) / c->slot_bytes;
	if (!f->o.discard)
		s->pub.image = calloc(1, s->pub.layout.file_size);
	s->got = calloc(s->n_ext ? s->n_ext : 1, 1);
	if ((!f->o.discard && !s->pub.image) || !s->got) {
		free(s->pub.image);
		free(s->got);
		layout_free(&s->pub.layout);
		free(s);
		return -ENOMEM;
	}
	s->conn = c;
	pthread_mutex_lock(&f->lock);
	if (f->n_saves == f->cap_saves) {
		size_t cap = f->cap_saves ? f->cap_saves * 2 : 16;
		struct fsave **n = realloc(f->saves, cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&f->lock);
			free(s->pub.image);
			free(s->got);
			layout_free(&s->pub.layout);
			free(s);
			return -ENOMEM;
		}
		f->saves = n;
		f->cap_saves = cap;
	}
	f->saves[f->n_saves++] = s;
	pthread_mutex_unlock(&f->lock);
	send_result(c, PROTO_SAVE_ACK, m->token, 0, "");
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Returns 0, or < 0 to drop the client. */
static int on_extent(struct fake_ckptd *f, struct fconn *c, const struct proto_extent *m)
{
	struct fsave *s = find_save(f, c, m->token);
	uint64_t slot, k, want;

	if (!c->arena || m->arena_off % c->slot_bytes || m->arena_off >= c->arena_bytes) {
		violation(f, "EXTENT at arena offset %llu, not a slot",
			  (unsigned long long)m->arena_off);
		return -EBADMSG;
	}
	slot = m->arena_off / c->slot_bytes;
	if (c->held[slot]) {
		violation(f, "EXTENT in slot %llu, which the daemon still holds",
			  (unsigned long long)slot);
		return -EBADMSG;
	}
	c->held[slot] = 1;
	c->n_held++;
	c->extents++;
	pthread_mutex_lock(&f->lock);
	f->st.extents++;
	if (c->n_held > f->st.max_held)
		f->st.max_held = c->n_held;
	pthread_mutex_unlock(&f->lock);

	if (f->o.close_after_extents && c->extents >= f->o.close_after_extents)
		return -ECONNABORTED;

	if (!s || s->pub.done || s->pub.aborted) {
		violation(f, "EXTENT for save %u, which is not staging", m->token);
		return queue_release(c, slot, NULL, f->o.release_delay_us);
	}
	k = m->file_off / c->slot_bytes;
	want = s->pub.layout.file_size - m->file_off;
	if (want > c->slot_bytes)
		want = c->slot_bytes;
	if (m->file_off % c->slot_bytes || k >= s->n_ext || m->len != want) {
		violation(f, "EXTENT [%llu, +%llu) is not extent of a %llu-byte file",
			  (unsigned long long)m->file_off, (unsigned long long)m->len,
			  (unsigned long long)s->pub.layout.file_size);
		return -EBADMSG;
	}
	if (s->got[k]) {
		violation(f, "EXTENT %llu of save %u sent twice", (unsigned long long)k, m->token);
		return -EBADMSG;
	}
	const uint8_t *src = (const uint8_t *)c->arena + m->arena_off;
	uint64_t padded = (m->len + 4095) / 4096 * 4096;
	if (!all_zero(src + m->len, padded - m->len))
		violation(f, "EXTENT %llu of save %u: slot tail not zeroed", (unsigned long long)k,
			  m->token);
	if (s->pub.image)
		memcpy(s->pub.image + m->file_off, src, m->len);
	s->got[k] = 1;
	pthread_mutex_lock(&f->lock);
	s->pub.received += m->len;
	s->pub.extents++;
	pthread_mutex_unlock(&f->lock);
	return queue_release(c, slot, s, f->o.release_delay_us);
}

static int on_message(struct fake_ckptd *f, struct fconn *c)
{
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
	} buf;
	char err[PROTO_MSG_LEN];
	ssize_t n = proto_recv(c->fd, buf.b, NULL);
	int type;

	if (n <= 0)
		return n == 0 ? -ECONNRESET : (int)n;
	type = proto_check(buf.b, (size_t)n, err, sizeof(err));
	if (type < 0) {
		violation(f, "bad message: %s", err);
		return type;
	}
	if (type != PROTO_HELLO && !c->arena && !f->o.silent) {
		violation(f, "message type %d before HELLO", type);
		return -EBADMSG;
	}
	switch (type) {
	case PROTO_HELLO:
		if (c->arena || c->hello_seen) {
			violation(f, "second HELLO");
			return -EBADMSG;
		}
		c->hello_seen = true;
		return on_hello(f, c, (const void *)buf.b);
	case PROTO_SAVE_BEGIN:
		return on_begin(f, c, (const void *)buf.b);
	case PROTO_EXTENT:
		return on_extent(f, c, (const void *)buf.b);
	case PROTO_SAVE_ABORT: {
		const struct proto_save_abort *m = (const void *)buf.b;
		struct fsave *s = find_save(f, c, m->token);
		if (s) {
			pthread_mutex_lock(&f->lock);
			if (!s->pub.done && !s->pub.aborted) {
				s->pub.aborted = true;
				save_finished_locked(f);
			}
			pthread_mutex_unlock(&f->lock);
		}
		return 0;
	}
	default:
		violation(f, "unexpected message type %d", type);
		return -EBADMSG;
	}
}

static void accept_one(struct fake_ckptd *f)
{
	int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	size_t i;

	if (fd < 0)
		return;
	if (f->o.refuse_at_accept) {
		struct proto_error e;
		proto_init(&e.h, PROTO_ERROR, sizeof(e));
		e.err = f->o.refuse_at_accept;
		proto_set_msg(e.msg, "fake ckptd: too many clients, refused at accept");
		(void)proto_send(fd, &e, sizeof(e), -1);
		close(fd);
		pthread_mutex_lock(&f->lock);
		f->st.disconnects++;
		pthread_mutex_unlock(&f->lock);
		return;
	}
	for (i = 0; i < FAKE_MAX_CONNS && f->conns[i]; i++)
		;
	struct fconn *c = i < FAKE_MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
	if (!c) {
		close(fd);
		return;
	}
	c->fd = fd;
	c->id = ++f->next_id;
	f->conns[i] = c;
}

static void *fake_main(void *arg)
{
	struct fake_ckptd *f = arg;
	struct pollfd pfd[FAKE_MAX_CONNS + 2];
	size_t map[FAKE_MAX_CONNS];

	for (;;) {
		uint64_t next = UINT64_MAX;
		nfds_t n = 0;

		for (size_t i = 0; i < FAKE_MAX_CONNS; i++) {
			if (!f->conns[i])
				continue;
			uint64_t t = run_releases(f, f->conns[i]);
			if (t < next)
				next = t;
		}
		pfd[n++] = (struct pollfd){ .fd = f->evfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = f->lfd, .events = POLLIN };
		for (size_t i = 0; i < FAKE_MAX_CONNS; i++) {
			if (!f->conns[i])
				continue;
			map[n - 2] = i;
			pfd[n++] = (struct pollfd){ .fd = f->conns[i]->fd, .events = POLLIN };
		}
		int timeout = next == UINT64_MAX ? -1 : (int)(next / 1000000ull) + 1;
		if (poll(pfd, n, timeout) < 0 && errno != EINTR)
			break;
		if (pfd[0].revents)
			break;
		if (pfd[1].revents & POLLIN)
			accept_one(f);
		for (nfds_t j = 2; j < n; j++) {
			if (!pfd[j].revents)
				continue;
			size_t i = map[j - 2];
			if (f->conns[i] && on_message(f, f->conns[i]) < 0)
				conn_close(f, i);
		}
	}
	return NULL;
}

int fake_ckptd_start(const struct fake_ckptd_opts *opts, struct fake_ckptd **ret_fake)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fake_ckptd *f;
	pthread_condattr_t ca;
	int r;

	if (!opts || !opts->socket_path || strlen(opts->socket_path) >= sizeof(sa.sun_path))
		return -EINVAL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->o = *opts;
	f->lfd = f->evfd = -1;
	f->path = strdup(opts->socket_path);
	pthread_mutex_init(&f->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (!f->path) {
		r = -ENOMEM;
		goto out;
	}
	f->evfd = eventfd(0, EFD_CLOEXEC);
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->evfd < 0 || f->lfd < 0) {
		r = -errno;
		goto out;
	}
	strcpy(sa.sun_path, opts->socket_path);
	unlink(opts->socket_path);
	if (bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(f->lfd, 16) < 0) {
		r = -errno;
		goto out;
	}
	r = -pthread_create(&f->thread, NULL, fake_main, f);
	if (r < 0)
		goto out;
	*ret_fake = f;
	return 0;

out:
	if (f->lfd >= 0) {
		close(f->lfd);
		unlink(opts->socket_path);
	}
	if (f->evfd >= 0)
		close(f->evfd);
	free(f->path);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
	return r;
}

void fake_ckptd_stop(struct fake_ckptd *f)
{
	uint64_t one = 1;

	if (!f)
		return;
	if (write(f->evfd, &one, sizeof(one)) != sizeof(one))
		abort();
	pthread_join(f->thread, NULL);
	for (size_t i = 0; i < FAKE_MAX_CONNS; i++)
		if (f->conns[i])
			conn_close(f, i);
	for (size_t i = 0; i < f->n_saves; i++) {
		layout_free(&f->saves[i]->pub.layout);
		free(f->saves[i]->pub.image);
		free(f->saves[i]->got);
		free(f->saves[i]);
	}
	free(f->saves);
	close(f->lfd);
	close(f->evfd);
	unlink(f->path);
	free(f->path);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

int fake_ckptd_wait_saves(struct fake_ckptd *f, size_t n, int64_t timeout_ms)
{
	struct timespec dl;
	int r = 0;

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&f->lock);
	while (f->n_finished < n && r == 0)
		r = pthread_cond_timedwait(&f->cond, &f->lock, &dl);
	r = f->n_finished >= n ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&f->lock);
	return r;
}

size_t fake_ckptd_n_saves(struct fake_ckptd *f)
{
	size_t n;

	pthread_mutex_lock(&f->lock);
	n = f->n_saves;
	pthread_mutex_unlock(&f->lock);
	return n;
}

const struct fake_save *fake_ckptd_save(struct fake_ckptd *f, size_t i)
{
	const struct fake_save *s = NULL;

	pthread_mutex_lock(&f->lock);
	if (i < f->n_saves)
		s = &f->saves[i]->pub;
	pthread_mutex_unlock(&f->lock);
	return s;
}

void fake_ckptd_stats(struct fake_ckptd *f, struct fake_ckptd_stats *ret)
{
	pthread_mutex_lock(&f->lock);
	*ret = f->st;
	pthread_mutex_unlock(&f->lock);
}
