/* SPDX-License-Identifier: MIT */
/*
 * check_proto.c - the wire protocol's trust boundary: proto_check over every
 * message type (exact sizes, magic, version, reserved fields, string
 * termination, umask and error ranges), and proto_send/proto_recv's handling
 * of passed descriptors and oversized messages.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shm/proto.h"

/* Every type with the size of its struct: the table the tests build
 * messages from, written independently of proto.c's. */
static const struct {
	unsigned type;
	size_t size;
	const char *name;
} types[] = {
	{ PROTO_HELLO, sizeof(struct proto_hello), "HELLO" },
	{ PROTO_HELLO_OK, sizeof(struct proto_hello_ok), "HELLO_OK" },
	{ PROTO_ERROR, sizeof(struct proto_error), "ERROR" },
	{ PROTO_SAVE_BEGIN, sizeof(struct proto_save_begin), "SAVE_BEGIN" },
	{ PROTO_SAVE_ACK, sizeof(struct proto_save_result), "SAVE_ACK" },
	{ PROTO_EXTENT, sizeof(struct proto_extent), "EXTENT" },
	{ PROTO_RELEASE, sizeof(struct proto_release), "RELEASE" },
	{ PROTO_SAVE_DONE, sizeof(struct proto_save_result), "SAVE_DONE" },
	{ PROTO_SAVE_ABORT, sizeof(struct proto_save_abort), "SAVE_ABORT" },
	{ PROTO_STATUS_REQ, sizeof(struct proto_status_req), "STATUS_REQ" },
	{ PROTO_STATUS_REPLY, sizeof(struct proto_status_reply), "STATUS_REPLY" },
	{ PROTO_SAVE_DURABLE, sizeof(struct proto_save_result), "SAVE_DURABLE" },
	{ PROTO_RESIDENT_REQ, sizeof(struct proto_resident_req), "RESIDENT_REQ" },
	{ PROTO_RESIDENT_REPLY, sizeof(struct proto_resident_reply), "RESIDENT_REPLY" },
	{ PROTO_LOAD_FILE, sizeof(struct proto_load_file), "LOAD_FILE" },
	{ PROTO_LOAD_READ, sizeof(struct proto_load_read), "LOAD_READ" },
	{ PROTO_LOAD_DONE, sizeof(struct proto_load_done), "LOAD_DONE" },
	{ PROTO_LOAD_CLOSE, sizeof(struct proto_load_close), "LOAD_CLOSE" },
	{ PROTO_LOAD_RELEASE, sizeof(struct proto_load_release), "LOAD_RELEASE" },
	{ PROTO_LOAD_OBJECT, sizeof(struct proto_load_object), "LOAD_OBJECT" },
	{ PROTO_SPILL_DROP, sizeof(struct proto_spill_drop), "SPILL_DROP" },
	{ PROTO_SPILL_REPLY, sizeof(struct proto_spill_reply), "SPILL_REPLY" },
};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

_Static_assert(N(types) == PROTO_TYPE_MAX, "a message type is missing from the test");

/* A message buffer with room past the largest struct. */
static _Alignas(8) unsigned char buf[PROTO_MSG_MAX + 64];

/* A valid message of types[i]: zeroed, header set. */
static size_t make(int i)
{
	memset(buf, 0, sizeof(buf));
	proto_init((struct proto_hdr *)buf, types[i].type, types[i].size);
	return types[i].size;
}

static struct proto_hdr *hdr(void)
{
	return (struct proto_hdr *)buf;
}

/* proto_check with a reason buffer that must be written on failure. */
static int check(size_t len, char *err, size_t errlen)
{
	memset(err, 0, errlen);
	return proto_check(buf, len, err, errlen);
}

/* ---- every type: the valid message and its header ---- */

