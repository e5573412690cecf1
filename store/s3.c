/* SPDX-License-Identifier: MIT */
/*
 * s3.c - the S3 backend (store_s3.h).
 *
 * Layout under a root s3://bucket/prefix:
 *
 *   <prefix>/.ckpt-work-<id>/attempt.json      the attempt's key, who made it
 *   <prefix>/.ckpt-work-<id>/rank-NNNNN.open   a rank's shard is being written
 *   <prefix>/.ckpt-work-<id>/coordinator.json  rank 0's daemon's claim
 *   <prefix>/.ckpt-work-<id>/rank-NNNNN.index.json  addressed to the claim
 *   <prefix>/.ckpt-work-<id>/failed            a daemon failed the attempt
 *   <prefix>/.ckpt-work-<id>/alive-<life>      a daemon's heartbeat (renewed)
 *   <prefix>/<name>/rank-NNNNN.<tag>.safetensors   the shards, in place
 *   <prefix>/<name>/manifest.json              written last: the commit
 *
 * S3 has no rename, so shards are uploaded where they stay, and the
 * manifest is the commit: PUT with If-None-Match: *, so that of two
 * coordinators at most one commits, and nothing we ship treats a name
 * without its manifest as a checkpoint.  The <tag> is 16 hex digits of the
 * attempt id: two attempts never write the same shard key, so a late upload
 * of a failed or crashed attempt can never land on a committed checkpoint's
 * shard, and what an attempt leaves behind never blocks the next one (it is
 * garbage for `ckptctl prune`).  Before the manifest goes up, the
 * coordinator checks that every shard it names is there, whole: a shard
 * removed meanwhile fails the save instead of committing.
 *
 * Leftovers.  A work area's age is that of its newest object (the
 * heartbeats of the save's daemons keep it young: "heartbeat" below), so a
 * collector never takes a slow save for a dead one.  A dead attempt's
 * uploads, tagged shards (unless a manifest is there) and work area are
 * removed by its daemon's sweep and by `ckptctl gc` (leftover_remove), and
 * a cleanup that fails (S3 unreachable) leaves attempt.json so that a later
 * one finds it again.
 *
 * A shard is one PUT if it fits one extent, else a multipart upload whose
 * parts are the arena's extents (part n = extent n-1), sent from the arena
 * by the transport thread (s3_http.h) with each part's CRC32C, which S3
 * checks; the upload is created with the CRC32C algorithm so that the
 * Complete lists each part's checksum too.  A part holds its slot until S3
 * acknowledged it: the arena is the upload buffer.
 *
 * Every small object above (and manifests, tombstones, pins, leases) is PUT
 * with its CRC32C stored beside it and read back through get_own() or
 * get_text(), which check the answer's body against it (s3_http.h): the
 * commit never merges, and no reader parses, bytes damaged on the way back.
 */
#include "store/store_s3.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "format/errmsg.h"
#include "format/index.h"
#include "format/names.h"
#include "format/jbuf.h"
#include "store/attempt.h"
#include "store/remove.h"
#include "store/s3_http.h"
#include "store/s3_parts.h"
#include "store/s3_xml.h"

#define ATTEMPT_MAX_BYTES (64u << 10)
#define MANIFEST_MAX_BYTES (1ull << 30)
#define FAILED_MARKER "failed"
#define CLAIM_FILE STORE_CLAIM_FILE
#define TAG_DIGITS 16

/* Set once per process (readers may open from several threads at once),
 * then only read until store_s3_stop. */
static struct s3_client *g_s3;
static pthread_mutex_t g_s3_lock = PTHREAD_MUTEX_INITIALIZER;

int store_s3_start(const struct s3_conf *conf, char *err, size_t errlen)
{
	int r = 0;

	pthread_mutex_lock(&g_s3_lock);
	if (!g_s3) {
		struct s3_client *c;
		r = s3_client_new(conf, &c, err, errlen);
		if (r == 0)
			__atomic_store_n(&g_s3, c, __ATOMIC_RELEASE); /* pairs with the
								       * fast path's load */
	}
	pthread_mutex_unlock(&g_s3_lock);
	return r;
}

int store_s3_start_settings(const struct store_s3_settings *set, char *err, size_t errlen)
{
	struct s3_conf conf;
	int r;

	if (__atomic_load_n(&g_s3, __ATOMIC_ACQUIRE))
		return 0; /* started: no credentials to read again */
	memset(&conf, 0, sizeof(conf));
	r = s3_creds_load(NULL, set->credentials_file, set->profile, &conf.creds, err, errlen);
	if (r < 0)
		goto out;
	snprintf(conf.region, sizeof(conf.region), "%s",
		 set->region ? set->region : conf.creds.region[0] ? conf.creds.region : "us-east-1");
	if (set->endpoint)
		snprintf(conf.endpoint, sizeof(conf.endpoint), "%s", set->endpoint);
	else if (conf.creds.endpoint[0])
		snprintf(conf.endpoint, sizeof(conf.endpoint), "%s", conf.creds.endpoint);
	else
		snprintf(conf.endpoint, sizeof(conf.endpoint), "https://s3.%s.amazonaws.com",
			 conf.region);
	conf.virtual_host = set->addressing && !strcmp(set->addressing, "virtual");
	conf.parts_in_flight = set->parts_in_flight ? set->parts_in_flight : 16;
	conf.retries = set->retries || set->retries_set ? set->retries : 8;
	conf.backoff_base_ms = set->backoff_base_ms ? set->backoff_base_ms : 100;
	conf.backoff_cap_ms = set->backoff_cap_ms ? set->backoff_cap_ms : 10000;
	conf.stall_ms = set->stall_ms ? set->stall_ms : 30000;
	conf.connect_timeout_ms = set->connect_timeout_ms ? set->connect_timeout_ms : 10000;
	r = store_s3_start(&conf, err, errlen);
out:
	s3_creds_wipe(&conf.creds);
	return r;
}

void store_s3_stop(void)
{
	s3_client_free(g_s3);
	g_s3 = NULL;
}

struct s3_client *store_s3_client(void)
{
	return g_s3;
}

static int no_client(char *err, size_t errlen)
{
	if (err)
		snprintf(err, errlen, "S3 is not set up in this process (no credentials or "
				      "endpoint were configured)");
	return -ENOTSUP;
}

/* ---- small requests ------------------------------------------------------------- */

static int key_of(const struct s3_loc *loc, const char *rel, char *buf, size_t len, char *err,
		  size_t errlen)
{
	int r = s3_key_join(loc, rel, buf, len, err, errlen);

	if (r == -ENAMETOOLONG)
		errmsg_set(err, errlen, r, "S3 key for '%s' under s3://%s/%s is too long", rel,
			   loc->bucket, loc->prefix);
	return r;
}

/* The bucket and key of `file` under url (s3://bucket/prefix), with the
 * client checked: 0 or -errno (err). */
static int url_key(const char *url, const char *file, struct s3_loc *loc, char key[S3_KEY_MAX + 1],
		   char *err, size_t errlen)
{
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	r = s3_url_parse(url, loc, err, errlen);
	return r < 0 ? r : key_of(loc, file, key, S3_KEY_MAX + 1, err, errlen);
}

/* A checkpoint's location (s3://bucket/prefix/name, never a bucket
 * alone), with the client checked: 0 or -errno (err). */
static int ckpt_loc(const char *ckpt, struct s3_loc *loc, char *err, size_t errlen)
{
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	r = s3_url_parse(ckpt, loc, err, errlen);
	if (r == 0 && !loc->prefix[0]) {
		snprintf(err, errlen, "'%s' names a bucket, not a checkpoint", ckpt);
		r = -EINVAL;
	}
	return r;
}

static int put_text(const char *bucket, const char *key, const char *text, bool exclusive,
		    char *err, size_t errlen)
{
	struct s3_req q = { .method = "PUT", .bucket = bucket, .key = key, .body = text,
			    .body_len = strlen(text) };
	int r;

	q.headers[0] = "Content-Type: application/json";
	q.headers[1] = exclusive ? "If-None-Match: *" : NULL;
	r = s3_call(g_s3, &q, err, errlen);
	s3_req_free(&q);
	return r;
}

/* PUTs text over key only if the object's ETag is still `match` (NULL:
 * unconditionally): -ESTALE if it changed.  The new object's ETag into
 * ret_etag (STORE_ETAG_LEN bytes; "" if none) if not NULL. */
static int put_text_if(const char *bucket, const char *key, const char *text, const char *match,
		       char *ret_etag, char *err, size_t errlen)
{
	struct s3_req q = { .method = "PUT", .bucket = bucket, .key = key, .body = text,
			    .body_len = strlen(text) };
	char hdr[160];
	int r;

	q.headers[0] = "Content-Type: application/json";
	if (match) {
		snprintf(hdr, sizeof(hdr), "If-Match: %s", match);
		q.headers[1] = hdr;
	}
	r = s3_call(g_s3, &q, err, errlen);
	if (match && (r == -EEXIST || (r < 0 && q.status == 412)))
		r = -ESTALE;
	if (ret_etag)
		snprintf(ret_etag, STORE_ETAG_LEN, "%s", r == 0 ? q.etag : "");
	s3_req_free(&q);
	return r;
}

/*
 * Every small object is read here, whole, and checked against the checksum
 * stored with it (s3_http.h: a damaged answer is asked for again, then
 * refused with -EBADMSG, never parsed):
 *   get_own()   what this version wrote for the save under way (attempt.json,
 *               the claim, indexes, markers): it must carry a checksum;
 *   get_text()  what may be older than this version (manifests of earlier
 *               checkpoints, tombstones, pins, leases, a dead life's work
 *               area): checked when it carries one, read as it is when not.
 * Both: -ENOENT if there is none (err untouched).
 */
static int get_text_etag(const char *bucket, const char *key, size_t max, char **ret,
			 size_t *ret_len, char *etag, size_t etaglen, char *err, size_t errlen);
static int get_checked(const char *bucket, const char *key, size_t max, enum s3_verify verify,
		       char **ret, size_t *ret_len, char *etag, size_t etaglen, char *err,
		       size_t errlen);

static int get_text(const char *bucket, const char *key, size_t max, char **ret, size_t *ret_len,
		    char *err, size_t errlen)
{
	return get_text_etag(bucket, key, max, ret, ret_len, NULL, 0, err, errlen);
}

static int get_own(const char *bucket, const char *key, size_t max, char **ret, size_t *ret_len,
		   char *err, size_t errlen)
{
	return get_checked(bucket, key, max, S3_VERIFY_REQUIRED, ret, ret_len, NULL, 0, err,
			   errlen);
}

/* get_text, and the object's ETag into etag (if not NULL; "" if none). */
static int get_text_etag(const char *bucket, const char *key, size_t max, char **ret,
			 size_t *ret_len, char *etag, size_t etaglen, char *err, size_t errlen)
{
	return get_checked(bucket, key, max, S3_VERIFY_IF_STORED, ret, ret_len, etag, etaglen,
			   err, errlen);
}

static int get_checked(const char *bucket, const char *key, size_t max, enum s3_verify verify,
		       char **ret, size_t *ret_len, char *etag, size_t etaglen, char *err,
		       size_t errlen)
{
	struct s3_req q = { .method = "GET", .bucket = bucket, .key = key, .max_resp = max,
			    .fail_404_quietly = true, .verify = verify };
	char e[512];
	int r;

	r = s3_call(g_s3, &q, e, sizeof(e));
	if (etag)
		snprintf(etag, etaglen, "%s", r == 0 ? q.etag : "");
	if (r == -ENOENT) {
		s3_req_free(&q);
		return r;
	}
	if (r < 0) {
		if (err)
			snprintf(err, errlen, "%s", e);
		s3_req_free(&q);
		return r;
	}
	if (!q.resp) {
		q.resp = strdup("");
		if (!q.resp)
			return -ENOMEM;
	}
	*ret = q.resp;
	*ret_len = q.resp_len;
	return 0;
}

static int del_key(const char *bucket, const char *key, char *err, size_t errlen)
{
	struct s3_req q = { .method = "DELETE", .bucket = bucket, .key = key,
			    .fail_404_quietly = true };
	int r = s3_call(g_s3, &q, err, errlen);

	s3_req_free(&q);
	return r == -ENOENT ? 0 : r;
}

/* ---- listing ---------------------------------------------------------------------- */

/* What a listing saw besides the names. */
struct list_info {
	unsigned skipped;  /* keys under the prefix we cannot name (left out) */
	int64_t newest;    /* the newest LastModified of a key, or 0 */
	int64_t date;      /* the server's clock (Date) at the last page, or 0 */
};

struct lister {
	int (*fn)(void *ud, const char *name, bool is_prefix);
	void *ud;
	const char *prefix;
	size_t strip;   /* bytes of the listed prefix */
	int res;
	struct list_info info;
};

static int64_t iso_time(const char *s);

/* Whether a listed key is one fn may see: under the prefix asked for
 * (a server that answers otherwise is wrong), and a key we could name. */
static bool listed_ok(const struct lister *l, const char *key, size_t n)
{
	char e[128];

	return n > l->strip && strlen(key) == n && !strncmp(key, l->prefix, l->strip) &&
	       s3_key_check(key, e, sizeof(e)) == 0;
}

/* fn's non-zero return stops the walk; s3_xml_each would hand back a
 * positive count otherwise, so the value itself is kept in l->res. */
static int stop_if(struct lister *l, int r)
{
	l->res = r;
	return r ? 1 : 0;
}

static int list_key(void *ud, const char *inner, size_t len)
{
	struct lister *l = ud;
	char key[S3_KEY_MAX + 1];
	int n = s3_xml_text(inner, len, "Key", key, sizeof(key));
	char when[64];
	int64_t t;

	if (n < 0 && n != -ENAMETOOLONG)
		return -EBADMSG;
	/* Every key counts for the newest change, also one we cannot name. */
	if (s3_xml_text(inner, len, "LastModified", when, sizeof(when)) > 0 &&
	    (t = iso_time(when)) > l->info.newest)
		l->info.newest = t;
	if (n < 0 || !listed_ok(l, key, (size_t)n)) {
		l->info.skipped++;
		return 0; /* not ours to name: skipped, never acted on */
	}
	return stop_if(l, l->fn(l->ud, key + l->strip, false));
}

static int list_prefix(void *ud, const char *inner, size_t len)
{
	struct lister *l = ud;
	char key[S3_KEY_MAX + 1];
	int n = s3_xml_text(inner, len, "Prefix", key, sizeof(key));

	if (n <= 0)
		return -EBADMSG;
	if (key[n - 1] == '/')
		key[--n] = '\0';
	if (!listed_ok(l, key, (size_t)n))
		return 0;
	return stop_if(l, l->fn(l->ud, key + l->strip, true));
}

/*
 * ListObjectsV2 of everything whose key starts with `prefix` (which ends
 * with '/' or is ""), following continuation tokens.  With `delim`, keys
 * below a further '/' are folded into one common prefix each.  fn gets
 * each name with `prefix` removed; its first non-zero return stops the
 * walk and is returned.
 */
static int s3_list_info(const char *bucket, const char *prefix, bool delim,
			int (*fn)(void *ud, const char *name, bool is_prefix), void *ud,
			struct list_info *ret_info, char *err, size_t errlen);

static int s3_list(const char *bucket, const char *prefix, bool delim,
		   int (*fn)(void *ud, const char *name, bool is_prefix), void *ud, char *err,
		   size_t errlen)
{
	return s3_list_info(bucket, prefix, delim, fn, ud, NULL, err, errlen);
}

/* s3_list, and *ret_skipped (if not NULL): how many keys under the prefix
 * it could not name (and so left out). */
static int s3_list_n(const char *bucket, const char *prefix, bool delim,
		     int (*fn)(void *ud, const char *name, bool is_prefix), void *ud,
		     unsigned *ret_skipped, char *err, size_t errlen)
{
	struct list_info info;
	int r = s3_list_info(bucket, prefix, delim, fn, ud, &info, err, errlen);

	if (ret_skipped)
		*ret_skipped = info.skipped;
	return r;
}

/* s3_list, and what else it saw into *ret_info (if not NULL; also when
 * it fails, then of the pages read). */
