/* SPDX-License-Identifier: MIT */
/*
 * conn.c - opening the connection to ckptd: connect, HELLO, and the answer
 * (HELLO_OK with the arena's memfd, or ERROR), all within one deadline.
 *
 * Two ways a daemon can leave a client waiting forever, both bounded here:
 * a full listen queue (connect() blocks on a Unix socket until the daemon
 * accepts) and a daemon that accepted but never answers.  SO_SNDTIMEO bounds
 * connect() and send() on Unix sockets, SO_RCVTIMEO bounds recvmsg(); both
 * are set to the time left before each step and cleared at the end, since
 * the receiver thread later blocks on the socket for as long as it lives.
 *
 * A daemon that refuses a client (too many clients, a job of another user)
 * sends ERROR and closes at once, without reading HELLO.  The client then
 * sees the refusal as a failed send (EPIPE) or a reset (ECONNRESET: the
 * daemon closed with our HELLO unread) before it reads the ERROR that is
 * queued behind it; conn_read_refusal() finds it so the user learns why.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/internal.h"

/* Deadline in ns (0: none).  Beyond a year is none: no overflow. */
static uint64_t deadline_after(int64_t timeout_ms)
{
	if (timeout_ms < 0 || timeout_ms > 365ll * 86400 * 1000)
		return 0;
	return cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Sets `opt` (SO_SNDTIMEO or SO_RCVTIMEO) to the time left.  Returns 0, or
 * -ETIMEDOUT if none is left. */
static int set_timeout(int sock, int opt, uint64_t deadline)
{
	struct timeval tv = { 0, 0 };

	if (deadline) {
		uint64_t now = cli_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		uint64_t left_us = (deadline - now + 999) / 1000;
		tv.tv_sec = (time_t)(left_us / 1000000);
		tv.tv_usec = (suseconds_t)(left_us % 1000000);
	}
	/* Cannot fail on a valid socket with a valid timeval. */
	(void)setsockopt(sock, SOL_SOCKET, opt, &tv, sizeof(tv));
	return 0;
}

int conn_read_refusal(int sock, char *msg, size_t msglen)
{
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
		struct proto_error error;
	} buf;
	char detail[PROTO_MSG_LEN];
	int flags = fcntl(sock, F_GETFL);

	if (flags < 0 || fcntl(sock, F_SETFL, flags | O_NONBLOCK) < 0)
		return 0;
	/* A reset is reported once, ahead of the data still queued. */
	for (int tries = 0; tries < 3; tries++) {
		ssize_t n = proto_recv(sock, buf.b, NULL);
		if (n == -ECONNRESET)
			continue;
		if (n <= 0)
			break;
		if (proto_check(buf.b, (size_t)n, detail, sizeof(detail)) != PROTO_ERROR)
			break;
		snprintf(msg, msglen, "%s",
			 buf.error.msg[0] ? buf.error.msg : strerror(-buf.error.err));
		(void)fcntl(sock, F_SETFL, flags);
		return buf.error.err < 0 ? buf.error.err : -EPROTO;
	}
	(void)fcntl(sock, F_SETFL, flags);
	return 0;
}

/* After the step `what` failed with r: the daemon's refusal if it sent one,
 * else r with a message about the step. */
static int step_failed(int sock, const char *path, const char *what, int r, int64_t timeout_ms)
{
	char msg[PROTO_MSG_LEN];
	int refused = conn_read_refusal(sock, msg, sizeof(msg));

	if (refused < 0) {
		cli_set_error("ckptd at '%s' refused the connection: %s", path, msg);
		return refused;
	}
	if (r == -EAGAIN || r == -EWOULDBLOCK || r == -ETIMEDOUT) {
		cli_set_error("ckpt_connect: ckptd at '%s' did not %s within %lld ms: it is stuck "
			      "or overloaded (or building a very large arena: raise timeout_ms)",
			      path, what, (long long)timeout_ms);
		return -ETIMEDOUT;
	}
	cli_set_error("ckpt_connect: %s: %s", what,
		      r == -ECONNRESET ? "ckptd closed the connection" : strerror(-r));
	return r;
}

