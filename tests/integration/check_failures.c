/* SPDX-License-Identifier: MIT */
/*
 * check_failures.c - integration: what a real ckptd does when things go
 * wrong: no daemon, clients killed mid-save, malformed peers, refused roots
 * and names, ranks that vanish or never come, leftovers of a crash, a daemon
 * that dies.  Every case asserts the exact errno and what is (not) on disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "shm/proto.h"
#include "store/store.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)

/* ---- shared helpers ---------------------------------------------------------- */

static bool status_str(struct testd *t, int idx, char **ret_text, json_t **ret_json)
{
	char *out = NULL;
	json_error_t je;
	int st = td_ckptctl(&out, "-s", (char *)td_sock(t, idx), "status", "--json", NULL);
	json_t *j;

	if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		fprintf(stderr, "[%s] ckptctl status --json: %s\n%s\n", t->name, td_status_str(st),
			out ? out : "");
		free(out);
		return false;
	}
	j = json_loads(out, 0, &je);
	if (!j) {
		fprintf(stderr, "[%s] ckptctl status --json is not JSON (%s):\n%s\n", t->name,
			je.text, out);
		free(out);
		return false;
	}
	*ret_json = j;
	if (ret_text)
		*ret_text = out;
	else
		free(out);
	return true;
}

/* True if the report shows no client of `job`, no client holding an arena,
 * and arena_bytes_total == 0. */
static bool status_idle(json_t *j, const char *job)
{
	json_t *clients = json_object_get(j, "clients"), *cl;
	size_t i;

	if (!json_is_array(clients))
		return false;
	json_array_foreach(clients, i, cl) {
		const char *cj = json_string_value(json_object_get(cl, "job"));

		if (cj && strcmp(cj, job) == 0)
			return false;
		if (json_integer_value(json_object_get(cl, "arena_bytes")) > 0)
			return false;
	}
	return json_is_integer(json_object_get(j, "arena_bytes_total")) &&
	       json_integer_value(json_object_get(j, "arena_bytes_total")) == 0;
}

/* Polls ckptctl status until status_idle (bounded); asserts it. */
static void assert_status_idle(struct testd *t, const char *job, int timeout_ms)
{
	int64_t end = td_now_ms() + timeout_ms;
	char *text = NULL;

	for (;;) {
		json_t *j = NULL;
		bool ok;

		free(text);
		text = NULL;
		ck_assert_msg(status_str(t, 0, &text, &j), "ckptctl status --json failed (above)");
		ok = status_idle(j, job);
		json_decref(j);
		if (ok)
			break;
		ck_assert_msg(td_now_ms() < end,
			      "after %d ms, status still shows a client of job %s or arena bytes:\n%s",
			      timeout_ms, job, text);
		td_sleep_ms(100);
	}
	free(text);
}

/* True if the status shows save `name` with `rank` attached to a client. */
static bool status_rank_staging(json_t *j, const char *name, int rank)
{
	json_t *saves = json_object_get(j, "saves"), *sv, *rk;
	size_t i, k;

	json_array_foreach(saves, i, sv) {
		const char *n = json_string_value(json_object_get(sv, "name"));

		if (!n || strcmp(n, name) != 0)
			continue;
		json_array_foreach(json_object_get(sv, "ranks"), k, rk) {
			if (json_integer_value(json_object_get(rk, "rank")) == rank &&
			    !json_is_null(json_object_get(rk, "client")))
				return true;
		}
	}
	return false;
}

/* Polls until save `name` shows `rank` attached (bounded).  Returns whether
 * it was seen; the callers go on either way (it only sharpens timing). */
static bool wait_rank_staging(struct testd *t, const char *name, int rank, int timeout_ms)
{
	int64_t end = td_now_ms() + timeout_ms;

	while (td_now_ms() < end) {
		json_t *j = NULL;
		bool ok;

		if (!status_str(t, 0, NULL, &j))
			return false;
		ok = status_rank_staging(j, name, rank);
		json_decref(j);
		if (ok)
			return true;
		td_sleep_ms(5);
	}
	fprintf(stderr, "[%s] note: status never showed save %s with rank %d attached\n", t->name,
		name, rank);
	return false;
}

/* A small save on a fresh client that must commit and read back: "the
 * daemon still serves". */
static void assert_serves(struct testd *t, int idx, const char *job, const char *name)
{
	struct ckpt_client *c = td_connect(td_sock(t, idx), job, 0, 1, 16 * MiB);
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r = NULL;
	uint64_t sh[2] = { 64, 1000 };
	static float w[64000];
	char p[TD_PATH], msg[1024];
	int st, cm, rc;

	td_fill(w, sizeof(w), 4242, 0);
	rc = ckpt_save_begin(c, t->root, name, 1, &s);
	ck_assert_msg(rc == 0, "save_begin = %d: %s", rc, ckpt_last_error());
	td_add(s, "w", CKPT_F32, 2, sh, w);
	ck_assert_int_eq(td_commit_wait(s, 60000, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == 0 && cm == 0, "follow-up save %s: staged %d committed %d: %s", name,
		      st, cm, msg);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	td_path(p, sizeof(p), "%s/%s", t->root, name);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "reader_open(%s) = %d: %s", p, rc, ckpt_last_error());
	ck_assert(td_verify_tensor(r, "w", CKPT_F32, 2, sh, 4242));
	ckpt_reader_close(r);
}

/* ---- a trainer rank in a helper process ---------------------------------------- */

struct rank_args {
	const char *sock;
	const char *root;
	const char *job;
	const char *name;
	uint32_t rank, world;
	uint64_t arena;
	uint64_t bytes;      /* total save size */
	bool distinct;       /* distinct pattern per tensor (else one shared buffer) */
	bool wait_go_after_staged; /* after "staged", wait for the parent (to be killed) */
	bool wait_go_after_commit; /* after "commit", wait for the parent (to be killed) */
};

/*
 * Saves args->bytes as 16 MiB F32 tensors "r<rank>.t<i>" (seed 100*rank+i
 * if distinct), and reports "commit RC", "staged RC PENDING" (PENDING: 1 if
 * the committed future was still pending then) and "committed RC MSG".
 */