START_TEST(test_valid)
{
	char err[256];
	size_t len = make(_i);

	ck_assert_uint_eq(hdr()->magic, PROTO_MAGIC);
	ck_assert_uint_eq(hdr()->version, PROTO_VERSION);
	ck_assert_uint_eq(hdr()->size, types[_i].size);
	ck_assert_uint_eq(hdr()->reserved, 0);
	ck_assert(types[_i].size <= PROTO_MSG_MAX);
	ck_assert_int_eq(check(len, err, sizeof(err)), (int)types[_i].type);
}
END_TEST

/* Sizes: the message must be exactly its struct, and say so. */
START_TEST(test_sizes)
{
	char err[256];
	size_t len = make(_i);

	/* One byte short or long, header agreeing with the length. */
	hdr()->size = (uint32_t)(len - 1);
	ck_assert_int_eq(check(len - 1, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, len - 1 < sizeof(struct proto_hdr) ? "shorter" : "size") != NULL,
		      "%s: '%s'", types[_i].name, err);
	make(_i);
	hdr()->size = (uint32_t)(len + 1);
	ck_assert_int_eq(check(len + 1, err, sizeof(err)), -EBADMSG);
	/* The struct's size, but the header says otherwise (both ways). */
	make(_i);
	hdr()->size = (uint32_t)(len + 8);
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	hdr()->size = (uint32_t)(len - 8);
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	hdr()->size = 0;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	hdr()->size = UINT32_MAX;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	/* The header says the truth but the datagram was cut. */
	make(_i);
	ck_assert_int_eq(check(len - 1, err, sizeof(err)), -EBADMSG);
	ck_assert_int_eq(check(sizeof(struct proto_hdr), err, sizeof(err)),
			 len == sizeof(struct proto_hdr) ? (int)types[_i].type : -EBADMSG);
}
END_TEST

/* Magic and version: -EPROTO (not our peer, or another protocol), which the
 * daemon reports differently from a malformed message. */
START_TEST(test_magic_version)
{
	char err[256];
	size_t len = make(_i);

	hdr()->magic = 0x4b504354; /* byte-swapped */
	ck_assert_int_eq(check(len, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "magic") != NULL, "'%s'", err);
	make(_i);
	hdr()->magic = 0;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EPROTO);

	make(_i);
	hdr()->version = PROTO_VERSION - 1;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "version") != NULL, "'%s'", err);
	hdr()->version = PROTO_VERSION + 1;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EPROTO);
	hdr()->version = 0xffff;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EPROTO);
}
END_TEST

/* The header's reserved field, for every type. */
START_TEST(test_hdr_reserved)
{
	char err[256];
	size_t len = make(_i);

	hdr()->reserved = 1;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(err[0] != '\0', "no reason");
	hdr()->reserved = 0x80000000u;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
}
END_TEST

/* ---- types that do not exist ---- */

static const uint16_t bad_types[] = { 0, PROTO_TYPE_MAX + 1, 100, 0x7fff, 0xffff };

START_TEST(test_unknown_type)
{
	char err[256];
	size_t len = make(0);

	hdr()->type = bad_types[_i];
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "type") != NULL, "'%s'", err);
	/* Whatever size the header claims. */
	for (size_t sz = sizeof(struct proto_hdr); sz <= PROTO_MSG_MAX; sz += 8) {
		hdr()->size = (uint32_t)sz;
		ck_assert_int_eq(check(sz, err, sizeof(err)), -EBADMSG);
	}
}
END_TEST

/* Shorter than a header: never read past len. */
START_TEST(test_short)
{
	char err[256];

	make(0);
	for (size_t len = 0; len < sizeof(struct proto_hdr); len++)
		ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "shorter than a header") != NULL, "'%s'", err);
}
END_TEST

/* ---- fields of one type: reserved words and strings ---- */

enum field_kind { F_RESERVED, F_STRING };

