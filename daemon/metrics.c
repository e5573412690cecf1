/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - the daemon's Prometheus metrics (metrics.h): the counters
 * save.c reports, the exposition text, the HTTP server on the event loop and
 * the textfile job.
 *
 * HTTP, as little of it as a scraper needs: one request per connection
 * (every answer says "Connection: close"), its head read into a fixed 8 KiB
 * buffer, no body ever read.  After the answer the socket is shut for
 * writing and what the client still sends is read and dropped for a moment
 * (bounded) before the close, so that a client whose request we did not read
 * to its end still gets the answer rather than a reset.
 */
#include "daemon/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/conn.h"
#include "daemon/log.h"
#include "daemon/save.h"
#include "daemon/server.h"
#include "format/jbuf.h"

#define READ_TIMEOUT_MS 5000    /* the whole request head within this */
#define WRITE_TIMEOUT_MS 10000  /* the whole answer taken within this */
#define DRAIN_MS 1000           /* then what the client still sends, dropped */
#define DRAIN_MAX (64u << 10)
#define MAX_UIDS 64             /* users whose last commit is remembered */
#define TEXTFILE_GAP_MS 1000    /* saves ending faster than this (a client
                                 * failing saves on purpose) share a write */

/* Buckets of ckptd_save_phase_seconds: 10 ms (a small save's commit) to
 * 10 minutes (the default commit deadline). */
static const struct {
	const char *le;
	int64_t us;
} buckets[] = {
	{ "0.01", 10000 },     { "0.025", 25000 },     { "0.05", 50000 },
	{ "0.1", 100000 },     { "0.25", 250000 },     { "0.5", 500000 },
	{ "1", 1000000 },      { "2.5", 2500000 },     { "5", 5000000 },
	{ "10", 10000000 },    { "30", 30000000 },     { "60", 60000000 },
	{ "120", 120000000 },  { "300", 300000000 },   { "600", 600000000 },
};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

static const char *const phase_names[METRICS_N_PHASES] = { "stage", "write", "upload",
							    "commit" };
static const char *const backend_names[METRICS_N_BACKENDS] = { "local", "s3", "spill" };

struct hist {
	uint64_t n[N_BUCKETS + 1]; /* per bucket, not cumulative; the last: above 600 s */
	uint64_t count;
	uint64_t sum_us;
};

enum mc_state { MC_READ, MC_WRITE, MC_DRAIN, MC_DEAD };

struct mconn {
	struct metrics *m;
	struct ev ev;
	int fd;
	enum mc_state state;
	int64_t deadline_ms;
	char *out;                 /* the whole answer */
	size_t out_len, out_off, drained, in_len;
	bool want_out;             /* EPOLLOUT armed */
	struct list link;          /* in metrics.conns, then metrics.dead */
	char in[METRICS_REQUEST_MAX];
};

struct tfjob {
	struct work w;
	struct metrics *m;
	int dirfd;
	const char *name;
	char *text;
	size_t len;
};

struct metrics {
	struct server *srv;
	int lfd;                   /* -1: no HTTP */
	struct ev ev_listen;
	bool listen_paused;        /* out of descriptors: resumed at the next tick */
	char listen_addr[64];
	struct list conns, dead;
	unsigned n_conns;

	uint64_t written[METRICS_N_BACKENDS];
	struct hist phases[METRICS_N_PHASES];
	struct {
		char job[129];
		uint64_t step;
	} jobs[METRICS_MAX_JOBS];
	unsigned n_jobs;
	bool other_set;            /* a job past METRICS_MAX_JOBS committed */
	uint64_t other_step;
	struct metrics_commit last_all;
	struct metrics_commit last_uid[MAX_UIDS];
	unsigned n_uids;

	int dirfd;                 /* the textfile's directory, or -1: off */
	char *fname;               /* its name in there */
	bool dirty, writing, failing;
	int64_t last_write_ms;
};

/* ---- counters ------------------------------------------------------------ */

