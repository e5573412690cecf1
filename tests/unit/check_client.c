/* SPDX-License-Identifier: MIT */
/*
 * check_client.c - libckpt against an in-process fake daemon (fake_ckptd):
 * connecting, building saves, the staging pipeline (images, backpressure,
 * refusals, lost connections, futures), and reading a checkpoint back.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "client/internal.h"
#include "format/crc32c.h"
#include "format/index.h"
#include "format/layout.h"
#include "tests/lib/fake_ckptd.h"

#define MiB (1ull << 20)
#define JOB "job-1"

/* A device tensor where CUDA cannot serve it: main() points the runtime
 * loader at a file that does not exist, so a CUDA build refuses with the
 * loader's reason and a build without CUDA with its own (check_cuda.c has
 * the device tensors that work). */
#ifdef CKPT_HAVE_CUDA
#define NO_CUDA_ERR (-ENODEV)
#define NO_CUDA_MSG "cannot load the CUDA runtime"
#else
#define NO_CUDA_ERR (-EOPNOTSUPP)
#define NO_CUDA_MSG "CUDA copy engine"
#endif
#define ROOT "/ckpt/root"

/* ---- environment: a temp dir, a fake daemon, a client ---- */

struct env {
	char dir[256];
	char sock[320];
	struct fake_ckptd *fake;
	struct ckpt_client *c;
};

static void env_dir(struct env *e)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(e->dir, sizeof(e->dir), "%s/check-client-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(e->dir));
	snprintf(e->sock, sizeof(e->sock), "%s/ckptd.sock", e->dir);
}

static struct ckpt_connect_opts opts_for(const struct env *e, uint64_t arena)
{
	return (struct ckpt_connect_opts){
		CKPT_CONNECT_OPTS_INIT,
		.socket_path = e->sock,
		.job = JOB,
		.rank = 0,
		.world = 1,
		.arena_bytes = arena,
	};
}

/* Starts a fake with `fo` (its socket_path is filled in) and connects. */
static void env_start(struct env *e, struct fake_ckptd_opts fo, uint64_t arena)
{
	memset(e, 0, sizeof(*e));
	env_dir(e);
	fo.socket_path = e->sock;
	if (!fo.arena_max)
		fo.arena_max = arena;
	ck_assert_int_eq(fake_ckptd_start(&fo, &e->fake), 0);
	struct ckpt_connect_opts o = opts_for(e, arena);
	int r = ckpt_connect(&o, &e->c);
	ck_assert_msg(r == 0, "connect: %d %s", r, ckpt_last_error());
}

static void rm_rf(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

static void env_stop(struct env *e)
{
	struct fake_ckptd_stats st;

	ckpt_disconnect(e->c);
	e->c = NULL;
	if (e->fake) {
		fake_ckptd_stats(e->fake, &st);
		ck_assert_msg(st.violations == 0, "client broke the protocol: %s", st.violation);
	}
	fake_ckptd_stop(e->fake);
	e->fake = NULL;
	rm_rf(e->dir);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void fill_pattern(void *buf, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	unsigned char *p = buf;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

/* ---- checking a safetensors image ---- */

struct expect {
	const char *name;
	const char *dtype;
	unsigned ndim;
	uint64_t shape[4];
	const void *data;
	size_t len;
};

static void check_image(const struct fake_save *fs, const struct expect *ex, size_t n)
{
	const uint8_t *img = fs->image;
	uint64_t hlen = 0, data_start, file_size = fs->layout.file_size, max_end = 0;
	json_error_t jerr;
	json_t *root, *meta;

	ck_assert_uint_ge(file_size, 8);
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | img[i];
	data_start = 8 + hlen;
	ck_assert_uint_eq(data_start % 4096, 0);
	ck_assert_uint_le(data_start, file_size);
	root = json_loadb((const char *)img + 8, hlen, 0, &jerr);
	ck_assert_msg(root != NULL, "header JSON: %s", jerr.text);
	ck_assert(json_is_object(root));
	meta = json_object_get(root, "__metadata__");
	ck_assert(json_is_object(meta));
	ck_assert_str_eq(json_string_value(json_object_get(meta, "format")), "pt");
	ck_assert_uint_eq(json_object_size(root), n + 1);

	for (size_t i = 0; i < n; i++) {
		json_t *t = json_object_get(root, ex[i].name);
		ck_assert_msg(json_is_object(t), "no entry '%s'", ex[i].name);
		ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), ex[i].dtype);
		json_t *shape = json_object_get(t, "shape");
		ck_assert_uint_eq(json_array_size(shape), ex[i].ndim);
		for (unsigned d = 0; d < ex[i].ndim; d++)
			ck_assert_uint_eq(json_integer_value(json_array_get(shape, d)),
					  ex[i].shape[d]);
		json_t *offs = json_object_get(t, "data_offsets");
		ck_assert_uint_eq(json_array_size(offs), 2);
		uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
		uint64_t en = (uint64_t)json_integer_value(json_array_get(offs, 1));
		ck_assert_uint_eq(en - b, ex[i].len);
		ck_assert_uint_le(data_start + en, file_size);
		ck_assert_msg(memcmp(img + data_start + b, ex[i].data, ex[i].len) == 0,
			      "bytes of '%s' differ", ex[i].name);
		if (en > max_end)
			max_end = en;
	}
	/* Packed with no hole at the end. */
	ck_assert_uint_eq(data_start + max_end, file_size);
	json_decref(root);
}

/* Waits for a future with a generous timeout and returns its result. */
static int wait_fut(struct ckpt_future *f)
{
	return ckpt_future_wait(f, 30000);
}

/* Commits s, waits for both futures, frees s.  Returns the committed
 * future's result (staged must succeed). */
static int td_commit_ok(struct ckpt_save *s)
{
	struct ckpt_future *st, *cm;
	int r;

	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), 0);
	r = wait_fut(cm);
	ckpt_save_free(s);
	return r;
}

/* ---- connect ---- */

START_TEST(test_connect_no_daemon)
{
	struct env e;
	struct ckpt_client *c = (void *)1;
	struct ckpt_connect_opts o;

	memset(&e, 0, sizeof(e));
	env_dir(&e);
	o = opts_for(&e, 0);
	ck_assert_int_eq(ckpt_connect(&o, &c), -ENOENT);
	ck_assert_ptr_eq(c, (void *)1);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "no ckptd listening on"));
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), e.sock));

	/* A socket file nobody listens on. */
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, e.sock);
	ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(s);
	ck_assert_int_eq(ckpt_connect(&o, &c), -ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "no ckptd listening on"));

	/* $CKPTD_SOCKET is used when the options name no socket. */
	unlink(e.sock);
	setenv("CKPTD_SOCKET", e.sock, 1);
	o.socket_path = NULL;
	ck_assert_int_eq(ckpt_connect(&o, &c), -ENOENT);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), e.sock));
	unsetenv("CKPTD_SOCKET");
	rm_rf(e.dir);
}
END_TEST

START_TEST(test_connect_bad_opts)
{
	struct ckpt_client *c = (void *)1;
	struct ckpt_connect_opts good = {
		CKPT_CONNECT_OPTS_INIT, .socket_path = "/nonexistent/ckptd.sock", .job = JOB,
		.rank = 0, .world = 1,
	};
	struct ckpt_connect_opts o;

	ck_assert_int_eq(ckpt_connect(NULL, &c), -EINVAL);
	o = good;
	o.job = NULL;
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	o.job = "";
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	o.job = "a/b";
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	ck_assert_str_ne(ckpt_last_error(), "");
	o = good;
	o.world = 0;
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	o.world = CKPT_MAX_WORLD + 1;
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	o = good;
	o.rank = 1;
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "rank"));
	o = good;
	o.copy_threads = 65;
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	ck_assert_ptr_eq(c, (void *)1);
	/* Valid options reach the socket. */
	ck_assert_int_eq(ckpt_connect(&good, &c), -ENOENT);
	ckpt_disconnect(NULL);
}
END_TEST

