/* SPDX-License-Identifier: MIT */
/*
 * check_multi.c - integration: multi-rank saves.  Every rank is its own
 * process with its own libckpt client; sharded tensors are assembled back
 * from the chunks and compared with the global pattern; replicas other than
 * 0 must not be written; two daemons sharing one root commit one checkpoint.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "store/store.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)

/*
 * The tensors of one rank of a `world`-rank job (world is 8 or 4):
 *   emb.rows    F32  [world*256, 2048]  rows [r*256, +256)           seed 2001
 *   attn.cols   BF16 [384, world*96]    cols [r*96, +96)             seed 2002
 *   grid.3d     I64  [2, (world/2)*5, 6] box at [r/(world/2), (r%(world/2))*5, 0]
 *                                        of shape [1, 5, 6]          seed 2003
 *   shared.bias F32  [333]               replica = r (only 0 written) seed 2004
 *   rank<r>.state U8 [1000 + 37r]                                     seed 3000+r
 *   step_scalar F64  []  (rank 0 only)                                seed 2005
 */
#define N_SHARDED 3
struct item {
	char name[32];
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t gshape[3], offs[3], shape[3];
	uint64_t seed;
	uint32_t replica;
	bool sharded;
};

static unsigned rank_items(uint32_t r, uint32_t world, struct item *it)
{
	uint32_t half = world / 2;
	unsigned n = 0;

	it[n] = (struct item){ .dt = CKPT_F32, .ndim = 2, .seed = 2001, .sharded = true,
			       .gshape = { world * 256ull, 2048 }, .offs = { r * 256ull, 0 },
			       .shape = { 256, 2048 } };
	snprintf(it[n++].name, 32, "emb.rows");
	it[n] = (struct item){ .dt = CKPT_BF16, .ndim = 2, .seed = 2002, .sharded = true,
			       .gshape = { 384, world * 96ull }, .offs = { 0, r * 96ull },
			       .shape = { 384, 96 } };
	snprintf(it[n++].name, 32, "attn.cols");
	it[n] = (struct item){ .dt = CKPT_I64, .ndim = 3, .seed = 2003, .sharded = true,
			       .gshape = { 2, half * 5ull, 6 },
			       .offs = { r / half, (r % half) * 5ull, 0 }, .shape = { 1, 5, 6 } };
	snprintf(it[n++].name, 32, "grid.3d");
	it[n] = (struct item){ .dt = CKPT_F32, .ndim = 1, .seed = 2004, .replica = r,
			       .gshape = { 333 }, .shape = { 333 } };
	snprintf(it[n++].name, 32, "shared.bias");
	it[n] = (struct item){ .dt = CKPT_U8, .ndim = 1, .seed = 3000 + r,
			       .gshape = { 1000 + 37ull * r }, .shape = { 1000 + 37ull * r } };
	snprintf(it[n++].name, 32, "rank%u.state", r);
	if (r == 0) {
		it[n] = (struct item){ .dt = CKPT_F64, .ndim = 0, .seed = 2005 };
		snprintf(it[n++].name, 32, "step_scalar");
	}
	return n;
}

struct rank_args {
	const char *sock;
	const char *root;
	const char *job;
	const char *name;
	uint32_t rank, world;
};