static int s3_list_info(const char *bucket, const char *prefix, bool delim,
			int (*fn)(void *ud, const char *name, bool is_prefix), void *ud,
			struct list_info *ret_info, char *err, size_t errlen)
{
	char token[1024] = "", enc_tok[3 * sizeof(token)], enc_pre[3 * S3_KEY_MAX + 1];
	char query[sizeof(enc_tok) + sizeof(enc_pre) + 128];
	struct lister l = { fn, ud, prefix, strlen(prefix), 0, { 0, 0, 0 } };
	int r;

	if (ret_info)
		*ret_info = l.info;
	if (s3_encode_query(prefix, enc_pre, sizeof(enc_pre)) < 0)
		return -ENAMETOOLONG;
	for (unsigned page = 0; page < 1000000; page++) {
		struct s3_req q = { .method = "GET", .bucket = bucket, .key = "",
				    .max_resp = 8u << 20 };
		char trunc[8] = "";

		if (s3_encode_query(token, enc_tok, sizeof(enc_tok)) < 0)
			return -ENAMETOOLONG;
		/* Parameters in sorted order (libcurl 7.88 signs the query as
		 * written). */
		snprintf(query, sizeof(query), "%s%s%s%slist-type=2&prefix=%s",
			 token[0] ? "continuation-token=" : "", token[0] ? enc_tok : "",
			 token[0] ? "&" : "", delim ? "delimiter=%2F&" : "", enc_pre);
		q.query = query;
		r = s3_call(g_s3, &q, err, errlen);
		if (r < 0) {
			s3_req_free(&q);
			return r;
		}
		if (q.date)
			l.info.date = q.date;
		r = q.resp ? s3_xml_each(q.resp, q.resp_len, "ListBucketResult/Contents", list_key, &l)
			   : 0;
		if (r >= 0 && delim && q.resp)
			r = s3_xml_each(q.resp, q.resp_len, "ListBucketResult/CommonPrefixes",
					list_prefix, &l);
		if (r >= 0 && q.resp &&
		    s3_xml_text(q.resp, q.resp_len, "ListBucketResult/IsTruncated", trunc,
				sizeof(trunc)) < 0)
			trunc[0] = '\0';
		if (r >= 0 && !strcmp(trunc, "true") &&
		    s3_xml_text(q.resp, q.resp_len, "ListBucketResult/NextContinuationToken", token,
				sizeof(token)) <= 0)
			r = -EBADMSG;
		s3_req_free(&q);
		if (ret_info)
			*ret_info = l.info;
		if (r == -EBADMSG) {
			snprintf(err, errlen, "S3 listing of s3://%s/%s: an answer we cannot read",
				 bucket, prefix);
			return r;
		}
		if (l.res)
			return l.res;
		if (r < 0)
			return r;
		if (strcmp(trunc, "true"))
			return 0;
	}
	snprintf(err, errlen, "S3 listing of s3://%s/%s does not end", bucket, prefix);
	return -ELOOP;
}

struct rm_all {
	const char *bucket;
	const char *prefix;
	const char *skip;        /* a name left alone, or NULL */
	int res;
	char err[384];
};

static int rm_one(void *ud, const char *name, bool is_prefix)
{
	struct rm_all *rm = ud;
	char key[S3_KEY_MAX + 1];

	(void)is_prefix;
	if (rm->skip && !strcmp(name, rm->skip))
		return 0;
	snprintf(key, sizeof(key), "%s%s", rm->prefix, name);
	int r = del_key(rm->bucket, key, rm->err, sizeof(rm->err));
	if (r < 0 && !rm->res)
		rm->res = r;
	return 0;
}

/* Deletes every object under `prefix` (ending with '/'), manifest.json
 * first if there is one, so that a removal cut short never leaves a
 * checkpoint that looks whole. */
static int rm_prefix(const char *bucket, const char *prefix, char *err, size_t errlen)
{
	struct rm_all rm = { bucket, prefix, MANIFEST_FILE, 0, "" };
	char key[S3_KEY_MAX + 1];
	int r;

	if (snprintf(key, sizeof(key), "%s%s", prefix, MANIFEST_FILE) >= (int)sizeof(key))
		return -ENAMETOOLONG;
	r = del_key(bucket, key, err, errlen);
	if (r < 0)
		return r;
	r = s3_list(bucket, prefix, false, rm_one, &rm, err, errlen);
	if (r == 0 && rm.res) {
		snprintf(err, errlen, "%s", rm.err);
		r = rm.res;
	}
	return r;
}

/* ---- arenas ------------------------------------------------------------------------- */

struct part;

struct store_arena {
	uint8_t *base;
	uint64_t len;
	int efd;
	unsigned busy;            /* loop thread only */
	pthread_mutex_t lock;     /* done list: transport -> loop */
	struct part *done_head;
};

struct part {
	struct s3_job job;
	struct store_arena *arena;
	struct store_shard *shard;
	uint32_t number;          /* 1-based; 0 for a single PUT */
	store_io_cb cb;
	void *ud;
	struct part *next;
};

static int s3a_attach(void *base, uint64_t len, unsigned depth, struct store_arena **ret,
		      char *err, size_t errlen)
{
	struct store_arena *a = calloc(1, sizeof(*a));

	(void)depth; /* parts in flight are the transport's, for all arenas */
	if (!a)
		return -ENOMEM;
	a->base = base;
	a->len = len;
	a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->efd < 0) {
		int r = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		free(a);
		return r;
	}
	pthread_mutex_init(&a->lock, NULL);
	*ret = a;
	return 0;
}

static void s3a_detach(struct store_arena *a)
{
	if (!a)
		return;
	close(a->efd);
	pthread_mutex_destroy(&a->lock);
	free(a);
}

static int s3a_fd(const struct store_arena *a)
{
	return a->efd;
}

static unsigned s3a_busy(const struct store_arena *a)
{
	return a->busy;
}

static void s3a_set_depth(unsigned depth)
{
	(void)depth;
}

/* Transport thread: hands the finished part to the loop. */
static void part_done(struct s3_job *j)
{
	struct part *p = (struct part *)j;
	struct store_arena *a = p->arena;
	uint64_t one = 1;

	pthread_mutex_lock(&a->lock);
	p->next = a->done_head;
	a->done_head = p;
	pthread_mutex_unlock(&a->lock);
	if (write(a->efd, &one, sizeof(one)) < 0) {
		/* The counter cannot overflow with so few writes; nothing to do. */
	}
}

/* ---- attempts ------------------------------------------------------------------------ */

struct upload {
	char key[S3_KEY_MAX + 1];
	char id[256];
	struct upload *next;
};

struct store_attempt {
	struct s3_loc loc;
	char root[S3_BUCKET_MAX + S3_PREFIX_MAX + 8];
	char work[sizeof(STORE_WORK_PREFIX) + STORE_ID_LEN]; /* ".ckpt-work-<id>" */
	char name[CKPT_MAX_NAME_LEN + 1];
	char id[STORE_ID_LEN + 1];
	char tag[TAG_DIGITS + 1];
	char self_id[STORE_ID_LEN + 1]; /* the daemon writing: its rank markers
	                                 * name it */
	uid_t uid;
	pthread_mutex_t lock;
	struct upload *open;      /* multipart uploads begun and not finished */
	bool commit_unclear;      /* a manifest PUT whose outcome is unknown */
};

struct store_shard {
	struct store_attempt *att;
	uint32_t rank;
	uint64_t size, extent;
	struct s3_plan plan;
	char key[S3_KEY_MAX + 1];
	char upload_id[256];      /* "" for a single PUT */
	struct s3_part_done *done; /* plan.n_parts, filled on the loop */
	uint32_t n_done;
	int res;                  /* the first failure of a part */
	char err[384];
};

/* HEAD of key: 0 (its size into *size if not NULL), -ENOENT, or -errno
 * with S3's reason in err. */
static int head_object(const char *bucket, const char *key, uint64_t *size, char *err,
		       size_t errlen)
{
	struct s3_req q = { .method = "HEAD", .bucket = bucket, .key = key,
			    .fail_404_quietly = true };
	int r = s3_call(g_s3, &q, err, errlen);

	if (r == 0 && size)
		*size = q.content_length;
	s3_req_free(&q);
	return r;
}

/* "<work>/<file>" or "<name>/<file>" as a key. */
static int work_key(const struct store_attempt *a, const char *file, char *buf, size_t len,
		    char *err, size_t errlen)
{
	char rel[sizeof(a->work) + 128];

	snprintf(rel, sizeof(rel), "%s/%s", a->work, file);
	return key_of(&a->loc, rel, buf, len, err, errlen);
}

static int ckpt_key(const struct store_attempt *a, const char *file, char *buf, size_t len,
		    char *err, size_t errlen)
{
	char rel[CKPT_MAX_NAME_LEN + INDEX_SHARD_NAME_MAX + 2];

	snprintf(rel, sizeof(rel), "%s/%s", a->name, file);
	return key_of(&a->loc, rel, buf, len, err, errlen);
}

/* "<prefix>/<dir>/": what lies in a work area or a checkpoint. */
static int dir_key(const struct store_attempt *a, const char *dir, char *buf, size_t len,
		   char *err, size_t errlen)
{
	int r = key_of(&a->loc, dir, buf, len - 1, err, errlen);

	if (r == 0)
		strcat(buf, "/");
	return r;
}

static void s3_attempt_close(struct store_attempt *a)
{
	if (!a)
		return;
	for (struct upload *u = a->open, *nx; u; u = nx) {
		nx = u->next;
		free(u);
	}
	pthread_mutex_destroy(&a->lock);
	free(a);
}

/* Is there a manifest under the name, and whose?  1 ours, 0 none, -EEXIST
 * another attempt's, other -errno on failure to tell. */
static int manifest_owner(const struct store_attempt *a, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 1], why[256];
	struct manifest m;
	char *text;
	size_t len;
	int r;

	r = ckpt_key(a, MANIFEST_FILE, key, sizeof(key), err, errlen);
	if (r < 0)
		return r;
	r = get_text(a->loc.bucket, key, MANIFEST_MAX_BYTES, &text, &len, err, errlen);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return r;
	memset(&m, 0, sizeof(m));
	r = manifest_parse(text, len, &m, why, sizeof(why));
	free(text);
	if (r < 0)
		return -EEXIST; /* something is there: not ours to judge */
	r = strcmp(m.attempt, a->id) == 0 ? 1 : -EEXIST;
	manifest_free(&m);
	return r;
}

/* Whether a daemon marked the attempt failed: -ECANCELED with the marker's
 * text (or "") in why, else 0 (also when it cannot be read). */
static int failed_reason(struct store_attempt *a, char *why, size_t whylen)
{
	char key[S3_KEY_MAX + 1], e[256], *text;
	size_t len;

	if (work_key(a, FAILED_MARKER, key, sizeof(key), e, sizeof(e)) < 0 ||
	    get_own(a->loc.bucket, key, 4096, &text, &len, NULL, 0) < 0)
		return 0;
	snprintf(why, whylen, "%.*s", (int)len, text);
	free(text);
	return -ECANCELED;
}

/* The attempt.json found: 0 join, 1 a leftover of an earlier life of this
 * daemon, -EEXIST/-ECANCELED refused (err set). */
static int check_existing(struct store_attempt *a, const char *text, size_t len,
			  const struct store_key *k, const struct store_writer *self, char *err,
			  size_t errlen)
{
	char why[256];
	int r = store_attempt_judge(text, len, k, a->id, self, true, a->uid);

	if (r == -EEXIST || r == -EPERM) {
		snprintf(err, errlen, r == -EPERM ? "work area '%s/%s' belongs to another user" :
				      "work area '%s/%s' belongs to another save (its %s differs)",
			 a->root, a->work, STORE_ATTEMPT_FILE);
		return -EEXIST;
	}
	if (r == 0 && failed_reason(a, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "this attempt already failed: %s",
			 why[0] ? why : "(no reason given)");
		return -ECANCELED;
	}
	return r;
}

static int rm_work(struct store_attempt *a, char *err, size_t errlen);

/*
 * root_open (store.h): nothing to make or open in a bucket, but the same
 * refusals as on a disk.  A prefix below base that holds a manifest.json
 * (a checkpoint, or a tombstone: one being removed) is a checkpoint: a
 * root below it would be taken for that checkpoint's keys.
 */
static int s3_root_open(const char *base, const char *root, int *ret_fd, char *err,
			size_t errlen)
{
	struct s3_loc bl, rl;
	size_t n;
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	r = s3_url_parse(base, &bl, err, errlen);
	if (r == 0)
		r = s3_url_parse(root, &rl, err, errlen);
	if (r < 0)
		return r;
	n = strlen(bl.prefix);
	if (strcmp(bl.bucket, rl.bucket) || strncmp(bl.prefix, rl.prefix, n) ||
	    (n && rl.prefix[n] && rl.prefix[n] != '/')) {
		snprintf(err, errlen, "root '%.400s' is not below '%.400s'", root, base);
		return -EINVAL;
	}
	for (const char *p = rl.prefix + n; *p;) {
		char name[S3_PREFIX_MAX + 1], key[S3_KEY_MAX + 1], why[256];
		const char *slash;
		size_t len;

		if (*p == '/')
			p++;
		slash = strchr(p, '/');
		len = slash ? (size_t)(slash - p) : strlen(p);
		memcpy(name, p, len);
		name[len] = '\0';
		p += len;
		if (store_name_reserved(name)) {
			snprintf(err, errlen, "root '%.400s': '%s' is a name ckptd keeps for its own "
				 "(work areas, leases, manifests): choose another prefix", root, name);
			return -EINVAL;
		}
		snprintf(key, sizeof(key), "%.*s/%s", (int)(p - rl.prefix), rl.prefix,
			 MANIFEST_FILE);
		r = head_object(rl.bucket, key, NULL, why, sizeof(why));
		if (r == 0) {
			snprintf(err, errlen, "root '%.400s' lies inside checkpoint 's3://%s/%.*s': a "
				 "save's root may not be inside a checkpoint", root, rl.bucket,
				 (int)(p - rl.prefix), rl.prefix);
			return -EINVAL;
		}
		if (r != -ENOENT) {
			snprintf(err, errlen, "root '%.400s': cannot tell whether 's3://%s/%.*s' is a "
				 "checkpoint: %s", root, rl.bucket, (int)(p - rl.prefix), rl.prefix,
				 why);
			return r;
		}
	}
	*ret_fd = -1;
	return 0;
}

/* A new attempt of root (its location, names, tag and writer set), for
 * attempt_open and attempt_resume.  0 (*ret) or -errno (err). */
static int attempt_new(const char *root, const struct store_key *k, const char *id,
		       const struct store_writer *self, uid_t uid, struct store_attempt **ret,
		       char *err, size_t errlen)
{
	struct store_attempt *a;
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	pthread_mutex_init(&a->lock, NULL);
	r = s3_url_parse(root, &a->loc, err, errlen);
	if (r < 0) {
		s3_attempt_close(a);
		return r;
	}
	s3_url_format(&a->loc, a->root, sizeof(a->root));
	snprintf(a->work, sizeof(a->work), "%s%s", STORE_WORK_PREFIX, id);
	snprintf(a->name, sizeof(a->name), "%s", k->name);
	snprintf(a->id, sizeof(a->id), "%s", id);
	snprintf(a->tag, sizeof(a->tag), "%.*s", TAG_DIGITS, id);
	snprintf(a->self_id, sizeof(a->self_id), "%s", self->id);
	a->uid = uid;
	*ret = a;
	return 0;
}

static int s3_attempt_open(const char *root, int rootfd, const struct store_key *k,
			   const char *id, const struct store_writer *self, uid_t uid,
			   struct store_attempt **ret, bool *ret_created, char *err, size_t errlen)
{
	struct store_attempt *a;
	char key[S3_KEY_MAX + 1];
	bool created = false;
	int r;

	(void)rootfd; /* a bucket has no directory to hold open */
	r = attempt_new(root, k, id, self, uid, &a, err, errlen);
	if (r < 0)
		return r;

