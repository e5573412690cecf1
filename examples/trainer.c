/* SPDX-License-Identifier: MIT */
/*
 * trainer.c - a sample trainer that checkpoints through ckptd (`make demo`).
 *
 *   trainer [--socket PATH] [--root DIR] [--job J] [--steps N] [--mib M]
 *           [--compute-ms T]
 *
 * Its "model" is M MiB (default 256) of fp32 in 32 tensors plus a small
 * data-loader state blob.  Each of N steps (default 5):
 *
 *   1. waits for the previous save's staged future (as a real trainer does
 *      right before optimizer.step(), the first write to the weights);
 *   2. mutates every tensor (a cheap fill standing in for the update);
 *   3. saves "step-NNNNNN" asynchronously: the call returns at once;
 *   4. "computes" for T ms (default 100; forward/backward), polling the
 *      futures only to time them.
 *
 * It prints, per step, how long the save call blocked, when the save was
 * staged and committed, and the staging rate.  At the end it waits for every
 * commit, reads the last checkpoint back with ckpt_reader and compares every
 * tensor and the blob byte for byte with memory, and prints "verified".
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"

#define N_TENSORS 32

struct step_rec {
	struct ckpt_save *save;
	struct ckpt_future *staged, *committed;
	double t_commit, call_ms, staged_ms, committed_ms;
};

static uint64_t model_bytes;

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms)
{
	struct timespec ts = { .tv_sec = (time_t)(ms / 1000),
			       .tv_nsec = (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6) };

	nanosleep(&ts, NULL);
}

static void die(const char *what, int err, const char *why)
{
	fprintf(stderr, "trainer: %s: %s (%s)\n", what, why && *why ? why : "failed",
		strerror(-err));
	exit(1);
}

/* Records the completion times of the futures of `rec` that finished;
 * exits on a failed one. */
static void observe(struct step_rec *rec)
{
	int r;

	if (rec->staged_ms < 0) {
		r = ckpt_future_poll(rec->staged);
		if (r != -EINPROGRESS) {
			if (r < 0)
				die("staging failed", r, ckpt_future_error(rec->staged));
			rec->staged_ms = now_ms() - rec->t_commit;
		}
	}
	if (rec->committed_ms < 0) {
		r = ckpt_future_poll(rec->committed);
		if (r != -EINPROGRESS) {
			if (r < 0)
				die("commit failed", r, ckpt_future_error(rec->committed));
			rec->committed_ms = now_ms() - rec->t_commit;
		}
	}
}

/* Polls steps 1..last and prints, in step order, each step whose two
 * futures are done.  Returns true once all of them are printed. */
static bool report(struct step_rec *recs, uint64_t last)
{
	static uint64_t next = 1;
	double gib = (double)model_bytes / (double)(1u << 30);

	for (uint64_t k = next; k <= last; k++)
		observe(&recs[k]);
	while (next <= last && recs[next].staged_ms >= 0 && recs[next].committed_ms >= 0) {
		struct step_rec *rec = &recs[next];
		double st = rec->staged_ms > 1e-3 ? rec->staged_ms : 1e-3;
		double cm = rec->committed_ms > 1e-3 ? rec->committed_ms : 1e-3;
		printf("step %3" PRIu64 ": call %7.3f ms  staged %8.1f ms  committed %8.1f ms  "
		       "%6.2f GiB/s staged  %6.2f GiB/s committed\n",
		       next, rec->call_ms, rec->staged_ms, rec->committed_ms, gib / (st / 1e3),
		       gib / (cm / 1e3));
		fflush(stdout);
		next++;
	}
	return next > last;
}