/* One rank: builds its items, saves, reports "committed RC MSG". */
static int rank_main(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	struct item it[8];
	void *bufs[8] = { 0 };
	unsigned n = rank_items(a->rank, a->world, it);
	struct ckpt_client *c = NULL;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	int rc, st, cm;

	(void)go;
	for (unsigned i = 0; i < n; i++) {
		size_t es = td_dtype_size(it[i].dt);
		uint64_t nb = td_nbytes(es, it[i].ndim, it[i].shape);

		bufs[i] = malloc(nb ? nb : 1);
		if (!bufs[i])
			return 10;
		td_fill_chunk(bufs[i], es, it[i].ndim, it[i].gshape, it[i].offs, it[i].shape,
			      it[i].seed);
	}
	rc = td_connect_rc(a->sock, a->job, a->rank, a->world, 32 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "committed %d connect: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 200, &s);
	if (rc < 0) {
		td_report(rep, "committed %d begin: %s", rc, ckpt_last_error());
		return 12;
	}
	if (a->rank == 0) {
		ckpt_save_set_metadata(s, "run", "multi");
		ckpt_save_set_metric(s, "loss", 0.5);
	}
	for (unsigned i = 0; i < n; i++) {
		struct ckpt_tensor tn = {
			CKPT_TENSOR_INIT, .name = it[i].name, .dtype = it[i].dt, .ndim = it[i].ndim,
			.shape = it[i].shape, .data = bufs[i], .device = CKPT_DEVICE_HOST,
			.global_shape = it[i].sharded ? it[i].gshape : NULL,
			.offsets = it[i].sharded ? it[i].offs : NULL,
			.replica = it[i].replica,
		};

		rc = ckpt_save_add_tensor(s, &tn);
		if (rc < 0) {
			td_report(rep, "committed %d add %s: %s", rc, it[i].name, ckpt_last_error());
			return 13;
		}
	}
	rc = ckpt_save_commit(s, &fs, &fc);
	if (rc < 0) {
		td_report(rep, "committed %d commit: %s", rc, ckpt_last_error());
		return 14;
	}
	st = td_future_wait(fs, 90000);
	td_report(rep, "staged %d %s", st, ckpt_future_error(fs));
	cm = td_future_wait(fc, 90000);
	td_report(rep, "committed %d %s", cm, ckpt_future_error(fc));
	ckpt_save_free(s);
	ckpt_disconnect(c);
	for (unsigned i = 0; i < n; i++)
		free(bufs[i]);
	return st == 0 && cm == 0 ? 0 : 1;
}

/*
 * Runs `world` ranks; rank r connects to socks[r]; asserts all commit.
 * Ranks whose bit is set in `late` start only once every other rank has
 * reported its shard staged (so the others wait for them).
 */
static void run_ranks(const char *root, const char *const *socks, uint32_t world, const char *job,
		      const char *name, unsigned late)
{
	struct td_child ch[8];
	struct rank_args a[8];
	char line[1024];

	ck_assert(world <= 8);
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t r = 0; r < world; r++) {
			if (((late >> r) & 1u) != (unsigned)pass)
				continue;
			a[r] = (struct rank_args){ .sock = socks[r], .root = root, .job = job,
						   .name = name, .rank = r, .world = world };
			ck_assert_int_eq(td_child_start(&ch[r], rank_main, &a[r]), 0);
		}
		if (pass == 1 || !late)
			break;
		for (uint32_t r = 0; r < world; r++) {
			if ((late >> r) & 1u)
				continue;
			ck_assert_msg(td_child_expect(&ch[r], "staged", 60000, line,
						      sizeof(line)) == 0 &&
					      strncmp(line, "0", 1) == 0,
				      "rank %u did not stage: %s", r, ch[r].out);
		}
		/* the early ranks must still be waiting for the late ones */
		for (uint32_t r = 0; r < world; r++) {
			if ((late >> r) & 1u)
				continue;
			ck_assert_msg(td_child_expect(&ch[r], "committed", 200, line,
						      sizeof(line)) == -ETIMEDOUT,
				      "rank %u finished before the late ranks began: %s", r,
				      ch[r].out);
		}
	}
	for (uint32_t r = 0; r < world; r++) {
		int rc = td_child_expect(&ch[r], "committed", 120000, line, sizeof(line));

		ck_assert_msg(rc == 0, "rank %u: no committed result (%d); it said:\n%s", r, rc,
			      ch[r].out);
		ck_assert_msg(strncmp(line, "0 ", 2) == 0 || strcmp(line, "0") == 0,
			      "rank %u: committed future: %s\n(all it said: %s)", r, line,
			      ch[r].out);
	}
	for (uint32_t r = 0; r < world; r++) {
		int st = td_child_wait(&ch[r], 30000);

		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
}

/* The file of rank k as the manifest names it (S3 tags shard names with the
 * attempt). */
static void shard_path(const char *manifest, uint32_t k, char *buf, size_t len)
{
	json_error_t je;
	json_t *j = json_load_file(manifest, 0, &je);
	json_t *f = json_array_get(json_object_get(j, "files"), k);

	ck_assert_msg(j != NULL, "%s: %s", manifest, je.text);
	ck_assert_int_eq(json_integer_value(json_object_get(f, "rank")), k);
	ck_assert_ptr_nonnull(json_string_value(json_object_get(f, "path")));
	snprintf(buf, len, "%s", json_string_value(json_object_get(f, "path")));
	json_decref(j);
}

/* Reads every global tensor back and compares; runs st_verify over the
 * shard files.  `root` holds checkpoint `name` (a local copy of an S3 one
 * in the S3 cases, which check their work areas themselves). */
static void verify_multi(struct testd *t, const char *root, const char *name, uint32_t world)
{
	struct ckpt_reader *r = NULL;
	struct td_spec *sp = td_spec_new();
	struct item it[8];
	char p[TD_PATH], file[128], man[TD_PATH];
	size_t want_tensors = 0;
	int rc;

	td_path(man, sizeof(man), "%s/%s/manifest.json", root, name);
	ck_assert_msg(td_exists(man), "%s is missing", man);
	ck_assert_msg(td_wait_count(root, STORE_WORK_PREFIX, 0, 10000), "a .partial dir is left");
	td_path(p, sizeof(p), "%s/%s", root, name);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "reader_open(%s) = %d: %s", p, rc, ckpt_last_error());
	ck_assert_uint_eq(ckpt_reader_world(r), world);
	ck_assert_uint_eq(ckpt_reader_step(r), 200);

	for (uint32_t k = 0; k < world; k++) {
		unsigned n = rank_items(k, world, it);

		shard_path(man, k, file, sizeof(file));
		if (!strcmp(root, t->root))
			ck_assert_msg(!strcmp(file, td_path(p, sizeof(p), "rank-%05u.safetensors", k)),
				      "local shard named '%s'", file);
		td_path(p, sizeof(p), "%s/%s/%s", root, name, file);
		ck_assert_msg(td_exists(p), "%s is missing", p);
		for (unsigned i = 0; i < n; i++) {
			if (it[i].replica != 0)
				continue; /* not written */
			td_spec_add(sp, file, it[i].name, it[i].dt, it[i].ndim, it[i].shape,
				    it[i].gshape, it[i].offs, it[i].seed);
			/* Each global tensor once: from its chunk at offset 0. */
			if (it[i].sharded) {
				bool first = true;

				for (unsigned d = 0; d < it[i].ndim; d++)
					first = first && it[i].offs[d] == 0;
				if (!first)
					continue;
			}
			want_tensors++;
			ck_assert_msg(td_verify_tensor(r, it[i].name, it[i].dt, it[i].ndim,
						       it[i].gshape, it[i].seed),
				      "global tensor %s does not read back (see above)",
				      it[i].name);
		}
	}
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), want_tensors);
	ckpt_reader_close(r);
	td_path(p, sizeof(p), "%s/%s", root, name);
	ck_assert_msg(td_st_verify(t, p, sp) >= 0, "safetensors disagrees (see above)");
	td_spec_free(sp);
}

