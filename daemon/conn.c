/* SPDX-License-Identifier: MIT */
/*
 * conn.c - client connections (conn.h): accepting, the handshake and the
 * arena, routing each checked message to the save state machine (save.h),
 * and sending without ever blocking the loop.
 */
#include "daemon/conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/loadio.h"
#include "daemon/log.h"
#include "daemon/resident.h"
#include "daemon/save.h"
#include "daemon/share.h"
#include "daemon/status.h"
#include "daemon/users.h"
#include "format/desc.h"
#include "format/names.h"
#include "shm/arena.h"

/* Messages queued for a peer that does not read: beyond this (slots plus
 * this many) it is dropped. */
#define OUTQ_EXTRA 1024

/* ---- sending ---------------------------------------------------------------- */

static void set_out(struct conn *c, bool on)
{
	struct epoll_event ee = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = &c->ev_sock };

	if (c->want_out == on || c->fd < 0)
		return;
	c->want_out = on;
	epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &ee);
}

static void outq_clear(struct conn *c)
{
	for (uint32_t i = 0; i < c->out_n; i++) {
		struct outmsg *m = &c->outq[(c->out_head + i) % c->out_cap];
		if (m->fd >= 0)
			close(m->fd);
	}
	c->out_n = c->out_head = 0;
}

/* Sends queued messages until the socket is full again.  Returns 0 or
 * -errno (the connection must close). */
static int outq_flush(struct conn *c)
{
	while (c->out_n) {
		struct outmsg *m = &c->outq[c->out_head];
		int r = proto_send(c->fd, m->u.buf, m->len, m->fd);

		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		if (m->fd >= 0)
			close(m->fd);
		c->out_head = (c->out_head + 1) % c->out_cap;
		c->out_n--;
	}
	set_out(c, false);
	return 0;
}

static int outq_push(struct conn *c, const void *msg, size_t len, int fd)
{
	uint32_t limit = c->w.n_slots + OUTQ_EXTRA;
	struct outmsg *m;

	if (c->out_n == c->out_cap) {
		uint32_t cap = c->out_cap ? c->out_cap * 2 : 16;
		struct outmsg *q;

		if (c->out_cap >= limit)
			return -ENOBUFS;
		q = malloc((size_t)cap * sizeof(*q));
		if (!q)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->out_n; i++)
			q[i] = c->outq[(c->out_head + i) % c->out_cap];
		free(c->outq);
		c->outq = q;
		c->out_cap = cap;
		c->out_head = 0;
	}
	m = &c->outq[(c->out_head + c->out_n) % c->out_cap];
	memcpy(m->u.buf, msg, len);
	m->len = (uint32_t)len;
	m->fd = -1;
	if (fd >= 0 && (m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0)
		return -errno;
	c->out_n++;
	set_out(c, true);
	return 0;
}

int conn_send(struct conn *c, const void *msg, size_t len, int fd)
{
	int r;

	if (c->fd < 0)
		return -ENOTCONN;
	/* Keep the order: while anything waits, new messages wait too. */
	r = c->out_n ? -EAGAIN : proto_send(c->fd, msg, len, fd);
	if (r == -EAGAIN)
		r = outq_push(c, msg, len, fd);
	if (r < 0) {
		conn_close(c, r == -ENOBUFS ? "not reading its messages (send queue full)" :
					      "cannot send");
		return r;
	}
	return 0;
}

static void send_error(struct conn *c, int err, const char *msg)
{
	struct proto_error m;

	proto_init(&m.h, PROTO_ERROR, sizeof(m));
	m.err = err;
	proto_set_msg(m.msg, msg);
	conn_send(c, &m, sizeof(m), -1);
}

void conn_send_result(struct conn *c, enum proto_type type, uint32_t token, int err,
		      const char *msg)
{
	struct proto_save_result m;

	proto_init(&m.h, type, sizeof(m));
	m.token = token;
	m.err = err;
	proto_set_msg(m.msg, msg);
	conn_send(c, &m, sizeof(m), -1);
}

