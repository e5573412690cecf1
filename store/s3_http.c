/* SPDX-License-Identifier: MIT */
/* s3_http.c - S3 requests with libcurl (s3_http.h). */
#include "store/s3_http.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/crc32c.h"
#include "store/s3_digest.h"
#include "store/s3_xml.h"

#define RESP_DEFAULT (64u << 10)
#define UPLOAD_BUFFER (512L << 10)
/* a request's own, its digest and its stored checksum (a PUT), or the
 * checksum mode (a GET) */
#define XFER_HDR_MAX (S3_HDR_MAX + 2)

struct s3_client {
	struct s3_conf conf;
	char sigv4[96];
	char *userpwd;          /* "KEY:SECRET": secret, wiped on free */
	char *token_hdr;        /* "x-amz-security-token: ..." or NULL */
	CURLSH *share;          /* connections and DNS of s3_call()s */
	pthread_mutex_t share_lock[CURL_LOCK_DATA_LAST];

	/* the transport */
	pthread_t th;
	bool th_started;
	pthread_mutex_t lock;
	struct s3_job *q_head, *q_tail; /* submitted, not yet taken */
	bool stop;
	CURLM *multi;

	struct s3_stats st;     /* updated with __atomic builtins */
};

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void stat_add(uint64_t *v, uint64_t n)
{
	__atomic_fetch_add(v, n, __ATOMIC_RELAXED);
}

void s3_where(const char *bucket, const char *key, char *buf, size_t len)
{
	snprintf(buf, len, "s3://%s/%s", bucket, key);
}

/* ---- one HTTP exchange ------------------------------------------------------ */

struct xfer {
	CURL *h;
	struct curl_slist *hdrs;
	const uint8_t *body;
	uint64_t body_len, body_pos;
	char *resp;
	size_t resp_len, resp_cap, max_resp;
	uint8_t *into;           /* the caller's buffer instead of resp */
	bool resp_over;
	bool status_seen;        /* on_write looked at the status */
	char etag[132];
	/* The answer's checksums of the body (s3_digest.h): the value of
	 * S3_SUM_HEADER and of S3_CRC32C_HEADER, "" with the flag set when
	 * one came too long, or twice, to be a checksum of ours. */
	char sum[16], s3sum[80];
	bool has_sum, has_s3sum;
	char date[64];           /* the answer's Date header, as sent */
	char errbuf[CURL_ERROR_SIZE];
};

static size_t on_read(char *dst, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	uint64_t left = x->body_len - x->body_pos;
	size_t want = size * n;

	if (want > left)
		want = (size_t)left;
	memcpy(dst, x->body + x->body_pos, want);
	x->body_pos += want;
	return want;
}

static int on_seek(void *ud, curl_off_t off, int origin)
{
	struct xfer *x = ud;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->body_len)
		return CURL_SEEKFUNC_CANTSEEK;
	x->body_pos = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *src, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;

	/* An error answer's body is S3's XML, not the caller's bytes: it goes
	 * to resp, within the usual limit rather than the caller's length.
	 * curl knows the status before the first body byte. */
	if (x->into && !x->status_seen) {
		long status = 0;

		x->status_seen = true;
		if (curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK &&
		    status >= 300) {
			x->into = NULL;
			x->max_resp = RESP_DEFAULT;
		}
	}
	if (x->resp_len + len > x->max_resp) {
		x->resp_over = true;
		return 0; /* CURLE_WRITE_ERROR */
	}
	if (x->into) {
		memcpy(x->into + x->resp_len, src, len);
		x->resp_len += len;
		return len;
	}
	if (x->resp_len + len + 1 > x->resp_cap) {
		size_t cap = x->resp_cap ? x->resp_cap : 4096;
		while (cap < x->resp_len + len + 1)
			cap *= 2;
		if (cap > x->max_resp + 1)
			cap = x->max_resp + 1;
		char *p = realloc(x->resp, cap);
		if (!p)
			return 0;
		x->resp = p;
		x->resp_cap = cap;
	}
	memcpy(x->resp + x->resp_len, src, len);
	x->resp_len += len;
	x->resp[x->resp_len] = '\0';
	return len;
}