START_TEST(test_connect_refused)
{
	struct env e;
	struct ckpt_client *c = (void *)1;
	struct fake_ckptd_opts fo = { .refuse_hello = -EACCES };

	memset(&e, 0, sizeof(e));
	env_dir(&e);
	fo.socket_path = e.sock;
	ck_assert_int_eq(fake_ckptd_start(&fo, &e.fake), 0);
	struct ckpt_connect_opts o = opts_for(&e, 0);
	ck_assert_int_eq(ckpt_connect(&o, &c), -EACCES);
	ck_assert_ptr_eq(c, (void *)1);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "refused on purpose"));
	fake_ckptd_stop(e.fake);
	rm_rf(e.dir);
}
END_TEST

START_TEST(test_connect_ok)
{
	struct env e;
	struct fake_ckptd_opts fo = { .arena_max = 16 * MiB };

	/* Wants 1 GiB (the default), the daemon grants 16 MiB. */
	env_start(&e, fo, 0);
	ck_assert_uint_eq(ckpt_client_arena_bytes(e.c), 16 * MiB);
	ck_assert_uint_eq(ckpt_client_arena_bytes(NULL), 0);
	env_stop(&e);
}
END_TEST

/* The nice values of this process's threads named `comm`; returns how
 * many there are. */
static int nice_of_threads(const char *comm, int *nice, int max)
{
	char path[320], buf[512];
	int n = 0;
	DIR *d = opendir("/proc/self/task");

	ck_assert_ptr_nonnull(d);
	for (struct dirent *de; (de = readdir(d)) != NULL;) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue; /* the thread has exited */
		bool match = fgets(buf, sizeof(buf), f) && strncmp(buf, comm, strlen(comm)) == 0 &&
			     buf[strlen(comm)] == '\n';
		fclose(f);
		if (!match || n == max)
			continue;
		/* Field 19 of stat is the nice value; field 2 (comm) ends at
		 * the last ')'. */
		snprintf(path, sizeof(path), "/proc/self/task/%s/stat", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* the thread has exited since */
		bool read = fgets(buf, sizeof(buf), f) != NULL;
		fclose(f);
		if (!read)
			continue;
		const char *p = strrchr(buf, ')');
		ck_assert_ptr_nonnull(p);
		int field = 2;
		for (p++; *p && field < 19; p++)
			if (*p == ' ')
				field++;
		nice[n++] = atoi(p);
	}
	closedir(d);
	return n;
}

/* $CKPT_COPY_NICE lowers the copy threads' priority, and only theirs: the
 * caller's threads and the library's other threads keep the process's. */
START_TEST(test_copy_nice)
{
	struct env e;
	struct fake_ckptd_opts fo = { .arena_max = 16 * MiB };
	int nice[CLI_MAX_COPY_THREADS], base;

	errno = 0;
	base = getpriority(PRIO_PROCESS, 0);
	ck_assert_int_eq(errno, 0);
	if (base > 12)
		return; /* already nearly as low as it goes: nothing to see */
	setenv("CKPT_COPY_NICE", "7", 1);
	memset(&e, 0, sizeof(e));
	env_dir(&e);
	fo.socket_path = e.sock;
	ck_assert_int_eq(fake_ckptd_start(&fo, &e.fake), 0);
	struct ckpt_connect_opts o = opts_for(&e, 16 * MiB);
	o.copy_threads = 3;
	ck_assert_int_eq(ckpt_connect(&o, &e.c), 0);
	unsetenv("CKPT_COPY_NICE");
	/* Each copy thread sets its own value as it starts. */
	for (int tries = 0;; tries++) {
		int n = nice_of_threads("ckpt-copy", nice, CLI_MAX_COPY_THREADS);
		bool all = n == 3;
		for (int i = 0; i < n; i++)
			all = all && nice[i] == base + 7;
		if (all)
			break;
		ck_assert_msg(tries < 30000, "copy threads: %d found, want 3 at nice %d", n, base + 7);
		usleep(1000);
	}
	/* The other threads name themselves as they start, too. */
	static const char *const others[] = { "ckpt-save", "ckpt-recv" };
	for (int k = 0; k < 2; k++) {
		for (int tries = 0; nice_of_threads(others[k], nice, 1) != 1; tries++) {
			ck_assert_msg(tries < 30000, "no thread named %s", others[k]);
			usleep(1000);
		}
		ck_assert_int_eq(nice[0], base);
	}
	ck_assert_int_eq(getpriority(PRIO_PROCESS, 0), base);
	env_stop(&e);
}
END_TEST

/* A daemon that accepts and never answers: connect gives up after
 * timeout_ms with -ETIMEDOUT and says what it waited for. */
START_TEST(test_connect_timeout)
{
	struct env e;
	struct ckpt_client *c = (void *)1;
	struct fake_ckptd_opts fo = { .silent = true };
	struct fake_ckptd_stats st;

	memset(&e, 0, sizeof(e));
	env_dir(&e);
	fo.socket_path = e.sock;
	ck_assert_int_eq(fake_ckptd_start(&fo, &e.fake), 0);
	struct ckpt_connect_opts o = opts_for(&e, 0);
	o.timeout_ms = 300;
	ck_assert_int_eq(ckpt_connect(&o, &c), -ETIMEDOUT);
	ck_assert_ptr_eq(c, (void *)1);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "did not answer HELLO within 300 ms"));
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), e.sock));
	fake_ckptd_stats(e.fake, &st);
	ck_assert_uint_eq(st.hellos, 1);
	fake_ckptd_stop(e.fake);
	rm_rf(e.dir);
}
END_TEST

/* A daemon whose listen queue is full: connect() itself is bounded. */
START_TEST(test_connect_timeout_backlog)
{
	struct env e;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ckpt_client *c = (void *)1;
	int lfd, filler, r;

	memset(&e, 0, sizeof(e));
	env_dir(&e);
	strcpy(sa.sun_path, e.sock);
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 0), 0);
	/* Nobody accepts: fill the queue (a backlog of 0 holds one). */
	filler = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	ck_assert_int_eq(connect(filler, (struct sockaddr *)&sa, sizeof(sa)), 0);

	struct ckpt_connect_opts o = opts_for(&e, 0);
	o.timeout_ms = 200;
	r = ckpt_connect(&o, &c);
	ck_assert_msg(r == -ETIMEDOUT, "connect = %d: %s", r, ckpt_last_error());
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "did not accept the connection within"));
	ck_assert_ptr_eq(c, (void *)1);
	close(filler);
	close(lfd);
	rm_rf(e.dir);
}
END_TEST

/* A daemon that refuses at accept (ERROR, then close, reading nothing):
 * whether the client first sees EPIPE on HELLO or a reset on the answer,
 * it reports the daemon's errno and reason. */
START_TEST(test_connect_refused_reason)
{
	struct env e;
	struct ckpt_client *c = (void *)1;
	struct fake_ckptd_opts fo = { .refuse_at_accept = -EUSERS };

	memset(&e, 0, sizeof(e));
	env_dir(&e);
	fo.socket_path = e.sock;
	ck_assert_int_eq(fake_ckptd_start(&fo, &e.fake), 0);
	struct ckpt_connect_opts o = opts_for(&e, 0);
	for (int i = 0; i < 20; i++) {
		int r = ckpt_connect(&o, &c);
		ck_assert_msg(r == -EUSERS, "try %d: connect = %d (%s): %s", i, r, strerror(-r),
			      ckpt_last_error());
		ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "refused the connection: fake "
					     "ckptd: too many clients"));
		ck_assert_ptr_null(strstr(ckpt_last_error(), "Broken pipe"));
	}
	ck_assert_ptr_eq(c, (void *)1);
	fake_ckptd_stop(e.fake);
	rm_rf(e.dir);
}
END_TEST

static void send_error(int fd, int err, const char *msg)
{
	struct proto_error m;

	proto_init(&m.h, PROTO_ERROR, sizeof(m));
	m.err = err;
	proto_set_msg(m.msg, msg);
	ck_assert_int_eq(proto_send(fd, &m, sizeof(m), -1), 0);
}