static void send_release(struct writer *w, uint32_t slot)
{
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, w));
	struct proto_release m;

	if (c->state == CONN_CLOSED)
		return;
	proto_init(&m.h, PROTO_RELEASE, sizeof(m));
	m.arena_off = (uint64_t)slot * c->slot_bytes;
	conn_send(c, &m, sizeof(m), -1);
}

/* ---- accepting --------------------------------------------------------------- */

/* Refuses a connection at once, telling the peer why. */
static void refuse_now(int fd, int err, const char *msg)
{
	struct proto_error m;

	proto_init(&m.h, PROTO_ERROR, sizeof(m));
	m.err = err;
	proto_set_msg(m.msg, msg);
	(void)proto_send(fd, &m, sizeof(m), -1);
	close(fd);
}

/*
 * The table is full: makes room for a connection of creds' uid, which has
 * `mine` connections, by closing an idle one of a user with two more
 * (users.h).  True if there is room now.
 */
static bool admit(struct server *srv, const struct creds *creds, pid_t pid, unsigned mine)
{
	char msg[PROTO_MSG_LEN];
	unsigned theirs = 0;
	struct conn *v = users_admission_victim(srv, creds->uid, &theirs);

	if (!v)
		return false;
	log_warn("client %u (pid %d uid %u): closed, idle, to admit pid %d of uid %u: "
		 "max_clients (%u) reached, and uid %u holds %u connections to uid %u's %u",
		 v->id, v->pid, (unsigned)v->creds.uid, pid, (unsigned)creds->uid,
		 srv->cfg.max_clients, (unsigned)v->creds.uid, theirs, (unsigned)creds->uid,
		 mine);
	snprintf(msg, sizeof(msg),
		 "ckptd closed this idle connection for another user's: max_clients (%u) is "
		 "reached and uid %u holds more connections than anyone", srv->cfg.max_clients,
		 (unsigned)v->creds.uid);
	send_error(v, -EMFILE, msg);
	conn_close(v, "closed for another user's connection (max_clients)");
	srv->conns_evicted++;
	return true; /* (conn_close took v out of n_conns) */
}

int conn_accept(struct server *srv)
{
	struct epoll_event ee;
	struct creds creds;
	unsigned mine;
	char msg[256];
	struct conn *c;
	pid_t pid;
	int fd, r;

	fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return (errno == EAGAIN || errno == EINTR) ? -EAGAIN : -errno;
	r = creds_from_peer(fd, &creds, &pid);
	if (r < 0) {
		log_warn("accept: peer credentials: %s", strerror(-r));
		close(fd);
		return 0;
	}
	mine = users_conns(srv, creds.uid);
	if (mine >= srv->cfg.max_clients_per_uid) {
		log_warn("refusing pid %d: uid %u has %u connections (max_clients_per_uid)", pid,
			 (unsigned)creds.uid, srv->cfg.max_clients_per_uid);
		snprintf(msg, sizeof(msg),
			 "uid %u has too many connections to ckptd (max_clients_per_uid = %u)",
			 (unsigned)creds.uid, srv->cfg.max_clients_per_uid);
		refuse_now(fd, -EUSERS, msg);
		return 0;
	}
	if (srv->n_conns >= srv->cfg.max_clients && !admit(srv, &creds, pid, mine)) {
		log_warn("refusing pid %d (uid %u): %u connections (max_clients), none of them "
			 "an idle one of a user with two more than this one", pid,
			 (unsigned)creds.uid, srv->n_conns);
		snprintf(msg, sizeof(msg), "ckptd has too many clients (max_clients = %u)",
			 srv->cfg.max_clients);
		refuse_now(fd, -EMFILE, msg);
		return 0;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->srv = srv;
	c->state = CONN_NEW;
	c->fd = fd;
	c->arena_fd = -1;
	c->id = ++srv->next_id;
	c->pid = pid;
	c->creds = creds;
	c->accepted_ms = now_ms();
	c->ev_sock = (struct ev){ EV_CONN, c };
	c->ev_io = (struct ev){ EV_IO, c };
	list_init(&c->ranks);
	ee.events = EPOLLIN;
	ee.data.ptr = &c->ev_sock;
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0) {
		r = -errno;
		close(fd);
		free(c);
		return r;
	}
	list_add_tail(&srv->conns, &c->link);
	srv->n_conns++;
	log_debug("client %u: connected (pid %d uid %u)", c->id, c->pid, (unsigned)c->creds.uid);
	return 0;
}

