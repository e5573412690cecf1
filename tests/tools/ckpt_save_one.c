/* SPDX-License-Identifier: MIT */
/*
 * ckpt_save_one.c - saves one checkpoint through ckptd as one rank of a
 * job, for scripts that need a save to exist in a given state.
 *
 *   ckpt_save_one -s SOCKET -r ROOT -n NAME [--step N] [--job J]
 *                 [--world W --rank R] [--mib M] [--wait staged|durable|committed]
 *
 * The rank's share is one F32 tensor "w" of M MiB (default 1), a row block
 * of a [W * rows] global tensor, so a save of a world larger than the ranks
 * that ever run stays in flight at the daemon until its commit deadline:
 * what `ckptctl status` tests watch.  Waits for the staged future (default),
 * the durable one (this rank's bytes written and synced by the daemon) or
 * the committed one, prints "staged NAME", "durable NAME" or "committed
 * NAME" and exits 0; prints the library's reason and exits 1 on a failure,
 * 2 on bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

static int fail(const char *what, int r, const char *why)
{
	fprintf(stderr, "ckpt_save_one: %s: %s (%s)\n", what, why && *why ? why : "failed",
		strerror(-r));
	return 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: ckpt_save_one -s SOCKET -r ROOT -n NAME [--step N] [--job J] "
			"[--world W --rank R] [--mib M] [--wait staged|durable|committed]\n");
	exit(2);
}

static unsigned long long parse_ull(const char *s, unsigned long long max)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (*s == '\0' || *s == '-' || *end || errno || v > max)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "root", required_argument, NULL, 'r' },
		{ "name", required_argument, NULL, 'n' },
		{ "step", required_argument, NULL, 'k' },
		{ "job", required_argument, NULL, 'j' },
		{ "world", required_argument, NULL, 'W' },
		{ "rank", required_argument, NULL, 'R' },
		{ "mib", required_argument, NULL, 'm' },
		{ "wait", required_argument, NULL, 'w' },
		{ NULL, 0, NULL, 0 },
	};
	const char *sock = NULL, *root = NULL, *name = NULL, *job = "save-one";
	unsigned long long step = 1, world = 1, rank = 0, mib = 1;
	const char *until = "staged";
	int c, r, ret = 1;

	while ((c = getopt_long(argc, argv, "s:r:n:", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			sock = optarg;
			break;
		case 'r':
			root = optarg;
			break;
		case 'n':
			name = optarg;
			break;
		case 'k':
			step = parse_ull(optarg, UINT64_MAX);
			break;
		case 'j':
			job = optarg;
			break;
		case 'W':
			world = parse_ull(optarg, CKPT_MAX_WORLD);
			break;
		case 'R':
			rank = parse_ull(optarg, CKPT_MAX_WORLD);
			break;
		case 'm':
			mib = parse_ull(optarg, 4096);
			break;
		case 'w':
			if (strcmp(optarg, "staged") && strcmp(optarg, "durable") &&
			    strcmp(optarg, "committed"))
				usage();
			until = optarg;
			break;
		default:
			usage();
		}
	}
	if (optind != argc || !sock || !root || !name || world == 0 || rank >= world || mib == 0)
		usage();

	/* Rows of 1 KiB; the rank's block starts at rank * rows. */
	uint64_t rows = mib * 1024, gshape[2] = { world * rows, 256 }, shape[2] = { rows, 256 };
	uint64_t offs[2] = { rank * rows, 0 };
	size_t bytes = (size_t)mib << 20;
	unsigned char *data = malloc(bytes);
	if (!data) {
		fprintf(stderr, "ckpt_save_one: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < bytes; i++)
		data[i] = (unsigned char)(i * 131 + rank);

	struct ckpt_connect_opts co = { CKPT_CONNECT_OPTS_INIT, .socket_path = sock, .job = job,
					.rank = (uint32_t)rank, .world = (uint32_t)world,
					.arena_bytes = 64ull << 20 };
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 2,
				 .shape = shape, .global_shape = gshape, .offsets = offs,
				 .data = data };
	struct ckpt_future *staged, *done, *durable;
	struct ckpt_client *cl;
	struct ckpt_save *s;

	r = ckpt_connect(&co, &cl);
	if (r < 0) {
		ret = fail("connect", r, ckpt_last_error());
		goto out_free;
	}
	r = ckpt_save_begin(cl, root, name, step, &s);
	if (r < 0) {
		ret = fail("save_begin", r, ckpt_last_error());
		goto out_disconnect;
	}
	if ((r = ckpt_save_add_tensor(s, &t)) < 0 ||
	    (r = ckpt_save_commit(s, &staged, &done)) < 0) {
		ret = fail("save", r, ckpt_last_error());
		goto out_save;
	}
	r = ckpt_future_wait(staged, -1);
	if (r < 0) {
		ret = fail("staged", r, ckpt_future_error(staged));
		goto out_save;
	}
	if (!strcmp(until, "durable")) {
		durable = ckpt_save_durable(s);
		r = durable ? ckpt_future_wait(durable, -1) : -EINVAL;
		if (r < 0) {
			ret = fail("durable", r, durable ? ckpt_future_error(durable) :
							  ckpt_last_error());
			goto out_save;
		}
	}
	if (!strcmp(until, "committed")) {
		r = ckpt_future_wait(done, -1);
		if (r < 0) {
			ret = fail("committed", r, ckpt_future_error(done));
			goto out_save;
		}
	}
	printf("%s %s\n", until, name);
	ret = 0;

out_save:
	/* A staged save is the daemon's: it goes on with it (or waits for
	 * the other ranks) after this process is gone. */
	ckpt_save_free(s);
out_disconnect:
	ckpt_disconnect(cl);
out_free:
	free(data);
	return ret;
}