/* Both ways the refusal can surface, made to happen one at a time. */
START_TEST(test_read_refusal)
{
	struct proto_hello hello;
	char msg[PROTO_MSG_LEN];
	int sv[2];

	proto_init(&hello.h, PROTO_HELLO, sizeof(hello));

	/* The daemon refused and closed before HELLO was sent: EPIPE. */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	send_error(sv[1], -EUSERS, "too many clients");
	close(sv[1]);
	ck_assert_int_eq(proto_send(sv[0], &hello, sizeof(hello), -1), -EPIPE);
	ck_assert_int_eq(conn_read_refusal(sv[0], msg, sizeof(msg)), -EUSERS);
	ck_assert_str_eq(msg, "too many clients");
	close(sv[0]);

	/* ... after HELLO was sent, leaving it unread: the answer is a reset
	 * first, then the ERROR behind it. */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(proto_send(sv[0], &hello, sizeof(hello), -1), 0);
	send_error(sv[1], -EACCES, "job belongs to another user");
	close(sv[1]);
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
	} buf;
	ck_assert_int_eq(proto_recv(sv[0], buf.b, NULL), -ECONNRESET);
	ck_assert_int_eq(conn_read_refusal(sv[0], msg, sizeof(msg)), -EACCES);
	ck_assert_str_eq(msg, "job belongs to another user");
	close(sv[0]);

	/* Nothing queued, or something else: no refusal, and no waiting. */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(conn_read_refusal(sv[0], msg, sizeof(msg)), 0);
	ck_assert_int_eq(proto_send(sv[1], &hello, sizeof(hello), -1), 0);
	ck_assert_int_eq(conn_read_refusal(sv[0], msg, sizeof(msg)), 0);
	close(sv[1]);
	ck_assert_int_eq(conn_read_refusal(sv[0], msg, sizeof(msg)), 0);
	close(sv[0]);
}
END_TEST

/* HELLO carries the umask (read, not changed) and the run id. */
START_TEST(test_hello_fields)
{
	struct env e;
	struct fake_ckptd_stats st;
	struct ckpt_client *c = (void *)1;

	umask(0027);
	setenv("CKPT_RUN_ID", "from env/1", 1);
	env_start(&e, (struct fake_ckptd_opts){ 0 }, 4 * MiB);
	ck_assert_uint_eq(umask(0022), 0027);
	fake_ckptd_stats(e.fake, &st);
	ck_assert_uint_eq(st.hello_umask, 0027);
	ck_assert_str_eq(st.hello_run, "from_env_1");
	ck_assert_str_eq(st.hello_job, JOB);
	ckpt_disconnect(e.c);

	struct ckpt_connect_opts o = opts_for(&e, 4 * MiB);
	o.run = "r-2";
	ck_assert_int_eq(ckpt_connect(&o, &e.c), 0);
	fake_ckptd_stats(e.fake, &st);
	ck_assert_str_eq(st.hello_run, "r-2");
	ck_assert_uint_eq(st.hello_umask, 0022);
	ckpt_disconnect(e.c);

	o.run = ""; /* none, whatever the environment says */
	ck_assert_int_eq(ckpt_connect(&o, &e.c), 0);
	fake_ckptd_stats(e.fake, &st);
	ck_assert_str_eq(st.hello_run, "");

	o.run = "no/slash";
	ck_assert_int_eq(ckpt_connect(&o, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "run id"));
	ck_assert_ptr_eq(c, (void *)1);
	fake_ckptd_stats(e.fake, &st);
	ck_assert_uint_eq(st.hellos, 3);
	unsetenv("CKPT_RUN_ID");
	env_stop(&e);
}
END_TEST

/* SAVE_BEGIN.attempt counts the begins of a name on this client. */
START_TEST(test_attempts)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	char name[32];
	uint8_t b = 1;

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 4 * MiB);
	/* Saves of "a": committed (0), refused as incomplete (1), freed
	 * unused (2), committed (3).  "b" in between is its own count. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "a", 1, &s), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "a", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "", &b, 1), -EINVAL);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EINVAL);
	ckpt_save_free(s);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "b", 1, &s), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "a", 1, &s), 0);
	ckpt_save_free(s);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "a", 2, &s), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 3);
	ck_assert_uint_eq(fake_ckptd_save(e.fake, 0)->attempt, 0);
	ck_assert_uint_eq(fake_ckptd_save(e.fake, 1)->attempt, 0);
	ck_assert_str_eq(fake_ckptd_save(e.fake, 1)->layout.name, "b");
	ck_assert_uint_eq(fake_ckptd_save(e.fake, 2)->attempt, 3);

	/* After 64 other names, "a" is forgotten; "b" was used more recently
	 * than "a" and is forgotten as well. */
	for (int i = 0; i < CLI_ATTEMPT_NAMES; i++) {
		snprintf(name, sizeof(name), "other-%d", i);
		ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, name, 1, &s), 0);
		ckpt_save_free(s);
	}
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "a", 3, &s), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_uint_eq(fake_ckptd_save(e.fake, 3)->attempt, 0);
	/* The 63 most recent names are still counted. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "other-63", 3, &s), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_uint_eq(fake_ckptd_save(e.fake, 4)->attempt, 1);
	env_stop(&e);
}
END_TEST

/* A save whose add_* or set_* failed is never committed as if whole:
 * before, it committed a valid checkpoint without the failed item. */
START_TEST(test_incomplete_save)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st = (void *)1, *cm = (void *)1;
	float w[4] = { 1, 2, 3, 4 };
	uint64_t shape = 4;
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 1,
				 .shape = &shape, .data = w };
	static const struct {
		const char *call;
		int err;
	} cases[] = {
		{ "ckpt_save_add_blob", -EINVAL },
		{ "ckpt_save_add_tensor", NO_CUDA_ERR },
		{ "ckpt_save_set_metadata", -EINVAL },
		{ "ckpt_save_set_metric", -EINVAL },
		{ "ckpt_save_add_tensor", -EEXIST },
	};

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 4 * MiB);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-1", 1, &s), 0);
		ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
		switch (i) {
		case 0:
			ck_assert_int_eq(ckpt_save_add_blob(s, "rng", NULL, 16), -EINVAL);
			break;
		case 1: {
			struct ckpt_tensor g = t;
			g.name = "gpu";
			g.device = CKPT_DEVICE_CUDA;
			ck_assert_int_eq(ckpt_save_add_tensor(s, &g), NO_CUDA_ERR);
			break;
		}
		case 2:
			ck_assert_int_eq(ckpt_save_set_metadata(s, "git", "\xff"), -EINVAL);
			break;
		case 3:
			ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 0.0 / 0.0), -EINVAL);
			break;
		case 4:
			ck_assert_int_eq(ckpt_save_add_tensor(s, &t), -EEXIST);
			break;
		}
		/* Later calls work, but cannot make the save whole again. */
		ck_assert_int_eq(ckpt_save_add_blob(s, "later", w, 4), 0);
		ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), cases[i].err);
		ck_assert_msg(strstr(ckpt_last_error(), cases[i].call) != NULL &&
			      strstr(ckpt_last_error(), "incomplete") != NULL,
			      "case %zu: '%s' does not name %s", i, ckpt_last_error(),
			      cases[i].call);
		ck_assert_ptr_eq(st, (void *)1);
		ckpt_save_free(s);
	}
	/* Nothing reached the daemon; a whole save still does. */
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 0);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-1", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(td_commit_ok(s), 0);
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 1);
	env_stop(&e);
}
END_TEST

/* ---- the log callback ---- */

struct log_rec {
	pthread_mutex_t lock;
	int n[4];
	char all[8192];
};

static void log_collect(enum ckpt_log_level level, const char *msg, void *userdata)
{
	struct log_rec *lr = userdata;

	pthread_mutex_lock(&lr->lock);
	if ((unsigned)level < 4)
		lr->n[level]++;
	size_t len = strlen(lr->all);
	snprintf(lr->all + len, sizeof(lr->all) - len, "%d %s\n", (int)level, msg);
	pthread_mutex_unlock(&lr->lock);
}