	r = manifest_owner(a, err, errlen);
	if (r != 0) {
		if (r > 0 || r == -EEXIST) {
			r = -EEXIST;
			snprintf(err, errlen, "checkpoint '%s/%s' already exists", a->root, k->name);
		}
		goto fail;
	}
	r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, errlen);
	if (r < 0)
		goto fail;
	for (int tries = 0;; tries++) {
		char *text;
		size_t len;

		if (tries == 3) {
			r = -EEXIST;
			snprintf(err, errlen, "work area '%s/%s' keeps changing", a->root, a->work);
			goto fail;
		}
		r = get_own(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, err, errlen);
		if (r == 0) {
			r = check_existing(a, text, len, k, self, err, errlen);
			free(text);
			/* A failed attempt's area: whoever finds it empties it
			 * (the coordinator may never come; daemons still
			 * writing find attempt.json gone and clean up). */
			if (r == -ECANCELED) {
				char e[384];

				(void)rm_work(a, e, sizeof(e));
			}
			if (r < 0)
				goto fail;
			if (r == 0)
				break;
			/* A leftover of this daemon before a restart: none of
			 * it may be used.  Empty it and start afresh, unless
			 * another daemon claimed it: then it is that
			 * coordinator's, which may still commit it. */
			char pre[S3_KEY_MAX + 1], ckey[S3_KEY_MAX + 1], *claim;
			size_t clen;
			r = work_key(a, CLAIM_FILE, ckey, sizeof(ckey), err, errlen);
			if (r == 0 && get_own(a->loc.bucket, ckey, ATTEMPT_MAX_BYTES, &claim, &clen,
					      NULL, 0) == 0) {
				bool foreign = store_claim_foreign(claim, clen, self->id);

				free(claim);
				if (foreign) {
					snprintf(err, errlen, "work area '%s/%s', of an earlier life of "
						 "this daemon, is claimed by another daemon's save: "
						 "save as a new attempt (or set a run id)", a->root,
						 a->work);
					r = -EEXIST;
					goto fail;
				}
			}
			if (r == 0)
				r = dir_key(a, a->work, pre, sizeof(pre), err, errlen);
			if (r == 0)
				r = rm_prefix(a->loc.bucket, pre, err, errlen);
			if (r < 0)
				goto fail;
			continue;
		}
		if (r != -ENOENT)
			goto fail;
		char *t = store_attempt_text(k, id, self, uid);
		if (!t) {
			r = -ENOMEM;
			goto fail;
		}
		/* Exclusive: of two daemons making it at once, one creates and
		 * the other reads and joins. */
		r = put_text(a->loc.bucket, key, t, true, err, errlen);
		free(t);
		if (r == 0) {
			created = true;
			break;
		}
		if (r != -EEXIST)
			goto fail;
	}
	*ret = a;
	*ret_created = created;
	return 0;

fail:
	s3_attempt_close(a);
	return r;
}

/*
 * The attempt of an earlier life of this daemon whose ranks spilled
 * (store.h: attempt_resume), found again: the work area is joined whichever
 * life of ours made it; if it is gone and rank 0 is ours (`coordinator`),
 * it is made again.  Returns 0 (*ret), 1 (*ret) when our manifest is there
 * already (the coordinator's commit landed before that life ended: its
 * work area is emptied now), -ECANCELED the attempt failed or was given up
 * (err), -EEXIST another save holds the name or the area (err), other
 * -errno when S3 could not tell (err).
 */
static int s3_attempt_resume(const char *root, const struct store_key *k, const char *id,
			     const struct store_writer *self, uid_t uid, bool coordinator,
			     struct store_attempt **ret, char *err, size_t errlen)
{
	struct store_attempt *a;
	char key[S3_KEY_MAX + 1], why[256];
	int r;

	r = attempt_new(root, k, id, self, uid, &a, err, errlen);
	if (r < 0)
		return r;

	r = manifest_owner(a, err, errlen);
	if (r == 1) {
		char e2[256];

		if (coordinator)
			(void)rm_work(a, e2, sizeof(e2));
		*ret = a;
		return 1;
	}
	if (r == -EEXIST) {
		snprintf(err, errlen, "checkpoint '%s/%s' was committed by another save", a->root,
			 k->name);
		goto fail;
	}
	if (r < 0)
		goto fail;
	r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, errlen);
	if (r < 0)
		goto fail;
	for (int tries = 0; tries < 3; tries++) {
		char *text, *t;
		size_t len;

		r = get_text(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, err, errlen);
		if (r == 0) {
			/* check_existing, but a failure marker counts whichever
			 * life of ours made the area. */
			r = check_existing(a, text, len, k, self, err, errlen);
			free(text);
			if (r == 1 && failed_reason(a, why, sizeof(why)) < 0) {
				snprintf(err, errlen, "this attempt already failed: %s",
					 why[0] ? why : "(no reason given)");
				r = -ECANCELED;
			}
			if (r >= 0) {
				*ret = a;
				return 0;
			}
			goto fail;
		}
		if (r != -ENOENT)
			goto fail;
		if (!coordinator) {
			r = -ECANCELED;
			snprintf(err, errlen, "rank 0's daemon abandoned the save (its work area "
					      "'%s/%s' is gone)", a->root, a->work);
			goto fail;
		}
		/* Removed meanwhile (by gc, or a cleanup): ours to make again;
		 * the ranks' markers are made again with their uploads. */
		t = store_attempt_text(k, id, self, uid);
		if (!t) {
			r = -ENOMEM;
			goto fail;
		}
		r = put_text(a->loc.bucket, key, t, true, err, errlen);
		free(t);
		if (r == 0) {
			*ret = a;
			return 0;
		}
		if (r != -EEXIST)
			goto fail;
	}
	r = -EEXIST;
	snprintf(err, errlen, "work area '%s/%s' keeps changing", a->root, a->work);
fail:
	s3_attempt_close(a);
	return r;
}

static const char *s3_attempt_tag(const struct store_attempt *a)
{
	return a->tag;
}

static void upload_forget(struct store_attempt *a, const char *upload_id)
{
	pthread_mutex_lock(&a->lock);
	for (struct upload **pp = &a->open; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->id, upload_id)) {
			struct upload *u = *pp;
			*pp = u->next;
			free(u);
			break;
		}
	pthread_mutex_unlock(&a->lock);
}

/* "[partNumber=N&]uploadId=ID" (part 0: none), sorted and encoded as
 * libcurl 7.88 needs the query it signs.  Upload ids are at most 255
 * bytes (shard_create checks the ones it keeps). */
static void upload_query(uint32_t part, const char *upload_id, char *buf, size_t len)
{
	char enc[256 * 3];

	if (s3_encode_query(upload_id, enc, sizeof(enc)) < 0)
		enc[0] = '\0';
	if (part)
		snprintf(buf, len, "partNumber=%u&uploadId=%s", part, enc);
	else
		snprintf(buf, len, "uploadId=%s", enc);
}

/* AbortMultipartUpload: 0 (also if the upload is gone already) or -errno
 * (err): the upload is still open, costing storage. */
static int abort_upload(const char *bucket, const char *key, const char *upload_id, char *err,
			size_t errlen)
{
	char q[800];
	struct s3_req rq = { .method = "DELETE", .bucket = bucket, .key = key, .query = q,
			     .fail_404_quietly = true };
	int r;

	upload_query(0, upload_id, q, sizeof(q));
	r = s3_call(g_s3, &rq, err, errlen);
	s3_req_free(&rq);
	return r == -ENOENT ? 0 : r;
}

/*
 * ListMultipartUploads of every key that starts with `prefix` (a key, not
 * encoded), following the markers: fn gets each <Upload> element; its
 * negative return stops the walk and is returned.  Returns how many
 * uploads were listed, or -errno (err).
 */
static int uploads_each(const char *bucket, const char *prefix,
			int (*fn)(void *ud, const char *inner, size_t len), void *ud, char *err,
			size_t errlen)
{
	char enc_pre[3 * S3_KEY_MAX + 1], km[S3_KEY_MAX + 1] = "", um[256] = "";
	char enc_km[3 * sizeof(km)], enc_um[3 * sizeof(um)];
	char q[sizeof(enc_pre) + sizeof(enc_km) + sizeof(enc_um) + 64];
	unsigned seen = 0;
	int r;

	if (s3_encode_query(prefix, enc_pre, sizeof(enc_pre)) < 0)
		return -ENAMETOOLONG;
	for (unsigned page = 0; page < 100000; page++) {
		struct s3_req rq = { .method = "GET", .bucket = bucket, .key = "", .query = q,
				     .max_resp = 8u << 20 };
		char trunc[8] = "";

		if (s3_encode_query(km, enc_km, sizeof(enc_km)) < 0 ||
		    s3_encode_query(um, enc_um, sizeof(enc_um)) < 0)
			return -ENAMETOOLONG;
		/* Parameters in sorted order (s3_list says why). */
		snprintf(q, sizeof(q), "%s%s%sprefix=%s%s%s%suploads=", km[0] ? "key-marker=" : "",
			 km[0] ? enc_km : "", km[0] ? "&" : "", enc_pre,
			 um[0] ? "&upload-id-marker=" : "", um[0] ? enc_um : "", "&");
		r = s3_call(g_s3, &rq, err, errlen);
		if (r == 0 && rq.resp) {
			r = s3_xml_each(rq.resp, rq.resp_len, "ListMultipartUploadsResult/Upload", fn,
					ud);
			if (r >= 0) {
				seen += (unsigned)r;
				r = 0;
			} else if (r != -EBADMSG) {
				s3_req_free(&rq);
				return r; /* fn's own: it said why */
			}
		}
		if (r == 0 && rq.resp &&
		    s3_xml_text(rq.resp, rq.resp_len, "ListMultipartUploadsResult/IsTruncated", trunc,
				sizeof(trunc)) < 0)
			trunc[0] = '\0';
		if (r == 0 && !strcmp(trunc, "true") &&
		    (s3_xml_text(rq.resp, rq.resp_len, "ListMultipartUploadsResult/NextKeyMarker", km,
				 sizeof(km)) < 0 ||
		     s3_xml_text(rq.resp, rq.resp_len, "ListMultipartUploadsResult/NextUploadIdMarker",
				 um, sizeof(um)) < 0))
			r = -EBADMSG;
		s3_req_free(&rq);
		if (r == -EBADMSG)
			snprintf(err, errlen, "S3 ListMultipartUploads of s3://%s/%s: an answer we "
				 "cannot read", bucket, prefix);
		if (r < 0)
			return r;
		if (strcmp(trunc, "true"))
			return (int)(seen > INT32_MAX ? INT32_MAX : seen);
	}
	snprintf(err, errlen, "S3 ListMultipartUploads of s3://%s/%s does not end", bucket, prefix);
	return -ELOOP;
}

struct up_abort {
	const char *bucket;
	const char *prefix;
	const char *suffix;      /* the keys it ends, e.g. ".<tag>.safetensors";
	                          * NULL: the key must be the prefix itself */
	const char *keep;        /* an upload id to leave alone, or NULL */
	int res;                 /* the first abort that failed */
	char err[384];
};

static int abort_listed(void *ud, const char *inner, size_t len)
{
	struct up_abort *u = ud;
	char key[S3_KEY_MAX + 1], id[256], e[384];
	size_t kl, sl = u->suffix ? strlen(u->suffix) : 0;
	bool match;
	int r;

	if (s3_xml_text(inner, len, "Key", key, sizeof(key)) <= 0 ||
	    s3_xml_text(inner, len, "UploadId", id, sizeof(id)) <= 0)
		return 0;
	kl = strlen(key);
	match = u->suffix ? kl >= sl && !strcmp(key + kl - sl, u->suffix) :
			    !strcmp(key, u->prefix);
	if (!match || (u->keep && !strcmp(id, u->keep)))
		return 0;
	r = abort_upload(u->bucket, key, id, e, sizeof(e));
	if (r < 0 && !u->res) {
		u->res = r;
		snprintf(u->err, sizeof(u->err), "%s", e);
	}
	return 0;
}

/* Aborts every open multipart upload of keys under `prefix` that end in
 * `suffix` (NULL: of the key `prefix` itself), except `keep` (NULL:
 * none).  0, or -errno (err) if the listing or an abort failed: then some
 * may be left open. */
static int abort_uploads_under(const char *bucket, const char *prefix, const char *suffix,
			       const char *keep, char *err, size_t errlen)
{
	struct up_abort u = { bucket, prefix, suffix, keep, 0, "" };
	int r = uploads_each(bucket, prefix, abort_listed, &u, err, errlen);

	if (r >= 0 && u.res) {
		snprintf(err, errlen, "%s", u.err);
		r = u.res;
	}
	return r < 0 ? r : 0;
}

/* Aborts an upload this attempt began; one that could not be aborted
 * stays on the attempt's list (attempt_fail tries again). */
static int upload_abort(struct store_attempt *a, const char *key, const char *upload_id,
			char *err, size_t errlen)
{
	int r = abort_upload(a->loc.bucket, key, upload_id, err, errlen);

	if (r == 0)
		upload_forget(a, upload_id);
	return r;
}

/* True if rank marker text (len bytes) was made by daemon self_id. */
static bool marker_by(const char *text, size_t len, const char *self_id)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	const char *by = json_string_value(json_object_get(j, "daemon"));
	bool mine = self_id[0] && by && !strcmp(by, self_id);

	json_decref(j);
	return mine;
}

/*
 * Makes an exclusive marker (If-None-Match) holding a nonce of its own and
 * the id of the daemon that makes it.  When a PUT's answer is lost and its
 * retry finds the object there (412), the nonce tells our own marker from
 * another writer's.  A marker another life or an earlier attempt of this
 * same daemon made (its "daemon" is self_id) is a dead writer's: a daemon
 * holds at most one live save of an attempt id (daemon/save.c refuses a
 * second one before it reaches the store), so the only writer of this rank
 * that can be alive is the caller.  It is taken over (1): the caller must
 * abort what that writer left open; unless that writer delivered the rank's
 * index (index_key is there, or cannot be told): then another daemon may be
 * committing it, and 2 says so, the marker untouched.  Returns 0, 1, 2,
 * -EEXIST for another daemon's marker, or -errno.
 */
static int put_marker(const char *bucket, const char *key, const char *self_id,
		      const char *index_key, char *err, size_t errlen)
{
	unsigned char rnd[16];
	char text[128], nonce[2 * sizeof(rnd) + 1], *got = NULL;
	size_t len;
	int r;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EIO;
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(nonce + 2 * i, 3, "%02x", rnd[i]);
	snprintf(text, sizeof(text), "{\"nonce\":\"%s\",\"daemon\":\"%s\"}", nonce, self_id);
	r = put_text(bucket, key, text, true, err, errlen);
	if (r != -EEXIST)
		return r;
	if (get_own(bucket, key, 4096, &got, &len, NULL, 0) == 0) {
		if (len == strlen(text) && !memcmp(got, text, len))
			r = 0; /* ours: the first PUT landed, its answer did not */
		else if (marker_by(got, len, self_id))
			r = 1;
	}
	free(got);
	/* A dead writer of ours that delivered its index may be in a commit
	 * another daemon is making: its shard key (the same, as the tag is
	 * the attempt's) must not be written again. */
	if (r == 1 && index_key &&
	    head_object(bucket, index_key, NULL, err, errlen) != -ENOENT)
		return 2;
	if (r == 1) {
		r = put_text(bucket, key, text, false, err, errlen);
		if (r == 0)
			r = 1;
	}
	return r;
}

/* 0 if no manifest names the checkpoint yet, -EEXIST if one does (err), or
 * -errno.  A rank marker made after this attempt's commit (which PUTs the
 * manifest before it empties the work area of the markers) must not let a
 * shard be written under the committed one's key.  (A marker made in an
 * area a failure emptied needs no look: that rank's save finds the area
 * gone when it polls, and fails.) */
static int not_committed(struct store_attempt *a, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 1];
	int r = ckpt_key(a, MANIFEST_FILE, key, sizeof(key), err, errlen);

	if (r == 0)
		r = head_object(a->loc.bucket, key, NULL, err, errlen);
	if (r == 0) {
		snprintf(err, errlen, "checkpoint '%s/%s' is committed already (by this attempt, "
			 "on another daemon)", a->root, a->name);
		return -EEXIST;
	}
	return r == -ENOENT ? 0 : r;
}

/* shard_create; `again` is the spill tier's upload of a rank this daemon
 * holds once more, of the same checked bytes (store_s3_shard_create_again). */
