/* SPDX-License-Identifier: MIT */
/*
 * server.c - client connections: the handshake, the arena, and the checks on
 * every message a peer sends.  A peer that breaks the protocol is dropped
 * with a logged reason; nothing it sends can harm the daemon or other
 * clients.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/status.h"
#include "format/crc32c.h"
#include "format/desc.h"
#include "format/names.h"
#include "shm/arena.h"

int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void send_error(int fd, int err, const char *msg)
{
	struct proto_error m;
	proto_init(&m.h, PROTO_ERROR, sizeof(m));
	m.err = err;
	proto_set_msg(m.msg, msg);
	(void)proto_send(fd, &m, sizeof(m), -1);
}

int server_accept(struct server *srv)
{
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	struct epoll_event ee;
	struct client *c;
	int fd;

	fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return (errno == EAGAIN || errno == EINTR) ? 0 : -errno;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("accept: SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return 0;
	}
	if (srv->n_clients >= srv->cfg.max_clients) {
		log_warn("refusing pid %d: %u clients connected (max_clients)", cred.pid,
			 srv->n_clients);
		send_error(fd, -EMFILE, "ckptd has too many clients (max_clients)");
		close(fd);
		return 0;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->srv = srv;
	c->fd = fd;
	c->efd = -1;
	c->arena_fd = -1;
	c->id = ++srv->next_id;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->ev_sock = (struct ev){ EV_CLIENT, c };
	c->ev_ring = (struct ev){ EV_RING, c };
	list_init(&c->ranks);
	list_init(&c->wait_q);
	list_init(&c->crc_q);
	ee.events = EPOLLIN;
	ee.data.ptr = &c->ev_sock;
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0) {
		int r = -errno;
		close(fd);
		free(c);
		return r;
	}
	list_add_tail(&srv->clients, &c->link);
	srv->n_clients++;
	log_debug("client %u: connected (pid %d uid %u)", c->id, c->pid, c->uid);
	return 0;
}

void client_close(struct client *c, const char *why)
{
	struct list *p, *t;

	if (c->gone)
		return;
	c->gone = true;
	epoll_ctl(c->srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->srv->n_clients--;
	if (c->role == PROTO_ROLE_CLIENT)
		log_info("client %u (pid %d, job '%s', rank %u): %s", c->id, c->pid, c->job,
			 c->rank, why);
	else
		log_debug("client %u: %s", c->id, why);

	/* A rank whose bytes are all here belongs to the daemon now and goes
	 * on; one still staging can never finish: it fails its save. */
	list_for_each_safe(p, t, &c->ranks)
	{
		struct rank_save *rs = list_entry(p, struct rank_save, clink);
		rs->told = true;
		if (!rs->staged && !rs->failed && rs->save->state == SAVE_ACTIVE)
			rank_fail(rs, -ECONNRESET, "rank %u disconnected before its shard was staged",
				  rs->rank);
	}
	writer_crc_drain(c, 0);
}

/* Frees a closed client once no write of its arena is in flight. */
void client_maybe_free(struct client *c)
{
	struct server *srv = c->srv;

	if (!c->gone || c->arena_pending || !list_empty(&c->ranks) || c->slots_held ||
	    c->ring_inflight)
		return;
	if (c->arena_fd >= 0)
		close(c->arena_fd);
	if (c->ring_ok)
		epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->efd, NULL);
	writer_exit(c);
	if (c->arena)
		munmap(c->arena, c->arena_bytes);
	if (c->slots) /* the bytes were reserved when the arena was asked for */
		srv->arena_in_use -= c->arena_bytes;
	free(c->slots);
	list_del(&c->link);
	log_debug("client %u: freed", c->id);
	free(c);
}

