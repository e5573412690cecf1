/* SPDX-License-Identifier: MIT */
/*
 * trainer.c - a sample trainer that checkpoints through ckptd (`make demo`).
 *
 *   trainer [--socket PATH] [--root DIR] [--job J] [--steps N] [--mib M]
 *           [--save-every K] [--compute-ms T]
 *
 * Its "model" is M MiB (default 256) of fp32 in 32 tensors plus a small
 * data-loader state blob.  Each of N steps (default 40):
 *
 *   1. "computes" for T ms (default 250; forward and backward -- a sleep,
 *      as the CPU is mostly idle while a GPU computes);
 *   2. waits for the last save's staged future before the optimizer step,
 *      the first write to the weights since that save began;
 *   3. updates the weights (a few bytes of every tensor);
 *   4. every K steps (default 10) and after the last step, saves
 *      "step-NNNNNN": the call returns at once and the copy and the write
 *      go on in the background.
 *
 * What it shows is the point of ckptd: the training step does not wait for
 * the checkpoint.  Per step it prints the step's wall time; per save, how
 * long the save call blocked, when the save was staged and when it was
 * committed; at the end the mean step time with and without a save in
 * flight.  Then it reads the last checkpoint back with ckpt_reader and
 * compares every tensor and the blob with memory, byte for byte.
 *
 * Saves are meant not to overlap: K * T should exceed the time one save
 * takes to commit (the disk's time for M MiB).  When they do overlap it
 * says so, as the numbers then measure a queue, not one save.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"

#define N_TENSORS 32

struct save_rec {
	uint64_t step;
	struct ckpt_save *save;
	struct ckpt_future *staged, *committed;
	double t_begin;                          /* ms, when the save call began */
	double call_ms, staged_ms, committed_ms; /* < 0: not yet */
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
	nanosleep(&ts, NULL);
}

static void die(const char *what, int err, const char *why)
{
	fprintf(stderr, "trainer: %s: %s (%s)\n", what, why && *why ? why : "failed",
		strerror(-err));
	exit(1);
}

/* Appends to the notes printed at the end of the current step's line. */
static void note(char *notes, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *notes, size_t len, const char *fmt, ...)
{
	size_t used = strlen(notes);
	va_list ap;

	if (used + 4 >= len)
		return;
	if (used)
		used += (size_t)snprintf(notes + used, len - used, "; ");
	va_start(ap, fmt);
	vsnprintf(notes + used, len - used, fmt, ap);
	va_end(ap);
}

/* Notes the completions of `rec`'s futures that happened since the last
 * look (timed to about a millisecond by the caller's polling); exits on a
 * failed save. */
static void observe(struct save_rec *rec, char *notes, size_t len)
{
	int r;

	if (rec->staged_ms < 0) {
		r = ckpt_future_poll(rec->staged);
		if (r != -EINPROGRESS) {
			if (r < 0)
				die("staging failed", r, ckpt_future_error(rec->staged));
			rec->staged_ms = now_ms() - rec->t_begin;
			note(notes, len, "step-%06" PRIu64 " staged after %.1f ms", rec->step,
			     rec->staged_ms);
		}
	}
	if (rec->committed_ms < 0) {
		r = ckpt_future_poll(rec->committed);
		if (r != -EINPROGRESS) {
			if (r < 0)
				die("commit failed", r, ckpt_future_error(rec->committed));
			rec->committed_ms = now_ms() - rec->t_begin;
			note(notes, len, "step-%06" PRIu64 " committed after %.1f ms", rec->step,
			     rec->committed_ms);
		}
	}
}

static void observe_all(struct save_rec *recs, size_t n, char *notes, size_t len)
{
	for (size_t i = 0; i < n; i++)
		observe(&recs[i], notes, len);
}

static bool any_in_flight(const struct save_rec *recs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (recs[i].committed_ms < 0)
			return true;
	return false;
}

static void usage(void)
{
	fprintf(stderr, "usage: trainer [--socket PATH] [--root DIR] [--job J] [--steps N] "
			"[--mib M] [--save-every K] [--compute-ms T]\n");
	exit(2);
}

