/* SPDX-License-Identifier: MIT */
/*
 * fake_ckptd.h - an in-process stand-in for ckptd, for libckpt unit tests.
 *
 * It runs one thread that listens on a Unix SOCK_SEQPACKET socket, answers
 * HELLO with an arena (arena_create()), parses each save's descriptor, copies
 * every EXTENT into an in-memory file image, releases the slot, and reports
 * SAVE_DONE once all bytes of a save arrived.  The finished images stay
 * available for the test to inspect.  Knobs make it misbehave on purpose.
 *
 * It also checks the client: extents must land in slots the client owns,
 * cover each file exactly once, and zero-pad the last slot; every breach is
 * counted in `violations` with the last reason kept in `violation`.
 */
#ifndef CKPT_TESTS_FAKE_CKPTD_H
#define CKPT_TESTS_FAKE_CKPTD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "format/layout.h"

struct fake_ckptd_opts {
	const char *socket_path;   /* required; an old socket file is removed */
	uint64_t arena_max;        /* cap on a granted arena (0: 64 MiB) */
	int refuse_hello;          /* < 0: answer HELLO with ERROR(this errno) */
	int refuse_save;           /* < 0: SAVE_ACK every save with this errno */
	unsigned refuse_first;     /* > 0: refuse only the first this many */
	unsigned ack_delay_us;     /* sleep before each SAVE_ACK (a daemon
	                            * slow to create the shard file) */
	int done_err;              /* < 0: SAVE_DONE every save with this errno */
	unsigned release_delay_us; /* sleep before each RELEASE (slow drain) */
	unsigned close_after_extents; /* > 0: drop a client after this many
	                                * EXTENTs (no RELEASE for the last) */
	bool discard;              /* keep no image (benchmarks): extents are
	                            * checked and released, not copied */
	bool silent;               /* accept and read HELLO, never answer */
	int refuse_at_accept;      /* < 0: on accept, send ERROR(this errno)
	                            * and close without reading anything (as
	                            * ckptd does with too many clients) */
};

/* One save as the fake saw it. */
struct fake_save {
	uint32_t client_id;
	uint32_t token;
	uint32_t attempt;       /* from SAVE_BEGIN */
	struct layout layout;   /* from desc_parse */
	uint8_t *image;         /* layout.file_size bytes (NULL with discard) */
	uint64_t received;      /* bytes received */
	uint64_t extents;       /* EXTENT messages for this save */
	bool done;              /* SAVE_DONE sent */
	bool aborted;           /* SAVE_ABORT received */
	int done_err;
};

struct fake_ckptd;

/* Starts the fake on opts->socket_path.  Returns 0 or -errno. */
int fake_ckptd_start(const struct fake_ckptd_opts *opts, struct fake_ckptd **ret_fake);

/* Stops the thread, closes every connection, frees the saves, removes the
 * socket.  Accepts NULL. */
void fake_ckptd_stop(struct fake_ckptd *f);

/*
 * Waits up to timeout_ms until `n` saves have finished (done or aborted).
 * Returns 0 or -ETIMEDOUT.
 */
int fake_ckptd_wait_saves(struct fake_ckptd *f, size_t n, int64_t timeout_ms);

/* Number of saves accepted (refused ones are not kept), and the i-th; the
 * pointer stays valid until fake_ckptd_stop().  Read a save only after it
 * finished (fake_ckptd_wait_saves()). */
size_t fake_ckptd_n_saves(struct fake_ckptd *f);
const struct fake_save *fake_ckptd_save(struct fake_ckptd *f, size_t i);

/* Counters. */
struct fake_ckptd_stats {
	uint64_t clients;        /* HELLOs answered with an arena */
	uint64_t extents;        /* EXTENT messages */
	uint64_t releases;       /* RELEASE messages sent */
	uint64_t max_held;       /* most slots held by the fake at once */
	uint64_t violations;     /* protocol breaches by the client */
	uint64_t disconnects;    /* connections closed (by either side) */
	uint64_t hellos;         /* HELLO messages received */
	uint32_t hello_umask;    /* the last HELLO's fields */
	char hello_run[CKPT_MAX_RUN_LEN + 1];
	char hello_job[CKPT_MAX_JOB_LEN + 1];
	char violation[256];     /* the last breach */
};
void fake_ckptd_stats(struct fake_ckptd *f, struct fake_ckptd_stats *ret);

#endif