static int shard_create_as(struct store_attempt *a, uint32_t rank, uint64_t size,
			   uint64_t extent, bool again, struct store_shard **ret, char *err,
			   size_t errlen)
{
	char file[INDEX_SHARD_NAME_MAX], mark[64], mkey[S3_KEY_MAX + 1];
	char iname[64], ikey[S3_KEY_MAX + 1];
	struct store_shard *s;
	bool marked = false;
	int r;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->att = a;
	s->rank = rank;
	s->size = size;
	s->extent = extent;
	/* Parts are whole extents straight from the arena: one extent each. */
	r = s3_part_plan(size, extent, extent, &s->plan, err, errlen);
	/* One PUT takes the whole object from one extent; several extents of
	 * a single-part object would each PUT the same key. */
	if (r == 0 && ((!s->plan.single && s->plan.part_bytes != extent) ||
		       (s->plan.single && size > extent))) {
		snprintf(err, errlen, "the shard of rank %u (%llu bytes) needs S3 parts of %llu "
				      "bytes, but the client's arena slots are %llu bytes: give the "
				      "client an arena of at least 64 MiB (CKPT_ARENA_SIZE)",
			 rank, (unsigned long long)size, (unsigned long long)s->plan.part_bytes,
			 (unsigned long long)extent);
		r = -EFBIG;
	}
	if (r < 0)
		goto fail;
	s->done = calloc(s->plan.n_parts ? s->plan.n_parts : 1, sizeof(*s->done));
	if (!s->done) {
		r = -ENOMEM;
		goto fail;
	}
	index_shard_name_tag(rank, a->tag, file, sizeof(file));
	r = ckpt_key(a, file, s->key, sizeof(s->key), err, errlen);
	if (r < 0)
		goto fail;
	/* One writer per rank and attempt, as the local backend's exclusive
	 * create: a marker made with If-None-Match. */
	snprintf(mark, sizeof(mark), "rank-%05u.open", rank);
	index_index_name(rank, iname, sizeof(iname));
	r = work_key(a, mark, mkey, sizeof(mkey), err, errlen);
	if (r == 0)
		r = work_key(a, iname, ikey, sizeof(ikey), err, errlen);
	if (r == 0)
		r = put_marker(a->loc.bucket, mkey, a->self_id, again ? NULL : ikey, err, errlen);
	if (r == -EEXIST)
		snprintf(err, errlen, "rank %u of this attempt is already being saved by another "
				      "daemon (%s/%s/%s exists)", rank, a->root, a->work, mark);
	if (r == 2) {
		snprintf(err, errlen, "rank %u of this attempt was delivered by an earlier save of "
				      "this daemon, which another daemon may still commit (%s/%s/%s "
				      "exists): save again as a new attempt", rank, a->root, a->work,
			 iname);
		r = -EEXIST;
	}
	if (r < 0)
		goto fail;
	marked = true;
	{
		int still = not_committed(a, err, errlen);

		if (still < 0) {
			r = still;
			goto fail;
		}
	}
	/* A dead writer of ours (a failed or crashed save of this attempt, an
	 * upload round of the spill tier given up) may have left uploads of
	 * this key open: they would cost storage for good. */
	if (r == 1)
		(void)abort_uploads_under(a->loc.bucket, s->key, NULL, NULL, err, errlen);
	if (!s->plan.single) {
		struct s3_req q = { .method = "POST", .bucket = a->loc.bucket, .key = s->key,
				    .query = "uploads=" };
		struct upload *u = calloc(1, sizeof(*u));

		if (!u) {
			r = -ENOMEM;
			goto fail;
		}
		q.headers[0] = "x-amz-checksum-algorithm: CRC32C";
		r = s3_call(g_s3, &q, err, errlen);
		if (r == 0 && (!q.resp || s3_xml_text(q.resp, q.resp_len,
						      "InitiateMultipartUploadResult/UploadId",
						      s->upload_id, sizeof(s->upload_id)) <= 0)) {
			snprintf(err, errlen, "S3 CreateMultipartUpload of %s/%s: no UploadId in "
					      "the answer", a->root, file);
			r = -EBADMSG;
		}
		s3_req_free(&q);
		if (r < 0) {
			/* Its answer may be all that was lost: an upload we
			 * have no id of may be open (aborted below, with the
			 * marker we made). */
			free(u);
			goto fail;
		}
		snprintf(u->key, sizeof(u->key), "%s", s->key);
		snprintf(u->id, sizeof(u->id), "%s", s->upload_id);
		pthread_mutex_lock(&a->lock);
		u->next = a->open;
		a->open = u;
		pthread_mutex_unlock(&a->lock);
	}
	*ret = s;
	return 0;

fail:
	/* The rank was ours a moment: what we made of it goes (no shard of
	 * it was written), and the rank is free again; but a rank the spill
	 * tier holds for a save owed a commit stays held (its next round
	 * tries again). */
	if (marked) {
		char e2[256];

		(void)abort_uploads_under(a->loc.bucket, s->key, NULL, NULL, e2, sizeof(e2));
		if (!again)
			(void)del_key(a->loc.bucket, mkey, e2, sizeof(e2));
	}
	free(s->done);
	free(s);
	return r;
}

static int s3_shard_create(struct store_attempt *a, uint32_t rank, uint64_t size,
			   uint64_t extent, bool direct, struct store_shard **ret, char *err,
			   size_t errlen)
{
	(void)direct;
	return shard_create_as(a, rank, size, extent, false, ret, err, errlen);
}

int store_s3_shard_create_again(struct store_attempt *a, uint32_t rank, uint64_t size,
				uint64_t extent, struct store_shard **ret, char *err, size_t errlen)
{
	return shard_create_as(a, rank, size, extent, true, ret, err, errlen);
}

int store_s3_rank_stored(struct store_attempt *a, uint32_t rank, uint64_t size, char *err,
			 size_t errlen)
{
	char file[INDEX_SHARD_NAME_MAX], name[64], key[S3_KEY_MAX + 1], *text = NULL;
	uint64_t got = 0;
	size_t len;
	int r;

	/* Our marker: the rank is this daemon's (no other run's shard). */
	err[0] = '\0';
	snprintf(name, sizeof(name), "rank-%05u.open", rank);
	r = work_key(a, name, key, sizeof(key), err, errlen);
	if (r == 0)
		r = get_own(a->loc.bucket, key, 4096, &text, &len, err, errlen);
	if (r == 0) {
		r = marker_by(text, len, a->self_id) ? 0 : -ENOENT;
		free(text);
	}
	if (r == 0) {
		index_index_name(rank, name, sizeof(name));
		r = work_key(a, name, key, sizeof(key), err, errlen);
	}
	if (r == 0)
		r = head_object(a->loc.bucket, key, NULL, err, errlen);
	if (r == 0) {
		index_shard_name_tag(rank, a->tag, file, sizeof(file));
		r = ckpt_key(a, file, key, sizeof(key), err, errlen);
	}
	if (r == 0)
		r = head_object(a->loc.bucket, key, &got, err, errlen);
	if (r == -ENOENT)
		return 0;
	if (r < 0) {
		/* err holds S3's reason (its code and message), as the
		 * upload's own failure would. */
		if (!err[0])
			snprintf(err, errlen, "S3: is rank %u of '%s/%s' there already: %s", rank,
				 a->root, a->name, strerror(-r));
		return r;
	}
	return got == size;
}

static void shard_write_crc(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			    uint64_t file_off, uint64_t len, const uint32_t *crc, store_io_cb cb,
			    void *ud)
{
	struct part *p;

	if (file_off >= s->size || (!s->plan.single && file_off % s->extent) ||
	    arena_off + len > a->len || !(p = calloc(1, sizeof(*p)))) {
		cb(ud, file_off >= s->size ? -EINVAL : -ENOMEM);
		return;
	}
	/* The writer pads the last extent for O_DIRECT; S3 gets the file's
	 * real bytes only. */
	if (len > s->size - file_off)
		len = s->size - file_off;
	p->arena = a;
	p->shard = s;
	p->cb = cb;
	p->ud = ud;
	p->job.bucket = s->att->loc.bucket;
	p->job.key = s->key;
	p->job.buf = a->base + arena_off;
	p->job.len = len;
	if (crc) {
		p->job.crc_given = true;
		p->job.crc = *crc;
	}
	p->job.done = part_done;
	if (!s->plan.single) {
		p->number = s3_part_of(&s->plan, file_off) + 1;
		upload_query(p->number, s->upload_id, p->job.query, sizeof(p->job.query));
	}
	a->busy++;
	s3_submit(g_s3, &p->job);
}

static void s3_shard_write(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			   uint64_t file_off, uint64_t len, store_io_cb cb, void *ud)
{
	shard_write_crc(s, a, arena_off, file_off, len, NULL, cb, ud);
}

void store_s3_shard_write_crc(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			      uint64_t file_off, uint64_t len, uint32_t crc, store_io_cb cb,
			      void *ud)
{
	shard_write_crc(s, a, arena_off, file_off, len, &crc, cb, ud);
}

/* S3 verifies each part's x-amz-checksum-crc32c: the writer gives it. */
static bool s3_shard_wants_crc(const struct store_shard *s)
{
	(void)s;
	return true;
}

static void s3a_reap(struct store_arena *a)
{
	struct part *list;
	uint64_t junk;

	if (read(a->efd, &junk, sizeof(junk)) < 0)
		junk = 0;
	pthread_mutex_lock(&a->lock);
	list = a->done_head;
	a->done_head = NULL;
	pthread_mutex_unlock(&a->lock);
	while (list) {
		struct part *p = list;
		struct store_shard *s = p->shard;
		int res = p->job.res;

		list = p->next;
		a->busy--;
		if (res == 0) {
			uint32_t i = p->number ? p->number - 1 : 0;
			s->done[i].number = p->number ? p->number : 1;
			snprintf(s->done[i].etag, sizeof(s->done[i].etag), "%s", p->job.etag);
			s->done[i].crc32c = p->job.crc;
			s->n_done++;
		} else if (!s->res) {
			s->res = res;
			snprintf(s->err, sizeof(s->err), "%s", p->job.err);
		}
		store_io_cb cb = p->cb;
		void *ud = p->ud;
		free(p);
		cb(ud, res);
	}
}

static const char *s3_shard_error(const struct store_shard *s)
{
	return s->res && s->err[0] ? s->err : NULL;
}

/* Does the object at key hold `size` bytes?  For a Complete whose first
 * answer was lost: a retry may say NoSuchUpload although it succeeded. */
static bool object_has_size(const char *bucket, const char *key, uint64_t size)
{
	char err[256];
	uint64_t got;

	return head_object(bucket, key, &got, err, sizeof(err)) == 0 && got == size;
}

static int s3_shard_finish(struct store_shard *s, uint64_t size, char *err, size_t errlen)
{
	struct store_attempt *a = s->att;
	char q[800];
	struct jbuf b;
	int r;

	if (s->res) {
		snprintf(err, errlen, "%s", s->err);
		return s->res;
	}
	if (size != s->size || s->n_done != s->plan.n_parts) {
		snprintf(err, errlen, "the shard of rank %u is not whole (%u of %u parts uploaded)",
			 s->rank, s->n_done, s->plan.n_parts);
		return -EIO;
	}
	if (s->plan.single)
		return 0; /* the PUT made it whole and visible in one step */
	jbuf_init(&b, 128 + (size_t)s->plan.n_parts * 160, 0);
	s3_complete_xml(&b, s->done, s->plan.n_parts);
	char *xml = NULL;
	size_t xml_len = 0;
	if (jbuf_finish(&b, true, &xml, &xml_len))
		return -ENOMEM;
	upload_query(0, s->upload_id, q, sizeof(q));
	struct s3_req rq = { .method = "POST", .bucket = a->loc.bucket, .key = s->key, .query = q,
			     .body = xml, .body_len = strlen(xml) };
	/* Without it curl sends a form type and the server parses the body
	 * as a form. */
	rq.headers[0] = "Content-Type: application/xml";
	r = s3_call(g_s3, &rq, err, errlen);
	if (r == -ENOENT && rq.attempts > 1 && object_has_size(a->loc.bucket, s->key, s->size))
		r = 0; /* an earlier try completed it; the retry found no upload */
	s3_req_free(&rq);
	free(xml);
	if (r < 0) {
		char e[384];

		(void)upload_abort(a, s->key, s->upload_id, e, sizeof(e));
		return r;
	}
	upload_forget(a, s->upload_id);
	/*
	 * A Create whose answer was lost made an upload nobody knows the id
	 * of, and a retry need not show: libcurl sends a request again by
	 * itself, on a fresh connection, when a reused one dies before any
	 * byte of the answer came (s3_call sees one attempt).  The key is this
	 * attempt's and this rank's alone (the rank marker), so every other
	 * upload of it is such a leftover.  Looked for once the shard is
	 * whole, by then any Create of ours has long been served; one that
	 * cannot be aborted now is gc's (store_s3_gc_uploads).
	 */
	{
		char e[384];

		(void)abort_uploads_under(a->loc.bucket, s->key, NULL, s->upload_id, e, sizeof(e));
	}
	return 0;
}

static int s3_rank_publish(struct store_attempt *a, uint32_t rank, const char *index_text,
			   char *err, size_t errlen)
{
	char name[64], key[S3_KEY_MAX + 1];
	int r;

	index_index_name(rank, name, sizeof(name));
	r = work_key(a, name, key, sizeof(key), err, errlen);
	return r < 0 ? r : put_text(a->loc.bucket, key, index_text, false, err, errlen);
}

static int s3_attempt_claim(struct store_attempt *a, const struct store_writer *self,
			    char ret[STORE_ID_LEN + 1], char *err, size_t errlen)
{
	char nonce[STORE_ID_LEN + 1], key[S3_KEY_MAX + 1];
	char *text;
	int r;

	r = store_claim_new(self, nonce, &text);
	if (r < 0) {
		snprintf(err, errlen, "claiming '%s/%s': %s", a->root, a->work, strerror(-r));
		return r;
	}
	/* One PUT replaces an earlier claim whole: S3 makes it visible at
	 * once or not at all. */
	r = work_key(a, CLAIM_FILE, key, sizeof(key), err, errlen);
	if (r == 0)
		r = put_text(a->loc.bucket, key, text, false, err, errlen);
	free(text);
	if (r == 0)
		memcpy(ret, nonce, sizeof(nonce));
	return r;
}

static int s3_attempt_addressee(struct store_attempt *a, char ret[STORE_ID_LEN + 1])
{
	char key[S3_KEY_MAX + 1], err[256];
	char *text;
	size_t len;
	int r;

	r = work_key(a, CLAIM_FILE, key, sizeof(key), err, sizeof(err));
	if (r == 0)
		r = get_own(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, NULL, 0);
	if (r < 0)
		return r;
	r = store_claim_nonce(text, len, ret);
	free(text);
	return r;
}

static void s3_shard_close(struct store_shard *s)
{
	if (!s)
		return;
	free(s->done);
	free(s);
}

void store_s3_shard_abort(struct store_shard *s)
{
	char err[256];

	if (s && s->upload_id[0])
		(void)upload_abort(s->att, s->key, s->upload_id, err, sizeof(err));
}

/* An index_fetch_fn: rank's index in the work area (ud: the attempt).  Its
 * own writing, so it must carry its checksum: a damaged index is never
 * merged. */
static int fetch_index(void *ud, uint32_t rank, char **ret, size_t *ret_len, char *err,
		       size_t errlen)
{
	struct store_attempt *a = ud;
	char name[64], key[S3_KEY_MAX + 1];
	int r;

	index_index_name(rank, name, sizeof(name));
	r = work_key(a, name, key, sizeof(key), err, errlen);
	return r < 0 ? r : get_own(a->loc.bucket, key, INDEX_MAX_BYTES, ret, ret_len, err, errlen);
}

static int s3_attempt_count(struct store_attempt *a, uint32_t world, const char *nonce,
			    const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			    size_t errlen)
{
	int r = store_count_delivered(fetch_index, a, world, nonce, local, n_local, io_n, err,
				      errlen);
	char why[256];

	/* After the count, whatever it found (store.h). */
	if (r == 0 && failed_reason(a, why, sizeof(why)) < 0)
		return -ECANCELED;
	return r;
}

/*
 * Empties the work area: everything but attempt.json, then attempt.json,
 * then whatever came in meanwhile.  Another daemon that writes into the
 * work area after that (a `failed` marker, its index, its heartbeat) finds
 * attempt.json gone when it checks next, and removes what it wrote
 * (attempt_fail, attempt_renew), so nothing is left behind whichever comes
 * first.  0, or -errno (err) if the area is not empty: attempt.json then
 * stays unless the first pass was clean, so that a sweep or gc finds the
 * area again and finishes.
 */
