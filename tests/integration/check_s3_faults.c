/* SPDX-License-Identifier: MIT */
/*
 * check_s3_faults.c - integration: saves to S3 through a proxy that injects
 * faults (tests/tools/s3_proxy.py between two ckptds and moto).
 *
 * Run by tests/integration/s3_faults.sh, which starts moto and the proxy
 * and sets S3_ENDPOINT (moto itself), CKPT_TEST_S3_PROXY (the proxy),
 * CKPT_TEST_S3_ROOT, CKPT_TEST_FAULTS (how many faults the campaign must
 * inject) and the AWS_* credentials; without them it SKIPs.
 *
 *   campaign   Two ranks on two daemons that share nothing but the bucket
 *              save one checkpoint after another while the proxy fails a
 *              fifth of all requests (500, 503 SlowDown, resets before and
 *              after the answer began, stalls, truncated answers, a byte
 *              flipped in a request body, a Complete that answers 200 with
 *              an error), until CKPT_TEST_FAULTS faults were injected.
 *              Every save must either commit, and then read back from moto
 *              directly (not through the proxy) with every byte equal to
 *              what the ranks held and every CRC checked, or fail on both
 *              ranks with no manifest.  No flipped byte may be forwarded.
 *   budget     Every part answered 503 SlowDown: the save outlasts the retry
 *              budget and fails on both ranks with the S3 code in the
 *              message, no manifest, and the upload's abort sent (seen in
 *              the proxy's log).  Then, faults off, the next save commits.
 *   spill      The spill tier (s3_spill_dir on both daemons) while the proxy
 *              holds every UploadPart: both ranks report staged and durable,
 *              no commit yet, the shards whole in the spill directories,
 *              `ckptctl status` says uploading / local_durable / no arena
 *              slot held.  Released, the save commits, reads back from moto,
 *              and each node's restore cache equals the S3 object byte for
 *              byte, with no work area left.
 *   spill_torn As spill, but once the first parts were checked and handed
 *              to S3 a byte changes in each spilled file: S3 refuses the
 *              parts (BadDigest: their CRC32C is of the bytes checked) or
 *              the check finds it; the save fails, no manifest, no spill
 *              area and nothing cached.
 *   answer_index  The proxy damages the answer (not the stored object) to
 *              rank 0's daemon's GET of rank 1's index: one digit of its
 *              JSON changed, so that only a checksum can tell.  Once (the
 *              GET the merge makes): the save commits, reads back whole and
 *              `ckptctl verify` passes (the GET was asked again).  Every
 *              time: the save fails on both ranks, rank 0's message says
 *              "checksum mismatch", no manifest is written, and a checkpoint
 *              saved before in the same root still reads back and verifies.
 *   answer_manifest  The same for a load: the reader (ckpt_reader_open and
 *              `ckptctl verify`, through the proxy here) gets the manifest
 *              with a digit changed.  Once: it opens and every tensor reads
 *              back right; every time: it refuses (-EBADMSG, "checksum
 *              mismatch"; ckptctl exits 1), and opens again once the
 *              answers are whole.
 *
 * Leftovers and gc (each under s3://BUCKET/s3gc/<case>, outside the audited
 * prefix; the bucket is read back with boto3 from moto itself):
 *   gc_live    A save whose manifest PUT the proxy holds, with its work area
 *              created longer ago than gc's --grace: `ckptctl gc --grace 10s`
 *              keeps the work area (its daemons' heartbeats are fresh) and
 *              every shard; released, the save commits and reads back whole.
 *   commit_gone  Rank 1's index PUT held; rank 0's finished shard deleted
 *              meanwhile: the commit fails on both ranks naming the shard,
 *              and no manifest is written.
 *   lost_create  The first CreateMultipartUpload is forwarded but its
 *              answer dropped (libcurl then sends it again by itself): the
 *              save commits and no upload is left open.
 *   crash_sweep  kill -9 of ckptd while its manifest PUT is held (the shard
 *              whole in S3): gc past its grace says the attempt is dead; the
 *              restarted daemon's sweep removes its shard and work area,
 *              never a committed checkpoint's objects or another attempt's.
 *   cleanup_retry  A save that fails while S3 refuses parts, aborts,
 *              deletes and reads: its cleanup fails; once S3 answers
 *              again, the periodic sweep aborts the upload and removes the
 *              work area.
 *
 * The spill tier's promise (daemon/save.h: a spilled save is owed a
 * commit), each with one daemon and a one-rank save (whole on the node),
 * the trainer killed (-9) once durable, under a root of its own beside the
 * campaign's (s3://bucket/durable/CASE):
 *   durable_outage   S3 answers 503 to everything for longer than every
 *              retry budget and the commit deadline: the save stays
 *              pending (`ckptctl spill list` shows S3's error), its spilled
 *              copy and records stay; S3 back, it commits, reads back and
 *              `ckptctl verify` passes, and the copy and records go.
 *   durable_restart  kill -9 of ckptd while the upload is on its way, then
 *              SIGTERM while S3 is down (a prompt, clean exit): each next
 *              life resumes the save and commits it.
 *   durable_drop     another user's `ckptctl spill drop` is refused (as root
 *              only: the ranks run as other uids); the owner's drops it:
 *              copy and records gone, never committed.
 *   durable_retrain  a restarted trainer saves the same key while the
 *              earlier attempt is pending: told -EALREADY with why, and
 *              the earlier one commits; after an attempt was dropped while
 *              S3 was down (its work area and rank marker left in S3), the
 *              retry commits.
 *   durable_two      two ranks on two daemons, both killed (-9) while S3 is
 *              down and started again: the save commits.
 *   durable_delivered  rank 1's daemon delivered its index, rank 0's parts
 *              were held; both daemons killed (-9) and started again: rank
 *              1 is not sent again (the store has it whole), its index goes
 *              to the new claim, and the save commits.
 *   durable_gone     the shard is deleted from S3 after its upload and
 *              before the commit: the commit says so and the node's copy
 *              is sent again; the save commits.
 *
 * It prints "campaign: faults=N ... commits_verified=C failures_clean=F";
 * s3_faults.sh then lists the bucket with boto3: one manifest per commit,
 * no work area, no open upload, no object outside a committed checkpoint
 * (under durable/ too, but for durable_drop's prefix: a save dropped
 * while S3 is down leaves its work area there).
 */
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define ROWS 5120ull     /* per rank: 5120 x 1024 F32 = 20 MiB, three parts */
#define COLS 1024ull
#define SEED_BASE 70000u

/* ---- the proxy's control API ---- */

struct body {
	char *p;
	size_t len;
};

static size_t on_body(char *src, size_t size, size_t n, void *ud)
{
	struct body *b = ud;
	size_t add = size * n;
	char *p = realloc(b->p, b->len + add + 1);

	if (!p)
		return 0;
	memcpy(p + b->len, src, add);
	b->p = p;
	b->len += add;
	p[b->len] = '\0';
	return add;
}

/* GET (post == NULL) or POST `post` to the proxy's `path`; the JSON answer. */
static json_t *proxy_call(const char *path, const char *post)
{
	const char *base = getenv("CKPT_TEST_S3_PROXY");
	char url[512];
	struct body b = { 0 };
	long status = 0;
	json_error_t je;
	json_t *j;
	CURL *h = curl_easy_init();

	ck_assert_ptr_nonnull(h);
	snprintf(url, sizeof(url), "%s%s", base, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	if (post)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, post);
	CURLcode cc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(h);
	ck_assert_msg(cc == CURLE_OK && status == 200, "proxy %s: curl %d, HTTP %ld: %s", path,
		      (int)cc, status, b.p ? b.p : "");
	j = json_loads(b.p ? b.p : "", 0, &je);
	ck_assert_msg(j != NULL, "proxy %s: not JSON (%s): %s", path, je.text, b.p ? b.p : "");
	free(b.p);
	return j;
}