static int rank_main(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	const uint64_t tb = 16 * MiB;
	unsigned n = (unsigned)(a->bytes / tb), i;
	uint64_t shape[1] = { tb / 4 };
	struct ckpt_client *c = NULL;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	unsigned char *buf;
	char name[64];
	int rc;

	buf = malloc(a->distinct ? n * tb : tb);
	if (!buf)
		return 10;
	for (i = 0; i < (a->distinct ? n : 1); i++)
		td_fill(buf + i * tb, tb, 100ull * a->rank + i, 0);
	rc = td_connect_rc(a->sock, a->job, a->rank, a->world, a->arena, &c);
	if (rc < 0) {
		td_report(rep, "error connect %d %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 7, &s);
	if (rc < 0) {
		td_report(rep, "error begin %d %s", rc, ckpt_last_error());
		return 12;
	}
	for (i = 0; i < n; i++) {
		struct ckpt_tensor tn = {
			CKPT_TENSOR_INIT, .name = name, .dtype = CKPT_F32, .ndim = 1, .shape = shape,
			.data = buf + (a->distinct ? i * tb : 0),
		};

		snprintf(name, sizeof(name), "r%u.t%02u", a->rank, i);
		rc = ckpt_save_add_tensor(s, &tn);
		if (rc < 0) {
			td_report(rep, "error add %d %s", rc, ckpt_last_error());
			return 13;
		}
	}
	rc = ckpt_save_commit(s, &fs, &fc);
	td_report(rep, "commit %d", rc);
	if (rc < 0)
		return 14;
	if (a->wait_go_after_commit) {
		td_wait_go(go, 120000);
		return 15;
	}
	rc = td_future_wait(fs, 120000);
	td_report(rep, "staged %d %d", rc, ckpt_future_poll(fc) == -EINPROGRESS);
	if (a->wait_go_after_staged) {
		td_wait_go(go, 120000);
		return 16;
	}
	rc = td_future_wait(fc, 120000);
	td_report(rep, "committed %d %s", rc, ckpt_future_error(fc));
	ckpt_save_free(s);
	ckpt_disconnect(c);
	return 0;
}

/* Parses "RC rest" of a report line; returns RC and points *rest past it. */
static int parse_rc(const char *line, const char **rest)
{
	char *end;
	long v = strtol(line, &end, 10);

	if (rest)
		*rest = *end == ' ' ? end + 1 : end;
	return (int)v;
}

/* ---- 6. no daemon ------------------------------------------------------------ */

START_TEST(test_no_daemon)
{
	struct testd t;
	struct ckpt_client *c = NULL;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char missing[TD_PATH], dead[TD_PATH];
	int rc, fd;

	td_init(&t, "no_daemon");
	td_path(missing, sizeof(missing), "%s/none.sock", t.sockdir);
	rc = td_connect_rc(missing, "job6", 0, 1, 16 * MiB, &c);
	ck_assert_msg(rc == -ENOENT, "connect to a missing socket = %d (%s), want -ENOENT", rc,
		      strerror(-rc));
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(ckpt_last_error(), missing) != NULL,
		      "ckpt_last_error() does not name the socket %s: \"%s\"", missing,
		      ckpt_last_error());

	/* A socket file nobody listens on (a daemon that crashed). */
	td_path(dead, sizeof(dead), "%s/dead.sock", t.sockdir);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert(strlen(dead) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, dead, strlen(dead) + 1);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd);
	rc = td_connect_rc(dead, "job6", 0, 1, 16 * MiB, &c);
	ck_assert_msg(rc == -ECONNREFUSED, "connect to a dead socket = %d (%s), want -ECONNREFUSED",
		      rc, strerror(-rc));
	ck_assert_msg(strstr(ckpt_last_error(), dead) != NULL,
		      "ckpt_last_error() does not name the socket %s: \"%s\"", dead,
		      ckpt_last_error());

	/* socket_path NULL: $CKPTD_SOCKET is used, and named in the error. */
	setenv("CKPTD_SOCKET", missing, 1);
	{
		struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = NULL,
					       .job = "job6", .rank = 0,
					       .world = 1, .arena_bytes = 16 * MiB };

		rc = ckpt_connect(&o, &c);
	}
	unsetenv("CKPTD_SOCKET");
	ck_assert_msg(rc == -ENOENT, "connect via $CKPTD_SOCKET = %d, want -ENOENT", rc);
	ck_assert_msg(strstr(ckpt_last_error(), missing) != NULL,
		      "ckpt_last_error() does not name $CKPTD_SOCKET %s: \"%s\"", missing,
		      ckpt_last_error());
	td_fini(&t);
}
END_TEST

/* ---- 7. client killed mid-staging ------------------------------------------- */

START_TEST(test_client_killed_mid_staging)
{
	/* _i == 0: killed right after ckpt_save_commit returns;
	 * _i == 1: killed once the daemon's status shows the save in progress. */
	struct testd t;
	struct td_child ch;
	struct rank_args a = {
		.job = "job7", .name = "killed", .rank = 0, .world = 1,
		.arena = 64 * MiB, .bytes = 1024 * MiB, .distinct = false,
		.wait_go_after_commit = true,
	};
	char p[TD_PATH], line[256];
	int rc;

	td_init(&t, _i ? "killed_mid_staging_late" : "killed_mid_staging");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);
	a.sock = td_sock(&t, 0);
	a.root = t.root;

	ck_assert_int_eq(td_child_start(&ch, rank_main, &a), 0);
	rc = td_child_expect(&ch, "commit", 60000, line, sizeof(line));
	ck_assert_msg(rc == 0, "the client never reported its commit (%d); it said:\n%s", rc,
		      ch.out);
	ck_assert_msg(parse_rc(line, NULL) == 0, "ckpt_save_commit in the client: %s", line);
	if (_i == 1)
		wait_rank_staging(&t, "killed", 0, 5000);
	td_child_kill(&ch);
	ck_assert_msg(!strstr(ch.out, "staged"), "test premise: staging finished before the kill");

	/* The save failed: nothing committed, the work dir goes away, the
	 * client and its arena are gone, and the daemon still serves. */
	td_path(p, sizeof(p), "%s/killed", t.root);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 15000),
		      "the .partial dir of the killed client is still in %s after 15 s", t.root);
	ck_assert_msg(!td_exists(p), "%s exists: a save whose client died mid-staging committed",
		      p);
	assert_status_idle(&t, "job7", 15000);
	ck_assert(td_daemon_alive(&t, 0));
	assert_serves(&t, 0, "job7b", "after");
	ck_assert_msg(!td_exists(p), "%s appeared later", p);
	td_fini(&t);
}
END_TEST

/* ---- 8. client killed after staged: the daemon still commits --------------- */

