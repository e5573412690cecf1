/* SPDX-License-Identifier: MIT */
/*
 * s3_retry.h - which failed S3 requests are tried again, and when.
 *
 * Retried: transport failures (timeouts, resets, refused or dropped
 * connections, a response cut short), HTTP 429, 500, 502, 503 and 504, and
 * the S3 codes that say "later" whatever the status (SlowDown,
 * RequestTimeout, InternalError, ServiceUnavailable and the like; not
 * RequestTimeTooSkewed: a clock that is off stays off).  BadDigest is
 * retried too: it means the
 * bytes were damaged on the way, and the part is sent again from the arena,
 * which still holds them.  Everything else fails at once with S3's code and
 * message.  Waits grow exponentially up to a cap, with full jitter (a random
 * wait in [0, min(cap, base * 2^n)]), within a budget of attempts.
 */
#ifndef CKPT_STORE_S3_RETRY_H
#define CKPT_STORE_S3_RETRY_H

#include <stdbool.h>
#include <stdint.h>

/* How a request ended below HTTP. */
enum s3_transport {
	S3_NET_OK = 0,       /* a complete HTTP response */
	S3_NET_TIMEOUT,      /* no progress within the limit */
	S3_NET_RESET,        /* connection refused, reset or closed early */
	S3_NET_TRUNCATED,    /* a response shorter than it said */
	S3_NET_OTHER,        /* anything else (TLS, resolving, out of memory) */
};

enum s3_verdict {
	S3_DONE = 0,  /* success */
	S3_RETRY,     /* try again after a wait, if the budget allows */
	S3_FAIL,      /* give up now */
};

/*
 * The verdict on one attempt: its transport outcome, HTTP status (0 if
 * none), and S3 error code ("" if the body had none).  A 2xx with an S3
 * error code (CompleteMultipartUpload may answer 200 with an <Error>) is
 * judged by the code.
 */
enum s3_verdict s3_classify(enum s3_transport net, long status, const char *code);

/* The negative errno that stands for a final failure (for the caller's
 * return value; the message keeps S3's own code and text). */
int s3_errno(enum s3_transport net, long status, const char *code);

/*
 * The wait before retry number `attempt` (1 for the first retry), in ms:
 * uniform in [0, min(cap_ms, base_ms * 2^(attempt - 1))], drawn from *seed
 * (a xorshift state the caller keeps; any non-zero start).
 */
uint64_t s3_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms, uint64_t *seed);

#endif