static void proxy_config(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void proxy_config(const char *fmt, ...)
{
	char body[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	json_decref(proxy_call("/__proxy/config", body));
}

static uint64_t jnum(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* The random faults injected (fail_all's outages are counted apart). */
static uint64_t faults_total(const json_t *st)
{
	const char *k;
	json_t *v;
	uint64_t n = 0;

	json_object_foreach(json_object_get(st, "faults"), k, v)
		if (strcmp(k, "fail_all"))
			n += (uint64_t)json_integer_value(v);
	return n;
}

/* ---- one rank of one save ---- */

struct rank_args {
	const char *sock, *root, *name;
	const char *job;  /* NULL: "faults" */
	uint32_t rank;
	uint32_t world;   /* 0: 2 */
	uid_t uid;        /* not 0: the rank runs as this uid (and gid) */
	uint64_t seed;
	bool steps;  /* report "staged" and "durable" before "result" */
};

static uint32_t world_of(const struct rank_args *a)
{
	return a->world ? a->world : 2;
}

static void rank_shape(uint32_t rank, uint32_t world, uint64_t g[2], uint64_t o[2],
		       uint64_t sh[2])
{
	g[0] = world * ROWS;
	g[1] = COLS;
	o[0] = rank * ROWS;
	o[1] = 0;
	sh[0] = ROWS;
	sh[1] = COLS;
}

/* Saves "w" (its rows of it) and a small tensor of its own; reports
 * "result RC MSG" once the committed future is done. */
static int rank_main(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	uint64_t g[2], o[2], sh[2], small = 4099;
	char tname[32];
	struct ckpt_client *c = NULL;
	struct ckpt_save *s = NULL;
	char msg[1024];
	int st = 0, cm = 0, rc;
	float *w;
	uint8_t *x;

	(void)go;
	if (a->uid && (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0)) {
		td_report(rep, "result %d cannot become uid %u", -errno, (unsigned)a->uid);
		return 9;
	}
	rank_shape(a->rank, world_of(a), g, o, sh);
	w = malloc(ROWS * COLS * sizeof(float));
	x = malloc(small);
	if (!w || !x)
		return 10;
	td_fill_chunk(w, sizeof(float), 2, g, o, sh, a->seed);
	td_fill(x, small, a->seed + 1 + a->rank, 0);
	rc = td_connect_rc(a->sock, a->job ? a->job : "faults", a->rank, world_of(a), 64 * MiB,
			   &c);
	if (rc < 0) {
		td_report(rep, "result %d connect: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, a->seed, &s);
	if (rc < 0) {
		td_report(rep, "result %d begin: %s", rc, ckpt_last_error());
		return 12;
	}
	struct ckpt_tensor tw = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 2,
				  .shape = sh, .data = w, .device = CKPT_DEVICE_HOST,
				  .global_shape = g, .offsets = o };
	snprintf(tname, sizeof(tname), "rank%u.x", a->rank);
	struct ckpt_tensor tx = { CKPT_TENSOR_INIT, .name = tname, .dtype = CKPT_U8, .ndim = 1,
				  .shape = &small, .data = x, .device = CKPT_DEVICE_HOST };
	rc = ckpt_save_add_tensor(s, &tw);
	if (rc == 0)
		rc = ckpt_save_add_tensor(s, &tx);
	if (rc < 0) {
		td_report(rep, "result %d add: %s", rc, ckpt_last_error());
		return 13;
	}
	if (a->steps) {
		struct ckpt_future *fs = NULL, *fc = NULL, *fd;

		rc = ckpt_save_commit(s, &fs, &fc);
		if (rc < 0) {
			td_report(rep, "result %d commit: %s", rc, ckpt_last_error());
			goto out;
		}
		st = ckpt_future_wait(fs, 120000);
		td_report(rep, "staged %d %s", st, ckpt_future_error(fs));
		fd = ckpt_save_durable(s);
		rc = fd ? ckpt_future_wait(fd, 120000) : -EFAULT;
		td_report(rep, "durable %d %s", rc, fd ? ckpt_future_error(fd) : "no future");
		cm = ckpt_future_wait(fc, 240000);
		td_report(rep, "result %d %s", cm, ckpt_future_error(fc));
		goto out;
	}
	rc = td_commit_wait(s, 240000, &st, &cm, msg, sizeof(msg));
	if (rc < 0)
		td_report(rep, "result %d commit: %s", rc, ckpt_last_error());
	else
		td_report(rep, "result %d %s", st < 0 ? st : cm, msg);
out:
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(w);
	free(x);
	return 0;
}

/* Runs one save of both ranks; returns its result (0 committed, else the
 * shared -errno) and each rank's result line ("RC MESSAGE").  Both ranks
 * must agree. */
static int save_ranks(struct testd *t, const char *root, const char *name, uint64_t seed,
		      char line[2][1024])
{
	struct td_child ch[2];
	struct rank_args a[2];
	int res[2];

	for (uint32_t r = 0; r < 2; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(t, (int)r), .root = root,
					   .name = name, .rank = r, .seed = seed };
		ck_assert_int_eq(td_child_start(&ch[r], rank_main, &a[r]), 0);
	}
	for (uint32_t r = 0; r < 2; r++) {
		int rc = td_child_expect(&ch[r], "result", 300000, line[r], sizeof(line[r]));

		ck_assert_msg(rc == 0, "%s: rank %u gave no result (%d); it said:\n%s", name, r,
			      rc, ch[r].out);
		res[r] = atoi(line[r]);
		int st = td_child_wait(&ch[r], 30000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "%s: rank %u: %s; it said:\n%s", name, r, td_status_str(st),
			      ch[r].out);
	}
	ck_assert_msg((res[0] == 0) == (res[1] == 0),
		      "%s: the ranks disagree on the outcome:\n  rank 0: %s\n  rank 1: %s", name,
		      line[0], line[1]);
	return res[0];
}

/* save_ranks, with the message of rank 0 if the save failed, else rank 1's. */
static int save_once(struct testd *t, const char *root, const char *name, uint64_t seed,
		     char *msg, size_t msglen)
{
	char line[2][1024];
	int res = save_ranks(t, root, name, seed, line);

	snprintf(msg, msglen, "%s", res ? line[0] : line[1]);
	return res;
}

/* Reads checkpoint `name` (of `world` ranks) back from moto itself and
 * compares every byte. */
static void verify_commit_world(const char *root, const char *name, uint64_t seed,
				uint32_t world)
{
	char url[1024];
	struct ckpt_reader *r = NULL;
	uint64_t g[2], o[2], sh[2], small = 4099;
	int rc;

	snprintf(url, sizeof(url), "%s/%s", root, name);
	rc = ckpt_reader_open(url, &r);
	ck_assert_msg(rc == 0, "%s committed but does not open: %d: %s", url, rc,
		      ckpt_last_error());
	ck_assert_uint_eq(ckpt_reader_world(r), world);
	ck_assert_uint_eq(ckpt_reader_step(r), seed);
	ck_assert_int_eq(ckpt_reader_tensor_count(r), (int)world + 1);
	rank_shape(0, world, g, o, sh);
	ck_assert_msg(td_verify_tensor(r, "w", CKPT_F32, 2, g, seed),
		      "%s: tensor w differs (see above)", url);
	for (uint32_t k = 0; k < world; k++) {
		char tname[32];
		uint8_t *x = malloc(small);

		snprintf(tname, sizeof(tname), "rank%u.x", k);
		ck_assert_ptr_nonnull(x);
		rc = ckpt_reader_read_tensor(r, tname, x, small);
		ck_assert_msg(rc == 0, "%s: %s: %d: %s", url, tname, rc, ckpt_last_error());
		ck_assert_msg(td_check(x, small, seed + 1 + k, 0) < 0, "%s: %s differs", url,
			      tname);
		free(x);
	}
	ckpt_reader_close(r);
}

static void verify_commit(const char *root, const char *name, uint64_t seed)
{
	verify_commit_world(root, name, seed, 2);
}

/* A failed save left no manifest: the reader finds no checkpoint. */
static void verify_no_commit(const char *root, const char *name)
{
	char url[1024];
	struct ckpt_reader *r = NULL;
	int rc;

	snprintf(url, sizeof(url), "%s/%s", root, name);
	rc = ckpt_reader_open(url, &r);
	ck_assert_msg(rc == -ENOENT, "%s failed, yet opening it gives %d (%s)", url, rc,
		      rc == 0 ? "it opened" : ckpt_last_error());
}

static void start_daemons(struct testd *t, const char *root)
{
	char conf[2048];

	/* Short backoffs and a 1 s stall limit keep the campaign brisk;
	 * 10 retries make a fifth of requests failing survivable
	 * (0.2^11 per request). */
	snprintf(conf, sizeof(conf),
		 "arena_max = 64M\ncommit_deadline = 240s\nroot = %s\ns3_endpoint = %s\n"
		 "s3_retries = 10\ns3_backoff_base = 10ms\ns3_backoff_cap = 200ms\n"
		 "s3_stall_timeout = 1s\ns3_connect_timeout = 2s\ns3_parts_in_flight = 4\n",
		 root, getenv("CKPT_TEST_S3_PROXY"));
	ck_assert_int_eq(td_daemon_start(t, 0, conf), 0);
	ck_assert_int_eq(td_daemon_start(t, 1, conf), 0);
}

static bool have_env(void)
{
	return getenv("CKPT_TEST_S3_ROOT") && getenv("CKPT_TEST_S3_PROXY") &&
	       getenv("S3_ENDPOINT") && getenv("AWS_ENDPOINT_URL_S3");
}

START_TEST(test_campaign)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	const char *tf = getenv("CKPT_TEST_FAULTS");
	uint64_t target = tf ? strtoull(tf, NULL, 10) : 200, faults = 0;
	unsigned saves = 0, verified = 0, clean = 0, outages = 0;
	char root[1024], name[32], msg[1024];
	struct testd t;
	json_t *st;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	ck_assert_uint_ge(target, 1);
	td_init(&t, "s3_campaign");
	snprintf(root, sizeof(root), "%s/campaign", base);
	start_daemons(&t, root);
	proxy_config("{\"reset\": true, \"rate\": 0.2, \"faults\": \"all\", "
		     "\"fault_methods\": \"all\", \"fault_kinds\": \"all\", \"stall_s\": 3}");
	/* Bounded: a save makes ~80 requests, a fifth of them faulted. */
	for (unsigned i = 0; faults < target && i < 4 * target + 20; i++) {
		/* Every fourth save also meets an outage of one step that
		 * outlasts the retry budget, on top of the random faults: it
		 * must fail cleanly whichever step it is. */
		static const char *const outage[] = { "create", "part", "complete" };
		const char *down = i % 4 == 3 ? outage[(i / 4) % 3] : NULL;
		uint64_t seed = SEED_BASE + i;
		int res;

		snprintf(name, sizeof(name), "f-%05u", i);
		if (down)
			proxy_config("{\"fail_all\": true, \"fault_kinds\": \"%s\"}", down);
		res = save_once(&t, root, name, seed, msg, sizeof(msg));
		if (down)
			proxy_config("{\"fail_all\": false, \"fault_kinds\": \"all\"}");
		saves++;
		if (down && res == 0)
			ck_abort_msg("%s committed through an outage of every %s request", name, down);
		if (down)
			outages++;
		if (res == 0) {
			verify_commit(root, name, seed);
			verified++;
		} else {
			verify_no_commit(root, name);
			clean++;
			printf("campaign: %s failed cleanly: %s\n", name, msg);
		}
		st = proxy_call("/__proxy/stats", NULL);
		faults = faults_total(st);
		ck_assert_msg(jnum(st, "flip_missed") == 0, "a flipped byte was forwarded");
		json_decref(st);
	}
	st = proxy_call("/__proxy/stats", NULL);
	char *kinds = json_dumps(json_object_get(st, "faults"), JSON_COMPACT | JSON_SORT_KEYS);
	printf("campaign: faults=%llu saves=%u commits_verified=%u failures_clean=%u "
	       "(outages %u) requests=%llu flips_caught=%llu flips_missed=%llu baddigest=%llu "
	       "by kind %s\n",
	       (unsigned long long)faults, saves, verified, clean, outages,
	       (unsigned long long)jnum(st, "requests"), (unsigned long long)jnum(st, "flip_caught"),
	       (unsigned long long)jnum(st, "flip_missed"), (unsigned long long)jnum(st, "baddigest"),
	       kinds ? kinds : "?");
	fflush(stdout);
	free(kinds);
	ck_assert_msg(faults >= target, "only %llu faults injected in %u saves (want %llu)",
		      (unsigned long long)faults, saves, (unsigned long long)target);
	ck_assert_msg(jnum(st, "flip_caught") > 0, "no flipped byte was injected and caught");
	ck_assert_uint_eq(jnum(st, "flip_missed"), 0);
	ck_assert_uint_eq(jnum(st, "invalid"), 0);
	/* Random faults are rare enough that every save without an outage
	 * must survive them. */
	ck_assert_msg(verified == saves - outages, "%u of %u saves without an outage failed",
		      saves - outages - verified, saves - outages);
	ck_assert_uint_eq(clean, outages);
	json_decref(st);
	proxy_config("{\"rate\": 0}");
	td_fini(&t);
}
END_TEST

START_TEST(test_budget)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	char root[1024], msg[1024];
	struct testd t;
	json_t *log;
	size_t i;
	json_t *e;
	bool abort_sent = false;
	int res;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_budget");
	snprintf(root, sizeof(root), "%s/budget", base);
	start_daemons(&t, root);
	/* Every UploadPart is 503 SlowDown for good; the rest passes. */
	proxy_config("{\"reset\": true, \"rate\": 0, \"fail_all\": true, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\"}");
	res = save_once(&t, root, "over-budget", SEED_BASE, msg, sizeof(msg));
	proxy_config("{\"fail_all\": false, \"fault_kinds\": \"all\"}");
	ck_assert_msg(res < 0, "a save whose every PUT failed committed");
	ck_assert_msg(strstr(msg, "SlowDown") || strstr(msg, "503"),
		      "the failure does not give S3's answer: %s", msg);
	printf("budget: the save failed: %s\n", msg);
	verify_no_commit(root, "over-budget");

	/* The abort went out for the upload begun (the parts are PUTs). */
	log = proxy_call("/__proxy/log", NULL);
	json_array_foreach(log, i, e) {
		const char *m = json_string_value(json_object_get(e, "method"));
		const char *p = json_string_value(json_object_get(e, "path"));

		if (m && p && !strcmp(m, "DELETE") && strstr(p, "uploadId="))
			abort_sent = true;
	}
	json_decref(log);
	ck_assert_msg(abort_sent, "no AbortMultipartUpload was sent");

	/* The daemons are fine afterwards: the next save commits. */
	res = save_once(&t, root, "after", SEED_BASE + 1, msg, sizeof(msg));
	ck_assert_msg(res == 0, "the save after the outage failed: %s", msg);
	verify_commit(root, "after", SEED_BASE + 1);
	td_fini(&t);
}
END_TEST


/* ---- the spill tier ---- */

/* The one entry of directory `dir` whose name starts with `prefix` into
 * out (dir/name); false if there is none. */
static bool one_entry(const char *dir, const char *prefix, char *out, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool found = false;

	if (!d)
		return false;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, "..")))
			continue;
		if (!strncmp(e->d_name, prefix, strlen(prefix))) {
			snprintf(out, len, "%s/%s", dir, e->d_name);
			found = true;
			break;
		}
	}
	closedir(d);
	return found;
}