static unsigned long parse_ul(const char *s, unsigned long max)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (*s == '\0' || *end || v == 0 || v > max)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "root", required_argument, NULL, 'r' },
		{ "job", required_argument, NULL, 'j' },
		{ "steps", required_argument, NULL, 'n' },
		{ "mib", required_argument, NULL, 'm' },
		{ "save-every", required_argument, NULL, 'k' },
		{ "compute-ms", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *socket_path = NULL, *root = NULL, *job = "demo";
	unsigned long steps = 40, mib = 256, every = 10, compute_ms = 250;
	int opt, r;

	while ((opt = getopt_long(argc, argv, "s:r:j:n:m:k:c:h", longopts, NULL)) != -1) {
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
			steps = parse_ul(optarg, 999999);
			break;
		case 'm':
			mib = parse_ul(optarg, 1ul << 20);
			break;
		case 'k':
			every = parse_ul(optarg, 999999);
			break;
		case 'c':
			compute_ms = parse_ul(optarg, 3600000);
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
	if (every > steps)
		every = steps;

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
		/* Touch every page now, as a trained model's memory is. */
		memset(tensors[i], i, per * sizeof(float));
		snprintf(names[i], sizeof(names[i]), "model.layers.%d.weight", i);
	}
	uint64_t model_bytes = per * sizeof(float) * N_TENSORS;
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
	printf("connected in %.0f ms; staging arena %.0f MiB\n", now_ms() - t0,
	       (double)ckpt_client_arena_bytes(client) / (1 << 20));
	printf("model: %.0f MiB in %d tensors and a data-loader blob; %lu steps of %lu ms "
	       "compute, a checkpoint every %lu steps and at the end\n\n",
	       (double)model_bytes / (1 << 20), N_TENSORS, steps, compute_ms, every);
	printf("What the numbers mean:\n"
	       "  step       wall time of one training step, save calls included (it stays at "
	       "the compute time)\n"
	       "  blocked    how long the save call held up the training loop\n"
	       "  staged     time until ckptd held a copy of the whole model (the weights may "
	       "change again)\n"
	       "  committed  time until the checkpoint was durable on disk, written while "
	       "training went on\n\n");

	/* every K steps and after the last one */
	size_t n_saves = steps / every + 1, n_rec = 0;
	size_t update = per * sizeof(float) < 4096 ? per * sizeof(float) : 4096;
	struct save_rec *recs = calloc(n_saves, sizeof(*recs));
	double sum_with = 0, sum_without = 0, max_wait = 0;
	unsigned long n_with = 0, n_without = 0, overlaps = 0;
	if (!recs) {
		fprintf(stderr, "trainer: out of memory\n");
		return 1;
	}

	for (uint64_t step = 1; step <= steps; step++) {
		char notes[512] = "";
		double start = now_ms(), until = start + (double)compute_ms;
		bool with_save = any_in_flight(recs, n_rec) || step % every == 0 || step == steps;

		/* forward/backward; poll the futures only to time them */
		while (now_ms() < until) {
			observe_all(recs, n_rec, notes, sizeof(notes));
			sleep_ms(until - now_ms() < 1 ? until - now_ms() : 1);
		}

		/* optimizer.step(): first wait until the last save no longer
		 * reads the weights (normally long done by now). */
		if (n_rec > 0 && recs[n_rec - 1].staged_ms < 0) {
			double w0 = now_ms();
			r = ckpt_future_wait(recs[n_rec - 1].staged, -1);
			if (r < 0)
				die("staging failed", r, ckpt_future_error(recs[n_rec - 1].staged));
			if (now_ms() - w0 > max_wait)
				max_wait = now_ms() - w0;
			observe(&recs[n_rec - 1], notes, sizeof(notes));
			note(notes, sizeof(notes), "waited %.1f ms for staging", now_ms() - w0);
		}
		for (int i = 0; i < N_TENSORS; i++)
			memset(tensors[i], (int)(step * 37 + (uint64_t)i * 11), update);

		if (step % every == 0 || step == steps) {
			struct save_rec *rec = &recs[n_rec];
			char name[32];

			if (any_in_flight(recs, n_rec))
				overlaps++;
			int n = snprintf(loader, sizeof(loader),
					 "{\"epoch\":%" PRIu64 ",\"sample\":%" PRIu64 ",\"seed\":1234}",
					 step / 3, step * 4096);
			memset(loader + n, '#', sizeof(loader) - (size_t)n);
			snprintf(name, sizeof(name), "step-%06" PRIu64, step);
			rec->step = step;
			rec->staged_ms = rec->committed_ms = -1;
			rec->t_begin = now_ms();
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
			if ((r = ckpt_save_set_metadata(rec->save, "trainer", "examples/trainer.c")) <
				    0 ||
			    (r = ckpt_save_set_metric(rec->save, "loss", 2.0 / (double)step)) < 0)
				die("metadata", r, ckpt_last_error());
			r = ckpt_save_commit(rec->save, &rec->staged, &rec->committed);
			if (r < 0)
				die("commit", r, ckpt_last_error());
			rec->call_ms = now_ms() - rec->t_begin;
			n_rec++;
			note(notes, sizeof(notes), "save %s began: blocked %.2f ms", name,
			     rec->call_ms);
		}

		double step_ms = now_ms() - start;
		if (with_save) {
			sum_with += step_ms;
			n_with++;
		} else {
			sum_without += step_ms;
			n_without++;
		}
		printf("step %3" PRIu64 "  %7.1f ms%s%s\n", step, step_ms, notes[0] ? "   " : "",
		       notes);
		fflush(stdout);
	}

	/* The last commits, timed to the millisecond. */
	while (any_in_flight(recs, n_rec)) {
		char notes[512] = "";
		observe_all(recs, n_rec, notes, sizeof(notes));
		if (notes[0])
			printf("          (after the last step) %s\n", notes);
		sleep_ms(1);
	}

	printf("\nsummary: %lu steps; mean step %.1f ms with no save in flight (%lu steps), "
	       "%.1f ms with one (%lu steps)\n",
	       steps, n_without ? sum_without / (double)n_without : 0.0, n_without,
	       n_with ? sum_with / (double)n_with : 0.0, n_with);
	for (size_t i = 0; i < n_rec; i++)
		printf("  save step-%06" PRIu64 ": blocked %.2f ms, staged %.1f ms, committed %.1f ms "
		       "(%.2f GiB/s to disk)\n",
		       recs[i].step, recs[i].call_ms, recs[i].staged_ms, recs[i].committed_ms,
		       (double)model_bytes / (double)(1u << 30) / (recs[i].committed_ms / 1e3));
	if (max_wait > 0)
		printf("  the optimizer waited for staging at most %.1f ms\n", max_wait);
	if (overlaps)
		printf("  note: %lu save(s) began before the previous one committed: the disk is "
		       "slower than one save per %lu ms; use a larger --save-every\n",
		       overlaps, every * compute_ms);
	for (size_t i = 0; i < n_rec; i++)
		ckpt_save_free(recs[i].save);
	ckpt_disconnect(client);

	/* Read the last checkpoint back and compare with memory. */
	char dir[4096];
	struct ckpt_reader *rd;
	uint64_t last = recs[n_rec - 1].step;
	snprintf(dir, sizeof(dir), "%s/step-%06" PRIu64, root, last);
	r = ckpt_reader_open(dir, &rd);
	if (r < 0)
		die("reader_open", r, ckpt_last_error());
	if (ckpt_reader_step(rd) != last || ckpt_reader_tensor_count(rd) != N_TENSORS) {
		fprintf(stderr, "trainer: %s: step %" PRIu64 " with %zu tensors, expected %" PRIu64
			" with %d\n", dir, ckpt_reader_step(rd), ckpt_reader_tensor_count(rd), last,
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
	printf("verified %s: %d tensors and 1 blob, %.0f MiB, byte for byte\n", dir, N_TENSORS,
	       (double)model_bytes / (1 << 20));

	free(back);
	for (int i = 0; i < N_TENSORS; i++)
		free(tensors[i]);
	free(recs);
	return 0;
}
