/* SPDX-License-Identifier: MIT */
/*
 * testgate.c - pauses at named steps, for tests only (testgate.h).
 */
#include "daemon/testgate.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "store/remove.h"

static char *g_dir; /* set once at start-up, read-only afterwards */

void testgate_init(void)
{
	const char *d = getenv("CKPTD_TEST_GATE");

	if (d && d[0] == '/' && strlen(d) < PATH_MAX - 64) {
		g_dir = strdup(d);
		if (g_dir) {
			log_warn("CKPTD_TEST_GATE is set: steps may pause for tests ('%s')", g_dir);
			/* The removal's own steps ("discard-data", "rename",
			 * ...) become gates too. */
			store_remove_hook = testgate;
		}
	}
}

void testgate(const char *step)
{
	char hold[PATH_MAX], waiting[PATH_MAX];
	int fd;

	if (!g_dir)
		return;
	snprintf(hold, sizeof(hold), "%s/%s.hold", g_dir, step);
	if (access(hold, F_OK) != 0)
		return;
	snprintf(waiting, sizeof(waiting), "%s/%s.waiting", g_dir, step);
	fd = open(waiting, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0)
		close(fd);
	log_info("test gate: held at '%s'", step);
	for (int i = 0; i < TESTGATE_MAX_S * 50 && access(hold, F_OK) == 0; i++) {
		struct timespec ts = { 0, 20 * 1000000L };
		nanosleep(&ts, NULL);
	}
	if (access(hold, F_OK) == 0)
		log_warn("test gate: '%s' held longer than %d s: going on", step, TESTGATE_MAX_S);
	else
		log_info("test gate: released at '%s'", step);
}