static int rm_work(struct store_attempt *a, char *err, size_t errlen)
{
	char pre[S3_KEY_MAX + 1], key[S3_KEY_MAX + 1];
	struct rm_all rm = { a->loc.bucket, pre, STORE_ATTEMPT_FILE, 0, "" };
	int r;

	r = dir_key(a, a->work, pre, sizeof(pre), err, errlen);
	if (r == 0)
		r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, errlen);
	if (r == 0)
		r = s3_list(a->loc.bucket, pre, false, rm_one, &rm, err, errlen);
	if (r == 0 && rm.res < 0) {
		snprintf(err, errlen, "%s", rm.err);
		r = rm.res;
	}
	/* attempt.json goes only after a clean pass: it is what the registry
	 * sweep and gc find a work area by, should anything be left. */
	if (r == 0)
		r = del_key(a->loc.bucket, key, err, errlen);
	if (r < 0)
		return r;
	rm.skip = NULL;
	r = s3_list(a->loc.bucket, pre, false, rm_one, &rm, err, errlen);
	if (r == 0 && rm.res < 0) {
		snprintf(err, errlen, "%s", rm.err);
		r = rm.res;
	}
	return r;
}

/*
 * The commit's last check: every shard the merged manifest (text) names is
 * in S3 with the size it gives (one HEAD each).  A work area that a
 * collector took for dead, or a hand that deleted a shard, must fail the
 * save, never commit a manifest of what is gone.  0; -ENODATA naming the
 * shard if it is one of this daemon's ranks (mg->local: the spill tier can
 * send its copy again), -ECANCELED if another daemon's; -errno if S3 could
 * not say.
 */
static int shards_whole(struct store_attempt *a, const char *text, const struct store_merge *mg,
			char *err, size_t errlen)
{
	struct manifest m;
	char key[S3_KEY_MAX + 1], why[256];
	int r;

	memset(&m, 0, sizeof(m));
	r = manifest_parse(text, strlen(text), &m, why, sizeof(why));
	if (r < 0) {
		snprintf(err, errlen, "the merged manifest does not parse: %s", why);
		return r;
	}
	for (size_t i = 0; r == 0 && i < m.n_files; i++) {
		uint64_t size = 0;

		r = ckpt_key(a, m.files[i].path, key, sizeof(key), err, errlen);
		if (r == 0)
			r = head_object(a->loc.bucket, key, &size, why, sizeof(why));
		if (r == -ENOENT || (r == 0 && size != m.files[i].size)) {
			bool local = false;

			for (size_t k = 0; k < mg->n_local; k++)
				local |= mg->local[k].rank == m.files[i].rank;
			snprintf(err, errlen, "shard '%s/%s/%s' of rank %u is %s: not committed "
				 "(was its save's work area removed while it ran?)", a->root, a->name,
				 m.files[i].path, m.files[i].rank, r == -ENOENT ? "gone from S3" :
				 "not the size the manifest gives");
			/* -ENODATA: a rank of this daemon's (the spill tier still
			 * has its copy to send again); -ECANCELED: another
			 * daemon's, which this save cannot mend. */
			r = local ? -ENODATA : -ECANCELED;
		} else if (r < 0) {
			snprintf(err, errlen, "cannot tell whether shard '%s/%s/%s' is whole: %s",
				 a->root, a->name, m.files[i].path, why);
		}
	}
	manifest_free(&m);
	return r;
}

static int s3_attempt_commit(struct store_attempt *a, const struct store_merge *m, char *err,
			     size_t errlen)
{
	/* S3 keeps no owner: the manifest says whose it is (retention plans
	 * each user's checkpoints apart by it). */
	struct index_origin o = { m->attempt_id, m->self->id, m->self->instance, m->nonce,
				  a->tag, true, (uint32_t)a->uid };
	char key[S3_KEY_MAX + 1];
	char *manifest = NULL;
	int r;

	r = index_merge_fetch(-1, fetch_index, a, m->key->job, m->key->name, m->key->world,
			      m->time_utc, &o, m->local, m->n_local, &manifest, err, errlen);
	if (r < 0)
		return r;
	r = shards_whole(a, manifest, m, err, errlen);
	if (r < 0) {
		free(manifest);
		return r; /* never PUT: the manifest would name what is gone */
	}
	r = ckpt_key(a, MANIFEST_FILE, key, sizeof(key), err, errlen);
	if (r == 0)
		r = put_text(a->loc.bucket, key, manifest, true, err, errlen);
	free(manifest);
	if (r < 0) {
		/* A lost answer to a PUT that succeeded looks like a failure (a
		 * retry then meets our own manifest: 412).  Only the manifest
		 * says whether we committed. */
		char e2[256];
		int own = manifest_owner(a, e2, sizeof(e2));

		if (own == 1)
			r = 0;
		else if (r == -EEXIST && own == -EEXIST)
			snprintf(err, errlen, "checkpoint '%s/%s' already exists", a->root,
				 a->name);
		/* Any other failure may be a PUT still on its way (a timeout,
		 * a reset, a 5xx after one of those): the manifest may yet
		 * land, so the shards it names must stay. */
		if (r < 0 && !(r == -EEXIST && own == -EEXIST))
			a->commit_unclear = true;
	}
	if (r == 0) {
		char e[384];

		/* The checkpoint stands without it; what is left of it is
		 * gc's (a work area next to its own committed manifest). */
		(void)rm_work(a, e, sizeof(e));
	}
	return r;
}

static int s3_attempt_poll(struct store_attempt *a, const char *id, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 1], why[256];
	char *text;
	size_t len;
	int r;

	(void)id;
	r = manifest_owner(a, err, errlen);
	if (r == 1)
		return 1;
	if (r == -EEXIST) {
		snprintf(err, errlen, "checkpoint '%s/%s' was committed by another save", a->root,
			 a->name);
		return r;
	}
	if (r < 0)
		return 0; /* could not tell: ask again at the next tick */
	if (failed_reason(a, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%s", why[0] ? why : "another daemon failed the save");
		return -ECANCELED;
	}
	r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, errlen);
	if (r == 0)
		r = get_own(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, NULL, 0);
	if (r == 0)
		free(text);
	if (r != -ENOENT)
		return 0;
	/* The coordinator removes the work area after its commit too: look
	 * at the manifest once more before calling it gone. */
	if (manifest_owner(a, err, errlen) == 1)
		return 1;
	snprintf(err, errlen, "rank 0's daemon abandoned the save (its work area is gone)");
	return -ECANCELED;
}

/* The first failure of several steps: kept with its message. */
struct first_err {
	int res;
	char err[512];
};

static void first_err_note(struct first_err *f, int r, const char *err)
{
	if (r < 0 && !f->res) {
		f->res = r;
		snprintf(f->err, sizeof(f->err), "%s", err);
	}
}

struct tag_rm {
	struct store_attempt *a;
	const char *suffix;       /* ".<tag>.safetensors" */
	struct first_err fe;
};

static int rm_tagged(void *ud, const char *name, bool is_prefix)
{
	struct tag_rm *t = ud;
	size_t n = strlen(name), sl = strlen(t->suffix);
	char key[S3_KEY_MAX + 1], err[512];
	int r;

	if (is_prefix || n <= sl || strcmp(name + n - sl, t->suffix) || strncmp(name, "rank-", 5))
		return 0;
	r = ckpt_key(t->a, name, key, sizeof(key), err, sizeof(err));
	if (r == 0)
		r = del_key(t->a->loc.bucket, key, err, sizeof(err));
	first_err_note(&t->fe, r, err);
	return 0;
}

/* Deletes every shard of attempt a under its checkpoint's name (its tag
 * says which: never another attempt's).  0 or -errno (err). */
static int rm_tagged_all(struct store_attempt *a, char *err, size_t errlen)
{
	char pre[S3_KEY_MAX + 1], suffix[TAG_DIGITS + 16];
	struct tag_rm t = { a, suffix, { 0, "" } };
	int r;

	snprintf(suffix, sizeof(suffix), ".%s.safetensors", a->tag);
	r = dir_key(a, a->name, pre, sizeof(pre), err, errlen);
	if (r == 0)
		r = s3_list(a->loc.bucket, pre, true, rm_tagged, &t, err, errlen);
	if (r == 0 && t.fe.res) {
		snprintf(err, errlen, "%s", t.fe.err);
		r = t.fe.res;
	}
	return r;
}

/* Aborts every multipart upload of attempt a under its checkpoint's name
 * (all ranks', and any whose Create answer was lost).  0 or -errno (err). */
static int abort_attempt_uploads(struct store_attempt *a, char *err, size_t errlen)
{
	char pre[S3_KEY_MAX + 1], suffix[TAG_DIGITS + 16];
	int r;

	snprintf(suffix, sizeof(suffix), ".%s.safetensors", a->tag);
	r = dir_key(a, a->name, pre, sizeof(pre), err, errlen);
	return r < 0 ? r : abort_uploads_under(a->loc.bucket, pre, suffix, NULL, err, errlen);
}

static int s3_attempt_fail(struct store_attempt *a, const struct store_fail *f)
{
	char key[S3_KEY_MAX + 1], err[512];
	struct first_err fe = { 0, "" };
	int r;

	if (!g_s3)
		return -ENOTSUP;
	/* Uploads this daemon began and did not finish cost storage until
	 * aborted: the ones it knows of, then any of its ranks' keys (a
	 * Create whose answer was lost made one it has no id of). */
	for (;;) {
		char k[S3_KEY_MAX + 1], id[256];
		pthread_mutex_lock(&a->lock);
		struct upload *u = a->open;
		if (u) {
			snprintf(k, sizeof(k), "%s", u->key);
			snprintf(id, sizeof(id), "%s", u->id);
		}
		pthread_mutex_unlock(&a->lock);
		if (!u)
			break;
		r = upload_abort(a, k, id, err, sizeof(err));
		if (r < 0) {
			first_err_note(&fe, r, err);
			break; /* S3 is not answering: the rest waits for the retry */
		}
	}
	/* Only the keys of shards this daemon made: a rank refused as a
	 * duplicate has the same key as the winner's upload. */
	for (size_t i = 0; fe.res == 0 && i < f->n_made; i++) {
		char file[INDEX_SHARD_NAME_MAX];

		index_shard_name_tag(f->made[i], a->tag, file, sizeof(file));
		r = ckpt_key(a, file, key, sizeof(key), err, sizeof(err));
		if (r == 0)
			r = abort_uploads_under(a->loc.bucket, key, NULL, NULL, err, sizeof(err));
		first_err_note(&fe, r, err);
	}
	if (f->coordinator) {
		/* Never undo a commit that happened (its answer may be what
		 * was lost); if that cannot be told, nothing goes now. */
		r = manifest_owner(a, err, sizeof(err));
		if (r > 0 || r == -EEXIST)
			return fe.res;
		first_err_note(&fe, r, err);
		/* After a manifest PUT of unknown outcome the shards stay (it
		 * may still land): garbage at worst, for the collector.  The
		 * work area goes last, and only once the rest is gone: its
		 * attempt.json is how a later try finds the attempt. */
		if (fe.res == 0 && !a->commit_unclear)
			first_err_note(&fe, rm_tagged_all(a, err, sizeof(err)), err);
		if (fe.res == 0)
			first_err_note(&fe, rm_work(a, err, sizeof(err)), err);
		return fe.res;
	}
	/* Never addressed to a claim (not even by an upload whose answer
	 * was lost): the coordinator cannot commit without our ranks, so
	 * their shards may go, and the marker tells it to give up.  Ranks
	 * that were addressed are the coordinator's to judge: it may have
	 * committed them, so we never delete them. */
	if (!f->delivered) {
		if (f->mark && work_key(a, FAILED_MARKER, key, sizeof(key), err, sizeof(err)) == 0)
			(void)put_text(a->loc.bucket, key, f->msg, false, err, sizeof(err));
		for (size_t i = 0; i < f->n_made; i++) {
			char file[INDEX_SHARD_NAME_MAX];

			index_shard_name_tag(f->made[i], a->tag, file, sizeof(file));
			r = ckpt_key(a, file, key, sizeof(key), err, sizeof(err));
			if (r == 0)
				r = del_key(a->loc.bucket, key, err, sizeof(err));
			first_err_note(&fe, r, err);
		}
		/* Our area, failed by our own marker, and no coordinator to
		 * remove it: removed as the coordinator would. */
		char nonce[STORE_ID_LEN + 1];
		if (fe.res == 0 && f->mark && f->created &&
		    s3_attempt_addressee(a, nonce) == -ENOENT) {
			first_err_note(&fe, rm_work(a, err, sizeof(err)), err);
			return fe.res;
		}
	}
	/* attempt.json gone: the coordinator has emptied the work area (after
	 * a commit or a failure), so what we wrote into it since is ours to
	 * remove. */
	char *text;
	size_t len;
	r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, sizeof(err));
	if (r == 0)
		r = get_own(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, err, sizeof(err));
	if (r == 0)
		free(text);
	if (r == -ENOENT) {
		struct rm_all rm = { a->loc.bucket, key, NULL, 0, "" };

		r = dir_key(a, a->work, key, sizeof(key), err, sizeof(err));
		if (r == 0)
			r = s3_list(a->loc.bucket, key, false, rm_one, &rm, err, sizeof(err));
		if (r == 0 && rm.res < 0) {
			snprintf(err, sizeof(err), "%s", rm.err);
			r = rm.res;
		}
	}
	first_err_note(&fe, r, err);
	return fe.res;
}

/* ---- heartbeat -------------------------------------------------------------------- */

/*
 * A work area's activity is the newest LastModified of what it holds:
 * attempt.json, rank markers, indexes, the claim, and each daemon's
 * heartbeat "alive-<life>", which every daemon in the save rewrites every
 * s3_heartbeat for as long as its part of the save lives (while it uploads
 * parts, which a listing of the area would not show, and while a commit's
 * manifest PUT is slow).  The age a collector compares with its grace
 * period is the listing's own Date less that time: both S3's clock, so no
 * other machine's clock takes part.
 */
#define ALIVE_PREFIX "alive-"

static int s3_attempt_renew(struct store_attempt *a, const struct store_writer *self, char *err,
			    size_t errlen)
{
	char file[sizeof(ALIVE_PREFIX) + STORE_ID_LEN], key[S3_KEY_MAX + 1], akey[S3_KEY_MAX + 1];
	char text[160], e[256];
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	snprintf(file, sizeof(file), "%s%s", ALIVE_PREFIX, self->instance);
	snprintf(text, sizeof(text), "{\"daemon\":\"%s\",\"instance\":\"%s\",\"time\":%lld}",
		 self->id, self->instance, (long long)time(NULL));
	r = work_key(a, file, key, sizeof(key), err, errlen);
	if (r == 0)
		r = work_key(a, STORE_ATTEMPT_FILE, akey, sizeof(akey), err, errlen);
	if (r == 0)
		r = put_text(a->loc.bucket, key, text, false, err, errlen);
	if (r < 0)
		return r;
	/* Written after the area was emptied (committed, or failed): ours to
	 * take back (rm_work says why this order leaves nothing). */
	r = head_object(a->loc.bucket, akey, NULL, err, errlen);
	if (r == -ENOENT) {
		(void)del_key(a->loc.bucket, key, e, sizeof(e));
		snprintf(err, errlen, "the work area '%s/%s' is gone", a->root, a->work);
	}
	return r;
}

static int count_key(void *ud, const char *name, bool is_prefix)
{
	(void)name, (void)is_prefix;
	(*(unsigned *)ud)++;
	return 0;
}

/* The seconds since the newest change in a's work area, by S3's clock,
 * into *ret_idle_s.  0, -ENOENT (nothing there), or -errno (err). */
static int work_idle(struct store_attempt *a, int64_t *ret_idle_s, char *err, size_t errlen)
{
	char pre[S3_KEY_MAX + 1];
	struct list_info info;
	unsigned n = 0;
	int64_t now;
	int r;

	r = dir_key(a, a->work, pre, sizeof(pre), err, errlen);
	if (r == 0)
		r = s3_list_info(a->loc.bucket, pre, false, count_key, &n, &info, err, errlen);
	if (r < 0)
		return r;
	if (!info.newest)
		return -ENOENT;
	/* A server that sends no Date: this machine's clock instead. */
	now = info.date ? info.date : (int64_t)time(NULL);
	*ret_idle_s = now > info.newest ? now - info.newest : 0;
	return 0;
}

