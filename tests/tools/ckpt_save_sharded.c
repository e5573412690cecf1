/* SPDX-License-Identifier: MIT */
/*
 * ckpt_save_sharded.c - saves one checkpoint of two ranks through ckptd,
 * both ranks from this one process (two connections), for scripts that
 * need a real multi-file checkpoint with a sharded tensor.
 *
 *   ckpt_save_sharded SOCKET ROOT NAME
 *
 * What each rank r (of world 2, job "sharded") saves:
 *   "w"          F32 [768, 1024], rows [384 r, 384 r + 384): 1.5 MiB a rank,
 *                so its CRC pieces straddle the 1 MiB grid;
 *   "bias"       F32 [1024], replica r (only rank 0's copy is written);
 *   "loader.<r>" a blob of 10000 bytes.
 * Waits for both committed futures, prints "committed NAME" and exits 0;
 * prints the library's reason and exits 1 on a failure, 2 on bad usage.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

#define WORLD 2
#define ROWS  768
#define COLS  1024
#define BLOB  10000

static int fail(const char *what, int r, const char *why)
{
	fprintf(stderr, "ckpt_save_sharded: %s: %s (%s)\n", what, why && *why ? why : "failed",
		strerror(-r));
	return 1;
}

int main(int argc, char **argv)
{
	static float w[ROWS * COLS], bias[COLS];
	static unsigned char blob[WORLD][BLOB];
	uint64_t gshape[2] = { ROWS, COLS }, shape[2] = { ROWS / WORLD, COLS };
	uint64_t offs[WORLD][2], bshape[1] = { COLS };
	struct ckpt_client *cl[WORLD] = { NULL };
	struct ckpt_save *s[WORLD] = { NULL };
	struct ckpt_future *staged[WORLD], *done[WORLD];
	char key[32];
	int r, ret = 1;

	if (argc != 4) {
		fprintf(stderr, "usage: ckpt_save_sharded SOCKET ROOT NAME\n");
		return 2;
	}
	for (size_t i = 0; i < ROWS * COLS; i++)
		w[i] = (float)(i % 4099) * 0.5f;
	for (size_t i = 0; i < COLS; i++)
		bias[i] = (float)i;
	for (int k = 0; k < WORLD; k++)
		for (size_t i = 0; i < BLOB; i++)
			blob[k][i] = (unsigned char)(i * 7 + (size_t)k);

	for (int k = 0; k < WORLD; k++) {
		struct ckpt_connect_opts co = { CKPT_CONNECT_OPTS_INIT, .socket_path = argv[1],
						.job = "sharded", .rank = (uint32_t)k,
						.world = WORLD, .arena_bytes = 16ull << 20 };

		offs[k][0] = (uint64_t)k * (ROWS / WORLD);
		offs[k][1] = 0;
		r = ckpt_connect(&co, &cl[k]);
		if (r < 0) {
			ret = fail("connect", r, ckpt_last_error());
			goto out;
		}
		r = ckpt_save_begin(cl[k], argv[2], argv[3], 7, &s[k]);
		if (r < 0) {
			ret = fail("save_begin", r, ckpt_last_error());
			goto out;
		}
		struct ckpt_tensor tw = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 2,
					  .shape = shape, .global_shape = gshape,
					  .offsets = offs[k], .data = w + offs[k][0] * COLS };
		struct ckpt_tensor tb = { CKPT_TENSOR_INIT, .name = "bias", .dtype = CKPT_F32,
					  .ndim = 1, .shape = bshape, .data = bias,
					  .replica = (uint32_t)k };

		snprintf(key, sizeof(key), "loader.%d", k);
		if ((r = ckpt_save_add_tensor(s[k], &tw)) < 0 ||
		    (r = ckpt_save_add_tensor(s[k], &tb)) < 0 ||
		    (r = ckpt_save_add_blob(s[k], key, blob[k], BLOB)) < 0 ||
		    (r = ckpt_save_commit(s[k], &staged[k], &done[k])) < 0) {
			ret = fail("save", r, ckpt_last_error());
			goto out;
		}
	}
	/* Rank 0's commit waits for rank 1's index: both were committed
	 * above, so waiting in turn cannot deadlock. */
	for (int k = 0; k < WORLD; k++) {
		r = ckpt_future_wait(staged[k], 60000);
		if (r < 0) {
			ret = fail("staged", r, ckpt_future_error(staged[k]));
			goto out;
		}
	}
	for (int k = 0; k < WORLD; k++) {
		r = ckpt_future_wait(done[k], 60000);
		if (r < 0) {
			ret = fail("committed", r, ckpt_future_error(done[k]));
			goto out;
		}
	}
	printf("committed %s\n", argv[3]);
	ret = 0;
out:
	for (int k = 0; k < WORLD; k++) {
		ckpt_save_free(s[k]);
		ckpt_disconnect(cl[k]);
	}
	return ret;
}