/* Entries of dir but . and .. (-1 if it cannot be read). */
static int entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static void spill_dir(const struct testd *t, int idx, const char *sub, char *out, size_t len)
{
	snprintf(out, len, "%s/spill%d/%u%s%s", t->dir, idx, (unsigned)getuid(), sub[0] ? "/" : "",
		 sub);
}

/* Two daemons with a spill directory each; a long stall limit, since the
 * proxy holds parts on purpose. */
static void start_spill_daemons(struct testd *t, const char *root)
{
	char conf[2048];

	for (int i = 0; i < 2; i++) {
		snprintf(conf, sizeof(conf),
			 "arena_max = 64M\ncommit_deadline = 240s\nroot = %s\ns3_endpoint = %s\n"
			 "s3_retries = 3\ns3_backoff_base = 10ms\ns3_backoff_cap = 100ms\n"
			 "s3_stall_timeout = 120s\ns3_parts_in_flight = 4\n"
			 "s3_spill_dir = %s/spill%d\ns3_spill_retry_cap = 200ms\n",
			 root, getenv("CKPT_TEST_S3_PROXY"), t->dir, i);
		ck_assert_int_eq(td_daemon_start(t, i, conf), 0);
	}
}

/* GET of an object from moto itself (signed as S3 wants), whole. */
static struct body s3_get(const char *bucket_key)
{
	const char *ep = getenv("S3_ENDPOINT"), *ak = getenv("AWS_ACCESS_KEY_ID");
	const char *sk = getenv("AWS_SECRET_ACCESS_KEY"), *reg = getenv("AWS_REGION");
	char url[2048], sig[128], up[512];
	struct body b = { 0 };
	long status = 0;
	CURL *h = curl_easy_init();

	ck_assert_ptr_nonnull(h);
	ck_assert_msg(ep && ak && sk, "no S3 endpoint or credentials in the environment");
	ck_assert(strlen(ep) + strlen(bucket_key) + 2 <= sizeof(url));
	snprintf(url, sizeof(url), "%s/%s", ep, bucket_key);
	snprintf(sig, sizeof(sig), "aws:amz:%s:s3", reg && reg[0] ? reg : "us-east-1");
	snprintf(up, sizeof(up), "%s:%s", ak, sk);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sig);
	curl_easy_setopt(h, CURLOPT_USERPWD, up);
	/* curl 7.88 does not add it; S3 wants it (shared notes). */
	struct curl_slist *hd = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	CURLcode cc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(h);
	curl_slist_free_all(hd);
	ck_assert_msg(cc == CURLE_OK && status == 200, "GET %s: curl %d, HTTP %ld", url, (int)cc,
		      status);
	return b;
}

static bool file_equals(const char *path, const struct body *b)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *buf;
	bool same;

	if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size != b->len) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	buf = malloc(b->len ? b->len : 1);
	same = buf && read(fd, buf, b->len) == (ssize_t)b->len && !memcmp(buf, b->p, b->len);
	free(buf);
	close(fd);
	return same;
}

/* Starts both ranks of a save that reports its steps. */
static void spill_start(struct testd *t, struct td_child ch[2], struct rank_args a[2],
			const char *root, const char *name, uint64_t seed)
{
	for (uint32_t r = 0; r < 2; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(t, (int)r), .root = root, .name = name,
					   .rank = r, .seed = seed, .steps = true };
		ck_assert_int_eq(td_child_start(&ch[r], rank_main, &a[r]), 0);
	}
}

static int spill_expect(struct td_child *c, const char *what, uint32_t rank, char *line,
			size_t len)
{
	int rc = td_child_expect(c, what, 180000, line, len);

	ck_assert_msg(rc == 0, "rank %u: no '%s' report (%d); it said:\n%s", rank, what, rc,
		      c->out);
	return atoi(line);
}

/* A rank's process exits 0 (bounded). */
static void reap_one(struct td_child *c, uint32_t rank)
{
	int st = td_child_wait(c, 30000);

	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %u: %s:\n%s", rank,
		      td_status_str(st), c->out);
}

static void spill_reap(struct td_child ch[2])
{
	for (uint32_t r = 0; r < 2; r++)
		reap_one(&ch[r], r);
}

static uint64_t held_now(void)
{
	json_t *st = proxy_call("/__proxy/stats", NULL);
	uint64_t n = jnum(st, "held_now");

	json_decref(st);
	return n;
}

/* Waits (bounded, generously: a busy machine) until at least n requests
 * are held at the proxy; `what` names them for the failure. */
static void wait_held(uint64_t n, const char *what, const char *out)
{
	for (int i = 0; i < 1200 && held_now() < n; i++)
		usleep(50000);
	ck_assert_msg(held_now() >= n, "%s never reached the proxy%s%s", what, out ? ":\n" : "",
		      out ? out : "");
}

/* Lets go of whatever an earlier case left held or failing (a failed case
 * ends without its own clean-up), then applies cfg (a JSON object's
 * members, without braces) over a reset. */
static void proxy_fresh(const char *cfg)
{
	proxy_config("{\"hold\": false, \"fail_all\": false, \"fault_path\": \"\", "
		     "\"fault_limit\": -1, \"rate\": 0}");
	for (int i = 0; i < 600 && held_now() > 0; i++)
		usleep(50000);
	ck_assert_uint_eq(held_now(), 0);
	proxy_config("{\"reset\": true, %s}", cfg);
}

START_TEST(test_spill)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	char root[1024], line[1024], path[4096], dir[4096], cache[4096];
	struct td_child ch[2];
	struct rank_args a[2];
	struct testd t;
	char *out = NULL;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_spill");
	snprintf(root, sizeof(root), "%s/spill", base);
	start_spill_daemons(&t, root);
	/* No part reaches S3 until the test says so. */
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\", \"hold\": true");
	spill_start(&t, ch, a, root, "held", SEED_BASE + 10);
	for (uint32_t r = 0; r < 2; r++) {
		rc = spill_expect(&ch[r], "staged", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: staged failed: %s", r, line);
		/* Durable on the node while S3 has none of its parts: the
		 * staging memory no longer waits for the store. */
		rc = spill_expect(&ch[r], "durable", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: durable failed: %s", r, line);
	}
	wait_held(1, "a part", NULL);
	ck_assert_msg(!strstr(ch[0].out, "result") && !strstr(ch[1].out, "result"),
		      "a rank reported its commit while every part was held:\n%s\n%s", ch[0].out,
		      ch[1].out);
	verify_no_commit(root, "held");
	/* The spilled shards are on the nodes' disks, whole. */
	for (int i = 0; i < 2; i++) {
		struct stat st;
		char name[64];

		spill_dir(&t, i, "work", dir, sizeof(dir));
		ck_assert_msg(one_entry(dir, ".ckpt-work-", path, sizeof(path)),
			      "no spill work area in %s", dir);
		snprintf(name, sizeof(name), "/rank-%05d.safetensors", i);
		strncat(path, name, sizeof(path) - strlen(path) - 1);
		ck_assert_msg(stat(path, &st) == 0 && (uint64_t)st.st_size > ROWS * COLS * 4,
			      "spilled shard %s missing or short", path);
	}
	/* ckptctl status says so: uploading, durable on the node. */
	ck_assert_int_eq(td_ckptctl(&out, "-s", td_sock(&t, 0), "status", "--json", NULL), 0);
	ck_assert_msg(out && strstr(out, "\"local_durable\":true") &&
			      strstr(out, "\"state\":\"uploading\"") &&
			      strstr(out, "\"spilled\":true") && strstr(out, "\"spill_dir\":\"/"),
		      "status does not show the spilled save:\n%s", out ? out : "");
	/* The trainer's staging memory is all free while S3 has nothing. */
	ck_assert_msg(strstr(out, "\"slots_in_use\":0"), "arena slots still held:\n%s", out);
	free(out);

	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\"}");
	for (uint32_t r = 0; r < 2; r++) {
		rc = spill_expect(&ch[r], "result", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: the save failed once released: %s", r, line);
	}
	spill_reap(ch);
	verify_commit(root, "held", SEED_BASE + 10);

	/* Each node keeps its ranks' shards as a restore cache, byte for byte
	 * the objects in S3, and no work area. */
	for (int i = 0; i < 2; i++) {
		char prefix[32], key[2048];
		struct body b;

		spill_dir(&t, i, "work", dir, sizeof(dir));
		ck_assert_msg(entries(dir) == 0, "%s still holds a work area", dir);
		spill_dir(&t, i, "cache", dir, sizeof(dir));
		ck_assert_msg(one_entry(dir, "", cache, sizeof(cache)), "no cache in %s", dir);
		strncat(cache, "/held", sizeof(cache) - strlen(cache) - 1);
		snprintf(prefix, sizeof(prefix), "rank-%05d.", i);
		ck_assert_msg(one_entry(cache, prefix, path, sizeof(path)),
			      "no cached shard of rank %d in %s", i, cache);
		ck_assert_msg(entries(cache) == 2, "%s: expected the shard and source.json", cache);
		snprintf(key, sizeof(key), "%s/held/%s", root + strlen("s3://"),
			 strrchr(path, '/') + 1);
		b = s3_get(key);
		ck_assert_msg(file_equals(path, &b), "%s differs from s3://%s", path, key);
		free(b.p);
	}
	td_fini(&t);
}
END_TEST

START_TEST(test_spill_torn)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	char root[1024], line[1024], path[4096], dir[4096];
	struct td_child ch[2];
	struct rank_args a[2];
	struct testd t;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_spill_torn");
	snprintf(root, sizeof(root), "%s/spilltorn", base);
	start_spill_daemons(&t, root);
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\", \"hold\": true");
	spill_start(&t, ch, a, root, "torn", SEED_BASE + 20);
	for (uint32_t r = 0; r < 2; r++) {
		rc = spill_expect(&ch[r], "durable", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: durable failed: %s", r, line);
	}
	/* Both ranks' first parts were checked and handed to S3 (and wait at
	 * the proxy): the bytes now change on the node's disk under them. */
	wait_held(2, "the first parts", NULL);
	for (int i = 0; i < 2; i++) {
		char name[64];
		uint8_t byte;
		int fd;

		spill_dir(&t, i, "work", dir, sizeof(dir));
		ck_assert_msg(one_entry(dir, ".ckpt-work-", path, sizeof(path)), "no work area");
		snprintf(name, sizeof(name), "/rank-%05d.safetensors", i);
		strncat(path, name, sizeof(path) - strlen(path) - 1);
		fd = open(path, O_RDWR | O_CLOEXEC);
		ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
		ck_assert_int_eq(pread(fd, &byte, 1, 1 << 20), 1);
		byte ^= 0x20;
		ck_assert_int_eq(pwrite(fd, &byte, 1, 1 << 20), 1);
		close(fd);
	}
	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\"}");
	for (uint32_t r = 0; r < 2; r++) {
		rc = spill_expect(&ch[r], "result", r, line, sizeof(line));
		ck_assert_msg(rc < 0, "rank %u: a save whose spilled bytes changed committed", r);
	}
	ck_assert_msg(strstr(ch[0].out, "BadDigest") || strstr(ch[1].out, "BadDigest") ||
			      strstr(ch[0].out, "checksum") || strstr(ch[1].out, "checksum"),
		      "the failure does not say the bytes changed:\n%s\n%s", ch[0].out, ch[1].out);
	printf("spill_torn: %s", strstr(ch[0].out, "result"));
	spill_reap(ch);
	verify_no_commit(root, "torn");
	/* The failed attempt's spill areas are gone, nothing was cached. */
	for (int i = 0; i < 2; i++) {
		spill_dir(&t, i, "work", dir, sizeof(dir));
		for (int k = 0; k < 100 && entries(dir) > 0; k++)
			usleep(50000);
		ck_assert_msg(entries(dir) == 0, "%s still holds a work area", dir);
		spill_dir(&t, i, "cache", dir, sizeof(dir));
		ck_assert_msg(entries(dir) <= 0, "%s caches a failed save", dir);
	}
	td_fini(&t);
}
END_TEST

