/* SPDX-License-Identifier: MIT */
/*
 * client.c - connecting to ckptd, the receiver thread, and disconnecting.
 *
 * The receiver is the only reader of the socket.  It never blocks on
 * anything but recvmsg() and the client lock, so slots come back to the copy
 * threads as fast as the daemon releases them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/internal.h"
#include "format/names.h"

static void broadcast_all(struct ckpt_client *c)
{
	pthread_cond_broadcast(&c->slot_cv);
	pthread_cond_broadcast(&c->copy_cv);
	pthread_cond_broadcast(&c->save_cv);
}

void save_finish_locked(struct ckpt_client *c, struct ckpt_save *s, int err, const char *msg)
{
	bool drop = false;

	if (s->on_pending) {
		struct ckpt_save **pp = &c->pending;
		while (*pp && *pp != s)
			pp = &(*pp)->p_next;
		if (*pp)
			*pp = s->p_next;
		s->p_next = NULL;
		s->on_pending = false;
		drop = true;
	}

	if (s->staging_done) {
		future_complete(&s->committed_f, err, msg);
	} else if (!s->has_done) {
		/* Still staging: the committed future must not complete before
		 * the staged one, so the save thread completes it at the end of
		 * staging.  A failure also stops the copies. */
		s->has_done = true;
		s->done_err = err;
		proto_set_msg(s->done_msg, msg);
		if (err < 0 && !s->failed) {
			s->failed = true;
			s->fail_err = err;
			proto_set_msg(s->fail_msg, msg);
		}
		pthread_cond_broadcast(&c->slot_cv);
		pthread_cond_broadcast(&c->save_cv);
	}
	if (drop)
		save_unref(s);
}