static const struct {
	unsigned type;
	enum field_kind kind;
	size_t off, len;
	const char *what;
} fields[] = {
	{ PROTO_HELLO, F_STRING, offsetof(struct proto_hello, job),
	  sizeof(((struct proto_hello *)0)->job), "HELLO.job" },
	{ PROTO_HELLO, F_STRING, offsetof(struct proto_hello, run),
	  sizeof(((struct proto_hello *)0)->run), "HELLO.run" },
	{ PROTO_HELLO_OK, F_STRING, offsetof(struct proto_hello_ok, spill_dir), PROTO_MSG_LEN,
	  "HELLO_OK.spill_dir" },
	{ PROTO_HELLO_OK, F_RESERVED, offsetof(struct proto_hello_ok, reserved), 4,
	  "HELLO_OK.reserved" },
	{ PROTO_ERROR, F_RESERVED, offsetof(struct proto_error, reserved), 4, "ERROR.reserved" },
	{ PROTO_ERROR, F_STRING, offsetof(struct proto_error, msg), PROTO_MSG_LEN, "ERROR.msg" },
	{ PROTO_SAVE_ACK, F_STRING, offsetof(struct proto_save_result, msg), PROTO_MSG_LEN,
	  "SAVE_ACK.msg" },
	{ PROTO_SAVE_DONE, F_STRING, offsetof(struct proto_save_result, msg), PROTO_MSG_LEN,
	  "SAVE_DONE.msg" },
	{ PROTO_SAVE_DURABLE, F_STRING, offsetof(struct proto_save_result, msg), PROTO_MSG_LEN,
	  "SAVE_DURABLE.msg" },
	{ PROTO_EXTENT, F_RESERVED, offsetof(struct proto_extent, reserved), 4,
	  "EXTENT.reserved" },
	{ PROTO_SAVE_ABORT, F_RESERVED, offsetof(struct proto_save_abort, reserved), 4,
	  "SAVE_ABORT.reserved" },
	{ PROTO_HELLO, F_RESERVED, offsetof(struct proto_hello, reserved), 4, "HELLO.reserved" },
	{ PROTO_LOAD_FILE, F_RESERVED, offsetof(struct proto_load_file, reserved), 4,
	  "LOAD_FILE.reserved" },
	{ PROTO_LOAD_CLOSE, F_RESERVED, offsetof(struct proto_load_close, reserved), 4,
	  "LOAD_CLOSE.reserved" },
	{ PROTO_LOAD_READ, F_RESERVED, offsetof(struct proto_load_read, reserved), 4,
	  "LOAD_READ.reserved" },
	{ PROTO_LOAD_RELEASE, F_RESERVED, offsetof(struct proto_load_release, reserved), 4,
	  "LOAD_RELEASE.reserved" },
	{ PROTO_LOAD_OBJECT, F_RESERVED, offsetof(struct proto_load_object, reserved), 4,
	  "LOAD_OBJECT.reserved" },
	{ PROTO_LOAD_OBJECT, F_STRING, offsetof(struct proto_load_object, ckpt), PROTO_LOAD_URL_LEN,
	  "LOAD_OBJECT.ckpt" },
	{ PROTO_LOAD_OBJECT, F_STRING, offsetof(struct proto_load_object, file),
	  PROTO_LOAD_NAME_LEN, "LOAD_OBJECT.file" },
	{ PROTO_RESIDENT_REQ, F_STRING, offsetof(struct proto_resident_req, attempt),
	  sizeof(((struct proto_resident_req *)0)->attempt), "RESIDENT_REQ.attempt" },
	{ PROTO_RESIDENT_REQ, F_STRING, offsetof(struct proto_resident_req, where),
	  sizeof(((struct proto_resident_req *)0)->where), "RESIDENT_REQ.where" },
	{ PROTO_RESIDENT_REPLY, F_STRING, offsetof(struct proto_resident_reply, msg),
	  PROTO_MSG_LEN, "RESIDENT_REPLY.msg" },
	{ PROTO_SPILL_DROP, F_STRING, offsetof(struct proto_spill_drop, what), PROTO_SPILL_WHAT,
	  "SPILL_DROP.what" },
	{ PROTO_SPILL_REPLY, F_STRING, offsetof(struct proto_spill_reply, msg), PROTO_MSG_LEN,
	  "SPILL_REPLY.msg" },
	{ PROTO_SPILL_REPLY, F_RESERVED, offsetof(struct proto_spill_reply, reserved), 4,
	  "SPILL_REPLY.reserved" },
};

