/* SPDX-License-Identifier: MIT */
/*
 * check_loadio.c - reads for loads through a real ckptd (daemon/loadio.h),
 * spoken in raw protocol, so that every check the daemon makes on a
 * client's LOAD_* messages is reached: bytes land in the arena as the file
 * has them, short at the end of the file; descriptors that are not regular
 * files open for reading fail their reads; handles never lent or given
 * back fail theirs; unaligned reads, reads outside the arena and LOAD_FILE
 * without a descriptor end the connection, and the daemon serves others
 * meanwhile.  The shared pool (daemon/share.h): a read one connection
 * made is answered to another of the same uid from the pool, without the
 * disk, in a read-only sealed memfd; a file written again is a new key;
 * pieces go once no client has their file lent;
 * releases of tokens that hold nothing end the connection; pins go with
 * the connection.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "shm/proto.h"
#include "tests/lib/testd.h"

#define MiB (1ull << 20)
#define ARENA (16 * MiB)

struct raw {
	int fd;
	uint8_t *arena;
	uint64_t arena_bytes, slot_bytes;
};

static void raw_open(struct raw *r, const char *sock, const char *job)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct proto_hello h;
	struct timeval tv = { 20, 0 };
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_hello_ok ok;
	} u;
	char err[256];
	int afd = -1;
	ssize_t n;

	r->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(r->fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	ck_assert_int_eq(connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	proto_init(&h.h, PROTO_HELLO, sizeof(h));
	h.role = PROTO_ROLE_CLIENT;
	h.world = 1;
	h.umask = 022;
	h.arena_bytes = ARENA;
	snprintf(h.job, sizeof(h.job), "%s", job);
	ck_assert_int_eq(proto_send(r->fd, &h, sizeof(h), -1), 0);
	n = proto_recv(r->fd, u.buf, &afd);
	ck_assert_int_eq(proto_check(u.buf, (size_t)n, err, sizeof(err)), PROTO_HELLO_OK);
	ck_assert_int_ge(afd, 0);
	r->arena_bytes = u.ok.arena_bytes;
	r->slot_bytes = u.ok.slot_bytes;
	r->arena = mmap(NULL, r->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
	ck_assert(r->arena != MAP_FAILED);
	close(afd);
}

static void raw_close(struct raw *r)
{
	munmap(r->arena, r->arena_bytes);
	close(r->fd);
}

static void lend(struct raw *r, uint32_t handle, int fd)
{
	struct proto_load_file m;

	proto_init(&m.h, PROTO_LOAD_FILE, sizeof(m));
	m.handle = handle;
	ck_assert_int_eq(proto_send(r->fd, &m, sizeof(m), fd), 0);
}

static void give_back(struct raw *r, uint32_t handle)
{
	struct proto_load_close m;

	proto_init(&m.h, PROTO_LOAD_CLOSE, sizeof(m));
	m.handle = handle;
	ck_assert_int_eq(proto_send(r->fd, &m, sizeof(m), -1), 0);
}

static void send_read_flags(struct raw *r, uint32_t token, uint32_t handle, uint64_t file_off,
			    uint64_t len, uint64_t arena_off, uint32_t flags)
{
	struct proto_load_read m;

	memset(&m, 0, sizeof(m));
	proto_init(&m.h, PROTO_LOAD_READ, sizeof(m));
	m.flags = flags;
	m.token = token;
	m.handle = handle;
	m.file_off = file_off;
	m.len = len;
	m.arena_off = arena_off;
	ck_assert_int_eq(proto_send(r->fd, &m, sizeof(m), -1), 0);
}

static void send_read(struct raw *r, uint32_t token, uint32_t handle, uint64_t file_off,
		      uint64_t len, uint64_t arena_off)
{
	send_read_flags(r, token, handle, file_off, len, arena_off, 0);
}

/* The next message: LOAD_DONE (returns its err or got, token checked) or
 * ERROR (returns INT64_MIN, its text in msg). */