/*
 * Removes what dead attempt a left: its multipart uploads, its tagged
 * shards under the checkpoint's name unless a manifest is there (a
 * commit, ours or another's, owns what it names), then its work area.
 * 0, or -errno (err) with attempt.json left in place, so that the next
 * sweep or gc finds the attempt and goes on where this one stopped.
 */
static int leftover_remove(struct store_attempt *a, char *err, size_t errlen)
{
	int r = manifest_owner(a, err, errlen);

	if (r < 0 && r != -EEXIST)
		return r;
	/* Uploads are never a checkpoint's: all of them go either way. */
	int u = abort_attempt_uploads(a, err, errlen);
	if (u < 0)
		return u;
	if (r == 0) {
		r = rm_tagged_all(a, err, errlen);
		if (r < 0)
			return r;
	}
	return rm_work(a, err, errlen);
}

/* ---- tools --------------------------------------------------------------------------- */

struct lst {
	const struct s3_loc *loc;
	const char *dir;
	int (*fn)(void *ud, const char *name, enum store_entry kind);
	void *ud;
};

static int list_one(void *ud, const char *name, bool is_prefix)
{
	struct lst *l = ud;
	enum store_entry kind = is_prefix ? STORE_ENTRY_OTHER : STORE_ENTRY_FILE;

	if (is_prefix) {
		char rel[S3_KEY_MAX + 1], key[S3_KEY_MAX + 1], err[256];
		if (!strncmp(name, STORE_WORK_PREFIX, sizeof(STORE_WORK_PREFIX) - 1)) {
			kind = STORE_ENTRY_WORK;
		} else {
			snprintf(rel, sizeof(rel), "%s%s%s/%s", l->dir, l->dir[0] ? "/" : "", name,
				 MANIFEST_FILE);
			/* A name too long to hold a manifest key is no checkpoint. */
			int r = key_of(l->loc, rel, key, sizeof(key), err, sizeof(err)) < 0 ?
					-ENOENT : head_object(l->loc->bucket, key, NULL, err,
							      sizeof(err));
			if (r == 0)
				kind = STORE_ENTRY_CHECKPOINT;
			/* Only "no manifest" makes it something else: a HEAD that
			 * failed otherwise must not make a committed checkpoint look
			 * absent (a reader looking for the newest one would take an
			 * older one). */
			else if (r != -ENOENT)
				return r;
		}
	}
	return l->fn(l->ud, name, kind);
}

static int s3_list_root(const char *root, const char *dir,
			int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud)
{
	struct s3_loc loc;
	char pre[S3_KEY_MAX + 2], err[512];
	struct lst l = { &loc, dir, fn, ud };
	int r;

	if (!g_s3)
		return -ENOTSUP;
	r = s3_url_parse(root, &loc, err, sizeof(err));
	if (r < 0)
		return r;
	if (dir[0])
		r = key_of(&loc, dir, pre, sizeof(pre) - 1, err, sizeof(err));
	else
		r = snprintf(pre, sizeof(pre), "%s", loc.prefix) < 0 ? -EINVAL : 0;
	if (r < 0)
		return r;
	if (pre[0])
		strcat(pre, "/");
	return s3_list(loc.bucket, pre, true, list_one, &l, err, sizeof(err));
}

/* ---- removing a checkpoint (remove.h) ------------------------------------------------ */

#define RM_DELETE_MAX 1000 /* keys per DeleteObjects, S3's limit */

struct keyset {
	char **v;
	size_t n, cap;
	const char *skip;
};

static int keyset_add(void *ud, const char *name, bool is_prefix)
{
	struct keyset *ks = ud;

	(void)is_prefix;
	if (!strcmp(name, ks->skip))
		return 0;
	if (ks->n == ks->cap) {
		size_t cap = ks->cap ? 2 * ks->cap : 64;
		char **v = realloc(ks->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ks->v = v;
		ks->cap = cap;
	}
	if (!(ks->v[ks->n] = strdup(name)))
		return -ENOMEM;
	ks->n++;
	return 0;
}

static void keyset_free(struct keyset *ks)
{
	for (size_t i = 0; i < ks->n; i++)
		free(ks->v[i]);
	free(ks->v);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether a name of sorted ks starts with pre (len bytes): the names that
 * do are one run of the sorted array. */
static bool keyset_has_prefix(const struct keyset *ks, const char *pre, size_t len)
{
	size_t lo = 0, hi = ks->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strncmp(ks->v[mid], pre, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < ks->n && !strncmp(ks->v[lo], pre, len);
}

static bool shard_tag_of(const char *key, char tag[TAG_DIGITS + 1]);

/*
 * Whether `k`, a key of a checkpoint (relative to its prefix; ks: all of
 * them, sorted), belongs to something nested in the checkpoint rather
 * than to it: a checkpoint below it (a prefix that holds a manifest.json
 * or a tombstone) or a save whose root lies inside it (a work area, and
 * the shards its attempt uploads next to it before its manifest).  Saves
 * refuse such roots (store.h, root_open), but an older daemon, a save
 * that raced the checkpoint's commit, or a hand may have made one: its
 * keys are someone else's, never removed with this checkpoint.
 */
static bool nested_key(const struct keyset *ks, const char *k)
{
	char buf[S3_KEY_MAX + sizeof(STORE_WORK_PREFIX) + TAG_DIGITS + 2];
	char tag[TAG_DIGITS + 1];
	const char *last = strrchr(k, '/'), *up;

	for (const char *s = strchr(k, '/'); s; s = strchr(s + 1, '/')) {
		const char *comp = s;

		while (comp > k && comp[-1] != '/')
			comp--;
		if (!strncmp(comp, STORE_WORK_PREFIX, sizeof(STORE_WORK_PREFIX) - 1))
			return true;
		if ((size_t)snprintf(buf, sizeof(buf), "%.*s/%s", (int)(s - k), k, MANIFEST_FILE) <
		    sizeof(buf) && keyset_has_prefix(ks, buf, strlen(buf) + 1))
			return true; /* (+1: the NUL, an exact match) */
	}
	if (!last || !shard_tag_of(k, tag))
		return false;
	/* A shard in NAME/: is the work area of its attempt NAME's sibling? */
	for (up = last; up > k && up[-1] != '/'; up--)
		;
	snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(up - k), k, STORE_WORK_PREFIX, tag);
	return keyset_has_prefix(ks, buf, strlen(buf));
}

/* Moves the keys of ks that are nested_key()s into *nested (sorting ks).
 * 0 or -ENOMEM. */
static int keyset_take_nested(struct keyset *ks, struct keyset *nested)
{
	bool *mark;
	size_t k = 0;

	if (!ks->n)
		return 0;
	qsort(ks->v, ks->n, sizeof(*ks->v), str_cmp);
	mark = calloc(ks->n, sizeof(*mark));
	if (!mark)
		return -ENOMEM;
	for (size_t i = 0; i < ks->n; i++)
		mark[i] = nested_key(ks, ks->v[i]);
	for (size_t i = 0; i < ks->n; i++) {
		if (!mark[i]) {
			ks->v[k++] = ks->v[i];
			continue;
		}
		if (nested->n == nested->cap) {
			size_t cap = nested->cap ? 2 * nested->cap : 16;
			char **v = realloc(nested->v, cap * sizeof(*v));

			if (!v) {
				/* (what is not moved yet stays in ks) */
				for (size_t j = i; j < ks->n; j++)
					ks->v[k++] = ks->v[j];
				ks->n = k;
				free(mark);
				return -ENOMEM;
			}
			nested->v = v;
			nested->cap = cap;
		}
		nested->v[nested->n++] = ks->v[i];
	}
	ks->n = k;
	free(mark);
	return 0;
}

struct del_errs {
	unsigned n;
	char first[384];
};

static int del_err_one(void *ud, const char *inner, size_t len)
{
	struct del_errs *d = ud;
	char key[256] = "", code[64] = "", msg[128] = "";

	if (!d->n++) {
		(void)s3_xml_text(inner, len, "Key", key, sizeof(key));
		(void)s3_xml_text(inner, len, "Code", code, sizeof(code));
		(void)s3_xml_text(inner, len, "Message", msg, sizeof(msg));
		snprintf(d->first, sizeof(d->first), "%s: %s %s", key, code, msg);
	}
	return 0;
}

/* One DeleteObjects of bucket's keys[0..n) (full keys).  0 or -errno (err),
 * also when S3 could not delete some of them. */
static int delete_batch(const char *bucket, const char *const *keys, size_t n, char *err,
			size_t errlen)
{
	struct s3_req q = { .method = "POST", .bucket = bucket, .key = "", .query = "delete=",
			    .max_resp = 4u << 20 };
	struct del_errs d = { 0, "" };
	struct jbuf b;
	char *xml = NULL;
	size_t xml_len = 0;
	int r;

	jbuf_init(&b, 128 + n * 64, 0);
	s3_delete_xml(&b, keys, n);
	if (jbuf_finish(&b, true, &xml, &xml_len))
		return -ENOMEM;
	q.body = xml;
	q.body_len = xml_len;
	q.headers[0] = "Content-Type: application/xml";
	r = s3_call(g_s3, &q, err, errlen);
	if (r == 0 && q.resp &&
	    s3_xml_each(q.resp, q.resp_len, "DeleteResult/Error", del_err_one, &d) < 0) {
		snprintf(err, errlen, "S3 DeleteObjects in s3://%s: an answer we cannot read",
			 bucket);
		r = -EBADMSG;
	}
	if (r == 0 && d.n) {
		snprintf(err, errlen, "S3 DeleteObjects in s3://%s: %u key%s not deleted (%s)",
			 bucket, d.n, d.n == 1 ? "" : "s", d.first);
		r = -EIO;
	}
	s3_req_free(&q);
	free(xml);
	return r;
}

static void rm_step(const char *what)
{
	if (store_remove_hook)
		store_remove_hook(what);
}

/* ---- leases (remove.h) -------------------------------------------------------------- */

_Static_assert(sizeof(((struct store_s3_lease *)0)->bucket) == S3_BUCKET_MAX + 1, "bucket");
_Static_assert(sizeof(((struct store_s3_lease *)0)->key) == S3_KEY_MAX + 1, "key");

/* The body of a lease taken at `now`: {"ckpt_lease":{...}}. */
/* A character of a host name shown as it is (to operators, in errors). */
static bool lease_plain(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '.' || c == '_';
}

static char *lease_body(int64_t now)
{
	char host[65] = "";
	json_t *j;
	char *text;

	/* The host only helps an operator find the reader: kept if plain. */
	if (gethostname(host, sizeof(host) - 1) < 0)
		host[0] = '\0';
	for (char *c = host; *c; c++)
		if (!lease_plain(*c))
			*c = '_';
	j = json_pack("{s:{s:I, s:I, s:i, s:s}}", STORE_S3_LEASE_KEY, "taken", (json_int_t)now,
		      "expires", (json_int_t)(now + STORE_S3_LEASE_TTL_S), "pid", (int)getpid(),
		      "host", host);
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return text;
}

/* Seconds on CLOCK_MONOTONIC, for when to renew: a wall clock set back
 * must not put renewals off.  Never 0 (0 means "none held"). */
static int64_t lease_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec + 1;
}

static int lease_put(struct store_s3_lease *l, int64_t now, char *err, size_t errlen)
{
	char *text = lease_body(now);
	int r;

	if (!text) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = put_text(l->bucket, l->key, text, false, err, errlen);
	free(text);
	return r;
}

int store_s3_lease_take(const char *ckpt, struct store_s3_lease *l, char *err, size_t errlen)
{
	unsigned char rnd[16];
	char rel[sizeof(STORE_S3_LEASE_PREFIX) + 32];
	struct s3_loc loc;
	int64_t now = (int64_t)time(NULL);
	int r, n;

	atomic_store(&l->renew_at, 0);
	r = ckpt_loc(ckpt, &loc, err, errlen);
	if (r < 0)
		return r;
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		snprintf(err, errlen, "no random bytes for the lease's name");
		return -EIO;
	}
	n = snprintf(rel, sizeof(rel), "%s", STORE_S3_LEASE_PREFIX);
	for (int i = 0; i < 16; i++)
		n += snprintf(rel + n, sizeof(rel) - (size_t)n, "%02x", rnd[i]);
	r = key_of(&loc, rel, l->key, sizeof(l->key), err, errlen);
	if (r < 0)
		return r;
	snprintf(l->bucket, sizeof(l->bucket), "%s", loc.bucket);
	r = lease_put(l, now, err, errlen);
	if (r == 0)
		atomic_store(&l->renew_at, lease_mono() + STORE_S3_LEASE_TTL_S / 3);
	else if (r != -EACCES) {
		/* It may have landed all the same (an answer lost after the
		 * retries): not left to block a removal for its life. */
		char e[128];

		(void)del_key(l->bucket, l->key, e, sizeof(e));
	}
	return r;
}

void store_s3_lease_renew(struct store_s3_lease *l)
{
	int64_t due = atomic_load(&l->renew_at), mono = lease_mono();
	char e[256];

	if (!due || mono < due || !g_s3)
		return;
	/* One thread renews; a failed PUT is tried again a minute later. */
	if (!atomic_compare_exchange_strong(&l->renew_at, &due, mono + 60))
		return;
	if (lease_put(l, (int64_t)time(NULL), e, sizeof(e)) == 0) {
		due = mono + 60;
		(void)atomic_compare_exchange_strong(&l->renew_at, &due,
						     mono + STORE_S3_LEASE_TTL_S / 3);
	}
}

void store_s3_lease_drop(struct store_s3_lease *l)
{
	char e[256];

	if (atomic_exchange(&l->renew_at, 0) && g_s3)
		(void)del_key(l->bucket, l->key, e, sizeof(e));
}

/* A lease body's times if it is one of ours: within bounds that no
 * arithmetic can overflow, ending after it began, for at most
 * STORE_S3_LEASE_MAX_S, and begun no later than now (give or take the
 * clocks' skew).  true, or false (not ours). */
static bool lease_times(const char *text, size_t len, int64_t now, int64_t *taken,
			int64_t *expires)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	json_t *o = j ? json_object_get(j, STORE_S3_LEASE_KEY) : NULL;
	json_t *t = o ? json_object_get(o, "taken") : NULL, *e = o ? json_object_get(o, "expires") : NULL;
	bool ok = json_is_integer(t) && json_is_integer(e);

	if (ok) {
		*taken = json_integer_value(t);
		*expires = json_integer_value(e);
		ok = *taken >= 0 && *taken < ((int64_t)1 << 40) && *expires >= 0 &&
		     *expires < ((int64_t)1 << 40) && *expires >= *taken &&
		     *expires - *taken <= STORE_S3_LEASE_MAX_S &&
		     *taken <= now + STORE_S3_LEASE_SKEW_S;
	}
	json_decref(j);
	return ok;
}

int store_s3_gc_lease(const char *dir, const char *name, int64_t grace_s, bool dry_run,
		      int64_t *ret_age_s, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 1], *text = NULL;
	int64_t taken, expires, now = (int64_t)time(NULL);
	struct s3_loc loc;
	size_t len = 0;
	bool ours;
	int r;

	*ret_age_s = -1;
	r = url_key(dir, name, &loc, key, err, errlen);
	if (r < 0)
		return r;
	r = get_text(loc.bucket, key, 4096, &text, &len, err, errlen);
	if (r == -ENOENT)
		return 0; /* its reader let go meanwhile */
	if (r == -EFBIG) {
		snprintf(err, errlen, "not a lease of ours (over 4 KiB)");
		return -EBADMSG;
	}
	if (r < 0)
		return r;
	ours = lease_times(text, len, now, &taken, &expires);
	free(text);
	if (!ours) {
		snprintf(err, errlen, "not a lease of ours (its body is not one ckptd writes)");
		return -EBADMSG;
	}
	/* Its age counts from its end (and the clocks' skew). */
	*ret_age_s = now - expires - STORE_S3_LEASE_SKEW_S;
	if (*ret_age_s < grace_s)
		return 0;
	if (!dry_run) {
		r = del_key(loc.bucket, key, err, errlen);
		if (r < 0)
			return r;
	}
	return 1;
}

/* Whether a lease's body (len bytes) is one that holds at `now`: ours in
 * form, taken no later than now (give or take the clocks' skew), for at
 * most STORE_S3_LEASE_MAX_S, and not ended more than the skew ago.  A
 * body that is none of these holds nothing (and goes with the rest). */