void metrics_written(struct server *srv, enum metrics_backend b, uint64_t bytes)
{
	if (srv->metrics && b < METRICS_N_BACKENDS)
		srv->metrics->written[b] += bytes;
}

void metrics_observe(struct server *srv, enum metrics_phase p, int64_t us)
{
	struct hist *h;
	size_t i;

	if (!srv->metrics || p >= METRICS_N_PHASES)
		return;
	h = &srv->metrics->phases[p];
	if (us < 0)
		us = 0;
	for (i = 0; i < N_BUCKETS && us > buckets[i].us; i++)
		;
	h->n[i]++;
	h->count++;
	h->sum_us += (uint64_t)us;
}

static void commit_set(struct metrics_commit *c, const struct save *s, int64_t now)
{
	char *root = strdup(s->root);

	if (!root)
		return; /* the older one stays: out of memory is no reason to fail */
	free(c->root);
	c->root = root;
	c->set = true;
	c->uid = s->creds.uid;
	snprintf(c->name, sizeof(c->name), "%s", s->key.name);
	snprintf(c->job, sizeof(c->job), "%s", s->key.job);
	c->step = s->key.step;
	c->bytes = s->bytes;
	c->at_ms = now;
}

static void job_step(struct metrics *m, const char *job, uint64_t step)
{
	for (unsigned i = 0; i < m->n_jobs; i++) {
		if (!strcmp(m->jobs[i].job, job)) {
			m->jobs[i].step = step;
			return;
		}
	}
	if (m->n_jobs < METRICS_MAX_JOBS) {
		snprintf(m->jobs[m->n_jobs].job, sizeof(m->jobs[0].job), "%s", job);
		m->jobs[m->n_jobs++].step = step;
		return;
	}
	m->other_set = true;
	m->other_step = step;
}

void metrics_save_end(struct server *srv, const struct save *s)
{
	struct metrics *m = srv->metrics;
	struct metrics_commit *slot = NULL;
	int64_t now = now_ms();

	if (!m)
		return;
	m->dirty = true;
	if (s->state != SAVE_COMMITTED)
		return;
	job_step(m, s->key.job, s->key.step);
	commit_set(&m->last_all, s, now);
	/* The user's entry, a free one, or the one whose commit is oldest. */
	for (unsigned i = 0; i < m->n_uids && !slot; i++)
		if (m->last_uid[i].uid == s->creds.uid)
			slot = &m->last_uid[i];
	if (!slot && m->n_uids < MAX_UIDS)
		slot = &m->last_uid[m->n_uids++];
	if (!slot) {
		slot = &m->last_uid[0];
		for (unsigned i = 1; i < m->n_uids; i++)
			if (m->last_uid[i].at_ms < slot->at_ms)
				slot = &m->last_uid[i];
		free(slot->root);
		memset(slot, 0, sizeof(*slot));
	}
	commit_set(slot, s, now);
}

const struct metrics_commit *metrics_last_commit(const struct server *srv, uid_t uid, bool all)
{
	const struct metrics *m = srv->metrics;

	if (!m)
		return NULL;
	if (all)
		return m->last_all.set ? &m->last_all : NULL;
	for (unsigned i = 0; i < m->n_uids; i++)
		if (m->last_uid[i].set && m->last_uid[i].uid == uid)
			return &m->last_uid[i];
	return NULL;
}

const char *metrics_listen_addr(const struct server *srv)
{
	return srv->metrics && srv->metrics->lfd >= 0 ? srv->metrics->listen_addr : NULL;
}

/* ---- the exposition text --------------------------------------------------- */

static void head(struct jbuf *b, const char *name, const char *type, const char *help)
{
	jbuf_lit(b, "# HELP ");
	jbuf_mem(b, name, strlen(name));
	jbuf_ch(b, ' ');
	jbuf_mem(b, help, strlen(help)); /* our own text: no '\\' or newline */
	jbuf_lit(b, "\n# TYPE ");
	jbuf_mem(b, name, strlen(name));
	jbuf_ch(b, ' ');
	jbuf_mem(b, type, strlen(type));
	jbuf_ch(b, '\n');
}