/* ---- closing ----------------------------------------------------------------- */

void conn_close(struct conn *c, const char *why)
{
	struct list *p, *t;

	if (c->state == CONN_CLOSED)
		return;
	if (c->state == CONN_READY || c->state == CONN_ARENA)
		log_info("client %u (pid %d, job '%s', rank %u): %s", c->id, c->pid, c->job, c->rank,
			 why);
	else
		log_debug("client %u: %s", c->id, why);
	c->state = CONN_CLOSED;
	epoll_ctl(c->srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->srv->n_conns--;
	outq_clear(c);

	/* A rank whose bytes are all here belongs to the daemon now and goes
	 * on; one still staging can never finish: it fails its save. */
	list_for_each_safe(p, t, &c->ranks)
	{
		struct rank *r = list_entry(p, struct rank, clink);
		r->told = true;
		rank_abort(r, -ECONNRESET, "disconnected before its shard was staged");
	}
	if (c->writer_ok)
		writer_crc_due(&c->w);
	loadio_closed(c);
}

void conn_drop(struct conn *c, const char *fmt, ...)
{
	char why[PROTO_MSG_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	log_warn("client %u (pid %d): protocol violation: %s; disconnecting", c->id, c->pid, why);
	send_error(c, -EPROTO, why);
	conn_close(c, "dropped");
}

/* ---- the arena ----------------------------------------------------------------- */

static void arena_run(struct work *w)
{
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, arena_job));
	char name[64], err[PROTO_MSG_LEN] = "";
	void *addr;
	int fd, r;

	snprintf(name, sizeof(name), "ckptd-arena-%u", c->id);
	fd = arena_create(name, c->arena_bytes, &addr);
	if (fd < 0) {
		w->res = fd;
		snprintf(w->err, sizeof(w->err), "cannot create a %llu-byte arena: %s%s",
			 (unsigned long long)c->arena_bytes, strerror(-fd),
			 fd == -EFBIG ? " (ckptd's file size limit, RLIMIT_FSIZE or systemd's "
					"LimitFSIZE=, is below it)" : "");
		return;
	}
	c->arena_fd = fd;
	c->arena = addr;
	r = c->srv->store->arena_attach(addr, c->arena_bytes, c->srv->cfg.uring_depth, &c->io, err,
					sizeof(err));
	if (r < 0) {
		w->res = r;
		snprintf(w->err, sizeof(w->err), "%s", err);
	} else if (err[0]) {
		log_warn("client %u: %s", c->id, err);
	}
}