START_TEST(test_log_callback)
{
	static struct log_rec lr = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct env e;
	struct ckpt_save *s;
	uint8_t b[100] = { 0 };

	ckpt_set_log_fn(log_collect, &lr);
	setenv("LOCAL_WORLD_SIZE", "1000000", 1);
	env_start(&e, (struct fake_ckptd_opts){ .done_err = -EIO }, 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "logged", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(td_commit_ok(s), -EIO);
	ckpt_set_log_fn(NULL, NULL);
	unsetenv("LOCAL_WORLD_SIZE");

	pthread_mutex_lock(&lr.lock);
	ck_assert_msg(strstr(lr.all, "2 connected to ckptd at"), "log:\n%s", lr.all);
	ck_assert_msg(strstr(lr.all, "3 copy threads: default: "), "log:\n%s", lr.all);
	ck_assert_msg(strstr(lr.all, "1 $LOCAL_WORLD_SIZE '1000000' is not a number"), "log:\n%s",
		      lr.all);
	ck_assert_msg(strstr(lr.all, "3 save 'logged' (token 1, attempt 0): "), "log:\n%s",
		      lr.all);
	ck_assert_msg(strstr(lr.all, "bytes staged in"), "log:\n%s", lr.all);
	ck_assert_msg(strstr(lr.all, "0 save 'logged' (token 1, attempt 0) failed"), "log:\n%s",
		      lr.all);
	ck_assert_int_eq(lr.n[CKPT_LOG_ERROR], 1);
	int before = lr.n[0] + lr.n[1] + lr.n[2] + lr.n[3];
	pthread_mutex_unlock(&lr.lock);

	/* Without a callback, nothing is called. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "quiet", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(td_commit_ok(s), -EIO);
	env_stop(&e);
	pthread_mutex_lock(&lr.lock);
	ck_assert_int_eq(lr.n[0] + lr.n[1] + lr.n[2] + lr.n[3], before);
	pthread_mutex_unlock(&lr.lock);
}
END_TEST

/* ---- building saves ---- */

START_TEST(test_add_validation)
{
	struct env e;
	struct ckpt_save *s = NULL, *s2 = (void *)1;
	float data[12] = { 0 };
	uint64_t shape[2] = { 3, 4 }, gshape[2] = { 6, 4 }, offs[2] = { 3, 0 };
	struct ckpt_tensor t = {
		CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 2, .shape = shape,
		.data = data,
	};
	struct ckpt_tensor bad;

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 8 * MiB);

	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "../x", 1, &s2), -EINVAL);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, ".hidden", 1, &s2), -EINVAL);
	ck_assert_int_eq(ckpt_save_begin(e.c, "relative/root", "x", 1, &s2), -EINVAL);
	ck_assert_ptr_eq(s2, (void *)1);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-1", 1, &s), 0);

	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), -EEXIST);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "'w'"));
	ck_assert_int_eq(ckpt_save_add_blob(s, "w", data, 4), -EEXIST);

	bad = t;
	bad.name = "";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad.name = "__metadata__";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad.name = "tab\there";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad.name = NULL;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad = t;
	bad.name = "d";
	bad.dtype = CKPT_DTYPE_COUNT;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad.dtype = (enum ckpt_dtype)-1;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad = t;
	bad.name = "n";
	bad.ndim = CKPT_MAX_NDIM + 1;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	bad = t;
	bad.name = "sh";
	bad.global_shape = gshape;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL); /* offsets NULL */
	bad.offsets = offs;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), 0);
	bad.name = "sh2";
	uint64_t far[2] = { 4, 0 };
	bad.offsets = far; /* rows 4..6 of 6 */
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "outside"));
	uint64_t wide[2] = { 0, 1 };
	bad.offsets = wide; /* columns 1..5 of 4 */
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);

	bad = t;
	bad.name = "gpu";
	bad.device = CKPT_DEVICE_CUDA;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), NO_CUDA_ERR);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), NO_CUDA_MSG));
	bad.device = (enum ckpt_device)7;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);

	/* A replica other than 0 is validated and then skipped: adding it
	 * twice is fine, and a bad one is still refused. */
	bad = t;
	bad.replica = 1;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), 0);
	bad.name = "";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &bad), -EINVAL);

	ck_assert_int_eq(ckpt_save_add_blob(s, "blob", NULL, 5), -EINVAL);
	ck_assert_int_eq(ckpt_save_add_blob(s, "blob", data, 5), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "empty", NULL, 0), 0);

	ck_assert_int_eq(ckpt_save_set_metadata(s, "k", "v"), 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "k", "v2"), -EEXIST);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "__k", "v"), -EINVAL);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "bad-utf8", "\xff\xfe"), -EINVAL);
	char *big = malloc(CKPT_MAX_META_LEN + 2);
	memset(big, 'x', CKPT_MAX_META_LEN + 1);
	big[CKPT_MAX_META_LEN + 1] = '\0';
	ck_assert_int_eq(ckpt_save_set_metadata(s, "big", big), -EINVAL);
	big[CKPT_MAX_META_LEN] = '\0';
	ck_assert_int_eq(ckpt_save_set_metadata(s, "big", big), 0);
	free(big);
	ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 1.5), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 2.0), -EEXIST);
	ck_assert_int_eq(ckpt_save_set_metric(s, "nan", 0.0 / 0.0), -EINVAL);
	ck_assert_int_eq(ckpt_save_set_metric(s, "inf", 1.0 / 0.0), -EINVAL);
	for (int i = 1; i < CKPT_MAX_META_KEYS; i++) {
		char key[32];
		snprintf(key, sizeof(key), "m%d", i);
		ck_assert_int_eq(ckpt_save_set_metric(s, key, i), 0);
	}
	ck_assert_int_eq(ckpt_save_set_metric(s, "one-too-many", 1), -E2BIG);

	/* Every call above that failed spoilt the save: the first one (the
	 * duplicate 'w') is what commit reports, and nothing is sent. */
	struct ckpt_future *st = (void *)1, *cm = (void *)1;
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EEXIST);
	ck_assert_ptr_eq(st, (void *)1);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "is incomplete"));
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(),
				     "ckpt_save_add_tensor: name 'w' is already in this save"));
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EEXIST);
	ckpt_save_free(s);
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 0);

	/* A whole save commits; after commit every call is -EBUSY, which does
	 * not touch the save in flight. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-1", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "blob", data, 5), 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "k", "v"), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 1.5), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EBUSY);
	t.name = "late";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), -EBUSY);
	ck_assert_int_eq(ckpt_save_add_blob(s, "late-blob", data, 1), -EBUSY);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "late", "v"), -EBUSY);
	ck_assert_int_eq(ckpt_save_set_metric(s, "late", 1), -EBUSY);
	ck_assert_int_eq(wait_fut(st), 0);
	ck_assert_int_eq(wait_fut(cm), 0);
	ck_assert_str_eq(ckpt_future_error(cm), "");
	ckpt_save_free(s);
	ckpt_save_free(NULL);

	/* A save freed without commit sends nothing. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-2", 2, &s), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ckpt_save_free(s);
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 1);
	env_stop(&e);
}
END_TEST

/* ---- the staging pipeline ---- */