/* A label value as the text format escapes it: backslash, double quote and
 * newline.  Job names cannot hold them today; the format must not depend on
 * that. */
static void label_value(struct jbuf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			jbuf_lit(b, "\\\\");
		else if (*s == '"')
			jbuf_lit(b, "\\\"");
		else if (*s == '\n')
			jbuf_lit(b, "\\n");
		else
			jbuf_ch(b, *s);
	}
}

/* name{label="value"} (no labels if label is NULL), a space. */
static void series(struct jbuf *b, const char *name, const char *label, const char *value)
{
	jbuf_mem(b, name, strlen(name));
	if (label) {
		jbuf_ch(b, '{');
		jbuf_mem(b, label, strlen(label));
		jbuf_lit(b, "=\"");
		label_value(b, value);
		jbuf_lit(b, "\"}");
	}
	jbuf_ch(b, ' ');
}

static void num_u64(struct jbuf *b, uint64_t v)
{
	jbuf_u64(b, v);
	jbuf_ch(b, '\n');
}

static void num_f(struct jbuf *b, double v)
{
	char t[64];
	int n = snprintf(t, sizeof(t), "%.6f\n", v);

	jbuf_mem(b, t, n > 0 && (size_t)n < sizeof(t) ? (size_t)n : 0);
}

static void render_hist(struct jbuf *b, const char *phase, const struct hist *h)
{
	uint64_t cum = 0;

	for (size_t i = 0; i <= N_BUCKETS; i++) {
		cum += h->n[i];
		jbuf_lit(b, "ckptd_save_phase_seconds_bucket{phase=\"");
		label_value(b, phase);
		jbuf_lit(b, "\",le=\"");
		if (i < N_BUCKETS)
			jbuf_mem(b, buckets[i].le, strlen(buckets[i].le));
		else
			jbuf_lit(b, "+Inf");
		jbuf_lit(b, "\"} ");
		num_u64(b, cum);
	}
	series(b, "ckptd_save_phase_seconds_sum", "phase", phase);
	num_f(b, (double)h->sum_us / 1e6);
	series(b, "ckptd_save_phase_seconds_count", "phase", phase);
	num_u64(b, h->count);
}