/* If line is header `name`, its value (trimmed) into out (outlen bytes;
 * "" if it does not fit) and true. */
static bool header_value(const char *line, size_t len, const char *name, char *out,
			 size_t outlen)
{
	size_t nl = strlen(name), b = nl + 1, e = len;

	if (len <= nl || line[nl] != ':' || strncasecmp(line, name, nl))
		return false;
	while (b < e && (line[b] == ' ' || line[b] == '\t'))
		b++;
	while (e > b && (line[e - 1] == '\r' || line[e - 1] == '\n' || line[e - 1] == ' ' ||
			 line[e - 1] == '\t'))
		e--;
	if (e - b >= outlen)
		e = b;
	memcpy(out, line + b, e - b);
	out[e - b] = '\0';
	return true;
}

/* A checksum header: kept once; a second one makes it "" (no checksum of
 * ours is ever repeated, so the answer is not one to trust). */
static void sum_header(const char *line, size_t len, const char *name, char *out, size_t outlen,
		       bool *seen)
{
	char v[96];

	/* v fits out: header_value keeps less than the length it is given. */
	if (!header_value(line, len, name, v, outlen < sizeof(v) ? outlen : sizeof(v)))
		return;
	if (*seen)
		v[0] = '\0';
	memcpy(out, v, strlen(v) + 1);
	*seen = true;
}

static size_t on_header(char *line, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;

	/* A new status line (after a 100 Continue) starts the headers over. */
	if (len >= 5 && !strncmp(line, "HTTP/", 5)) {
		x->etag[0] = x->sum[0] = x->s3sum[0] = x->date[0] = '\0';
		x->has_sum = x->has_s3sum = false;
	}
	(void)header_value(line, len, "etag", x->etag, sizeof(x->etag));
	(void)header_value(line, len, "date", x->date, sizeof(x->date));
	sum_header(line, len, S3_SUM_HEADER, x->sum, sizeof(x->sum), &x->has_sum);
	sum_header(line, len, S3_CRC32C_HEADER, x->s3sum, sizeof(x->s3sum), &x->has_s3sum);
	return len;
}

static void xfer_clear(struct xfer *x)
{
	if (x->h)
		curl_easy_cleanup(x->h);
	curl_slist_free_all(x->hdrs);
	free(x->resp);
	memset(x, 0, sizeof(*x));
}

static int add_hdr(struct xfer *x, const char *line)
{
	struct curl_slist *l = curl_slist_append(x->hdrs, line);

	if (!l)
		return -ENOMEM;
	x->hdrs = l;
	return 0;
}

/* Sets up x for one attempt of a request.  `fresh`: a retry, on a new
 * connection (the last one may be what failed). */