void cli_conn_dead_locked(struct ckpt_client *c, const char *detail)
{
	if (c->dead)
		return;
	c->dead = true;
	snprintf(c->dead_msg, sizeof(c->dead_msg), "connection to ckptd lost: %s", detail);
	while (c->pending)
		save_finish_locked(c, c->pending, -ECONNRESET, c->dead_msg);
	if (c->active && !c->active->failed) {
		c->active->failed = true;
		c->active->fail_err = -ECONNRESET;
		proto_set_msg(c->active->fail_msg, c->dead_msg);
	}
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
	case PROTO_SAVE_ACK: {
		const struct proto_save_result *m = buf;
		struct ckpt_save *s = c->awaiting_ack;
		if (!s || s->token != m->token) {
			snprintf(detail, dlen, "SAVE_ACK for save %u, which awaits no ACK",
				 m->token);
			return -EBADMSG;
		}
		/* The daemon has read the descriptor: its slots are free again,
		 * whether the save was accepted or not. */
		if (arena_slots_put(&c->slots, s->desc_first, s->desc_count) < 0) {
			snprintf(detail, dlen, "descriptor slots of save %u already free", m->token);
			return -EBADMSG;
		}
		pthread_cond_broadcast(&c->slot_cv);
		s->acked = true;
		s->ack_err = m->err;
		proto_set_msg(s->ack_msg, m->msg);
		if (m->err == 0) {
			atomic_fetch_add(&s->refs, 1);
			s->on_pending = true;
			s->p_next = c->pending;
			c->pending = s;
		}
		c->awaiting_ack = NULL;
		pthread_cond_broadcast(&c->save_cv);
		return 0;
	}
	case PROTO_SAVE_DONE: {
		const struct proto_save_result *m = buf;
		struct ckpt_save *s = c->pending;
		char msg[PROTO_MSG_LEN];
		while (s && s->token != m->token)
			s = s->p_next;
		if (!s) {
			/* A save this client gave up (SAVE_ABORT) may still be
			 * reported; a token never issued is a protocol error. */
			if (m->token == 0 || m->token >= c->next_token) {
				snprintf(detail, dlen, "SAVE_DONE for unknown save %u", m->token);
				return -EBADMSG;
			}
			return 0;
		}
		if (m->err && !m->msg[0])
			snprintf(msg, sizeof(msg), "ckptd failed the save: %s", strerror(-m->err));
		else
			proto_set_msg(msg, m->msg);
		save_finish_locked(c, s, m->err, msg);
		return 0;
	}
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

static void *recv_thread_main(void *arg)
{
	struct ckpt_client *c = arg;
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
	} buf;
	char detail[PROTO_MSG_LEN];

	for (;;) {
		ssize_t n = proto_recv(c->sock, buf.b, NULL);
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
		r = type < 0 ? type : handle_msg(c, type, buf.b, detail, sizeof(detail));
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
	while (c->pending)
		save_finish_locked(c, c->pending, -ECONNABORTED,
				   "client disconnected before the daemon reported the commit");
	pthread_mutex_unlock(&c->lock);

	if (c->sock >= 0)
		close(c->sock);
	if (c->arena)
		munmap(c->arena, c->arena_bytes);
	arena_slots_free(&c->slots);
	pthread_cond_destroy(&c->slot_cv);
	pthread_cond_destroy(&c->copy_cv);
	pthread_cond_destroy(&c->save_cv);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static int check_opts(const struct ckpt_connect_opts *opts)
{
	char err[256];

	if (!opts) {
		cli_set_error("ckpt_connect: options are NULL");
		return -EINVAL;
	}
	if (!name_job_ok(opts->job, err, sizeof(err))) {
		cli_set_error("ckpt_connect: %s", err);
		return -EINVAL;
	}
	if (opts->world < 1 || opts->world > CKPT_MAX_WORLD) {
		cli_set_error("ckpt_connect: world size %u is outside 1..%u", opts->world,
			      CKPT_MAX_WORLD);
		return -EINVAL;
	}
	if (opts->rank >= opts->world) {
		cli_set_error("ckpt_connect: rank %u is not below the world size %u", opts->rank,
			      opts->world);
		return -EINVAL;
	}
	if (opts->copy_threads > CLI_MAX_COPY_THREADS) {
		cli_set_error("ckpt_connect: %u copy threads, at most %u", opts->copy_threads,
			      CLI_MAX_COPY_THREADS);
		return -EINVAL;
	}
	return 0;
}

static int open_socket(const char *path, int *ret_sock)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int sock, r;

	if (!path[0] || strlen(path) >= sizeof(sa.sun_path)) {
		cli_set_error("ckpt_connect: socket path '%s' is empty or too long", path);
		return -EINVAL;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sock < 0) {
		r = -errno;
		cli_set_error("ckpt_connect: socket: %s", strerror(-r));
		return r;
	}
	while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		r = -errno;
		if (r == -ENOENT || r == -ECONNREFUSED)
			cli_set_error("no ckptd listening on '%s': %s", path, strerror(-r));
		else if (r == -EACCES || r == -EPERM)
			cli_set_error("no permission to connect to ckptd at '%s': %s", path,
				      strerror(-r));
		else
			cli_set_error("connecting to ckptd at '%s': %s", path, strerror(-r));
		close(sock);
		return r;
	}
	*ret_sock = sock;
	return 0;
}

