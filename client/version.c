/* SPDX-License-Identifier: MIT */
/* version.c - ckpt_version(), made from the header's version macros. */
#include "ckpt.h"

#define STR_(x) #x
#define STR(x) STR_(x)

const char *ckpt_version(void)
{
	return STR(CKPT_VERSION_MAJOR) "." STR(CKPT_VERSION_MINOR) "." STR(CKPT_VERSION_PATCH);
}