int metrics_render(struct server *srv, char **ret, size_t *len)
{
	struct metrics *m = srv->metrics;
	struct jbuf b;
	struct list *p;
	unsigned clients = 0;

	jbuf_init(&b, 8192, 0);
	head(&b, "ckptd_saves_total", "counter",
	     "Saves on this daemon by how they ended, as ckptctl status counts them: committed, "
	     "failed, and refused (begins refused before or while opening; a save refused while "
	     "opening counts as failed too)");
	series(&b, "ckptd_saves_total", "result", "committed");
	num_u64(&b, srv->saves_committed);
	series(&b, "ckptd_saves_total", "result", "failed");
	num_u64(&b, srv->saves_failed);
	series(&b, "ckptd_saves_total", "result", "refused");
	num_u64(&b, srv->saves_refused);

	head(&b, "ckptd_save_phase_seconds", "histogram",
	     "Time of a phase: stage (a rank's begin to its last byte staged), write (staged to "
	     "durable on the first tier), upload (spilled rank: durable on the node to uploaded), "
	     "commit (rank 0's daemon: the commit job)");
	for (int i = 0; i < METRICS_N_PHASES; i++)
		render_hist(&b, phase_names[i], m ? &m->phases[i] : &(struct hist){ 0 });

	head(&b, "ckptd_bytes_written_total", "counter",
	     "Shard bytes written: local (a local root), s3 (acknowledged by S3, uploads of "
	     "spilled shards included), spill (to the spill directory)");
	for (int i = 0; i < METRICS_N_BACKENDS; i++) {
		series(&b, "ckptd_bytes_written_total", "backend", backend_names[i]);
		num_u64(&b, m ? m->written[i] : 0);
	}

	head(&b, "ckptd_latest_committed_step", "gauge",
	     "Step of the job's save committed last on this daemon (jobs past the first 64 "
	     "share job=\"(other)\")");
	for (unsigned i = 0; m && i < m->n_jobs; i++) {
		series(&b, "ckptd_latest_committed_step", "job", m->jobs[i].job);
		num_u64(&b, m->jobs[i].step);
	}
	if (m && m->other_set) {
		series(&b, "ckptd_latest_committed_step", "job", "(other)");
		num_u64(&b, m->other_step);
	}

	head(&b, "ckptd_prune_deletions_total", "counter", "Checkpoints the daemon's retention removed");
	series(&b, "ckptd_prune_deletions_total", NULL, NULL);
	num_u64(&b, srv->prune_deleted);
	head(&b, "ckptd_prune_errors_total", "counter",
	     "Checkpoints the daemon's retention failed to remove");
	series(&b, "ckptd_prune_errors_total", NULL, NULL);
	num_u64(&b, srv->prune_errors);

	head(&b, "ckptd_arena_bytes_in_use", "gauge",
	     "Memory counted against arena_total: staging arenas, resident images, load pools");
	series(&b, "ckptd_arena_bytes_in_use", NULL, NULL);
	num_u64(&b, srv->arena_in_use + srv->resident_bytes + srv->share_bytes);
	head(&b, "ckptd_arena_bytes_limit", "gauge", "arena_total");
	series(&b, "ckptd_arena_bytes_limit", NULL, NULL);
	num_u64(&b, srv->cfg.arena_total);

	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);
		clients += c->job[0] && c->state != CONN_CLOSED;
	}
	head(&b, "ckptd_clients", "gauge", "Trainer connections (ranks) open now");
	series(&b, "ckptd_clients", NULL, NULL);
	num_u64(&b, clients);
	head(&b, "ckptd_clients_evicted_total", "counter",
	     "Idle connections closed to admit another user's when max_clients was reached");
	series(&b, "ckptd_clients_evicted_total", NULL, NULL);
	num_u64(&b, srv->conns_evicted);
	head(&b, "ckptd_uptime_seconds", "gauge", "Time since the daemon started");
	series(&b, "ckptd_uptime_seconds", NULL, NULL);
	num_f(&b, (double)(now_ms() - srv->start_ms) / 1e3);
	head(&b, "ckptd_loop_stall_max_seconds", "gauge",
	     "Longest round of the event loop since start-up");
	series(&b, "ckptd_loop_stall_max_seconds", NULL, NULL);
	num_f(&b, (double)srv->max_stall_us / 1e6);
	return jbuf_finish(&b, false, ret, len);
}

/* ---- HTTP ------------------------------------------------------------------ */

static void mconn_close(struct mconn *c)
{
	struct metrics *m = c->m;

	if (c->state == MC_DEAD)
		return;
	epoll_ctl(m->srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->state = MC_DEAD;
	free(c->out);
	c->out = NULL;
	m->n_conns--;
	/* Freed between rounds: an event of this round may still name it. */
	list_del(&c->link);
	list_add_tail(&m->dead, &c->link);
}

static void want(struct mconn *c, uint32_t events)
{
	struct epoll_event ee = { .events = events, .data.ptr = &c->ev };

	if (epoll_ctl(c->m->srv->epfd, EPOLL_CTL_MOD, c->fd, &ee) < 0)
		mconn_close(c);
}

static void drain(struct mconn *c)
{
	char scratch[4096];

	while (c->state == MC_DRAIN) {
		ssize_t n = recv(c->fd, scratch, sizeof(scratch), 0);
		if (n > 0) {
			c->drained += (size_t)n;
			if (c->drained > DRAIN_MAX)
				mconn_close(c);
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else {
			if (n == 0 || errno != EAGAIN)
				mconn_close(c);
			return;
		}
	}
}

static void flush(struct mconn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->out_off += (size_t)n;
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && errno == EAGAIN) {
			if (!c->want_out) {
				c->want_out = true;
				want(c, EPOLLOUT);
			}
			return;
		} else {
			mconn_close(c);
			return;
		}
	}
	free(c->out);
	c->out = NULL;
	shutdown(c->fd, SHUT_WR);
	c->state = MC_DRAIN;
	c->deadline_ms = now_ms() + DRAIN_MS;
	want(c, EPOLLIN | EPOLLRDHUP);
	drain(c);
}