static int type_index(unsigned type)
{
	for (int i = 0; i < N(types); i++)
		if (types[i].type == type)
			return i;
	ck_abort_msg("type %u not in the table", type);
	return -1;
}

START_TEST(test_field)
{
	int t = type_index(fields[_i].type);
	unsigned char *f = buf + fields[_i].off;
	char err[256];
	size_t len;

	ck_assert(fields[_i].off + fields[_i].len <= types[t].size);
	if (fields[_i].kind == F_RESERVED) {
		/* Any bit of the word. */
		for (unsigned bit = 0; bit < 32; bit++) {
			uint32_t v = 1u << bit;
			len = make(t);
			memcpy(f, &v, sizeof(v));
			ck_assert_msg(check(len, err, sizeof(err)) == -EBADMSG, "%s bit %u accepted",
				      fields[_i].what, bit);
			ck_assert(err[0] != '\0');
		}
		return;
	}

	/* A string filling its field with its NUL in the last byte is fine;
	 * one without a NUL is refused, whatever follows it in the message. */
	len = make(t);
	memset(f, 'a', fields[_i].len - 1);
	ck_assert_int_eq(check(len, err, sizeof(err)), (int)types[t].type);
	memset(f, 'a', fields[_i].len);
	ck_assert_msg(check(len, err, sizeof(err)) == -EBADMSG, "%s unterminated accepted",
		      fields[_i].what);
	ck_assert_msg(strstr(err, "terminated") != NULL, "'%s'", err);
	/* Not even a stray byte past the NUL matters, only that there is one. */
	len = make(t);
	memset(f + 1, 'z', fields[_i].len - 1);
	ck_assert_int_eq(check(len, err, sizeof(err)), (int)types[t].type);
}
END_TEST

/* ---- values with a range ---- */

static const struct {
	uint32_t umask;
	bool ok;
} umasks[] = {
	{ 0, true },         { 022, true },       { 077, true },        { 0777, true },
	{ 01000, false },    { 01777, false },    { 04000, false },     { 0x10000, false },
	{ 0x80000000, false }, { UINT32_MAX, false },
};

START_TEST(test_hello_umask)
{
	struct proto_hello *m = (struct proto_hello *)buf;
	char err[256];
	size_t len = make(type_index(PROTO_HELLO));

	m->umask = umasks[_i].umask;
	ck_assert_msg(check(len, err, sizeof(err)) == (umasks[_i].ok ? PROTO_HELLO : -EBADMSG),
		      "umask %#o: '%s'", umasks[_i].umask, err);
}
END_TEST

/* HELLO flags: only the known ones; RESIDENT_REPLY: err <= 0. */
START_TEST(test_hello_flags_and_resident_err)
{
	struct proto_hello *m = (struct proto_hello *)buf;
	struct proto_resident_reply *rr = (struct proto_resident_reply *)buf;
	char err[256];
	size_t len;

	for (unsigned bit = 0; bit < 32; bit++) {
		len = make(type_index(PROTO_HELLO));
		m->flags = 1u << bit;
		ck_assert_int_eq(check(len, err, sizeof(err)),
				 (1u << bit) & PROTO_HELLO_FLAGS ? PROTO_HELLO : -EBADMSG);
	}
	len = make(type_index(PROTO_RESIDENT_REPLY));
	rr->err = -ENOENT;
	ck_assert_int_eq(check(len, err, sizeof(err)), PROTO_RESIDENT_REPLY);
	rr->err = ENOENT;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
}
END_TEST

/* LOAD_READ flags: only PROTO_LOAD_SHARE.  LOAD_DONE: only known flags, no
 * flags with an error, no pool fields outside the pool. */