static void arena_done(struct work *w)
{
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, arena_job));
	struct server *srv = c->srv;
	struct proto_hello_ok ok;
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = &c->ev_io };

	c->arena_job.run = NULL; /* not in flight any more */
	if (c->state == CONN_CLOSED)
		return; /* the reaper frees the arena */
	if (w->res == 0) {
		if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->store->arena_fd(c->io), &ee) < 0) {
			w->res = -errno;
			snprintf(w->err, sizeof(w->err), "epoll: %s", strerror(errno));
		} else {
			c->io_in_epoll = true;
		}
	}
	if (w->res == 0) {
		w->res = writer_init(&c->w, srv, c->arena, c->arena_bytes, c->slot_bytes, c->io,
				     send_release);
		c->writer_ok = w->res == 0;
		if (w->res < 0)
			snprintf(w->err, sizeof(w->err), "out of memory");
	}
	if (w->res < 0) {
		log_warn("client %u (pid %d): refused: %s", c->id, c->pid, w->err);
		send_error(c, w->res, w->err);
		conn_close(c, "refused");
		return;
	}
	c->state = CONN_READY;
	memset(&ok, 0, sizeof(ok));
	proto_init(&ok.h, PROTO_HELLO_OK, sizeof(ok));
	ok.client_id = c->id;
	ok.arena_bytes = c->arena_bytes;
	ok.slot_bytes = c->slot_bytes;
	/* Where the node's copies of its S3 shards wait: the client reads its
	 * own user's there itself (store/spill.c: <dir>/<uid>/cache). */
	if (srv->cfg.s3_spill_dir && strlen(srv->cfg.s3_spill_dir) < sizeof(ok.spill_dir))
		snprintf(ok.spill_dir, sizeof(ok.spill_dir), "%s", srv->cfg.s3_spill_dir);
	if (conn_send(c, &ok, sizeof(ok), c->arena_fd) < 0)
		return;
	/* The client has its own reference now; ours is the mapping. */
	close(c->arena_fd);
	c->arena_fd = -1;
	log_info("client %u (pid %d uid %u): job '%s'%s%s rank %u/%u, arena %llu MiB in %u slots",
		 c->id, c->pid, (unsigned)c->creds.uid, c->job, c->run[0] ? " run " : "", c->run,
		 c->rank, c->world, (unsigned long long)(c->arena_bytes >> 20), c->w.n_slots);
}

/* ---- the handshake ------------------------------------------------------------- */

bool conn_job_free_for(struct server *srv, const char *job, uid_t uid, uid_t *ret_owner)
{
	struct list *p;

	list_for_each(p, &srv->conns)
	{
		const struct conn *o = list_entry(p, struct conn, link);
		bool alive = o->state == CONN_ARENA || o->state == CONN_READY ||
			     (o->state == CONN_CLOSED && o->job[0] && !list_empty(&o->ranks));
		if (alive && o->creds.uid != uid && strcmp(o->job, job) == 0) {
			*ret_owner = o->creds.uid;
			return false;
		}
	}
	list_for_each(p, &srv->saves)
	{
		const struct save *s = list_entry(p, struct save, link);
		if (s->creds.uid != uid && strcmp(s->key.job, job) == 0) {
			*ret_owner = s->creds.uid;
			return false;
		}
	}
	/* A trainer that crashed left its job only in memory: the name is
	 * still taken, so that its restart gets in and restores. */
	return !images_job_owner(srv, job, uid, ret_owner);
}

