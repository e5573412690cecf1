/* SPDX-License-Identifier: MIT */
/*
 * check_resident.c - integration: restoring from checkpoints ckptd keeps in
 * memory (CKPT_CONNECT_RESIDENT, ckpt_load_set_client).
 *
 * The point of the feature is a restart after the trainer died: so the
 * saving rank is a real process killed with SIGKILL, and every load that
 * claims to come from memory runs after the shard file was deleted from
 * the checkpoint (manifest.json stays), so only the daemon can have served
 * those bytes (test_partial_stale aside: there storage and the image
 * differ in one chosen byte, which tells them apart).  Every byte loaded
 * is compared with the deterministic pattern it was saved from: whole
 * tensors, and boxes of them (rows that start and end inside CRC pieces,
 * column bands, element ranges).  The safety side: another job of the
 * same user gets nothing, only the newest committed save of a rank is
 * served, a failed save does not displace it, an image of another attempt
 * at the same path is never used, an image that differs from storage in
 * one byte of a CRC piece a box touches (even outside the box) is not used
 * for that file, and a client without the flag leaves nothing in memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "client/internal.h"
#include "store/store.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 60000
#define ARENA (16 * MiB)
#define DAEMON_CONF "arena_max = 32M\n"

/* ---- the state a rank saves ---------------------------------------------- */

/*
 * About 39 MiB of tensors in mixed dtypes, most of them not a whole number
 * of MiB (so CRC blocks and extents end inside tensors), a scalar, and per
 * saving rank a blob.  Saved by `world` ranks, each tensor is cut by rows
 * (the first dimension); a loader asks for whole tensors, except in
 * test_partial, which asks for boxes of them.
 */
struct item {
	const char *name;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[2];
};

static const struct item items[] = {
	{ "embed", CKPT_F32, 2, { 2048, 1024 } },           /* 8 MiB */
	{ "layers.0.w", CKPT_BF16, 2, { 3001, 2048 } },     /* 11.7 MiB */
	{ "layers.0.b", CKPT_F16, 1, { 777 } },
	{ "layers.1.w", CKPT_I64, 2, { 1000, 1031 } },      /* 7.9 MiB */
	{ "layers.1.idx", CKPT_U8, 1, { 5000001 } },        /* 4.8 MiB */
	{ "norm", CKPT_F64, 1, { 12345 } },
	{ "head", CKPT_BF16, 2, { 512, 3000 } },            /* 2.9 MiB */
	{ "fp8", CKPT_F8_E4M3, 2, { 3, 1111111 } },         /* 3.2 MiB */
	{ "step", CKPT_I64, 0, { 0 } },                     /* a scalar */
};

#define N_ITEMS (sizeof(items) / sizeof(items[0]))
#define BLOB_LEN (MiB + 123)

/* Pattern seeds: `gen` tells the saves of one test apart, so that bytes
 * of the wrong save never compare equal. */
static uint64_t item_seed(unsigned gen, size_t i)
{
	return 1000 + 100ull * gen + i;
}

static uint64_t blob_seed(unsigned gen, uint32_t rank)
{
	return 90000 + 100ull * gen + rank;
}

/* Rows [rank * n / world, (rank + 1) * n / world) of item it. */
static void row_part(const struct item *it, uint32_t rank, uint32_t world, uint64_t *offs,
		     uint64_t *shape)
{
	for (unsigned d = 0; d < it->ndim; d++) {
		offs[d] = 0;
		shape[d] = it->shape[d];
	}
	if (it->ndim == 0 || world == 1)
		return;
	offs[0] = it->shape[0] * rank / world;
	shape[0] = it->shape[0] * (rank + 1) / world - offs[0];
}

/* Connects as rank/world of job with run id `run` and CKPT_CONNECT_* flags.
 * Does not assert: helper processes use it too. */
static int connect_rc(const char *sock, const char *job, const char *run, uint32_t rank,
		      uint32_t world, uint32_t flags, struct ckpt_client **ret)
{
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };

	o.socket_path = sock;
	o.job = job;
	o.run = run;
	o.rank = rank;
	o.world = world;
	o.arena_bytes = ARENA;
	o.flags = flags;
	return ckpt_connect(&o, ret);
}

static struct ckpt_client *connect_ok(struct testd *t, const char *job, const char *run,
				      uint32_t rank, uint32_t world, uint32_t flags)
{
	struct ckpt_client *c = NULL;
	int rc = connect_rc(td_sock(t, 0), job, run, rank, world, flags, &c);

	ck_assert_msg(rc == 0, "connect job %s rank %u/%u flags %#x: %d %s", job, rank, world,
		      flags, rc, ckpt_last_error());
	return c;
}

/*
 * Saves rank `rank` of `world`'s part of generation `gen` as checkpoint
 * root/name at `step`, and waits until it is committed.  Returns 0, or the
 * first failure (begin, add, commit, staged, committed) with its reason in
 * msg.  Does not assert: helper processes use it too.
 */
static int save_state(struct ckpt_client *c, const char *root, const char *name, uint64_t step,
		      unsigned gen, uint32_t rank, uint32_t world, char *msg, size_t len)
{
	void *bufs[N_ITEMS + 1] = { 0 };
	uint64_t offs[N_ITEMS][2], shape[N_ITEMS][2];
	struct ckpt_save *sv = NULL;
	char key[32];
	int rc, st = 0, cm = 0;

	msg[0] = '\0';
	rc = ckpt_save_begin(c, root, name, step, &sv);
	if (rc < 0) {
		snprintf(msg, len, "begin: %s", ckpt_last_error());
		return rc;
	}
	for (size_t i = 0; i < N_ITEMS; i++) {
		const struct item *it = &items[i];
		size_t es = td_dtype_size(it->dt);
		bool sharded = world > 1 && it->ndim > 0;

		row_part(it, rank, world, offs[i], shape[i]);
		bufs[i] = malloc(td_nbytes(es, it->ndim, shape[i]) + 1);
		if (!bufs[i]) {
			rc = -ENOMEM;
			snprintf(msg, len, "out of memory");
			goto out;
		}
		td_fill_chunk(bufs[i], es, it->ndim, it->shape, offs[i], shape[i],
			      item_seed(gen, i));
		/* A scalar cannot be cut: rank 0 writes it, the others hold
		 * replicas. */
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = it->name, .dtype = it->dt,
					  .ndim = it->ndim, .shape = shape[i], .data = bufs[i],
					  .global_shape = sharded ? it->shape : NULL,
					  .offsets = sharded ? offs[i] : NULL,
					  .replica = it->ndim ? 0 : rank };
		rc = ckpt_save_add_tensor(sv, &tn);
		if (rc < 0) {
			snprintf(msg, len, "add %s: %s", it->name, ckpt_last_error());
			goto out;
		}
	}
	bufs[N_ITEMS] = malloc(BLOB_LEN + rank);
	if (!bufs[N_ITEMS]) {
		rc = -ENOMEM;
		snprintf(msg, len, "out of memory");
		goto out;
	}
	td_fill(bufs[N_ITEMS], BLOB_LEN + rank, blob_seed(gen, rank), 0);
	snprintf(key, sizeof(key), "rng/rank-%u", rank);
	rc = ckpt_save_add_blob(sv, key, bufs[N_ITEMS], BLOB_LEN + rank);
	if (rc < 0) {
		snprintf(msg, len, "add blob: %s", ckpt_last_error());
		goto out;
	}
	rc = td_commit_wait(sv, WAIT_MS, &st, &cm, msg, len);
	if (rc == 0)
		rc = st ? st : cm;
out:
	ckpt_save_free(sv);
	for (size_t i = 0; i <= N_ITEMS; i++)
		free(bufs[i]);
	return rc;
}

static void save_ok(struct ckpt_client *c, const char *root, const char *name, uint64_t step,
		    unsigned gen, uint32_t rank, uint32_t world)
{
	char msg[1024];
	int rc = save_state(c, root, name, step, gen, rank, world, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "save %s (rank %u/%u): %d %s", name, rank, world, rc, msg);
}

/* ---- a saving rank in its own process -------------------------------------- */

struct rank_args {
	const char *sock, *root, *job, *name;
	uint64_t step;
	unsigned gen;
	uint32_t rank, world;
	bool block;   /* after reporting, wait (bounded) to be killed */
};