static int64_t next_answer(struct raw *r, uint32_t token, char *msg, size_t len)
{
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_load_done d;
		struct proto_error e;
	} u;
	char err[256];
	ssize_t n = proto_recv(r->fd, u.buf, NULL);
	int type;

	ck_assert_msg(n > 0, "no answer: %zd", n);
	type = proto_check(u.buf, (size_t)n, err, sizeof(err));
	if (type == PROTO_ERROR) {
		snprintf(msg, len, "%s", u.e.msg);
		return INT64_MIN;
	}
	ck_assert_int_eq(type, PROTO_LOAD_DONE);
	ck_assert_uint_eq(u.d.token, token);
	return u.d.err ? u.d.err : (int64_t)u.d.got;
}

static int64_t read_once(struct raw *r, uint32_t token, uint32_t handle, uint64_t file_off,
			 uint64_t len, uint64_t arena_off)
{
	char msg[PROTO_MSG_LEN] = "";
	int64_t v;

	send_read(r, token, handle, file_off, len, arena_off);
	v = next_answer(r, token, msg, sizeof(msg));
	ck_assert_msg(v != INT64_MIN, "read dropped the connection: %s", msg);
	return v;
}

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)((i * 2654435761u) >> 13);
}

/* A file of `size` pattern bytes at path. */
static void make_file(const char *path, uint64_t size)
{
	uint8_t *b = malloc(size);
	int fd;

	ck_assert_ptr_nonnull(b);
	for (uint64_t i = 0; i < size; i++)
		b[i] = pattern(i);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, b, size), (ssize_t)size);
	fsync(fd);
	close(fd);
	free(b);
}

static void check_bytes(const uint8_t *got, uint64_t file_off, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		if (got[i] != pattern(file_off + i))
			ck_abort_msg("byte %llu of the file: %u, want %u",
				     (unsigned long long)(file_off + i), got[i],
				     pattern(file_off + i));
}