static int hello_client(struct conn *c, const struct proto_hello *m, char *err, size_t errlen)
{
	struct server *srv = c->srv;
	uint64_t want, avail, room, staging, left;
	uid_t owner;

	if (!name_job_ok(m->job, err, errlen))
		return -EINVAL;
	if (!name_run_ok(m->run, err, errlen))
		return -EINVAL;
	if (m->world == 0 || m->world > CKPT_MAX_WORLD || m->rank >= m->world) {
		snprintf(err, errlen, "rank %u of world %u is not valid", m->rank, m->world);
		return -EINVAL;
	}
	/* A job belongs to the user who runs it, as long as any of its
	 * connections, saves or resident images lives here: another uid may
	 * not join it (and so may not touch its saves, nor keep its restart
	 * from its images). */
	if (!conn_job_free_for(srv, m->job, c->creds.uid, &owner)) {
		snprintf(err, errlen, "job '%s' belongs to another user (uid %u)", m->job,
			 (unsigned)owner);
		return -EACCES;
	}

	want = m->arena_bytes ? m->arena_bytes : (1ull << 30);
	if (want > srv->cfg.arena_max)
		want = srv->cfg.arena_max;
	/* Staging comes before keeping old checkpoints in memory, but one
	 * user's staging stops at arena_per_uid, and past its share a user
	 * makes room out of its own images and pools only (users.h). */
	share_make_room(srv, c->creds.uid, arena_round(want));
	staging = users_staging(srv, c->creds.uid);
	left = staging < srv->cfg.arena_per_uid ? srv->cfg.arena_per_uid - staging : 0;
	if (want > left)
		want = left;
	if (left >= ARENA_MIN_BYTES)
		images_make_room(srv, c->creds.uid, arena_round(want));
	room = srv->arena_in_use + srv->resident_bytes + srv->share_bytes;
	room = room < srv->cfg.arena_total ? srv->cfg.arena_total - room : 0;
	avail = room < left ? room : left;
	if (want > avail)
		want = avail;
	want = arena_round(want);
	if (want > avail || want > srv->cfg.arena_max) {
		uint64_t slot = arena_slot_bytes(want);
		want = want > slot ? (want / slot - 1) * slot : 0;
	}
	if (want < ARENA_MIN_BYTES || want > avail) {
		if (left <= room)
			snprintf(err, errlen,
				 "no room for a staging arena: uid %u's arenas and load pools use "
				 "%llu of arena_per_uid %llu bytes (arenas also of connections "
				 "still finishing their work)",
				 (unsigned)c->creds.uid, (unsigned long long)staging,
				 (unsigned long long)srv->cfg.arena_per_uid);
		else
			snprintf(err, errlen,
				 "no room for a staging arena: %llu of arena_total %llu bytes in "
				 "use (arenas, also of connections still finishing their work, "
				 "%llu of resident images and %llu of load pools in use)",
				 (unsigned long long)(srv->arena_in_use + srv->resident_bytes +
						      srv->share_bytes),
				 (unsigned long long)srv->cfg.arena_total,
				 (unsigned long long)srv->resident_bytes,
				 (unsigned long long)srv->share_bytes);
		return -ENOMEM;
	}
	c->arena_bytes = want;
	c->slot_bytes = arena_slot_bytes(want);
	snprintf(c->job, sizeof(c->job), "%s", m->job);
	snprintf(c->run, sizeof(c->run), "%s", m->run);
	c->rank = m->rank;
	c->world = m->world;
	c->resident = m->flags & PROTO_HELLO_RESIDENT;
	c->creds.umask = (mode_t)(m->umask & 0777);

	/* Reserve the bytes now, so concurrent handshakes respect
	 * arena_total; populating gigabytes takes seconds: a worker does it. */
	srv->arena_in_use += want;
	c->state = CONN_ARENA;
	c->arena_job = (struct work){ .run = arena_run, .done = arena_done };
	workers_submit(&srv->arenas, &c->arena_job);
	return 0;
}

static void on_hello(struct conn *c, const struct proto_hello *m)
{
	char err[PROTO_MSG_LEN] = "";
	int r;

	if (c->state != CONN_NEW) {
		conn_drop(c, "second HELLO");
		return;
	}
	if (m->role == PROTO_ROLE_CONTROL) {
		struct proto_hello_ok ok;
		memset(&ok, 0, sizeof(ok));
		proto_init(&ok.h, PROTO_HELLO_OK, sizeof(ok));
		ok.client_id = c->id;
		c->state = CONN_CONTROL;
		conn_send(c, &ok, sizeof(ok), -1);
		return;
	}
	if (m->role != PROTO_ROLE_CLIENT) {
		conn_drop(c, "HELLO with unknown role %u", m->role);
		return;
	}
	r = hello_client(c, m, err, sizeof(err));
	if (r < 0) {
		log_warn("client %u (pid %d uid %u): refused: %s", c->id, c->pid,
			 (unsigned)c->creds.uid, err);
		send_error(c, r, err);
		conn_close(c, "refused");
	}
	/* Otherwise HELLO_OK goes out once the arena is made (arena_done). */
}

/* ---- saves ------------------------------------------------------------------------ */