/* Connects with CKPT_CONNECT_RESIDENT, saves, reports "committed RC MSG". */
static int rank_main(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	struct ckpt_client *c = NULL;
	char msg[1024];
	int rc;

	rc = connect_rc(a->sock, a->job, "r1", a->rank, a->world, CKPT_CONNECT_RESIDENT, &c);
	if (rc < 0) {
		td_report(rep, "committed %d connect: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = save_state(c, a->root, a->name, a->step, a->gen, a->rank, a->world, msg,
			sizeof(msg));
	td_report(rep, "committed %d %s", rc, msg);
	if (a->block) {
		/* A trainer that goes on training: the parent kills it. */
		td_wait_go(go, 120000);
		return 12;
	}
	ckpt_disconnect(c);
	return rc == 0 ? 0 : 1;
}

static void start_rank(struct td_child *ch, struct rank_args *a)
{
	ck_assert_int_eq(td_child_start(ch, rank_main, a), 0);
}

/* Waits for a rank's "committed" report and asserts it is 0. */
static void expect_committed(struct td_child *ch, uint32_t rank)
{
	char line[1200];
	int rc = td_child_expect(ch, "committed", WAIT_MS, line, sizeof(line));

	ck_assert_msg(rc == 0, "rank %u never reported its commit (%d); it said:\n%s", rank, rc,
		      ch->out);
	ck_assert_msg(strtol(line, NULL, 10) == 0, "rank %u: save failed: %s", rank, line);
}

/* ---- loading it back ---------------------------------------------------- */

/*
 * Loads every tensor (whole) and the blob of each of `world` saving ranks
 * of checkpoint `path`, through client c if not NULL
 * (ckpt_load_set_client).  Returns 0 -- after asserting every byte equals
 * generation `gen` -- or the error of ckpt_load_start() or of the done
 * future, with its message in msg; the stats go to *ret_st either way.
 */
static int load_state(const char *path, struct ckpt_client *c, unsigned gen, uint32_t world,
		      struct ckpt_load_stats *ret_st, char *msg, size_t len)
{
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done = NULL;
	struct ckpt_load_dst dst[N_ITEMS];
	void *bufs[N_ITEMS];
	void *blobs[8];
	char key[32];
	int rc;

	ck_assert_uint_le(world, 8);
	rc = ckpt_reader_open(path, &rd);
	ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, ckpt_last_error());
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	for (size_t i = 0; i < N_ITEMS; i++) {
		const struct item *it = &items[i];
		size_t n = td_nbytes(td_dtype_size(it->dt), it->ndim, it->shape);

		bufs[i] = malloc(n);
		ck_assert_ptr_nonnull(bufs[i]);
		memset(bufs[i], 0xA5, n);
		dst[i] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .data = bufs[i] };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = it->dt,
					       .name = it->name, .global_shape = it->shape,
					       .ndim = it->ndim, .n_dsts = 1, .dsts = &dst[i] };
		rc = ckpt_load_add_tensor(ld, &lt);
		ck_assert_msg(rc == 0, "add %s: %d %s", it->name, rc, ckpt_last_error());
	}
	for (uint32_t r = 0; r < world; r++) {
		blobs[r] = malloc(BLOB_LEN + r);
		ck_assert_ptr_nonnull(blobs[r]);
		snprintf(key, sizeof(key), "rng/rank-%u", r);
		rc = ckpt_load_add_blob(ld, key, blobs[r], BLOB_LEN + r);
		ck_assert_msg(rc == 0, "add blob %s: %d %s", key, rc, ckpt_last_error());
	}
	if (c)
		ck_assert_int_eq(ckpt_load_set_client(ld, c), 0);
	rc = ckpt_load_start(ld, &done);
	if (rc < 0) {
		snprintf(msg, len, "%s", ckpt_last_error());
	} else {
		rc = td_future_wait(done, WAIT_MS);
		snprintf(msg, len, "%s", ckpt_future_error(done));
	}
	*ret_st = (struct ckpt_load_stats){ CKPT_LOAD_STATS_INIT };
	ck_assert_int_eq(ckpt_load_stats(ld, ret_st), 0);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	if (rc == 0) {
		for (size_t i = 0; i < N_ITEMS; i++) {
			const struct item *it = &items[i];
			size_t n = td_nbytes(td_dtype_size(it->dt), it->ndim, it->shape);
			int64_t at = td_check(bufs[i], n, item_seed(gen, i), 0);

			ck_assert_msg(at < 0, "%s: '%s' differs from what was saved at byte %lld",
				      path, it->name, (long long)at);
		}
		for (uint32_t r = 0; r < world; r++) {
			int64_t at = td_check(blobs[r], BLOB_LEN + r, blob_seed(gen, r), 0);

			ck_assert_msg(at < 0, "%s: blob of rank %u differs at byte %lld", path, r,
				      (long long)at);
		}
	}
	for (size_t i = 0; i < N_ITEMS; i++)
		free(bufs[i]);
	for (uint32_t r = 0; r < world; r++)
		free(blobs[r]);
	return rc;
}

/* Set while a load's image is expected to fail its check: the file is
 * then read from storage by the library, not through the daemon. */
static bool image_rejected;

/* A load that must work; asserts its stats say `files` files came from
 * memory, and then all of the bytes read; with a client, the rest came
 * through the daemon's reads (the client's arena is large enough for every
 * read of these plans). */
static void load_ok(const char *path, struct ckpt_client *c, unsigned gen, uint32_t world,
		    uint32_t files)
{
	struct ckpt_load_stats st;
	char msg[1024];
	int rc = load_state(path, c, gen, world, &st, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "load %s: %d %s", path, rc, msg);
	ck_assert_msg(st.files_resident == files, "load %s: %u files from memory, want %u", path,
		      st.files_resident, files);
	ck_assert_uint_ge(st.bytes_read, st.bytes_wanted);
	if (files) {
		ck_assert_uint_gt(st.bytes_resident, 0);
		ck_assert_msg(st.bytes_resident == st.bytes_read,
			      "load %s: %llu of %llu bytes from memory", path,
			      (unsigned long long)st.bytes_resident,
			      (unsigned long long)st.bytes_read);
	} else {
		ck_assert_uint_eq(st.bytes_resident, 0);
	}
	if (c && !image_rejected)
		ck_assert_msg(st.bytes_daemon + st.bytes_resident == st.bytes_read,
			      "load %s: %llu bytes through ckptd, %llu from memory, of %llu", path,
			      (unsigned long long)st.bytes_daemon,
			      (unsigned long long)st.bytes_resident,
			      (unsigned long long)st.bytes_read);
	if (!c)
		ck_assert_uint_eq(st.bytes_daemon, 0);
}

/* A load that must fail because rank `rank`'s shard is gone: -ENOENT, at
 * start or from the future, with a message naming the file. */
static void load_fails_missing(const char *path, struct ckpt_client *c, unsigned gen,
			       uint32_t world, uint32_t rank)
{
	struct ckpt_load_stats st;
	char msg[1024], file[64];
	int rc = load_state(path, c, gen, world, &st, msg, sizeof(msg));

	snprintf(file, sizeof(file), "rank-%05u.safetensors", rank);
	ck_assert_msg(rc == -ENOENT, "load %s%s = %d (%s), want -ENOENT", path,
		      c ? " with a client" : "", rc, msg);
	ck_assert_msg(strstr(msg, file), "load %s: the error does not name %s: %s", path, file,
		      msg);
	ck_assert_uint_eq(st.files_resident, 0);
}

/* ---- files and status --------------------------------------------------- */

static void shard_path(char *buf, size_t len, const struct testd *t, const char *name,
		       uint32_t rank)
{
	td_path(buf, len, "%s/%s/rank-%05u.safetensors", t->root, name, rank);
}

static uint64_t shard_size(const struct testd *t, const char *name, uint32_t rank)
{
	char p[TD_PATH];
	struct stat sb;

	shard_path(p, sizeof(p), t, name, rank);
	ck_assert_msg(stat(p, &sb) == 0, "stat %s: %s", p, strerror(errno));
	return (uint64_t)sb.st_size;
}

/* Deletes a rank's shard file of a committed checkpoint; the manifest
 * stays, so the checkpoint still opens. */
static void delete_shard(const struct testd *t, const char *name, uint32_t rank)
{
	char p[TD_PATH];

	shard_path(p, sizeof(p), t, name, rank);
	ck_assert_msg(unlink(p) == 0, "unlink %s: %s", p, strerror(errno));
	td_path(p, sizeof(p), "%s/%s/manifest.json", t->root, name);
	ck_assert(td_exists(p));
}

/* The "attempt" of root/name's manifest, into out[33]. */
static void manifest_attempt(const struct testd *t, const char *name, char *out, size_t len)
{
	char p[TD_PATH], *text = NULL;
	json_error_t je;
	json_t *j;
	const char *a;

	td_path(p, sizeof(p), "%s/%s/manifest.json", t->root, name);
	ck_assert_int_eq(td_read_file(p, 64 * MiB, &text, NULL), 0);
	j = json_loads(text, 0, &je);
	ck_assert_msg(j, "%s: %s", p, je.text);
	a = json_string_value(json_object_get(j, "attempt"));
	ck_assert_msg(a && a[0], "%s has no attempt", p);
	snprintf(out, len, "%s", a);
	json_decref(j);
	free(text);
}