START_TEST(test_reads)
{
	const uint64_t size = 3 * MiB + 123;
	struct testd t;
	struct raw r;
	char path[TD_PATH], fifo[TD_PATH];
	int fd, ffd, dfd, wfd;

	td_init(&t, "loadio_reads");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	td_path(path, sizeof(path), "%s/data", t.dir);
	make_file(path, size);
	raw_open(&r, td_sock(&t, 0), "lio");
	ck_assert_uint_ge(r.arena_bytes, 8 * MiB);

	fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	lend(&r, 0, fd);
	close(fd); /* the daemon keeps its own */

	/* The whole file, asked for rounded up: short at the end. */
	memset(r.arena, 0xee, 4 * MiB);
	ck_assert_int_eq(read_once(&r, 1, 0, 0, 4 * MiB, 0), (int64_t)size);
	check_bytes(r.arena, 0, size);
	/* A middle piece into the second slot. */
	memset(r.arena + r.slot_bytes, 0, MiB);
	ck_assert_int_eq(read_once(&r, 2, 0, MiB, MiB, r.slot_bytes), (int64_t)MiB);
	check_bytes(r.arena + r.slot_bytes, MiB, MiB);
	/* Past the end: nothing, not an error. */
	ck_assert_int_eq(read_once(&r, 3, 0, 8 * MiB, 4096, 0), 0);

	/* A handle never lent, and one given back. */
	ck_assert_int_eq(read_once(&r, 4, 7, 0, 4096, 0), -EBADF);
	give_back(&r, 0);
	ck_assert_int_eq(read_once(&r, 5, 0, 0, 4096, 0), -EBADF);

	/* Not regular files, and a file not open for reading. */
	td_path(fifo, sizeof(fifo), "%s/fifo", t.dir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ffd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	ck_assert_int_ge(ffd, 0);
	lend(&r, 1, ffd);
	close(ffd);
	ck_assert_int_eq(read_once(&r, 6, 1, 0, 4096, 0), -EINVAL);
	dfd = open(t.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dfd, 0);
	lend(&r, 2, dfd);
	close(dfd);
	ck_assert_int_eq(read_once(&r, 7, 2, 0, 4096, 0), -EINVAL);
	wfd = open(path, O_WRONLY | O_CLOEXEC);
	ck_assert_int_ge(wfd, 0);
	lend(&r, 3, wfd);
	close(wfd);
	ck_assert_int_eq(read_once(&r, 8, 3, 0, 4096, 0), -EBADF);

	/* A handle lent again works again. */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	lend(&r, 1, fd);
	close(fd);
	ck_assert_int_eq(read_once(&r, 9, 1, 0, 4096, 0), 4096);
	check_bytes(r.arena, 0, 4096);
	raw_close(&r);
	td_fini(&t);
}
END_TEST

/* Each of these ends the connection with an ERROR naming the problem;
 * another client is served after each. */
static const struct {
	const char *what;
	uint64_t file_off, len, arena_off; /* arena_off ~0: the arena's size */
	bool no_fd;
	const char *expect;
} bad[] = {
	{ "unaligned file offset", 100, 4096, 0, false, "not aligned" },
	{ "unaligned length", 0, 4000, 0, false, "not aligned" },
	{ "unaligned arena offset", 0, 4096, 512, false, "not aligned" },
	{ "outside the arena", 0, 8192, ~0ull, false, "inside the arena" },
	{ "empty read", 0, 0, 0, false, "not aligned" },
	{ "too large a read", 0, PROTO_LOAD_MAX + 4096, 0, false, "not aligned" },
	{ "LOAD_FILE without a descriptor", 0, 0, 0, true, "without a descriptor" },
};

START_TEST(test_bad)
{
	struct testd t;
	struct raw r, other;
	char path[TD_PATH], msg[PROTO_MSG_LEN] = "";
	int fd;
	int64_t v;

	td_init(&t, "loadio_bad");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	td_path(path, sizeof(path), "%s/data", t.dir);
	make_file(path, MiB);
	raw_open(&r, td_sock(&t, 0), "lio");
	if (bad[_i].no_fd) {
		struct proto_load_file m;
		proto_init(&m.h, PROTO_LOAD_FILE, sizeof(m));
		ck_assert_int_eq(proto_send(r.fd, &m, sizeof(m), -1), 0);
	} else {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		lend(&r, 0, fd);
		close(fd);
		send_read(&r, 1, 0, bad[_i].file_off, bad[_i].len,
			  bad[_i].arena_off == ~0ull ? r.arena_bytes - 4096 : bad[_i].arena_off);
	}
	v = next_answer(&r, 1, msg, sizeof(msg));
	ck_assert_msg(v == INT64_MIN, "%s: answered %lld instead of dropping", bad[_i].what,
		      (long long)v);
	ck_assert_msg(strstr(msg, bad[_i].expect), "%s: '%s'", bad[_i].what, msg);
	raw_close(&r);

	/* The daemon goes on. */
	raw_open(&other, td_sock(&t, 0), "lio2");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	lend(&other, 0, fd);
	close(fd);
	ck_assert_int_eq(read_once(&other, 1, 0, 0, MiB, 0), (int64_t)MiB);
	check_bytes(other.arena, 0, MiB);
	raw_close(&other);
	td_fini(&t);
}
END_TEST

/* One uid cannot take the daemon's descriptors: past a quarter of half
 * its RLIMIT_NOFILE (here 512: 64 per uid), lent descriptors are refused
 * (their reads fail with EMFILE) and another client still connects and
 * reads. */
START_TEST(test_lend_cap)
{
	struct rlimit old, low = { 512, 512 };
	struct testd t;
	struct raw r, other;
	char path[TD_PATH];
	unsigned refused = 0;
	int fd;

	td_init(&t, "loadio_cap");
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
	/* The soft limit only: lowering the hard one could not be undone. */
	low.rlim_max = old.rlim_max;
	low.rlim_cur = old.rlim_cur < 512 ? old.rlim_cur : 512;
	/* The daemon inherits it. */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
	td_path(path, sizeof(path), "%s/data", t.dir);
	make_file(path, 8192);
	raw_open(&r, td_sock(&t, 0), "lio");
	for (uint32_t h = 0; h < 100; h++) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		ck_assert_int_ge(fd, 0);
		lend(&r, h, fd);
		close(fd);
	}
	for (uint32_t h = 0; h < 100; h++) {
		int64_t v = read_once(&r, h + 1, h, 0, 4096, 0);
		if (v == -EMFILE)
			refused++;
		else
			ck_assert_int_eq(v, 4096);
	}
	ck_assert_uint_eq(refused, 100 - 64);
	/* The daemon still has descriptors for others (an arena, a ring). */
	raw_open(&other, td_sock(&t, 0), "lio2");
	/* The hog leaves: its descriptors come back once the daemon has
	 * reaped its connection (between loop rounds), and the same uid may
	 * lend again. */
	raw_close(&r);
	{
		int64_t v = -EMFILE;
		for (uint32_t h = 0; h < 100 && v == -EMFILE; h++) {
			fd = open(path, O_RDONLY | O_CLOEXEC);
			lend(&other, h, fd);
			close(fd);
			v = read_once(&other, h + 1, h, 0, 4096, 0);
			if (v == -EMFILE)
				td_sleep_ms(50);
		}
		ck_assert_int_eq(v, 4096);
	}
	raw_close(&other);
	td_fini(&t);
}
END_TEST