static void answer(struct mconn *c, int code, const char *reason, const char *type,
		   const char *extra, const char *body, size_t body_len, bool head_only)
{
	char hdr[512];
	int n = snprintf(hdr, sizeof(hdr),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n%s\r\n",
			 code, reason, type, body_len, extra);
	size_t total = (size_t)n + (head_only ? 0 : body_len);

	c->out = malloc(total);
	if (!c->out) {
		mconn_close(c);
		return;
	}
	memcpy(c->out, hdr, (size_t)n);
	if (!head_only)
		memcpy(c->out + n, body, body_len);
	c->out_len = total;
	c->out_off = 0;
	c->state = MC_WRITE;
	c->deadline_ms = now_ms() + WRITE_TIMEOUT_MS;
	flush(c);
}

static void answer_text(struct mconn *c, int code, const char *reason, const char *extra,
			const char *text)
{
	answer(c, code, reason, "text/plain; charset=utf-8", extra, text, strlen(text), false);
}

/*
 * The request line: METHOD SP TARGET SP HTTP/1.x, nothing else, method in
 * capitals, target an absolute path of visible ASCII.  Fills the method and
 * path (without its query).  Returns false for anything else.
 */
static bool request_line(const char *line, size_t len, char *method, size_t mlen, char *path,
			 size_t plen)
{
	const char *sp1 = memchr(line, ' ', len), *sp2, *end = line + len;
	size_t ml, tl;

	if (!sp1)
		return false;
	sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
	if (!sp2)
		return false;
	ml = (size_t)(sp1 - line);
	tl = (size_t)(sp2 - sp1 - 1);
	if (ml == 0 || ml >= mlen || tl == 0 || sp1[1] != '/')
		return false;
	for (size_t i = 0; i < ml; i++)
		if (line[i] < 'A' || line[i] > 'Z')
			return false;
	for (size_t i = 0; i < tl; i++)
		if (sp1[1 + i] <= 0x20 || sp1[1 + i] > 0x7e)
			return false;
	if ((size_t)(end - sp2 - 1) != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) ||
	    sp2[8] < '0' || sp2[8] > '9')
		return false;
	memcpy(method, line, ml);
	method[ml] = '\0';
	if (tl >= plen)
		tl = plen - 1; /* longer than any path we serve: a 404 all the same */
	memcpy(path, sp1 + 1, tl);
	path[tl] = '\0';
	path[strcspn(path, "?")] = '\0';
	return true;
}

/* Looks at what arrived: answers once the head is complete or cannot be a
 * request; else waits for more. */
static void parse(struct mconn *c)
{
	const char *nl = memchr(c->in, '\n', c->in_len);
	char method[17], path[64];
	bool done, line_ok;
	size_t ll;

	if (!nl) {
		if (c->in_len == sizeof(c->in))
			answer_text(c, 400, "Bad Request", "", "bad request\n");
		return;
	}
	ll = (size_t)(nl - c->in);
	if (ll && c->in[ll - 1] == '\r')
		ll--;
	line_ok = request_line(c->in, ll, method, sizeof(method), path, sizeof(path));
	if (!line_ok) {
		answer_text(c, 400, "Bad Request", "", "bad request\n");
		return;
	}
	/* The head ends with an empty line. */
	done = memmem(c->in, c->in_len, "\n\r\n", 3) || memmem(c->in, c->in_len, "\n\n", 2);
	if (!done) {
		if (c->in_len == sizeof(c->in))
			answer_text(c, 431, "Request Header Fields Too Large", "",
				    "request head larger than 8 KiB\n");
		return;
	}
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		answer_text(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
			    "method not allowed: GET /metrics\n");
		return;
	}
	if (strcmp(path, "/metrics")) {
		answer_text(c, 404, "Not Found", "", "not found: ckptd serves /metrics\n");
		return;
	}
	{
		char *text = NULL;
		size_t len = 0;

		if (metrics_render(c->m->srv, &text, &len) < 0) {
			answer_text(c, 503, "Service Unavailable", "", "out of memory\n");
			return;
		}
		answer(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", "", text, len,
		       !strcmp(method, "HEAD"));
		free(text);
	}
}