/* Daemon 0's status report (ckptctl status --json), parsed; owned. */
static json_t *status_json(struct testd *t)
{
	char *out = NULL;
	json_error_t je;
	json_t *j;
	int st = td_ckptctl(&out, "-s", td_sock(t, 0), "status", "--json", NULL);

	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl status --json: %s: %s", td_status_str(st), out ? out : "");
	j = json_loads(out, 0, &je);
	ck_assert_msg(j, "status is not JSON (%s): %s", je.text, out);
	ck_assert_msg(json_is_array(json_object_get(j, "resident")),
		      "status has no \"resident\" array: %s", out);
	ck_assert_msg(json_is_integer(json_object_get(j, "resident_bytes")),
		      "status has no \"resident_bytes\": %s", out);
	free(out);
	return j;
}

/* The entry of j's "resident" for (job, name, rank); borrowed, or NULL. */
static json_t *find_resident(json_t *j, const char *job, const char *name, uint32_t rank)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(j, "resident"), i, e) {
		const char *ej = json_string_value(json_object_get(e, "job"));
		const char *en = json_string_value(json_object_get(e, "name"));

		if (ej && en && !strcmp(ej, job) && !strcmp(en, name) &&
		    json_integer_value(json_object_get(e, "rank")) == (json_int_t)rank)
			return e;
	}
	return NULL;
}

/* Number of "resident" entries of job. */
static size_t count_resident(json_t *j, const char *job)
{
	json_t *e;
	size_t i, n = 0;

	json_array_foreach(json_object_get(j, "resident"), i, e) {
		const char *ej = json_string_value(json_object_get(e, "job"));

		n += ej && !strcmp(ej, job);
	}
	return n;
}

/*
 * Polls the status (bounded, 15 s) until it lists the image of (job, name,
 * rank), and returns that report (owned).  The daemon hands the image over
 * when it frees the save's rank, a moment after it told the client of the
 * commit, so a report taken right after "committed" may not show it yet.
 */
static json_t *wait_resident(struct testd *t, const char *job, const char *name, uint32_t rank)
{
	int64_t end = td_now_ms() + 15000;

	for (;;) {
		json_t *j = status_json(t);

		if (find_resident(j, job, name, rank))
			return j;
		if (td_now_ms() >= end) {
			char *s = json_dumps(j, JSON_INDENT(1));

			ck_abort_msg("after 15 s the status lists no image of '%s' rank %u (job "
				     "%s):\n%s", name, rank, job, s ? s : "?");
		}
		json_decref(j);
		td_sleep_ms(50);
	}
}

/* Polls (bounded) until the status lists no save named `name`: its ranks,
 * and so its images, have been dealt with. */
static void wait_save_gone(struct testd *t, const char *name)
{
	int64_t end = td_now_ms() + 15000;

	for (;;) {
		json_t *j = status_json(t), *sv;
		bool found = false;
		size_t i;

		json_array_foreach(json_object_get(j, "saves"), i, sv) {
			const char *n = json_string_value(json_object_get(sv, "name"));
			found |= n && !strcmp(n, name);
		}
		json_decref(j);
		if (!found)
			return;
		ck_assert_msg(td_now_ms() < end, "save '%s' still in the status after 15 s", name);
		td_sleep_ms(50);
	}
}

/* ---- 1. kill -9, shard deleted, restored from memory ------------------------ */