/* ---- leftovers and gc ---- */

/* "s3://BUCKET/s3gc/<what>": outside the prefix s3_faults.sh audits. */
static void gc_root(char *out, size_t len, const char *what)
{
	snprintf(out, len, "s3://%s/s3gc/%s", getenv("S3_BUCKET"), what);
}

/*
 * Runs `code` in the test Python (boto3 on moto itself, as the
 * environment says) with argv[1] = the root's key prefix ("s3gc/<what>/")
 * and argv[2] = arg; its stdout into *out (malloc'd).  Asserts exit 0.
 */
static void s3py(const char *root, const char *arg, const char *code, char **out)
{
	const char *py = getenv("CKPT_TEST_PYTHON");
	char prefix[1024], prog[4096];
	const char *key = strchr(root + strlen("s3://"), '/');
	char *o = NULL;

	ck_assert_msg(py && py[0], "CKPT_TEST_PYTHON is not set");
	snprintf(prefix, sizeof(prefix), "%s/", key ? key + 1 : "");
	snprintf(prog, sizeof(prog),
		 "import boto3, json, os, sys\n"
		 "b = os.environ['S3_BUCKET']\n"
		 "s3 = boto3.client('s3', endpoint_url=os.environ['S3_ENDPOINT'])\n"
		 "pre = sys.argv[1]\n"
		 "def keys(p=''):\n"
		 "    out = []\n"
		 "    for pg in s3.get_paginator('list_objects_v2').paginate(Bucket=b, Prefix=pre + p):\n"
		 "        out += [o['Key'][len(pre):] for o in pg.get('Contents', [])]\n"
		 "    return sorted(out)\n"
		 "def uploads():\n"
		 "    return sorted(u['Key'][len(pre):] for u in\n"
		 "                  s3.list_multipart_uploads(Bucket=b, Prefix=pre).get('Uploads', []))\n"
		 "%s\n", code);
	char *argv[] = { (char *)py, "-c", prog, prefix, (char *)(arg ? arg : ""), NULL };
	int st = td_run_capture(argv, 60000, &o);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "python: %s:\n%s\n%s",
		      td_status_str(st), o ? o : "", code);
	*out = o;
}

/* The keys under root (one per line), and the open uploads ("upload KEY"). */
static char *s3_state(const char *root)
{
	char *out = NULL;

	s3py(root, NULL,
	     "for k in keys(): print(k)\n"
	     "for u in uploads(): print('upload', u)\n", &out);
	return out;
}

/* Does any line of text start with `start` and hold `has` (NULL: any)? */
static bool line_has(const char *text, const char *start, const char *has)
{
	for (const char *l = text; l && *l;) {
		const char *nl = strchr(l, '\n');
		size_t n = nl ? (size_t)(nl - l) : strlen(l);

		if (n >= strlen(start) && !strncmp(l, start, strlen(start)) &&
		    (!has || (memmem(l, n, has, strlen(has)) != NULL)))
			return true;
		l = nl ? nl + 1 : NULL;
	}
	return false;
}

/* Waits (bounded) until the state of root has (want) or lacks (!want) a line
 * starting with `start` and holding `has`; returns the last state seen. */
static char *wait_state(const char *root, const char *start, const char *has, bool want,
			int timeout_ms)
{
	int64_t end = td_now_ms() + timeout_ms;
	char *st = s3_state(root);

	while (line_has(st, start, has) != want && td_now_ms() < end) {
		free(st);
		td_sleep_ms(200);
		st = s3_state(root);
	}
	return st;
}

static void gc_daemons(struct testd *t, const char *root, int n, const char *more)
{
	char conf[2048];

	for (int i = 0; i < n; i++) {
		snprintf(conf, sizeof(conf),
			 "arena_max = 64M\nroot = %s\ns3_endpoint = %s\n"
			 "s3_retries = 2\ns3_backoff_base = 10ms\ns3_backoff_cap = 50ms\n"
			 "s3_stall_timeout = 120s\ns3_heartbeat = 500ms\n%s",
			 root, getenv("CKPT_TEST_S3_PROXY"), more);
		ck_assert_int_eq(td_daemon_start(t, i, conf), 0);
	}
}

/* ckpt_save_one as a helper process: one rank of a world of one, 20 MiB
 * (three parts), waiting for the commit. */
struct one_args {
	const char *sock, *root, *name;
};

static int save_one_main(void *arg, int rep, int go)
{
	const struct one_args *a = arg;
	char bin[4096];

	(void)go;
	snprintf(bin, sizeof(bin), "%s/tests/ckpt_save_one", td_build_dir());
	dup2(rep, 1);
	dup2(rep, 2);
	execl(bin, bin, "-s", a->sock, "-r", a->root, "-n", a->name, "--world", "1", "--rank",
	      "0", "--mib", "20", "--wait", "committed", (char *)NULL);
	return 127;
}

START_TEST(test_gc_live)
{
	char root[1024], line[2][1024], *out = NULL, *st;
	struct td_child ch[2];
	struct rank_args a[2];
	struct testd t;
	int64_t t0;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_gc_live");
	gc_root(root, sizeof(root), "live");
	gc_daemons(&t, root, 2, "commit_deadline = 240s\n");
	/* The manifest PUT waits at the proxy: every shard is whole, the save
	 * is in its commit, and stays there as long as the test likes. */
	proxy_fresh("\"fault_methods\": \"PUT\", \"fault_kinds\": \"put\", "
		    "\"fault_path\": \"/manifest.json\", \"hold\": true");
	for (uint32_t r = 0; r < 2; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(&t, (int)r), .root = root,
					   .name = "slow", .rank = r, .seed = SEED_BASE + 30 };
		ck_assert_int_eq(td_child_start(&ch[r], rank_main, &a[r]), 0);
	}
	wait_held(1, "the manifest PUT", NULL);
	/* The work area was made before the manifest PUT came: 11 s after
	 * that, its attempt.json is older than gc's grace of 10 s, while the
	 * heartbeats (every 500 ms) keep the area young by far more than a
	 * busy machine can delay them. */
	t0 = td_now_ms();
	while (td_now_ms() - t0 < 11000)
		td_sleep_ms(100);
	rc = td_ckptctl(&out, "gc", root, "--grace", "10s", "--json", NULL);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "gc: %s\n%s",
		      td_status_str(rc), out ? out : "");
	printf("gc_live: %s", out);
	ck_assert_msg(strstr(out, "\"action\":\"KEEP\"") && strstr(out, ".ckpt-work-") &&
			      !strstr(out, "REMOVE"),
		      "gc did not keep the live save's work area:\n%s", out);
	free(out);
	st = s3_state(root);
	ck_assert_msg(line_has(st, "slow/rank-00000.", ".safetensors") &&
			      line_has(st, "slow/rank-00001.", ".safetensors") &&
			      line_has(st, ".ckpt-work-", "attempt.json") &&
			      line_has(st, ".ckpt-work-", "/alive-"),
		      "a shard, the work area or a heartbeat is missing:\n%s", st);
	free(st);
	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\", \"fault_methods\": \"all\", "
		     "\"fault_path\": \"\"}");
	for (uint32_t r = 0; r < 2; r++) {
		rc = td_child_expect(&ch[r], "result", 120000, line[r], sizeof(line[r]));
		ck_assert_msg(rc == 0 && atoi(line[r]) == 0, "rank %u: %s\n%s", r, line[r],
			      ch[r].out);
		ck_assert_int_eq(td_child_wait(&ch[r], 30000), 0);
	}
	verify_commit(root, "slow", SEED_BASE + 30);
	st = wait_state(root, ".ckpt-work-", NULL, false, 30000);
	ck_assert_msg(!line_has(st, ".ckpt-work-", NULL), "a work area is left:\n%s", st);
	free(st);
	td_fini(&t);
}
END_TEST