static void read_request(struct mconn *c)
{
	while (c->state == MC_READ) {
		ssize_t n;

		if (c->in_len == sizeof(c->in))
			return; /* parse() answered */
		n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
		if (n > 0) {
			c->in_len += (size_t)n;
			parse(c);
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else {
			if (n == 0 || errno != EAGAIN)
				mconn_close(c); /* gone before asking */
			return;
		}
	}
}

void metrics_conn_event(struct ev *ev, uint32_t events)
{
	struct mconn *c = ev->ptr;

	(void)events; /* errors and hang-ups show in recv and send */
	switch (c->state) {
	case MC_READ:
		read_request(c);
		break;
	case MC_WRITE:
		flush(c);
		break;
	case MC_DRAIN:
		drain(c);
		break;
	case MC_DEAD:
		break;
	}
}

/* At the cap a new connection takes the place of the oldest one that has
 * not sent a whole request (idle ones cannot lock scrapers out); if every
 * one is being answered, the new one is closed. */
static bool make_room(struct metrics *m)
{
	struct list *p;

	if (m->n_conns < METRICS_MAX_CONNS)
		return true;
	list_for_each(p, &m->conns)
	{
		struct mconn *c = list_entry(p, struct mconn, link);
		if (c->state == MC_READ) {
			mconn_close(c);
			return true;
		}
	}
	return false;
}

void metrics_listen_event(struct ev *ev)
{
	struct metrics *m = ev->ptr;

	for (int k = 0; k < 64; k++) {
		struct epoll_event ee = { .events = EPOLLIN | EPOLLRDHUP };
		struct mconn *c;
		int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* Level-triggered: the listener would wake the loop
				 * on every round.  Resumed at the next tick. */
				struct epoll_event off = { .events = 0, .data.ptr = &m->ev_listen };
				epoll_ctl(m->srv->epfd, EPOLL_CTL_MOD, m->lfd, &off);
				m->listen_paused = true;
				log_debug("metrics: accept: %s", strerror(errno));
			}
			return;
		}
		c = make_room(m) ? calloc(1, sizeof(*c)) : NULL;
		if (!c) {
			close(fd);
			continue;
		}
		c->m = m;
		c->fd = fd;
		c->state = MC_READ;
		c->ev = (struct ev){ EV_METRICS_CONN, c };
		c->deadline_ms = now_ms() + READ_TIMEOUT_MS;
		ee.data.ptr = &c->ev;
		if (epoll_ctl(m->srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0) {
			close(fd);
			free(c);
			continue;
		}
		list_add_tail(&m->conns, &c->link);
		m->n_conns++;
	}
}

/* ---- the textfile ------------------------------------------------------------ */

/* On a worker, as the daemon: a new file under a temporary name, made
 * exclusively (nothing planted under that name is followed or truncated),
 * renamed over the old one, so a reader sees one whole file or the other.
 * No fsync: after a power loss the next write puts it right. */