START_TEST(test_kill9)
{
	struct testd t;
	struct td_child ch;
	struct rank_args a = { .job = "J", .name = "ck", .step = 7, .gen = 1, .rank = 0,
			       .world = 1, .block = true };
	struct ckpt_client *c;
	char path[TD_PATH];
	json_t *j, *e;
	int st;

	td_init(&t, "kill9");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	a.sock = td_sock(&t, 0);
	a.root = t.root;
	start_rank(&ch, &a);
	expect_committed(&ch, 0);
	kill(ch.pid, SIGKILL);
	st = td_child_wait(&ch, 10000);
	ck_assert_msg(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
		      "the trainer ended with %s, not by SIGKILL", td_status_str(st));

	/* The image outlives its client. */
	j = wait_resident(&t, "J", "ck", 0);
	json_decref(j);
	td_path(path, sizeof(path), "%s/ck", t.root);
	delete_shard(&t, "ck", 0);

	/* From storage alone the checkpoint is gone... */
	load_fails_missing(path, NULL, 1, 1, 0);

	/* ...a restarted trainer of the job (without the flag: loading
	 * needs none) gets it from the daemon, every byte. */
	c = connect_ok(&t, "J", "r2", 0, 1, 0);
	load_ok(path, c, 1, 1, 1);

	/* The image was handed out once, and is still there. */
	j = status_json(&t);
	e = find_resident(j, "J", "ck", 0);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(json_integer_value(json_object_get(e, "loads")), 1);
	json_decref(j);

	/* A second load works the same (the image is not consumed). */
	load_ok(path, c, 1, 1, 1);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 2. another job of the same user is not served ------------------------ */

START_TEST(test_other_job)
{
	struct testd t;
	struct ckpt_client *c, *k;
	char path[TD_PATH];
	json_t *j;

	td_init(&t, "other_job");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "ck", 1, 2, 0, 1);
	ckpt_disconnect(c);
	j = wait_resident(&t, "J", "ck", 0);
	json_decref(j);
	td_path(path, sizeof(path), "%s/ck", t.root);
	delete_shard(&t, "ck", 0);

	/* Job K, same uid, same rank: the image is not K's. */
	k = connect_ok(&t, "K", "r1", 0, 1, 0);
	load_fails_missing(path, k, 2, 1, 0);
	/* Nor is a resident client of K: the flag is no key to others. */
	ckpt_disconnect(k);
	k = connect_ok(&t, "K", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	load_fails_missing(path, k, 2, 1, 0);
	ckpt_disconnect(k);

	/* The image was there all along: J gets it. */
	c = connect_ok(&t, "J", "r2", 0, 1, 0);
	load_ok(path, c, 2, 1, 1);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 3. only the newest committed save of a rank ---------------------------- */

START_TEST(test_newest_only)
{
	struct testd t;
	struct ckpt_client *c, *l;
	char pa[TD_PATH], pb[TD_PATH], pc[TD_PATH];
	json_t *j;

	td_init(&t, "newest_only");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "a", 1, 1, 0, 1);
	save_ok(c, t.root, "b", 2, 2, 0, 1);
	j = wait_resident(&t, "J", "b", 0);
	ck_assert_msg(!find_resident(j, "J", "a", 0), "the status still lists a's image");
	ck_assert_uint_eq(count_resident(j, "J"), 1);
	json_decref(j);
	td_path(pa, sizeof(pa), "%s/a", t.root);
	td_path(pb, sizeof(pb), "%s/b", t.root);
	td_path(pc, sizeof(pc), "%s/c", t.root);
	delete_shard(&t, "a", 0);
	delete_shard(&t, "b", 0);

	l = connect_ok(&t, "J", "r2", 0, 1, 0);
	load_ok(pb, l, 2, 1, 1);
	load_fails_missing(pa, l, 1, 1, 0);

	/* A third save refills the image a's save left (same size): what
	 * comes back is c's bytes, and b is no longer served. */
	save_ok(c, t.root, "c", 3, 3, 0, 1);
	j = wait_resident(&t, "J", "c", 0);
	ck_assert_uint_eq(count_resident(j, "J"), 1);
	json_decref(j);
	delete_shard(&t, "c", 0);
	load_ok(pc, l, 3, 1, 1);
	load_fails_missing(pb, l, 2, 1, 0);
	ckpt_disconnect(l);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 4. two ranks on one daemon, loaded whole by one ---------------------- */

START_TEST(test_two_ranks)
{
	struct testd t;
	struct td_child ch[2];
	struct rank_args a[2];
	struct ckpt_client *l;
	char path[TD_PATH];
	json_t *j;

	td_init(&t, "two_ranks");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	for (uint32_t r = 0; r < 2; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(&t, 0), .root = t.root, .job = "J2",
					   .name = "ck", .step = 5, .gen = 4, .rank = r,
					   .world = 2 };
		start_rank(&ch[r], &a[r]);
	}
	for (uint32_t r = 0; r < 2; r++) {
		int st = td_child_wait(&ch[r], 90000);

		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
	for (uint32_t r = 0; r < 2; r++) {
		uint64_t size = shard_size(&t, "ck", r);
		json_t *e;

		j = wait_resident(&t, "J2", "ck", r);
		e = find_resident(j, "J2", "ck", r);
		ck_assert_int_eq(json_integer_value(json_object_get(e, "bytes")),
				 (json_int_t)size);
		json_decref(j);
		delete_shard(&t, "ck", r);
	}
	td_path(path, sizeof(path), "%s/ck", t.root);
	load_fails_missing(path, NULL, 4, 2, 0);

	/* One loader, world 1: whole tensors, each assembled from both
	 * ranks' images. */
	l = connect_ok(&t, "J2", "r2", 0, 1, 0);
	load_ok(path, l, 4, 2, 2);
	ckpt_disconnect(l);
	td_fini(&t);
}
END_TEST

/* ---- 5. an image of another checkpoint is not used ------------------------- */

/*
 * Job J saves "a" at step 1 with the flag (its image stays), then a new
 * client of J without the flag saves "a" at step 1 again, other bytes of
 * the same size, so that only the attempt id or the path can tell the
 * two apart:
 *   _i == 0: the first checkpoint removed, saved again at the same path
 *            with another run id: another attempt id;
 *   _i == 1: the same, with the first run id: the very same attempt id
 *            (it hashes job, run, name, step, the client's attempt
 *            number -- 0 on a new client -- and world, not the path);
 *   _i == 2: the same run id again, but under another root directory,
 *            both checkpoints kept: same attempt id, another path;
 *   _i == 3: as 1, but the second save goes through ANOTHER daemon on the
 *            same root, so the first daemon cannot know its image is
 *            stale: path and attempt id match, the bytes do not.
 * Either way, the load of the second checkpoint must give its own bytes,
 * which storage has: the first save's image must not stand in for them.
 * In 0 and 1 the daemon drops the image when the path is saved again; in
 * 2 it keeps it (it is still what exp1's checkpoint holds); in 3 it still
 * serves it, and the client, finding blocks that do not match the
 * manifest, reads storage instead.
 */
START_TEST(test_stale)
{
	static const char *const what[] = { "stale_other_attempt", "stale_same_attempt",
					    "stale_other_root", "stale_other_daemon" };
	struct testd t;
	struct ckpt_client *c, *l;
	char path[TD_PATH], root2[TD_PATH], name2[16], first[64], second[64];
	uint64_t size;
	json_t *j, *e;

	td_init(&t, what[_i]);
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "a", 1, 1, 0, 1);
	ckpt_disconnect(c);
	j = wait_resident(&t, "J", "a", 0);
	snprintf(first, sizeof(first), "%s",
		 json_string_value(json_object_get(find_resident(j, "J", "a", 0), "attempt")));
	json_decref(j);
	size = shard_size(&t, "a", 0);

	td_path(path, sizeof(path), "%s/a", t.root);
	if (_i != 2) {
		ck_assert_int_eq(td_rm_rf(path), 0);
		snprintf(root2, sizeof(root2), "%s", t.root);
		snprintf(name2, sizeof(name2), "a");
	} else {
		td_path(root2, sizeof(root2), "%s/exp2", t.root);
		ck_assert_int_eq(mkdir(root2, 0755), 0);
		snprintf(name2, sizeof(name2), "exp2/a");
	}
	if (_i == 3) {
		ck_assert_int_eq(td_daemon_start(&t, 1, DAEMON_CONF), 0);
		ck_assert_int_eq(connect_rc(td_sock(&t, 1), "J", "r1", 0, 1, 0, &c), 0);
	} else {
		c = connect_ok(&t, "J", _i == 0 ? "r2" : "r1", 0, 1, 0);
	}
	save_ok(c, root2, "a", 1, 2, 0, 1);
	ckpt_disconnect(c);
	manifest_attempt(&t, name2, second, sizeof(second));
	if (_i == 0)
		ck_assert_msg(strcmp(first, second) != 0, "test premise: both saves are attempt %s",
			      first);
	else
		ck_assert_msg(strcmp(first, second) == 0,
			      "test premise: same run, same attempt id, got %s and %s", first,
			      second);
	ck_assert_uint_eq(shard_size(&t, name2, 0), size);

	/* The first image: dropped by the daemon that saw the path saved
	 * again, kept otherwise... */
	j = status_json(&t);
	e = find_resident(j, "J", "a", 0);
	if (_i < 2) {
		ck_assert_msg(!e, "the image of a checkpoint saved over is still listed");
	} else {
		ck_assert_msg(e, "the first save's image is gone");
		ck_assert_str_eq(json_string_value(json_object_get(e, "attempt")), first);
	}
	json_decref(j);

	/* ...and the load reads storage: the second save's bytes. */
	l = connect_ok(&t, "J", "r3", 0, 1, 0);
	td_path(path, sizeof(path), "%s/a", root2);
	image_rejected = _i == 3;
	load_ok(path, l, 2, 1, 0);
	image_rejected = false;
	if (_i == 3) {
		/* The daemon did hand its stale image out: the right bytes
		 * above came from storage after the image failed its check. */
		j = status_json(&t);
		e = find_resident(j, "J", "a", 0);
		ck_assert_msg(e, "the first save's image is gone");
		ck_assert_int_eq(json_integer_value(json_object_get(e, "loads")), 1);
		json_decref(j);
	}
	if (_i == 2) {
		/* The first checkpoint is still served from memory. */
		td_path(path, sizeof(path), "%s/a", t.root);
		load_ok(path, l, 1, 1, 1);
	}
	ckpt_disconnect(l);
	td_fini(&t);
}
END_TEST

/* ---- 6. the status report lists the image ---------------------------------- */

START_TEST(test_status)
{
	struct testd t;
	struct ckpt_client *c;
	char attempt[64];
	uint64_t size;
	json_t *j, *e;

	td_init(&t, "status");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	j = status_json(&t);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "resident")), 0);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "resident_bytes")), 0);
	json_decref(j);

	c = connect_ok(&t, "J", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "ck", 42, 6, 0, 1);
	size = shard_size(&t, "ck", 0);
	manifest_attempt(&t, "ck", attempt, sizeof(attempt));
	for (int k = 0; k < 2; k++) {
		/* k == 0: the client is connected; 1: it is gone. */
		j = wait_resident(&t, "J", "ck", 0);
		ck_assert_uint_eq(json_array_size(json_object_get(j, "resident")), 1);
		e = find_resident(j, "J", "ck", 0);
		ck_assert_str_eq(json_string_value(json_object_get(e, "root")), t.root);
		ck_assert_int_eq(json_integer_value(json_object_get(e, "step")), 42);
		ck_assert_str_eq(json_string_value(json_object_get(e, "attempt")), attempt);
		ck_assert_int_eq(json_integer_value(json_object_get(e, "bytes")), (json_int_t)size);
		ck_assert_int_eq(json_integer_value(json_object_get(e, "loads")), 0);
		ck_assert_msg(json_is_number(json_object_get(e, "age_s")) &&
				      json_number_value(json_object_get(e, "age_s")) >= 0,
			      "age_s missing or negative");
		ck_assert_int_ge(json_integer_value(json_object_get(j, "resident_bytes")),
				 (json_int_t)size);
		json_decref(j);
		if (k == 0) {
			ckpt_disconnect(c);
			c = NULL;
		}
	}
	td_fini(&t);
}
END_TEST

/* ---- 7. a client without the flag keeps nothing in memory ----------------- */

START_TEST(test_no_flag)
{
	struct testd t;
	struct ckpt_client *c, *l;
	char path[TD_PATH];
	json_t *j;

	td_init(&t, "no_flag");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, 0);
	save_ok(c, t.root, "a", 1, 7, 0, 1);
	ckpt_disconnect(c);
	/* A resident save of another job after it: once that one's image is
	 * listed, a's save was over long ago, and had it made an image it
	 * would be listed too. */
	c = connect_ok(&t, "K", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "k", 1, 8, 0, 1);
	ckpt_disconnect(c);
	j = wait_resident(&t, "K", "k", 0);
	ck_assert_uint_eq(count_resident(j, "J"), 0);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "resident")), 1);
	json_decref(j);

	/* set_client then serves nothing; storage has every byte. */
	td_path(path, sizeof(path), "%s/a", t.root);
	l = connect_ok(&t, "J", "r2", 0, 1, 0);
	load_ok(path, l, 7, 1, 0);
	delete_shard(&t, "a", 0);
	load_fails_missing(path, l, 7, 1, 0);
	ckpt_disconnect(l);
	td_fini(&t);
}
END_TEST

/* ---- 8. a failed save does not displace the committed image ---------------- */

