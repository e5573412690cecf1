/* SPDX-License-Identifier: MIT */
/* loadio.c - reads into a client's arena for its loads (see loadio.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/conn.h"
#include "daemon/loadio.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/share.h"
#include "shm/proto.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

/* A read issued as pieces of at most LOADIO_PIECE bytes: the disk sees
 * many requests in flight, as the read limit's fio and ckpt_bench readers
 * give it (one huge O_DIRECT read is slower here). */
#define LOADIO_PIECE (8ull << 20)

struct pread_job {
	void (*done)(void *owner, int err, uint64_t got);
	void *owner;
	uint32_t pending, n;
	struct rpiece {
		struct pread_job *j;
		uint64_t len;
		int res;
	} pieces[];
};

static void rpiece_done(void *ud, int res)
{
	struct rpiece *pc = ud;
	struct pread_job *j = pc->j;
	uint64_t got = 0;
	int err = 0;

	pc->res = res;
	if (--j->pending)
		return;
	/* All pieces are back: the bytes read are the prefix of whole
	 * pieces up to the first short one (the end of the file). */
	for (uint32_t i = 0; i < j->n; i++) {
		if (j->pieces[i].res < 0) {
			err = j->pieces[i].res;
			break;
		}
		got += (uint64_t)j->pieces[i].res;
		if ((uint64_t)j->pieces[i].res < j->pieces[i].len)
			break;
	}
	j->done(j->owner, err, err ? 0 : got);
	free(j);
}

void loadio_read_pieces(const struct store_ops *store, struct store_arena *io, int fd,
			uint64_t arena_off, uint64_t file_off, uint64_t len,
			void (*done)(void *owner, int err, uint64_t got), void *owner)
{
	uint32_t n = (uint32_t)((len + LOADIO_PIECE - 1) / LOADIO_PIECE);
	struct pread_job *j = calloc(1, sizeof(*j) + n * sizeof(j->pieces[0]));

	if (!j) {
		done(owner, -ENOMEM, 0);
		return;
	}
	j->done = done;
	j->owner = owner;
	j->n = n;
	j->pending = n;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t rel = (uint64_t)i * LOADIO_PIECE;
		j->pieces[i] = (struct rpiece){ .j = j, .len = len - rel < LOADIO_PIECE ?
								    len - rel : LOADIO_PIECE };
	}
	/* j is freed by the last piece's callback, which may run inside the
	 * last call (a failure at once): nothing of it is read after.  The
	 * count covers every piece before the first goes out. */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t rel = (uint64_t)i * LOADIO_PIECE;
		store->arena_read(io, fd, arena_off + rel, file_off + rel,
				  len - rel < LOADIO_PIECE ? len - rel : LOADIO_PIECE, rpiece_done,
				  &j->pieces[i]);
	}
}

struct lreq {
	struct conn *c;
	uint32_t token, handle;
	uint64_t arena_off, file_off, len;
	struct share_wait sw; /* answered in the pool (share.h) */
	struct lreq *next_pin;
	/* An S3 object's read, on an s3_reads worker: GET of s3_len bytes
	 * (the request clipped to the object's size) into s3_dst. */
	struct work w;
	const char *s3_ckpt, *s3_file;
	uint8_t *s3_dst;
	uint64_t s3_len;
	struct lreq *s3_next; /* in its conn's s3_wait */
};

static void send_done(struct conn *c, uint32_t token, int err, uint64_t got)
{
	struct proto_load_done m;

	if (c->state == CONN_CLOSED)
		return;
	memset(&m, 0, sizeof(m));
	proto_init(&m.h, PROTO_LOAD_DONE, sizeof(m));
	m.token = token;
	m.err = err;
	m.got = got;
	conn_send(c, &m, sizeof(m), -1);
}

static bool lfiles_ready(struct conn *c)
{
	if (c->lfiles)
		return true;
	c->lfiles = malloc(PROTO_LOAD_FILES * sizeof(*c->lfiles));
	if (!c->lfiles)
		return false;
	for (uint32_t i = 0; i < PROTO_LOAD_FILES; i++)
		c->lfiles[i] = (struct lfile){ .fd = -EBADF };
	return true;
}

