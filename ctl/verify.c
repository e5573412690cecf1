/* SPDX-License-Identifier: MIT */
/* verify.c - ckptctl verify (being written). */
#include "ctl/ctl.h"

int ctl_verify(const char *path, bool json)
{
	(void)path;
	(void)json;
	ctl_err("verify: not built yet");
	return CTL_EXIT_ERROR;
}
