/* SPDX-License-Identifier: MIT */
/*
 * s3_http.h - requests to an S3 endpoint with libcurl: signing, retries,
 * and one transport thread that keeps many uploads in flight.
 *
 * Two ways in:
 *   s3_call()    [worker] one request, performed on the calling thread with
 *                retries and sleeps between them (attempt files, indexes,
 *                the manifest, Create/Complete/Abort, listings, GETs);
 *   s3_submit()  [any] an upload of a body the caller keeps untouched until
 *                the job's done callback (the arena's extents), run by the
 *                transport thread with the curl multi interface, at most
 *                parts_in_flight at once, over connections it keeps open.
 *
 * Signing is curl's CURLOPT_AWS_SIGV4, with what libcurl 7.88 needs done by
 * hand (../shared/notes/s3.md): region and service always given, the
 * x-amz-content-sha256 header added (UNSIGNED-PAYLOAD: the body's integrity
 * is the CRC32C header that S3 checks), keys and query values encoded by
 * s3_addr.c, query parameters in sorted order, x-amz-security-token added for
 * session credentials, and no User-Agent/Expect/Connection headers of ours.
 *
 * Retries: s3_classify() decides; waits are s3_backoff_ms() (capped
 * exponential, full jitter); each request gets at most 1 + `retries`
 * attempts.  A request that stops making progress for `stall_ms` is a
 * timeout (curl's low-speed limit), and is retried on a fresh connection.
 * So is a GET whose body does not match the checksum stored with the object
 * (enum s3_verify): a damaged answer counts as a failed attempt.
 *
 * Secrets: the secret key and session token go to curl only.  No message
 * this module makes contains them (URLs, codes and S3's messages only).
 */
#ifndef CKPT_STORE_S3_HTTP_H
#define CKPT_STORE_S3_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/s3_addr.h"
#include "store/s3_creds.h"
#include "store/s3_retry.h"

struct s3_conf {
	char endpoint[256];         /* scheme://host[:port] */
	char region[64];
	bool virtual_host;          /* bucket.host addressing, else path style */
	unsigned parts_in_flight;   /* uploads at once on the transport: 1..256 */
	unsigned retries;           /* attempts after the first: 0..100 */
	uint64_t backoff_base_ms;   /* first wait's cap */
	uint64_t backoff_cap_ms;    /* any wait's cap */
	uint64_t connect_timeout_ms;
	uint64_t stall_ms;          /* no byte moved this long: a timeout */
	struct s3_creds creds;
};

/* Counters for status (monotonic; read without a lock, may lag a little). */
struct s3_stats {
	uint64_t requests, retries, failures;
	uint64_t bytes_up, bytes_down;
	uint64_t parts_done;
	unsigned in_flight, queued;
};

struct s3_client;

/* Checks conf (endpoint, region, credentials present) and starts the
 * transport thread.  Returns 0 or -errno (reason in err, no secret in it).
 * *conf is copied; the caller may wipe its copy. */
int s3_client_new(const struct s3_conf *conf, struct s3_client **ret, char *err, size_t errlen);
/* Stops the transport (jobs still queued complete with -ECANCELED) and
 * frees everything, wiping the credentials.  Accepts NULL. */
void s3_client_free(struct s3_client *c);
const struct s3_conf *s3_client_conf(const struct s3_client *c);
void s3_client_stats(const struct s3_client *c, struct s3_stats *ret);

/* ---- one request, on the calling thread ---- */

#define S3_HDR_MAX 6

/*
 * Whether a GET of a whole object checks the body against the checksum
 * stored with it (s3_digest.h): every PUT with a body stores one.  A body
 * that does not match is never handed on: the GET is tried again on a fresh
 * connection, as a 5xx would be, and once the attempts are spent it fails
 * with -EBADMSG and "checksum mismatch" in the message.
 */
enum s3_verify {
	S3_VERIFY_NONE = 0,   /* ranged reads (the manifest's CRCs cover them),
	                       * listings, HEADs */
	S3_VERIFY_IF_STORED,  /* an object an earlier ckptd may have written
	                       * without one: checked if the answer has one */
	S3_VERIFY_REQUIRED,   /* ours, written by this version: an answer
	                       * without a checksum is as bad as a wrong one */
};

struct s3_req {
	/* in */
	const char *method;          /* GET PUT POST DELETE HEAD */
	const char *bucket;
	const char *key;             /* as stored (s3_key_check'ed), not encoded */
	const char *query;           /* encoded and sorted, or NULL */
	const char *headers[S3_HDR_MAX]; /* extra "Name: value", NULL-ended */
	const void *body;            /* PUT/POST body, or NULL */
	uint64_t body_len;
	uint64_t range_off, range_len; /* GET bytes [off, off+len) if len */
	size_t max_resp;             /* keep at most this much of the body (0: 64 KiB) */
	void *into;                  /* GET: the body goes here (max_resp bytes),
	                              * not into resp */
	bool fail_404_quietly;       /* 404 is an expected answer (-ENOENT) */
	enum s3_verify verify;       /* GET without a range: check the body */
	/* out (s3_req_free releases) */
	long status;
	char *resp;                  /* NUL-terminated; NULL if no body */
	size_t resp_len;
	uint64_t content_length;     /* Content-Length of the answer (HEAD) */
	char etag[132];
	int64_t date;                /* the answer's Date (the server's clock,
	                              * seconds since the epoch), or 0 */
	char code[64];               /* S3's Error/Code, or "" */
	char message[256];           /* S3's Error/Message, or "" */
	unsigned attempts;
};

/*
 * Performs r, retrying what s3_classify() says may succeed later.  Returns
 * 0 on a 2xx answer with no <Error> body (a 200 that carries one, as
 * CompleteMultipartUpload can, is an error), else -errno (s3_errno()) with
 * err: "S3 PUT s3://bucket/key: 403 AccessDenied: S3's message (after 3
 * attempts)".  A response body over max_resp is -EFBIG.  A PUT with a body
 * sends its CRC32C twice: as x-amz-checksum-crc32c, which S3 checks on
 * arrival, and as S3_SUM_HEADER, stored with the object for later GETs
 * (r->verify) to check; a body that fails that check after every attempt
 * is -EBADMSG (err: "S3 GET s3://bucket/key: checksum mismatch: ...").
 */
int s3_call(struct s3_client *c, struct s3_req *r, char *err, size_t errlen);
void s3_req_free(struct s3_req *r);

/* ---- uploads on the transport thread ---- */

struct s3_job {
	/* in: all of it stays valid and unchanged until done() */
	const char *bucket;
	const char *key;
	char query[800];             /* "partNumber=N&uploadId=ID" or "" */
	bool exclusive;              /* If-None-Match: * (a whole object) */
	const uint8_t *buf;
	uint64_t len;
	bool crc_given;              /* crc below is the caller's, of the bytes
	                              * it checked: S3 refuses what differs */
	/* Runs on the transport thread once the job finished or failed: must
	 * only hand the job on (a lock and an eventfd), never block. */
	void (*done)(struct s3_job *j);
	/* out */
	int res;                     /* 0 or -errno */
	uint32_t crc;                /* CRC32C of buf, sent as the part checksum
	                              * (in with crc_given) */
	char etag[132];
	char err[384];
	unsigned attempts;
	/* private to the transport */
	struct s3_job *next;
	int64_t due_ms;
	uint64_t seed;
	void *easy;
};

/* Queues j (any thread).  done() runs exactly once. */
void s3_submit(struct s3_client *c, struct s3_job *j);

/* "s3://bucket/key" into buf, for messages. */
void s3_where(const char *bucket, const char *key, char *buf, size_t len);

#endif