static void drop(struct client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void drop(struct client *c, const char *fmt, ...)
{
	char why[PROTO_MSG_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	log_warn("client %u (pid %d): protocol violation: %s; disconnecting", c->id, c->pid, why);
	send_error(c->fd, -EPROTO, why);
	client_close(c, "dropped");
}

/* Worker thread: makes the arena (memfd, populated) and the client's ring,
 * then hands the client back to the loop. */
static void *arena_worker(void *arg)
{
	struct client *c = arg;
	char name[64];
	void *addr;
	int fd;

	snprintf(name, sizeof(name), "ckptd-arena-%u", c->id);
	fd = arena_create(name, c->arena_bytes, &addr);
	if (fd < 0) {
		c->arena_err = fd;
		snprintf(c->arena_msg, sizeof(c->arena_msg), "cannot create a %llu-byte arena: %s%s",
			 (unsigned long long)c->arena_bytes, strerror(-fd),
			 fd == -EFBIG ? " (ckptd's file size limit, RLIMIT_FSIZE or systemd's "
					"LimitFSIZE=, is below it)" : "");
	} else {
		c->arena_fd = fd;
		c->arena = addr;
		c->arena_err = writer_init(c, c->srv->cfg.uring_depth, c->arena_msg,
					   sizeof(c->arena_msg));
	}
	/* A pointer is 8 bytes: one write below PIPE_BUF is atomic. */
	while (write(c->srv->apipe[1], &c, sizeof(c)) < 0 && errno == EINTR)
		;
	return NULL;
}

static void arena_done(struct client *c)
{
	struct server *srv = c->srv;
	struct proto_hello_ok ok;
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = &c->ev_ring };
	int r;

	c->arena_pending = false;
	srv->arenas_pending--;
	if (c->gone)
		return; /* the reaper frees the arena */
	if (c->arena_err == 0 && epoll_ctl(srv->epfd, EPOLL_CTL_ADD, c->efd, &ee) < 0) {
		c->arena_err = -errno;
		snprintf(c->arena_msg, sizeof(c->arena_msg), "epoll: %s", strerror(errno));
		writer_exit(c);
	}
	if (c->arena_err < 0) {
		log_warn("client %u (pid %d): refused: %s", c->id, c->pid, c->arena_msg);
		send_error(c->fd, c->arena_err, c->arena_msg);
		client_close(c, "refused");
		return;
	}
	proto_init(&ok.h, PROTO_HELLO_OK, sizeof(ok));
	ok.client_id = c->id;
	ok.arena_bytes = c->arena_bytes;
	ok.slot_bytes = c->slot_bytes;
	r = proto_send(c->fd, &ok, sizeof(ok), c->arena_fd);
	/* The client has its own reference now; ours is the mapping. */
	close(c->arena_fd);
	c->arena_fd = -1;
	if (r < 0) {
		client_close(c, "cannot send the arena");
		return;
	}
	log_info("client %u (pid %d uid %u): job '%s' rank %u/%u, arena %llu MiB in %u slots", c->id,
		 c->pid, c->uid, c->job, c->rank, c->world,
		 (unsigned long long)(c->arena_bytes >> 20), c->n_slots);
}

void server_arena_event(struct server *srv)
{
	struct client *c;

	while (read(srv->apipe[0], &c, sizeof(c)) == (ssize_t)sizeof(c))
		arena_done(c);
}

static int hello_client(struct client *c, const struct proto_hello *m, char *err, size_t errlen)
{
	struct server *srv = c->srv;
	struct list *p;
	uint64_t want, avail;
	pthread_attr_t attr;
	pthread_t th;
	int r;

	if (!name_job_ok(m->job, err, errlen))
		return -EINVAL;
	if (m->world == 0 || m->world > CKPT_MAX_WORLD || m->rank >= m->world) {
		snprintf(err, errlen, "rank %u of world %u is not valid", m->rank, m->world);
		return -EINVAL;
	}
	/* A job belongs to the user who runs it: another uid may not join it
	 * (and so may not touch its saves). */
	for (p = srv->clients.next; p != &srv->clients; p = p->next) {
		struct client *o = list_entry(p, struct client, link);
		if (o != c && !o->gone && o->role == PROTO_ROLE_CLIENT && o->uid != c->uid &&
		    strcmp(o->job, m->job) == 0) {
			snprintf(err, errlen, "job '%s' belongs to another user (uid %u)", m->job,
				 o->uid);
			return -EACCES;
		}
	}

	want = m->arena_bytes ? m->arena_bytes : (1ull << 30);
	if (want > srv->cfg.arena_max)
		want = srv->cfg.arena_max;
	avail = srv->cfg.arena_total - srv->arena_in_use;
	if (want > avail)
		want = avail;
	want = arena_round(want);
	if (want > avail || want > srv->cfg.arena_max) {
		uint64_t slot = arena_slot_bytes(want);
		want = want > slot ? (want / slot - 1) * slot : 0;
	}
	if (want < ARENA_MIN_BYTES || srv->arena_in_use + want > srv->cfg.arena_total) {
		snprintf(err, errlen,
			 "no room for a staging arena: %llu of arena_total %llu bytes in use",
			 (unsigned long long)srv->arena_in_use,
			 (unsigned long long)srv->cfg.arena_total);
		return -ENOMEM;
	}

	c->arena_bytes = want;
	c->slot_bytes = arena_slot_bytes(want);
	c->n_slots = (uint32_t)(want / c->slot_bytes);
	c->slots = calloc(c->n_slots, sizeof(*c->slots));
	if (!c->slots)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n_slots; i++)
		list_init(&c->slots[i].qlink);
	snprintf(c->job, sizeof(c->job), "%s", m->job);
	c->rank = m->rank;
	c->world = m->world;

	/* Reserve the bytes now, so concurrent handshakes respect arena_total,
	 * and make the arena on a worker thread. */
	srv->arena_in_use += want;
	c->arena_pending = true;
	srv->arenas_pending++;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	r = pthread_create(&th, &attr, arena_worker, c);
	pthread_attr_destroy(&attr);
	if (r != 0) {
		/* No thread: do it here, slower for others but correct. */
		arena_worker(c);
	}
	return 0;
}