/* ---- 2. eight ranks, one daemon ------------------------------------------------- */

START_TEST(test_eight_ranks)
{
	struct testd t;
	const char *socks[8];
	char p[TD_PATH], *text = NULL;
	json_t *j;
	json_error_t je;

	td_init(&t, "eight_ranks");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\ncommit_deadline = 90s\n"), 0);
	for (int r = 0; r < 8; r++)
		socks[r] = td_sock(&t, 0);
	run_ranks(t.root, socks, 8, "job2", "eight", 0);
	verify_multi(&t, t.root, "eight", 8);

	/* one manifest, eight files listed, rank 0's metadata */
	td_path(p, sizeof(p), "%s/eight/manifest.json", t.root);
	ck_assert_int_eq(td_read_file(p, 64 * MiB, &text, NULL), 0);
	j = json_loads(text, 0, &je);
	ck_assert_msg(j != NULL, "manifest.json: %s", je.text);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "world_size")), 8);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "files")), 8);
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "metadata"), "run")),
			 "multi");
	/* the replicated tensor has exactly one chunk */
	ck_assert_uint_eq(json_array_size(json_object_get(
				  json_object_get(json_object_get(j, "tensors"), "shared.bias"),
				  "chunks")),
			  1);
	ck_assert_uint_eq(json_array_size(json_object_get(
				  json_object_get(json_object_get(j, "tensors"), "emb.rows"),
				  "chunks")),
			  8);
	json_decref(j);
	free(text);
	ck_assert_int_eq(td_count_entries(t.root, ""), 1);
	td_fini(&t);
}
END_TEST

/* ---- 12. two daemons sharing one root ---------------------------------------------- */

START_TEST(test_two_daemons)
{
	/* _i: 0 all ranks at once; 1 daemon B's ranks (2, 3) come late, so
	 * A waits for B's shards; 2 daemon A's ranks (0, 1) come late, so B's
	 * ranks wait for A's commit. */
	static const unsigned late[3] = { 0, 0xc, 0x3 };
	struct testd t;
	const char *socks[4];

	td_init(&t, _i == 0 ? "two_daemons" : _i == 1 ? "two_daemons_b_late" : "two_daemons_a_late");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\ncommit_deadline = 90s\n"), 0);
	ck_assert_int_eq(td_daemon_start(&t, 1, "arena_max = 64M\ncommit_deadline = 90s\n"), 0);
	socks[0] = socks[1] = td_sock(&t, 0);
	socks[2] = socks[3] = td_sock(&t, 1);
	run_ranks(t.root, socks, 4, "job12", "shared", late[_i]);
	verify_multi(&t, t.root, "shared", 4);
	ck_assert_int_eq(td_count_entries(t.root, ""), 1);
	td_fini(&t);
}
END_TEST

/* ---- two runs saving the same attempt through two daemons --------------------------- */

/*
 * Two runs of one job without a run id (the documented case: they look like
 * one attempt) save the same name and step through two daemons sharing the
 * root.  Run A's ranks 0 and 1 go to daemon 0, run B's rank 0 to daemon 1.
 * Whichever daemon creates rank 0's shard first coordinates; the other one's
 * rank 0 is refused ("already being saved") and its failure cleanup must
 * delete nothing of the winner's: the winner commits, and what it committed
 * stays complete.  Each rank saves one tensor of its run's own bytes.
 *
 * _i: 0 daemon 0 made the work area, B's refusal and cleanup finish before
 *       A's last rank comes (the cleanup once removed the area under A);
 *     1 daemon 1 made the area (held at its "shard" gate until A took rank
 *       0), so the loser is the area's creator;
 *     2 the loser's cleanup is held until A has committed, then runs over
 *       the committed checkpoint (once: committed, then emptied).
 * Gates: CKPTD_TEST_GATE (daemon/testgate.h).
 */
#define DUP_BYTES (96u * 1024u)

struct dup_args {
	const char *sock, *root, *job, *name;
	uint32_t rank, world;
	uint64_t seed;
};