START_TEST(test_load_flags)
{
	struct proto_load_read *rd = (struct proto_load_read *)buf;
	struct proto_load_done *d = (struct proto_load_done *)buf;
	char err[256];
	size_t len;

	for (unsigned bit = 0; bit < 32; bit++) {
		len = make(type_index(PROTO_LOAD_READ));
		rd->flags = 1u << bit;
		ck_assert_int_eq(check(len, err, sizeof(err)),
				 (1u << bit) == PROTO_LOAD_SHARE ? PROTO_LOAD_READ : -EBADMSG);
		len = make(type_index(PROTO_LOAD_DONE));
		d->flags = 1u << bit;
		ck_assert_int_eq(check(len, err, sizeof(err)),
				 (1u << bit) & PROTO_DONE_FLAGS ? PROTO_LOAD_DONE : -EBADMSG);
	}
	len = make(type_index(PROTO_LOAD_DONE));
	d->flags = PROTO_DONE_POOL | PROTO_DONE_SHARED;
	d->pool_gen = 3;
	d->pool_off = 1 << 20;
	ck_assert_int_eq(check(len, err, sizeof(err)), PROTO_LOAD_DONE);
	d->err = -EIO;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	len = make(type_index(PROTO_LOAD_DONE));
	d->pool_gen = 3;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
	len = make(type_index(PROTO_LOAD_DONE));
	d->pool_off = 4096;
	ck_assert_int_eq(check(len, err, sizeof(err)), -EBADMSG);
}
END_TEST

static const struct {
	int32_t err;
	bool ok;
} results[] = {
	{ 0, true },  { -EIO, true }, { -ENOSPC, true }, { INT32_MIN, true },
	{ 1, false }, { EIO, false }, { INT32_MAX, false },
};

START_TEST(test_result_err)
{
	static const unsigned kinds[] = { PROTO_SAVE_ACK, PROTO_SAVE_DONE, PROTO_SAVE_DURABLE };

	for (int k = 0; k < 3; k++) {
		unsigned type = kinds[k];
		struct proto_save_result *m = (struct proto_save_result *)buf;
		char err[256];
		size_t len = make(type_index(type));
		/* SAVE_DURABLE only ever says 0. */
		bool ok = results[_i].ok && (type != PROTO_SAVE_DURABLE || results[_i].err == 0);

		m->err = results[_i].err;
		ck_assert_msg(check(len, err, sizeof(err)) == (ok ? (int)type : -EBADMSG),
			      "type %u err %d: '%s'", type, results[_i].err, err);
	}
	/* SPILL_REPLY: err <= 0 too. */
	struct proto_spill_reply *sr = (struct proto_spill_reply *)buf;
	char e2[256];
	size_t len = make(type_index(PROTO_SPILL_REPLY));

	sr->err = results[_i].err;
	ck_assert_msg(check(len, e2, sizeof(e2)) == (results[_i].ok ? PROTO_SPILL_REPLY : -EBADMSG),
		      "SPILL_REPLY err %d: '%s'", results[_i].err, e2);
}
END_TEST

/* The reason buffer is optional and always terminated when small. */
START_TEST(test_err_buffer)
{
	char err[8];
	size_t len = make(0);

	hdr()->magic = 0;
	ck_assert_int_eq(proto_check(buf, len, NULL, 0), -EPROTO);
	memset(err, 'x', sizeof(err));
	ck_assert_int_eq(proto_check(buf, len, err, sizeof(err)), -EPROTO);
	ck_assert_ptr_nonnull(memchr(err, '\0', sizeof(err)));
}
END_TEST

/* ---- proto_set_msg ---- */