static void on_hello(struct client *c, const struct proto_hello *m)
{
	struct proto_hello_ok ok;
	char err[PROTO_MSG_LEN] = "";
	int r;

	if (c->role) {
		drop(c, "second HELLO");
		return;
	}
	proto_init(&ok.h, PROTO_HELLO_OK, sizeof(ok));
	ok.client_id = c->id;
	if (m->role == PROTO_ROLE_CONTROL) {
		c->role = PROTO_ROLE_CONTROL;
		if (proto_send(c->fd, &ok, sizeof(ok), -1) < 0)
			client_close(c, "cannot answer HELLO");
		return;
	}
	if (m->role != PROTO_ROLE_CLIENT) {
		drop(c, "HELLO with unknown role %u", m->role);
		return;
	}
	c->role = PROTO_ROLE_CLIENT;
	r = hello_client(c, m, err, sizeof(err));
	if (r < 0) {
		log_warn("client %u (pid %d): refused: %s", c->id, c->pid, err);
		send_error(c->fd, r, err);
		c->role = 0; /* nothing of a rank to clean up */
		client_close(c, "refused");
	}
	/* Otherwise HELLO_OK goes out once the arena is made (arena_done). */
}

static struct rank_save *find_rank(struct client *c, uint32_t token)
{
	for (struct list *p = c->ranks.next; p != &c->ranks; p = p->next) {
		struct rank_save *rs = list_entry(p, struct rank_save, clink);
		if (rs->token == token)
			return rs;
	}
	return NULL;
}

static void send_result(struct client *c, enum proto_type type, uint32_t token, int err,
			const char *msg)
{
	struct proto_save_result m;
	proto_init(&m.h, type, sizeof(m));
	m.token = token;
	m.err = err;
	proto_set_msg(m.msg, msg);
	if (proto_send(c->fd, &m, sizeof(m), -1) < 0)
		client_close(c, "cannot send a save result");
}

static void on_save_begin(struct client *c, const struct proto_save_begin *m)
{
	struct layout l = { 0 };
	struct rank_save *rs;
	char err[PROTO_MSG_LEN] = "";
	int64_t t0 = now_us();
	char *copy;
	int r;

	if (find_rank(c, m->token)) {
		drop(c, "SAVE_BEGIN reuses token %u", m->token);
		return;
	}
	if (m->desc_off % c->slot_bytes || m->desc_len == 0 || m->desc_len > DESC_MAX_BYTES ||
	    m->desc_off >= c->arena_bytes || m->desc_len > c->arena_bytes - m->desc_off) {
		drop(c, "SAVE_BEGIN descriptor range %llu+%llu is outside the arena",
		     (unsigned long long)m->desc_off, (unsigned long long)m->desc_len);
		return;
	}
	/* Parse a private copy: the client can write its arena at any time. */
	copy = malloc(m->desc_len);
	if (!copy) {
		send_result(c, PROTO_SAVE_ACK, m->token, -ENOMEM, "ckptd is out of memory");
		return;
	}
	memcpy(copy, c->arena + m->desc_off, m->desc_len);
	r = desc_parse(copy, m->desc_len, &l, err, sizeof(err));
	free(copy);
	if (r < 0) {
		log_warn("client %u (job '%s' rank %u): bad save descriptor: %s", c->id, c->job,
			 c->rank, err);
		send_result(c, PROTO_SAVE_ACK, m->token, r, err);
		return;
	}
	r = save_begin_rank(c->srv, c, m->token, &l, &rs, err, sizeof(err));
	if (r < 0) {
		layout_free(&l);
		log_info("client %u (job '%s' rank %u): save refused: %s", c->id, c->job, c->rank,
			 err);
		send_result(c, PROTO_SAVE_ACK, m->token, r, err);
		return;
	}
	if (m->token > c->max_token)
		c->max_token = m->token;
	rs->t_begin = t0;
	send_result(c, PROTO_SAVE_ACK, m->token, 0, "");
	log_debug("save '%s' rank %u: descriptor of %llu bytes accepted in %.1f ms", rs->save->name,
		  rs->rank, (unsigned long long)m->desc_len, (double)(now_us() - t0) / 1000.0);
}