static void lfile_close(struct conn *c, struct lfile *f)
{
	if (f->fd >= 0) {
		close(f->fd);
		c->n_lent--;
		c->srv->lent_fds--;
	}
	share_unlend(c->srv, f->sf);
	f->sf = NULL;
	free(f->s3);
	f->s3 = NULL;
	f->s3_size = 0;
	f->s3_warned = false;
	f->fd = -EBADF;
	f->closing = false;
}

/* Room for one more lent descriptor (loadio.h): 0, or -EMFILE. */
static int lend_room(struct conn *c)
{
	struct rlimit rl;
	uint64_t total = 1024, of_uid = 0;
	struct list *p;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		total = rl.rlim_cur / 2;
	if (total < 256)
		total = 256;
	if (c->srv->lent_fds >= total)
		return -EMFILE;
	list_for_each(p, &c->srv->conns)
	{
		const struct conn *o = list_entry(p, struct conn, link);
		if (o->creds.uid == c->creds.uid)
			of_uid += o->n_lent;
	}
	return of_uid >= total / 4 ? -EMFILE : 0;
}

void loadio_on_file(struct conn *c, const struct proto_load_file *m, int fd)
{
	struct lfile *f;
	struct stat st;
	int fl;

	if (fd < 0) {
		conn_drop(c, "LOAD_FILE without a descriptor");
		return;
	}
	if (m->handle >= PROTO_LOAD_FILES) {
		close(fd);
		conn_drop(c, "LOAD_FILE handle %u is not below %u", m->handle, PROTO_LOAD_FILES);
		return;
	}
	if (!lfiles_ready(c)) {
		close(fd);
		conn_drop(c, "out of memory for lent files");
		return;
	}
	f = &c->lfiles[m->handle];
	if (f->busy) {
		close(fd);
		conn_drop(c, "LOAD_FILE replaces handle %u while reads of it are in flight",
			  m->handle);
		return;
	}
	lfile_close(c, f);
	/* Only regular files open for reading: a FIFO, socket or device could
	 * block a worker or read something that is not a checkpoint. */
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fstat(fd, &st) < 0) {
		f->fd = -EBADF;
	} else if (!S_ISREG(st.st_mode)) {
		f->fd = -EINVAL;
	} else if ((fl & O_ACCMODE) == O_WRONLY) {
		f->fd = -EBADF;
	} else {
		/* O_DIRECT where the file system has it (this changes the
		 * client's open file description, lent for this purpose);
		 * elsewhere (tmpfs) buffered reads. */
		int r = lend_room(c);
		if (r < 0) {
			if (c->n_lent == 0 || c->srv->lent_fds % 64 == 0)
				log_warn("client %u (uid %u): no room for another lent descriptor "
					 "(%u lent in all): its reads of handle %u fail with EMFILE",
					 c->id, (unsigned)c->creds.uid, c->srv->lent_fds, m->handle);
			f->fd = r;
			close(fd);
			return;
		}
		if (!(fl & O_DIRECT))
			(void)fcntl(fd, F_SETFL, fl | O_DIRECT);
		f->fd = fd;
		f->sf = share_lend(c->srv, c->creds.uid, c->job, &st);
		c->n_lent++;
		c->srv->lent_fds++;
		return;
	}
	close(fd);
}

void loadio_on_object(struct conn *c, const struct proto_load_object *m)
{
	struct server *srv = c->srv;
	size_t lc = strlen(m->ckpt), lf = strlen(m->file);
	struct lfile *f;

	if (m->handle >= PROTO_LOAD_FILES) {
		conn_drop(c, "LOAD_OBJECT handle %u is not below %u", m->handle, PROTO_LOAD_FILES);
		return;
	}
	if (!lfiles_ready(c)) {
		conn_drop(c, "out of memory for lent files");
		return;
	}
	f = &c->lfiles[m->handle];
	if (f->busy) {
		conn_drop(c, "LOAD_OBJECT replaces handle %u while reads of it are in flight",
			  m->handle);
		return;
	}
	lfile_close(c, f);
	/* Errors come with the reads, as for LOAD_FILE: the library then
	 * reads the object itself (with its own credentials, if it has any).
	 * The daemon's credentials read only below its S3 roots, the same
	 * places they write for any client of the socket (README: S3). */
	struct s3_loc loc;
	char e[256];

	if (!srv->s3_reads.n) {
		f->fd = -EOPNOTSUPP;
	} else if (!s3_is_url(m->ckpt) || s3_url_parse(m->ckpt, &loc, e, sizeof(e)) < 0 ||
		   !lf || strchr(m->file, '/') || !strcmp(m->file, ".") || !strcmp(m->file, "..")) {
		/* (A path here would have config_root_allowed resolve it on
		 * the loop; a valid URL is printable ASCII, safe to log.) */
		f->fd = -EINVAL;
	} else if (!config_root_allowed(&srv->cfg, m->ckpt)) {
		if (!c->s3_refusal_logged)
			log_warn("client %u (uid %u): S3 load of '%s', which is not below any S3 "
				 "root of the config: refused", c->id, (unsigned)c->creds.uid,
				 m->ckpt);
		c->s3_refusal_logged = true;
		f->fd = -EPERM;
	} else if (!(f->s3 = malloc(lc + lf + 2))) {
		f->fd = -ENOMEM;
	} else {
		memcpy(f->s3, m->ckpt, lc + 1);
		memcpy(f->s3 + lc + 1, m->file, lf + 1);
		f->s3_size = m->size;
	}
}