START_TEST(test_commit_gone)
{
	char root[1024], msg[1024], *st, *out = NULL;
	struct td_child ch[2];
	struct rank_args a[2];
	char line[2][1024];
	struct testd t;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_commit_gone");
	gc_root(root, sizeof(root), "gone");
	gc_daemons(&t, root, 2, "commit_deadline = 240s\n");
	/* Rank 1's index waits: rank 0's daemon cannot merge yet. */
	proxy_fresh("\"fault_methods\": \"PUT\", \"fault_kinds\": \"put\", "
		    "\"fault_path\": \"rank-00001.index.json\", \"hold\": true");
	for (uint32_t r = 0; r < 2; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(&t, (int)r), .root = root,
					   .name = "victim", .rank = r, .seed = SEED_BASE + 40 };
		ck_assert_int_eq(td_child_start(&ch[r], rank_main, &a[r]), 0);
	}
	wait_held(1, "rank 1's index", NULL);
	/* Rank 0's shard, once whole, is deleted behind the save's back. */
	st = wait_state(root, "victim/rank-00000.", ".safetensors", true, 60000);
	ck_assert_msg(line_has(st, "victim/rank-00000.", ".safetensors"), "no shard 0:\n%s", st);
	free(st);
	s3py(root, NULL,
	     "ks = [k for k in keys('victim/') if k.startswith('victim/rank-00000.')]\n"
	     "assert len(ks) == 1, ks\n"
	     "s3.delete_object(Bucket=b, Key=pre + ks[0])\n"
	     "print(ks[0])\n", &out);
	free(out);
	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\", \"fault_methods\": \"all\", "
		     "\"fault_path\": \"\"}");
	for (uint32_t r = 0; r < 2; r++) {
		rc = td_child_expect(&ch[r], "result", 120000, line[r], sizeof(line[r]));
		ck_assert_msg(rc == 0, "rank %u gave no result:\n%s", r, ch[r].out);
		ck_assert_int_eq(td_child_wait(&ch[r], 30000), 0);
	}
	ck_assert_msg(atoi(line[0]) < 0 && atoi(line[1]) < 0,
		      "a save whose shard was deleted committed:\n  %s\n  %s", line[0], line[1]);
	snprintf(msg, sizeof(msg), "%s", line[0]);
	printf("commit_gone: rank 0: %s\n", msg);
	ck_assert_msg(strstr(msg, "rank-00000.") && strstr(msg, "gone"),
		      "the failure does not name the shard that is gone: %s", msg);
	verify_no_commit(root, "victim");
	st = s3_state(root);
	ck_assert_msg(!line_has(st, "victim/manifest.json", NULL), "a manifest was written:\n%s",
		      st);
	free(st);
	td_fini(&t);
}
END_TEST

START_TEST(test_lost_create)
{
	char root[1024], *st;
	struct testd t;
	json_t *js;
	char msg[1024];
	int res;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_lost_create");
	gc_root(root, sizeof(root), "create");
	gc_daemons(&t, root, 2, "commit_deadline = 240s\n");
	/* The first Create reaches moto; its answer never reaches ckptd. */
	proxy_fresh("\"rate\": 1, \"faults\": \"drop-response\", \"fault_methods\": "
		    "\"POST\", \"fault_kinds\": \"create\", \"fault_limit\": 1");
	res = save_once(&t, root, "made", SEED_BASE + 50, msg, sizeof(msg));
	js = proxy_call("/__proxy/stats", NULL);
	uint64_t drops = jnum(json_object_get(js, "faults"), "drop-response");
	json_decref(js);
	proxy_config("{\"rate\": 0, \"faults\": \"all\", \"fault_methods\": \"all\", "
		     "\"fault_kinds\": \"all\", \"fault_limit\": -1}");
	ck_assert_msg(res == 0, "the save failed: %s", msg);
	ck_assert_uint_eq(drops, 1);
	verify_commit(root, "made", SEED_BASE + 50);
	st = s3_state(root);
	printf("lost_create: left in S3:\n%s", st);
	ck_assert_msg(!line_has(st, "upload ", NULL), "an upload is left open:\n%s", st);
	free(st);
	td_fini(&t);
}
END_TEST

START_TEST(test_crash_sweep)
{
	static const char other[] = "0123456789abcdef0123456789abcdef";
	char root[1024], *st, *out = NULL, msg[1024];
	struct one_args oa;
	struct td_child ch;
	struct testd t;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_crash_sweep");
	gc_root(root, sizeof(root), "crash");
	gc_daemons(&t, root, 2, "commit_deadline = 240s\n");
	proxy_fresh("\"fault_methods\": \"all\", \"fault_kinds\": \"all\"");
	/* A committed checkpoint, and another attempt's leftovers under the
	 * same name (a work area of another daemon, a shard of its tag). */
	ck_assert_int_eq(save_once(&t, root, "kept", SEED_BASE + 60, msg, sizeof(msg)), 0);
	s3py(root, other,
	     "o = sys.argv[2]\n"
	     "s3.put_object(Bucket=b, Key=pre + '.ckpt-work-' + o + '/attempt.json', Body=json.dumps("
	     "{'format': 'ckpt-attempt-1', 'id': o, 'name': 'dead', 'daemon': {'id': o, "
	     "'instance': o}}))\n"
	     "s3.put_object(Bucket=b, Key=pre + 'dead/rank-00003.' + o[:16] + '.safetensors', "
	     "Body=b'x')\n", &out);
	free(out);
	out = NULL;
	/* The manifest PUT of "dead" waits at the proxy: then ckptd dies. */
	proxy_config("{\"fault_methods\": \"PUT\", \"fault_kinds\": \"put\", \"fault_path\": "
		     "\"dead/manifest.json\", \"hold\": true}");
	oa = (struct one_args){ td_sock(&t, 0), root, "dead" };
	ck_assert_int_eq(td_child_start(&ch, save_one_main, &oa), 0);
	wait_held(1, "the manifest PUT", ch.out);
	td_daemon_kill(&t, 0);
	td_child_kill(&ch);
	st = s3_state(root);
	ck_assert_msg(line_has(st, "dead/rank-00000.", ".safetensors") &&
			      !line_has(st, "dead/manifest.json", NULL),
		      "not the state of a crash before the commit:\n%s", st);
	/* The dead attempt's work area: the one that is not the planted one. */
	char dead_area[64] = "";
	for (const char *l = st; l && (l = strstr(l, ".ckpt-work-")); l++)
		if (strncmp(l + 11, other, 32))
			snprintf(dead_area, sizeof(dead_area), "%.43s", l);
	ck_assert_msg(strlen(dead_area) == 43, "the dead attempt has no work area:\n%s", st);
	free(st);
	/* gc past its grace takes it for dead (nothing renews it now). */
	for (int i = 0; i < 100; i++) {
		free(out);
		out = NULL;
		rc = td_ckptctl(&out, "gc", root, "--grace", "2s", "--dry-run", NULL);
		ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "gc: %s",
			      out ? out : "");
		if (line_has(out, "REMOVE", ".ckpt-work-") &&
		    !line_has(out, "KEEP", ".ckpt-work-"))
			break;
		td_sleep_ms(500);
	}
	printf("crash_sweep: gc --dry-run:\n%s", out);
	ck_assert_msg(line_has(out, "REMOVE", ".ckpt-work-"), "gc keeps the dead attempt:\n%s",
		      out);
	free(out);
	/* The daemon comes back; its sweep removes what its dead life left:
	 * the shard too, after the usual idle time. */
	td_daemon_stop(&t, 1);
	gc_daemons(&t, root, 1, "commit_deadline = 2s\n");
	st = wait_state(root, "dead/rank-00000.", NULL, false, 90000);
	printf("crash_sweep: after the sweep:\n%s", st);
	ck_assert_msg(!line_has(st, "dead/rank-00000.", NULL), "the dead attempt's shard is "
		      "left:\n%s", st);
	free(st);
	st = wait_state(root, dead_area, NULL, false, 90000);
	ck_assert_msg(!line_has(st, dead_area, NULL), "the dead attempt's work area is left:\n%s",
		      st);
	/* Only the planted one, another daemon's, is left. */
	ck_assert_msg(line_has(st, ".ckpt-work-0123456789abcdef", "attempt.json") &&
			      line_has(st, "dead/rank-00003.0123456789abcdef", NULL),
		      "another attempt's leftovers were removed:\n%s", st);
	ck_assert_msg(!line_has(st, "upload ", NULL), "an upload is left open:\n%s", st);
	free(st);
	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\", \"fault_methods\": \"all\", "
		     "\"fault_path\": \"\"}");
	verify_commit(root, "kept", SEED_BASE + 60);
	verify_no_commit(root, "dead");
	td_fini(&t);
}
END_TEST

START_TEST(test_cleanup_retry)
{
	char root[1024], areas[4096], *st;
	struct one_args oa;
	struct td_child ch;
	struct testd t;
	int st_rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_cleanup_retry");
	gc_root(root, sizeof(root), "retry");
	/* One part in flight: the first is held, the others meet the outage. */
	gc_daemons(&t, root, 1, "commit_deadline = 8s\ns3_parts_in_flight = 1\n");
	proxy_fresh("\"fault_methods\": \"all\", \"fault_kinds\": \"part\", \"hold\": true");
	oa = (struct one_args){ td_sock(&t, 0), root, "outage" };
	ck_assert_int_eq(td_child_start(&ch, save_one_main, &oa), 0);
	wait_held(1, "a part", ch.out);
	/* S3 goes away for parts, aborts, reads, listings and deletes. */
	proxy_config("{\"hold\": false, \"fail_all\": true, \"fault_kinds\": "
		     "\"part,abort,read,delete,delete-objects,other\"}");
	st_rc = td_child_wait(&ch, 120000);
	ck_assert_msg(st_rc >= 0 && WIFEXITED(st_rc) && WEXITSTATUS(st_rc) == 1,
		      "the save did not fail: %s\n%s", td_status_str(st_rc), ch.out);
	/* Its cleanup has run, and failed: the upload and the area are there. */
	bool said = false;
	for (int i = 0; i < 600 && !said; i++) {
		char log[65536];

		said = td_read_log(&t, 0, log, sizeof(log)) > 0 &&
		       strstr(log, "cleanup is incomplete");
		if (!said)
			td_sleep_ms(100);
	}
	ck_assert_msg(said, "the daemon never said its cleanup was incomplete");
	st = s3_state(root);
	printf("cleanup_retry: during the outage:\n%s", st);
	ck_assert_msg(line_has(st, "upload outage/rank-00000.", NULL) &&
			      line_has(st, ".ckpt-work-", "attempt.json"),
		      "nothing left to clean up:\n%s", st);
	free(st);
	/* ... and the daemon has not forgotten it: its registry entry stays. */
	td_path(areas, sizeof(areas), "%s/state-0/areas", t.dir);
	ck_assert_int_eq(td_count_entries(areas, ""), 1);
	/* S3 is back: the periodic sweep finishes the cleanup. */
	proxy_config("{\"fail_all\": false, \"fault_kinds\": \"all\"}");
	st = wait_state(root, "upload ", NULL, false, 120000);
	free(st);
	st = wait_state(root, ".ckpt-work-", NULL, false, 60000);
	printf("cleanup_retry: after the outage:\n%s", st);
	ck_assert_msg(!line_has(st, "upload ", NULL) && !line_has(st, ".ckpt-work-", NULL) &&
			      !line_has(st, "outage/", NULL),
		      "the cleanup was not done once S3 was back:\n%s", st);
	free(st);
	ck_assert_msg(td_wait_count(areas, "", 0, 30000), "the registry entry stays after the "
		      "cleanup was done");
	td_fini(&t);
}
END_TEST

/* ---- damaged answers ---- */

/* From now on the proxy changes one digit in the body of 200 answers to
 * GETs whose path matches `re` (a regex without backslashes, in JSON):
 * `skip` pass whole first, then `times` are changed (-1: all).  A digit
 * that follows a digit: the JSON still parses, a number stays a number. */
static void damage_answers(const char *re, int skip, int times)
{
	proxy_config("{\"answer_match\": \"%s\", \"answer_skip\": %d, \"answer_times\": %d, "
		     "\"answer_how\": \"digit\"}", re, skip, times);
}

static uint64_t answers_damaged(void)
{
	json_t *st = proxy_call("/__proxy/stats", NULL);
	uint64_t n = jnum(st, "answers_damaged");

	json_decref(st);
	return n;
}