/* Checksums the pieces of the items that lie in [off, off + len). */
void rank_crc_extent(struct rank_save *rs, const uint8_t *buf, uint64_t off, uint64_t len)
{
	const struct layout *l = &rs->layout;
	uint64_t end = off + len;

	for (size_t i = layout_find(l, off); i < l->n_items && l->items[i].begin < end; i++) {
		const struct layout_item *it = &l->items[i];
		uint64_t b = it->begin > off ? it->begin : off;
		uint64_t e = it->end < end ? it->end : end;
		while (b < e) {
			uint64_t grid = (b / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			uint64_t pe = grid < e ? grid : e;
			/* Piece index within the item: grid cells since its first. */
			uint32_t k = (uint32_t)(b / LAYOUT_CRC_BLOCK - it->begin / LAYOUT_CRC_BLOCK);
			rs->crcs[it->crc0 + k] = crc32c(buf + (b - off), pe - b, 0);
			b = pe;
		}
	}
}

static void on_extent(struct client *c, const struct proto_extent *m)
{
	struct rank_save *rs = find_rank(c, m->token);
	uint64_t slot_idx, ext, want;
	struct wreq *w;

	if (m->arena_off % c->slot_bytes || m->arena_off >= c->arena_bytes) {
		drop(c, "EXTENT arena offset %llu is not a slot", (unsigned long long)m->arena_off);
		return;
	}
	slot_idx = m->arena_off / c->slot_bytes;
	w = &c->slots[slot_idx];
	if (w->rs) {
		drop(c, "EXTENT in slot %llu, which the daemon still holds",
		     (unsigned long long)slot_idx);
		return;
	}
	if (!rs || rs->failed || rs->save->state != SAVE_ACTIVE) {
		/* A save that failed (and may be gone) while the client still had
		 * extents on the way: give the slot straight back. */
		if (!rs && m->token > c->max_token) {
			drop(c, "EXTENT for unknown save token %u", m->token);
			return;
		}
		client_send_release(c, m->arena_off);
		return;
	}
	if (m->file_off % c->slot_bytes || m->file_off >= rs->layout.file_size) {
		drop(c, "EXTENT file offset %llu is not an extent of the file",
		     (unsigned long long)m->file_off);
		return;
	}
	ext = m->file_off / c->slot_bytes;
	want = rs->layout.file_size - m->file_off;
	if (want > c->slot_bytes)
		want = c->slot_bytes;
	if (m->len != want || (rs->got[ext / 8] & (1u << (ext % 8)))) {
		drop(c, "EXTENT %llu: length %llu (expected %llu) or sent twice",
		     (unsigned long long)ext, (unsigned long long)m->len,
		     (unsigned long long)want);
		return;
	}
	rs->got[ext / 8] |= (uint8_t)(1u << (ext % 8));
	rs->extents_received++;
	rs->bytes_received += m->len;
	if (rs->extents_received == rs->n_extents) {
		rs->staged = true;
		rs->t_staged = now_us();
	}

	w->rs = rs;
	w->file_off = m->file_off;
	w->done = m->len;
	w->len = (m->len + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
	w->written = false;
	w->crc_pending = true;
	list_add_tail(&c->crc_q, &w->clink);
	c->slots_held++;
	rs->held++;
	rs->crc_pending++;
	c->last_extent_ms = now_ms();

	/* The write goes first; the checksum waits (see writer_crc_drain)
	 * unless the rank is staged or the client is short of free slots.
	 * Both only read the slot, and it is released after both. */
	writer_submit(c, (uint32_t)slot_idx);
	if (rs->staged)
		writer_crc_drain(c, 0);
	else if (c->n_slots - c->slots_held <= 1)
		writer_crc_drain(c, c->n_slots / 8 > 2 ? c->n_slots / 8 : 2);
	else
		writer_reap(c);
}

static void on_status(struct client *c)
{
	struct proto_status_reply m;
	char *json = NULL;
	int fd, r;

	r = status_report(c->srv, &json);
	if (r < 0) {
		drop(c, "status report failed");
		return;
	}
	fd = memfd_create("ckptd-status", MFD_CLOEXEC);
	if (fd < 0) {
		free(json);
		send_error(c->fd, -errno, "cannot make the status report");
		return;
	}
	size_t len = strlen(json), off = 0;
	while (off < len) {
		ssize_t n = write(fd, json + off, len - off);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	free(json);
	proto_init(&m.h, PROTO_STATUS_REPLY, sizeof(m));
	m.len = off;
	if (proto_send(c->fd, &m, sizeof(m), fd) < 0)
		client_close(c, "cannot send status");
	close(fd);
}

void server_client_event(struct client *c, uint32_t events)
{
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_hdr h;
		struct proto_hello hello;
		struct proto_save_begin begin;
		struct proto_extent extent;
		struct proto_save_abort abort;
	} u;
	char err[256];

	/* Bounded, so one busy client cannot starve the others (epoll is
	 * level-triggered: the rest is read on the next round). */
	for (int i = 0; i < 32 && !c->gone; i++) {
		ssize_t n = proto_recv(c->fd, u.buf, NULL);
		if (n == -EAGAIN)
			return;
		if (n == 0 || n == -ECONNRESET) {
			client_close(c, "disconnected");
			return;
		}
		if (n < 0) {
			if (n == -EMSGSIZE)
				drop(c, "oversized message");
			else
				client_close(c, "connection error");
			return;
		}
		int type = proto_check(u.buf, (size_t)n, err, sizeof(err));
		if (type < 0) {
			drop(c, "%s", err);
			return;
		}
		if (type != PROTO_HELLO && !c->role) {
			drop(c, "message type %d before HELLO", type);
			return;
		}
		if (c->arena_pending) {
			drop(c, "message type %d before HELLO_OK", type);
			return;
		}
		switch (type) {
		case PROTO_HELLO:
			on_hello(c, &u.hello);
			break;
		case PROTO_SAVE_BEGIN:
			if (c->role != PROTO_ROLE_CLIENT)
				goto wrong;
			on_save_begin(c, &u.begin);
			break;
		case PROTO_EXTENT:
			if (c->role != PROTO_ROLE_CLIENT)
				goto wrong;
			on_extent(c, &u.extent);
			break;
		case PROTO_SAVE_ABORT: {
			struct rank_save *rs;
			if (c->role != PROTO_ROLE_CLIENT)
				goto wrong;
			rs = find_rank(c, u.abort.token);
			if (rs && !rs->staged && !rs->failed && rs->save->state == SAVE_ACTIVE)
				rank_fail(rs, -ECANCELED, "rank %u aborted its save", rs->rank);
			break;
		}
		case PROTO_STATUS_REQ:
			on_status(c);
			break;
		default:
			goto wrong;
		}
		continue;
wrong:
		drop(c, "message type %d is not for this role", type);
		return;
	}
	(void)events;
}

void client_send_release(struct client *c, uint64_t arena_off)
{
	struct proto_release m;

	if (c->gone)
		return;
	proto_init(&m.h, PROTO_RELEASE, sizeof(m));
	m.arena_off = arena_off;
	if (proto_send(c->fd, &m, sizeof(m), -1) < 0)
		client_close(c, "cannot send RELEASE");
}

void rank_tell(struct rank_save *rs)
{
	struct save *s = rs->save;
	struct client *c = rs->client;

	if (rs->told)
		return;
	rs->told = true;
	if (c->gone)
		return;
	if (s->state == SAVE_COMMITTED)
		send_result(c, PROTO_SAVE_DONE, rs->token, 0, "");
	else
		send_result(c, PROTO_SAVE_DONE, rs->token, rs->failed ? rs->err : s->err,
			    s->msg);
}