static void on_save_begin(struct conn *c, const struct proto_save_begin *m)
{
	struct layout l = { 0 };
	char err[PROTO_MSG_LEN] = "";
	char *copy;
	int r;

	if (rank_find(c, m->token)) {
		conn_drop(c, "SAVE_BEGIN reuses token %u", m->token);
		return;
	}
	if (m->desc_off % c->slot_bytes || m->desc_len == 0 || m->desc_len > DESC_MAX_BYTES ||
	    m->desc_off >= c->arena_bytes || m->desc_len > c->arena_bytes - m->desc_off) {
		conn_drop(c, "SAVE_BEGIN descriptor range %llu+%llu is outside the arena",
		     (unsigned long long)m->desc_off, (unsigned long long)m->desc_len);
		return;
	}
	if (m->token > c->max_token)
		c->max_token = m->token;
	/* Parse a private copy: the client can write its arena at any time. */
	copy = malloc(m->desc_len);
	if (!copy) {
		conn_send_result(c, PROTO_SAVE_ACK, m->token, -ENOMEM, "ckptd is out of memory");
		return;
	}
	memcpy(copy, c->arena + m->desc_off, m->desc_len);
	r = desc_parse(copy, m->desc_len, &l, err, sizeof(err));
	free(copy);
	if (r < 0) {
		log_warn("client %u (job '%s' rank %u): bad save descriptor: %s", c->id, c->job,
			 c->rank, err);
	} else {
		r = save_begin(c->srv, c, m->token, m->attempt, &l, err, sizeof(err));
		layout_free(&l);
		if (r < 0)
			log_info("client %u (job '%s' rank %u): save refused: %s", c->id, c->job,
				 c->rank, err);
	}
	if (r < 0) {
		c->srv->saves_refused++;
		conn_send_result(c, PROTO_SAVE_ACK, m->token, r, err);
	}
	/* Else the ACK follows once the rank's shard exists. */
}

static void on_extent(struct conn *c, const struct proto_extent *m)
{
	char err[PROTO_MSG_LEN];
	struct rank *r;
	uint64_t slot;
	int res;

	if (m->arena_off % c->slot_bytes || m->arena_off >= c->arena_bytes) {
		conn_drop(c, "EXTENT arena offset %llu is not a slot", (unsigned long long)m->arena_off);
		return;
	}
	slot = m->arena_off / c->slot_bytes;
	if (writer_slot_held(&c->w, (uint32_t)slot)) {
		conn_drop(c, "EXTENT in slot %llu, which the daemon still holds",
		     (unsigned long long)slot);
		return;
	}
	if (c->w.slots[slot].reads) {
		conn_drop(c, "EXTENT in slot %llu, which a read for a load still fills",
			  (unsigned long long)slot);
		return;
	}
	r = rank_find(c, m->token);
	if (!r) {
		/* A save that ended (and was freed) while the client still had
		 * extents on the way: give the slot straight back. */
		if (m->token > c->max_token || m->token == 0) {
			conn_drop(c, "EXTENT for unknown save token %u", m->token);
			return;
		}
		send_release(&c->w, (uint32_t)slot);
		return;
	}
	res = rank_extent(r, (uint32_t)slot, m->file_off, m->len, err, sizeof(err));
	if (res < 0)
		conn_drop(c, "%s", err);
	else if (res > 0)
		send_release(&c->w, (uint32_t)slot);
}

