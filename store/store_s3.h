/* SPDX-License-Identifier: MIT */
/*
 * store_s3.h - the S3 backend: checkpoints under s3://bucket/prefix (s3.c
 * describes the layout and the commit).
 *
 * Its requests go through one S3 client per process (s3_http.h), set up
 * once with store_s3_start() before the first attempt, listing or read, and
 * torn down with store_s3_stop() after the last.  Without it every S3 hook
 * fails with -ENOTSUP ("S3 is not set up").
 */
#ifndef CKPT_STORE_STORE_S3_H
#define CKPT_STORE_STORE_S3_H

#include "store/s3_http.h"
#include "store/store.h"

extern const struct store_ops store_s3;

/* Starts the process's S3 client (idempotent).  0 or -errno (err). */
int store_s3_start(const struct s3_conf *conf, char *err, size_t errlen);
void store_s3_stop(void);
/* What a configuration may say; NULL strings and 0 numbers: not said. */
struct store_s3_settings {
	const char *endpoint, *region, *addressing; /* "path" or "virtual" */
	const char *credentials_file, *profile;
	unsigned parts_in_flight, retries;
	uint64_t backoff_base_ms, backoff_cap_ms, stall_ms, connect_timeout_ms;
	bool retries_set;             /* retries == 0 was said */
};

/*
 * Starts the client from `set` over the standard AWS environment:
 * credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN,
 * else the credentials file; endpoint: set, AWS_ENDPOINT_URL_S3,
 * AWS_ENDPOINT_URL, the file's endpoint_url, else AWS's for the region;
 * region: set, AWS_REGION, AWS_DEFAULT_REGION, the file's, else us-east-1.
 * 0 or -errno with the reason in err (never a secret).
 */
int store_s3_start_settings(const struct store_s3_settings *set, char *err, size_t errlen);

/* GETs `file` of checkpoint `ckpt` (s3://bucket/prefix/name) whole, at most
 * max bytes, into a malloc'd NUL-terminated *ret.  0, -ENOENT (err not
 * set), or -errno with err. */
int store_s3_get(const char *ckpt, const char *file, size_t max, char **ret, size_t *ret_len,
		 char *err, size_t errlen);

/* store_s3_get, and the object's ETag (as S3 gives it, quotes included;
 * "" if none) into etag (NULL: not wanted). */
#define STORE_ETAG_LEN 132
int store_s3_get_etag(const char *ckpt, const char *file, size_t max, char **ret,
		      size_t *ret_len, char etag[STORE_ETAG_LEN], char *err, size_t errlen);

/* PUTs text as `file` under url (s3://bucket/prefix) only if the object's
 * ETag is still `match`, or, with match NULL or "", only if there is none
 * yet.  0, -ESTALE if that no longer holds, or -errno (err). */
int store_s3_put_if(const char *url, const char *file, const char *text, const char *match,
		    char *err, size_t errlen);

/* 1 if the object `rel` under root (s3://bucket/prefix) exists, 0 if not,
 * or -errno. */
int store_s3_exists(const char *root, const char *rel);

/*
 * Removes what attempt `id` under `root` left if its attempt.json names
 * daemon life `instance` (a crashed life's, or a failed save's whose
 * cleanup failed) and nothing happened in its work area for min_idle_s
 * (by S3's clock: another daemon of the save renews its heartbeat there):
 * its multipart uploads, its tagged shards unless a manifest is there, and
 * the work area, attempt.json last.  1 removed, 0 not there or not that
 * life's, -EBUSY still active (err says since when), -errno (err) with
 * attempt.json left for a later try.
 */
int store_s3_sweep(const char *root, const char *id, const char *instance, int64_t min_idle_s,
		   char *err, size_t errlen);

/*
 * gc of lease object `name` (remove.h) in directory `dir` (an S3 URL)
 * whose prefix holds no checkpoint (a reader's, left by a crash): once it
 * ended at least grace_s ago (*ret_age_s, counted from its end and the
 * clocks' skew), deletes it.  Returns 1 removed (dry_run: would be), 0
 * live or younger, -EBADMSG not a lease of ours (err), or -errno (err).
 */
int store_s3_gc_lease(const char *dir, const char *name, int64_t grace_s, bool dry_run,
		      int64_t *ret_age_s, char *err, size_t errlen);

/*
 * gc of the work area of attempt `id` in directory `dir` (an S3 URL) whose
 * attempt.json is ours (the id, a name): if nothing in it changed for
 * grace_s (*ret_age_s: the seconds since its newest object was written,
 * its daemons' heartbeats included, by S3's clock), aborts the attempt's
 * unfinished multipart uploads, deletes its tagged shards unless a
 * manifest names a checkpoint there, and removes the work area.  Returns
 * 1 removed (dry_run: would be), 0 younger, -ENOENT emptied meanwhile (a
 * commit or a cleanup), -EBADMSG not ours to judge (err), or -errno (err;
 * what is left is found again next time).
 */
int store_s3_gc_work(const char *dir, const char *id, int64_t grace_s, bool dry_run,
		     int64_t *ret_age_s, char *err, size_t errlen);

/*
 * gc of the unfinished multipart uploads under root (an S3 URL): every
 * upload found is reported.  One of a ckptd shard
 * ("rank-NNNNN.<tag>.safetensors") whose attempt has no work area left is
 * aborted once it is grace_s old (dry_run: only said); one whose work area
 * is there is kept (that work area's activity decides: store_s3_gc_work);
 * any other upload is reported, never aborted.  report() gets each
 * decision (key relative to root, action, why, age in seconds or -1).
 * Returns how many uploads were listed, or -errno (err).
 */
typedef void (*store_gc_report_fn)(void *ud, const char *rel, const char *action,
				   const char *why, int64_t age_s);
int store_s3_gc_uploads(const char *root, int64_t grace_s, bool dry_run,
			store_gc_report_fn report, void *ud, char *err, size_t errlen);

/* The running client, or NULL. */
struct s3_client *store_s3_client(void);

/* Bytes [off, off + len) of object <ckpt>/<file> into buf with one ranged
 * GET (retried as s3_call retries).  0, or -errno with the reason in err
 * (-EBADMSG: the object is shorter). */
int store_s3_read_range_err(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			    void *buf, char *err, size_t errlen);

/* shard_write of store_s3 with the part's CRC32C given: the caller's
 * checksum of the bytes it checked (the spill tier's), sent as the part's
 * x-amz-checksum-crc32c, so S3 refuses the part if the bytes sent differ
 * (len: the bytes to send, not padded). */
void store_s3_shard_write_crc(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			      uint64_t file_off, uint64_t len, uint32_t crc, store_io_cb cb,
			      void *ud);

/* Aborts the multipart upload of shard s, if it began one (a spill-tier
 * upload round given up: the next round makes a new one).  Best effort. */
void store_s3_shard_abort(struct store_shard *s);

/* The spill tier's shard_create for a rank this daemon holds (its marker in
 * the work area), to send the same checked bytes once more: the marker is
 * taken over even when the rank's index was delivered.  As shard_create
 * otherwise (-EEXIST once the attempt committed or its area is gone). */
int store_s3_shard_create_again(struct store_attempt *a, uint32_t rank, uint64_t size,
				uint64_t extent, struct store_shard **ret, char *err, size_t errlen);

/* 1 if rank's shard is in the store whole (`size` bytes) with its index
 * delivered, under this daemon's marker: nothing of it to send again; 0 if
 * not; -errno (err) if S3 cannot tell. */
int store_s3_rank_stored(struct store_attempt *a, uint32_t rank, uint64_t size, char *err,
			 size_t errlen);

#endif