/* ---- the shared pool ---------------------------------------------------- */

/* A LOAD_DONE with where its bytes are. */
struct pdone {
	int64_t v;           /* err or got; INT64_MIN: an ERROR came (msg) */
	uint32_t flags, gen;
	uint64_t pool_off;
	int fd;              /* the pool, when it came with this answer */
	char msg[PROTO_MSG_LEN];
};

static void next_pdone(struct raw *r, uint32_t token, struct pdone *d)
{
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_load_done d;
		struct proto_error e;
	} u;
	char err[256];
	int fd = -1, type;
	ssize_t n = proto_recv(r->fd, u.buf, &fd);

	memset(d, 0, sizeof(*d));
	d->fd = -1;
	ck_assert_msg(n > 0, "no answer: %zd", n);
	type = proto_check(u.buf, (size_t)n, err, sizeof(err));
	if (type == PROTO_ERROR) {
		snprintf(d->msg, sizeof(d->msg), "%s", u.e.msg);
		d->v = INT64_MIN;
		ck_assert_int_lt(fd, 0);
		return;
	}
	ck_assert_msg(type == PROTO_LOAD_DONE, "type %d: %s", type, err);
	ck_assert_uint_eq(u.d.token, token);
	d->v = u.d.err ? u.d.err : (int64_t)u.d.got;
	d->flags = u.d.flags;
	d->gen = u.d.pool_gen;
	d->pool_off = u.d.pool_off;
	d->fd = fd;
	ck_assert_msg(fd < 0 || (u.d.flags & PROTO_DONE_POOL), "a descriptor outside the pool");
}

static void send_release(struct raw *r, uint32_t token)
{
	struct proto_load_release m;

	memset(&m, 0, sizeof(m));
	proto_init(&m.h, PROTO_LOAD_RELEASE, sizeof(m));
	m.token = token;
	ck_assert_int_eq(proto_send(r->fd, &m, sizeof(m), -1), 0);
}

/* Daemon 0's status report: its "loads" object's integer `key`, and its
 * first pool's integer `pkey` (-1: no pool). */
static int64_t loads_stat(struct testd *t, const char *key, const char *pkey, int64_t *ret_pv)
{
	char *out = NULL;
	json_error_t je;
	json_t *j, *loads, *pools;
	int st = td_ckptctl(&out, "-s", td_sock(t, 0), "status", "--json", NULL);
	int64_t v;

	ck_assert_msg(st == 0, "ckptctl status: %s: %s", td_status_str(st), out ? out : "");
	j = json_loads(out, 0, &je);
	ck_assert_msg(j, "status is not JSON: %s", out);
	loads = json_object_get(j, "loads");
	ck_assert_msg(json_is_object(loads), "no \"loads\" in the status: %s", out);
	ck_assert_msg(json_is_integer(json_object_get(loads, key)), "no loads.%s: %s", key, out);
	v = json_integer_value(json_object_get(loads, key));
	pools = json_object_get(loads, "pools");
	if (ret_pv)
		*ret_pv = json_array_size(pools) ?
				  json_integer_value(json_object_get(json_array_get(pools, 0), pkey)) :
				  -1;
	json_decref(j);
	free(out);
	return v;
}

/* Reads [off, +len) of handle with PROTO_LOAD_SHARE until the answer comes
 * in the pool (the first read of a uid has the pool made: until it is,
 * reads land in the arena; bounded, 15 s). */