START_TEST(test_save_image)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	static float w[3][5];
	static int64_t steps[7];
	static uint16_t half[2][2][2];
	static double scalar = 3.25;
	static uint8_t blob[3000];
	static float chunk[2][5];
	static float replica[4];
	uint64_t sw[2] = { 3, 5 }, ss[1] = { 7 }, sh[3] = { 2, 2, 2 }, sc[2] = { 2, 5 };
	uint64_t gsc[2] = { 6, 5 }, osc[2] = { 2, 0 }, sr[1] = { 4 };

	fill_pattern(w, sizeof(w), 1);
	fill_pattern(steps, sizeof(steps), 2);
	fill_pattern(half, sizeof(half), 3);
	fill_pattern(blob, sizeof(blob), 4);
	fill_pattern(chunk, sizeof(chunk), 5);
	fill_pattern(replica, sizeof(replica), 6);

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 8 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-7", 7, &s), 0);
	struct ckpt_tensor ts[] = {
		{ CKPT_TENSOR_INIT, .name = "layer.0.weight", .dtype = CKPT_F32, .ndim = 2,
		  .shape = sw, .data = w },
		{ CKPT_TENSOR_INIT, .name = "steps", .dtype = CKPT_I64, .ndim = 1, .shape = ss,
		  .data = steps },
		{ CKPT_TENSOR_INIT, .name = "half \"quoted\"", .dtype = CKPT_BF16, .ndim = 3,
		  .shape = sh, .data = half },
		{ CKPT_TENSOR_INIT, .name = "scalar", .dtype = CKPT_F64, .ndim = 0,
		  .data = &scalar },
		{ CKPT_TENSOR_INIT, .name = "sharded", .dtype = CKPT_F32, .ndim = 2, .shape = sc,
		  .data = chunk, .global_shape = gsc, .offsets = osc },
		{ CKPT_TENSOR_INIT, .name = "dp-copy", .dtype = CKPT_F32, .ndim = 1, .shape = sr,
		  .data = replica, .replica = 2 },
	};
	for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
		ck_assert_int_eq(ckpt_save_add_tensor(s, &ts[i]), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "loader", blob, sizeof(blob)), 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "git", "abc123"), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 0.5), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), 0);
	ck_assert_int_eq(wait_fut(cm), 0);
	ck_assert_int_eq(ckpt_future_poll(st), 0);
	ck_assert_int_eq(ckpt_future_poll(cm), 0);

	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 1);
	const struct fake_save *fs = fake_ckptd_save(e.fake, 0);
	ck_assert(fs->done);
	ck_assert_str_eq(fs->layout.name, "step-7");
	ck_assert_str_eq(fs->layout.root, ROOT);
	ck_assert_uint_eq(fs->layout.step, 7);
	ck_assert_uint_eq(fs->layout.n_items, 6); /* the replica is skipped */
	ck_assert_uint_eq(fs->received, fs->layout.file_size);
	struct expect ex[] = {
		{ "layer.0.weight", "F32", 2, { 3, 5 }, w, sizeof(w) },
		{ "steps", "I64", 1, { 7 }, steps, sizeof(steps) },
		{ "half \"quoted\"", "BF16", 3, { 2, 2, 2 }, half, sizeof(half) },
		{ "scalar", "F64", 0, { 0 }, &scalar, sizeof(scalar) },
		{ "sharded", "F32", 2, { 2, 5 }, chunk, sizeof(chunk) },
		{ "loader", "U8", 1, { sizeof(blob) }, blob, sizeof(blob) },
	};
	check_image(fs, ex, sizeof(ex) / sizeof(ex[0]));
	/* The descriptor carried the global view of the sharded chunk. */
	const struct layout_item *it = &fs->layout.items[4];
	ck_assert(it->sharded);
	ck_assert_uint_eq(layout_gshape(&fs->layout, it)[0], 6);
	ck_assert_uint_eq(layout_offs(&fs->layout, it)[0], 2);
	ckpt_save_free(s);
	env_stop(&e);
}
END_TEST

/* A 20 MiB save through a 4 MiB arena: copies wait for released slots. */
START_TEST(test_backpressure)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	enum { N = 6 };
	uint64_t shapes[N] = { 1 * MiB, 1 * MiB + 3, 512 * 1024 + 1, 1 * MiB, 1 * MiB + 777, 3 };
	float *bufs[N];
	struct expect ex[N];
	char names[N][16];
	uint64_t total = 0;

	env_start(&e, (struct fake_ckptd_opts){ .release_delay_us = 2000 }, 4 * MiB);
	ck_assert_uint_eq(ckpt_client_arena_bytes(e.c), 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "big", 1, &s), 0);
	for (int i = 0; i < N; i++) {
		size_t len = shapes[i] * sizeof(float);
		bufs[i] = malloc(len);
		fill_pattern(bufs[i], len, 100 + i);
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = names[i], .dtype = CKPT_F32,
					 .ndim = 1, .shape = &shapes[i], .data = bufs[i] };
		ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
		ex[i] = (struct expect){ names[i], "F32", 1, { shapes[i] }, bufs[i], len };
		total += len;
	}
	ck_assert_uint_gt(total, 18 * MiB);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), 0);
	ck_assert_int_eq(wait_fut(cm), 0);

	const struct fake_save *fs = fake_ckptd_save(e.fake, 0);
	check_image(fs, ex, N);
	struct fake_ckptd_stats stats;
	fake_ckptd_stats(e.fake, &stats);
	ck_assert_uint_eq(stats.extents, (fs->layout.file_size + MiB - 1) / MiB);
	ck_assert_uint_eq(stats.extents, fs->extents);
	ck_assert_uint_le(stats.max_held, 4);
	ck_assert_uint_ge(stats.max_held, 2); /* the slots really were reused */
	ckpt_save_free(s);
	for (int i = 0; i < N; i++)
		free(bufs[i]);
	env_stop(&e);
}
END_TEST

START_TEST(test_save_refused)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	uint8_t b[10] = { 0 };

	env_start(&e, (struct fake_ckptd_opts){ .refuse_save = -EACCES }, 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "nope", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), -EACCES);
	ck_assert_int_eq(wait_fut(cm), -EACCES);
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(st), "refused on purpose"));
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(cm), "refused on purpose"));
	ckpt_save_free(s);

	/* The client stays usable: the descriptor slots came back. */
	for (int i = 0; i < 10; i++) {
		ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "nope", 1, &s), 0);
		ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
		ck_assert_int_eq(wait_fut(cm), -EACCES);
		ckpt_save_free(s);
	}
	env_stop(&e);
}
END_TEST

START_TEST(test_commit_failed_by_daemon)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	uint8_t b[100000];

	fill_pattern(b, sizeof(b), 9);
	env_start(&e, (struct fake_ckptd_opts){ .done_err = -EIO }, 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "fails", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), 0);
	ck_assert_int_eq(wait_fut(cm), -EIO);
	ck_assert_str_eq(ckpt_future_error(st), "");
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(cm), "failed on purpose"));
	ckpt_save_free(s);
	env_stop(&e);
}
END_TEST

START_TEST(test_connection_lost)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	size_t len = 20 * MiB;
	uint8_t *b = malloc(len);

	memset(b, 1, len);
	env_start(&e, (struct fake_ckptd_opts){ .close_after_extents = 3, .release_delay_us = 1000 },
		  4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "lost", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, len), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), -ECONNRESET);
	ck_assert_int_eq(wait_fut(cm), -ECONNRESET);
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(st), "connection to ckptd lost"));
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(cm), "connection to ckptd lost"));
	ckpt_save_free(s);

	/* Later commits fail at once. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "after", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -ENOTCONN);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "connection to ckptd lost"));
	ckpt_save_free(s);
	env_stop(&e);
	free(b);
}
END_TEST

/* Several saves committed back to back stage in order and all commit. */
START_TEST(test_pipelined_saves)
{
	struct env e;
	enum { N = 4 };
	struct ckpt_save *s[N];
	struct ckpt_future *st[N], *cm[N];
	size_t len = 3 * MiB + 5;
	uint8_t *b[N];
	char name[32];

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 4 * MiB);
	for (int i = 0; i < N; i++) {
		b[i] = malloc(len);
		fill_pattern(b[i], len, 50 + i);
		snprintf(name, sizeof(name), "step-%d", i);
		ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, name, i, &s[i]), 0);
		ck_assert_int_eq(ckpt_save_add_blob(s[i], "data", b[i], len), 0);
		ck_assert_int_eq(ckpt_save_commit(s[i], &st[i], &cm[i]), 0);
	}
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(wait_fut(st[i]), 0);
		ck_assert_int_eq(wait_fut(cm[i]), 0);
	}
	ck_assert_int_eq(fake_ckptd_wait_saves(e.fake, N, 5000), 0);
	for (int i = 0; i < N; i++) {
		const struct fake_save *fs = fake_ckptd_save(e.fake, (size_t)i);
		snprintf(name, sizeof(name), "step-%d", i);
		ck_assert_str_eq(fs->layout.name, name); /* commit order */
		struct expect ex = { "data", "U8", 1, { len }, b[i], len };
		check_image(fs, &ex, 1);
		ckpt_save_free(s[i]);
		free(b[i]);
	}
	env_stop(&e);
}
END_TEST

