/* SPDX-License-Identifier: MIT */
/* proto.c - framing, validation and fd passing for the ckptd protocol. */
#include "shm/proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const size_t proto_sizes[PROTO_TYPE_MAX + 1] = {
	[PROTO_HELLO] = sizeof(struct proto_hello),
	[PROTO_HELLO_OK] = sizeof(struct proto_hello_ok),
	[PROTO_ERROR] = sizeof(struct proto_error),
	[PROTO_SAVE_BEGIN] = sizeof(struct proto_save_begin),
	[PROTO_SAVE_ACK] = sizeof(struct proto_save_result),
	[PROTO_EXTENT] = sizeof(struct proto_extent),
	[PROTO_RELEASE] = sizeof(struct proto_release),
	[PROTO_SAVE_DONE] = sizeof(struct proto_save_result),
	[PROTO_SAVE_ABORT] = sizeof(struct proto_save_abort),
	[PROTO_STATUS_REQ] = sizeof(struct proto_status_req),
	[PROTO_STATUS_REPLY] = sizeof(struct proto_status_reply),
	[PROTO_SAVE_DURABLE] = sizeof(struct proto_save_result),
	[PROTO_RESIDENT_REQ] = sizeof(struct proto_resident_req),
	[PROTO_RESIDENT_REPLY] = sizeof(struct proto_resident_reply),
	[PROTO_LOAD_FILE] = sizeof(struct proto_load_file),
	[PROTO_LOAD_READ] = sizeof(struct proto_load_read),
	[PROTO_LOAD_DONE] = sizeof(struct proto_load_done),
	[PROTO_LOAD_CLOSE] = sizeof(struct proto_load_close),
	[PROTO_LOAD_RELEASE] = sizeof(struct proto_load_release),
	[PROTO_LOAD_OBJECT] = sizeof(struct proto_load_object),
	[PROTO_SPILL_DROP] = sizeof(struct proto_spill_drop),
	[PROTO_SPILL_REPLY] = sizeof(struct proto_spill_reply),
};
_Static_assert(sizeof(struct proto_spill_drop) <= PROTO_MSG_MAX, "message too large");
_Static_assert(sizeof(struct proto_spill_reply) <= PROTO_MSG_MAX, "message too large");
_Static_assert(sizeof(struct proto_load_object) <= PROTO_MSG_MAX, "message too large");

_Static_assert(sizeof(struct proto_error) <= PROTO_MSG_MAX, "message too large");
_Static_assert(sizeof(struct proto_save_result) <= PROTO_MSG_MAX, "message too large");
_Static_assert(sizeof(struct proto_hello) <= PROTO_MSG_MAX, "message too large");

void proto_init(struct proto_hdr *h, enum proto_type type, size_t size)
{
	memset(h, 0, size);
	h->magic = PROTO_MAGIC;
	h->version = PROTO_VERSION;
	h->type = (uint16_t)type;
	h->size = (uint32_t)size;
}