START_TEST(test_set_msg)
{
	char msg[PROTO_MSG_LEN + 16], big[PROTO_MSG_LEN * 2];

	memset(msg, 'x', sizeof(msg));
	proto_set_msg(msg, NULL);
	ck_assert_str_eq(msg, "");
	proto_set_msg(msg, "why");
	ck_assert_str_eq(msg, "why");
	memset(big, 'b', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	memset(msg, 'x', sizeof(msg));
	proto_set_msg(msg, big);
	ck_assert_uint_eq(strlen(msg), PROTO_MSG_LEN - 1);
	ck_assert_int_eq(msg[PROTO_MSG_LEN], 'x'); /* nothing written past the field */
}
END_TEST

/* ---- send and receive: descriptors and sizes ---- */

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void pair(int sv[2])
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

START_TEST(test_send_recv)
{
	struct proto_status_reply m, *got = (struct proto_status_reply *)buf;
	int sv[2], fd, pfd[2], before;
	char err[256];
	ssize_t n;

	pair(sv);
	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	proto_init(&m.h, PROTO_STATUS_REPLY, sizeof(m));
	m.len = 42;

	/* With an fd, asked for: it arrives, close-on-exec. */
	ck_assert_int_eq(proto_send(sv[0], &m, sizeof(m), pfd[1]), 0);
	n = proto_recv(sv[1], buf, &fd);
	ck_assert_int_eq(n, (ssize_t)sizeof(m));
	ck_assert_int_eq(proto_check(buf, (size_t)n, err, sizeof(err)), PROTO_STATUS_REPLY);
	ck_assert_uint_eq(got->len, 42);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	ck_assert_int_eq(write(fd, "k", 1), 1);
	{
		char c = 0;
		ck_assert_int_eq(read(pfd[0], &c, 1), 1);
		ck_assert_int_eq(c, 'k');
	}
	close(fd);

	/* With an fd nobody asked for: closed, not leaked. */
	before = count_fds();
	ck_assert_int_eq(proto_send(sv[0], &m, sizeof(m), pfd[1]), 0);
	ck_assert_int_eq(proto_recv(sv[1], buf, NULL), (ssize_t)sizeof(m));
	ck_assert_int_eq(count_fds(), before);

	/* Without an fd: *ret_fd is -1. */
	ck_assert_int_eq(proto_send(sv[0], &m, sizeof(m), -1), 0);
	fd = 1234;
	ck_assert_int_eq(proto_recv(sv[1], buf, &fd), (ssize_t)sizeof(m));
	ck_assert_int_eq(fd, -1);

	/* Orderly shutdown: 0; a peer gone: -EPIPE on send. */
	close(sv[0]);
	ck_assert_int_eq(proto_recv(sv[1], buf, &fd), 0);
	ck_assert_int_eq(fd, -1);
	ck_assert_int_eq(proto_send(sv[1], &m, sizeof(m), -1), -EPIPE);
	close(sv[1]);
	close(pfd[0]);
	close(pfd[1]);
}
END_TEST

/* proto_send_many: more messages than one sendmmsg takes (16), each
 * arriving as its own message, in order; a peer gone: -EPIPE and the
 * number sent before it. */
START_TEST(test_send_many)
{
	struct proto_extent m[40];
	const struct proto_extent *got = (const struct proto_extent *)buf;
	char err[256];
	unsigned sent = 99;
	int sv[2];

	pair(sv);
	for (unsigned i = 0; i < 40; i++) {
		proto_init(&m[i].h, PROTO_EXTENT, sizeof(m[i]));
		m[i].token = 7;
		m[i].file_off = (uint64_t)i << 20;
		m[i].arena_off = (uint64_t)(39 - i) << 20;
		m[i].len = 1u << 20;
	}
	ck_assert_int_eq(proto_send_many(sv[0], m, sizeof(m[0]), 40, &sent), 0);
	ck_assert_uint_eq(sent, 40);
	for (unsigned i = 0; i < 40; i++) {
		ssize_t n = proto_recv(sv[1], buf, NULL);

		ck_assert_int_eq(n, (ssize_t)sizeof(m[0]));
		ck_assert_int_eq(proto_check(buf, (size_t)n, err, sizeof(err)), PROTO_EXTENT);
		ck_assert_uint_eq(got->file_off, (uint64_t)i << 20);
		ck_assert_uint_eq(got->arena_off, (uint64_t)(39 - i) << 20);
	}
	ck_assert_int_eq(proto_send_many(sv[0], m, sizeof(m[0]), 0, &sent), 0);
	ck_assert_uint_eq(sent, 0);
	close(sv[1]);
	sent = 99;
	ck_assert_int_eq(proto_send_many(sv[0], m, sizeof(m[0]), 3, &sent), -EPIPE);
	ck_assert_uint_eq(sent, 0);
	close(sv[0]);
}
END_TEST

/* A peer passing several fds: one kept at most, the rest closed. */
START_TEST(test_recv_many_fds)
{
	struct proto_status_req m;
	int sv[2], pfd[2], fds[3], fd, before;
	union {
		char b[CMSG_SPACE(sizeof(fds))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			     .msg_controllen = sizeof(ctl.b) };
	struct cmsghdr *c;

	pair(sv);
	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	fds[0] = fds[1] = fds[2] = pfd[0];
	proto_init(&m.h, PROTO_STATUS_REQ, sizeof(m));
	memset(&ctl, 0, sizeof(ctl));
	c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));

	before = count_fds();
	ck_assert_int_eq(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(m));
	ck_assert_int_eq(proto_recv(sv[1], buf, &fd), (ssize_t)sizeof(m));
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(count_fds(), before + 1);
	close(fd);

	ck_assert_int_eq(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(m));
	ck_assert_int_eq(proto_recv(sv[1], buf, NULL), (ssize_t)sizeof(m));
	ck_assert_int_eq(count_fds(), before);
	close(sv[0]);
	close(sv[1]);
	close(pfd[0]);
	close(pfd[1]);
}
END_TEST