/* Commit returns at once; the copies run on library threads. */
START_TEST(test_commit_fast)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	enum { N = 64 };
	uint64_t shape = 256 * 1024; /* 1 MiB of F32 each: 64 MiB */
	float *buf = malloc(N * shape * sizeof(float));
	char names[N][16];

	fill_pattern(buf, N * shape * sizeof(float), 77);
	env_start(&e, (struct fake_ckptd_opts){ .release_delay_us = 3000 }, 4 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "fast", 1, &s), 0);
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "p%d", i);
		struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = names[i], .dtype = CKPT_F32,
					 .ndim = 1, .shape = &shape,
					 .data = buf + (size_t)i * shape };
		ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	}
	double t0 = now_ms();
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	double dt = now_ms() - t0;
	ck_assert_int_eq(ckpt_future_poll(st), -EINPROGRESS);
	ck_assert_int_eq(ckpt_future_poll(cm), -EINPROGRESS);
	ck_assert_str_eq(ckpt_future_error(st), "");
	ck_assert_msg(dt < 5.0, "commit took %.3f ms", dt);

	/* Waiting with a timeout while the drain is slow. */
	t0 = now_ms();
	ck_assert_int_eq(ckpt_future_wait(cm, 20), -ETIMEDOUT);
	dt = now_ms() - t0;
	ck_assert_msg(dt >= 19.0 && dt < 1000.0, "20 ms wait took %.3f ms", dt);
	ck_assert_int_eq(ckpt_future_wait(cm, 0), -ETIMEDOUT);

	ck_assert_int_eq(ckpt_future_wait(st, -1), 0);
	ck_assert_int_eq(ckpt_future_wait(cm, -1), 0);
	const struct fake_save *fs = fake_ckptd_save(e.fake, 0);
	ck_assert_uint_eq(fs->received, fs->layout.file_size);
	ck_assert_int_eq(memcmp(fs->image + fs->layout.data_start, buf, N * shape * sizeof(float)),
			 0);
	ckpt_save_free(s);
	free(buf);
	env_stop(&e);
}
END_TEST

/* Adds n one-element U32 tensors "model.layers.<i>.scale". */
static void add_scales(struct ckpt_save *s, const uint32_t *vals, int n)
{
	uint64_t one = 1;
	char name[32];

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "model.layers.%d.scale", i);
		struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = name, .dtype = CKPT_U32,
					 .ndim = 1, .shape = &one, .data = &vals[i] };
		ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	}
}

/* 10,000 tiny tensors: adding is fast and the file is right. */
START_TEST(test_many_tensors)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	enum { N = 10000 };
	static uint32_t vals[N];
	uint64_t one = 1;
	char name[32];

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 8 * MiB);
	for (int i = 0; i < N; i++)
		vals[i] = 0xabc00000u + (uint32_t)i;

	/* A duplicate among 10,000 names is found, and the save it spoilt is
	 * refused at commit. */
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "many", 1, &s), 0);
	add_scales(s, vals, N);
	snprintf(name, sizeof(name), "model.layers.%d.scale", 1234);
	struct ckpt_tensor dup = { CKPT_TENSOR_INIT, .name = name, .dtype = CKPT_U32, .ndim = 1,
				   .shape = &one, .data = vals };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &dup), -EEXIST);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EEXIST);
	ckpt_save_free(s);

	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "many", 1, &s), 0);
	double t0 = now_ms();
	add_scales(s, vals, N);
	double dt = now_ms() - t0;
	ck_assert_msg(dt < 500.0, "10,000 adds took %.1f ms", dt);

	t0 = now_ms();
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), 0);
	ck_assert_int_eq(wait_fut(cm), 0);
	dt = now_ms() - t0;
	ck_assert_msg(dt < 2000.0, "staging 10,000 tensors took %.1f ms", dt);

	const struct fake_save *fs = fake_ckptd_save(e.fake, 0);
	ck_assert_uint_eq(fs->layout.n_items, N);
	ck_assert_uint_eq(fs->layout.file_size, fs->layout.data_start + N * 4);
	ck_assert_int_eq(memcmp(fs->image + fs->layout.data_start, vals, sizeof(vals)), 0);
	for (int i = 0; i < N; i += 997)
		ck_assert_uint_eq(fs->layout.items[i].begin, fs->layout.data_start + 4u * i);
	ckpt_save_free(s);
	env_stop(&e);
}
END_TEST

/* Disconnect waits for staging; a commit still pending then fails. */
START_TEST(test_disconnect_pending)
{
	struct env e;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	size_t len = 2 * MiB;
	uint8_t *b = malloc(len);

	memset(b, 7, len);
	/* Slots come back only after 200 ms: staging (3 of 8 slots) finishes
	 * long before the commit. */
	env_start(&e, (struct fake_ckptd_opts){ .release_delay_us = 200000 }, 8 * MiB);
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "bye", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, len), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	struct ckpt_save *never;
	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "never", 1, &never), 0);
	ck_assert_int_eq(ckpt_save_add_blob(never, "b", b, 10), 0);
	ckpt_disconnect(e.c);
	e.c = NULL;
	ck_assert_int_eq(ckpt_future_poll(st), 0);
	ck_assert_int_eq(ckpt_future_poll(cm), -ECONNABORTED);
	ck_assert_ptr_nonnull(strstr(ckpt_future_error(cm), "disconnected"));
	/* Saves outlive their client: committed or not. */
	ckpt_save_free(s);
	ckpt_save_free(never);
	env_stop(&e);
	free(b);
}
END_TEST

/* ---- reading a checkpoint back ---- */

/* Writes the fake's images of `n` saves (ranks 0..n-1 of one checkpoint)
 * as a committed checkpoint in dir, the way the daemon would. */