static int dup_rank_main(void *arg, int rep, int go)
{
	const struct dup_args *a = arg;
	uint64_t shape[1] = { DUP_BYTES };
	struct ckpt_client *c = NULL;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	char tname[32];
	uint8_t *buf = malloc(DUP_BYTES);
	int rc, st, cm;

	(void)go;
	if (!buf)
		return 10;
	/* No run id: both runs are the same attempt. */
	unsetenv("CKPT_RUN_ID");
	unsetenv("TORCHELASTIC_RUN_ID");
	unsetenv("SLURM_JOB_ID");
	td_fill(buf, DUP_BYTES, a->seed, 0);
	rc = td_connect_rc(a->sock, a->job, a->rank, a->world, 16 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "committed %d connect: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 200, &s);
	if (rc < 0) {
		td_report(rep, "committed %d begin: %s", rc, ckpt_last_error());
		return 12;
	}
	snprintf(tname, sizeof(tname), "w%u", a->rank);
	struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = tname, .dtype = CKPT_U8, .ndim = 1,
				  .shape = shape, .data = buf, .device = CKPT_DEVICE_HOST };
	rc = ckpt_save_add_tensor(s, &tn);
	if (rc == 0)
		rc = ckpt_save_commit(s, &fs, &fc);
	if (rc < 0) {
		td_report(rep, "committed %d commit: %s", rc, ckpt_last_error());
		return 13;
	}
	st = td_future_wait(fs, 120000);
	td_report(rep, "staged %d %s", st, ckpt_future_error(fs));
	cm = td_future_wait(fc, 120000);
	td_report(rep, "committed %d %s", cm, ckpt_future_error(fc));
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(buf);
	return 0;
}

/* Whether daemon idx shows no client and no save of `job` (a failed save's
 * ranks stay until its cleanup has run: then its closed client goes too). */
static bool dup_idle(struct testd *t, int idx, const char *job)
{
	char *out = NULL;
	bool idle = false;
	json_t *st;

	if (td_ckptctl(&out, "-s", td_sock(t, idx), "status", "--json", NULL) != 0) {
		free(out);
		return false;
	}
	st = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
	free(out);
	if (st) {
		json_t *cl = json_object_get(st, "clients"), *sv = json_object_get(st, "saves");
		idle = true;
		for (size_t i = 0; i < json_array_size(cl); i++) {
			const char *cj = json_string_value(json_object_get(json_array_get(cl, i),
									   "job"));
			idle &= !cj || strcmp(cj, job) != 0;
		}
		idle &= json_array_size(sv) == 0;
	}
	json_decref(st);
	return idle;
}

static void dup_wait_idle(struct testd *t, int idx, const char *job)
{
	int64_t until = td_now_ms() + 60000;

	while (!dup_idle(t, idx, job)) {
		ck_assert_msg(td_now_ms() < until, "daemon %d still busy with job '%s'", idx, job);
		td_sleep_ms(50);
	}
}

/* The committed future's line of child c ("RC MSG"). */
static void dup_result(struct td_child *c, char *line, size_t len)
{
	int rc = td_child_expect(c, "committed", 150000, line, len);

	ck_assert_msg(rc == 0, "no committed result (%d); it said:\n%s", rc, c->out);
}

/* Reads checkpoint root/name back: both ranks' tensors are run A's. */
static void dup_verify(struct testd *t, const char *root, const char *name)
{
	struct ckpt_reader *r = NULL;
	uint64_t g[1] = { DUP_BYTES };
	char p[TD_PATH], *out = NULL;
	int rc;

	td_path(p, sizeof(p), "%s/%s", root, name);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "reader_open(%s) = %d: %s", p, rc, ckpt_last_error());
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), 2);
	ck_assert_msg(td_verify_tensor(r, "w0", CKPT_U8, 1, g, 7100), "w0 is not run A's");
	ck_assert_msg(td_verify_tensor(r, "w1", CKPT_U8, 1, g, 7101), "w1 is not run A's");
	ckpt_reader_close(r);
	rc = td_ckptctl(&out, "verify", p, NULL);
	ck_assert_msg(rc == 0, "ckptctl verify %s: %s\n%s", p, td_status_str(rc), out ? out : "");
	free(out);
	(void)t;
}

/* One scenario (see above) on `root` (t->root, or an S3 root: then the
 * daemons' config `conf` names it). */
