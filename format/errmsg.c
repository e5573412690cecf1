/* SPDX-License-Identifier: MIT */
/* errmsg.c - reason strings (see errmsg.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "format/errmsg.h"

int errmsg_set(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return ret;
}

const char *errmsg_safe(const char *s, char buf[ERRMSG_SAFE_LEN])
{
	const size_t max = ERRMSG_SAFE_LEN - 4;
	size_t i;

	if (!s)
		s = "(null)";
	for (i = 0; s[i] && i < max; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	if (s[i])
		memcpy(buf + i, "...", 4);
	else
		buf[i] = '\0';
	return buf;
}

const char *errmsg_dims(const uint64_t *d, unsigned n, char *buf, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(buf, len, "[");
	for (unsigned i = 0; i < n && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? "," : "",
				      (unsigned long long)d[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}
