/* SPDX-License-Identifier: MIT */
/* testhook.c - a pause at a named step, for tests (testhook.h). */
#include "daemon/testhook.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"

/* Written once by testhook_init before any worker starts; read-only after. */
static char g_step[64];
static char g_dir[PATH_MAX];

void testhook_init(void)
{
	const char *v = getenv("CKPTD_TEST_PAUSE");
	const char *colon = v ? strchr(v, ':') : NULL;

	if (!v || !*v)
		return;
	if (!colon || colon == v || (size_t)(colon - v) >= sizeof(g_step) || colon[1] != '/' ||
	    strlen(colon + 1) >= sizeof(g_dir) - 64) {
		log_warn("CKPTD_TEST_PAUSE='%.200s' is not STEP:/DIR: ignored", v);
		return;
	}
	memcpy(g_step, v, (size_t)(colon - v));
	g_step[colon - v] = '\0';
	snprintf(g_dir, sizeof(g_dir), "%s", colon + 1);
	log_warn("test hook: saves pause at step '%s' (CKPTD_TEST_PAUSE, for tests only)", g_step);
}

void testhook_pause(const char *step)
{
	char path[sizeof(g_dir) + sizeof(g_step) + 16];
	int fd;

	if (!g_step[0] || strcmp(step, g_step))
		return;
	snprintf(path, sizeof(path), "%s/%s.paused", g_dir, step);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0)
		close(fd);
	snprintf(path, sizeof(path), "%s/%s.go", g_dir, step);
	for (int i = 0; i < TESTHOOK_WAIT_S * 100 && access(path, F_OK) < 0; i++) {
		struct timespec ts = { 0, 10 * 1000000L };

		nanosleep(&ts, NULL);
	}
}