static void dup_run(struct testd *t, int scenario, const char *root, const char *conf)
{
	struct td_child a0, a1, b0;
	struct dup_args aa0, aa1, ab0;
	char g0[TD_PATH], g1[TD_PATH], hold[TD_PATH], waiting[TD_PATH], line[1024];
	char area[TD_PATH], shard0[TD_PATH], areas[TD_PATH], id[STORE_ID_LEN + 1];
	struct store_key k = { .step = 200, .attempt = 0, .world = 2 };
	bool local = !strncmp(root, "/", 1);

	snprintf(k.job, sizeof(k.job), "dupjob");
	snprintf(k.name, sizeof(k.name), "ck");
	store_key_id(&k, id);
	td_path(area, sizeof(area), "%s/%s%s", root, STORE_WORK_PREFIX, id);
	td_path(shard0, sizeof(shard0), "%s/rank-00000.safetensors", area);
	td_path(g0, sizeof(g0), "%s/gate0", t->dir);
	td_path(g1, sizeof(g1), "%s/gate1", t->dir);
	ck_assert_int_eq(mkdir(g0, 0777), 0);
	ck_assert_int_eq(mkdir(g1, 0777), 0);
	setenv("CKPTD_TEST_GATE", g0, 1);
	ck_assert_int_eq(td_daemon_start(t, 0, conf), 0);
	setenv("CKPTD_TEST_GATE", g1, 1);
	ck_assert_int_eq(td_daemon_start(t, 1, conf), 0);
	unsetenv("CKPTD_TEST_GATE");

	aa0 = (struct dup_args){ td_sock(t, 0), root, "dupjob", "ck", 0, 2, 7100 };
	aa1 = (struct dup_args){ td_sock(t, 0), root, "dupjob", "ck", 1, 2, 7101 };
	ab0 = (struct dup_args){ td_sock(t, 1), root, "dupjob", "ck", 0, 2, 8100 };

	if (scenario == 1) {
		/* Daemon 1 makes the area and is held before its shard. */
		td_path(hold, sizeof(hold), "%s/shard.hold", g1);
		td_path(waiting, sizeof(waiting), "%s/shard.waiting", g1);
		ck_assert_int_eq(td_write_file(hold, ""), 0);
		ck_assert_int_eq(td_child_start(&b0, dup_rank_main, &ab0), 0);
		ck_assert_msg(td_wait_exists(waiting, true, 60000), "daemon 1 never reached its gate");
		ck_assert(!local || td_exists(area));
		ck_assert_int_eq(td_child_start(&a0, dup_rank_main, &aa0), 0);
		ck_assert_msg(td_child_expect(&a0, "staged", 60000, line, sizeof(line)) == 0 &&
				      line[0] == '0',
			      "run A's rank 0 did not stage: %s", a0.out);
		ck_assert_int_eq(unlink(hold), 0);
	} else {
		ck_assert_int_eq(td_child_start(&a0, dup_rank_main, &aa0), 0);
		ck_assert_msg(td_child_expect(&a0, "staged", 60000, line, sizeof(line)) == 0 &&
				      line[0] == '0',
			      "run A's rank 0 did not stage: %s", a0.out);
		if (scenario == 2) {
			td_path(hold, sizeof(hold), "%s/cleanup.hold", g1);
			td_path(waiting, sizeof(waiting), "%s/cleanup.waiting", g1);
			ck_assert_int_eq(td_write_file(hold, ""), 0);
		}
		ck_assert_int_eq(td_child_start(&b0, dup_rank_main, &ab0), 0);
	}
	/* Run B's rank 0 is refused: rank 0 of the attempt is taken. */
	dup_result(&b0, line, sizeof(line));
	ck_assert_msg(strncmp(line, "0", 1) != 0 && strstr(line, "already being saved"),
		      "run B's rank 0 was not refused as a duplicate: %s", line);
	if (scenario == 2) {
		/* Held at the gate; a daemon without gates (8073602) has run
		 * its cleanup by the time it is idle: the shard must be there
		 * either way. */
		int64_t until = td_now_ms() + 60000;

		while (!td_exists(waiting) && !dup_idle(t, 1, "dupjob") && td_now_ms() < until)
			td_sleep_ms(50);
		ck_assert_msg(!local || td_exists(shard0),
			      "daemon 1's cleanup removed run A's shard");
		ck_assert_msg(td_exists(waiting), "daemon 1's cleanup never reached its gate");
	} else {
		/* Its cleanup has run before run A goes on. */
		ck_assert_int_eq(td_child_wait(&b0, 30000), 0);
		dup_wait_idle(t, 1, "dupjob");
	}
	ck_assert(!local || td_exists(shard0));
	ck_assert_int_eq(td_child_start(&a1, dup_rank_main, &aa1), 0);
	dup_result(&a0, line, sizeof(line));
	ck_assert_msg(strcmp(line, "0") == 0 || strncmp(line, "0 ", 2) == 0,
		      "run A's rank 0 did not commit: %s\n(all: %s)", line, a0.out);
	dup_result(&a1, line, sizeof(line));
	ck_assert_msg(strcmp(line, "0") == 0 || strncmp(line, "0 ", 2) == 0,
		      "run A's rank 1 did not commit: %s", line);
	if (scenario == 2) {
		/* Now the loser's cleanup runs, after the commit. */
		ck_assert_int_eq(unlink(hold), 0);
		ck_assert_int_eq(td_child_wait(&b0, 30000), 0);
		dup_wait_idle(t, 1, "dupjob");
	}
	ck_assert_int_eq(td_child_wait(&a0, 30000), 0);
	ck_assert_int_eq(td_child_wait(&a1, 30000), 0);
	dup_wait_idle(t, 0, "dupjob");
	dup_verify(t, root, "ck");
	/* The loser keeps no note of the area (it is the coordinator's), so a
	 * new life of it has nothing to sweep: still nothing goes. */
	td_path(areas, sizeof(areas), "%s/state-1/areas", t->dir);
	ck_assert_msg(td_count_entries(areas, "") == 0, "daemon 1 still notes a work area");
	ck_assert_int_eq(td_daemon_stop(t, 1), 0);
	ck_assert_int_eq(td_daemon_start(t, 1, conf), 0);
	dup_wait_idle(t, 1, "dupjob");
	dup_verify(t, root, "ck");
	if (local)
		ck_assert_int_eq(td_count_entries(root, ""), 1);
}

START_TEST(test_dup_attempt)
{
	static const char *names[3] = { "dup_winner_made", "dup_loser_made", "dup_cleanup_late" };
	struct testd t;

	td_init(&t, names[_i]);
	dup_run(&t, _i, t.root, "arena_max = 64M\ncommit_deadline = 150s\n");
	td_fini(&t);
}
END_TEST

