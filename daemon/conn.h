/* SPDX-License-Identifier: MIT */
/*
 * conn.h - client connections: the handshake, the arena, the checks on every
 * message a peer sends, and the queue of messages to it.
 *
 *   NEW --HELLO(client)--> ARENA --arena made--> READY
 *   NEW --HELLO(control)--> CONTROL
 *   any --socket closed--> CLOSED (the arena stays while the daemon still
 *                                  writes from it; freed on a worker)
 *
 * A peer that breaks the protocol is dropped with a logged reason and an
 * ERROR message; nothing it sends can harm the daemon or other clients.  A
 * connection that says nothing within handshake_timeout is closed (so is a
 * control connection, ckptctl's, idle that long); each uid
 * may hold max_clients_per_uid connections, and when max_clients are taken
 * a uid with at least two fewer connections than another closes an idle one
 * of the busiest such uid (users.h).
 * An arena is sized within arena_max, the uid's arena_per_uid and
 * arena_total (users.h).  A job belongs to the uid of its first client for
 * as long as any of its connections, saves or resident images (resident.h)
 * lives.
 *
 * Sends never block and never drop a client for a full socket buffer: a
 * message that does not fit waits in the connection's queue (bounded) until
 * the socket is writable again.
 */
#ifndef CKPTD_CONN_H
#define CKPTD_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/creds.h"
#include "daemon/list.h"
#include "daemon/server.h"
#include "daemon/worker.h"
#include "daemon/writer.h"
#include "shm/proto.h"

enum conn_state { CONN_NEW, CONN_ARENA, CONN_READY, CONN_CONTROL, CONN_CLOSED };

struct outmsg {
	uint32_t len;
	int fd;                 /* sent along (SCM_RIGHTS), or -1 */
	union {
		char buf[PROTO_MSG_MAX];
		uint64_t align;
	} u;
};

struct lreq;
struct sfile;

struct conn {
	struct server *srv;
	enum conn_state state;
	struct ev ev_sock, ev_io;
	int fd;                 /* -1 once closed */
	uint32_t id;
	pid_t pid;
	struct creds creds;
	int64_t accepted_ms;
	int64_t last_msg_ms;    /* control connections idle out after this */
	bool want_out;          /* EPOLLOUT armed */
	struct outmsg *outq;    /* ring of queued messages */
	uint32_t out_head, out_n, out_cap;

	char job[CKPT_MAX_JOB_LEN + 1];
	char run[CKPT_MAX_RUN_LEN + 1];
	uint32_t rank, world;
	uint32_t max_token;     /* largest save token accepted so far */
	bool resident;          /* HELLO_RESIDENT: saves fill images (resident.h) */
	struct lfile {          /* loadio.h: lent descriptors, by handle */
		int fd;         /* or -errno: unusable (-EBADF: never lent) */
		uint32_t busy;  /* reads queued or in flight */
		bool closing;   /* LOAD_CLOSE came while busy */
		struct sfile *sf; /* share.h: its pieces may be pooled */
		char *s3;         /* or an S3 object: "<ckpt>\0<file>" (malloc'd) */
		uint64_t s3_size;
		bool s3_warned;   /* a failed read of it was logged */
	} *lfiles;              /* PROTO_LOAD_FILES entries, or NULL */
	uint32_t load_inflight;
	uint64_t load_bytes;    /* bytes of those reads */
	uint32_t n_lent;        /* lfiles holding a descriptor */
	struct lreq *load_pins; /* reads answered in the pool, not released */
	uint32_t pool_gen_sent; /* the pool whose descriptor it has (share.h) */

	/* The arena: made on an arena worker while ARENA (only that job
	 * touches these fields then). */
	struct work arena_job;
	int arena_fd;
	uint8_t *arena;
	uint64_t arena_bytes, slot_bytes;
	struct store_arena *io;
	bool io_in_epoll;
	struct writer w;
	bool writer_ok;

	struct list ranks;      /* struct rank.clink */
	struct list link;       /* in server.conns */
	/* S3 reads waiting for an s3_reads worker (loadio.c), oldest first;
	 * while there are some, s3_link is in server.s3_conns. */
	struct lreq *s3_wait, **s3_wait_tail;
	struct list s3_link;
	bool s3_listed;
	bool s3_refusal_logged; /* a refused LOAD_OBJECT was logged */
	bool freeing;           /* the free job is in flight */
	struct work free_job;
	struct store_arena *free_io; /* what the free job releases (moved */
	uint8_t *free_arena;         /* out of io/arena, which the loop may */
	int free_fd;                 /* still read while it runs) */
};

/* Accepts what the listening socket has (bounded).  Returns 0 or -errno. */
int conn_accept(struct server *srv);
/* An epoll event on the socket. */
void conn_event(struct conn *c, uint32_t events);
/* The backend's completion fd became readable. */
void conn_io_event(struct conn *c);
/* Closes the socket (idempotent); ranks not staged fail. */
void conn_close(struct conn *c, const char *why);
/* Queues or sends one message (and fd, or -1).  Returns 0, or -errno if
 * the connection was closed for it. */
int conn_send(struct conn *c, const void *msg, size_t len, int fd);
/* Ends a connection that broke the protocol: logs why, sends ERROR, closes. */
void conn_drop(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* SAVE_ACK / SAVE_DONE for a token. */
void conn_send_result(struct conn *c, enum proto_type type, uint32_t token, int err,
		      const char *msg);
/* Periodic: handshake timeouts, stalled checksums. */
void conns_tick(struct server *srv);
/* Frees closed connections nothing points at (their arenas on a worker). */
void conns_reap(struct server *srv);
/* True if connection c has a rank of a save, or a slot still being
 * written from its arena. */
bool conn_saving(const struct conn *c);
/* True if uid may use job `job`: no other uid holds a connection, save or
 * resident image of it (else that uid in *ret_owner). */
bool conn_job_free_for(struct server *srv, const char *job, uid_t uid, uid_t *ret_owner);

#endif