static void commit_dir(struct fake_ckptd *f, size_t n, const char *dir)
{
	int dfd;
	char name[64], *text;
	char err[512];

	mkdir(dir, 0755);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dfd, 0);
	for (size_t r = 0; r < n; r++) {
		const struct fake_save *fs = fake_ckptd_save(f, r);
		const struct layout *l = &fs->layout;
		uint32_t *crcs = calloc(l->n_crcs + 1, sizeof(uint32_t));
		for (size_t i = 0; i < l->n_items; i++) {
			const struct layout_item *it = &l->items[i];
			uint32_t k = it->crc0;
			for (uint64_t p = it->begin; p < it->end;) {
				uint64_t q = (p / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
				if (q > it->end)
					q = it->end;
				crcs[k++] = crc32c(fs->image + p, q - p, 0);
				p = q;
			}
		}
		index_shard_name((uint32_t)r, name, sizeof(name));
		int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		ck_assert_int_eq(write(fd, fs->image, l->file_size), (ssize_t)l->file_size);
		close(fd);
		ck_assert_int_eq(index_build(l, crcs, JOB, (uint32_t)r, (uint32_t)n, &text), 0);
		index_index_name((uint32_t)r, name, sizeof(name));
		fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
		close(fd);
		free(text);
		free(crcs);
	}
	err[0] = '\0';
	int r = index_merge(dfd, JOB, fake_ckptd_save(f, 0)->layout.name, (uint32_t)n, 1700000000,
			    NULL, 0, &text, err, sizeof(err));
	ck_assert_msg(r == 0, "index_merge: %d %s", r, err);
	int fd = openat(dfd, MANIFEST_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	free(text);
	close(dfd);
}

/* Two ranks save a 4x6 tensor cut by columns (non-contiguous chunks), one
 * cut by rows, and a blob larger than a CRC block; the reader assembles
 * them and checks every CRC. */
START_TEST(test_reader)
{
	struct env e;
	struct ckpt_client *c1;
	struct ckpt_save *s0, *s1;
	struct ckpt_future *st, *cm;
	float full[4][6], rows[4][6];
	float left[4][3], right[4][3];
	uint64_t g[2] = { 4, 6 }, half[2] = { 4, 3 }, o0[2] = { 0, 0 }, o1[2] = { 0, 3 };
	uint64_t rshape[2] = { 2, 6 }, ro1[2] = { 2, 0 };
	size_t blen = LAYOUT_CRC_BLOCK * 2 + 12345;
	uint8_t *blob = malloc(blen), *back = malloc(blen);
	char dir[400];

	fill_pattern(full, sizeof(full), 11);
	fill_pattern(rows, sizeof(rows), 12);
	fill_pattern(blob, blen, 13);
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 3; j++) {
			left[i][j] = full[i][j];
			right[i][j] = full[i][j + 3];
		}

	env_start(&e, (struct fake_ckptd_opts){ 0 }, 8 * MiB);
	struct ckpt_connect_opts o = opts_for(&e, 8 * MiB);
	/* Rank 0 of 2 would be the job's other client in real life; here the
	 * same fake serves both. */
	ckpt_disconnect(e.c);
	o.world = 2;
	ck_assert_int_eq(ckpt_connect(&o, &e.c), 0);
	o.rank = 1;
	ck_assert_int_eq(ckpt_connect(&o, &c1), 0);

	ck_assert_int_eq(ckpt_save_begin(e.c, ROOT, "step-9", 9, &s0), 0);
	ck_assert_int_eq(ckpt_save_begin(c1, ROOT, "step-9", 9, &s1), 0);
	struct ckpt_tensor t0 = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 2,
				  .shape = half, .data = left, .global_shape = g, .offsets = o0 };
	struct ckpt_tensor t1 = t0;
	t1.data = right;
	t1.offsets = o1;
	ck_assert_int_eq(ckpt_save_add_tensor(s0, &t0), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s1, &t1), 0);
	struct ckpt_tensor r0 = { CKPT_TENSOR_INIT, .name = "rows", .dtype = CKPT_F32, .ndim = 2,
				  .shape = rshape, .data = rows[0], .global_shape = g,
				  .offsets = o0 };
	struct ckpt_tensor r1 = r0;
	r1.data = rows[2];
	r1.offsets = ro1;
	ck_assert_int_eq(ckpt_save_add_tensor(s0, &r0), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s1, &r1), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s1, "loader", blob, blen), 0);
	ck_assert_int_eq(ckpt_save_commit(s0, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(cm), 0);
	ck_assert_int_eq(ckpt_save_commit(s1, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(cm), 0);
	ckpt_save_free(s0);
	ckpt_save_free(s1);
	ckpt_disconnect(c1);

	snprintf(dir, sizeof(dir), "%s/step-9", e.dir);
	commit_dir(e.fake, 2, dir);

	struct ckpt_reader *rd = NULL;
	ck_assert_int_eq(ckpt_reader_open(dir, &rd), 0);
	ck_assert_uint_eq(ckpt_reader_step(rd), 9);
	ck_assert_uint_eq(ckpt_reader_world(rd), 2);
	ck_assert_uint_eq(ckpt_reader_tensor_count(rd), 2);
	ck_assert_str_eq(ckpt_reader_tensor_name(rd, 0), "rows");
	ck_assert_str_eq(ckpt_reader_tensor_name(rd, 1), "w");
	ck_assert_ptr_null(ckpt_reader_tensor_name(rd, 2));

	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[CKPT_MAX_NDIM];
	ck_assert_int_eq(ckpt_reader_tensor_info(rd, "w", CKPT_MAX_NDIM, &dt, &ndim, shape), 0);
	ck_assert_int_eq(dt, CKPT_F32);
	ck_assert_uint_eq(ndim, 2);
	ck_assert_uint_eq(shape[0], 4);
	ck_assert_uint_eq(shape[1], 6);
	ck_assert_int_eq(ckpt_reader_tensor_info(rd, "nope", CKPT_MAX_NDIM, &dt, &ndim, shape),
			 -ENOENT);
	/* The shape array's capacity is respected: too small is -ERANGE and
	 * nothing is written; NULL asks for dtype and ndim only. */
	uint64_t small[1] = { 777 };
	dt = CKPT_BOOL;
	ndim = 99;
	ck_assert_int_eq(ckpt_reader_tensor_info(rd, "w", 1, &dt, &ndim, small), -ERANGE);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "2 dimensions"));
	ck_assert_uint_eq(small[0], 777);
	ck_assert_int_eq(dt, CKPT_BOOL);
	ck_assert_uint_eq(ndim, 99);
	ck_assert_int_eq(ckpt_reader_tensor_info(rd, "w", 0, &dt, &ndim, NULL), 0);
	ck_assert_int_eq(dt, CKPT_F32);
	ck_assert_uint_eq(ndim, 2);
	uint64_t exact[2] = { 0, 0 };
	ck_assert_int_eq(ckpt_reader_tensor_info(rd, "w", 2, NULL, NULL, exact), 0);
	ck_assert_uint_eq(exact[0], 4);
	ck_assert_uint_eq(exact[1], 6);

	/* Blobs are listed like tensors. */
	ck_assert_uint_eq(ckpt_reader_blob_count(rd), 1);
	ck_assert_str_eq(ckpt_reader_blob_name(rd, 0), "loader");
	ck_assert_ptr_null(ckpt_reader_blob_name(rd, 1));
	ck_assert_uint_eq(ckpt_reader_blob_count(NULL), 0);
	ck_assert_ptr_null(ckpt_reader_blob_name(NULL, 0));

	float got[4][6];
	memset(got, 0, sizeof(got));
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "w", got, sizeof(got)), 0);
	ck_assert_int_eq(memcmp(got, full, sizeof(full)), 0);
	memset(got, 0, sizeof(got));
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "rows", got, sizeof(got)), 0);
	ck_assert_int_eq(memcmp(got, rows, sizeof(rows)), 0);
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "w", got, sizeof(got) - 4), -EINVAL);
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "loader", got, sizeof(got)), -ENOENT);

	ck_assert_int_eq(ckpt_reader_blob_size(rd, "loader"), (int64_t)blen);
	ck_assert_int_eq(ckpt_reader_blob_size(rd, "w"), -ENOENT);
	ck_assert_int_eq(ckpt_reader_read_blob(rd, "loader", back, blen), 0);
	ck_assert_int_eq(memcmp(back, blob, blen), 0);
	ckpt_reader_close(rd);

	/* Flip one byte in the blob's second CRC piece. */
	char path[512];
	snprintf(path, sizeof(path), "%s/rank-00001.safetensors", dir);
	const struct fake_save *fs1 = fake_ckptd_save(e.fake, 1);
	const struct layout_item *bit = &fs1->layout.items[fs1->layout.n_items - 1];
	ck_assert_str_eq(bit->name, "loader");
	uint64_t at = (bit->begin / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK + 100;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	uint8_t byte;
	ck_assert_int_eq(pread(fd, &byte, 1, (off_t)at), 1);
	byte ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &byte, 1, (off_t)at), 1);
	ck_assert_int_eq(ckpt_reader_open(dir, &rd), 0);
	ck_assert_int_eq(ckpt_reader_read_blob(rd, "loader", back, blen), -EBADMSG);
	char want[128];
	snprintf(want, sizeof(want), "blob 'loader': CRC mismatch in rank-00001.safetensors at "
		 "offset %llu", (unsigned long long)(at - 100));
	ck_assert_str_eq(ckpt_last_error(), want);
	/* The tensors of that file are still fine. */
	ck_assert_int_eq(ckpt_reader_read_tensor(rd, "w", got, sizeof(got)), 0);
	ckpt_reader_close(rd);

	/* Truncated file. */
	ck_assert_int_eq(ftruncate(fd, (off_t)(bit->begin + 10)), 0);
	close(fd);
	ck_assert_int_eq(ckpt_reader_open(dir, &rd), 0);
	ck_assert_int_eq(ckpt_reader_read_blob(rd, "loader", back, blen), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "truncated"));
	ckpt_reader_close(rd);

	/* Not committed / corrupt manifest. */
	char mpath[512];
	snprintf(mpath, sizeof(mpath), "%s/manifest.json", dir);
	fd = open(mpath, O_WRONLY | O_TRUNC | O_CLOEXEC);
	ck_assert_int_eq(write(fd, "{\"format\":", 10), 10);
	close(fd);
	rd = (void *)1;
	ck_assert_int_eq(ckpt_reader_open(dir, &rd), -EBADMSG);
	unlink(mpath);
	ck_assert_int_eq(ckpt_reader_open(dir, &rd), -ENOENT);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "not a committed checkpoint"));
	ck_assert_ptr_eq(rd, (void *)1);
	ck_assert_int_eq(ckpt_reader_open("/nonexistent-ckpt-dir", &rd), -ENOENT);
	ckpt_reader_close(NULL);

	free(blob);
	free(back);
	env_stop(&e);
}
END_TEST

/* The host engine (streaming stores for long copies): every alignment of
 * source and destination, lengths around its threshold and odd tails; the
 * bytes around the destination are left alone. */