static void on_status(struct conn *c)
{
	struct proto_status_reply m;
	char *json = NULL;
	size_t len, off = 0;
	int fd, r;

	r = status_report(c->srv, c->creds.uid, &json);
	if (r < 0) {
		send_error(c, r, "cannot make the status report");
		return;
	}
	fd = memfd_create("ckptd-status", MFD_CLOEXEC);
	if (fd < 0) {
		free(json);
		send_error(c, -errno, "cannot make the status report");
		return;
	}
	len = strlen(json);
	while (off < len) {
		ssize_t n = write(fd, json + off, len - off);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	free(json);
	proto_init(&m.h, PROTO_STATUS_REPLY, sizeof(m));
	m.len = off;
	conn_send(c, &m, sizeof(m), fd);
	close(fd);
}

/* ckptctl spill drop: the peer's uid decides (save_drop). */
static void on_spill_drop(struct conn *c, const struct proto_spill_drop *m)
{
	struct proto_spill_reply rep;

	proto_init(&rep.h, PROTO_SPILL_REPLY, sizeof(rep));
	rep.err = save_drop(c->srv, c->creds.uid, m->what, rep.msg, sizeof(rep.msg));
	conn_send(c, &rep, sizeof(rep), -1);
}

void conn_event(struct conn *c, uint32_t events)
{
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_hdr h;
		struct proto_hello hello;
		struct proto_save_begin begin;
		struct proto_extent extent;
		struct proto_save_abort abort;
		struct proto_resident_req resident;
		struct proto_load_file lfile;
		struct proto_load_read lread;
		struct proto_load_close lclose;
		struct proto_load_release lrelease;
		struct proto_load_object lobject;
		struct proto_spill_drop drop;
	} u;
	char err[256];

	if ((events & EPOLLOUT) && c->state != CONN_CLOSED && outq_flush(c) < 0) {
		conn_close(c, "cannot send");
		return;
	}
	if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		return;
	/* Bounded, so one busy client cannot starve the others (epoll is
	 * level-triggered: the rest is read on the next round). */
	for (int i = 0; i < 32 && c->state != CONN_CLOSED; i++) {
		int fd = -1;
		ssize_t n = proto_recv(c->fd, u.buf, &fd);
		int type;

		/* Only LOAD_FILE lends a descriptor; any other is closed. */
		if (fd >= 0 && (n <= 0 || proto_check(u.buf, (size_t)n, err, sizeof(err)) !=
						 PROTO_LOAD_FILE)) {
			close(fd);
			fd = -1;
		}

		if (n == -EAGAIN)
			return;
		if (n == 0 || n == -ECONNRESET) {
			conn_close(c, "disconnected");
			return;
		}
		if (n < 0) {
			if (n == -EMSGSIZE)
				conn_drop(c, "oversized message");
			else
				conn_close(c, "connection error");
			return;
		}
		c->last_msg_ms = now_ms();
		type = proto_check(u.buf, (size_t)n, err, sizeof(err));
		if (type < 0) {
			conn_drop(c, "%s", err);
			return;
		}
		if (fd >= 0 && c->state != CONN_READY) {
			close(fd);
			fd = -1;
		}
		if (type != PROTO_HELLO && c->state == CONN_NEW) {
			conn_drop(c, "message type %d before HELLO", type);
			return;
		}
		if (c->state == CONN_ARENA) {
			conn_drop(c, "message type %d before HELLO_OK", type);
			return;
		}
		switch (type) {
		case PROTO_HELLO:
			on_hello(c, &u.hello);
			break;
		case PROTO_SAVE_BEGIN:
			if (c->state != CONN_READY)
				goto wrong;
			on_save_begin(c, &u.begin);
			break;
		case PROTO_EXTENT:
			if (c->state != CONN_READY)
				goto wrong;
			on_extent(c, &u.extent);
			break;
		case PROTO_SAVE_ABORT: {
			struct rank *r;
			if (c->state != CONN_READY)
				goto wrong;
			r = rank_find(c, u.abort.token);
			if (r)
				rank_abort(r, -ECANCELED, "aborted its save");
			break;
		}
		case PROTO_STATUS_REQ:
			on_status(c);
			break;
		case PROTO_SPILL_DROP:
			if (c->state != CONN_CONTROL)
				goto wrong;
			on_spill_drop(c, &u.drop);
			break;
		case PROTO_RESIDENT_REQ:
			if (c->state != CONN_READY)
				goto wrong;
			resident_on_req(c, &u.resident);
			break;
		case PROTO_LOAD_FILE:
			if (c->state != CONN_READY)
				goto wrong;
			loadio_on_file(c, &u.lfile, fd);
			break;
		case PROTO_LOAD_READ:
			if (c->state != CONN_READY)
				goto wrong;
			loadio_on_read(c, &u.lread);
			break;
		case PROTO_LOAD_CLOSE:
			if (c->state != CONN_READY)
				goto wrong;
			loadio_on_close(c, &u.lclose);
			break;
		case PROTO_LOAD_RELEASE:
			if (c->state != CONN_READY)
				goto wrong;
			loadio_on_release(c, &u.lrelease);
			break;
		case PROTO_LOAD_OBJECT:
			if (c->state != CONN_READY)
				goto wrong;
			loadio_on_object(c, &u.lobject);
			break;
		default:
			goto wrong;
		}
		continue;
wrong:
		conn_drop(c, "message type %d is not for this connection", type);
		return;
	}
}