static bool terminated(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

int proto_check(const void *buf, size_t len, char *err, size_t errlen)
{
	const struct proto_hdr *h = buf;

	if (len < sizeof(*h)) {
		snprintf(err, errlen, "message of %zu bytes is shorter than a header", len);
		return -EBADMSG;
	}
	if (h->magic != PROTO_MAGIC) {
		snprintf(err, errlen, "bad magic 0x%08x: not a ckptd peer", h->magic);
		return -EPROTO;
	}
	if (h->version != PROTO_VERSION) {
		snprintf(err, errlen, "protocol version %u, this side speaks %u", h->version,
			 PROTO_VERSION);
		return -EPROTO;
	}
	if (h->type == 0 || h->type > PROTO_TYPE_MAX) {
		snprintf(err, errlen, "unknown message type %u", h->type);
		return -EBADMSG;
	}
	if (h->size != len || len != proto_sizes[h->type]) {
		snprintf(err, errlen, "message type %u: size %u, received %zu, expected %zu",
			 h->type, h->size, len, proto_sizes[h->type]);
		return -EBADMSG;
	}
	if (h->reserved != 0) {
		snprintf(err, errlen, "message type %u: reserved header field set", h->type);
		return -EBADMSG;
	}

	switch (h->type) {
	case PROTO_HELLO: {
		const struct proto_hello *m = buf;
		if (m->umask & ~0777u || m->flags & ~PROTO_HELLO_FLAGS || m->reserved ||
		    !terminated(m->job, sizeof(m->job)) ||
		    !terminated(m->run, sizeof(m->run)))
			goto bad_field;
		break;
	}
	case PROTO_HELLO_OK: {
		const struct proto_hello_ok *m = buf;
		if (m->reserved || !terminated(m->spill_dir, sizeof(m->spill_dir)))
			goto bad_field;
		break;
	}
	case PROTO_ERROR: {
		const struct proto_error *m = buf;
		if (m->reserved || !terminated(m->msg, sizeof(m->msg)))
			goto bad_field;
		break;
	}
	case PROTO_SAVE_ACK:
	case PROTO_SAVE_DONE:
	case PROTO_SAVE_DURABLE: {
		const struct proto_save_result *m = buf;
		if (!terminated(m->msg, sizeof(m->msg)) || m->err > 0 ||
		    (h->type == PROTO_SAVE_DURABLE && m->err))
			goto bad_field;
		break;
	}
	case PROTO_EXTENT: {
		const struct proto_extent *m = buf;
		if (m->reserved)
			goto bad_field;
		break;
	}
	case PROTO_SAVE_ABORT: {
		const struct proto_save_abort *m = buf;
		if (m->reserved)
			goto bad_field;
		break;
	}
	case PROTO_RESIDENT_REQ: {
		const struct proto_resident_req *m = buf;
		if (!terminated(m->attempt, sizeof(m->attempt)) ||
		    !terminated(m->where, sizeof(m->where)))
			goto bad_field;
		break;
	}
	case PROTO_LOAD_FILE: {
		const struct proto_load_file *m = buf;
		if (m->reserved)
			goto bad_field;
		break;
	}
	case PROTO_LOAD_OBJECT: {
		const struct proto_load_object *m = buf;
		if (m->reserved || !terminated(m->ckpt, sizeof(m->ckpt)) ||
		    !terminated(m->file, sizeof(m->file)))
			goto bad_field;
		break;
	}
	case PROTO_LOAD_CLOSE: {
		const struct proto_load_close *m = buf;
		if (m->reserved)
			goto bad_field;
		break;
	}
	case PROTO_LOAD_READ: {
		const struct proto_load_read *m = buf;
		if (m->reserved || (m->flags & ~PROTO_LOAD_SHARE))
			goto bad_field;
		break;
	}
	case PROTO_LOAD_RELEASE: {
		const struct proto_load_release *m = buf;
		if (m->reserved)
			goto bad_field;
		break;
	}
	case PROTO_LOAD_DONE: {
		const struct proto_load_done *m = buf;
		if (m->err > 0 || (m->flags & ~PROTO_DONE_FLAGS) ||
		    (m->err && m->flags) || (!(m->flags & PROTO_DONE_POOL) && (m->pool_gen || m->pool_off)))
			goto bad_field;
		break;
	}
	case PROTO_SPILL_DROP: {
		const struct proto_spill_drop *m = buf;
		if (!terminated(m->what, sizeof(m->what)))
			goto bad_field;
		break;
	}
	case PROTO_SPILL_REPLY: {
		const struct proto_spill_reply *m = buf;
		if (m->err > 0 || m->reserved || !terminated(m->msg, sizeof(m->msg)))
			goto bad_field;
		break;
	}
	case PROTO_RESIDENT_REPLY: {
		const struct proto_resident_reply *m = buf;
		if (m->err > 0 || !terminated(m->msg, sizeof(m->msg)))
			goto bad_field;
		break;
	}
	default:
		break;
	}
	return h->type;

bad_field:
	snprintf(err, errlen, "message type %u: reserved field set or string not terminated",
		 h->type);
	return -EBADMSG;
}

int proto_send(int sock, const void *msg, size_t len, int fd)
{
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	for (;;) {
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n >= 0)
			return (size_t)n == len ? 0 : -EMSGSIZE;
		if (errno != EINTR)
			return -errno;
	}
}

int proto_send_many(int sock, const void *msgs, size_t len, unsigned n, unsigned *ret_sent)
{
	struct iovec iov[PROTO_SEND_MANY_MAX];
	struct mmsghdr mh[PROTO_SEND_MANY_MAX];
	unsigned done = 0;
	int r = 0;

	while (done < n) {
		unsigned k = n - done < PROTO_SEND_MANY_MAX ? n - done : PROTO_SEND_MANY_MAX;

		for (unsigned i = 0; i < k; i++) {
			iov[i].iov_base = (char *)msgs + (size_t)(done + i) * len;
			iov[i].iov_len = len;
			memset(&mh[i], 0, sizeof(mh[i]));
			mh[i].msg_hdr.msg_iov = &iov[i];
			mh[i].msg_hdr.msg_iovlen = 1;
		}
		int got = sendmmsg(sock, mh, k, MSG_NOSIGNAL);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		for (int i = 0; i < got; i++) {
			if (mh[i].msg_len != len) {
				/* A datagram socket never sends part of a message. */
				done += (unsigned)i;
				r = -EMSGSIZE;
				goto out;
			}
		}
		done += (unsigned)got;
	}
out:
	if (ret_sent)
		*ret_sent = done;
	return r;
}

ssize_t proto_recv(int sock, void *buf, int *ret_fd)
{
	struct iovec iov = { .iov_base = buf, .iov_len = PROTO_MSG_MAX };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof(ctl.buf),
	};
	ssize_t n;
	int got = -1;

	if (ret_fd)
		*ret_fd = -1;
	for (;;) {
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
		if (n >= 0)
			break;
		if (errno != EINTR)
			return -errno;
	}
	/* Collect every passed fd: keep at most one, close the rest, so a
	 * misbehaving peer cannot make us leak descriptors. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (ret_fd && got < 0)
				got = fd;
			else
				close(fd);
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (got >= 0)
			close(got);
		return -EMSGSIZE;
	}
	if (ret_fd)
		*ret_fd = got;
	return n;
}

void proto_set_msg(char *dst, const char *src)
{
	snprintf(dst, PROTO_MSG_LEN, "%s", src ? src : "");
}