START_TEST(test_client_killed_after_staged)
{
	struct testd t;
	struct td_child ch;
	struct rank_args a = {
		.job = "job8", .name = "orphan", .rank = 0, .world = 1,
		.arena = 512 * MiB, .bytes = 256 * MiB, .distinct = true,
		.wait_go_after_staged = true,
	};
	struct ckpt_reader *r = NULL;
	const char *rest;
	char p[TD_PATH], line[256], name[32];
	uint64_t shape[1] = { 4 * MiB };
	int rc;

	td_init(&t, "killed_after_staged");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 512M\n"), 0);
	a.sock = td_sock(&t, 0);
	a.root = t.root;

	ck_assert_int_eq(td_child_start(&ch, rank_main, &a), 0);
	rc = td_child_expect(&ch, "staged", 90000, line, sizeof(line));
	ck_assert_msg(rc == 0, "the client never reported staged (%d); it said:\n%s", rc, ch.out);
	td_child_kill(&ch);
	ck_assert_msg(parse_rc(line, &rest) == 0, "staged future in the client: %s", line);
	if (rest[0] != '1')
		fprintf(stderr, "[%s] note: the save was already committed when the client "
				"was killed; the test is weaker this run\n", t.name);

	td_path(p, sizeof(p), "%s/orphan/manifest.json", t.root);
	ck_assert_msg(td_wait_exists(p, true, 60000),
		      "%s did not appear within 60 s after the client died after staged", p);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000), "a .partial dir is left");
	td_path(p, sizeof(p), "%s/orphan", t.root);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "reader_open(%s) = %d: %s", p, rc, ckpt_last_error());
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), 16);
	for (unsigned i = 0; i < 16; i++) {
		snprintf(name, sizeof(name), "r0.t%02u", i);
		ck_assert_msg(td_verify_tensor(r, name, CKPT_F32, 1, shape, i),
			      "tensor %s of the orphaned save does not read back", name);
	}
	ckpt_reader_close(r);
	assert_status_idle(&t, "job8", 15000);
	td_fini(&t);
}
END_TEST

/* ---- 9. malformed messages ----------------------------------------------------- */

enum bad_kind {
	BAD_GARBAGE,
	BAD_MAGIC,
	BAD_VERSION,
	BAD_SIZE_FIELD,
	BAD_TRUNCATED,
	BAD_OVERSIZE,
	BAD_UNKNOWN_TYPE,
	BAD_RESERVED,
	BAD_EXTENT_BEFORE_HELLO,
	BAD_SAVE_BEGIN_BEFORE_HELLO,
	BAD_HELLO_JOB,
	BAD_HELLO_RANK,
	BAD_HELLO_UNTERMINATED,
	BAD_EXTENT_UNKNOWN_TOKEN, /* after a good HELLO */
	BAD_HELLO_TWICE,          /* after a good HELLO */
	BAD_SAVE_BEGIN_OUTSIDE,   /* after a good HELLO: descriptor outside the arena */
	BAD_COUNT
};

static const char *const bad_names[BAD_COUNT] = {
	"garbage bytes", "wrong magic", "wrong version", "size field != length",
	"truncated HELLO", "oversized message", "unknown type", "reserved field set",
	"EXTENT before HELLO", "SAVE_BEGIN before HELLO", "HELLO with job '../x'",
	"HELLO with rank >= world", "HELLO with unterminated job",
	"EXTENT with an unknown token", "second HELLO", "SAVE_BEGIN outside the arena",
};

static int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", path,
		      strerror(errno));
	return fd;
}

static void hdr(struct proto_hdr *h, uint16_t type, size_t size)
{
	memset(h, 0, sizeof(*h));
	h->magic = PROTO_MAGIC;
	h->version = PROTO_VERSION;
	h->type = type;
	h->size = (uint32_t)size;
}

static void hello_msg(struct proto_hello *m, const char *job, uint32_t rank, uint32_t world)
{
	memset(m, 0, sizeof(*m));
	hdr(&m->h, PROTO_HELLO, sizeof(*m));
	m->role = PROTO_ROLE_CLIENT;
	m->rank = rank;
	m->world = world;
	m->arena_bytes = 4 * MiB;
	snprintf(m->job, sizeof(m->job), "%s", job);
}

static void raw_send(int fd, const void *buf, size_t len)
{
	ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

	/* The daemon may already have dropped us (EPIPE/ECONNRESET): fine, the
	 * check that follows is that the connection is closed. */
	ck_assert_msg(n == (ssize_t)len || (n < 0 && (errno == EPIPE || errno == ECONNRESET)),
		      "send: %s", strerror(errno));
}

/* Receives one message (closing any fds that came with it).  Returns its
 * length, 0 at EOF, -ETIMEDOUT, or -errno. */
static ssize_t raw_recv(int fd, void *buf, size_t len, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	ssize_t n;

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (int k = 0; k < nfd; k++) {
				int x;

				memcpy(&x, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
				close(x);
			}
		}
	}
	return n;
}

/* A good HELLO on a raw connection; returns the HELLO_OK. */
static void raw_hello(int fd, const char *job, struct proto_hello_ok *ok)
{
	struct proto_hello m;
	char buf[PROTO_MSG_MAX];
	ssize_t n;

	hello_msg(&m, job, 0, 1);
	raw_send(fd, &m, sizeof(m));
	n = raw_recv(fd, buf, sizeof(buf), 10000);
	ck_assert_msg(n == (ssize_t)sizeof(*ok), "HELLO_OK: got %zd bytes, want %zu", n,
		      sizeof(*ok));
	memcpy(ok, buf, sizeof(*ok));
	ck_assert_uint_eq(ok->h.type, PROTO_HELLO_OK);
	ck_assert_uint_gt(ok->arena_bytes, 0);
}

/* Waits until the daemon closes fd (EOF or reset), reading whatever it says
 * before (an ERROR message is fine).  Returns true if closed in time. */
static bool raw_wait_closed(int fd, int timeout_ms, uint16_t *last_type)
{
	int64_t end = td_now_ms() + timeout_ms;
	char buf[PROTO_MSG_MAX + 64];

	for (;;) {
		int64_t left = end - td_now_ms();
		ssize_t n;

		if (left <= 0)
			return false;
		n = raw_recv(fd, buf, sizeof(buf), (int)left);
		if (n == 0 || n == -ECONNRESET || n == -EPIPE)
			return true;
		if (n == -ETIMEDOUT)
			return false;
		if (n < 0)
			return true;
		if ((size_t)n >= sizeof(struct proto_hdr) && last_type)
			*last_type = ((struct proto_hdr *)buf)->type;
	}
}

