/* SPDX-License-Identifier: MIT */
/*
 * proto.h - the wire protocol between libckpt (and ckptctl) and ckptd.
 *
 * Transport: a Unix SOCK_SEQPACKET socket, so every message arrives whole or
 * not at all.  Every message starts with struct proto_hdr; all integers are
 * host-endian (both ends are on one machine).  File descriptors travel with
 * SCM_RIGHTS.  Messages are small and fixed-size; what can be large (the save
 * descriptor, the status report) travels in shared memory.
 *
 * A session:
 *
 *   C: HELLO(role, job, run, rank, world, umask, arena wanted)
 *   D: HELLO_OK(arena size, slot size) + memfd      | ERROR, then close
 *
 *   per save (token chosen by the client: increasing on the connection):
 *   C: SAVE_BEGIN(token, attempt, descriptor range in the arena)
 *   D: SAVE_ACK(token, 0 | -errno + reason)   the descriptor's slots are
 *                                             free again once this arrives
 *   C: EXTENT(token, file_off, arena_off, len) ...   one per slot filled
 *   D: RELEASE(arena_off) ...                 slot written, free again
 *   D: SAVE_DURABLE(token, 0, where)          the rank's bytes are durable
 *                                             at the first tier (at most
 *                                             once, never after SAVE_DONE;
 *                                             it may not come at all)
 *   D: SAVE_DONE(token, 0 | -errno + reason)  committed, or failed
 *   C: SAVE_ABORT(token)                      client gives up a save before
 *                                             all extents are sent
 *
 * The arena is cut into slots of slot_bytes (a power of two, a multiple of
 * LAYOUT_CRC_BLOCK).  An extent fills one slot with the file bytes
 * [file_off, file_off + len): file_off is a multiple of slot_bytes, len ==
 * slot_bytes except for the file's last extent, and the client zeroes the
 * slot from len up to round_up(len, LAYOUT_ALIGN) so the daemon can write it
 * with O_DIRECT.  The daemon releases each slot exactly once.
 *
 * Resident images (a client that said HELLO_RESIDENT keeps its rank's
 * newest committed save in the daemon's memory; any client of the same uid
 * and job may read it back):
 *   C: RESIDENT_REQ(token, attempt id, hash of the checkpoint's path, rank)
 *   D: RESIDENT_REPLY(token, 0, size, step) + read-only memfd
 *                                          | RESIDENT_REPLY(token, -errno)
 *
 * Reads for a client's load (daemon/loadio.c): the client opens each file
 * itself (so the kernel checks its rights, not the daemon's) and lends the
 * daemon the descriptor; the daemon reads into the client's arena with
 * io_uring, O_DIRECT where the file system allows:
 *   C: LOAD_FILE(handle) + fd              no answer; errors come with reads
 *   C: LOAD_READ(token, handle, file_off, len, arena_off)
 *   D: LOAD_DONE(token, bytes read | -errno)
 *   C: LOAD_CLOSE(handle)
 * A shard of an S3 checkpoint is lent by name instead, and read by the
 * daemon with ranged GETs (its credentials; only under its S3 roots):
 *   C: LOAD_OBJECT(handle, checkpoint URL, file name, size)
 * then LOAD_READ/LOAD_DONE/LOAD_CLOSE as for a file (never in the pool).
 * With PROTO_LOAD_SHARE the daemon may answer in its shared pool of the
 * client's uid (daemon/share.h): LOAD_DONE(POOL, gen, pool_off), with the
 * pool's read-only memfd the first time a connection sees that gen; the
 * client reads the bytes there and then sends
 *   C: LOAD_RELEASE(token)
 * file_off, len and arena_off are multiples of 4096 (PROTO_LOAD_ALIGN);
 * the arena range is the client's (no slot of it held by the daemon) and
 * stays the daemon's until LOAD_DONE: an EXTENT for it meanwhile ends the
 * connection.  At most PROTO_LOAD_FILES handles, PROTO_LOAD_MAX bytes a read.
 *
 * Control role (ckptctl): HELLO(role=CONTROL), HELLO_OK without fd, then
 * STATUS_REQ -> STATUS_REPLY(len) + memfd holding a JSON report, or
 * SPILL_DROP(attempt id or ROOT/NAME) -> SPILL_REPLY(0 | -errno + reason):
 * an operator gives up a spilled save the daemon still owes a commit (its
 * owner or root only; daemon/save.h).
 *
 * Any message that fails validation ends the connection of that peer (the
 * daemon logs why); it never affects other clients.
 */