static void usage(void)
{
	fprintf(stderr, "usage: trainer [--socket PATH] [--root DIR] [--job J] [--steps N] "
			"[--mib M] [--compute-ms T]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "root", required_argument, NULL, 'r' },
		{ "job", required_argument, NULL, 'j' },
		{ "steps", required_argument, NULL, 'n' },
		{ "mib", required_argument, NULL, 'm' },
		{ "compute-ms", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *socket_path = NULL, *root = NULL, *job = "demo";
	unsigned long steps = 5, mib = 256;
	double compute_ms = 100;
	int opt, r;

	while ((opt = getopt_long(argc, argv, "s:r:j:n:m:c:h", longopts, NULL)) != -1) {
		char *end;
		switch (opt) {
		case 's':
			socket_path = optarg;
			break;
		case 'r':
			root = optarg;
			break;
		case 'j':
			job = optarg;
			break;
		case 'n':
			steps = strtoul(optarg, &end, 10);
			if (*end || steps == 0 || steps > 999999)
				usage();
			break;
		case 'm':
			mib = strtoul(optarg, &end, 10);
			if (*end || mib == 0 || mib > (1ul << 20))
				usage();
			break;
		case 'c':
			compute_ms = strtod(optarg, &end);
			if (*end || compute_ms < 0)
				usage();
			break;
		default:
			usage();
		}
	}
	if (optind != argc)
		usage();
	if (!root) {
		fprintf(stderr, "trainer: --root DIR is required (a root ckptd allows)\n");
		return 2;
	}

	/* The model: 32 fp32 tensors of M/32 MiB (at least one element). */
	uint64_t per = ((uint64_t)mib << 20) / N_TENSORS / sizeof(float);
	float *tensors[N_TENSORS];
	char names[N_TENSORS][64];
	uint64_t shapes[N_TENSORS][2];
	if (per == 0)
		per = 1;
	for (int i = 0; i < N_TENSORS; i++) {
		/* 2-D where it divides evenly, like real weight matrices. */
		shapes[i][0] = per % 1024 == 0 ? per / 1024 : 1;
		shapes[i][1] = per % 1024 == 0 ? 1024 : per;
		tensors[i] = malloc(per * sizeof(float));
		if (!tensors[i]) {
			fprintf(stderr, "trainer: out of memory for the model\n");
			return 1;
		}
		snprintf(names[i], sizeof(names[i]), "model.layers.%d.weight", i);
	}
	model_bytes = per * sizeof(float) * N_TENSORS;
	char loader[4096];

	struct ckpt_connect_opts co = {
		CKPT_CONNECT_OPTS_INIT, .socket_path = socket_path, .job = job, .rank = 0, .world = 1,
		.arena_bytes = 0,
	};
	struct ckpt_client *client;
	double t0 = now_ms();
	r = ckpt_connect(&co, &client);
	if (r < 0)
		die("connect", r, ckpt_last_error());
	printf("connected in %.0f ms: arena %.0f MiB; model %.1f MiB in %d tensors + blob, "
	       "%lu steps\n", now_ms() - t0, (double)ckpt_client_arena_bytes(client) / (1 << 20),
	       (double)model_bytes / (1 << 20), N_TENSORS, steps);

	struct step_rec *recs = calloc(steps + 1, sizeof(*recs));
	if (!recs) {
		fprintf(stderr, "trainer: out of memory\n");
		return 1;
	}
	for (uint64_t step = 1; step <= steps; step++) {
		struct step_rec *rec = &recs[step];

		/* optimizer.step(): first wait until the last save no longer
		 * reads the weights. */
		if (step > 1) {
			r = ckpt_future_wait(recs[step - 1].staged, -1);
			if (r < 0)
				die("staging failed", r, ckpt_future_error(recs[step - 1].staged));
			observe(&recs[step - 1]);
		}
		for (int i = 0; i < N_TENSORS; i++) {
			unsigned char v = (unsigned char)(step * 37 + (uint64_t)i * 11);
			memset(tensors[i], v, per * sizeof(float));
		}
		int n = snprintf(loader, sizeof(loader),
				 "{\"epoch\":%" PRIu64 ",\"sample\":%" PRIu64 ",\"seed\":1234}",
				 step / 3, step * 4096);
		memset(loader + n, '#', sizeof(loader) - (size_t)n);

		char name[32];
		snprintf(name, sizeof(name), "step-%06" PRIu64, step);
		rec->staged_ms = rec->committed_ms = -1;
		rec->t_commit = now_ms();
		r = ckpt_save_begin(client, root, name, step, &rec->save);
		if (r < 0)
			die("save_begin", r, ckpt_last_error());
		for (int i = 0; i < N_TENSORS; i++) {
			struct ckpt_tensor t = {
				CKPT_TENSOR_INIT, .name = names[i], .dtype = CKPT_F32, .ndim = 2,
				.shape = shapes[i], .data = tensors[i],
			};
			r = ckpt_save_add_tensor(rec->save, &t);
			if (r < 0)
				die("add_tensor", r, ckpt_last_error());
		}
		r = ckpt_save_add_blob(rec->save, "dataloader", loader, sizeof(loader));
		if (r < 0)
			die("add_blob", r, ckpt_last_error());
		if ((r = ckpt_save_set_metadata(rec->save, "trainer", "examples/trainer.c")) < 0 ||
		    (r = ckpt_save_set_metric(rec->save, "loss", 2.0 / (double)step)) < 0)
			die("metadata", r, ckpt_last_error());
		r = ckpt_save_commit(rec->save, &rec->staged, &rec->committed);
		if (r < 0)
			die("commit", r, ckpt_last_error());
		rec->call_ms = now_ms() - rec->t_commit;

		/* forward/backward of the next step */
		double until = now_ms() + compute_ms;
		while (now_ms() < until) {
			report(recs, step);
			sleep_ms(1);
		}
	}

	/* Every commit, timed to the millisecond. */
	while (!report(recs, steps))
		sleep_ms(1);
	for (uint64_t k = 1; k <= steps; k++)
		ckpt_save_free(recs[k].save);
	ckpt_disconnect(client);

	/* Read the last checkpoint back and compare with memory. */
	char dir[4096];
	struct ckpt_reader *rd;
	snprintf(dir, sizeof(dir), "%s/step-%06lu", root, steps);
	r = ckpt_reader_open(dir, &rd);
	if (r < 0)
		die("reader_open", r, ckpt_last_error());
	if (ckpt_reader_step(rd) != steps || ckpt_reader_tensor_count(rd) != N_TENSORS) {
		fprintf(stderr, "trainer: %s: step %" PRIu64 " with %zu tensors, expected %lu "
			"with %d\n", dir, ckpt_reader_step(rd), ckpt_reader_tensor_count(rd), steps,
			N_TENSORS);
		return 1;
	}
	float *back = malloc(per * sizeof(float));
	char loader_back[sizeof(loader)];
	if (!back) {
		fprintf(stderr, "trainer: out of memory\n");
		return 1;
	}
	for (int i = 0; i < N_TENSORS; i++) {
		enum ckpt_dtype dt;
		unsigned ndim;
		uint64_t shape[CKPT_MAX_NDIM];
		r = ckpt_reader_tensor_info(rd, names[i], CKPT_MAX_NDIM, &dt, &ndim, shape);
		if (r < 0)
			die("tensor_info", r, ckpt_last_error());
		if (dt != CKPT_F32 || ndim != 2 || shape[0] != shapes[i][0] ||
		    shape[1] != shapes[i][1]) {
			fprintf(stderr, "trainer: tensor '%s' has the wrong dtype or shape\n",
				names[i]);
			return 1;
		}
		r = ckpt_reader_read_tensor(rd, names[i], back, per * sizeof(float));
		if (r < 0)
			die("read_tensor", r, ckpt_last_error());
		if (memcmp(back, tensors[i], per * sizeof(float)) != 0) {
			fprintf(stderr, "trainer: tensor '%s' differs from memory\n", names[i]);
			return 1;
		}
	}
	if (ckpt_reader_blob_size(rd, "dataloader") != (int64_t)sizeof(loader)) {
		fprintf(stderr, "trainer: blob 'dataloader' is missing or has the wrong size\n");
		return 1;
	}
	r = ckpt_reader_read_blob(rd, "dataloader", loader_back, sizeof(loader_back));
	if (r < 0)
		die("read_blob", r, ckpt_last_error());
	if (memcmp(loader_back, loader, sizeof(loader)) != 0) {
		fprintf(stderr, "trainer: blob 'dataloader' differs from memory\n");
		return 1;
	}
	ckpt_reader_close(rd);
	printf("verified %s: %d tensors and 1 blob, %.1f MiB, byte for byte\n", dir, N_TENSORS,
	       (double)model_bytes / (1 << 20));

	free(back);
	for (int i = 0; i < N_TENSORS; i++)
		free(tensors[i]);
	free(recs);
	return 0;
}