/* `ckptctl verify ROOT/NAME`: its exit status, and its output in out. */
static int ctl_verify(const char *root, const char *name, char **out)
{
	char url[1024];
	int st;

	snprintf(url, sizeof(url), "%s/%s", root, name);
	st = td_ckptctl(out, "verify", url, NULL);
	ck_assert_msg(st >= 0 && WIFEXITED(st), "ckptctl verify %s: %s", url, td_status_str(st));
	return WEXITSTATUS(st);
}

static void ctl_verify_ok(const char *root, const char *name)
{
	char *out = NULL;
	int rc = ctl_verify(root, name, &out);

	ck_assert_msg(rc == 0 && out && strstr(out, ": OK,"),
		      "ckptctl verify %s/%s: exit %d:\n%s", root, name, rc, out ? out : "");
	free(out);
}

/* Rank 1's index in the work area: only rank 0's daemon (the coordinator)
 * GETs it, once to count the ranks delivered and once to merge. */
#define RANK1_INDEX "/[.]ckpt-work-[^/]*/rank-00001[.]index[.]json$"

START_TEST(test_answer_index)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	char root[1024], msg[1024], line[2][1024];
	struct testd t;
	int res;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_answer_index");
	snprintf(root, sizeof(root), "%s/answer", base);
	start_daemons(&t, root);
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"hold\": false, "
		     "\"fault_methods\": \"all\", \"fault_kinds\": \"all\"");
	res = save_once(&t, root, "before", SEED_BASE + 30, msg, sizeof(msg));
	ck_assert_msg(res == 0, "the first save failed: %s", msg);
	ck_assert_uint_eq(answers_damaged(), 0);

	/* Once, on the merge's GET (the count's passes whole): the answer is
	 * refused and asked again, and the true bytes are merged. */
	damage_answers(RANK1_INDEX, 1, 1);
	res = save_once(&t, root, "once", SEED_BASE + 31, msg, sizeof(msg));
	ck_assert_uint_eq(answers_damaged(), 1);
	ck_assert_msg(res == 0, "a save whose index answer was damaged once failed: %s", msg);
	verify_commit(root, "once", SEED_BASE + 31);
	ctl_verify_ok(root, "once");

	/* Every time: no answer is ever whole, so the save must fail. */
	damage_answers(RANK1_INDEX, 0, -1);
	res = save_ranks(&t, root, "always", SEED_BASE + 32, line);
	snprintf(msg, sizeof(msg), "%s", line[0]);
	printf("answer_index: rank 1: %s\n", line[1]);
	ck_assert_msg(answers_damaged() >= 2, "only %llu answers damaged",
		      (unsigned long long)answers_damaged());
	proxy_config("{\"answer_match\": \"\"}");
	ck_assert_msg(res < 0, "a save whose index answers were all damaged committed");
	printf("answer_index: the save failed: %s\n", msg);
	verify_no_commit(root, "always");
	/* Rank 0's daemon read the index: its rank and its log say why. */
	ck_assert_msg(strstr(msg, "checksum mismatch") && strstr(msg, "rank-00001.index.json"),
		      "rank 0's failure does not name the checksum mismatch: %s", msg);
	char *log = malloc(1 << 20);
	ck_assert_ptr_nonnull(log);
	ssize_t n = td_read_log(&t, 0, log, 1 << 20);
	ck_assert_msg(n > 0 && strstr(log, "checksum mismatch"),
		      "rank 0's daemon does not log the checksum mismatch:\n%s", n > 0 ? log : "");
	free(log);
	/* The checkpoint saved before is untouched. */
	verify_commit(root, "before", SEED_BASE + 30);
	ctl_verify_ok(root, "before");
	td_fini(&t);
}
END_TEST

START_TEST(test_answer_manifest)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	char root[1024], msg[1024], url[1100];
	struct ckpt_reader *r = NULL;
	struct testd t;
	char *out = NULL;
	int res, rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	/* This test's process (and the ckptctl it runs) reads S3 through the
	 * proxy: before the first read, which starts the process's client. */
	ck_assert_int_eq(setenv("AWS_ENDPOINT_URL_S3", getenv("CKPT_TEST_S3_PROXY"), 1), 0);
	td_init(&t, "s3_answer_manifest");
	snprintf(root, sizeof(root), "%s/answer-load", base);
	start_daemons(&t, root);
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"hold\": false, "
		     "\"fault_methods\": \"all\", \"fault_kinds\": \"all\"");
	res = save_once(&t, root, "m", SEED_BASE + 40, msg, sizeof(msg));
	ck_assert_msg(res == 0, "the save failed: %s", msg);
	snprintf(url, sizeof(url), "%s/m", root);

	/* Once: asked again, and every tensor reads back right. */
	damage_answers("/answer-load/m/manifest[.]json$", 0, 1);
	verify_commit(root, "m", SEED_BASE + 40);
	ck_assert_uint_eq(answers_damaged(), 1);
	damage_answers("/answer-load/m/manifest[.]json$", 0, 1);
	ctl_verify_ok(root, "m");
	ck_assert_uint_eq(answers_damaged(), 2); /* the count goes on */

	/* Every time: refused, with the reason. */
	damage_answers("/answer-load/m/manifest[.]json$", 0, -1);
	rc = ckpt_reader_open(url, &r);
	ck_assert_msg(rc == -EBADMSG, "a reader opened %s from damaged answers: %d (%s)", url,
		      rc, rc == 0 ? "opened" : ckpt_last_error());
	ck_assert_msg(strstr(ckpt_last_error(), "checksum mismatch") &&
			      strstr(ckpt_last_error(), "manifest.json"),
		      "the reader's error does not say why: %s", ckpt_last_error());
	rc = ctl_verify(root, "m", &out);
	ck_assert_msg(rc == 1 && out && strstr(out, "checksum mismatch"),
		      "ckptctl verify of damaged answers: exit %d:\n%s", rc, out ? out : "");
	free(out);
	ck_assert_uint_ge(answers_damaged(), 4);

	/* Whole answers again: it opens (nothing was stored damaged). */
	proxy_config("{\"answer_match\": \"\"}");
	verify_commit(root, "m", SEED_BASE + 40);
	ctl_verify_ok(root, "m");
	td_fini(&t);
}
END_TEST

/* ---- the spill tier's promise: durable means it ---- */

#define DURABLE_DEADLINE_S 10 /* commit_deadline of the durable cases */

/* A root of its own per case, beside the campaign's (s3_faults.sh audits
 * both prefixes apart). */
static void durable_root(const char *name, char *out, size_t len)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT");
	const char *slash = strchr(base + strlen("s3://"), '/');
	int n = slash ? (int)(slash - base) : (int)strlen(base);

	snprintf(out, len, "%.*s/durable/%s", n, base, name);
}

/* The spill directory of daemon idx for uid, "work", "cache" or "". */
static void spill_dir_of(const struct testd *t, int idx, uid_t uid, const char *sub, char *out,
			 size_t len)
{
	snprintf(out, len, "%s/spill%d/%u%s%s", t->dir, idx, (unsigned)uid, sub[0] ? "/" : "",
		 sub);
}

/* One daemon, one rank per save: a save is whole on that node.  A short
 * commit deadline (the outages below outlast it) and quick retries. */
static void start_durable_daemon(struct testd *t, const char *root, const char *extra)
{
	char conf[2048];

	snprintf(conf, sizeof(conf),
		 "arena_max = 64M\ncommit_deadline = %ds\nroot = %s\ns3_endpoint = %s\n"
		 "s3_retries = 2\ns3_backoff_base = 10ms\ns3_backoff_cap = 50ms\n"
		 "s3_stall_timeout = 120s\ns3_parts_in_flight = 4\n"
		 "s3_spill_dir = %s/spill0\ns3_spill_retry_cap = 200ms\n%s",
		 DURABLE_DEADLINE_S, root, getenv("CKPT_TEST_S3_PROXY"), t->dir,
		 extra ? extra : "");
	ck_assert_int_eq(td_daemon_start(t, 0, conf), 0);
}

/* The save `name` in daemon idx's status report, if it is there (a new
 * reference), else NULL. */
static json_t *save_status(struct testd *t, int idx, const char *name)
{
	char *out = NULL;
	json_t *st, *saves, *s, *found = NULL;
	size_t i;
	int rc = td_ckptctl(&out, "-s", td_sock(t, idx), "status", "--json", NULL);

	ck_assert_msg(rc == 0, "ckptctl status: %s", out ? out : "");
	st = json_loads(out, 0, NULL);
	free(out);
	ck_assert_ptr_nonnull(st);
	saves = json_object_get(st, "saves");
	json_array_foreach(saves, i, s) {
		const char *n = json_string_value(json_object_get(s, "name"));

		if (n && !strcmp(n, name))
			found = json_incref(s);
	}
	json_decref(st);
	return found;
}

/* Waits (bounded) until save `name` is pending with at least `tries`
 * failed tries and, if `past_deadline`, older than the commit deadline;
 * returns it (a new reference). */
static json_t *wait_pending(struct testd *t, const char *name, unsigned tries, bool past_deadline)
{
	json_t *s = NULL;

	for (int i = 0; i < 600; i++) {
		json_t *pd;

		s = save_status(t, 0, name);
		if (!s) {
			td_dump_log(t, 0, 4000);
			ck_abort_msg("save '%s' left the daemon's report before S3 took it: it "
				     "failed (the log above says why)", name);
		}
		pd = json_object_get(s, "pending");
		if (pd && jnum(pd, "tries") >= tries &&
		    (!past_deadline ||
		     json_number_value(json_object_get(s, "age_s")) > DURABLE_DEADLINE_S + 1))
			return s;
		json_decref(s);
		s = NULL;
		td_sleep_ms(100);
	}
	td_dump_log(t, 0, 4000);
	ck_abort_msg("save '%s' never showed as pending with %u failed tries", name, tries);
	return NULL;
}

/* Waits (bounded) until save `name` is no longer in the report. */
static void wait_gone(struct testd *t, const char *name)
{
	for (int i = 0; i < 600; i++) {
		json_t *s = save_status(t, 0, name);

		if (!s)
			return;
		json_decref(s);
		td_sleep_ms(100);
	}
	td_dump_log(t, 0, 4000);
	ck_abort_msg("save '%s' is still in the daemon's report", name);
}

/* Waits (bounded) until daemon 0 says the failure of attempt id is cleaned
 * up: from then on a new save of that attempt is not refused for it. */
static void wait_cleaned(struct testd *t, const char *id)
{
	static char log[1 << 20];
	char want[128];

	snprintf(want, sizeof(want), "(attempt %s): its failure is cleaned up", id);
	for (int i = 0; i < 600; i++) {
		log[0] = '\0';
		if (td_read_log(t, 0, log, sizeof(log)) > 0 && strstr(log, want))
			return;
		td_sleep_ms(100);
	}
	td_dump_log(t, 0, 4000);
	ck_abort_msg("the failure of attempt %s was never cleaned up", id);
}