static void tf_run(struct work *w)
{
	struct tfjob *j = (struct tfjob *)w;
	char tmp[NAME_MAX + 1];
	size_t off = 0;
	int fd;

	snprintf(tmp, sizeof(tmp), ".%s.tmp", j->name);
	unlinkat(j->dirfd, tmp, 0); /* a leftover of a crash */
	fd = openat(j->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		w->res = -errno;
		snprintf(w->err, sizeof(w->err), "creating %s: %s", tmp, strerror(errno));
		return;
	}
	/* Readable by node_exporter whatever the daemon's umask. */
	if (fchmod(fd, 0644) < 0)
		w->res = -errno;
	while (w->res == 0 && off < j->len) {
		ssize_t n = write(fd, j->text + off, j->len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			w->res = -errno;
		else
			off += (size_t)n;
	}
	if (close(fd) < 0 && w->res == 0)
		w->res = -errno;
	if (w->res == 0 && renameat(j->dirfd, tmp, j->dirfd, j->name) < 0)
		w->res = -errno;
	if (w->res < 0) {
		snprintf(w->err, sizeof(w->err), "writing %s: %s", j->name, strerror(-w->res));
		unlinkat(j->dirfd, tmp, 0);
	}
}

static void tf_done(struct work *w)
{
	struct tfjob *j = (struct tfjob *)w;
	struct metrics *m = j->m;

	m->writing = false;
	/* Logged when it starts failing and when it works again, not every
	 * 15 s in between. */
	if (w->res < 0 && !m->failing)
		log_warn("metrics_textfile %s: %s", m->srv->cfg.metrics_textfile, w->err);
	else if (w->res == 0 && m->failing)
		log_info("metrics_textfile %s: written again", m->srv->cfg.metrics_textfile);
	m->failing = w->res < 0;
	free(j->text);
	free(j);
}

static void tf_submit(struct metrics *m)
{
	struct tfjob *j = calloc(1, sizeof(*j));

	if (!j)
		return;
	if (metrics_render(m->srv, &j->text, &j->len) < 0) {
		free(j);
		return;
	}
	j->w.run = tf_run;
	j->w.done = tf_done;
	j->m = m;
	j->dirfd = m->dirfd;
	j->name = m->fname;
	m->dirty = false;
	m->writing = true;
	m->last_write_ms = now_ms();
	workers_submit(&m->srv->work, &j->w);
}

/* ---- life ---------------------------------------------------------------------- */

void metrics_tick(struct server *srv)
{
	struct metrics *m = srv->metrics;
	int64_t now = now_ms();
	struct list *p, *t;

	if (!m)
		return;
	if (m->listen_paused) {
		struct epoll_event ee = { .events = EPOLLIN, .data.ptr = &m->ev_listen };
		if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, m->lfd, &ee) == 0)
			m->listen_paused = false;
	}
	list_for_each_safe(p, t, &m->conns)
	{
		struct mconn *c = list_entry(p, struct mconn, link);
		if (now > c->deadline_ms)
			mconn_close(c);
	}
	if (m->dirfd >= 0 && !m->writing &&
	    ((m->dirty && now - m->last_write_ms >= TEXTFILE_GAP_MS) ||
	     now - m->last_write_ms >= METRICS_TEXTFILE_EVERY_MS))
		tf_submit(m);
}

void metrics_reap(struct server *srv)
{
	struct metrics *m = srv->metrics;
	struct list *p, *t;

	if (!m)
		return;
	list_for_each_safe(p, t, &m->dead)
	{
		list_del(p);
		free(list_entry(p, struct mconn, link));
	}
}