/* The work area is removed (renamed away) and another one made under its
 * name while the coordinator is about to commit: the commit must not put
 * that other directory in place as the checkpoint. */
START_TEST(test_workarea_swapped)
{
	struct testd t;
	struct td_child a0;
	struct dup_args aa0;
	char g0[TD_PATH], hold[TD_PATH], waiting[TD_PATH], line[1024], area[TD_PATH];
	char moved[TD_PATH], ck[TD_PATH], id[STORE_ID_LEN + 1];
	struct store_key k = { .step = 200, .attempt = 0, .world = 1 };

	td_init(&t, "workarea_swapped");
	snprintf(k.job, sizeof(k.job), "dupjob");
	snprintf(k.name, sizeof(k.name), "ck");
	store_key_id(&k, id);
	td_path(area, sizeof(area), "%s/%s%s", t.root, STORE_WORK_PREFIX, id);
	td_path(moved, sizeof(moved), "%s/moved-away", t.dir);
	td_path(ck, sizeof(ck), "%s/ck", t.root);
	td_path(g0, sizeof(g0), "%s/gate0", t.dir);
	ck_assert_int_eq(mkdir(g0, 0777), 0);
	td_path(hold, sizeof(hold), "%s/commit.hold", g0);
	td_path(waiting, sizeof(waiting), "%s/commit.waiting", g0);
	ck_assert_int_eq(td_write_file(hold, ""), 0);
	setenv("CKPTD_TEST_GATE", g0, 1);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\ncommit_deadline = 150s\n"), 0);
	unsetenv("CKPTD_TEST_GATE");
	aa0 = (struct dup_args){ td_sock(&t, 0), t.root, "dupjob", "ck", 0, 1, 7100 };
	ck_assert_int_eq(td_child_start(&a0, dup_rank_main, &aa0), 0);
	ck_assert_msg(td_wait_exists(waiting, true, 60000), "the commit never reached its gate");
	ck_assert_int_eq(rename(area, moved), 0);
	ck_assert_int_eq(mkdir(area, 0755), 0);
	ck_assert_int_eq(unlink(hold), 0);
	dup_result(&a0, line, sizeof(line));
	ck_assert_msg(line[0] == '-' && strstr(line, "made again"),
		      "the commit did not notice the swap: %s", line);
	ck_assert_int_eq(td_child_wait(&a0, 30000), 0);
	ck_assert_msg(!td_exists(ck), "another directory was put in place as the checkpoint");
	ck_assert_msg(td_exists(area), "the other directory was not put back");
	ck_assert_int_eq(rmdir(area), 0);
	ck_assert_int_eq(td_rm_rf(moved), 0);
	td_fini(&t);
}
END_TEST

/* The same on S3 (run by tests/integration/s3.sh with moto, as "s3"). */
START_TEST(test_s3_dup_attempt)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT"), *ep = getenv("S3_ENDPOINT");
	char root[1024], conf[2048];
	struct testd t;

	if (!base || !ep) {
		td_skip("s3_dup", "no S3 server: tests/integration/s3.sh runs these with moto");
		return;
	}
	td_init(&t, "s3_dup");
	snprintf(root, sizeof(root), "%s/dup-%d-%d", base, _i, (int)getpid());
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 150s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_backoff_base = 20ms\n", root, ep);
	dup_run(&t, _i, root, conf);
	td_fini(&t);
}
END_TEST

/* ---- the same through S3 ------------------------------------------------------------ */

/*
 * Run by tests/integration/s3.sh, which starts moto (signatures checked)
 * and sets S3_ENDPOINT, the AWS_* credentials and CKPT_TEST_S3_ROOT (a
 * prefix of its own, with odd characters in it); without it they SKIP.
 * _i: 0 two ranks, 1 eight ranks on one daemon, 2 four ranks on two
 * daemons that share nothing but the bucket, 3 the same with daemon B's
 * ranks late.  Each checkpoint is copied out with boto3 and read back with
 * the local reader and safetensors; no work area or open upload may be
 * left.
 */
START_TEST(test_s3_ranks)
{
	static const uint32_t worlds[4] = { 2, 8, 4, 4 };
	static const unsigned lates[4] = { 0, 0, 0, 0xc };
	const char *base = getenv("CKPT_TEST_S3_ROOT"), *ep = getenv("S3_ENDPOINT");
	const char *py = getenv("CKPT_TEST_PYTHON");
	uint32_t world = worlds[_i];
	char root[1024], conf[2048], name[32], fetched[TD_PATH], tool[TD_PATH];
	char *out = NULL;
	const char *socks[8];
	struct testd t;
	int st;

	if (!base || !ep || !py || !*py) {
		td_skip("s3", "no S3 server: tests/integration/s3.sh runs these with moto");
		return;
	}
	td_init(&t, "s3_ranks");
	snprintf(root, sizeof(root), "%s/multi-%d-%d", base, _i, (int)getpid());
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 90s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_backoff_base = 20ms\n", root, ep);
	ck_assert_int_eq(td_daemon_start(&t, 0, conf), 0);
	if (_i >= 2)
		ck_assert_int_eq(td_daemon_start(&t, 1, conf), 0);
	for (uint32_t r = 0; r < world; r++)
		socks[r] = td_sock(&t, _i >= 2 && r >= world / 2 ? 1 : 0);
	snprintf(name, sizeof(name), "s3-%u", world);
	run_ranks(root, socks, world, "jobs3", name, lates[_i]);

	td_path(fetched, sizeof(fetched), "%s/fetched", t.dir);
	td_path(tool, sizeof(tool), "%s/tests/tools/s3_fetch.py", td_src_dir());
	char *argv[] = { (char *)py, tool, root, name, fetched, NULL };
	st = td_run_capture(argv, 120000, &out);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "s3_fetch: %s: %s",
		      td_status_str(st), out ? out : "");
	char want[128];
	snprintf(want, sizeof(want), "objects=%u ", world + 1);
	ck_assert_msg(strstr(out, want) && strstr(out, "work_areas=0") && strstr(out, "uploads=0"),
		      "after the commit S3 holds: %s (want %sand no work area or upload)", out,
		      want);
	free(out);
	verify_multi(&t, fetched, name, world);
	td_fini(&t);
}
END_TEST