void conn_io_event(struct conn *c)
{
	c->srv->store->arena_reap(c->io);
}

/* ---- time and freeing -------------------------------------------------------------- */

void conns_tick(struct server *srv)
{
	int64_t now = now_ms();
	struct list *p, *t;

	list_for_each_safe(p, t, &srv->conns)
	{
		struct conn *c = list_entry(p, struct conn, link);

		if (c->state == CONN_CONTROL &&
		    now - c->last_msg_ms > (int64_t)srv->cfg.handshake_timeout_ms) {
			conn_close(c, "control connection idle");
			continue;
		}
		if (c->state == CONN_NEW &&
		    now - c->accepted_ms > (int64_t)srv->cfg.handshake_timeout_ms) {
			char msg[128];
			snprintf(msg, sizeof(msg), "no HELLO within %llu ms (handshake_timeout)",
				 (unsigned long long)srv->cfg.handshake_timeout_ms);
			log_warn("client %u (pid %d uid %u): %s", c->id, c->pid,
				 (unsigned)c->creds.uid, msg);
			send_error(c, -ETIMEDOUT, msg);
			conn_close(c, "handshake timed out");
			continue;
		}
		/* A client that stalls mid-save must not keep checksums (and
		 * so its slots) waiting for long. */
		if (c->writer_ok && !list_empty(&c->w.crc_q) &&
		    now - c->w.last_extent_ms > 200)
			writer_crc_due(&c->w);
	}
}

static void free_run(struct work *w)
{
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, free_job));

	/* Unpinning and unmapping gigabytes takes a while: not on the loop. */
	c->srv->store->arena_detach(c->free_io);
	if (c->free_arena)
		munmap(c->free_arena, c->arena_bytes);
	if (c->free_fd >= 0)
		close(c->free_fd);
}

static void free_done(struct work *w)
{
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, free_job));

	/* The bytes were reserved when the arena was asked for. */
	c->srv->arena_in_use -= c->arena_bytes;
	list_del(&c->link);
	log_debug("client %u: freed", c->id);
	free(c->outq);
	free(c);
}

bool conn_saving(const struct conn *c)
{
	return !list_empty(&c->ranks) || (c->writer_ok && writer_held(&c->w));
}

void conns_reap(struct server *srv)
{
	struct list *p, *t;

	list_for_each_safe(p, t, &srv->conns)
	{
		struct conn *c = list_entry(p, struct conn, link);

		if (c->state != CONN_CLOSED || c->freeing || c->arena_job.run || conn_saving(c) ||
		    loadio_busy(c) || (c->io && srv->store->arena_busy(c->io)))
			continue;
		loadio_free(c);
		if (c->io_in_epoll)
			epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->store->arena_fd(c->io), NULL);
		if (c->writer_ok)
			writer_free(&c->w);
		c->writer_ok = false;
		c->freeing = true;
		c->free_io = c->io;
		c->free_arena = c->arena;
		c->free_fd = c->arena_fd;
		c->io = NULL;
		c->arena = NULL;
		c->arena_fd = -1;
		c->free_job = (struct work){ .run = free_run, .done = free_done };
		workers_submit(&srv->work, &c->free_job);
	}
}
