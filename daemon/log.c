/* SPDX-License-Identifier: MIT */
/*
 * log.c - "<N>message\n" lines on stderr, which journald turns into entries
 * of priority N (sd-daemon(3)).
 *
 * Each line goes out in one write() of at most LOG_LINE_MAX bytes, below
 * PIPE_BUF, so lines from several threads never interleave on the journal's
 * stream (a pipe or a socket).  Newlines inside a message become spaces: one
 * event, one entry.
 */
#include "daemon/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096

static atomic_int log_level = LOG_INFO;

void log_set_level(int level)
{
	if (level < LOG_EMERG)
		level = LOG_EMERG;
	if (level > LOG_DEBUG)
		level = LOG_DEBUG;
	atomic_store_explicit(&log_level, level, memory_order_relaxed);
}

void log_msg(int prio, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	int saved_errno = errno; /* callers may log between a call and errno use */
	size_t len, off = 0;
	va_list ap;
	int n;

	if (prio < LOG_EMERG)
		prio = LOG_EMERG;
	if (prio > LOG_DEBUG)
		prio = LOG_DEBUG;
	if (prio > atomic_load_explicit(&log_level, memory_order_relaxed))
		goto out;

	n = snprintf(line, sizeof(line), "<%d>", prio);
	len = (size_t)n;
	va_start(ap, fmt);
	n = vsnprintf(line + len, sizeof(line) - len - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		goto out;
	if ((size_t)n >= sizeof(line) - len - 1) {
		/* Truncated: say so, rather than cut a path silently. */
		len = sizeof(line) - 1;
		memcpy(line + len - 3, "...", 3);
	} else {
		len += (size_t)n;
	}
	for (size_t i = 3; i < len; i++) {
		if (line[i] == '\n' || line[i] == '\r')
			line[i] = ' ';
	}
	line[len++] = '\n';

	while (off < len) {
		ssize_t w = write(STDERR_FILENO, line + off, len - off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			break; /* nowhere left to report it */
		}
		off += (size_t)w;
	}
out:
	errno = saved_errno;
}