static bool lease_live(const char *text, size_t len, int64_t now, char *who, size_t wholen)
{
	int64_t taken, expires;
	json_t *j, *o;
	const char *host;
	time_t until;
	char when[32] = "?";
	struct tm tm;

	if (!lease_times(text, len, now, &taken, &expires) ||
	    expires < now - STORE_S3_LEASE_SKEW_S)
		return false;
	/* Who holds it, for the operator: a host that is not plain is not
	 * shown. */
	j = json_loadb(text, len, 0, NULL);
	o = json_object_get(j, STORE_S3_LEASE_KEY);
	host = json_string_value(json_object_get(o, "host"));
	for (const char *c = host; c && *c; c++)
		if (!lease_plain(*c))
			host = NULL;
	until = (time_t)expires;
	if (gmtime_r(&until, &tm))
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	snprintf(who, wholen, "pid %lld on %.64s, until %s",
		 json_is_integer(json_object_get(o, "pid")) ?
			 (long long)json_integer_value(json_object_get(o, "pid")) : -1LL,
		 host && host[0] ? host : "?", when);
	json_decref(j);
	return true;
}

struct lease_scan {
	const char *bucket, *under; /* the checkpoint's key prefix */
	int64_t now;
	unsigned seen;
	int res;                    /* an error reading one */
	char who[160], err[256];
};

/* Reads lease `name` (under s->under): 1 if it holds (or there are too
 * many to read, or it could not be read: s->res), 0 if not. */
static int lease_one(struct lease_scan *s, const char *name)
{
	char key[S3_KEY_MAX + 1], *text = NULL;
	size_t len = 0;
	int r;

	if (++s->seen > STORE_S3_LEASE_SCAN_MAX) {
		snprintf(s->who, sizeof(s->who), "more than %u leases: not read", STORE_S3_LEASE_SCAN_MAX);
		return 1;
	}
	if ((size_t)snprintf(key, sizeof(key), "%s%s", s->under, name) >= sizeof(key))
		return 0;
	r = get_text(s->bucket, key, 4096, &text, &len, s->err, sizeof(s->err));
	if (r == -ENOENT)
		return 0; /* its reader let go meanwhile */
	if (r == -EFBIG || r == -EACCES)
		return 0; /* not a lease of ours (too big; unreadable to us, e.g.
			   * archived): holds nothing, goes with the rest */
	if (r < 0) {
		s->res = r;
		return 1;
	}
	r = lease_live(text, len, s->now, s->who, sizeof(s->who)) ? 1 : 0;
	free(text);
	return r;
}

/* 1 if a reader holds a lease on the checkpoint whose keys start with
 * `pre` (who says which), 0 if none does, -errno (err) if that cannot be
 * known.  ks: the checkpoint's keys (relative to pre), listed after its
 * tombstone was written. */
static int leases_held(const char *bucket, const char *pre, const struct keyset *ks, char *who,
		       size_t wholen, char *err, size_t errlen)
{
	struct lease_scan s = { .bucket = bucket, .under = pre, .now = (int64_t)time(NULL) };
	int r = 0;

	for (size_t i = 0; r == 0 && i < ks->n; i++)
		if (store_is_lease_name(ks->v[i]))
			r = lease_one(&s, ks->v[i]);
	if (r == 1 && s.res) {
		snprintf(err, errlen, "reading a lease: %s", s.err);
		return s.res;
	}
	if (r == 1)
		snprintf(who, wholen, "%s", s.who);
	return r;
}

/* ---- removal (remove.h) ------------------------------------------------------------- */

/* How much of a manifest a tombstone carries a copy of, and how much of
 * either a removal reads. */
#define TOMB_COPY_MAX (16u << 20)
#define RM_READ_MAX   (1u << 30)

/*
 * A tombstone for ckpt with a fresh nonce (written to nonce[33]): each
 * removal's is its own, so its ETag is too.  Phase "deciding" carries the
 * manifest it stands in for (man, len bytes; NULL or too big: none), so
 * that whichever removal ends up deciding to keep the checkpoint can put
 * it back; phase "deleting" (STORE_TOMBSTONE_DELETING) carries none:
 * written once a removal has decided, before any data goes, so that no
 * removal that comes later puts back a manifest over data being deleted.
 * malloc'd, or NULL.
 */
static char *tombstone_text(const char *ckpt, const char *by, const char *man, size_t len,
			    bool deleting, char nonce[33])
{
	unsigned char rnd[16];
	json_t *t, *o;
	char *js;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return NULL;
	for (int i = 0; i < 16; i++)
		snprintf(nonce + 2 * i, 3, "%02x", rnd[i]);
	t = json_pack("{s:{s:s, s:s, s:I, s:s, s:s}}", STORE_TOMBSTONE_KEY, "checkpoint", ckpt,
		      "by", by ? by : "ckptd", "time", (json_int_t)time(NULL), "nonce", nonce,
		      "phase", deleting ? STORE_TOMBSTONE_DELETING : "deciding");
	o = json_object_get(t, STORE_TOMBSTONE_KEY);
	/* (A manifest that is not UTF-8 cannot be carried: then none is.) */
	if (o && man && !deleting && len <= TOMB_COPY_MAX)
		json_object_set_new(o, "manifest", json_stringn(man, len));
	js = t ? json_dumps(t, JSON_COMPACT) : NULL;
	json_decref(t);
	return js;
}

/* The manifest a tombstone (text, len bytes) carries, malloc'd into *ret
 * (NULL if it carries none). */
static int tombstone_manifest(const char *text, size_t len, char **ret, size_t *ret_len)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	json_t *m = json_object_get(json_object_get(j, STORE_TOMBSTONE_KEY), "manifest");
	int r = 0;

	*ret = NULL;
	*ret_len = 0;
	if (json_is_string(m) && json_string_length(m)) {
		*ret_len = json_string_length(m);
		*ret = malloc(*ret_len + 1);
		if (*ret) {
			memcpy(*ret, json_string_value(m), *ret_len);
			(*ret)[*ret_len] = '\0';
		} else {
			r = -ENOMEM;
		}
	}
	json_decref(j);
	return r;
}

/* Whether the manifest key holds our tombstone (nonce) now; its ETag into
 * etag if so. */
static bool tombstone_ours(const char *bucket, const char *man, const char *nonce,
			   char etag[STORE_ETAG_LEN])
{
	char *now = NULL;
	size_t len = 0;
	bool ours = false;

	if (get_text_etag(bucket, man, 64u << 20, &now, &len, etag, STORE_ETAG_LEN, NULL, 0) ==
	    0 && store_is_tombstone(now, len)) {
		json_t *j = json_loadb(now, len, 0, NULL);
		const char *n = json_string_value(json_object_get(
			json_object_get(j, STORE_TOMBSTONE_KEY), "nonce"));

		ours = n && !strcmp(n, nonce);
		json_decref(j);
	}
	free(now);
	return ours;
}

/* DELETE of key only while its ETag is `match` (S3's conditional delete;
 * a server that ignores the header deletes as before).  0 also when it
 * is gone or changed (then it is no longer ours to delete). */
static int del_key_if(const char *bucket, const char *key, const char *match, char *err,
		      size_t errlen)
{
	struct s3_req q = { .method = "DELETE", .bucket = bucket, .key = key,
			    .fail_404_quietly = true };
	char hdr[160];
	int r;

	if (match && match[0]) {
		snprintf(hdr, sizeof(hdr), "If-Match: %s", match);
		q.headers[0] = hdr;
	}
	r = s3_call(g_s3, &q, err, errlen);
	if (r == -ENOENT || (r < 0 && q.status == 412))
		r = 0;
	s3_req_free(&q);
	return r;
}

