/* SPDX-License-Identifier: MIT */
/*
 * server.h - ckptd's state: clients (connections with their arena and
 * io_uring), saves (one per job and checkpoint name on this daemon) and the
 * ranks of a save that this daemon writes.
 *
 * One thread runs everything from an epoll loop; nothing here is locked.
 *
 * Lifetimes.  A client lives while its socket is open OR while the daemon
 * still owns work in its arena: a trainer that dies after "staged" leaves a
 * client with gone = true whose writes finish, whose rank is committed, and
 * which is freed when its last rank is done.  A save lives until it is
 * committed or failed and every local rank has been told and has no write in
 * flight.
 */
#ifndef CKPTD_SERVER_H
#define CKPTD_SERVER_H

#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/config.h"
#include "format/layout.h"
#include "shm/proto.h"

struct list {
	struct list *prev, *next;
};

#define list_entry(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define list_for_each_safe(pos, tmp, head)                                              \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                  \
	     (pos) = (tmp), (tmp) = (pos)->next)

static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}
static inline bool list_empty(const struct list *l)
{
	return l->next == l;
}
static inline void list_add_tail(struct list *head, struct list *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}
static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

/* What an epoll event points at. */
enum ev_kind { EV_LISTEN = 1, EV_CLIENT, EV_RING, EV_SIGNAL, EV_TIMER, EV_ARENA };
struct ev {
	enum ev_kind kind;
	void *ptr;
};

enum save_state { SAVE_ACTIVE = 0, SAVE_COMMITTED, SAVE_FAILED };

struct client;
struct save;

/* One write the daemon owns: a slot of the client's arena. */
struct wreq {
	struct rank_save *rs;   /* NULL when the slot is free */
	uint64_t file_off;      /* next byte to write */
	uint64_t len;           /* bytes still to write (padded to LAYOUT_ALIGN) */
	uint64_t done;          /* file bytes of the extent (unpadded), for stats */
	bool written;           /* the write is complete */
	bool crc_pending;       /* not checksummed yet (in client->crc_q) */
	struct list qlink;      /* in client->wait_q while waiting for ring room */
	struct list clink;      /* in client->crc_q */
};

/* The part of a save that one local client (rank) writes. */
struct rank_save {
	struct save *save;
	struct client *client;  /* the connection; its arena outlives the socket */
	uint32_t rank;
	uint32_t token;
	struct layout layout;
	uint32_t *crcs;         /* layout.n_crcs */
	int fd;                 /* the shard file in the work dir */
	bool direct;            /* fd is O_DIRECT */
	uint32_t n_extents;
	uint32_t extents_received;
	uint32_t extents_written;
	uint8_t *got;           /* one bit per extent */
	uint64_t bytes_received;
	uint64_t bytes_written;
	unsigned inflight;      /* writes (and the fsync) submitted, not completed */
	unsigned held;          /* arena slots this rank holds (written or queued) */
	unsigned crc_pending;   /* of those, not checksummed yet */
	int64_t t_begin, t_staged, t_written; /* now_us(), for the debug log */
	bool staged;            /* every extent arrived: the daemon owns the rank */
	bool syncing;
	bool durable;           /* fsynced and its index is in the work dir */
	bool failed;
	int err;                /* this rank's own failure */
	bool told;              /* SAVE_DONE sent (or the client is gone) */
	struct list slink;      /* in save->ranks */
	struct list clink;      /* in client->ranks */
};

struct save {
	struct server *srv;
	char job[CKPT_MAX_JOB_LEN + 1];
	char name[CKPT_MAX_NAME_LEN + 1];
	char *root;             /* canonical */
	char work[CKPT_MAX_NAME_LEN + CKPT_MAX_JOB_LEN + 16]; /* ".partial-<name>-<job>" */
	uint32_t world;
	int rootfd, workfd;
	int64_t started_ms, deadline_ms;
	enum save_state state;
	int err;
	char msg[PROTO_MSG_LEN];
	bool coordinator;       /* rank 0 writes through this daemon */
	uint32_t n_present;     /* coordinator: indexes seen so far (prefix scan) */
	uint64_t bytes;         /* local ranks' file bytes */
	struct list ranks;
	struct list link;       /* in server->saves */
};

struct client {
	struct server *srv;
	struct ev ev_sock, ev_ring;
	int fd;                 /* -1 once the connection is closed */
	bool gone;
	uint32_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint32_t role;
	char job[CKPT_MAX_JOB_LEN + 1];
	uint32_t rank, world;
	uint32_t max_token;     /* largest save token accepted so far */