#ifndef CKPT_SHM_PROTO_H
#define CKPT_SHM_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.h"

#define PROTO_MAGIC   0x54504b43u /* "CKPT" in memory order */
#define PROTO_VERSION 6u
#define PROTO_MSG_MAX 1024        /* largest message, bytes */
#define PROTO_MSG_LEN 512         /* reason strings, bytes incl. NUL */

enum proto_type {
	PROTO_HELLO = 1,
	PROTO_HELLO_OK = 2,
	PROTO_ERROR = 3,
	PROTO_SAVE_BEGIN = 4,
	PROTO_SAVE_ACK = 5,
	PROTO_EXTENT = 6,
	PROTO_RELEASE = 7,
	PROTO_SAVE_DONE = 8,
	PROTO_SAVE_ABORT = 9,
	PROTO_STATUS_REQ = 10,
	PROTO_STATUS_REPLY = 11,
	PROTO_SAVE_DURABLE = 12,
	PROTO_RESIDENT_REQ = 13,
	PROTO_RESIDENT_REPLY = 14,
	PROTO_LOAD_FILE = 15,
	PROTO_LOAD_READ = 16,
	PROTO_LOAD_DONE = 17,
	PROTO_LOAD_CLOSE = 18,
	PROTO_LOAD_RELEASE = 19,
	PROTO_LOAD_OBJECT = 20,
	PROTO_SPILL_DROP = 21,
	PROTO_SPILL_REPLY = 22,
	PROTO_TYPE_MAX = 22,
};

enum proto_role {
	PROTO_ROLE_CLIENT = 1,  /* a trainer rank: gets an arena */
	PROTO_ROLE_CONTROL = 2, /* ckptctl: status only */
};

struct proto_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t size;     /* whole message, header included */
	uint32_t reserved; /* 0 */
};

struct proto_hello {
	struct proto_hdr h;
	uint32_t role;
	uint32_t rank;
	uint32_t world;
	uint32_t umask;    /* the client's file mode creation mask (<= 0777):
	                    * files of its saves are created with it */
	uint32_t flags;    /* PROTO_HELLO_* */
	uint32_t reserved; /* 0 */
	uint64_t arena_bytes;
	char job[CKPT_MAX_JOB_LEN + 1]; /* NUL-terminated */
	char run[CKPT_MAX_RUN_LEN + 1]; /* NUL-terminated; "" or a name like
	                                 * job: the same on every rank of one
	                                 * run of the job, new for each run */
};

/* HELLO flags. */
#define PROTO_HELLO_RESIDENT 0x1u /* keep the newest committed save resident */
#define PROTO_HELLO_FLAGS    0x1u /* every known flag */

struct proto_hello_ok {
	struct proto_hdr h;
	uint64_t arena_bytes; /* size of the memfd sent along (0 for control) */
	uint64_t slot_bytes;
	uint32_t client_id;
	uint32_t reserved;
	char spill_dir[PROTO_MSG_LEN]; /* the S3 spill tier's directory ("" if
	                                * none or longer than this): its cache
	                                * holds local copies of this node's S3
	                                * shards (store/spill.c) */
};

/* Sent before the daemon closes a connection it refuses or drops. */
struct proto_error {
	struct proto_hdr h;
	int32_t err; /* negative errno */
	uint32_t reserved;
	char msg[PROTO_MSG_LEN];
};

struct proto_save_begin {
	struct proto_hdr h;
	uint32_t token;
	uint32_t attempt;  /* saves of this name this client began before (0:
	                    * the first): ranks retry in step, so (job, run,
	                    * name, step, attempt) names one attempt on every
	                    * rank and never an earlier one */
	uint64_t desc_off; /* multiple of slot_bytes */
	uint64_t desc_len; /* <= DESC_MAX_BYTES, range inside the arena */
};