START_TEST(test_failed_save)
{
	struct testd t;
	struct td_child ch;
	struct rank_args a = { .job = "J3", .name = "a", .step = 1, .gen = 1, .rank = 1,
			       .world = 2 };
	struct ckpt_client *c;
	char path[TD_PATH], msg[1024];
	json_t *j;
	int rc, st;

	td_init(&t, "failed_save");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF "commit_deadline = 5s\n"), 0);
	a.sock = td_sock(&t, 0);
	a.root = t.root;
	/* Rank 1 in a process of its own (forked before this one has a
	 * client); it saves a, then leaves. */
	start_rank(&ch, &a);
	c = connect_ok(&t, "J3", "r1", 0, 2, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "a", 1, 1, 0, 2);
	st = td_child_wait(&ch, 90000);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1: %s; it said:\n%s",
		      td_status_str(st), ch.out);
	json_decref(wait_resident(&t, "J3", "a", 0));
	json_decref(wait_resident(&t, "J3", "a", 1));

	/* b: rank 0's bytes all go into a new image, but rank 1 never
	 * comes, so the save fails at the deadline. */
	rc = save_state(c, t.root, "b", 2, 2, 0, 2, msg, sizeof(msg));
	ck_assert_msg(rc < 0, "save b without rank 1 did not fail: %s", msg);
	ck_assert_msg(td_msg_names_rank(msg, 1), "the failure does not name rank 1: %s", msg);
	wait_save_gone(&t, "b");
	j = status_json(&t);
	ck_assert_ptr_nonnull(find_resident(j, "J3", "a", 0));
	ck_assert_ptr_nonnull(find_resident(j, "J3", "a", 1));
	ck_assert_uint_eq(count_resident(j, "J3"), 2);
	json_decref(j);

	delete_shard(&t, "a", 0);
	delete_shard(&t, "a", 1);
	td_path(path, sizeof(path), "%s/a", t.root);
	load_ok(path, c, 1, 2, 2);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 9. reads through the daemon check what they read ---------------------- */

/*
 * Without an image, a load with a client has the daemon read the shard
 * into the client's arena; those bytes are checked like any others:
 *   _i == 0: a flipped byte fails the load naming the file;
 *   _i == 1: a truncated shard fails it saying so.
 * The same checkpoint, intact, loaded the same way first, is correct.
 */
START_TEST(test_daemon_reads_checked)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_load_stats st;
	char shard[TD_PATH], path[TD_PATH], msg[1024];
	uint64_t size;
	int fd, rc;

	td_init(&t, _i ? "daemon_truncated" : "daemon_flipped");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, 0);
	save_ok(c, t.root, "a", 1, 1, 0, 1);
	td_path(path, sizeof(path), "%s/a", t.root);
	load_ok(path, c, 1, 1, 0);

	shard_path(shard, sizeof(shard), &t, "a", 0);
	size = shard_size(&t, "a", 0);
	if (_i == 0) {
		unsigned char b;
		fd = open(shard, O_RDWR | O_CLOEXEC);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(pread(fd, &b, 1, (off_t)(size / 2)), 1);
		b ^= 0x10;
		ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(size / 2)), 1);
		fsync(fd);
		close(fd);
	} else {
		ck_assert_int_eq(truncate(shard, (off_t)(size / 2)), 0);
	}
	rc = load_state(path, c, 1, 1, &st, msg, sizeof(msg));
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "rank-00000.safetensors"), "error names no file: %s", msg);
	ck_assert_msg(strstr(msg, _i ? "truncated" : "CRC mismatch"), "%s", msg);
	ck_assert_msg(strstr(msg, "ckptd") || _i == 0, "not read through ckptd: %s", msg);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 10. an image handed out cannot be written ----------------------------- */

/*
 * The descriptor a client gets is read-only, but a memfd's is mode 0777:
 * reopened through /proc it would be writable, were the image not sealed.
 * Through the library's own request (client/internal.h), as a hostile
 * client of the same job would do it: the image reads as the shard file
 * does, and neither write(), a shared writable mapping nor a resize
 * through a reopened descriptor gets through.
 */
START_TEST(test_sealed)
{
	struct testd t;
	struct ckpt_client *c;
	char path[TD_PATH], canon[TD_PATH], shard[TD_PATH], where[STORE_ID_LEN + 1], attempt[64];
	char proc[64];
	uint64_t size = 0;
	char *file = NULL;
	size_t flen = 0;
	void *map;
	int fd = -1, rw;

	td_init(&t, "sealed");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	c = connect_ok(&t, "J", "r1", 0, 1, CKPT_CONNECT_RESIDENT);
	save_ok(c, t.root, "a", 1, 1, 0, 1);
	td_path(path, sizeof(path), "%s/a", t.root);
	ck_assert_ptr_nonnull(realpath(path, canon));
	store_hash_hex(canon, strlen(canon), where);
	manifest_attempt(&t, "a", attempt, sizeof(attempt));
	ck_assert_int_eq(cli_resident_get(c, attempt, where, 0, 10000, &fd, &size), 0);
	shard_path(shard, sizeof(shard), &t, "a", 0);
	ck_assert_int_eq(td_read_file(shard, 1ull << 30, &file, &flen), 0);
	ck_assert_uint_eq(size, flen);
	map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert(map != MAP_FAILED);
	ck_assert_msg(memcmp(map, file, flen) == 0, "the image is not the shard file");
	munmap(map, size);

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	rw = open(proc, O_RDWR | O_CLOEXEC);
	if (rw >= 0) {
		ck_assert_int_eq(pwrite(rw, "x", 1, 0), -1);
		ck_assert_int_eq(errno, EPERM);
		ck_assert(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
		ck_assert_int_eq(errno, EPERM);
		ck_assert_int_eq(ftruncate(rw, 0), -1);
		close(rw);
	}
	ck_assert(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	close(fd);
	free(file);
	/* Still intact for a load. */
	delete_shard(&t, "a", 0);
	load_ok(path, c, 1, 1, 1);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 11. boxes of tensors, copied from the image ------------------------------ */

/*
 * A load of part of a tensor from an image copies each run of a box that
 * is contiguous in the file and in the destination straight into place,
 * and checks each CRC piece the run touches over the bytes that landed
 * plus the image's bytes of the piece outside the run; other boxes (a
 * column band, a padded destination, boxes that overlap) go through a
 * bounce buffer.  Every box goes into a buffer of its own, filled with a
 * sentinel first: after the load the box holds what was saved and every
 * other byte of its buffer is untouched.
 */

#define MAX_BOXES 4
#define GUARD 4096       /* sentinel bytes before and after each box */
#define SENTINEL 0xA5

/* One destination box of item `item` of a table of items: offs and shape
 * (2-D: rows, columns; 1-D: elements; 0-D: unused), into a buffer whose
 * rows are `pitch` elements apart (0: packed, strides NULL). */
struct box {
	unsigned item;
	uint64_t offs[2], shape[2];
	uint64_t pitch;
};

/* Writes bytes [off, off + len) of item `item` as saved (the whole tensor,
 * row-major) into buf. */
typedef void expect_fn(void *buf, size_t len, unsigned item, uint64_t off, const void *ctx);

/* Bytes of the rows of box b (with its pitch), without the guards. */
static uint64_t box_span(const struct item *tab, const struct box *b)
{
	const struct item *it = &tab[b->item];
	size_t es = td_dtype_size(it->dt);

	if (it->ndim == 0)
		return es;
	if (it->ndim == 1)
		return b->shape[0] * es;
	return b->shape[0] * (b->pitch ? b->pitch : b->shape[1]) * es;
}

static uint64_t box_bytes(const struct item *tab, const struct box *b)
{
	const struct item *it = &tab[b->item];

	return td_nbytes(td_dtype_size(it->dt), it->ndim, b->shape);
}

/* Asserts box b's buffer (guards included) holds the box's bytes as
 * `expect` says, at its pitch, and the sentinel everywhere else. */
static void check_box(const struct item *tab, const struct box *b, unsigned char *buf,
		      expect_fn *expect, const void *ctx, const char *what)
{
	const struct item *it = &tab[b->item];
	size_t es = td_dtype_size(it->dt);
	uint64_t rows = it->ndim == 2 ? b->shape[0] : 1;
	uint64_t run = it->ndim == 0 ? es : (it->ndim == 1 ? b->shape[0] : b->shape[1]) * es;
	uint64_t pitch = it->ndim == 2 && b->pitch ? b->pitch * es : run;
	uint64_t len = 2 * GUARD + box_span(tab, b);
	unsigned char *want = malloc(run);

	ck_assert_ptr_nonnull(want);
	for (uint64_t r = 0; r < rows; r++) {
		unsigned char *at = buf + GUARD + r * pitch;
		uint64_t off = it->ndim == 2 ? ((b->offs[0] + r) * it->shape[1] + b->offs[1]) * es :
			       it->ndim == 1 ? b->offs[0] * es : 0;

		expect(want, run, b->item, off, ctx);
		if (memcmp(at, want, run) != 0) {
			uint64_t k = 0;

			while (at[k] == want[k])
				k++;
			ck_abort_msg("%s: '%s' byte %llu of the tensor is %#x, saved as %#x (row "
				     "%llu of the box)", what, it->name,
				     (unsigned long long)(off + k), at[k], want[k],
				     (unsigned long long)r);
		}
		/* Seen: the sentinel check below then covers the rest. */
		memset(at, SENTINEL, run);
	}
	/* One assertion, not one per byte: each passing ck_assert() is a
	 * message to Check's parent process. */
	for (uint64_t k = 0; k < len; k++)
		if (buf[k] != SENTINEL)
			ck_abort_msg("%s: '%s': byte %lld of its buffer (from the box's start), "
				     "outside the box, was written", what, it->name,
				     (long long)k - GUARD);
	free(want);
}

/*
 * Loads the n boxes bx (of the items of `tab`; the boxes of one tensor
 * adjacent) from checkpoint `path`, through client c if not NULL.  Returns
 * 0 -- after check_box() of every box -- or the error of ckpt_load_start()
 * or of the done future, with its message in msg; the stats go to *ret_st
 * either way.
 */
static int load_boxes(const char *path, struct ckpt_client *c, const struct item *tab,
		      const struct box *bx, unsigned n, expect_fn *expect, const void *ctx,
		      const char *what, struct ckpt_load_stats *ret_st, char *msg, size_t len)
{
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done = NULL;
	struct ckpt_load_dst dst[MAX_BOXES];
	int64_t strides[MAX_BOXES][2];
	unsigned char *bufs[MAX_BOXES];
	int rc;

	ck_assert_uint_le(n, MAX_BOXES);
	rc = ckpt_reader_open(path, &rd);
	ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, ckpt_last_error());
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	for (unsigned i = 0; i < n; i++) {
		const struct item *it = &tab[bx[i].item];
		size_t blen = 2 * GUARD + box_span(tab, &bx[i]);

		bufs[i] = malloc(blen);
		ck_assert_ptr_nonnull(bufs[i]);
		memset(bufs[i], SENTINEL, blen);
		strides[i][0] = (int64_t)bx[i].pitch;
		strides[i][1] = 1;
		dst[i] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT, .data = bufs[i] + GUARD,
						 .offsets = it->ndim ? bx[i].offs : NULL,
						 .shape = it->ndim ? bx[i].shape : NULL };
		if (it->ndim == 2 && bx[i].pitch)
			dst[i].strides = strides[i];
	}
	for (unsigned i = 0, k; i < n; i = k) {
		const struct item *it = &tab[bx[i].item];

		for (k = i + 1; k < n && bx[k].item == bx[i].item; k++)
			;
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = it->dt,
					       .name = it->name, .global_shape = it->shape,
					       .ndim = it->ndim, .n_dsts = k - i, .dsts = &dst[i] };
		rc = ckpt_load_add_tensor(ld, &lt);
		ck_assert_msg(rc == 0, "%s: add %s: %d %s", what, it->name, rc, ckpt_last_error());
	}
	if (c)
		ck_assert_int_eq(ckpt_load_set_client(ld, c), 0);
	rc = ckpt_load_start(ld, &done);
	if (rc < 0) {
		snprintf(msg, len, "%s", ckpt_last_error());
	} else {
		rc = td_future_wait(done, WAIT_MS);
		snprintf(msg, len, "%s", ckpt_future_error(done));
	}
	*ret_st = (struct ckpt_load_stats){ CKPT_LOAD_STATS_INIT };
	ck_assert_int_eq(ckpt_load_stats(ld, ret_st), 0);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	for (unsigned i = 0; i < n; i++) {
		if (rc == 0)
			check_box(tab, &bx[i], bufs[i], expect, ctx, what);
		free(bufs[i]);
	}
	return rc;
}