START_TEST(test_host_engine_copy)
{
	static const size_t lens[] = {0, 1, 63, 64, 65, 4095, 65535, 65536, 65537,
				      65536 + 63, 1048576 + 17, 3 * 1048576 + 4096 + 5};
	size_t max = 3 * 1048576 + 4096 + 5 + 256;
	unsigned char *src = malloc(max), *dst = malloc(max);
	char err[128];

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	for (size_t i = 0; i < max; i++)
		src[i] = (unsigned char)(i * 131u + (i >> 12));
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t len = lens[li];
		for (unsigned so = 0; so < 64; so += (len > 1000000 ? 21 : 1)) {
			for (unsigned d = 0; d < 64; d += (len > 1000000 ? 13 : 3)) {
				memset(dst, 0xa5, len + 128);
				ck_assert_int_eq(copy_engine_host.copy(dst + d, src + so, len, err,
								       sizeof(err)), 0);
				if (copy_engine_host.sync)
					ck_assert_int_eq(copy_engine_host.sync(err, sizeof(err)), 0);
				ck_assert_msg(memcmp(dst + d, src + so, len) == 0,
					      "len %zu src+%u dst+%u: bytes differ", len, so, d);
				for (unsigned k = 0; k < d; k++)
					ck_assert_uint_eq(dst[k], 0xa5);
				for (unsigned k = 0; k < 64; k++)
					ck_assert_uint_eq(dst[d + len + k], 0xa5);
			}
		}
	}
	free(src);
	free(dst);
}
END_TEST

/* Copies start before the daemon accepts a save (SAVE_ACK): a daemon slow
 * to answer gets the slots filled meanwhile, sent after its yes.  A 12 MiB
 * save through a 4 MiB arena parks what fits and waits for the rest; a
 * small one is wholly parked.  The images must be exact and every EXTENT
 * must come after the ACK, in a slot the client owns (the fake checks). */
static struct log_rec park_log = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void save_pattern(struct env *e, const char *name, uint64_t floats, uint32_t seed,
			 int want, const char *want_msg)
{
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	float *buf = malloc(floats * sizeof(float));

	ck_assert_ptr_nonnull(buf);
	fill_pattern(buf, floats * sizeof(float), seed);
	ck_assert_int_eq(ckpt_save_begin(e->c, ROOT, name, 1, &s), 0);
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 1,
				 .shape = &floats, .data = buf };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(wait_fut(st), want);
	ck_assert_int_eq(wait_fut(cm), want);
	if (want_msg) {
		ck_assert_ptr_nonnull(strstr(ckpt_future_error(st), want_msg));
		ck_assert_ptr_nonnull(strstr(ckpt_future_error(cm), want_msg));
	}
	ckpt_save_free(s);
	if (want == 0) {
		size_t n = fake_ckptd_n_saves(e->fake);
		const struct fake_save *fs = fake_ckptd_save(e->fake, n - 1);
		struct expect ex = { "w", "F32", 1, { floats }, buf, floats * sizeof(float) };
		ck_assert_str_eq(fs->layout.name, name);
		ck_assert(fs->done);
		check_image(fs, &ex, 1);
	}
	free(buf);
}

START_TEST(test_copy_before_ack)
{
	struct env e;

	ckpt_set_log_fn(log_collect, &park_log);
	env_start(&e, (struct fake_ckptd_opts){ .ack_delay_us = 100000 }, 4 * MiB);
	save_pattern(&e, "big", 3 * MiB, 11, 0, NULL);
	save_pattern(&e, "small", 100 * 1024, 12, 0, NULL);
	save_pattern(&e, "big-again", 3 * MiB + 5, 13, 0, NULL);
	env_stop(&e);
	ckpt_set_log_fn(NULL, NULL);
	pthread_mutex_lock(&park_log.lock);
	ck_assert_msg(strstr(park_log.all, "save 'big' (token 1): 3 extents filled before ckptd "
				       "answered: sending"), "log:\n%s", park_log.all);
	ck_assert_msg(strstr(park_log.all, "save 'small' (token 2): 1 extent filled before ckptd "
				       "answered: sending"), "log:\n%s", park_log.all);
	pthread_mutex_unlock(&park_log.lock);
}
END_TEST

/* More extents filled before the answer than the save thread sends in one
 * system call (16): every one reaches the daemon exactly once and the image
 * is exact. */
START_TEST(test_copy_before_ack_many)
{
	struct env e;
	unsigned parked = 0;
	const char *p;

	ckpt_set_log_fn(log_collect, &park_log);
	env_start(&e, (struct fake_ckptd_opts){ .ack_delay_us = 1000000 }, 160 * MiB);
	save_pattern(&e, "wide", 36 * MiB + 5, 31, 0, NULL);
	const struct fake_save *fs = fake_ckptd_save(e.fake, 0);
	uint64_t n_ext = fs->extents;
	env_stop(&e); /* asserts no protocol violation (no extent twice) */
	ckpt_set_log_fn(NULL, NULL);
	pthread_mutex_lock(&park_log.lock);
	p = strstr(park_log.all, "save 'wide' (token 1): ");
	ck_assert_msg(p && sscanf(p, "save 'wide' (token 1): %u extents filled", &parked) == 1,
		      "log:\n%s", park_log.all);
	pthread_mutex_unlock(&park_log.lock);
	/* A second of delay is ages for 144 MiB: every extent was parked. */
	ck_assert_uint_eq(parked, n_ext);
	ck_assert_uint_gt(parked, 16);
}
END_TEST

/* A refusal that comes after copies started: both futures fail with the
 * daemon's reason, no EXTENT of the refused save reaches it, and the slots
 * the copies filled come back (the next save, larger than the arena, needs
 * every one of them). */
START_TEST(test_refused_after_copies)
{
	struct env e;

	ckpt_set_log_fn(log_collect, &park_log);
	env_start(&e, (struct fake_ckptd_opts){ .ack_delay_us = 100000, .refuse_save = -EACCES,
						.refuse_first = 2 }, 4 * MiB);
	save_pattern(&e, "nope", 3 * MiB, 21, -EACCES, "refused on purpose");
	save_pattern(&e, "nope-small", 1000, 22, -EACCES, "refused on purpose");
	save_pattern(&e, "yes", 5 * MiB, 23, 0, NULL);
	ck_assert_uint_eq(fake_ckptd_n_saves(e.fake), 1);
	env_stop(&e); /* asserts no protocol violation */
	ckpt_set_log_fn(NULL, NULL);
	pthread_mutex_lock(&park_log.lock);
	ck_assert_msg(strstr(park_log.all, "save 'nope' (token 1): 3 extents filled before ckptd "
				       "answered: giving the slots back"), "log:\n%s", park_log.all);
	pthread_mutex_unlock(&park_log.lock);
}
END_TEST

static Suite *client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *tc;

#define TC(name, fn, timeout)                                                                      \
	do {                                                                                       \
		tc = tcase_create(name);                                                           \
		tcase_set_timeout(tc, timeout);                                                    \
		tcase_add_test(tc, fn);                                                            \
		suite_add_tcase(s, tc);                                                            \
	} while (0)

	TC("connect_no_daemon", test_connect_no_daemon, 10);
	TC("connect_bad_opts", test_connect_bad_opts, 10);
	TC("connect_refused", test_connect_refused, 10);
	TC("connect_ok", test_connect_ok, 10);
	TC("copy_nice", test_copy_nice, 60);
	TC("connect_timeout", test_connect_timeout, 10);
	TC("connect_timeout_backlog", test_connect_timeout_backlog, 10);
	TC("connect_refused_reason", test_connect_refused_reason, 20);
	TC("read_refusal", test_read_refusal, 10);
	TC("hello_fields", test_hello_fields, 10);
	TC("attempts", test_attempts, 20);
	TC("incomplete_save", test_incomplete_save, 20);
	TC("log_callback", test_log_callback, 20);
	TC("add_validation", test_add_validation, 20);
	TC("save_image", test_save_image, 20);
	TC("backpressure", test_backpressure, 30);
	TC("save_refused", test_save_refused, 20);
	TC("copy_before_ack", test_copy_before_ack, 30);
	TC("copy_before_ack_many", test_copy_before_ack_many, 30);
	TC("refused_after_copies", test_refused_after_copies, 30);
	TC("commit_failed_by_daemon", test_commit_failed_by_daemon, 20);
	TC("connection_lost", test_connection_lost, 30);
	TC("pipelined_saves", test_pipelined_saves, 30);
	TC("commit_fast", test_commit_fast, 30);
	TC("many_tensors", test_many_tensors, 30);
	TC("disconnect_pending", test_disconnect_pending, 20);
	TC("reader", test_reader, 30);
	TC("host_engine_copy", test_host_engine_copy, 60);
#undef TC
	return s;
}

int main(void)
{
	SRunner *sr;

	setenv("CKPT_CUDART", "/nonexistent/libcudart-for-check_client.so", 1);
	sr = srunner_create(client_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