/* The read is over (answered or not): its accounting ends. */
static void lreq_end(struct lreq *q)
{
	struct conn *c = q->c;

	c->load_inflight--;
	c->load_bytes -= q->len;
	free(q);
}

/* Its arena slots are the client's again (counted from the LOAD_READ on,
 * so no EXTENT may claim them while the read may still land there, even
 * one waiting in the pool that may fall back to the arena). */
static void slots_unread(struct lreq *q)
{
	struct conn *c = q->c;
	uint32_t first = (uint32_t)(q->arena_off / c->slot_bytes);
	uint32_t last = (uint32_t)((q->arena_off + q->len - 1) / c->slot_bytes);

	for (uint32_t s = first; s <= last; s++)
		c->w.slots[s].reads--;
}

/* Its descriptor is not needed any more. */
static void lreq_unbusy(struct lreq *q)
{
	struct conn *c = q->c;
	struct lfile *f = &c->lfiles[q->handle];

	if (--f->busy == 0 && f->closing)
		lfile_close(c, f);
}

static void direct_done(void *owner, int err, uint64_t got)
{
	struct lreq *q = owner;
	struct conn *c = q->c;

	slots_unread(q);
	lreq_unbusy(q);
	if (!err)
		c->srv->load_disk_bytes += got;
	send_done(c, q->token, err, got);
	lreq_end(q);
}

/* Reads q into the client's arena (direct_done answers; q is freed then). */
static void direct_start(struct lreq *q)
{
	struct conn *c = q->c;

	loadio_read_pieces(c->srv->store, c->io, c->lfiles[q->handle].fd, q->arena_off,
			   q->file_off, q->len, direct_done, q);
}

/* The pool answered q (share.h): res 0, the bytes are there (pinned until
 * LOAD_RELEASE); else q reads into the arena after all. */
static void shared_done(struct share_wait *w, int res)
{
	struct lreq *q = (struct lreq *)((char *)w - offsetof(struct lreq, sw));
	struct conn *c = q->c;
	struct server *srv = c->srv;
	struct proto_load_done m;
	uint64_t pool_off;
	uint32_t gen;
	int fd;

	if (res < 0) {
		direct_start(q);
		return;
	}
	slots_unread(q);
	lreq_unbusy(q);
	if (c->state == CONN_CLOSED) {
		share_put(srv, w->e);
		lreq_end(q);
		return;
	}
	memset(&m, 0, sizeof(m));
	proto_init(&m.h, PROTO_LOAD_DONE, sizeof(m));
	m.token = q->token;
	m.got = share_got(w, &pool_off, &gen, &fd);
	m.flags = PROTO_DONE_POOL | (w->reader ? 0 : PROTO_DONE_SHARED);
	m.pool_gen = gen;
	m.pool_off = pool_off;
	if (!w->reader)
		srv->load_shared_bytes += m.got;
	q->next_pin = c->load_pins;
	c->load_pins = q;
	if (c->pool_gen_sent != gen) {
		c->pool_gen_sent = gen;
		conn_send(c, &m, sizeof(m), fd);
	} else {
		conn_send(c, &m, sizeof(m), -1);
	}
}

static void s3_run(struct work *w)
{
	struct lreq *q = (struct lreq *)((char *)w - offsetof(struct lreq, w));

	w->res = store_s3_read_range_err(q->s3_ckpt, q->s3_file, q->file_off, q->s3_len,
					 q->s3_dst, w->err, sizeof(w->err));
}