/* SAVE_ACK, SAVE_DONE and SAVE_DURABLE (err 0) share this shape. */
struct proto_save_result {
	struct proto_hdr h;
	uint32_t token;
	int32_t err; /* 0 or negative errno */
	char msg[PROTO_MSG_LEN];
};

struct proto_extent {
	struct proto_hdr h;
	uint32_t token;
	uint32_t reserved;
	uint64_t file_off;
	uint64_t arena_off;
	uint64_t len;
};

struct proto_release {
	struct proto_hdr h;
	uint64_t arena_off;
};

struct proto_save_abort {
	struct proto_hdr h;
	uint32_t token;
	uint32_t reserved;
};

struct proto_status_req {
	struct proto_hdr h;
};

struct proto_status_reply {
	struct proto_hdr h;
	uint64_t len; /* JSON bytes in the memfd sent along */
};

/* The pending spilled save to drop: its attempt id (32 hex digits) or its
 * canonical "ROOT/NAME" (a longer one is named by its id). */
#define PROTO_SPILL_WHAT 896
struct proto_spill_drop {
	struct proto_hdr h;
	char what[PROTO_SPILL_WHAT]; /* NUL-terminated */
};

struct proto_spill_reply {
	struct proto_hdr h;
	int32_t err;       /* 0 or negative errno */
	uint32_t reserved;
	char msg[PROTO_MSG_LEN];
};

/* Asks for the image of `rank`'s file of the checkpoint attempt `attempt`
 * (the manifest's "attempt": STORE_ID_LEN hex digits) at the checkpoint
 * directory whose canonical path ("ROOT/NAME", ROOT as the daemon's save
 * spells it: realpath, or the one spelling of an S3 URL) hashes to `where`
 * (store_hash_hex).  The attempt id alone is not enough: it names (job,
 * run, name, step, attempt number), which a later save to another root,
 * or to the same path after a delete, can repeat. */
struct proto_resident_req {
	struct proto_hdr h;
	uint32_t token;    /* echoed in the reply */
	uint32_t rank;
	char attempt[40];  /* NUL-terminated */
	char where[40];    /* NUL-terminated */
};

/* err 0: a read-only memfd comes along, holding the file's `size` bytes
 * from offset 0 (the memfd may be larger). */
struct proto_resident_reply {
	struct proto_hdr h;
	uint32_t token;
	int32_t err;       /* 0 or negative errno (-ENOENT: not resident) */
	uint64_t size;
	uint64_t step;
	char msg[PROTO_MSG_LEN];
};

#define PROTO_LOAD_ALIGN 4096u
#define PROTO_LOAD_FILES 4096u
#define PROTO_LOAD_MAX   (256ull << 20)
/* LOAD_READs a connection may have unanswered, or answered in the pool and
 * not released, at once: one more ends the connection. */
#define PROTO_LOAD_INFLIGHT 256u

struct proto_load_file {
	struct proto_hdr h;
	uint32_t handle;   /* < PROTO_LOAD_FILES; reusing one replaces it */
	uint32_t reserved;
};

/* A shard of an S3 checkpoint, lent by name: its reads are ranged GETs of
 * <ckpt>/<file> by the daemon, clipped to `size` bytes. */
#define PROTO_LOAD_URL_LEN 512u
#define PROTO_LOAD_NAME_LEN 256u
struct proto_load_object {
	struct proto_hdr h;
	uint32_t handle;   /* < PROTO_LOAD_FILES; reusing one replaces it */
	uint32_t reserved;
	uint64_t size;     /* the object's size, as the manifest says */
	char ckpt[PROTO_LOAD_URL_LEN];   /* s3://bucket/prefix/name, canonical */
	char file[PROTO_LOAD_NAME_LEN];  /* the shard's name in it */
};

struct proto_load_read {
	struct proto_hdr h;
	uint32_t token;
	uint32_t handle;
	uint64_t file_off;
	uint64_t len;
	uint64_t arena_off;
	uint32_t flags;    /* PROTO_LOAD_SHARE */
	uint32_t reserved; /* 0 */
};