/*
 * Review repro (S3): two runs of one attempt (world 1, no run id) on two
 * daemons.  Daemon 1 joins the work area while daemon 0's commit is held;
 * daemon 0 commits (its cleanup of the area deletes the rank markers), and
 * only then does daemon 1 create its rank 0 shard.  Nothing may overwrite
 * the committed shard: run A's checkpoint must still read as run A's, and
 * run B must not be told committed.
 */
START_TEST(test_s3_late_shard)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT"), *ep = getenv("S3_ENDPOINT");
	char root[1024], conf[2048], g0[TD_PATH], g1[TD_PATH], h0[TD_PATH], w0[TD_PATH];
	char h1[TD_PATH], w1[TD_PATH], line[1024], p[1100], *out = NULL;
	struct td_child a0, b0;
	struct dup_args aa0, ab0;
	struct ckpt_reader *r = NULL;
	uint64_t g[1] = { DUP_BYTES };
	struct testd t;
	int rc;

	if (!base || !ep) {
		td_skip("s3_late", "no S3 server: tests/integration/s3.sh runs these with moto");
		return;
	}
	td_init(&t, "s3_late_shard");
	snprintf(root, sizeof(root), "%s/late-%d", base, (int)getpid());
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 150s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_backoff_base = 20ms\n", root, ep);
	td_path(g0, sizeof(g0), "%s/gate0", t.dir);
	td_path(g1, sizeof(g1), "%s/gate1", t.dir);
	ck_assert_int_eq(mkdir(g0, 0777), 0);
	ck_assert_int_eq(mkdir(g1, 0777), 0);
	td_path(h0, sizeof(h0), "%s/commit.hold", g0);
	td_path(w0, sizeof(w0), "%s/commit.waiting", g0);
	td_path(h1, sizeof(h1), "%s/shard.hold", g1);
	td_path(w1, sizeof(w1), "%s/shard.waiting", g1);
	ck_assert_int_eq(td_write_file(h0, ""), 0);
	ck_assert_int_eq(td_write_file(h1, ""), 0);
	setenv("CKPTD_TEST_GATE", g0, 1);
	ck_assert_int_eq(td_daemon_start(&t, 0, conf), 0);
	setenv("CKPTD_TEST_GATE", g1, 1);
	ck_assert_int_eq(td_daemon_start(&t, 1, conf), 0);
	unsetenv("CKPTD_TEST_GATE");
	aa0 = (struct dup_args){ td_sock(&t, 0), root, "latejob", "ck", 0, 1, 7100 };
	ab0 = (struct dup_args){ td_sock(&t, 1), root, "latejob", "ck", 0, 1, 8100 };

	/* Run A reaches its commit; run B joins the area and waits before its
	 * shard. */
	ck_assert_int_eq(td_child_start(&a0, dup_rank_main, &aa0), 0);
	ck_assert_msg(td_wait_exists(w0, true, 60000), "daemon 0 never reached its commit");
	ck_assert_int_eq(td_child_start(&b0, dup_rank_main, &ab0), 0);
	ck_assert_msg(td_wait_exists(w1, true, 60000), "daemon 1 never reached its shard");
	/* Run A commits. */
	ck_assert_int_eq(unlink(h0), 0);
	dup_result(&a0, line, sizeof(line));
	ck_assert_msg(strcmp(line, "0") == 0 || strncmp(line, "0 ", 2) == 0,
		      "run A did not commit: %s", line);
	ck_assert_int_eq(td_child_wait(&a0, 30000), 0);
	/* Then run B's shard. */
	ck_assert_int_eq(unlink(h1), 0);
	dup_result(&b0, line, sizeof(line));
	printf("s3_late_shard: run B was told: %s\n", line);
	ck_assert_int_eq(td_child_wait(&b0, 30000), 0);
	dup_wait_idle(&t, 1, "latejob");

	snprintf(p, sizeof(p), "%s/ck", root);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "reader_open(%s) = %d: %s", p, rc, ckpt_last_error());
	ck_assert_msg(td_verify_tensor(r, "w0", CKPT_U8, 1, g, 7100),
		      "run A's committed checkpoint no longer holds run A's bytes (run B was "
		      "told: %s)", line);
	ckpt_reader_close(r);
	rc = td_ckptctl(&out, "verify", p, NULL);
	ck_assert_msg(rc == 0, "ckptctl verify %s: %s\n%s", p, td_status_str(rc), out ? out : "");
	free(out);
	ck_assert_msg(line[0] == '-', "run B was told committed: %s", line);
	td_fini(&t);
}
END_TEST