/* The spilled shard of attempt id's rank 0 for uid, whole (or absent). */
static bool spilled_whole(const struct testd *t, uid_t uid, const char *id)
{
	char path[4096];
	struct stat st;

	spill_dir_of(t, 0, uid, "work", path, sizeof(path));
	strncat(path, "/.ckpt-work-", sizeof(path) - strlen(path) - 1);
	strncat(path, id, sizeof(path) - strlen(path) - 1);
	strncat(path, "/rank-00000.safetensors", sizeof(path) - strlen(path) - 1);
	return stat(path, &st) == 0 && (uint64_t)st.st_size > ROWS * COLS * 4;
}

static bool records_there(const struct testd *t, const char *id)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/state-0/spill/%s/save.json", t->dir, id);
	return td_exists(path);
}

/* A rank of a one-rank save; its steps reported. */
static void durable_start(struct td_child *ch, struct rank_args *a, struct testd *t,
			  const char *root, const char *name, uint64_t seed, uid_t uid)
{
	*a = (struct rank_args){ .sock = td_sock(t, 0), .root = root, .name = name,
				 .job = "durable", .world = 1, .uid = uid, .seed = seed,
				 .steps = true };
	ck_assert_int_eq(td_child_start(ch, rank_main, a), 0);
}

/* Up to "durable" with every part held at the proxy; then the trainer is
 * killed (-9) and, if `outage`, S3 goes down: every request answers 503
 * (else the parts stay held). */
static void durable_then(struct testd *t, const char *root, const char *name, uint64_t seed,
			 uid_t uid, bool outage)
{
	struct td_child ch;
	struct rank_args a;
	char line[1024];
	int rc;

	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\", \"hold\": true");
	durable_start(&ch, &a, t, root, name, seed, uid);
	rc = spill_expect(&ch, "staged", 0, line, sizeof(line));
	ck_assert_msg(rc == 0, "staged failed: %s", line);
	rc = spill_expect(&ch, "durable", 0, line, sizeof(line));
	ck_assert_msg(rc == 0, "durable failed: %s", line);
	for (int i = 0; i < 200 && held_now() < 1; i++)
		td_sleep_ms(50);
	ck_assert_msg(held_now() >= 1, "no part was waiting at the proxy");
	td_child_kill(&ch);
	if (outage)
		proxy_config("{\"fail_all\": true, \"fault_kinds\": \"all\", \"hold\": false}");
}

static void durable_then_outage(struct testd *t, const char *root, const char *name,
				uint64_t seed, uid_t uid)
{
	durable_then(t, root, name, seed, uid, true);
}

/* Waits (bounded) until checkpoint `name` is committed (its manifest read
 * from moto itself). */
static void wait_committed(struct testd *t, const char *root, const char *name)
{
	char url[1024];

	snprintf(url, sizeof(url), "%s/%s", root, name);
	for (int i = 0; i < 600; i++) {
		struct ckpt_reader *r = NULL;

		if (ckpt_reader_open(url, &r) == 0) {
			ckpt_reader_close(r);
			return;
		}
		td_sleep_ms(100);
	}
	td_dump_log(t, 0, 4000);
	ck_abort_msg("%s never committed", url);
}

static void outage_over(void)
{
	proxy_config("{\"fail_all\": false, \"hold\": false, \"fault_kinds\": \"all\"}");
}

/* The trainer is gone and S3 stays down longer than every retry budget and
 * the commit deadline: the spilled save waits, whole on the node, and
 * commits once S3 is back. */
START_TEST(test_durable_outage)
{
	char root[1024], id[64], *out = NULL;
	struct testd t;
	json_t *s;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_outage");
	durable_root("outage", root, sizeof(root));
	start_durable_daemon(&t, root, NULL);
	durable_then_outage(&t, root, "out", SEED_BASE + 30, 0);

	s = wait_pending(&t, "out", 3, true);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "attempt")));
	const char *last = json_string_value(json_object_get(json_object_get(s, "pending"),
							    "last_error"));
	ck_assert_msg(last && strstr(last, "503"), "the last error is not S3's 503: %s",
		      last ? last : "(none)");
	json_decref(s);
	ck_assert_msg(spilled_whole(&t, getuid(), id), "the spilled copy is gone or short");
	ck_assert_msg(records_there(&t, id), "the save is not recorded for a restart");
	verify_no_commit(root, "out");
	rc = td_ckptctl(&out, "-s", td_sock(&t, 0), "spill", "list", NULL);
	ck_assert_msg(rc == 0 && strstr(out, id) && strstr(out, "503"),
		      "spill list does not show the pending save: %s", out ? out : "");
	printf("durable_outage: %s", out);
	free(out);
	out = NULL;
	rc = td_ckptctl(&out, "-s", td_sock(&t, 0), "status", NULL);
	ck_assert_msg(rc == 0 && strstr(out, "durable on this node") && strstr(out, "503"),
		      "status does not show the pending save: %s", out ? out : "");
	free(out);

	outage_over();
	wait_committed(&t, root, "out");
	wait_gone(&t, "out");
	verify_commit_world(root, "out", SEED_BASE + 30, 1);
	ctl_verify_ok(root, "out");
	ck_assert_msg(!spilled_whole(&t, getuid(), id) && !records_there(&t, id),
		      "the spilled copy or its records outlived the commit");
	td_fini(&t);
}
END_TEST

/* A pending save outlives its daemon: kill -9 while its upload is on its
 * way, SIGTERM while S3 is down; each next life resumes it and commits. */
START_TEST(test_durable_restart)
{
	char root[1024], id[64];
	struct testd t;
	json_t *s;
	int st;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_restart");
	durable_root("restart", root, sizeof(root));
	start_durable_daemon(&t, root, NULL);

	/* kill -9 of ckptd with the trainer gone and the parts at the proxy. */
	durable_then(&t, root, "rs", SEED_BASE + 31, 0, false);
	s = save_status(&t, 0, "rs");
	ck_assert_ptr_nonnull(s);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "attempt")));
	json_decref(s);
	td_daemon_kill(&t, 0);
	ck_assert_msg(spilled_whole(&t, getuid(), id), "kill -9 of ckptd lost the spilled copy");
	start_durable_daemon(&t, root, NULL);
	outage_over();
	wait_committed(&t, root, "rs");
	wait_gone(&t, "rs");
	verify_commit_world(root, "rs", SEED_BASE + 31, 1);
	ctl_verify_ok(root, "rs");
	ck_assert_msg(!spilled_whole(&t, getuid(), id) && !records_there(&t, id),
		      "the spilled copy or its records outlived the commit");

	/* SIGTERM with S3 down: the daemon exits promptly and cleanly, the
	 * save parked; the next life resumes it. */
	durable_then_outage(&t, root, "rs2", SEED_BASE + 35, 0);
	s = wait_pending(&t, "rs2", 1, false);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "attempt")));
	json_decref(s);
	st = td_daemon_stop(&t, 0);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: %s",
		      td_status_str(st));
	ck_assert_msg(spilled_whole(&t, getuid(), id) && records_there(&t, id),
		      "a stop of ckptd lost the spilled save");
	verify_no_commit(root, "rs2");
	start_durable_daemon(&t, root, NULL);
	s = wait_pending(&t, "rs2", 1, false);
	ck_assert_msg(json_is_true(json_object_get(json_object_get(s, "pending"), "resumed")),
		      "the next life did not resume the save");
	json_decref(s);
	outage_over();
	wait_committed(&t, root, "rs2");
	wait_gone(&t, "rs2");
	verify_commit_world(root, "rs2", SEED_BASE + 35, 1);
	ctl_verify_ok(root, "rs2");
	ck_assert_msg(!spilled_whole(&t, getuid(), id) && !records_there(&t, id),
		      "the spilled copy or its records outlived the commit");
	td_fini(&t);
}
END_TEST

/* Runs ckptctl as uid (setpriv), or as ourselves with uid 0.  The wait
 * status, or -ENOENT without setpriv. */
static int ckptctl_as(uid_t uid, char **out, const char *a1, const char *a2, const char *a3,
		      const char *a4, const char *a5)
{
	char exe[TD_PATH], ru[32], rg[32];
	char *argv[16];
	int n = 0;

	snprintf(exe, sizeof(exe), "%s/ckptctl", td_build_dir());
	if (uid) {
		if (!td_exists("/usr/bin/setpriv"))
			return -ENOENT;
		snprintf(ru, sizeof(ru), "--reuid=%u", (unsigned)uid);
		snprintf(rg, sizeof(rg), "--regid=%u", (unsigned)uid);
		argv[n++] = (char *)"/usr/bin/setpriv";
		argv[n++] = ru;
		argv[n++] = rg;
		argv[n++] = (char *)"--clear-groups";
	}
	argv[n++] = exe;
	argv[n++] = (char *)a1;
	argv[n++] = (char *)a2;
	argv[n++] = (char *)a3;
	argv[n++] = (char *)a4;
	argv[n++] = (char *)a5;
	argv[n] = NULL;
	return td_run_capture(argv, 30000, out);
}

#define UID_OWNER 4242u
#define UID_OTHER 4343u

/* Only an operator's command drops a pending save: another user cannot,
 * its owner (or root) can, and then its copy and records are gone and it
 * never commits. */
START_TEST(test_durable_drop)
{
	char root[1024], id[64], where[1200], *out = NULL;
	bool as_users = geteuid() == 0 && td_exists("/usr/bin/setpriv");
	uid_t owner = as_users ? UID_OWNER : getuid();
	struct testd t;
	json_t *s;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_drop");
	durable_root("drop", root, sizeof(root));
	if (as_users) {
		/* Other users reach the socket (the test's directories are
		 * private). */
		ck_assert_int_eq(chmod(t.dir, 0755), 0);
		ck_assert_int_eq(chmod(t.sockdir, 0755), 0);
	}
	start_durable_daemon(&t, root, as_users ? "socket_mode = 0666\n" : NULL);
	durable_then_outage(&t, root, "dr", SEED_BASE + 32, as_users ? owner : 0);
	s = wait_pending(&t, "dr", 1, false);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "attempt")));
	json_decref(s);
	snprintf(where, sizeof(where), "%s/dr", root);

	if (as_users) {
		rc = ckptctl_as(UID_OTHER, &out, "-s", td_sock(&t, 0), "spill", "drop", id);
		ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 6 &&
				      strstr(out, "belongs to another user"),
			      "another user's drop: %s: %s", td_status_str(rc), out ? out : "");
		free(out);
		out = NULL;
		s = save_status(&t, 0, "dr");
		ck_assert_msg(s && json_object_get(s, "pending"),
			      "another user's drop took the save away");
		json_decref(s);
	} else {
		td_skip("s3_durable_drop_other_uid", "needs root and setpriv to run ckptctl as "
			"another user");
	}
	ck_assert_msg(spilled_whole(&t, owner, id), "the spilled copy is gone");
	rc = ckptctl_as(as_users ? owner : 0, &out, "-s", td_sock(&t, 0), "spill", "drop", where);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
		      "the owner's drop: %s: %s", td_status_str(rc), out ? out : "");
	printf("durable_drop: %s", out);
	free(out);
	out = NULL;
	wait_gone(&t, "dr");
	/* The failure's cleanup meets S3 down too; the node's copy goes
	 * whatever S3 says. */
	for (int i = 0; i < 600 && (spilled_whole(&t, owner, id) || records_there(&t, id)); i++)
		td_sleep_ms(100);
	ck_assert_msg(!spilled_whole(&t, owner, id) && !records_there(&t, id),
		      "the dropped save's copy or records are still there");
	rc = ckptctl_as(0, &out, "-s", td_sock(&t, 0), "spill", "drop", id);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 1 &&
			      strstr(out, "no pending"),
		      "a second drop: %s: %s", td_status_str(rc), out ? out : "");
	free(out);
	outage_over();
	verify_no_commit(root, "dr");
	td_fini(&t);
}
END_TEST