int store_s3_remove(const char *ckpt, const char *by, const char *expect_etag,
		    int (*recheck)(void *ud, char *why, size_t whylen), void *ud, char *err,
		    size_t errlen)
{
	char etag[STORE_ETAG_LEN], tomb_etag[STORE_ETAG_LEN] = "", who[160] = "", nonce[33];
	char man[S3_KEY_MAX + 1], pre[S3_KEY_MAX + 2], *text = NULL, *js, note[320] = "";
	struct keyset ks = { .skip = MANIFEST_FILE }, nested = { .skip = "" };
	const char **batch = NULL;
	struct s3_loc loc;
	bool found_tomb;
	size_t len = 0;
	int r;

	r = ckpt_loc(ckpt, &loc, err, errlen);
	if (r < 0)
		return r;
	r = key_of(&loc, MANIFEST_FILE, man, sizeof(man), err, errlen);
	if (r < 0)
		return r;
	snprintf(pre, sizeof(pre), "%s/", loc.prefix);
	r = get_text_etag(loc.bucket, man, RM_READ_MAX, &text, &len, etag, sizeof(etag), err,
			  errlen);
	if (r == -ENOENT) {
		snprintf(err, errlen, "%s has no %s: not a committed checkpoint", ckpt,
			 MANIFEST_FILE);
		return r;
	}
	if (r < 0)
		return r;
	found_tomb = store_is_tombstone(text, len);
	if (expect_etag && expect_etag[0] && strcmp(etag, expect_etag)) {
		/* Not what the caller saw: committed again under its name,
		 * put back, or another removal's since.  Left alone. */
		free(text);
		snprintf(err, errlen, "%s", found_tomb ?
			 "another removal has it since the plan (left to it)" :
			 "not the checkpoint planned: its manifest changed since (kept)");
		return found_tomb ? -EINPROGRESS : -ESTALE;
	}
	if (found_tomb && store_tombstone_deleting(text, len)) {
		/* Decided already: only the deleting is left to finish. */
		free(text);
		snprintf(tomb_etag, sizeof(tomb_etag), "%s", etag);
		r = s3_list(loc.bucket, pre, false, keyset_add, &ks, err, errlen);
		if (r == 0)
			r = keyset_take_nested(&ks, &nested);
		if (r == -ENOMEM)
			snprintf(err, errlen, "out of memory");
		if (r < 0) {
			keyset_free(&ks);
			keyset_free(&nested);
			return r;
		}
		goto delete;
	}
	if (found_tomb) {
		/* One cut short, or another removal's the caller saw, still
		 * deciding: taken over, with the manifest it carries. */
		char *m;
		size_t mlen;

		r = tombstone_manifest(text, len, &m, &mlen);
		free(text);
		text = m;
		len = mlen;
		if (r < 0) {
			snprintf(err, errlen, "out of memory");
			return r;
		}
	}
	js = tombstone_text(ckpt, by, text, len, false, nonce);
	if (!js) {
		free(text);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/*
	 * From here no reader takes it for a checkpoint.  Written only over
	 * what was just read (If-Match): a manifest written meanwhile stays,
	 * and a tombstone found is taken over, so that of two removals at
	 * once only the later tombstone's owner decides; the other's putting
	 * back the manifest, or its deciding to delete, both only over its
	 * own tombstone, then fail.
	 */
	rm_step("tombstone");
	r = put_text_if(loc.bucket, man, js, etag[0] ? etag : NULL, tomb_etag, err, errlen);
	free(js);
	if (r == -ESTALE && tombstone_ours(loc.bucket, man, nonce, tomb_etag))
		r = 0; /* a retry after a lost answer: ours landed */
	if (r == -ESTALE) {
		free(text);
		snprintf(err, errlen, "%s", found_tomb ?
			 "another removal took it over meanwhile (left to it)" :
			 "not the checkpoint planned: its manifest changed under the removal (kept)");
		return found_tomb ? -EINPROGRESS : -ESTALE;
	}
	if (r < 0) {
		free(text);
		return r;
	}
	/*
	 * Leases: a reader puts its lease, then reads the manifest; we put the
	 * tombstone, then list the leases.  So a reader that got the manifest
	 * has a lease this listing shows, and the manifest goes back; any
	 * later reader finds the tombstone (S3 is strongly consistent).  The
	 * caller's recheck comes in the same place, for the same reason.
	 */
	rm_step("leases");
	/* One listing, after the tombstone: the leases, and what to delete
	 * (what is nested in it is not its own: set apart, left). */
	r = s3_list(loc.bucket, pre, false, keyset_add, &ks, err, errlen);
	if (r == 0)
		r = keyset_take_nested(&ks, &nested);
	if (r == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (r == 0)
		r = leases_held(loc.bucket, pre, &ks, who, sizeof(who), err, errlen);
	if (r == 0 && recheck) {
		char why[160] = "";

		if (recheck(ud, why, sizeof(why))) {
			snprintf(who, sizeof(who), "%s", why[0] ? why : "kept by the caller");
			r = 2;
		}
	}
	if (r != 0) {
		char e[256] = "";
		int put = -ENOENT;

		if (r < 0)
			snprintf(who, sizeof(who), "whether a reader holds a lease is not known: %.100s",
				 err);
		if (text && tomb_etag[0])
			put = put_text_if(loc.bucket, man, text, tomb_etag, NULL, e, sizeof(e));
		free(text);
		keyset_free(&ks);
		keyset_free(&nested);
		if (put == 0) {
			snprintf(err, errlen, "%s%s%s: kept", r == 1 ? "in use (a reader holds a lease: " :
				 "", who, r == 1 ? ")" : "");
			return r < 0 ? r : -EBUSY;
		}
		if (put == -ESTALE) {
			/* The later removal decides, seeing the same lease or
			 * pin, with the copy its tombstone carries. */
			snprintf(err, errlen, "%s%s%s, but another removal took it over (left to it)",
				 r == 1 ? "in use (a reader holds a lease: " : "", who,
				 r == 1 ? ")" : "");
			return -EINPROGRESS;
		}
		/* Not put back: reported as a failure, never as kept. */
		snprintf(err, errlen, "%s%s%s, but its manifest could not be put back (%.120s): "
			 "while it looks removed, a later prune decides again",
			 r == 1 ? "in use (a reader holds a lease: " : "", who, r == 1 ? ")" : "",
			 put == -ENOENT ? "its tombstone carries no copy" : e);
		return r < 0 ? r : -EIO;
	}
	free(text);
	/* Decided: said in the tombstone, only over our own, before anything
	 * goes.  A removal that took it over since decides instead. */
	js = tombstone_text(ckpt, by, NULL, 0, true, nonce);
	if (!js) {
		keyset_free(&ks);
		keyset_free(&nested);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rm_step("deleting");
	{
		char was[STORE_ETAG_LEN];

		snprintf(was, sizeof(was), "%s", tomb_etag);
		r = put_text_if(loc.bucket, man, js, was[0] ? was : NULL, tomb_etag, err, errlen);
	}
	free(js);
	if (r == -ESTALE && tombstone_ours(loc.bucket, man, nonce, tomb_etag))
		r = 0;
	if (r < 0) {
		keyset_free(&ks);
		keyset_free(&nested);
		if (r == -ESTALE) {
			snprintf(err, errlen, "another removal took it over before the deletion (left "
				 "to it)");
			return -EINPROGRESS;
		}
		return r; /* our tombstone stays: a later removal decides again */
	}
delete:
	batch = calloc(RM_DELETE_MAX, sizeof(*batch));
	if (!batch)
		r = -ENOMEM;
	if (r == 0 && !batch)
		r = -ENOMEM;
	for (size_t at = 0; r == 0 && at < ks.n; at += RM_DELETE_MAX) {
		size_t k = ks.n - at < RM_DELETE_MAX ? ks.n - at : RM_DELETE_MAX, i;

		for (i = 0; i < k; i++) {
			size_t l = strlen(pre) + strlen(ks.v[at + i]) + 1;
			char *full = malloc(l);

			if (!full)
				break;
			snprintf(full, l, "%s%s", pre, ks.v[at + i]);
			batch[i] = full;
		}
		rm_step("delete-batch");
		r = i < k ? -ENOMEM : delete_batch(loc.bucket, batch, k, err, errlen);
		while (i)
			free((char *)batch[--i]);
	}
	free(batch);
	keyset_free(&ks);
	keyset_free(&nested);
	if (r < 0)
		return r; /* the tombstone stays: a later removal finishes */
	/* Only the tombstone may be left, and what is nested in it: keys that
	 * came meanwhile, or that we cannot name, keep it (and the removal is
	 * reported unfinished) rather than orphaned.  A lease put meanwhile
	 * is a reader's that found the tombstone and lets go: it is not
	 * waited for. */
	{
		struct keyset left = { .skip = MANIFEST_FILE }, inner = { .skip = "" };
		unsigned odd = 0;
		size_t leases = 0;

		r = s3_list_n(loc.bucket, pre, false, keyset_add, &left, &odd, err, errlen);
		if (r == 0)
			r = keyset_take_nested(&left, &inner);
		if (r == -ENOMEM)
			snprintf(err, errlen, "out of memory");
		for (size_t i = 0; r == 0 && i < left.n; i++)
			if (store_is_lease_name(left.v[i]))
				leases++;
		if (r == 0 && (left.n > leases || odd)) {
			const char *eg = "";

			for (size_t i = 0; i < left.n && !eg[0]; i++)
				if (!store_is_lease_name(left.v[i]))
					eg = left.v[i];
			snprintf(err, errlen, "%zu key%s under %s could not be deleted%s%.200s%s: its "
				 "tombstone stays", left.n - leases + odd,
				 left.n - leases + odd == 1 ? "" : "s", ckpt,
				 eg[0] ? " (e.g. '" : " (names we cannot handle)", eg,
				 eg[0] ? "')" : "");
			r = -EIO;
		}
		/* Its own keys are gone: the removal is done, and what is
		 * nested stays, said to the caller. */
		if (r == 0 && inner.n)
			snprintf(note, sizeof(note), "left %zu key%s nested in it, another checkpoint's "
				 "or save's (e.g. '%.200s'): not this checkpoint's to remove",
				 inner.n, inner.n == 1 ? "" : "s", inner.v[0]);
		keyset_free(&left);
		keyset_free(&inner);
		if (r < 0)
			return r;
	}
	/* Last, and only our own tombstone: not one another removal put
	 * since, nor a manifest committed under the name after it. */
	rm_step("delete-tombstone");
	r = del_key_if(loc.bucket, man, tomb_etag, err, errlen);
	if (r == 0)
		snprintf(err, errlen, "%s", note);
	return r;
}

int store_s3_read_range_err(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			    void *buf, char *err, size_t errlen)
{
	struct s3_loc loc;
	char key[S3_KEY_MAX + 1];
	int r;

	r = url_key(ckpt, file, &loc, key, err, errlen);
	if (r < 0)
		return r;
	if (len == 0)
		return 0;
	struct s3_req q = { .method = "GET", .bucket = loc.bucket, .key = key, .range_off = off,
			    .range_len = len, .into = buf, .max_resp = (size_t)len };
	r = s3_call(g_s3, &q, err, errlen);
	if (q.status == 416 || (r == 0 && q.resp_len != len)) {
		/* A range past the end (InvalidRange), or a short answer: the
		 * object is shorter than the manifest says. */
		r = -EBADMSG;
		snprintf(err, errlen, "S3 GET s3://%s/%s: %s", loc.bucket, key,
			 "the object is shorter than the checkpoint's manifest says");
	}
	s3_req_free(&q);
	return r;
}

static int s3_read_range(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			 void *buf)
{
	char err[512];

	if (!g_s3)
		return -ENOTSUP;
	return store_s3_read_range_err(ckpt, file, off, len, buf, err, sizeof(err));
}

int store_s3_put_if(const char *url, const char *file, const char *text, const char *match,
		    char *err, size_t errlen)
{
	struct s3_loc loc;
	char key[S3_KEY_MAX + 1];
	int r;

	r = url_key(url, file, &loc, key, err, errlen);
	if (r < 0)
		return r;
	if (match && match[0])
		return put_text_if(loc.bucket, key, text, match, NULL, err, errlen);
	r = put_text(loc.bucket, key, text, true, err, errlen);
	return r == -EEXIST ? -ESTALE : r;
}

int store_s3_get(const char *ckpt, const char *file, size_t max, char **ret, size_t *ret_len,
		 char *err, size_t errlen)
{
	return store_s3_get_etag(ckpt, file, max, ret, ret_len, NULL, err, errlen);
}

int store_s3_get_etag(const char *ckpt, const char *file, size_t max, char **ret,
		      size_t *ret_len, char etag[STORE_ETAG_LEN], char *err, size_t errlen)
{
	struct s3_loc loc;
	char key[S3_KEY_MAX + 1];
	int r;

	r = url_key(ckpt, file, &loc, key, err, errlen);
	return r < 0 ? r : get_text_etag(loc.bucket, key, max, ret, ret_len, etag,
					 etag ? STORE_ETAG_LEN : 0, err, errlen);
}

int store_s3_exists(const char *root, const char *rel)
{
	struct s3_loc loc;
	char key[S3_KEY_MAX + 1], err[256];
	int r;

	if (!g_s3)
		return -ENOTSUP;
	r = s3_url_parse(root, &loc, err, sizeof(err));
	if (r == 0)
		r = key_of(&loc, rel, key, sizeof(key), err, sizeof(err));
	if (r == 0)
		r = head_object(loc.bucket, key, NULL, err, sizeof(err));
	return r == 0 ? 1 : r == -ENOENT ? 0 : r;
}

static int s3_remove(const char *root, const char *name)
{
	struct s3_loc loc;
	char pre[S3_KEY_MAX + 2], err[512];
	int r;

	if (!g_s3)
		return -ENOTSUP;
	r = s3_url_parse(root, &loc, err, sizeof(err));
	if (r == 0)
		r = key_of(&loc, name, pre, sizeof(pre) - 1, err, sizeof(err));
	if (r < 0)
		return r;
	strcat(pre, "/");
	return rm_prefix(loc.bucket, pre, err, sizeof(err));
}

/* ---- leftovers ------------------------------------------------------------------------ */

/*
 * The attempt `id` (32 hex digits) whose work area is in dir, for a sweep
 * or gc: *a set up, and its attempt.json into *ret (json_decref it) when
 * that is ckptd's for this id (its id, a checkpoint name, which goes into
 * a->name).  Returns 0, -ENOENT (no attempt.json), -EBADMSG (not one ckptd
 * wrote for it: err), or -errno (err).
 */
static int leftover_open(const char *dir, const char *id, struct store_attempt *a,
			 json_t **ret, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 1];
	const char *name, *aid;
	char *text;
	size_t len;
	json_t *j;
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	if (strlen(id) != STORE_ID_LEN) {
		snprintf(err, errlen, "not a work area's id");
		return -EINVAL;
	}
	memset(a, 0, sizeof(*a));
	r = s3_url_parse(dir, &a->loc, err, errlen);
	if (r < 0)
		return r;
	s3_url_format(&a->loc, a->root, sizeof(a->root));
	snprintf(a->work, sizeof(a->work), "%s%s", STORE_WORK_PREFIX, id);
	snprintf(a->id, sizeof(a->id), "%s", id);
	snprintf(a->tag, sizeof(a->tag), "%.*s", TAG_DIGITS, id);
	r = work_key(a, STORE_ATTEMPT_FILE, key, sizeof(key), err, errlen);
	if (r == 0)
		r = get_text(a->loc.bucket, key, ATTEMPT_MAX_BYTES, &text, &len, err, errlen);
	/* -EBADMSG is kept for "not ours" below: an answer damaged however
	 * often it was asked for is the way's trouble (tried again later). */
	if (r == -EBADMSG)
		r = -EIO;
	if (r < 0)
		return r;
	j = json_loadb(text, len, 0, NULL);
	free(text);
	name = json_string_value(json_object_get(j, "name"));
	aid = json_string_value(json_object_get(j, "id"));
	if (!aid || strcmp(aid, id) || !name || !name_checkpoint_ok(name, NULL, 0)) {
		json_decref(j);
		snprintf(err, errlen, "its %s is not one ckptd wrote for it: not ours to judge",
			 STORE_ATTEMPT_FILE);
		return -EBADMSG;
	}
	snprintf(a->name, sizeof(a->name), "%s", name);
	*ret = j;
	return 0;
}

int store_s3_sweep(const char *root, const char *id, const char *instance, int64_t min_idle_s,
		   char *err, size_t errlen)
{
	struct store_attempt a;
	char e[512];
	const char *inst;
	int64_t idle;
	json_t *j;
	bool ours;
	int r;

	r = leftover_open(root, id, &a, &j, e, sizeof(e));
	if (r == -ENOENT || r == -EBADMSG || r == -EINVAL)
		return 0;
	if (r < 0) {
		snprintf(err, errlen, "%s", e);
		return r;
	}
	inst = json_string_value(json_object_get(json_object_get(j, "daemon"), "instance"));
	ours = inst && !strcmp(inst, instance);
	json_decref(j);
	if (!ours)
		return 0;
	/* Another daemon may still be in the save (its heartbeat): only an
	 * area idle for min_idle_s is a dead attempt's. */
	r = work_idle(&a, &idle, err, errlen);
	if (r == -ENOENT)
		return 0; /* emptied meanwhile */
	if (r < 0)
		return r;
	if (idle < min_idle_s) {
		snprintf(err, errlen, "work area '%s/%s' was active %llds ago", a.root, a.work,
			 (long long)idle);
		return -EBUSY;
	}
	r = leftover_remove(&a, err, errlen);
	return r < 0 ? r : 1;
}

int store_s3_gc_work(const char *dir, const char *id, int64_t grace_s, bool dry_run,
		     int64_t *ret_age_s, char *err, size_t errlen)
{
	struct store_attempt a;
	int64_t idle;
	json_t *j;
	int r;

	r = leftover_open(dir, id, &a, &j, err, errlen);
	if (r == -ENOENT) {
		snprintf(err, errlen, "no %s: not ours to judge", STORE_ATTEMPT_FILE);
		return -EBADMSG;
	}
	if (r < 0)
		return r;
	json_decref(j);
	/* Its age is its last activity's (a live save's daemons renew their
	 * heartbeat in it), never its creation's: a save that runs longer
	 * than the grace period is still a save. */
	r = work_idle(&a, &idle, err, errlen);
	if (r == -ENOENT) {
		snprintf(err, errlen, "its work area was emptied meanwhile");
		return r;
	}
	if (r < 0)
		return r;
	*ret_age_s = idle;
	if (idle < grace_s)
		return 0;
	if (dry_run)
		return 1;
	/* (leftover_remove succeeds only once attempt.json, last, is gone) */
	r = leftover_remove(&a, err, errlen);
	return r < 0 ? r : 1;
}

/* ---- gc of multipart uploads left without a work area ---- */

struct up_gc {
	const char *bucket;
	size_t strip;              /* bytes of the root's prefix ("" or "p/") */
	int64_t grace_s, now;
	bool dry_run;
	store_gc_report_fn report;
	void *ud;
	unsigned seen;
};

static int first_key(void *ud, const char *name, bool is_prefix)
{
	(void)name, (void)is_prefix;
	*(bool *)ud = true;
	return 1; /* one is enough */
}

/* "2026-11-26T03:11:34.000Z" -> seconds, or -1. */
static int64_t iso_time(const char *s)
{
	struct tm tm;
	int n = 0;

	memset(&tm, 0, sizeof(tm));
	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6 || n != 19)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm);
}

/* The tag of a key ".../NAME/rank-NNNNN.<16 hex>.safetensors" (our
 * marker: what the S3 backend names an attempt's shard), into tag. */
static bool shard_tag_of(const char *key, char tag[TAG_DIGITS + 1])
{
	const char *base = strrchr(key, '/');
	unsigned rank;
	int n = 0;

	base = base ? base + 1 : key;
	if (sscanf(base, "rank-%5u.%n", &rank, &n) != 1 || n != 11 ||
	    strlen(base) != 11 + TAG_DIGITS + strlen(".safetensors") ||
	    strcmp(base + 11 + TAG_DIGITS, ".safetensors"))
		return false;
	for (int i = 0; i < TAG_DIGITS; i++) {
		char c = base[11 + i];

		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false;
		tag[i] = c;
	}
	tag[TAG_DIGITS] = '\0';
	return true;
}

static int gc_upload(void *ud, const char *inner, size_t len)
{
	struct up_gc *g = ud;
	char key[S3_KEY_MAX + 1], id[256], when[64], tag[TAG_DIGITS + 1], err[256];
	char pre[S3_KEY_MAX + 64];
	const char *name_sep, *dir_end;
	int64_t t, age;
	bool work = false;

	if (s3_xml_text(inner, len, "Key", key, sizeof(key)) <= 0 ||
	    s3_xml_text(inner, len, "UploadId", id, sizeof(id)) <= 0)
		return 0;
	g->seen++;
	if (strlen(key) <= g->strip)
		return 0;
	if (s3_xml_text(inner, len, "Initiated", when, sizeof(when)) <= 0 ||
	    (t = iso_time(when)) < 0) {
		g->report(g->ud, key + g->strip, "UNKNOWN", "an upload without a start time", -1);
		return 0;
	}
	age = g->now - t;
	if (!shard_tag_of(key, tag) || !(name_sep = strrchr(key, '/')) || name_sep == key) {
		g->report(g->ud, key + g->strip, "UNKNOWN",
			  "an upload not of a ckptd shard: reported, never aborted", age);
		return 0;
	}
	/* Its attempt's work area is in the directory above the checkpoint's
	 * name: while it is there, the work area's gc decides (or the save
	 * is alive). */
	for (dir_end = name_sep - 1; dir_end > key && *dir_end != '/'; dir_end--)
		;
	snprintf(pre, sizeof(pre), "%.*s%s%s", (int)(dir_end > key ? dir_end - key + 1 : 0), key,
		 STORE_WORK_PREFIX, tag);
	if (s3_list(g->bucket, pre, false, first_key, &work, err, sizeof(err)) < 0 && !work) {
		g->report(g->ud, key + g->strip, "FAILED", err, age);
		return 0;
	}
	if (work) {
		g->report(g->ud, key + g->strip, "KEEP",
			  "an unfinished upload of a shard whose save's work area is there (its "
			  "activity decides)", age);
		return 0;
	}
	if (age < g->grace_s) {
		g->report(g->ud, key + g->strip, "KEEP",
			  "an unfinished upload of a shard, within the grace period", age);
		return 0;
	}
	if (!g->dry_run && abort_upload(g->bucket, key, id, err, sizeof(err)) < 0) {
		g->report(g->ud, key + g->strip, "FAILED", err, age);
		return 0;
	}
	g->report(g->ud, key + g->strip, g->dry_run ? "REMOVE" : "REMOVED",
		  "an unfinished upload of a shard whose save is gone (aborted)", age);
	return 0;
}

int store_s3_gc_uploads(const char *root, int64_t grace_s, bool dry_run,
			store_gc_report_fn report, void *ud, char *err, size_t errlen)
{
	char pre[S3_PREFIX_MAX + 2];
	struct up_gc g = { 0 };
	struct s3_loc loc;
	int r;

	if (!g_s3)
		return no_client(err, errlen);
	r = s3_url_parse(root, &loc, err, errlen);
	if (r < 0)
		return r;
	snprintf(pre, sizeof(pre), "%s%s", loc.prefix, loc.prefix[0] ? "/" : "");
	g.bucket = loc.bucket;
	g.strip = strlen(pre);
	g.grace_s = grace_s;
	g.now = (int64_t)time(NULL);
	g.dry_run = dry_run;
	g.report = report;
	g.ud = ud;
	r = uploads_each(loc.bucket, pre, gc_upload, &g, err, errlen);
	return r < 0 ? r : (int)(g.seen > INT32_MAX ? INT32_MAX : g.seen);
}

const struct store_ops store_s3 = {
	.name = "s3",
	.arena_attach = s3a_attach,
	.arena_detach = s3a_detach,
	.arena_fd = s3a_fd,
	.arena_reap = s3a_reap,
	.arena_busy = s3a_busy,
	.set_disk_depth = s3a_set_depth,
	.root_open = s3_root_open,
	.attempt_open = s3_attempt_open,
	.attempt_resume = s3_attempt_resume,
	.shard_create = s3_shard_create,
	.attempt_tag = s3_attempt_tag,
	.shard_write = s3_shard_write,
	.shard_wants_crc = s3_shard_wants_crc,
	.shard_write_crc = store_s3_shard_write_crc,
	.shard_finish = s3_shard_finish,
	.shard_error = s3_shard_error,
	.rank_publish = s3_rank_publish,
	.attempt_claim = s3_attempt_claim,
	.attempt_addressee = s3_attempt_addressee,
	.shard_close = s3_shard_close,
	.attempt_count = s3_attempt_count,
	.attempt_commit = s3_attempt_commit,
	.attempt_poll = s3_attempt_poll,
	.attempt_fail = s3_attempt_fail,
	.attempt_renew = s3_attempt_renew,
	.attempt_close = s3_attempt_close,
	.list = s3_list_root,
	.read_range = s3_read_range,
	.remove = s3_remove,
};