	/* The arena is made on a worker thread (populating gigabytes takes
	 * seconds, which must not stall other clients' saves).  While
	 * arena_pending, only that thread touches arena_fd, arena, the ring
	 * and efd; it hands the client back through server.apipe. */
	bool arena_pending;
	int arena_err;
	char arena_msg[PROTO_MSG_LEN];
	int arena_fd;
	uint8_t *arena;
	uint64_t arena_bytes, slot_bytes;
	uint32_t n_slots;
	struct wreq *slots;     /* n_slots; slots[i].rs != NULL: daemon holds it */
	uint32_t slots_held;

	struct io_uring ring;
	bool ring_ok, fixed;
	int efd;
	unsigned ring_depth, ring_inflight;
	struct list wait_q;     /* wreqs waiting for ring room */
	struct list crc_q;      /* wreqs whose checksum is deferred, in order */
	int64_t last_extent_ms; /* when the last EXTENT arrived */

	struct list ranks;      /* rank_saves of this client */
	struct list link;       /* in server->clients */
};

struct server {
	struct config cfg;
	int epfd, lfd, sigfd, tfd;
	int apipe[2];           /* arena workers -> loop: finished clients */
	unsigned arenas_pending;
	struct ev ev_listen, ev_sig, ev_timer, ev_arena;
	struct list clients, saves;
	unsigned n_clients;
	uint32_t next_id;
	uint64_t arena_in_use;
	bool stopping;
	bool euid_root;
	uint64_t fsize_limit;    /* RLIMIT_FSIZE of this process; 0: none */
	int64_t start_ms, last_sweep_ms;
	uint64_t saves_committed, saves_failed, bytes_written;
};

int64_t now_ms(void);
int64_t now_us(void);

/* server.c: connections and the protocol */
int server_accept(struct server *srv);
/* Finishes the handshakes whose arenas the workers have made. */
void server_arena_event(struct server *srv);
void server_client_event(struct client *c, uint32_t events);
void client_close(struct client *c, const char *why);
void client_maybe_free(struct client *c);
/* Computes the CRCs of the item pieces in the extent at file offset `off`
 * (`len` bytes at `buf`). */
void rank_crc_extent(struct rank_save *rs, const uint8_t *buf, uint64_t off, uint64_t len);
/* Gives the slot at arena_off back to the client (if it is still there). */
void client_send_release(struct client *c, uint64_t arena_off);
/* Sends SAVE_DONE for a rank (once). */
void rank_tell(struct rank_save *rs);

/* writer.c: the io_uring writer */
int writer_init(struct client *c, unsigned depth, char *err, size_t errlen);
void writer_exit(struct client *c);
/* Starts writing slot `slot` (which the client filled with an extent). */
void writer_submit(struct client *c, uint32_t slot);
/*
 * Checksums extents whose CRC was deferred, oldest first, releasing the
 * slots already written, until want_free slots are free (0: all of them).
 * The loop defers checksums while a client is staging (they would take CPU
 * from its copy threads on a small machine) and drains them all when the
 * rank is staged, when the client goes away or stalls; and a few when the
 * client is about to run out of free slots.
 */
void writer_crc_drain(struct client *c, uint32_t want_free);
/* Starts the fsync of a rank whose every extent is written. */
void writer_fsync(struct rank_save *rs);
void writer_ring_event(struct client *c);
/* Handles the completions already in the ring, without waiting: called
 * between extents so the disk never idles while the loop checksums. */
void writer_reap(struct client *c);

/* commit.c: saves, ranks, the commit */
/* Opens (or joins) the save a SAVE_BEGIN names and creates the rank's shard
 * file.  On failure returns -errno with the reason in err. */
int save_begin_rank(struct server *srv, struct client *c, uint32_t token, struct layout *l,
		    struct rank_save **ret_rs, char *err, size_t errlen);
/* Called when the rank's shard is written and fsynced (res = 0) or failed. */
void rank_synced(struct rank_save *rs, int res);
/* Fails a save for every rank with err and a reason. */
void save_fail(struct save *s, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A rank's own failure (its client gone before staging, aborted, I/O). */
void rank_fail(struct rank_save *rs, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Frees a rank of a finished save once it has no write in flight. */
void rank_maybe_free(struct rank_save *rs);
/* Frees finished saves, their ranks and closed clients with nothing left in
 * flight.  Only called between event batches: handlers never free what
 * another event of the same batch may point at. */
void server_reap(struct server *srv);
/* Periodic: deadlines, waiting for other daemons, the sweep. */
void saves_tick(struct server *srv);
/* Removes stale work directories (older than the commit deadline). */
void sweep_roots(struct server *srv);

#endif