static void s3_kick(struct server *srv);

static void s3_done(struct work *w)
{
	struct lreq *q = (struct lreq *)((char *)w - offsetof(struct lreq, w));
	struct conn *c = q->c;
	struct lfile *f = &c->lfiles[q->handle];
	struct server *srv = c->srv;
	bool ran = w->run != NULL;

	if (w->res < 0 && !f->s3_warned) {
		/* Once per object: the client's load fails (or falls back)
		 * with the errno; the reason is here. */
		f->s3_warned = true;
		log_warn("client %u (uid %u): %s", c->id, (unsigned)c->creds.uid, w->err);
	}
	slots_unread(q);
	lreq_unbusy(q);
	if (w->res == 0)
		c->srv->load_s3_bytes += q->s3_len;
	send_done(c, q->token, w->res, w->res < 0 ? 0 : q->s3_len);
	lreq_end(q);
	if (ran) {
		srv->s3_submitted--;
		s3_kick(srv);
	}
}

/*
 * Hands waiting S3 reads to the workers, one connection at a time in turn,
 * never more than there are workers: a GET runs as soon as it is
 * submitted, so a client with many reads queued delays another's next read
 * by one GET at most, not by its whole queue.
 */
static void s3_kick(struct server *srv)
{
	while (srv->s3_submitted < srv->s3_reads.n && !list_empty(&srv->s3_conns)) {
		struct conn *c = list_entry(srv->s3_conns.next, struct conn, s3_link);
		struct lreq *q = c->s3_wait;

		list_del(&c->s3_link);
		c->s3_wait = q->s3_next;
		if (c->s3_wait)
			list_add_tail(&srv->s3_conns, &c->s3_link);
		else
			c->s3_listed = false;
		srv->s3_submitted++;
		q->w.run = s3_run;
		workers_submit(&srv->s3_reads, &q->w);
	}
}

/* A read of an S3 object (LOAD_OBJECT), on an s3_reads worker: the
 * request clipped to the object's size, as a file read ends at its end. */
static void s3_start(struct lreq *q)
{
	struct conn *c = q->c;
	struct lfile *f = &c->lfiles[q->handle];

	q->s3_ckpt = f->s3;
	q->s3_file = f->s3 + strlen(f->s3) + 1;
	q->s3_dst = c->arena + q->arena_off;
	q->s3_len = q->file_off >= f->s3_size ? 0 :
		    f->s3_size - q->file_off < q->len ? f->s3_size - q->file_off : q->len;
	/* run stays NULL until a worker is given it (s3_kick). */
	q->w = (struct work){ .done = s3_done };
	if (q->s3_len == 0) {
		s3_done(&q->w);
		return;
	}
	if (!c->s3_wait)
		c->s3_wait_tail = &c->s3_wait;
	*c->s3_wait_tail = q;
	c->s3_wait_tail = &q->s3_next;
	if (!c->s3_listed) {
		c->s3_listed = true;
		list_add_tail(&c->srv->s3_conns, &c->s3_link);
	}
	s3_kick(c->srv);
}