START_TEST(test_malformed)
{
	struct testd t;
	union {
		struct proto_hello hello;
		struct proto_extent ext;
		struct proto_save_begin sb;
		char raw[8192];
	} m;
	struct proto_hello_ok ok;
	size_t len = 0;
	int idle, idle_hello, bad;
	uint16_t last = 0;
	char name[32];

	td_init(&t, "malformed");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);

	/* Bystanders that must survive: a connection that never speaks, and
	 * one that said HELLO and holds an arena. */
	idle = raw_connect(td_sock(&t, 0));
	idle_hello = raw_connect(td_sock(&t, 0));
	raw_hello(idle_hello, "bystander", &ok);

	bad = raw_connect(td_sock(&t, 0));
	memset(&m, 0, sizeof(m));
	switch (_i) {
	case BAD_GARBAGE:
		memset(m.raw, 0xab, 13);
		len = 13;
		break;
	case BAD_MAGIC:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.magic = 0xdeadbeef;
		len = sizeof(m.hello);
		break;
	case BAD_VERSION:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.version = PROTO_VERSION + 7;
		len = sizeof(m.hello);
		break;
	case BAD_SIZE_FIELD:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.size = sizeof(m.hello) + 8;
		len = sizeof(m.hello);
		break;
	case BAD_TRUNCATED:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.size = sizeof(m.hello) - 16;
		len = sizeof(m.hello) - 16;
		break;
	case BAD_OVERSIZE:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.size = 4096;
		len = 4096;
		break;
	case BAD_UNKNOWN_TYPE:
		hdr(&m.hello.h, 77, sizeof(struct proto_hdr));
		len = sizeof(struct proto_hdr);
		break;
	case BAD_RESERVED:
		hello_msg(&m.hello, "j9", 0, 1);
		m.hello.h.reserved = 1;
		len = sizeof(m.hello);
		break;
	case BAD_EXTENT_BEFORE_HELLO:
		hdr(&m.ext.h, PROTO_EXTENT, sizeof(m.ext));
		m.ext.token = 1;
		m.ext.file_off = 0;
		m.ext.arena_off = 0;
		m.ext.len = 4096;
		len = sizeof(m.ext);
		break;
	case BAD_SAVE_BEGIN_BEFORE_HELLO:
		hdr(&m.sb.h, PROTO_SAVE_BEGIN, sizeof(m.sb));
		m.sb.token = 1;
		m.sb.desc_len = 100;
		len = sizeof(m.sb);
		break;
	case BAD_HELLO_JOB:
		hello_msg(&m.hello, "../x", 0, 1);
		len = sizeof(m.hello);
		break;
	case BAD_HELLO_RANK:
		hello_msg(&m.hello, "j9", 5, 2);
		len = sizeof(m.hello);
		break;
	case BAD_HELLO_UNTERMINATED:
		hello_msg(&m.hello, "j9", 0, 1);
		memset(m.hello.job, 'a', sizeof(m.hello.job));
		len = sizeof(m.hello);
		break;
	case BAD_EXTENT_UNKNOWN_TOKEN:
		raw_hello(bad, "j9", &ok);
		hdr(&m.ext.h, PROTO_EXTENT, sizeof(m.ext));
		m.ext.token = 12345;
		m.ext.file_off = 0;
		m.ext.arena_off = 0;
		m.ext.len = ok.slot_bytes;
		len = sizeof(m.ext);
		break;
	case BAD_HELLO_TWICE:
		raw_hello(bad, "j9", &ok);
		hello_msg(&m.hello, "j9", 0, 1);
		len = sizeof(m.hello);
		break;
	case BAD_SAVE_BEGIN_OUTSIDE:
		raw_hello(bad, "j9", &ok);
		hdr(&m.sb.h, PROTO_SAVE_BEGIN, sizeof(m.sb));
		m.sb.token = 1;
		m.sb.desc_off = ok.arena_bytes; /* one past the end */
		m.sb.desc_len = 4096;
		len = sizeof(m.sb);
		break;
	default:
		ck_abort();
	}
	raw_send(bad, m.raw, len);
	if (_i == BAD_SAVE_BEGIN_OUTSIDE) {
		/* A descriptor range outside the client's own arena is a
		 * protocol violation (server.c on_save_begin drops the client),
		 * not a save the daemon refuses: an ERROR with -EPROTO naming
		 * the range, then the connection closes.  No SAVE_ACK. */
		_Alignas(8) char buf[PROTO_MSG_MAX];
		char why[256] = "";
		ssize_t n = raw_recv(bad, buf, sizeof(buf), 10000);
		const struct proto_error *e = (const struct proto_error *)buf;
		int type = n > 0 ? proto_check(buf, (size_t)n, why, sizeof(why)) : (int)n;

		ck_assert_msg(type == PROTO_ERROR,
			      "SAVE_BEGIN outside the arena: got %d (%zd bytes, %s), want an ERROR",
			      type, n, why);
		ck_assert_msg(e->err == -EPROTO, "SAVE_BEGIN outside the arena: ERROR %d (%s)",
			      e->err, strerror(-e->err));
		ck_assert_msg(strstr(e->msg, "outside the arena") != NULL,
			      "SAVE_BEGIN outside the arena: ERROR says '%s'", e->msg);
		ck_assert_msg(raw_wait_closed(bad, 10000, NULL),
			      "SAVE_BEGIN outside the arena: ERROR but no close");
	} else {
		ck_assert_msg(raw_wait_closed(bad, 10000, &last),
			      "case '%s': the daemon did not close the connection within 10 s",
			      bad_names[_i]);
		ck_assert_msg(last != PROTO_HELLO_OK,
			      "case '%s': the daemon answered HELLO_OK", bad_names[_i]);
	}

	ck_assert_msg(td_daemon_alive(&t, 0), "case '%s' killed the daemon", bad_names[_i]);
	/* A normal client saves fine while the bad client (our end still open)
	 * and the bystanders are connected. */
	snprintf(name, sizeof(name), "after-%d", _i);
	assert_serves(&t, 0, "good9", name);
	close(bad);

	/* The bystanders were not dropped: the idle one can still say HELLO,
	 * the other one is still open (no EOF pending). */
	{
		struct pollfd p = { .fd = idle_hello, .events = POLLIN };

		ck_assert_msg(poll(&p, 1, 0) == 0, "the bystander with an arena was disturbed");
	}
	raw_hello(idle, "bystander2", &ok);
	close(idle);
	close(idle_hello);
	assert_status_idle(&t, "bystander", 15000);
	td_fini(&t);
}
END_TEST

/* ---- 10. root outside the allowed roots ---------------------------------------- */