static int xfer_setup(struct s3_client *c, struct xfer *x, const char *method, const char *bucket,
		      const char *key, const char *query, const char *const *extra,
		      const void *body, uint64_t body_len, uint64_t range_off, uint64_t range_len,
		      size_t max_resp, bool fresh, bool shared, char *err, size_t errlen)
{
	char url[3 * S3_KEY_MAX + 1024], line[128];
	int r;

	memset(x, 0, sizeof(*x));
	/* Every key is checked here, whatever made it (a listing's answer
	 * included): no empty, "." or ".." segment can name another key. */
	if (key[0] && (r = s3_key_check(key, err, errlen)) < 0)
		return r;
	r = s3_object_url(c->conf.endpoint, c->conf.virtual_host, bucket, key, query, url,
			  sizeof(url), err, errlen);
	if (r < 0) {
		if (r == -ENAMETOOLONG)
			snprintf(err, errlen, "S3 URL of key '%s' is too long", key);
		return r;
	}
	x->h = curl_easy_init();
	if (!x->h)
		return -ENOMEM;
	x->max_resp = max_resp ? max_resp : RESP_DEFAULT;
	x->body = body;
	x->body_len = body_len;
	/* x-amz-content-sha256 on every request: libcurl 7.88 does not add
	 * it and S3 requires it.  The body is protected by its CRC32C. */
	r = add_hdr(x, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
	if (r == 0 && c->token_hdr)
		r = add_hdr(x, c->token_hdr);
	for (size_t i = 0; r == 0 && extra && i < XFER_HDR_MAX && extra[i]; i++)
		r = add_hdr(x, extra[i]);
	if (r == 0 && range_len) {
		snprintf(line, sizeof(line), "Range: bytes=%llu-%llu", (unsigned long long)range_off,
			 (unsigned long long)(range_off + range_len - 1));
		r = add_hdr(x, line);
	}
	if (r < 0)
		return r;

	CURL *h = x->h;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	/* The path is ours, encoded: curl must not squash its segments. */
	curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_AWS_SIGV4, c->sigv4);
	curl_easy_setopt(h, CURLOPT_USERPWD, c->userpwd);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->hdrs);
	curl_easy_setopt(h, CURLOPT_USERAGENT, "ckptd/1");
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->conf.connect_timeout_ms);
	/* A stalled transfer (no byte either way for stall_ms) is a timeout. */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
			 (long)((c->conf.stall_ms + 999) / 1000 ? (c->conf.stall_ms + 999) / 1000 : 1));
	if (fresh)
		curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
	if (shared && c->share)
		curl_easy_setopt(h, CURLOPT_SHARE, c->share);

	if (!strcmp(method, "PUT")) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(h, CURLOPT_READDATA, x);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)body_len);
		curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER);
	} else if (!strcmp(method, "POST")) {
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
	} else if (!strcmp(method, "HEAD")) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (!strcmp(method, "DELETE")) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
	}
	return 0;
}

static enum s3_transport net_of(CURLcode cc)
{
	switch (cc) {
	case CURLE_OK:
		return S3_NET_OK;
	case CURLE_OPERATION_TIMEDOUT:
		return S3_NET_TIMEOUT;
	case CURLE_COULDNT_CONNECT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return S3_NET_RESET;
	case CURLE_PARTIAL_FILE:
		return S3_NET_TRUNCATED;
	default:
		return S3_NET_OTHER;
	}
}

/* What one finished attempt says: its transport outcome, status, and S3's
 * error code and message when the answer is one. */
struct outcome {
	enum s3_transport net;
	long status;
	char code[64];
	char message[256];
	char detail[CURL_ERROR_SIZE + 64];
};

static void judge(struct xfer *x, CURLcode cc, const char *method, struct outcome *o)
{
	memset(o, 0, sizeof(*o));
	o->net = net_of(cc);
	if (cc == CURLE_WRITE_ERROR && x->resp_over) {
		o->net = S3_NET_OTHER;
		snprintf(o->detail, sizeof(o->detail), "response larger than %zu bytes",
			 x->max_resp);
		return;
	}
	if (o->net != S3_NET_OK) {
		snprintf(o->detail, sizeof(o->detail), "%s", x->errbuf[0] ? x->errbuf :
							     curl_easy_strerror(cc));
		return;
	}
	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &o->status);
	/* An error body on a failure status, and on a 200 to anything but a
	 * GET (CompleteMultipartUpload answers 200 with <Error> when it fails
	 * after it began; a GET's body is the object, whatever it holds). */
	s3_answer_error(method, o->status, x->resp, x->resp_len, o->code, sizeof(o->code),
			o->message, sizeof(o->message));
	/* No S3 code (a proxy's or a balancer's answer): the status alone
	 * decides (s3_classify), and describe() says there was none. */
}

static void describe(const char *method, const char *bucket, const char *key,
		     const struct outcome *o, unsigned attempts, char *err, size_t errlen)
{
	char where[S3_KEY_MAX + S3_BUCKET_MAX + 8];

	s3_where(bucket, key, where, sizeof(where));
	if (o->net != S3_NET_OK)
		snprintf(err, errlen, "S3 %s %.300s: %s (after %u attempt%s)", method, where,
			 o->detail, attempts, attempts == 1 ? "" : "s");
	else
		snprintf(err, errlen, "S3 %s %.300s: %ld %s%s%.200s (after %u attempt%s)", method,
			 where, o->status, o->code[0] ? o->code : "(no S3 error code)",
			 o->message[0] ? ": " : "", o->message, attempts, attempts == 1 ? "" : "s");
}