/* HELLO -> HELLO_OK + memfd.  Returns 0 and the fd, or -errno. */
static int handshake(struct ckpt_client *c, const struct ckpt_connect_opts *opts, int *ret_fd)
{
	struct proto_hello hello;
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
		struct proto_hello_ok ok;
		struct proto_error error;
	} buf;
	char detail[PROTO_MSG_LEN];
	ssize_t n;
	int fd = -1, type, r;

	proto_init(&hello.h, PROTO_HELLO, sizeof(hello));
	hello.role = PROTO_ROLE_CLIENT;
	hello.rank = opts->rank;
	hello.world = opts->world;
	hello.arena_bytes = opts->arena_bytes ? opts->arena_bytes : CLI_DEFAULT_ARENA;
	snprintf(hello.job, sizeof(hello.job), "%s", opts->job);
	r = proto_send(c->sock, &hello, sizeof(hello), -1);
	if (r < 0) {
		cli_set_error("ckpt_connect: sending HELLO: %s", strerror(-r));
		return r;
	}

	n = proto_recv(c->sock, buf.b, &fd);
	if (n <= 0) {
		r = n == 0 ? -ECONNRESET : (int)n;
		cli_set_error("ckpt_connect: no answer to HELLO: %s",
			      n == 0 ? "ckptd closed the connection" : strerror(-r));
		return r;
	}
	type = proto_check(buf.b, (size_t)n, detail, sizeof(detail));
	if (type < 0) {
		r = type;
		cli_set_error("ckpt_connect: bad answer from ckptd: %s", detail);
		goto out_fd;
	}
	if (type == PROTO_ERROR) {
		r = buf.error.err < 0 ? buf.error.err : -EPROTO;
		cli_set_error("ckptd refused the connection: %s",
			      buf.error.msg[0] ? buf.error.msg : strerror(-r));
		goto out_fd;
	}
	if (type != PROTO_HELLO_OK) {
		r = -EPROTO;
		cli_set_error("ckpt_connect: ckptd answered HELLO with message type %d", type);
		goto out_fd;
	}
	if (fd < 0) {
		r = -EPROTO;
		cli_set_error("ckpt_connect: ckptd sent no arena with HELLO_OK");
		goto out_fd;
	}
	/* The slot size must cut the arena evenly, be a power of two and lie on
	 * the CRC grid (proto.h); anything else would corrupt the file image. */
	uint64_t ab = buf.ok.arena_bytes, sb = buf.ok.slot_bytes;
	if (sb == 0 || (sb & (sb - 1)) || sb % LAYOUT_CRC_BLOCK || ab < sb || ab % sb ||
	    ab / sb > INT32_MAX || ab > (uint64_t)SIZE_MAX / 2) {
		r = -EPROTO;
		cli_set_error("ckpt_connect: ckptd granted an unusable arena (%llu bytes, "
			      "%llu-byte slots)", (unsigned long long)ab, (unsigned long long)sb);
		goto out_fd;
	}
	c->arena_bytes = ab;
	c->slot_bytes = sb;
	c->client_id = buf.ok.client_id;
	*ret_fd = fd;
	return 0;

out_fd:
	if (fd >= 0)
		close(fd);
	return r;
}

int ckpt_connect(const struct ckpt_connect_opts *opts, struct ckpt_client **ret_client)
{
	struct ckpt_client *c;
	const char *path;
	int fd = -1, r;

	r = check_opts(opts);
	if (r < 0)
		return r;
	if (!ret_client) {
		cli_set_error("ckpt_connect: ret_client is NULL");
		return -EINVAL;
	}
	path = opts->socket_path;
	if (!path)
		path = getenv("CKPTD_SOCKET");
	if (!path || !path[0])
		path = CKPT_DEFAULT_SOCKET;

	c = calloc(1, sizeof(*c));
	if (!c) {
		cli_set_error("ckpt_connect: out of memory");
		return -ENOMEM;
	}
	c->sock = -1;
	c->rank = opts->rank;
	c->world = opts->world;
	c->next_token = 1;
	snprintf(c->job, sizeof(c->job), "%s", opts->job);
	r = -pthread_mutex_init(&c->lock, NULL);
	if (r < 0) {
		free(c);
		cli_set_error("ckpt_connect: pthread_mutex_init: %s", strerror(-r));
		return r;
	}
	if ((r = cond_init_monotonic(&c->slot_cv)) < 0 ||
	    (r = cond_init_monotonic(&c->copy_cv)) < 0 ||
	    (r = cond_init_monotonic(&c->save_cv)) < 0) {
		/* Unreachable in practice (glibc cannot fail here). */
		cli_set_error("ckpt_connect: pthread_cond_init: %s", strerror(-r));
		pthread_mutex_destroy(&c->lock);
		free(c);
		return r;
	}

	r = open_socket(path, &c->sock);
	if (r < 0)
		goto out_destroy;
	r = handshake(c, opts, &fd);
	if (r < 0)
		goto out_destroy;
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

	r = -pthread_create(&c->recv_thread, NULL, recv_thread_main, c);
	if (r < 0)
		goto out_thread;
	c->recv_started = true;
	r = -pthread_create(&c->save_thread, NULL, save_thread_main, c);
	if (r < 0)
		goto out_thread;
	c->save_started = true;
	unsigned want = opts->copy_threads ? opts->copy_threads : CLI_DEFAULT_COPY_THREADS;
	for (; c->n_copy < want; c->n_copy++) {
		r = -pthread_create(&c->copy_threads[c->n_copy], NULL, copy_thread_main, c);
		if (r < 0)
			goto out_thread;
	}
	*ret_client = c;
	return 0;

out_thread:
	cli_set_error("ckpt_connect: starting threads: %s", strerror(-r));
out_destroy:
	client_destroy(c);
	return r;
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