static int listen_start(struct metrics *m, const char *spec)
{
	struct config_listen l;
	struct sockaddr_storage ss = { 0 };
	socklen_t slen;
	char why[256], host[INET6_ADDRSTRLEN];
	int one = 1, fd, r;

	if (config_parse_listen(spec, &l, why, sizeof(why)) < 0) {
		log_err("metrics_listen '%s': %s", spec, why);
		return -EBUSY;
	}
	if (l.family == AF_INET) {
		struct sockaddr_in *sa = (struct sockaddr_in *)&ss;
		sa->sin_family = AF_INET;
		sa->sin_port = htons(l.port);
		memcpy(&sa->sin_addr, l.addr, 4);
		slen = sizeof(*sa);
	} else {
		struct sockaddr_in6 *sa = (struct sockaddr_in6 *)&ss;
		sa->sin6_family = AF_INET6;
		sa->sin6_port = htons(l.port);
		memcpy(&sa->sin6_addr, l.addr, 16);
		slen = sizeof(*sa);
	}
	fd = socket(l.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		log_err("metrics_listen '%s': socket: %s", spec, strerror(errno));
		return r;
	}
	/* A restarted daemon binds its port again at once (TIME_WAIT). */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l.family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, slen) < 0 || listen(fd, METRICS_MAX_CONNS) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &slen) < 0) {
		r = -errno;
		log_err("metrics_listen '%s': %s", spec, strerror(errno));
		close(fd);
		return r;
	}
	if (l.family == AF_INET) {
		const struct sockaddr_in *sa = (const struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &sa->sin_addr, host, sizeof(host));
		snprintf(m->listen_addr, sizeof(m->listen_addr), "%s:%u", host,
			 (unsigned)ntohs(sa->sin_port));
	} else {
		const struct sockaddr_in6 *sa = (const struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &sa->sin6_addr, host, sizeof(host));
		snprintf(m->listen_addr, sizeof(m->listen_addr), "[%s]:%u", host,
			 (unsigned)ntohs(sa->sin6_port));
	}
	m->lfd = fd;
	m->ev_listen = (struct ev){ EV_METRICS_LISTEN, m };
	{
		struct epoll_event ee = { .events = EPOLLIN, .data.ptr = &m->ev_listen };
		if (epoll_ctl(m->srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0) {
			r = -errno;
			close(fd);
			m->lfd = -1;
			return r;
		}
	}
	log_info("metrics: serving http://%s/metrics", m->listen_addr);
	return 0;
}

static int textfile_start(struct metrics *m, const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX];
	size_t dl = slash > path ? (size_t)(slash - path) : 1;

	/* config.c checked: absolute, a file name after the last '/'. */
	if (!slash || dl >= sizeof(dir)) {
		log_err("metrics_textfile '%s': not an absolute path of a file", path);
		return -EBUSY;
	}
	memcpy(dir, path, dl);
	dir[dl] = '\0';
	m->fname = strdup(slash + 1);
	if (!m->fname)
		return -ENOMEM;
	m->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (m->dirfd < 0) {
		log_err("metrics_textfile '%s': directory '%s': %s", path, dir, strerror(errno));
		return -EBUSY; /* a configuration error: exit 78 */
	}
	m->dirty = true; /* the first file at the first tick */
	log_info("metrics: writing '%s' every %d s and after every save", path,
		 METRICS_TEXTFILE_EVERY_MS / 1000);
	return 0;
}

int metrics_start(struct server *srv)
{
	struct metrics *m = calloc(1, sizeof(*m));
	int r = 0;

	if (!m)
		return -ENOMEM;
	m->srv = srv;
	m->lfd = -1;
	m->dirfd = -1;
	list_init(&m->conns);
	list_init(&m->dead);
	srv->metrics = m;
	if (srv->cfg.metrics_textfile)
		r = textfile_start(m, srv->cfg.metrics_textfile);
	if (r == 0 && srv->cfg.metrics_listen)
		r = listen_start(m, srv->cfg.metrics_listen);
	return r;
}

void metrics_stop(struct server *srv)
{
	struct metrics *m = srv->metrics;
	struct list *p, *t;

	if (!m)
		return;
	list_for_each_safe(p, t, &m->conns)
		mconn_close(list_entry(p, struct mconn, link));
	metrics_reap(srv);
	if (m->lfd >= 0)
		close(m->lfd);
	if (m->dirfd >= 0)
		close(m->dirfd);
	free(m->fname);
	free(m->last_all.root);
	for (unsigned i = 0; i < m->n_uids; i++)
		free(m->last_uid[i].root);
	free(m);
	srv->metrics = NULL;
}