/* The loads of test_partial, of the items of save_state(). */
static const struct pload {
	const char *what;
	bool mid;   /* every end of a box that is not an end of its tensor
		     * lies inside a CRC piece (asserted in a world-1 save) */
	unsigned n;
	struct box box[MAX_BOXES];
} ploads[] = {
	{ "rows [37, 911)", true, 1, { { 3, { 37, 0 }, { 874, 1031 }, 0 } } },
	{ "one row", true, 1, { { 3, { 500, 0 }, { 1, 1031 }, 0 } } },
	{ "one row across grid lines", true, 1, { { 7, { 1, 0 }, { 1, 1111111 }, 0 } } },
	{ "rows to the tensor's end", true, 1, { { 6, { 77, 0 }, { 435, 3000 }, 0 } } },
	{ "rows from row 0", true, 1, { { 1, { 0, 0 }, { 1333, 2048 }, 0 } } },
	{ "rows [0, 613) and [613, 1000) into two buffers", true, 2,
	  { { 3, { 0, 0 }, { 613, 1031 }, 0 }, { 3, { 613, 0 }, { 387, 1031 }, 0 } } },
	{ "three row boxes, small gaps between", true, 3,
	  { { 3, { 3, 0 }, { 2, 1031 }, 0 }, { 3, { 20, 0 }, { 1, 1031 }, 0 },
	    { 3, { 40, 0 }, { 860, 1031 }, 0 } } },
	{ "element ranges of 1-D tensors", true, 3,
	  { { 2, { 1, 0 }, { 775, 0 }, 0 }, { 4, { 123457, 0 }, { 2876544, 0 }, 0 },
	    { 5, { 5, 0 }, { 11995, 0 }, 0 } } },
	{ "a column band", false, 1, { { 3, { 10, 100 }, { 980, 513 }, 0 } } },
	{ "a column band into a wider buffer", false, 1,
	  { { 0, { 0, 1 }, { 2048, 1022 }, 1024 } } },
	{ "rows into a padded buffer", false, 1, { { 6, { 10, 0 }, { 390, 3000 }, 3001 } } },
	{ "overlapping row boxes", false, 2,
	  { { 1, { 0, 0 }, { 1600, 2048 }, 0 }, { 1, { 1500, 0 }, { 1501, 2048 }, 0 } } },
	{ "rows, a band, a whole 1-D tensor and the scalar", false, 4,
	  { { 5, { 0, 0 }, { 12345, 0 }, 0 }, { 6, { 200, 0 }, { 100, 3000 }, 0 },
	    { 7, { 0, 5 }, { 3, 1111095 }, 0 }, { 8, { 0, 0 }, { 0, 0 }, 0 } } },
};

#define N_PLOADS (sizeof(ploads) / sizeof(ploads[0]))

static void expect_gen(void *buf, size_t len, unsigned item, uint64_t off, const void *ctx)
{
	td_fill(buf, len, item_seed(*(const unsigned *)ctx, item), off);
}

/* Absolute offset of the first byte of tensor `name` in a shard file: 8
 * bytes of header length, the JSON header, then the data, which the
 * header's "data_offsets" count from. */
static uint64_t item_begin(const char *shard, const char *name)
{
	unsigned char le[8];
	uint64_t n = 0, begin;
	json_error_t je;
	json_t *j, *off;
	char *hdr;
	int fd = open(shard, O_RDONLY | O_CLOEXEC);

	ck_assert_msg(fd >= 0, "open %s: %s", shard, strerror(errno));
	ck_assert_int_eq(pread(fd, le, 8, 0), 8);
	for (int i = 7; i >= 0; i--)
		n = n << 8 | le[i];
	ck_assert_uint_lt(n, 16 * MiB);
	hdr = malloc(n);
	ck_assert_ptr_nonnull(hdr);
	ck_assert_int_eq(pread(fd, hdr, n, 8), (ssize_t)n);
	close(fd);
	j = json_loadb(hdr, n, 0, &je);
	ck_assert_msg(j, "%s: header: %s", shard, je.text);
	off = json_object_get(json_object_get(j, name), "data_offsets");
	ck_assert_msg(json_is_array(off), "%s has no tensor '%s'", shard, name);
	begin = 8 + n + (uint64_t)json_integer_value(json_array_get(off, 0));
	json_decref(j);
	free(hdr);
	return begin;
}

/* The premise of the `mid` loads, in a world-1 checkpoint: their boxes are
 * whole rows (or element ranges) that start and end inside CRC pieces,
 * except at the ends of their tensors, so the pieces at both ends hold
 * bytes the runs do not. */
static void check_mid(const struct testd *t, const char *name)
{
	char shard[TD_PATH];

	shard_path(shard, sizeof(shard), t, name, 0);
	for (size_t k = 0; k < N_PLOADS; k++) {
		const char *what = ploads[k].what;

		for (unsigned i = 0; ploads[k].mid && i < ploads[k].n; i++) {
			const struct box *b = &ploads[k].box[i];
			const struct item *it = &items[b->item];
			uint64_t row = it->ndim == 2 ? it->shape[1] * td_dtype_size(it->dt) :
						       td_dtype_size(it->dt);
			uint64_t base = item_begin(shard, it->name);
			uint64_t lo = base + b->offs[0] * row, hi = lo + b->shape[0] * row;

			ck_assert(it->ndim >= 1 && (it->ndim == 1 || b->shape[1] == it->shape[1]));
			ck_assert_msg(b->offs[0] == 0 || lo % MiB,
				      "test premise: '%s' box %u starts on a grid line", what, i);
			ck_assert_msg(b->offs[0] + b->shape[0] == it->shape[0] || hi % MiB,
				      "test premise: '%s' box %u ends on a grid line", what, i);
		}
	}
}

/* True if two boxes of pl share bytes: the load reads them once (or
 * twice, if a read limit cuts them apart), so bytes_read may be less than
 * bytes_wanted, which counts them per box. */
