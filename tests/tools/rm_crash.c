/* SPDX-License-Identifier: MIT */
/*
 * rm_crash.c - for the crash tests of removal (tests/integration/
 * prune_crash.sh).  Unlike the other tools it calls libckpt's internals
 * (store/remove.h), as ckptctl prune does.
 *
 *   rm_crash remove ROOT NAME K [ETAG]
 *                                 removes checkpoint NAME of ROOT (a
 *                                 directory or s3://...; S3 from the AWS_*
 *                                 variables) and dies (_exit 86, as a
 *                                 crash: nothing flushed, no clean-up)
 *                                 just before the K-th step of the
 *                                 removal; K = 0 never dies; on S3, ETAG
 *                                 is the manifest's as planned, the pins
 *                                 are checked again as prune does, and
 *                                 with RM_CRASH_PIN set in the
 *                                 environment NAME is pinned (the root's
 *                                 .ckpt-pins written) just after the
 *                                 tombstone, as a pin racing a prune;
 *                                 with RM_CRASH_PAUSE=STEP it prints
 *                                 "paused STEP" before that step and
 *                                 waits for a line on stdin
 *   rm_crash hold PATH            opens checkpoint PATH with ckpt_reader
 *                                 (taking its lease), prints "held", and
 *                                 keeps it until stdin ends
 *   rm_crash lease S3URL          takes an S3 lease on S3URL and prints
 *                                 "leased KEY"; renews it, due or not, for
 *                                 each "renew" line on stdin ("renewed");
 *                                 drops it when stdin ends
 *
 * remove prints "crash before STEP (step K)" or "done in N steps" and
 * exits 86 or 0 (1 if the removal failed, 2 on bad usage).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "store/prune.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

static unsigned long crash_at, steps;
static const char *pin_root, *pin_name; /* RM_CRASH_PIN: a pin lands late */

static const char *pause_at; /* RM_CRASH_PAUSE: a step to wait before */

static void hook(const char *step)
{
	if (pause_at && !strcmp(step, pause_at)) {
		char line[64];

		printf("paused %s\n", step);
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			_exit(87); /* the test went away */
	}
	if (pin_root && !strcmp(step, "leases")) {
		/* As if `ckptctl pin` ran after the plan, before the recheck:
		 * the pin list is written as that would. */
		char text[600], err[512];
		int r;

		snprintf(text, sizeof(text), "%s\n", pin_name);
		r = store_s3_put_if(pin_root, ".ckpt-pins", text, NULL, err, sizeof(err));
		fprintf(stderr, "pinned %s late: %s\n", pin_name, r ? err : "ok");
		pin_root = NULL;
	}
	if (++steps == crash_at) {
		fprintf(stderr, "crash before %s (step %lu)\n", step, steps);
		_exit(86);
	}
}

static int cmd_remove(const char *root, const char *name, const char *k, const char *etag)
{
	char err[512] = "", *end;
	int r;

	crash_at = strtoul(k, &end, 10);
	if (*end || !*k) {
		fprintf(stderr, "rm_crash: K must be a number\n");
		return 2;
	}
	store_remove_hook = hook;
	pause_at = getenv("RM_CRASH_PAUSE");
	if (s3_is_url(root)) {
		struct store_s3_settings set = { .retries = 3 };
		char url[2048];

		r = store_s3_start_settings(&set, err, sizeof(err));
		if (r == 0) {
			struct prune_recheck rc = { .root = root, .name = name };

			if (getenv("RM_CRASH_PIN")) {
				pin_root = root;
				pin_name = name;
			}
			snprintf(url, sizeof(url), "%s/%s", root, name);
			r = store_s3_remove(url, "rm_crash", etag, prune_pin_recheck, &rc, err,
					    sizeof(err));
		}
		store_s3_stop();
	} else {
		struct store_rm_result res;
		struct store_rm_target t = { .name = name };
		int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (fd < 0) {
			fprintf(stderr, "rm_crash: %s: %s\n", root, strerror(errno));
			return 1;
		}
		r = store_local_remove(fd, &t, 1, STORE_NO_OWNER, &res) == 1 ? 0 : res.res;
		snprintf(err, sizeof(err), "%s", res.err);
		close(fd);
	}
	if (r < 0) {
		fprintf(stderr, "rm_crash: removing %s/%s: %s\n", root, name, err);
		return 1;
	}
	printf("done in %lu steps\n", steps);
	return 0;
}

static int cmd_hold(const char *path)
{
	struct ckpt_reader *rd;
	char buf[64];

	if (ckpt_reader_open(path, &rd) < 0) {
		fprintf(stderr, "rm_crash: %s\n", ckpt_last_error());
		return 1;
	}
	printf("held\n");
	fflush(stdout);
	while (read(0, buf, sizeof(buf)) > 0)
		;
	ckpt_reader_close(rd);
	return 0;
}

/* lease URL: takes an S3 lease on URL, prints "leased KEY"; for each
 * "renew" line on stdin makes it due and renews it ("renewed"); at the
 * end of stdin drops it. */
static int cmd_lease(const char *url)
{
	struct store_s3_settings set = { .retries = 3 };
	struct store_s3_lease l;
	char err[512] = "", line[64];
	int r;

	r = store_s3_start_settings(&set, err, sizeof(err));
	if (r == 0)
		r = store_s3_lease_take(url, &l, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "rm_crash: lease on %s: %s\n", url, err);
		store_s3_stop();
		return 1;
	}
	printf("leased %s\n", l.key);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (strcmp(line, "renew\n"))
			continue;
		atomic_store(&l.renew_at, 1); /* long due */
		store_s3_lease_renew(&l);
		printf("renewed\n");
		fflush(stdout);
	}
	store_s3_lease_drop(&l);
	store_s3_stop();
	return 0;
}

int main(int argc, char **argv)
{
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "remove"))
		return cmd_remove(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
	if (argc == 3 && !strcmp(argv[1], "hold"))
		return cmd_hold(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "lease"))
		return cmd_lease(argv[2]);
	fprintf(stderr, "usage: rm_crash remove ROOT NAME K [ETAG] | rm_crash hold PATH | "
		"rm_crash lease S3URL\n");
	return 2;
}