/* ---- s3_call ----------------------------------------------------------------- */

int s3_call(struct s3_client *c, struct s3_req *r, char *err, size_t errlen)
{
	uint64_t seed = (uint64_t)mono_ms() ^ (uint64_t)(uintptr_t)r;
	struct outcome o;
	int res = 0;

	r->resp = NULL;
	r->resp_len = 0;
	r->etag[0] = r->code[0] = r->message[0] = '\0';
	r->date = 0;
	/* Every body goes with a digest S3 checks, so a byte damaged on the
	 * way is refused (BadDigest, retried), never stored: CRC32C on a PUT,
	 * Content-MD5 on a POST (a Complete's x-amz-checksum-* would describe
	 * the object, not the body).  A PUT's CRC32C is also stored with the
	 * object (S3_SUM_HEADER), so that a byte damaged on the way back is
	 * caught as well: a GET checks the body it got against it. */
	const char *hdrs[XFER_HDR_MAX + 1] = { 0 };
	char digest[64], stored[64], why[192];
	bool verify = r->verify != S3_VERIFY_NONE && !strcmp(r->method, "GET") && !r->range_len;
	size_t nh = 0;

	while (nh < S3_HDR_MAX && r->headers[nh]) {
		hdrs[nh] = r->headers[nh];
		nh++;
	}
	if (r->body && !strcmp(r->method, "PUT")) {
		char b64[9];

		s3_crc32c_b64(crc32c(r->body, (size_t)r->body_len, 0), b64);
		snprintf(digest, sizeof(digest), S3_CRC32C_HEADER ": %s", b64);
		snprintf(stored, sizeof(stored), S3_SUM_HEADER ": %s", b64);
		hdrs[nh++] = digest;
		hdrs[nh++] = stored;
	} else if (r->body && !strcmp(r->method, "POST")) {
		s3_content_md5_hdr(r->body, (size_t)r->body_len, digest, sizeof(digest));
		hdrs[nh++] = digest;
	} else if (verify) {
		/* S3's own checksum too, where it keeps one: objects of
		 * earlier versions carry no S3_SUM_HEADER, but S3 kept the
		 * x-amz-checksum-crc32c every ckptd PUT has sent. */
		hdrs[nh++] = "x-amz-checksum-mode: ENABLED";
	}
	for (unsigned attempt = 1;; attempt++) {
		bool bad_sum = false;
		struct xfer x;
		CURLcode cc;

		res = xfer_setup(c, &x, r->method, r->bucket, r->key, r->query, hdrs, r->body,
				 r->body_len, r->range_off, r->range_len, r->max_resp, attempt > 1,
				 true, err, errlen);
		if (res < 0) {
			xfer_clear(&x);
			return res;
		}
		x.into = r->into;
		stat_add(&c->st.requests, 1);
		cc = curl_easy_perform(x.h);
		judge(&x, cc, r->method, &o);
		r->attempts = attempt;
		enum s3_verdict v = s3_classify(o.net, o.status, o.code);
		if (v == S3_DONE && verify) {
			/* A damaged answer is never handed on: asked again, on a
			 * fresh connection, as a 5xx would be. */
			int k = s3_sum_check(r->into ? r->into : x.resp, x.resp_len,
					     x.has_sum ? x.sum : NULL, x.has_s3sum ? x.s3sum : NULL,
					     why, sizeof(why));
			if (k == 0 && r->verify == S3_VERIFY_REQUIRED) {
				snprintf(why, sizeof(why), "checksum mismatch: the answer carries no "
							   "checksum (no %s), and ckptd stores one "
							   "with every such object", S3_SUM_HEADER);
				k = -EBADMSG;
			}
			if (k < 0) {
				bad_sum = true;
				v = S3_RETRY;
			}
		}
		if (v == S3_DONE || v == S3_FAIL || attempt > c->conf.retries) {
			r->status = o.status;
			snprintf(r->code, sizeof(r->code), "%s", o.code);
			snprintf(r->message, sizeof(r->message), "%s", o.message);
			memcpy(r->etag, x.etag, sizeof(r->etag));
			time_t date = x.date[0] ? curl_getdate(x.date, NULL) : -1;
			r->date = date > 0 ? (int64_t)date : 0;
			curl_off_t cl = -1;
			if (curl_easy_getinfo(x.h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) != CURLE_OK ||
			    cl < 0)
				cl = 0;
			r->content_length = (uint64_t)cl;
			if (!strcmp(r->method, "PUT"))
				stat_add(&c->st.bytes_up, r->body_len);
			if (v == S3_DONE && r->range_len && o.status != 206) {
				/* A server that ignored the Range would hand us
				 * other bytes than the ones asked for. */
				snprintf(o.code, sizeof(o.code), "NotPartial");
				snprintf(o.message, sizeof(o.message),
					 "a ranged GET answered %ld, not 206", o.status);
				v = S3_FAIL;
				o.status = 502;
			}
			if (v == S3_DONE) {
				r->resp = x.resp;
				r->resp_len = x.resp_len; /* also what went into `into` */
				stat_add(&c->st.bytes_down, x.resp_len);
				x.resp = NULL;
				res = 0;
			} else if (bad_sum) {
				char where[S3_KEY_MAX + S3_BUCKET_MAX + 8];

				res = -EBADMSG;
				stat_add(&c->st.failures, 1);
				s3_where(r->bucket, r->key, where, sizeof(where));
				snprintf(err, errlen, "S3 GET %.300s: %s (after %u attempt%s)", where,
					 why, attempt, attempt == 1 ? "" : "s");
			} else {
				res = o.net == S3_NET_OTHER && x.resp_over ? -EFBIG :
								s3_errno(o.net, o.status, o.code);
				if (!(res == -ENOENT && r->fail_404_quietly))
					stat_add(&c->st.failures, 1);
				describe(r->method, r->bucket, r->key, &o, attempt, err, errlen);
			}
			xfer_clear(&x);
			return res;
		}
		xfer_clear(&x);
		stat_add(&c->st.retries, 1);
		uint64_t ms = s3_backoff_ms(attempt, c->conf.backoff_base_ms, c->conf.backoff_cap_ms,
					    &seed);
		struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
}

void s3_req_free(struct s3_req *r)
{
	if (!r)
		return;
	free(r->resp);
	r->resp = NULL;
	r->resp_len = 0;
}

/* ---- the transport thread ---------------------------------------------------- */

/* A job's attempt in flight: the xfer lives in the job's rq slot. */
struct flight {
	struct xfer x;
	char crc_hdr[64];
	const char *hdrs[3];
};

static void job_finish(struct s3_client *c, struct s3_job *j, int res)
{
	struct flight *f = j->easy;

	if (f) {
		xfer_clear(&f->x);
		free(f);
		j->easy = NULL;
	}
	j->res = res;
	if (res == 0) {
		stat_add(&c->st.parts_done, 1);
		stat_add(&c->st.bytes_up, j->len);
	} else {
		stat_add(&c->st.failures, 1);
	}
	j->done(j);
}

/* Starts an attempt of j on the multi handle; 0 or -errno (j not started). */
static int job_start(struct s3_client *c, struct s3_job *j)
{
	struct flight *f = calloc(1, sizeof(*f));
	char b64[9];
	int r;

	if (!f)
		return -ENOMEM;
	s3_crc32c_b64(j->crc, b64);
	snprintf(f->crc_hdr, sizeof(f->crc_hdr), "x-amz-checksum-crc32c: %s", b64);
	f->hdrs[0] = f->crc_hdr;
	f->hdrs[1] = j->exclusive ? "If-None-Match: *" : NULL;
	r = xfer_setup(c, &f->x, "PUT", j->bucket, j->key, j->query[0] ? j->query : NULL, f->hdrs,
		       j->buf, j->len, 0, 0, 0, j->attempts > 0, false, j->err, sizeof(j->err));
	if (r < 0) {
		xfer_clear(&f->x);
		free(f);
		return r;
	}
	curl_easy_setopt(f->x.h, CURLOPT_PRIVATE, j);
	if (curl_multi_add_handle(c->multi, f->x.h) != CURLM_OK) {
		xfer_clear(&f->x);
		free(f);
		snprintf(j->err, sizeof(j->err), "curl_multi_add_handle failed");
		return -ENOMEM;
	}
	j->easy = f;
	j->attempts++;
	stat_add(&c->st.requests, 1);
	return 0;
}

/* An attempt of j ended with cc: done, failed, or back into `wait`. */
static void job_ended(struct s3_client *c, struct s3_job *j, CURLcode cc, struct s3_job **wait)
{
	struct flight *f = j->easy;
	struct outcome o;

	curl_multi_remove_handle(c->multi, f->x.h);
	judge(&f->x, cc, "PUT", &o);
	enum s3_verdict v = s3_classify(o.net, o.status, o.code);
	if (v == S3_DONE && !f->x.etag[0]) {
		/* Without the part's ETag the upload cannot be completed. */
		snprintf(o.code, sizeof(o.code), "NoETag");
		snprintf(o.message, sizeof(o.message), "the answer carried no ETag");
		v = S3_FAIL;
	}
	if (v == S3_DONE) {
		memcpy(j->etag, f->x.etag, sizeof(j->etag));
		job_finish(c, j, 0);
		return;
	}
	if (v == S3_RETRY && j->attempts <= c->conf.retries) {
		xfer_clear(&f->x);
		free(f);
		j->easy = NULL;
		stat_add(&c->st.retries, 1);
		j->due_ms = mono_ms() + (int64_t)s3_backoff_ms(j->attempts, c->conf.backoff_base_ms,
							       c->conf.backoff_cap_ms, &j->seed);
		j->next = *wait;
		*wait = j;
		return;
	}
	char what[sizeof(j->err)];
	describe("PUT", j->bucket, j->key, &o, j->attempts, what, sizeof(what));
	snprintf(j->err, sizeof(j->err), "%s", what);
	job_finish(c, j, o.net == S3_NET_OK ? s3_errno(o.net, o.status, o.code) :
					      s3_errno(o.net, 0, NULL));
}

static void start_one(struct s3_client *c, struct s3_job *j, struct s3_job **act,
		      unsigned *active)
{
	int r = job_start(c, j);

	if (r < 0) {
		job_finish(c, j, r);
		return;
	}
	j->next = *act;
	*act = j;
	(*active)++;
}

static void *transport_main(void *arg)
{
	struct s3_client *c = arg;
	/* Lists through j->next: queued here (FIFO), waiting for a retry's
	 * time, and in flight on the multi handle. */
	struct s3_job *pend_head = NULL, *pend_tail = NULL, *wait = NULL, *act = NULL;
	unsigned active = 0, queued = 0;

	for (;;) {
		struct s3_job *in;
		bool stop;

		pthread_mutex_lock(&c->lock);
		in = c->q_head;
		c->q_head = c->q_tail = NULL;
		stop = c->stop;
		pthread_mutex_unlock(&c->lock);
		/* The CRC32C goes in the part's header, so it is computed before
		 * the part starts, here rather than on the daemon's loop. */
		for (struct s3_job *j = in, *nx; j; j = nx) {
			nx = j->next;
			j->next = NULL;
			if (!j->crc_given)
				j->crc = crc32c(j->buf, j->len, 0);
			j->seed = (uint64_t)(uintptr_t)j ^ ((uint64_t)mono_ms() << 20);
			if (pend_tail)
				pend_tail->next = j;
			else
				pend_head = j;
			pend_tail = j;
			queued++;
		}
		if (stop)
			break;

		/* Retries whose wait is over go first, then new jobs. */
		int64_t now = mono_ms(), next_due = now + 1000;
		for (struct s3_job **pp = &wait; *pp && active < c->conf.parts_in_flight;) {
			struct s3_job *j = *pp;
			if (j->due_ms > now) {
				if (j->due_ms < next_due)
					next_due = j->due_ms;
				pp = &j->next;
				continue;
			}
			*pp = j->next;
			j->next = NULL;
			start_one(c, j, &act, &active);
		}
		while (pend_head && active < c->conf.parts_in_flight) {
			struct s3_job *j = pend_head;
			pend_head = j->next;
			if (!pend_head)
				pend_tail = NULL;
			queued--;
			start_one(c, j, &act, &active);
		}
		__atomic_store_n(&c->st.in_flight, active, __ATOMIC_RELAXED);
		__atomic_store_n(&c->st.queued, queued, __ATOMIC_RELAXED);

		int running = 0, left;
		CURLMsg *m;
		curl_multi_perform(c->multi, &running);
		while ((m = curl_multi_info_read(c->multi, &left))) {
			struct s3_job *j = NULL;
			if (m->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
			for (struct s3_job **pp = &act; *pp; pp = &(*pp)->next)
				if (*pp == j) {
					*pp = j->next;
					break;
				}
			j->next = NULL;
			active--;
			job_ended(c, j, m->data.result, &wait);
		}
		if (wait && active < c->conf.parts_in_flight) {
			for (struct s3_job *j = wait; j; j = j->next)
				if (j->due_ms < next_due)
					next_due = j->due_ms;
		}
		now = mono_ms();
		int timeout = next_due > now ? (int)(next_due - now) : 0;
		if (timeout > 1000)
			timeout = 1000;
		if (pend_head && active < c->conf.parts_in_flight)
			timeout = 0; /* a finished part made room */
		/* Returns at once if the queue was fed meanwhile: s3_submit()
		 * wakes it. */
		curl_multi_poll(c->multi, NULL, 0, timeout, NULL);
	}

	/* Stopping: nothing new starts, and nothing waits for the network:
	 * what is in flight, waiting or queued fails. */
	for (struct s3_job *j = act, *nx; j; j = nx) {
		struct flight *f = j->easy;
		nx = j->next;
		curl_multi_remove_handle(c->multi, f->x.h);
		snprintf(j->err, sizeof(j->err), "the S3 transport stopped");
		job_finish(c, j, -ECANCELED);
	}
	for (struct s3_job *j = wait, *nx; j; j = nx) {
		nx = j->next;
		snprintf(j->err, sizeof(j->err), "the S3 transport stopped");
		job_finish(c, j, -ECANCELED);
	}
	for (struct s3_job *j = pend_head, *nx; j; j = nx) {
		nx = j->next;
		snprintf(j->err, sizeof(j->err), "the S3 transport stopped");
		job_finish(c, j, -ECANCELED);
	}
	return NULL;
}

void s3_submit(struct s3_client *c, struct s3_job *j)
{
	j->next = NULL;
	j->res = 0;
	j->attempts = 0;
	j->easy = NULL;
	j->err[0] = j->etag[0] = '\0';
	pthread_mutex_lock(&c->lock);
	if (c->q_tail)
		c->q_tail->next = j;
	else
		c->q_head = j;
	c->q_tail = j;
	pthread_mutex_unlock(&c->lock);
	curl_multi_wakeup(c->multi);
}

/* ---- the client ---------------------------------------------------------------- */

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *ud)
{
	struct s3_client *c = ud;
	(void)h;
	(void)a;
	pthread_mutex_lock(&c->share_lock[d]);
}

static void share_unlock(CURL *h, curl_lock_data d, void *ud)
{
	struct s3_client *c = ud;
	(void)h;
	pthread_mutex_unlock(&c->share_lock[d]);
}

static void wipe_free(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

int s3_client_new(const struct s3_conf *conf, struct s3_client **ret, char *err, size_t errlen)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	struct s3_client *c;
	char probe[64];
	int r;

	pthread_once(&once, curl_init_once);
	if (!conf->endpoint[0] || !conf->region[0]) {
		snprintf(err, errlen, "S3 needs an endpoint and a region");
		return -EINVAL;
	}
	if (!conf->creds.key_id[0] || !conf->creds.secret[0]) {
		snprintf(err, errlen, "no S3 credentials: set AWS_ACCESS_KEY_ID and "
				      "AWS_SECRET_ACCESS_KEY, or name a credentials file");
		return -EINVAL;
	}
	/* The endpoint must make a URL (scheme, host, no path). */
	r = s3_object_url(conf->endpoint, conf->virtual_host, "bucket", "", NULL, probe,
			  sizeof(probe), err, errlen);
	if (r < 0 && r != -ENAMETOOLONG)
		return r;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->conf = *conf;
	if (c->conf.parts_in_flight == 0)
		c->conf.parts_in_flight = 1;
	snprintf(c->sigv4, sizeof(c->sigv4), "aws:amz:%s:s3", conf->region);
	size_t ul = strlen(conf->creds.key_id) + strlen(conf->creds.secret) + 2;
	c->userpwd = malloc(ul);
	if (!c->userpwd)
		goto nomem;
	snprintf(c->userpwd, ul, "%s:%s", conf->creds.key_id, conf->creds.secret);
	if (conf->creds.token[0]) {
		size_t tl = strlen(conf->creds.token) + 32;
		c->token_hdr = malloc(tl);
		if (!c->token_hdr)
			goto nomem;
		snprintf(c->token_hdr, tl, "x-amz-security-token: %s", conf->creds.token);
	}
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&c->share_lock[i], NULL);
	pthread_mutex_init(&c->lock, NULL);
	c->share = curl_share_init();
	c->multi = curl_multi_init();
	if (!c->share || !c->multi)
		goto nomem;
	curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
	curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
	curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)c->conf.parts_in_flight);
	curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)c->conf.parts_in_flight);
	r = pthread_create(&c->th, NULL, transport_main, c);
	if (r) {
		snprintf(err, errlen, "cannot start the S3 transport thread: %s", strerror(r));
		s3_client_free(c);
		return -r;
	}
	c->th_started = true;
	explicit_bzero(c->conf.creds.secret, sizeof(c->conf.creds.secret));
	explicit_bzero(c->conf.creds.token, sizeof(c->conf.creds.token));
	*ret = c;
	return 0;