/* A trainer killed after its save was durable restarts and saves the same
 * name at the same step with the same key.  While the earlier attempt is
 * pending here, it is told so (-EALREADY) and the earlier one commits; once
 * an attempt is dead (dropped while S3 was down, its markers left in S3),
 * the retry commits. */
START_TEST(test_durable_retrain)
{
	char root[1024], line[1024], id[64];
	struct td_child ch;
	struct rank_args a;
	struct testd t;
	json_t *s;
	int rc;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_retrain");
	durable_root("retrain", root, sizeof(root));
	start_durable_daemon(&t, root, NULL);

	/* Pending (its parts held at the proxy): told, and the earlier
	 * attempt commits. */
	durable_then(&t, root, "again", SEED_BASE + 33, 0, false);
	durable_start(&ch, &a, &t, root, "again", SEED_BASE + 33, 0);
	rc = spill_expect(&ch, "result", 0, line, sizeof(line));
	ck_assert_msg(rc == -EALREADY && strstr(line, "already durable"),
		      "the restarted trainer was not told the save is durable: %s", line);
	reap_one(&ch, 0);
	printf("durable_retrain: %s\n", line);
	outage_over();
	wait_committed(&t, root, "again");
	wait_gone(&t, "again");
	verify_commit_world(root, "again", SEED_BASE + 33, 1);

	/* Dead: dropped while S3 was down, so the attempt's work area and
	 * rank marker stay in S3; the retry is not refused for them. */
	durable_then_outage(&t, root, "dead", SEED_BASE + 34, 0);
	s = wait_pending(&t, "dead", 1, false);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "attempt")));
	json_decref(s);
	rc = td_ckptctl(NULL, "-s", td_sock(&t, 0), "spill", "drop", id, NULL);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "drop: %s",
		      td_status_str(rc));
	wait_cleaned(&t, id);
	outage_over();
	durable_start(&ch, &a, &t, root, "dead", SEED_BASE + 34, 0);
	rc = spill_expect(&ch, "result", 0, line, sizeof(line));
	ck_assert_msg(rc == 0, "the retry of a dead attempt failed: %s", line);
	reap_one(&ch, 0);
	verify_commit_world(root, "dead", SEED_BASE + 34, 1);
	ctl_verify_ok(root, "dead");
	td_fini(&t);
}
END_TEST

/* Two ranks on two daemons, both spilled, the trainers gone and S3 down:
 * both daemons are killed (-9) and started again.  The coordinator's next
 * life claims the work area afresh, the other daemon's next life delivers
 * its rank to that claim, and the save commits once S3 is back. */
START_TEST(test_durable_two)
{
	char root[1024], line[1024];
	struct td_child ch[2];
	struct rank_args a[2];
	struct testd t;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_two");
	durable_root("two", root, sizeof(root));
	start_spill_daemons(&t, root);
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\", \"hold\": true");
	spill_start(&t, ch, a, root, "two", SEED_BASE + 36);
	for (uint32_t r = 0; r < 2; r++) {
		int rc = spill_expect(&ch[r], "durable", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: durable failed: %s", r, line);
	}
	for (int i = 0; i < 200 && held_now() < 2; i++)
		td_sleep_ms(50);
	ck_assert_msg(held_now() >= 2, "the parts never reached the proxy");
	td_child_kill(&ch[0]);
	td_child_kill(&ch[1]);
	proxy_config("{\"fail_all\": true, \"fault_kinds\": \"all\", \"hold\": false}");
	json_decref(wait_pending(&t, "two", 1, false));
	td_daemon_kill(&t, 0);
	td_daemon_kill(&t, 1);
	start_spill_daemons(&t, root);
	json_decref(wait_pending(&t, "two", 1, false));
	outage_over();
	wait_committed(&t, root, "two");
	verify_commit(root, "two", SEED_BASE + 36);
	ctl_verify_ok(root, "two");
	wait_gone(&t, "two");
	td_fini(&t);
}
END_TEST

/* The state of save `name` in daemon idx's report ("" if absent). */
static void save_state_of(struct testd *t, int idx, const char *name, char *out, size_t len)
{
	json_t *s = save_status(t, idx, name);
	const char *state = json_string_value(json_object_get(s, "state"));

	snprintf(out, len, "%s", state ? state : "");
	json_decref(s);
}

/*
 * Review repro: as durable_two, but rank 1's daemon had uploaded its rank and
 * delivered its index (to the coordinator's claim) before both daemons were
 * killed; rank 0's parts were held at the proxy.  Both ranks were told
 * durable: the save must commit after both daemons restart.
 */
START_TEST(test_durable_delivered)
{
	char root[1024], line[1024], state[64] = "";
	struct td_child ch[2];
	struct rank_args a[2];
	struct testd t;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_delivered");
	durable_root("delivered", root, sizeof(root));
	start_spill_daemons(&t, root);
	proxy_fresh("\"rate\": 0, \"fail_all\": false, \"fault_methods\": "
		     "\"all\", \"fault_kinds\": \"part\", \"hold\": true, \"fault_path\": "
		     "\"rank-00000\"");
	spill_start(&t, ch, a, root, "dlv", SEED_BASE + 37);
	for (uint32_t r = 0; r < 2; r++) {
		int rc = spill_expect(&ch[r], "durable", r, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %u: durable failed: %s", r, line);
	}
	/* Rank 1's daemon has delivered: its save only waits for the commit. */
	for (int i = 0; i < 600; i++) {
		save_state_of(&t, 1, "dlv", state, sizeof(state));
		if (!strcmp(state, "waiting"))
			break;
		td_sleep_ms(100);
	}
	ck_assert_msg(!strcmp(state, "waiting"), "rank 1's daemon never delivered: '%s'", state);
	wait_held(1, "rank 0's parts", NULL);
	td_child_kill(&ch[0]);
	td_child_kill(&ch[1]);
	td_daemon_kill(&t, 0);
	td_daemon_kill(&t, 1);
	start_spill_daemons(&t, root);
	outage_over();
	wait_committed(&t, root, "dlv");
	verify_commit(root, "dlv", SEED_BASE + 37);
	td_fini(&t);
}
END_TEST

/*
 * Review repro: a spilled save, whole on one node, whose S3 shard is deleted
 * (a collector, a hand) after its upload and before its commit.  The commit
 * finds the shard gone; the copy on the node's disk is intact.  The save
 * must end (re-uploaded and committed, or failed), not retry a commit that
 * can never succeed for as long as the daemon lives.
 */
START_TEST(test_durable_gone)
{
	char root[1024], line[1024], *st, *out = NULL;
	struct td_child ch;
	struct rank_args a;
	struct testd t;
	json_t *s = NULL;
	int i;

	if (!have_env()) {
		td_skip("s3_faults", "no S3 server: tests/integration/s3_faults.sh runs this");
		return;
	}
	td_init(&t, "s3_durable_gone");
	durable_root("gone", root, sizeof(root));
	start_durable_daemon(&t, root, NULL);
	proxy_fresh("\"fault_methods\": \"PUT\", \"fault_kinds\": \"put\", "
		    "\"fault_path\": \"rank-00000.index.json\", \"hold\": true");
	durable_start(&ch, &a, &t, root, "gone", SEED_BASE + 38, 0);
	ck_assert_msg(spill_expect(&ch, "durable", 0, line, sizeof(line)) == 0, "%s", line);
	wait_held(1, "rank 0's index", NULL);
	st = wait_state(root, "gone/rank-00000.", ".safetensors", true, 60000);
	free(st);
	s3py(root, NULL,
	     "ks = [k for k in keys('gone/') if k.startswith('gone/rank-00000.')]\n"
	     "assert len(ks) == 1, ks\n"
	     "s3.delete_object(Bucket=b, Key=pre + ks[0])\n"
	     "print(ks[0])\n", &out);
	free(out);
	proxy_config("{\"hold\": false, \"fault_kinds\": \"all\", \"fault_methods\": \"all\", "
		     "\"fault_path\": \"\"}");
	/* The save leaves the report (it committed) before ten failed tries
	 * of the commit (the retry cap is 200 ms), or never. */
	for (i = 0;; i++) {
		json_t *pd;

		s = save_status(&t, 0, "gone");
		if (!s)
			break;
		pd = json_object_get(s, "pending");
		if ((pd && jnum(pd, "tries") >= 10) || i == 1200)
			break;
		json_decref(s);
		s = NULL;
		td_sleep_ms(100);
	}
	if (s) {
		char *dump = json_dumps(s, JSON_COMPACT);

		printf("durable_gone: still pending: %s\n", dump ? dump : "?");
		free(dump);
		json_decref(s);
		ck_abort_msg("the save whose S3 shard was deleted retries a commit that cannot "
			     "succeed, and never re-uploads its intact spilled copy");
	}
	wait_committed(&t, root, "gone");
	ctl_verify_ok(root, "gone");
	td_fini(&t);
}
END_TEST

static Suite *faults_suite(void)
{
	Suite *s = suite_create("integration_s3_faults");

	td_case(s, "campaign", test_campaign, 1800, 0, 1);
	td_case(s, "budget", test_budget, 300, 0, 1);
	td_case(s, "spill", test_spill, 300, 0, 1);
	td_case(s, "spill_torn", test_spill_torn, 300, 0, 1);
	td_case(s, "answer_index", test_answer_index, 600, 0, 1);
	td_case(s, "answer_manifest", test_answer_manifest, 600, 0, 1);
	td_case(s, "gc_live", test_gc_live, 300, 0, 1);
	td_case(s, "commit_gone", test_commit_gone, 300, 0, 1);
	td_case(s, "lost_create", test_lost_create, 300, 0, 1);
	td_case(s, "crash_sweep", test_crash_sweep, 400, 0, 1);
	td_case(s, "cleanup_retry", test_cleanup_retry, 400, 0, 1);
	td_case(s, "durable_outage", test_durable_outage, 300, 0, 1);
	td_case(s, "durable_restart", test_durable_restart, 300, 0, 1);
	td_case(s, "durable_drop", test_durable_drop, 300, 0, 1);
	td_case(s, "durable_retrain", test_durable_retrain, 300, 0, 1);
	td_case(s, "durable_two", test_durable_two, 300, 0, 1);
	td_case(s, "durable_delivered", test_durable_delivered, 300, 0, 1);
	td_case(s, "durable_gone", test_durable_gone, 300, 0, 1);
	return s;
}

int main(void)
{
	curl_global_init(CURL_GLOBAL_ALL);
	return td_main(faults_suite(), "check_s3_faults");
}