static void read_until_pool(struct raw *r, uint32_t *token, uint32_t handle, uint64_t off,
			    uint64_t len, struct pdone *d)
{
	int64_t end = td_now_ms() + 15000;

	for (;;) {
		uint32_t tok = ++*token;
		send_read_flags(r, tok, handle, off, len, 0, PROTO_LOAD_SHARE);
		next_pdone(r, tok, d);
		ck_assert_msg(d->v != INT64_MIN, "dropped: %s", d->msg);
		if (d->flags & PROTO_DONE_POOL)
			return;
		ck_assert_int_le(d->v, (int64_t)len);
		check_bytes(r->arena, off, (uint64_t)d->v);
		ck_assert_msg(td_now_ms() < end, "no answer in the pool after 15 s");
		td_sleep_ms(50);
	}
}

START_TEST(test_pool)
{
	const uint64_t size = 6 * MiB + 4096;
	struct testd t;
	struct raw a, b, o;
	struct pdone d, e;
	char path[TD_PATH], proc[64];
	uint32_t tok_a = 0, tok_b = 100;
	int64_t pins = 0;
	int fd, rw_fd;
	void *map;
	struct stat st;

	td_init(&t, "loadio_pool");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nload_share = 64M\n"), 0);
	td_path(path, sizeof(path), "%s/data", t.dir);
	make_file(path, size);
	raw_open(&a, td_sock(&t, 0), "lio");
	raw_open(&b, td_sock(&t, 0), "lio"); /* the same uid and job: the same pool */
	raw_open(&o, td_sock(&t, 0), "other-job");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	lend(&a, 0, fd);
	lend(&o, 3, fd);
	/* One client of the job has the file: nothing to share, no pool. */
	send_read_flags(&a, ++tok_a, 0, 0, MiB, 0, PROTO_LOAD_SHARE);
	next_pdone(&a, tok_a, &d);
	ck_assert_int_eq(d.v, (int64_t)MiB);
	ck_assert_uint_eq(d.flags, 0);
	check_bytes(a.arena, 0, MiB);
	(void)loads_stat(&t, "disk_bytes", "entries", &pins);
	ck_assert_int_eq(pins, -1);
	lend(&b, 7, fd);
	close(fd);

	/* a reads [1M, 5M): from the disk into the pool. */
	read_until_pool(&a, &tok_a, 0, MiB, 4 * MiB, &d);
	ck_assert_int_eq(d.v, (int64_t)(4 * MiB));
	ck_assert_msg(!(d.flags & PROTO_DONE_SHARED), "a's own read is not shared");
	ck_assert_int_ge(d.fd, 0);
	ck_assert_int_eq(fstat(d.fd, &st), 0);
	ck_assert_uint_ge((uint64_t)st.st_size, d.pool_off + 4 * MiB);
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, d.fd, 0);
	ck_assert(map != MAP_FAILED);
	check_bytes((const uint8_t *)map + d.pool_off, MiB, 4 * MiB);

	/* The pool is read-only for clients: not writable through the
	 * descriptor, nor through one reopened read-write via /proc (sealed). */
	ck_assert(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, d.fd, 0) == MAP_FAILED);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", d.fd);
	rw_fd = open(proc, O_RDWR | O_CLOEXEC);
	if (rw_fd >= 0) {
		ck_assert(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw_fd, 0) ==
			  MAP_FAILED);
		ck_assert_int_lt(pwrite(rw_fd, "x", 1, (off_t)d.pool_off), 0);
		close(rw_fd);
	}

	/* b reads [2M, 4M), inside a's piece: from the pool, shared, with the
	 * pool's descriptor (b's first). */
	send_read_flags(&b, ++tok_b, 7, 2 * MiB, 2 * MiB, 0, PROTO_LOAD_SHARE);
	next_pdone(&b, tok_b, &e);
	ck_assert_msg(e.v == (int64_t)(2 * MiB), "b got %lld (%s)", (long long)e.v, e.msg);
	ck_assert_uint_eq(e.flags, PROTO_DONE_POOL | PROTO_DONE_SHARED);
	ck_assert_uint_eq(e.gen, d.gen);
	ck_assert_uint_eq(e.pool_off, d.pool_off + MiB);
	ck_assert_int_ge(e.fd, 0);
	close(e.fd);
	check_bytes((const uint8_t *)map + e.pool_off, 2 * MiB, 2 * MiB);
	ck_assert_int_ge(loads_stat(&t, "shared_bytes", "pins", &pins), (int64_t)(2 * MiB));
	ck_assert_int_eq(pins, 2);

	/* A client of another job (same uid) lent the same file: its job has
	 * no pool of its own (one lender), and it never gets this one. */
	send_read_flags(&o, 1, 3, 2 * MiB, 2 * MiB, 0, PROTO_LOAD_SHARE);
	next_pdone(&o, 1, &e);
	ck_assert_int_eq(e.v, (int64_t)(2 * MiB));
	ck_assert_uint_eq(e.flags, 0);
	ck_assert_int_lt(e.fd, 0);
	check_bytes(o.arena, 2 * MiB, 2 * MiB);
	raw_close(&o);

	/* The end of the file: a read past it is short, from the pool too. */
	read_until_pool(&a, &tok_a, 0, 4 * MiB, 4 * MiB, &e);
	ck_assert_int_eq(e.v, (int64_t)(size - 4 * MiB));
	ck_assert_int_lt(e.fd, 0); /* a has this pool already */
	check_bytes((const uint8_t *)map + e.pool_off, 4 * MiB, size - 4 * MiB);
	send_release(&a, tok_a);

	/* The file written again (another mtime, other bytes): a new key, so
	 * b's read of the same range comes from the disk. */
	td_sleep_ms(20);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "\xAA\xBB", 2, (off_t)(3 * MiB)), 2);
	close(fd);
	send_read_flags(&b, ++tok_b, 7, 2 * MiB, 2 * MiB, 0, PROTO_LOAD_SHARE);
	next_pdone(&b, tok_b, &e);
	ck_assert_int_eq(e.v, (int64_t)(2 * MiB));
	ck_assert_uint_eq(e.flags, PROTO_DONE_POOL);
	ck_assert_uint_eq(((const uint8_t *)map)[e.pool_off + MiB], 0xAA);
	ck_assert_uint_eq(((const uint8_t *)map)[e.pool_off + MiB + 1], 0xBB);
	send_release(&b, tok_b);

	/* A release of a token that holds nothing (this one was just
	 * released) ends the connection. */
	send_release(&b, tok_b);
	next_pdone(&b, 0, &e);
	ck_assert_msg(e.v == INT64_MIN && strstr(e.msg, "LOAD_RELEASE"), "'%s'", e.msg);
	raw_close(&b);

	/* a leaves holding its first pin; the pins go with it. */
	raw_close(&a);
	{
		int64_t end = td_now_ms() + 15000;
		do {
			td_sleep_ms(20);
			(void)loads_stat(&t, "disk_bytes", "pins", &pins);
		} while (pins != 0 && td_now_ms() < end);
		ck_assert_int_eq(pins, 0);
	}
	/* No client has the file lent any more: the pool keeps none of its
	 * pieces (it shares between loads at once, it is no cache). */
	(void)loads_stat(&t, "disk_bytes", "entries", &pins);
	ck_assert_int_eq(pins, 0);
	/* A client that does not offer the pool gets its bytes in its arena. */
	raw_open(&a, td_sock(&t, 0), "lio");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	lend(&a, 0, fd);
	close(fd);
	ck_assert_int_eq(read_once(&a, 1, 0, 0, MiB, 0), (int64_t)MiB);
	check_bytes(a.arena, 0, MiB);
	raw_close(&a);
	munmap(map, (size_t)st.st_size);
	close(d.fd);
	td_fini(&t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("loadio");

	td_case(s, "reads", test_reads, 60, 0, 1);
	td_case(s, "bad", test_bad, 60, 0, (int)(sizeof(bad) / sizeof(bad[0])));
	td_case(s, "lend_cap", test_lend_cap, 60, 0, 1);
	td_case(s, "pool", test_pool, 90, 0, 1);
	return td_main(s, "check_loadio");
}
