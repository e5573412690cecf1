/* SPDX-License-Identifier: MIT */
/*
 * errmsg.h - the "reason" strings of the format module's parsers.
 *
 * Parsers report why they refused input in a caller's buffer (err, errlen),
 * which the daemon logs and the client passes back to the user.  Input comes
 * from peers, so what a message quotes of it is cut short and made printable.
 */
#ifndef CKPT_FORMAT_ERRMSG_H
#define CKPT_FORMAT_ERRMSG_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a buffer for errmsg_safe(): 48 quoted bytes, "..." and NUL. */
#define ERRMSG_SAFE_LEN 52

/* Formats a reason into err (if err is not NULL and errlen > 0) and returns
 * `ret`, so that `return errmsg_set(err, errlen, -EBADMSG, ...)` reads well. */
__attribute__((format(printf, 4, 5)))
int errmsg_set(char *err, size_t errlen, int ret, const char *fmt, ...);

/* A peer's string for a message: at most 48 bytes, anything outside printable
 * ASCII shown as '?', "..." if cut.  Returns buf. */
const char *errmsg_safe(const char *s, char buf[ERRMSG_SAFE_LEN]);

/* A shape or offsets for a message: "[2,3,4]" (cut short if len is too
 * small).  Returns buf. */
const char *errmsg_dims(const uint64_t *d, unsigned n, char *buf, size_t len);

#endif