nomem:
	s3_client_free(c);
	return -ENOMEM;
}

void s3_client_free(struct s3_client *c)
{
	if (!c)
		return;
	if (c->th_started) {
		pthread_mutex_lock(&c->lock);
		c->stop = true;
		pthread_mutex_unlock(&c->lock);
		curl_multi_wakeup(c->multi);
		pthread_join(c->th, NULL);
	}
	if (c->multi)
		curl_multi_cleanup(c->multi);
	if (c->share)
		curl_share_cleanup(c->share);
	wipe_free(c->userpwd);
	wipe_free(c->token_hdr);
	s3_creds_wipe(&c->conf.creds);
	free(c);
}

const struct s3_conf *s3_client_conf(const struct s3_client *c)
{
	return &c->conf;
}

void s3_client_stats(const struct s3_client *c, struct s3_stats *ret)
{
	ret->requests = __atomic_load_n(&c->st.requests, __ATOMIC_RELAXED);
	ret->retries = __atomic_load_n(&c->st.retries, __ATOMIC_RELAXED);
	ret->failures = __atomic_load_n(&c->st.failures, __ATOMIC_RELAXED);
	ret->bytes_up = __atomic_load_n(&c->st.bytes_up, __ATOMIC_RELAXED);
	ret->bytes_down = __atomic_load_n(&c->st.bytes_down, __ATOMIC_RELAXED);
	ret->parts_done = __atomic_load_n(&c->st.parts_done, __ATOMIC_RELAXED);
	ret->in_flight = __atomic_load_n(&c->st.in_flight, __ATOMIC_RELAXED);
	ret->queued = __atomic_load_n(&c->st.queued, __ATOMIC_RELAXED);
}