static bool boxes_overlap(const struct pload *pl)
{
	for (unsigned i = 0; i < pl->n; i++) {
		for (unsigned k = i + 1; k < pl->n; k++) {
			const struct box *a = &pl->box[i], *b = &pl->box[k];
			bool meet = a->item == b->item;

			for (unsigned d = 0; meet && d < items[a->item].ndim; d++)
				meet = a->offs[d] < b->offs[d] + b->shape[d] &&
				       b->offs[d] < a->offs[d] + a->shape[d];
			if (meet)
				return true;
		}
	}
	return false;
}

/* Bit r set if rank r of `world` saved bytes of box b (rows cut as
 * row_part does; the scalar is rank 0's). */
static unsigned box_ranks(const struct box *b, uint32_t world)
{
	const struct item *it = &items[b->item];
	unsigned m = 0;

	if (it->ndim == 0)
		return 1;
	for (uint32_t r = 0; r < world; r++) {
		uint64_t offs[2], shape[2];

		row_part(it, r, world, offs, shape);
		if (b->offs[0] < offs[0] + shape[0] && b->offs[0] + b->shape[0] > offs[0])
			m |= 1u << r;
	}
	return m;
}

/*
 * _i == 0: one rank, killed with SIGKILL after its commit;
 * _i == 1: two ranks that disconnected, so boxes cross from one rank's
 *          image into the other's.
 * Each load of ploads runs first from storage (no client: what the test
 * expects is right without images), then, the shards deleted, through a
 * client: every byte from memory.
 */
START_TEST(test_partial)
{
	static const char *const what[] = { "partial_kill9", "partial_two_ranks" };
	static const unsigned gen = 9;
	uint32_t world = _i ? 2 : 1;
	struct testd t;
	struct td_child ch[2];
	struct rank_args a[2];
	struct ckpt_client *l;
	struct ckpt_load_stats st;
	char path[TD_PATH], msg[1024];
	int rc;

	td_init(&t, what[_i]);
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	for (uint32_t r = 0; r < world; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(&t, 0), .root = t.root, .job = "JP",
					   .name = "ck", .step = 3, .gen = gen, .rank = r,
					   .world = world, .block = world == 1 };
		start_rank(&ch[r], &a[r]);
	}
	if (world == 1) {
		expect_committed(&ch[0], 0);
		kill(ch[0].pid, SIGKILL);
		int s = td_child_wait(&ch[0], 10000);
		ck_assert_msg(s >= 0 && WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL,
			      "the trainer ended with %s, not by SIGKILL", td_status_str(s));
		check_mid(&t, "ck");
	} else {
		for (uint32_t r = 0; r < world; r++) {
			int s = td_child_wait(&ch[r], 90000);

			ck_assert_msg(s >= 0 && WIFEXITED(s) && WEXITSTATUS(s) == 0,
				      "rank %u: %s; it said:\n%s", r, td_status_str(s), ch[r].out);
		}
	}
	for (uint32_t r = 0; r < world; r++)
		json_decref(wait_resident(&t, "JP", "ck", r));
	td_path(path, sizeof(path), "%s/ck", t.root);

	for (size_t k = 0; k < N_PLOADS; k++) {
		const struct pload *pl = &ploads[k];

		rc = load_boxes(path, NULL, items, pl->box, pl->n, expect_gen, &gen, pl->what, &st,
				msg, sizeof(msg));
		ck_assert_msg(rc == 0, "%s, from storage: %d %s", pl->what, rc, msg);
		ck_assert_uint_eq(st.files_resident, 0);
	}
	for (uint32_t r = 0; r < world; r++)
		delete_shard(&t, "ck", r);

	l = connect_ok(&t, "JP", "r2", 0, 1, 0);
	for (size_t k = 0; k < N_PLOADS; k++) {
		const struct pload *pl = &ploads[k];
		uint64_t wanted = 0;
		unsigned ranks = 0;

		for (unsigned i = 0; i < pl->n; i++) {
			wanted += box_bytes(items, &pl->box[i]);
			ranks |= box_ranks(&pl->box[i], world);
		}
		rc = load_boxes(path, l, items, pl->box, pl->n, expect_gen, &gen, pl->what, &st,
				msg, sizeof(msg));
		ck_assert_msg(rc == 0, "%s, from memory: %d %s", pl->what, rc, msg);
		ck_assert_uint_eq(st.bytes_wanted, wanted);
		if (!boxes_overlap(pl))
			ck_assert_uint_ge(st.bytes_read, st.bytes_wanted);
		ck_assert_msg(st.files_resident == (uint32_t)__builtin_popcount(ranks),
			      "%s: %u files from memory, want %d", pl->what, st.files_resident,
			      __builtin_popcount(ranks));
		ck_assert_msg(st.bytes_resident == st.bytes_read,
			      "%s: %llu of %llu bytes from memory", pl->what,
			      (unsigned long long)st.bytes_resident,
			      (unsigned long long)st.bytes_read);
		ck_assert_uint_eq(st.bytes_daemon, 0);
	}
	ckpt_disconnect(l);
	td_fini(&t);
}
END_TEST

/* ---- 12. boxes of an image that is not what storage holds -------------------- */

/*
 * As stale_other_daemon: daemon 0 keeps the image of checkpoint "w" (one
 * f32 tensor w [4096, 1024], 16 MiB, 4 KiB rows), then daemon 1 saves it
 * again at the same path with the same attempt id, so daemon 0 still hands
 * out its image.  The two saves differ in ONE byte, placed relative to
 * the loaded box and the CRC pieces (1 MiB grid of the file) it touches:
 *   - in a piece the box touches but outside the box (just before or
 *     after it, or at the far end of that piece): none of the box's own
 *     bytes differ, so only a check that takes the image's bytes of the
 *     piece outside the runs can see it; the image must be rejected and
 *     storage serve the load;
 *   - inside the box (also in a piece the box shares with bytes outside
 *     it): the load must give storage's byte, never the image's;
 *   - in a piece the box does not touch: the image serves every byte.
 * The image holds the pattern, storage the pattern with the byte changed.
 */

#define W_ROWS 4096
#define W_COLS 1024
#define W_ROW (W_COLS * 4ull)
#define W_BYTES (W_ROWS * W_ROW)
#define W_SEED 4242

static const struct item w_item[] = { { "w", CKPT_F32, 2, { W_ROWS, W_COLS } } };

enum stale_where {
	IN_BOX,          /* a byte of the box (middle row, middle column) */
	LAST_IN_BOX,     /* the box's last byte, in a piece with bytes after it */
	AFTER_IN_PIECE,  /* the byte after the box's last, in the same piece */
	PIECE_END,       /* the last byte of the piece of the box's last byte */
	BEFORE_IN_PIECE, /* the byte before the box's first, in the same piece */
	PIECE_START,     /* the first byte of the piece of the box's first byte */
	NEXT_PIECE,      /* the first byte of the piece after the box's last */
	PREV_PIECE,      /* the last byte of the piece before the box's first */
};

static const struct stale_case {
	const char *name;
	uint64_t rows[2], cols[2]; /* the box: rows [a, b), columns [c, d) of w */
	enum stale_where where;
	bool image;                /* the image serves the whole load */
} stale_cases[] = {
	{ "pstale_after_box", { 0, 1500 }, { 0, W_COLS }, AFTER_IN_PIECE, false },
	{ "pstale_piece_end", { 0, 1500 }, { 0, W_COLS }, PIECE_END, false },
	{ "pstale_before_box", { 1300, 2900 }, { 0, W_COLS }, BEFORE_IN_PIECE, false },
	{ "pstale_piece_start", { 1300, 2900 }, { 0, W_COLS }, PIECE_START, false },
	{ "pstale_in_box", { 0, 1500 }, { 0, W_COLS }, IN_BOX, false },
	{ "pstale_in_one_row", { 1700, 1701 }, { 0, W_COLS }, IN_BOX, false },
	{ "pstale_last_in_box", { 0, 1500 }, { 0, W_COLS }, LAST_IN_BOX, false },
	{ "pstale_next_piece", { 0, 1500 }, { 0, W_COLS }, NEXT_PIECE, true },
	{ "pstale_prev_piece", { 1300, 2900 }, { 0, W_COLS }, PREV_PIECE, true },
	{ "pstale_band_after_box", { 100, 1500 }, { 256, 512 }, AFTER_IN_PIECE, false },
	{ "pstale_band_in_box", { 100, 1500 }, { 256, 512 }, IN_BOX, false },
	{ "pstale_band_next_piece", { 100, 1500 }, { 256, 512 }, NEXT_PIECE, true },
};

#define N_STALE (sizeof(stale_cases) / sizeof(stale_cases[0]))

/* The file offset of the byte the two saves of case sc differ in, w's
 * bytes starting at file offset base; asserts it lies where the case says
 * (the premise of the case). */
