/* SPDX-License-Identifier: MIT */
/* error.c - the per-thread message behind ckpt_last_error(). */
#include <stdarg.h>
#include <stdio.h>

#include "client/internal.h"

static __thread char last_error[PROTO_MSG_LEN];

void cli_set_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
}

const char *ckpt_last_error(void)
{
	return last_error;
}