/* A datagram larger than any message: -EMSGSIZE, its fd closed. */
START_TEST(test_recv_too_big)
{
	static unsigned char big[PROTO_MSG_MAX + 1];
	int sv[2], pfd[2], fd = 1234, before;

	pair(sv);
	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	before = count_fds();
	ck_assert_int_eq(proto_send(sv[0], big, sizeof(big), pfd[0]), 0);
	ck_assert_int_eq(proto_recv(sv[1], buf, &fd), -EMSGSIZE);
	ck_assert_int_eq(fd, -1);
	ck_assert_int_eq(count_fds(), before);
	/* A message of exactly PROTO_MSG_MAX still arrives whole. */
	ck_assert_int_eq(proto_send(sv[0], big, PROTO_MSG_MAX, -1), 0);
	ck_assert_int_eq(proto_recv(sv[1], buf, &fd), PROTO_MSG_MAX);
	close(sv[0]);
	close(sv[1]);
	close(pfd[0]);
	close(pfd[1]);
}
END_TEST

static Suite *proto_suite(void)
{
	Suite *s = suite_create("proto");
	TCase *tc;

	tc = tcase_create("types");
	tcase_add_loop_test(tc, test_valid, 0, N(types));
	tcase_add_loop_test(tc, test_sizes, 0, N(types));
	tcase_add_loop_test(tc, test_magic_version, 0, N(types));
	tcase_add_loop_test(tc, test_hdr_reserved, 0, N(types));
	tcase_add_loop_test(tc, test_unknown_type, 0, N(bad_types));
	tcase_add_test(tc, test_short);
	suite_add_tcase(s, tc);

	tc = tcase_create("fields");
	tcase_add_loop_test(tc, test_field, 0, N(fields));
	tcase_add_loop_test(tc, test_hello_umask, 0, N(umasks));
	tcase_add_test(tc, test_hello_flags_and_resident_err);
	tcase_add_test(tc, test_load_flags);
	tcase_add_loop_test(tc, test_result_err, 0, N(results));
	tcase_add_test(tc, test_err_buffer);
	tcase_add_test(tc, test_set_msg);
	suite_add_tcase(s, tc);

	tc = tcase_create("transport");
	tcase_add_test(tc, test_send_recv);
	tcase_add_test(tc, test_send_many);
	tcase_add_test(tc, test_recv_many_fds);
	tcase_add_test(tc, test_recv_too_big);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(proto_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