static uint64_t stale_offset(const struct stale_case *sc, uint64_t base)
{
	uint64_t first = base + sc->rows[0] * W_ROW + sc->cols[0] * 4;
	uint64_t last = base + (sc->rows[1] - 1) * W_ROW + sc->cols[1] * 4 - 1;
	uint64_t fo = 0;

	switch (sc->where) {
	case IN_BOX:
		fo = base + (sc->rows[0] + sc->rows[1]) / 2 * W_ROW +
		     (sc->cols[0] + sc->cols[1]) / 2 * 4 + 1;
		break;
	case LAST_IN_BOX:
		fo = last;
		ck_assert_msg((last + 1) % MiB, "test premise: the box ends on a grid line");
		break;
	case AFTER_IN_PIECE:
		fo = last + 1;
		ck_assert_msg(fo / MiB == last / MiB, "test premise: the box ends on a grid line");
		break;
	case PIECE_END:
		fo = (last / MiB + 1) * MiB - 1;
		ck_assert_msg(fo > last, "test premise: the box ends on a grid line");
		break;
	case BEFORE_IN_PIECE:
		fo = first - 1;
		ck_assert_msg(first > base && fo / MiB == first / MiB,
			      "test premise: the box starts on a grid line");
		break;
	case PIECE_START:
		fo = first / MiB * MiB;
		ck_assert_msg(fo < first, "test premise: the box starts on a grid line");
		break;
	case NEXT_PIECE:
		fo = (last / MiB + 1) * MiB;
		break;
	case PREV_PIECE:
		fo = first / MiB * MiB - 1;
		break;
	}
	ck_assert_msg(fo >= base && fo < base + W_BYTES, "test premise: byte %llu is not in w",
		      (unsigned long long)fo);
	return fo;
}

/* Saves w (`data`) as root/w at step 1: job J, run r1, rank 0 of 1 on a
 * new client of daemon idx (so both saves have the same attempt id). */
static void save_w(struct testd *t, int idx, uint32_t flags, const void *data)
{
	struct ckpt_client *c = NULL;
	struct ckpt_save *sv = NULL;
	char msg[1024];
	int rc, st = 0, cm = 0;

	rc = connect_rc(td_sock(t, idx), "J", "r1", 0, 1, flags, &c);
	ck_assert_msg(rc == 0, "connect to daemon %d: %d %s", idx, rc, ckpt_last_error());
	ck_assert_int_eq(ckpt_save_begin(c, t->root, "w", 1, &sv), 0);
	td_add(sv, "w", CKPT_F32, 2, w_item[0].shape, data);
	rc = td_commit_wait(sv, WAIT_MS, &st, &cm, msg, sizeof(msg));
	ck_assert_msg(rc == 0 && st == 0 && cm == 0, "save w through daemon %d: %d/%d/%d %s", idx,
		      rc, st, cm, msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
}

static void expect_bytes(void *buf, size_t len, unsigned item, uint64_t off, const void *ctx)
{
	(void)item;
	memcpy(buf, (const unsigned char *)ctx + off, len);
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_seen[8192];

/* Keeps the library's warnings (a log callback: any thread). */
static void keep_warnings(enum ckpt_log_level level, const char *msg, void *ud)
{
	(void)ud;
	if (level > CKPT_LOG_WARNING)
		return;
	pthread_mutex_lock(&log_lock);
	size_t n = strlen(log_seen);
	snprintf(log_seen + n, sizeof(log_seen) - n, "%s\n", msg);
	pthread_mutex_unlock(&log_lock);
}

START_TEST(test_partial_stale)
{
	const struct stale_case *sc = &stale_cases[_i];
	const struct box bx = { 0, { sc->rows[0], sc->cols[0] },
				{ sc->rows[1] - sc->rows[0], sc->cols[1] - sc->cols[0] }, 0 };
	struct testd t;
	struct ckpt_client *l;
	struct ckpt_load_stats st;
	char path[TD_PATH], shard[TD_PATH], first[64], second[64], msg[1024], want[128];
	unsigned char *data = malloc(W_BYTES), b;
	uint64_t base, fo, piece;
	json_t *j, *e;
	int fd, rc;

	ck_assert_ptr_nonnull(data);
	td_fill(data, W_BYTES, W_SEED, 0);
	td_init(&t, sc->name);
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	save_w(&t, 0, CKPT_CONNECT_RESIDENT, data);
	j = wait_resident(&t, "J", "w", 0);
	snprintf(first, sizeof(first), "%s",
		 json_string_value(json_object_get(find_resident(j, "J", "w", 0), "attempt")));
	json_decref(j);
	shard_path(shard, sizeof(shard), &t, "w", 0);
	base = item_begin(shard, "w");
	fo = stale_offset(sc, base);
	/* The piece of the changed byte: the first the check of the image
	 * finds bad (clipped to w's first byte, as pieces are). */
	piece = fo / MiB * MiB > base ? fo / MiB * MiB : base;
	data[fo - base] ^= 0x5A;

	td_path(path, sizeof(path), "%s/w", t.root);
	ck_assert_int_eq(td_rm_rf(path), 0);
	ck_assert_int_eq(td_daemon_start(&t, 1, DAEMON_CONF), 0);
	save_w(&t, 1, 0, data);
	manifest_attempt(&t, "w", second, sizeof(second));
	ck_assert_msg(strcmp(first, second) == 0, "test premise: attempts %s and %s", first,
		      second);
	fd = open(shard, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)fo), 1);
	close(fd);
	ck_assert_msg(b == data[fo - base], "test premise: storage lacks the changed byte");
	ck_assert_uint_eq(item_begin(shard, "w"), base);

	l = connect_ok(&t, "J", "r3", 0, 1, 0);
	log_seen[0] = '\0';
	ckpt_set_log_fn(keep_warnings, NULL);
	rc = load_boxes(path, l, w_item, &bx, 1, expect_bytes, data, sc->name, &st, msg,
			sizeof(msg));
	ckpt_set_log_fn(NULL, NULL);
	ck_assert_msg(rc == 0, "%s: %d %s", sc->name, rc, msg);
	ck_assert_uint_eq(st.bytes_wanted, box_bytes(w_item, &bx));
	ck_assert_uint_ge(st.bytes_read, st.bytes_wanted);
	snprintf(want, sizeof(want), "/rank-00000.safetensors does not match the manifest at "
		 "offset %llu:", (unsigned long long)piece);
	if (sc->image) {
		ck_assert_msg(st.files_resident == 1 && st.bytes_resident == st.bytes_read,
			      "%s: %u files and %llu of %llu bytes from memory, want all", sc->name,
			      st.files_resident, (unsigned long long)st.bytes_resident,
			      (unsigned long long)st.bytes_read);
		ck_assert_msg(!strstr(log_seen, "in-memory copy"), "%s: warned: %s", sc->name,
			      log_seen);
	} else {
		ck_assert_msg(st.files_resident == 0 && st.bytes_resident < st.bytes_read,
			      "%s: the image was used: %u files and %llu of %llu bytes from "
			      "memory", sc->name, st.files_resident,
			      (unsigned long long)st.bytes_resident,
			      (unsigned long long)st.bytes_read);
		ck_assert_msg(strstr(log_seen, "ckptd's in-memory copy of") &&
				      strstr(log_seen, want),
			      "%s: no warning naming the piece at %llu: %s", sc->name,
			      (unsigned long long)piece, log_seen);
	}
	/* Either way daemon 0 handed its image out: the check decided. */
	j = status_json(&t);
	e = find_resident(j, "J", "w", 0);
	ck_assert_msg(e, "the image is gone");
	ck_assert_int_eq(json_integer_value(json_object_get(e, "loads")), 1);
	json_decref(j);
	ckpt_disconnect(l);
	free(data);
	td_fini(&t);
}
END_TEST

static Suite *resident_suite(void)
{
	Suite *s = suite_create("integration_resident");

	td_case(s, "kill9", test_kill9, 60, 0, 1);
	td_case(s, "other_job", test_other_job, 60, 0, 1);
	td_case(s, "newest_only", test_newest_only, 60, 0, 1);
	td_case(s, "two_ranks", test_two_ranks, 60, 0, 1);
	td_case(s, "stale", test_stale, 60, 0, 4);
	td_case(s, "status", test_status, 60, 0, 1);
	td_case(s, "no_flag", test_no_flag, 60, 0, 1);
	td_case(s, "failed_save", test_failed_save, 60, 0, 1);
	td_case(s, "daemon_reads_checked", test_daemon_reads_checked, 60, 0, 2);
	td_case(s, "sealed", test_sealed, 60, 0, 1);
	td_case(s, "partial", test_partial, 120, 0, 2);
	td_case(s, "partial_stale", test_partial_stale, 60, 0, (int)N_STALE);
	return s;
}

int main(void)
{
	return td_main(resident_suite(), "check_resident");
}