/* LOAD_READ flags: the bytes may be answered in the uid's shared pool
 * instead of the arena (the client can map it and will LOAD_RELEASE). */
#define PROTO_LOAD_SHARE 0x1u

/* The grid the pool keeps files in: a read offered to it (PROTO_LOAD_SHARE)
 * lies within one cell [k * PROTO_LOAD_CELL, (k + 1) * PROTO_LOAD_CELL) of
 * its file, and is answered from the pool's copy of that whole cell, read
 * once for every request that falls in it (daemon/share.h).  A read
 * offered across two cells is answered in the arena. */
#define PROTO_LOAD_CELL (8ull << 20)
_Static_assert(PROTO_LOAD_CELL % PROTO_LOAD_ALIGN == 0 && PROTO_LOAD_MAX % PROTO_LOAD_CELL == 0,
	       "cells are whole O_DIRECT blocks, and a largest read is whole cells");

struct proto_load_done {
	struct proto_hdr h;
	uint32_t token;
	int32_t err;       /* 0 or negative errno */
	uint64_t got;      /* bytes read (< len only at the end of the file) */
	uint32_t flags;    /* PROTO_DONE_* */
	uint32_t pool_gen; /* PROTO_DONE_POOL: which pool (a new one comes
	                    * with its read-only memfd) */
	uint64_t pool_off; /* PROTO_DONE_POOL: where the bytes start in it */
};

/* LOAD_DONE flags. */
#define PROTO_DONE_POOL   0x1u /* the bytes are in the pool, not the arena;
                                * they stay there until LOAD_RELEASE(token) */
#define PROTO_DONE_SHARED 0x2u /* read from storage for another request:
                                * this one cost the disk nothing */
#define PROTO_DONE_FLAGS  0x3u

struct proto_load_release {
	struct proto_hdr h;
	uint32_t token;    /* of a LOAD_DONE with PROTO_DONE_POOL */
	uint32_t reserved;
};

struct proto_load_close {
	struct proto_hdr h;
	uint32_t handle;
	uint32_t reserved;
};

/* Fills in the header of a message of `type` and `size` bytes. */
void proto_init(struct proto_hdr *h, enum proto_type type, size_t size);

/*
 * Checks a received message of `len` bytes: magic, version, a known type,
 * size == len == the exact size of that type's struct, reserved fields zero,
 * and NUL-terminated strings.  Returns the type (> 0), or -EPROTO (wrong
 * magic/version: err says which) or -EBADMSG.
 */
int proto_check(const void *buf, size_t len, char *err, size_t errlen);

/*
 * Sends one message, with fd attached if fd >= 0 (SCM_RIGHTS).  Retries on
 * EINTR; MSG_NOSIGNAL.  Returns 0 or -errno (-EPIPE if the peer is gone).
 */
int proto_send(int sock, const void *msg, size_t len, int fd);

/* The most messages proto_send_many hands the kernel in one call. */
#define PROTO_SEND_MANY_MAX 16

/*
 * Sends n messages of len bytes each, laid out back to back at msgs, as n
 * separate messages, PROTO_SEND_MANY_MAX per system call (sendmmsg); no fds.  A blocking socket waits for room as proto_send does.
 * Returns 0 once all n are sent, or -errno; on an error *ret_sent (if not
 * NULL) says how many went out before it.
 */
int proto_send_many(int sock, const void *msgs, size_t len, unsigned n, unsigned *ret_sent);

/*
 * Receives one message into buf (PROTO_MSG_MAX bytes).  If ret_fd is not
 * NULL, an attached fd is returned there (else -1); fds that were not asked
 * for are closed.  Returns the message length (> 0), 0 on orderly shutdown,
 * -EAGAIN (non-blocking socket, nothing there), -EMSGSIZE (truncated), or
 * -errno.
 */
ssize_t proto_recv(int sock, void *buf, int *ret_fd);

/* Copies a reason into a fixed message field, always NUL-terminated. */
void proto_set_msg(char *dst, const char *src);

#endif