static void expect_refused(struct testd *t, struct ckpt_client *c, const char *root,
			   const char *name, int want, const char *what)
{
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	uint64_t sh[1] = { 1024 };
	static uint8_t d[1024];
	int rc, st, cm;

	(void)t;
	rc = ckpt_save_begin(c, root, name, 1, &s);
	ck_assert_msg(rc == 0, "%s: save_begin = %d: %s", what, rc, ckpt_last_error());
	td_add(s, "x", CKPT_U8, 1, sh, d);
	rc = ckpt_save_commit(s, &fs, &fc);
	ck_assert_msg(rc == 0, "%s: commit = %d", what, rc);
	st = td_future_wait(fs, 30000);
	cm = td_future_wait(fc, 30000);
	ck_assert_msg(st == want, "%s: staged future = %d (%s), want %d (%s): %s", what, st,
		      strerror(-st), want, strerror(-want), ckpt_future_error(fs));
	ck_assert_msg(cm == want, "%s: committed future = %d (%s), want %d (%s): %s", what, cm,
		      strerror(-cm), want, strerror(-want), ckpt_future_error(fc));
	ck_assert_msg(ckpt_future_error(fc)[0] != '\0', "%s: no message with the failure", what);
	ck_assert_msg(ckpt_future_error(fs)[0] != '\0', "%s: no message on the staged future",
		      what);
	ckpt_save_free(s);
}

START_TEST(test_root_not_allowed)
{
	struct testd t;
	struct ckpt_client *c;
	char other[TD_PATH], link[TD_PATH];

	td_init(&t, "root_not_allowed");
	td_path(other, sizeof(other), "%s/other", t.dir);
	ck_assert_int_eq(mkdir(other, 0755), 0);
	td_path(link, sizeof(link), "%s/escape", t.root);
	ck_assert_int_eq(symlink(other, link), 0);
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	c = td_connect(td_sock(&t, 0), "job10", 0, 1, 16 * MiB);

	expect_refused(&t, c, other, "outside", -EACCES, "root outside the allowed roots");
	ck_assert_msg(td_count_entries(other, "") == 0, "something was created in %s", other);
	expect_refused(&t, c, "/", "outside", -EACCES, "root /");
	expect_refused(&t, c, link, "via-link", -EACCES, "root through a symlink out of the root");
	ck_assert_msg(td_count_entries(other, "") == 0, "something was created in %s", other);
	ck_assert_msg(td_count_entries(t.root, "") == 1, "something was created in %s", t.root);

	/* and the client still works */
	ckpt_disconnect(c);
	assert_serves(&t, 0, "job10b", "inside");
	td_fini(&t);
}
END_TEST

/* ---- 11. invalid names, existing names ------------------------------------------ */

START_TEST(test_invalid_names)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	char long_name[CKPT_MAX_NAME_LEN + 2], max_name[CKPT_MAX_NAME_LEN + 1];
	const char *bad[] = { "../x", "", long_name, "a/b", ".hidden", "..", "sp ace", "x\n" };
	const char *bad_roots[] = { "relative/root", "", "/a/../b" };
	int rc;

	memset(long_name, 'n', CKPT_MAX_NAME_LEN + 1);
	long_name[CKPT_MAX_NAME_LEN + 1] = '\0';
	memset(max_name, 'm', CKPT_MAX_NAME_LEN);
	max_name[CKPT_MAX_NAME_LEN] = '\0';

	td_init(&t, "invalid_names");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	c = td_connect(td_sock(&t, 0), "job11", 0, 1, 16 * MiB);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		s = NULL;
		rc = ckpt_save_begin(c, t.root, bad[i], 1, &s);
		ck_assert_msg(rc == -EINVAL, "save_begin(name \"%.20s\"%s) = %d, want -EINVAL",
			      bad[i], strlen(bad[i]) > 20 ? "..." : "", rc);
		ck_assert_ptr_null(s);
		ck_assert_msg(ckpt_last_error()[0] != '\0', "no message for name \"%.20s\"",
			      bad[i]);
	}
	for (size_t i = 0; i < sizeof(bad_roots) / sizeof(bad_roots[0]); i++) {
		s = NULL;
		rc = ckpt_save_begin(c, bad_roots[i], "ok", 1, &s);
		ck_assert_msg(rc == -EINVAL, "save_begin(root \"%s\") = %d, want -EINVAL",
			      bad_roots[i], rc);
		ck_assert_ptr_null(s);
	}
	/* 128 characters is still a valid name, and saves. */
	ckpt_disconnect(c);
	assert_serves(&t, 0, "job11b", max_name);
	ck_assert_int_eq(td_count_entries(t.root, ""), 1);
	td_fini(&t);
}
END_TEST

START_TEST(test_name_exists)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r = NULL;
	uint64_t sh[2] = { 256, 1024 };
	float *a, *b;
	char p[TD_PATH], msg[1024];
	int st, cm;

	td_init(&t, "name_exists");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	a = malloc(256 * 1024 * 4);
	b = malloc(256 * 1024 * 4);
	ck_assert(a && b);
	td_fill(a, 256 * 1024 * 4, 111, 0);
	td_fill(b, 256 * 1024 * 4, 222, 0);

	c = td_connect(td_sock(&t, 0), "job11", 0, 1, 16 * MiB);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "dup", 1, &s), 0);
	td_add(s, "w", CKPT_F32, 2, sh, a);
	ck_assert_int_eq(td_commit_wait(s, 60000, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == 0 && cm == 0, "first save: %d %d %s", st, cm, msg);
	ckpt_save_free(s);

	s = NULL;
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "dup", 2, &s), 0);
	td_add(s, "w", CKPT_F32, 2, sh, b);
	ck_assert_int_eq(td_commit_wait(s, 60000, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == -EEXIST, "second save of 'dup': staged %d (%s), want -EEXIST: %s", st,
		      strerror(-st), msg);
	ck_assert_msg(cm == -EEXIST, "second save of 'dup': committed %d (%s), want -EEXIST: %s",
		      cm, strerror(-cm), msg);
	ck_assert_msg(msg[0] != '\0', "no message with -EEXIST");
	ckpt_save_free(s);
	ckpt_disconnect(c);

	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000), "a .partial dir is left");
	td_path(p, sizeof(p), "%s/dup", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	ck_assert_uint_eq(ckpt_reader_step(r), 1);
	ck_assert_msg(td_verify_tensor(r, "w", CKPT_F32, 2, sh, 111),
		      "the existing checkpoint changed after a refused save of the same name");
	ckpt_reader_close(r);
	free(a);
	free(b);
	td_fini(&t);
}
END_TEST

/* ---- 13. a rank disconnects mid-save ---------------------------------------------- */