void loadio_on_read(struct conn *c, const struct proto_load_read *m)
{
	struct server *srv = c->srv;
	struct lfile *f;
	struct lreq *q;
	uint32_t first, last;
	struct stat st;

	if (!srv->store->arena_read) {
		send_done(c, m->token, -EOPNOTSUPP, 0);
		return;
	}
	if (m->len == 0 || m->len > PROTO_LOAD_MAX || m->file_off % PROTO_LOAD_ALIGN ||
	    m->len % PROTO_LOAD_ALIGN || m->arena_off % PROTO_LOAD_ALIGN ||
	    m->arena_off >= c->arena_bytes || m->len > c->arena_bytes - m->arena_off ||
	    m->file_off > (uint64_t)INT64_MAX - m->len) {
		conn_drop(c, "LOAD_READ of %llu bytes at file offset %llu into arena offset %llu "
			  "is not aligned or not inside the arena",
			  (unsigned long long)m->len, (unsigned long long)m->file_off,
			  (unsigned long long)m->arena_off);
		return;
	}
	first = (uint32_t)(m->arena_off / c->slot_bytes);
	last = (uint32_t)((m->arena_off + m->len - 1) / c->slot_bytes);
	for (uint32_t s = first; s <= last; s++) {
		if (writer_slot_held(&c->w, s)) {
			conn_drop(c, "LOAD_READ into slot %u, which the daemon holds for a save", s);
			return;
		}
	}
	/* Reads answered in the pool count until they are released, so this
	 * bounds what one client pins there too. */
	if (c->load_inflight >= LOADIO_MAX_INFLIGHT || m->len > c->arena_bytes - c->load_bytes) {
		conn_drop(c, "more than %u reads or more bytes than its arena in flight",
			  LOADIO_MAX_INFLIGHT);
		return;
	}
	bool s3 = m->handle < PROTO_LOAD_FILES && c->lfiles && c->lfiles[m->handle].s3;

	if (m->handle >= PROTO_LOAD_FILES || !c->lfiles || (!s3 && c->lfiles[m->handle].fd < 0) ||
	    c->lfiles[m->handle].closing) {
		send_done(c, m->token,
			  m->handle < PROTO_LOAD_FILES && c->lfiles && c->lfiles[m->handle].fd < 0 ?
				  c->lfiles[m->handle].fd :
				  -EBADF,
			  0);
		return;
	}
	f = &c->lfiles[m->handle];
	q = calloc(1, sizeof(*q));
	if (!q) {
		send_done(c, m->token, -ENOMEM, 0);
		return;
	}
	q->c = c;
	q->token = m->token;
	q->handle = m->handle;
	q->arena_off = m->arena_off;
	q->file_off = m->file_off;
	q->len = m->len;
	for (uint32_t s = first; s <= last; s++)
		c->w.slots[s].reads++;
	f->busy++;
	c->load_inflight++;
	c->load_bytes += m->len;
	if (s3) {
		s3_start(q);
		return;
	}
	if ((m->flags & PROTO_LOAD_SHARE) && fstat(f->fd, &st) == 0) {
		q->sw = (struct share_wait){ .file_off = m->file_off, .len = m->len,
					     .who = c->id, .cb = shared_done };
		/* Answered by shared_done, perhaps at once. */
		if (share_get(srv, f->sf, f->fd, &st, &q->sw))
			return;
	}
	direct_start(q);
}

void loadio_on_release(struct conn *c, const struct proto_load_release *m)
{
	struct lreq **pp;

	for (pp = &c->load_pins; *pp; pp = &(*pp)->next_pin) {
		struct lreq *q = *pp;
		if (q->token == m->token) {
			*pp = q->next_pin;
			share_put(c->srv, q->sw.e);
			lreq_end(q);
			return;
		}
	}
	conn_drop(c, "LOAD_RELEASE of token %u, which holds nothing in the pool", m->token);
}

void loadio_closed(struct conn *c)
{
	/* S3 reads not begun end unread (the GETs running finish). */
	if (c->s3_listed) {
		list_del(&c->s3_link);
		c->s3_listed = false;
	}
	while (c->s3_wait) {
		struct lreq *q = c->s3_wait;
		c->s3_wait = q->s3_next;
		slots_unread(q);
		lreq_unbusy(q);
		lreq_end(q);
	}
	while (c->load_pins) {
		struct lreq *q = c->load_pins;
		c->load_pins = q->next_pin;
		share_put(c->srv, q->sw.e);
		lreq_end(q);
	}
}

void loadio_on_close(struct conn *c, const struct proto_load_close *m)
{
	struct lfile *f;

	if (m->handle >= PROTO_LOAD_FILES || !c->lfiles)
		return;
	f = &c->lfiles[m->handle];
	if (f->busy)
		f->closing = true;
	else
		lfile_close(c, f);
}

bool loadio_busy(const struct conn *c)
{
	return c->load_inflight > 0;
}

bool loadio_active(const struct conn *c)
{
	if (c->load_inflight || c->n_lent || c->load_pins || c->s3_listed)
		return true;
	for (uint32_t i = 0; c->lfiles && i < PROTO_LOAD_FILES; i++)
		if (c->lfiles[i].s3 || c->lfiles[i].busy)
			return true;
	return false;
}

void loadio_free(struct conn *c)
{
	if (!c->lfiles)
		return;
	for (uint32_t i = 0; i < PROTO_LOAD_FILES; i++)
		lfile_close(c, &c->lfiles[i]);
	free(c->lfiles);
	c->lfiles = NULL;
}