/*
 * Review repro (local): daemon 1 makes the work area and delivers rank 1;
 * daemon 0 holds rank 0, claims the area and is about to commit (held at its
 * "commit" gate, after its count found both ranks).  Daemon 1 is restarted:
 * its registry still notes the area (it made it and had delivered), and
 * its next life's start-up sweep must not remove an area another daemon
 * claimed and is committing.
 */
START_TEST(test_creator_restart)
{
	struct testd t;
	struct td_child a0, a1;
	struct dup_args aa0, aa1;
	char g0[TD_PATH], hold[TD_PATH], waiting[TD_PATH], line[1024], area[TD_PATH];
	char id[STORE_ID_LEN + 1];
	struct store_key k = { .step = 200, .attempt = 0, .world = 2 };
	const char *conf = "arena_max = 64M\ncommit_deadline = 150s\n";

	td_init(&t, "creator_restart");
	snprintf(k.job, sizeof(k.job), "crjob");
	snprintf(k.name, sizeof(k.name), "ck");
	store_key_id(&k, id);
	td_path(area, sizeof(area), "%s/%s%s", t.root, STORE_WORK_PREFIX, id);
	td_path(g0, sizeof(g0), "%s/gate0", t.dir);
	ck_assert_int_eq(mkdir(g0, 0777), 0);
	td_path(hold, sizeof(hold), "%s/commit.hold", g0);
	td_path(waiting, sizeof(waiting), "%s/commit.waiting", g0);
	ck_assert_int_eq(td_write_file(hold, ""), 0);
	setenv("CKPTD_TEST_GATE", g0, 1);
	ck_assert_int_eq(td_daemon_start(&t, 0, conf), 0);
	unsetenv("CKPTD_TEST_GATE");
	ck_assert_int_eq(td_daemon_start(&t, 1, conf), 0);
	aa0 = (struct dup_args){ td_sock(&t, 0), t.root, "crjob", "ck", 0, 2, 7100 };
	aa1 = (struct dup_args){ td_sock(&t, 1), t.root, "crjob", "ck", 1, 2, 7101 };
	ck_assert_int_eq(td_child_start(&a1, dup_rank_main, &aa1), 0);
	ck_assert_msg(td_child_expect(&a1, "staged", 60000, line, sizeof(line)) == 0 &&
			      line[0] == '0', "rank 1 did not stage: %s", a1.out);
	ck_assert(td_exists(area));
	ck_assert_int_eq(td_child_start(&a0, dup_rank_main, &aa0), 0);
	ck_assert_msg(td_wait_exists(waiting, true, 60000), "daemon 0 never reached its commit");
	/* Daemon 1 dies (a graceful stop waits for daemon 0's commit) and
	 * starts again while daemon 0 commits. */
	td_daemon_kill(&t, 1);
	ck_assert_int_eq(td_daemon_start(&t, 1, conf), 0);
	/* Its start-up sweep (on a worker) judges the area it noted: it must
	 * leave it to the daemon that claimed it. */
	{
		char *log = malloc(1 << 20);
		int64_t until = td_now_ms() + 60000;
		bool said = false;

		ck_assert_ptr_nonnull(log);
		while (!said && td_now_ms() < until) {
			ssize_t n = td_read_log(&t, 1, log, 1 << 20);

			said = n > 0 && (strstr(log, "left to its coordinator") ||
					 strstr(log, "removed stale work area"));
			if (!said)
				td_sleep_ms(50);
		}
		ck_assert_msg(said, "daemon 1's sweep said nothing of the area");
		ck_assert_msg(!strstr(log, "removed stale work area"),
			      "daemon 1's sweep removed an area daemon 0 claimed");
		free(log);
	}
	ck_assert(td_exists(area));
	ck_assert_int_eq(unlink(hold), 0);
	dup_result(&a0, line, sizeof(line));
	ck_assert_msg(strcmp(line, "0") == 0 || strncmp(line, "0 ", 2) == 0,
		      "daemon 0's commit of a save whose every rank was durable failed after "
		      "daemon 1's restart: %s", line);
	ck_assert_int_eq(td_child_wait(&a0, 30000), 0);
	(void)td_child_wait(&a1, 30000);
	td_fini(&t);
}
END_TEST

static Suite *multi_suite(void)
{
	Suite *s = suite_create("integration_multi");

	td_case(s, "eight_ranks", test_eight_ranks, 180, 0, 1);
	td_case(s, "two_daemons_one_root", test_two_daemons, 180, 0, 3);
	td_case(s, "dup_attempt", test_dup_attempt, 300, 0, 3);
	td_case(s, "workarea_swapped", test_workarea_swapped, 120, 0, 1);
	td_case(s, "creator_restart", test_creator_restart, 180, 0, 1);
	td_case(s, "s3", test_s3_ranks, 240, 0, 4);
	td_case(s, "s3", test_s3_dup_attempt, 300, 0, 3);
	td_case(s, "s3", test_s3_late_shard, 300, 0, 1);
	return s;
}

int main(void)
{
	return td_main(multi_suite(), "check_multi");
}