START_TEST(test_rank_disconnects)
{
	struct testd t;
	struct td_child ch[3];
	struct rank_args a[3];
	char line[1024], p[TD_PATH];
	int rc;

	td_init(&t, "rank_disconnects");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\ncommit_deadline = 30s\n"), 0);
	for (int k = 0; k < 3; k++) {
		a[k] = (struct rank_args){
			.sock = td_sock(&t, 0), .root = t.root, .job = "job13", .name = "lost",
			.rank = (uint32_t)k, .world = 3, .arena = 64 * MiB,
			.bytes = k < 2 ? 32 * MiB : 1024 * MiB, .distinct = k < 2,
			.wait_go_after_commit = k == 2,
		};
	}
	/* Ranks 0 and 1 stage their shards; then rank 2 starts a large save
	 * and dies in the middle of staging it. */
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(td_child_start(&ch[k], rank_main, &a[k]), 0);
	for (int k = 0; k < 2; k++) {
		rc = td_child_expect(&ch[k], "staged", 60000, line, sizeof(line));
		ck_assert_msg(rc == 0 && parse_rc(line, NULL) == 0,
			      "rank %d did not stage (%d): %s", k, rc, ch[k].out);
	}
	ck_assert_int_eq(td_child_start(&ch[2], rank_main, &a[2]), 0);
	rc = td_child_expect(&ch[2], "commit", 60000, line, sizeof(line));
	ck_assert_msg(rc == 0 && parse_rc(line, NULL) == 0, "rank 2 commit: %s", ch[2].out);
	wait_rank_staging(&t, "lost", 2, 5000);
	td_child_kill(&ch[2]);
	ck_assert_msg(!strstr(ch[2].out, "staged"), "test premise: rank 2 staged before the kill");

	for (int k = 0; k < 2; k++) {
		const char *msg;

		rc = td_child_expect(&ch[k], "committed", 60000, line, sizeof(line));
		ck_assert_msg(rc == 0, "rank %d: no committed result within 60 s: %s", k, ch[k].out);
		rc = parse_rc(line, &msg);
		ck_assert_msg(rc == -ECANCELED,
			      "rank %d: committed future = %d (%s), want -ECANCELED: %s", k, rc,
			      strerror(-rc), msg);
		ck_assert_msg(td_msg_names_rank(msg, 2),
			      "rank %d: the message does not name rank 2: \"%s\"", k, msg);
		rc = td_child_wait(&ch[k], 30000);
		ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "rank %d: %s", k,
			      td_status_str(rc));
	}
	td_path(p, sizeof(p), "%s/lost", t.root);
	ck_assert_msg(!td_exists(p), "%s exists although rank 2 died", p);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 15000),
		      "the .partial dir of the failed save is still there after 15 s");
	assert_status_idle(&t, "job13", 15000);
	td_fini(&t);
}
END_TEST

/* ---- 13b. a rank of another daemon fails: the coordinator gives up at once ---- */

/*
 * Rank 0 saves through daemon 0 (the coordinator), rank 1 through daemon 1
 * and dies while staging.  Daemon 1 fails the save and marks the work area
 * failed; daemon 0 must fail it on that marker, long before its 120 s
 * commit deadline, and say why.
 */
START_TEST(test_other_daemon_fails)
{
	struct testd t;
	struct td_child ch[2];
	struct rank_args a[2];
	char line[1024], p[TD_PATH];
	const char *msg;
	int rc;

	td_init(&t, "other_daemon_fails");
	for (int d = 0; d < 2; d++)
		ck_assert_int_eq(td_daemon_start(&t, d, "arena_max = 64M\ncommit_deadline = 120s\n"),
				 0);
	for (int k = 0; k < 2; k++)
		a[k] = (struct rank_args){
			.sock = td_sock(&t, k), .root = t.root, .job = "job13b", .name = "half",
			.rank = (uint32_t)k, .world = 2, .arena = 64 * MiB,
			.bytes = k == 0 ? 32 * MiB : 1024 * MiB, .distinct = k == 0,
		};
	ck_assert_int_eq(td_child_start(&ch[0], rank_main, &a[0]), 0);
	rc = td_child_expect(&ch[0], "staged", 60000, line, sizeof(line));
	ck_assert_msg(rc == 0 && parse_rc(line, NULL) == 0, "rank 0 did not stage: %s", ch[0].out);
	ck_assert_int_eq(td_child_start(&ch[1], rank_main, &a[1]), 0);
	rc = td_child_expect(&ch[1], "commit", 60000, line, sizeof(line));
	ck_assert_msg(rc == 0 && parse_rc(line, NULL) == 0, "rank 1 commit: %s", ch[1].out);
	td_sleep_ms(200);
	td_child_kill(&ch[1]);
	ck_assert_msg(!strstr(ch[1].out, "staged"), "test premise: rank 1 staged before the kill");

	rc = td_child_expect(&ch[0], "committed", 60000, line, sizeof(line));
	ck_assert_msg(rc == 0, "rank 0: no committed result within 60 s (deadline 120 s): %s",
		      ch[0].out);
	rc = parse_rc(line, &msg);
	ck_assert_msg(rc < 0, "rank 0 committed a save whose rank 1 died: %s", msg);
	ck_assert_msg(strstr(msg, "gave up"), "rank 0's message does not say why: \"%s\"", msg);
	rc = td_child_wait(&ch[0], 30000);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "rank 0: %s",
		      td_status_str(rc));
	td_path(p, sizeof(p), "%s/half", t.root);
	ck_assert_msg(!td_exists(p), "%s exists although rank 1 died", p);
	td_fini(&t);
}
END_TEST

/* ---- 14. a rank that never saves: deadline ------------------------------------------ */

START_TEST(test_rank_missing_deadline)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	uint64_t sh[1] = { 4096 };
	static int64_t d[4096];
	char p[TD_PATH];
	int64_t t0, el;
	int st, cm;

	td_init(&t, "rank_missing");
	ck_assert_int_eq(td_daemon_start(&t, 0, "commit_deadline = 2s\n"), 0);
	td_fill(d, sizeof(d), 14, 0);
	c = td_connect(td_sock(&t, 0), "job14", 0, 2, 16 * MiB);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "half", 1, &s), 0);
	td_add(s, "d", CKPT_I64, 1, sh, d);
	t0 = td_now_ms();
	ck_assert_int_eq(ckpt_save_commit(s, &fs, &fc), 0);
	st = td_future_wait(fs, 30000);
	ck_assert_msg(st == 0, "staged = %d: %s", st, ckpt_future_error(fs));
	cm = td_future_wait(fc, 30000);
	el = td_now_ms() - t0;
	ck_assert_msg(cm == -ETIMEDOUT, "committed = %d (%s) after %lld ms, want -ETIMEDOUT: %s", cm,
		      strerror(-cm), (long long)el, ckpt_future_error(fc));
	ck_assert_msg(td_msg_names_rank(ckpt_future_error(fc), 1),
		      "the deadline message does not name rank 1: \"%s\"", ckpt_future_error(fc));
	ck_assert_msg(el >= 1000, "failed after %lld ms, before the 2 s deadline", (long long)el);
	ckpt_save_free(s);
	ckpt_disconnect(c);

	td_path(p, sizeof(p), "%s/half", t.root);
	ck_assert_msg(!td_exists(p), "%s exists", p);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000),
		      "the .partial dir of the timed-out save is still there");
	td_fini(&t);
}
END_TEST