static int connect_socket(int sock, const char *path, uint64_t deadline, int64_t timeout_ms)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int r;

	memcpy(sa.sun_path, path, strlen(path) + 1);
	for (;;) {
		r = set_timeout(sock, SO_SNDTIMEO, deadline);
		if (r < 0)
			break;
		if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return 0;
		r = -errno;
		if (r != -EINTR)
			break;
	}
	if (r == -ENOENT || r == -ECONNREFUSED)
		cli_set_error("no ckptd listening on '%s': %s", path, strerror(-r));
	else if (r == -EACCES || r == -EPERM)
		cli_set_error("no permission to connect to ckptd at '%s': %s", path, strerror(-r));
	else if (r == -EAGAIN || r == -ETIMEDOUT) {
		/* Its listen queue stayed full. */
		cli_set_error("ckpt_connect: ckptd at '%s' did not accept the connection within "
			      "%lld ms: it is stuck or overloaded", path, (long long)timeout_ms);
		r = -ETIMEDOUT;
	} else
		cli_set_error("connecting to ckptd at '%s': %s", path, strerror(-r));
	return r;
}

int conn_open(const char *path, const struct proto_hello *hello, int64_t timeout_ms,
	      int *ret_sock, struct proto_hello_ok *ret_ok, int *ret_fd)
{
	union {
		char b[PROTO_MSG_MAX];
		uint64_t align;
		struct proto_hello_ok ok;
		struct proto_error error;
	} buf;
	uint64_t deadline = deadline_after(timeout_ms);
	char detail[PROTO_MSG_LEN];
	int sock, fd = -1, type, r;
	ssize_t n;

	if (!path[0] || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		cli_set_error("ckpt_connect: socket path '%s' is empty or too long", path);
		return -EINVAL;
	}
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sock < 0) {
		r = -errno;
		cli_set_error("ckpt_connect: socket: %s", strerror(-r));
		return r;
	}
	r = connect_socket(sock, path, deadline, timeout_ms);
	if (r < 0)
		goto out_close;

	r = set_timeout(sock, SO_SNDTIMEO, deadline);
	if (r == 0)
		r = proto_send(sock, hello, sizeof(*hello), -1);
	if (r < 0) {
		r = step_failed(sock, path, "take HELLO", r, timeout_ms);
		goto out_close;
	}
	r = set_timeout(sock, SO_RCVTIMEO, deadline);
	n = r < 0 ? r : proto_recv(sock, buf.b, &fd);
	if (n <= 0) {
		r = step_failed(sock, path, "answer HELLO", n == 0 ? -ECONNRESET : (int)n,
				timeout_ms);
		goto out_close;
	}
	type = proto_check(buf.b, (size_t)n, detail, sizeof(detail));
	if (type < 0) {
		r = type;
		cli_set_error("ckpt_connect: bad answer from ckptd: %s", detail);
		goto out_fd;
	}
	if (type == PROTO_ERROR) {
		r = buf.error.err < 0 ? buf.error.err : -EPROTO;
		cli_set_error("ckptd at '%s' refused the connection: %s", path,
			      buf.error.msg[0] ? buf.error.msg : strerror(-r));
		goto out_fd;
	}
	if (type != PROTO_HELLO_OK) {
		r = -EPROTO;
		cli_set_error("ckpt_connect: ckptd answered HELLO with message type %d", type);
		goto out_fd;
	}
	if (fd < 0) {
		r = -EPROTO;
		cli_set_error("ckpt_connect: ckptd sent no arena with HELLO_OK");
		goto out_fd;
	}
	/* From now on the receiver thread owns the socket: no timeouts. */
	set_timeout(sock, SO_SNDTIMEO, 0);
	set_timeout(sock, SO_RCVTIMEO, 0);
	*ret_sock = sock;
	*ret_ok = buf.ok;
	*ret_fd = fd;
	return 0;

out_fd:
	if (fd >= 0)
		close(fd);
out_close:
	close(sock);
	return r;
}