/* (15. leftovers of a crash: in check_adversarial.c, deep_leftovers) */

/* ---- the daemon dies mid-save ---------------------------------------------------- */

/* SIGTERM (systemd stop or restart): a save the daemon already owns (every
 * byte staged) still commits before the daemon exits; one still staging
 * fails, and nothing of it is visible. */
START_TEST(test_graceful_stop)
{
	struct testd t;
	struct ckpt_client *c, *c2;
	struct ckpt_save *s, *s2;
	struct ckpt_future *fs, *fc, *fs2, *fc2;
	struct ckpt_reader *r;
	uint64_t shape[1] = { 4 * MiB };
	unsigned char *buf;
	char name[32], p[TD_PATH];
	int status, st2, cm2;

	td_init(&t, "graceful_stop");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 256M\narena_total = 512M\n"), 0);
	buf = malloc(64 * MiB);
	ck_assert_ptr_nonnull(buf);
	td_fill(buf, 64 * MiB, 11, 0);

	/* Client 1: 64 MiB into a 128 MiB arena, staged before the signal. */
	c = td_connect(td_sock(&t, 0), "jobS", 0, 1, 128 * MiB);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "owned", 1, &s), 0);
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		td_add(s, name, CKPT_F32, 1, shape, buf + (size_t)i * 16 * MiB);
	}
	ck_assert_int_eq(ckpt_save_commit(s, &fs, &fc), 0);
	ck_assert_int_eq(td_future_wait(fs, 20000), 0);

	/* Client 2: 512 MiB through a 4 MiB arena: still staging at the signal. */
	c2 = td_connect(td_sock(&t, 0), "jobT", 0, 1, 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(c2, t.root, "staging", 1, &s2), 0);
	for (int i = 0; i < 32; i++) {
		snprintf(name, sizeof(name), "t%02d", i);
		td_add(s2, name, CKPT_F32, 1, shape, buf + (size_t)(i % 4) * 16 * MiB);
	}
	ck_assert_int_eq(ckpt_save_commit(s2, &fs2, &fc2), 0);
	td_sleep_ms(20);

	status = td_daemon_stop(&t, 0);
	ck_assert_msg(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "ckptd did not exit cleanly on SIGTERM: %s", td_status_str(status));

	/* The owned save committed, and its client was told. */
	ck_assert_int_eq(td_future_wait(fc, 20000), 0);
	td_path(p, sizeof(p), "%s/owned", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	{
		unsigned char *back = malloc(16 * MiB);
		ck_assert_ptr_nonnull(back);
		for (int i = 0; i < 4; i++) {
			snprintf(name, sizeof(name), "t%d", i);
			ck_assert_int_eq(ckpt_reader_read_tensor(r, name, back, 16 * MiB), 0);
			ck_assert_msg(memcmp(back, buf + (size_t)i * 16 * MiB, 16 * MiB) == 0,
				      "tensor %s differs after a graceful stop", name);
		}
		free(back);
	}
	ckpt_reader_close(r);

	/* The other failed, with nothing visible. */
	st2 = td_future_wait(fs2, 20000);
	cm2 = td_future_wait(fc2, 20000);
	ck_assert_msg(cm2 < 0 && cm2 != -EINPROGRESS && cm2 != -ETIMEDOUT,
		      "a save still staging at SIGTERM: committed %d (staged %d)", cm2, st2);
	td_path(p, sizeof(p), "%s/staging", t.root);
	ck_assert_msg(!td_exists(p), "a save still staging at SIGTERM became visible");

	ckpt_save_free(s);
	ckpt_save_free(s2);
	ckpt_disconnect(c);
	ckpt_disconnect(c2);
	free(buf);
	td_fini(&t);
}
END_TEST

START_TEST(test_daemon_dies)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	uint64_t shape[1] = { 4 * MiB };
	unsigned char *buf;
	char name[32], p[TD_PATH];
	int64_t t0;
	int st, cm;

	td_init(&t, "daemon_dies");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);
	buf = malloc(16 * MiB);
	ck_assert_ptr_nonnull(buf);
	td_fill(buf, 16 * MiB, 5, 0);
	c = td_connect(td_sock(&t, 0), "jobX", 0, 1, 64 * MiB);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "doomed", 1, &s), 0);
	for (int i = 0; i < 64; i++) {
		snprintf(name, sizeof(name), "t%02d", i);
		td_add(s, name, CKPT_F32, 1, shape, buf);
	}
	ck_assert_int_eq(ckpt_save_commit(s, &fs, &fc), 0);
	td_sleep_ms(50);
	td_daemon_kill(&t, 0);
	t0 = td_now_ms();
	st = td_future_wait(fs, 20000);
	cm = td_future_wait(fc, 20000);
	ck_assert_msg(st < 0 && st != -EINPROGRESS,
		      "staged future after the daemon died: %d (%s) (want a failure)", st,
		      strerror(-st));
	ck_assert_msg(cm < 0 && cm != -EINPROGRESS,
		      "committed future after the daemon died: %d (%s) (want a failure)", cm,
		      strerror(-cm));
	ck_assert_msg(ckpt_future_error(fc)[0] != '\0', "no message after the daemon died");
	ck_assert_msg(td_now_ms() - t0 < 20000, "futures took too long to fail");
	ckpt_save_free(s);
	/* a new save on the dead connection is refused, not hung */
	s = NULL;
	if (ckpt_save_begin(c, t.root, "later", 2, &s) == 0) {
		int rc;

		td_add(s, "x", CKPT_F32, 1, shape, buf);
		rc = ckpt_save_commit(s, &fs, &fc);
		if (rc == 0) {
			cm = td_future_wait(fc, 10000);
			ck_assert_msg(cm < 0 && cm != -EINPROGRESS,
				      "a save on a dead connection: %d", cm);
		} else {
			ck_assert_int_eq(rc, -ENOTCONN);
		}
		ckpt_save_free(s);
	}
	ckpt_disconnect(c);
	td_path(p, sizeof(p), "%s/doomed/manifest.json", t.root);
	ck_assert_msg(!td_exists(p), "a save committed although the daemon died");
	free(buf);
	/* A new daemon on the same root removes the work dir only when old: so
	 * just check the restart works and serves. */
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);
	assert_serves(&t, 0, "jobY", "reborn");
	td_fini(&t);
}
END_TEST

/* ---- 16. the file system refuses the bytes -------------------------------------------- */

/*
 * ckptd runs under a file size limit (RLIMIT_FSIZE, what LimitFSIZE= sets):
 * a real kernel refusal on the daemon's own files, without a special disk.
 *   - a shard larger than the limit is refused when its space is reserved,
 *     before any byte is staged: -EFBIG with a message;
 *   - a shard exactly at the limit whose size is not a multiple of 4 KiB
 *     passes the reservation, and its last O_DIRECT write (padded to 4 KiB)
 *     crosses the limit: the write path fails the save with a message.
 * Neither leaves anything partial or touches the checkpoint saved before, and
 * the daemon (which must not die of SIGXFSZ) goes on serving.  The limit
 * holds for the daemon's memfds too, so an arena above it is refused.
 */
static void save_one(struct testd *t, struct ckpt_client *c, const char *name, uint64_t rows,
		     const float *buf, int *st, int *cm, char *msg, size_t msglen)
{
	struct ckpt_save *s = NULL;
	uint64_t sh[2] = { rows, 1025 };

	ck_assert_int_eq(ckpt_save_begin(c, t->root, name, 7, &s), 0);
	td_add(s, "w", CKPT_F32, 2, sh, buf);
	ck_assert_int_eq(td_commit_wait(s, 60000, st, cm, msg, msglen), 0);
	ckpt_save_free(s);
}

START_TEST(test_write_errors)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_reader *r = NULL;
	uint64_t sh[2] = { 1025, 1025 }; /* 4,202,500 bytes: not a multiple of 4 KiB */
	size_t big = 2050 * 1025 * sizeof(float);
	float *a, *b;
	char p[TD_PATH], msg[1024];
	struct stat stt;
	int st, cm;

	td_init(&t, "write_errors");
	a = malloc(big);
	b = malloc(big);
	ck_assert(a && b);
	td_fill(a, big, 31, 0);
	td_fill(b, big, 32, 0);

	/* The size of the shard file for one 1025 x 1025 f32 tensor. */
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	c = td_connect(td_sock(&t, 0), "jobF", 0, 1, 16 * MiB);
	save_one(&t, c, "ok-1", 1025, a, &st, &cm, msg, sizeof(msg));
	ck_assert_msg(st == 0 && cm == 0, "first save: %d %d %s", st, cm, msg);
	ckpt_disconnect(c);
	td_path(p, sizeof(p), "%s/ok-1/rank-00000.safetensors", t.root);
	ck_assert_int_eq(stat(p, &stt), 0);
	ck_assert_msg(stt.st_size % 4096 != 0, "shard size %lld is 4 KiB-aligned",
		      (long long)stt.st_size);
	ck_assert_int_eq(td_daemon_stop(&t, 0), 0);

	t.d[0].fsize_limit = (uint64_t)stt.st_size;
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	/* memfds obey the limit too: an arena above it is refused, saying why. */
	c = NULL;
	ck_assert_int_eq(td_connect_rc(td_sock(&t, 0), "jobF", 0, 1, 16 * MiB, &c), -EFBIG);
	ck_assert_msg(strstr(ckpt_last_error(), "LimitFSIZE") != NULL, "message: %s",
		      ckpt_last_error());
	/* The smallest arena (4 MiB) fits under it. */
	c = td_connect(td_sock(&t, 0), "jobF", 0, 1, 4 * MiB);

	/* Larger than the limit: refused at the reservation. */
	save_one(&t, c, "ok-2", 2050, b, &st, &cm, msg, sizeof(msg));
	ck_assert_msg(st == -EFBIG && cm == -EFBIG, "shard over the limit: staged %d, committed "
		      "%d (want -EFBIG): %s", st, cm, msg);
	ck_assert_msg(strstr(msg, "no room") != NULL, "message: %s", msg);

	/* At the limit: the padded last write fails. */
	save_one(&t, c, "ok-3", 1025, b, &st, &cm, msg, sizeof(msg));
	ck_assert_msg(cm < 0 && cm != -EINPROGRESS, "the last write crossing the limit: "
		      "committed %d (want a failure): %s", cm, msg);
	ck_assert_msg(strstr(msg, "writing the shard of rank 0") != NULL &&
			      strstr(msg, "file size limit") != NULL,
		      "message: %s", msg);

	/* The daemon still serves, and smaller saves fit. */
	ck_assert(td_daemon_alive(&t, 0));
	save_one(&t, c, "ok-4", 64, b, &st, &cm, msg, sizeof(msg));
	ck_assert_msg(st == 0 && cm == 0, "a save under the limit: %d %d %s", st, cm, msg);
	ckpt_disconnect(c);

	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000), "a .partial dir is left");
	td_path(p, sizeof(p), "%s/ok-2", t.root);
	ck_assert_msg(!td_exists(p), "a refused save is visible");
	td_path(p, sizeof(p), "%s/ok-3", t.root);
	ck_assert_msg(!td_exists(p), "a failed save is visible");
	td_path(p, sizeof(p), "%s/ok-1", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	ck_assert_msg(td_verify_tensor(r, "w", CKPT_F32, 2, sh, 31),
		      "the earlier checkpoint changed after failed saves");
	ckpt_reader_close(r);
	free(a);
	free(b);
	td_fini(&t);
}
END_TEST

static Suite *failures_suite(void)
{
	Suite *s = suite_create("integration_failures");

	td_case(s, "no_daemon", test_no_daemon, 30, 0, 1);
	td_case(s, "client_killed_mid_staging", test_client_killed_mid_staging, 120, 0, 2);
	td_case(s, "client_killed_after_staged", test_client_killed_after_staged, 120, 0, 1);
	td_case(s, "malformed_messages", test_malformed, 60, 0, BAD_COUNT);
	td_case(s, "root_not_allowed", test_root_not_allowed, 60, 0, 1);
	td_case(s, "invalid_names", test_invalid_names, 60, 0, 1);
	td_case(s, "name_exists", test_name_exists, 60, 0, 1);
	td_case(s, "rank_disconnects", test_rank_disconnects, 120, 0, 1);
	td_case(s, "other_daemon_fails", test_other_daemon_fails, 120, 0, 1);
	td_case(s, "rank_missing_deadline", test_rank_missing_deadline, 60, 0, 1);
	td_case(s, "graceful_stop", test_graceful_stop, 90, 0, 1);
	td_case(s, "daemon_dies", test_daemon_dies, 90, 0, 1);
	td_case(s, "write_errors", test_write_errors, 120, 0, 1);
	return s;
}

int main(void)
{
	return td_main(failures_suite(), "check_failures");
}
