/* SPDX-License-Identifier: MIT */
/*
 * check_adversarial.c - integration: what a hostile or unlucky user can do
 * to a real ckptd, one test per finding of the adversarial review (issue 7,
 * section 5).  "Committed" must mean the bytes of this attempt, complete;
 * a job is its owner's; files are created with the saving user's rights.
 *
 *   two_jobs_similar_names   jobs "b-c"/"a" and "c"/"a-b" save at once
 *   squatted_work_area       another user made the attempt's work area first
 *   retry_never_adopts       a retry after a crash never uses the crashed
 *                            attempt's rank files (one daemon, then two)
 *   no_commit_before_every_rank  a rank frozen mid-staging holds the commit
 *   job_owner_persists       another uid cannot join (and fail) a job whose
 *                            client left after staged; status shows a user
 *                            only their own saves
 *   client_rights            a user cannot save where they could not write;
 *                            files are theirs, with their umask
 *   idle_connections         silent connections time out, a uid has a cap,
 *                            and a refused client is told why
 *   deep_leftovers           work areas of a crashed daemon are removed
 *                            wherever they are below a root
 *   unread_answers           a client that reads none of its answers is
 *                            neither dropped nor able to block the daemon
 *
 * and of issue 30 ("one user starves a node"):
 *
 *   arena_share              one uid's connections asking arena_max take
 *                            no more than arena_per_uid: another uid still
 *                            gets an arena, and its resident image stays
 *   fair_admission           uids holding max_clients with idle connections
 *                            do not lock out a new uid's trainer; a
 *                            connection with a save in flight is never
 *                            closed for it
 *   crashed_job_owned        a crashed job's resident image keeps its name
 *                            its owner's: another uid is refused, the
 *                            owner's restart restores from memory
 *
 * Tests that act as other users fork children that drop to uids
 * TD_UID_A/TD_UID_B (the suite runs as root, like CI); without root they
 * say SKIP.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "shm/proto.h"
#include "store/store.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define UID_A 41001
#define UID_B 41002
#define UID_C 41003
#define UID_D 41004

/* ---- a rank in its own process --------------------------------------------- */

struct rk {
	const char *sock, *root, *job, *name;
	uint32_t rank, world;
	uint64_t step;
	uid_t uid;                /* 0: stay root */
	int umask;                /* -1: leave it */
	uint64_t seed, bytes;
	bool hold;                /* after committed, wait for a go byte */
	bool quit_after_staged;   /* exit once staged: the daemon owns the rest */
	uint32_t flags;           /* CKPT_CONNECT_* */
};

/* Connects as rank a->rank of a->world with a 16 MiB arena and a->flags;
 * for children (no ck_assert). */
static int rk_connect(const struct rk *a, struct ckpt_client **ret)
{
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };

	o.socket_path = a->sock;
	o.job = a->job;
	o.rank = a->rank;
	o.world = a->world;
	o.arena_bytes = 16 * MiB;
	o.flags = a->flags;
	return ckpt_connect(&o, ret);
}

/* Reports "connect RC MSG", "staged RC MSG", "committed RC MSG". */
static int rk_main(void *arg, int rep, int go)
{
	const struct rk *a = arg;
	struct ckpt_client *c = NULL;
	struct ckpt_save *s = NULL;
	struct ckpt_future *fs = NULL, *fc = NULL;
	uint64_t shape[1] = { a->bytes };
	struct ckpt_tensor t = { CKPT_TENSOR_INIT };
	char tname[32];
	void *buf;
	int rc;

	if (a->uid && (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0)) {
		td_report(rep, "committed %d cannot become uid %u", -errno, (unsigned)a->uid);
		return 9;
	}
	if (a->umask >= 0)
		umask((mode_t)a->umask);
	buf = malloc(a->bytes);
	if (!buf)
		return 10;
	td_fill(buf, a->bytes, a->seed, 0);
	rc = rk_connect(a, &c);
	td_report(rep, "connect %d %s", rc, rc < 0 ? ckpt_last_error() : "");
	if (rc < 0) {
		td_report(rep, "committed %d %s", rc, ckpt_last_error());
		return 1;
	}
	rc = ckpt_save_begin(c, a->root, a->name, a->step, &s);
	if (rc == 0) {
		snprintf(tname, sizeof(tname), "t%u", a->rank);
		t.name = tname;
		t.dtype = CKPT_U8;
		t.ndim = 1;
		t.shape = shape;
		t.data = buf;
		rc = ckpt_save_add_tensor(s, &t);
	}
	if (rc == 0)
		rc = ckpt_save_commit(s, &fs, &fc);
	if (rc < 0) {
		td_report(rep, "committed %d %s", rc, ckpt_last_error());
		return 2;
	}
	rc = td_future_wait(fs, 60000);
	td_report(rep, "staged %d %s", rc, ckpt_future_error(fs));
	if (a->quit_after_staged)
		return 0; /* _exit: the connection closes, the daemon goes on */
	rc = td_future_wait(fc, 90000);
	td_report(rep, "committed %d %s", rc, ckpt_future_error(fc));
	if (a->hold)
		td_wait_go(go, 120000);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(buf);
	return 0;
}

/* Starts a rank child. */
static void rk_start(struct td_child *ch, struct rk *a)
{
	memset(ch, 0, sizeof(*ch));
	ck_assert_int_eq(td_child_start(ch, rk_main, a), 0);
}

/* Waits for "<what> RC MSG" from the child; returns RC, copies MSG. */
static int rk_expect(struct td_child *ch, const char *what, int timeout_ms, char *msg, size_t len)
{
	char rest[1024] = "";
	int rc, off = 0;

	rc = td_child_expect(ch, what, timeout_ms, rest, sizeof(rest));
	ck_assert_msg(rc == 0, "no '%s' from the rank within %d ms (%d); it said: %s", what,
		      timeout_ms, rc, ch->out);
	ck_assert_msg(sscanf(rest, "%d %n", &rc, &off) == 1, "bad report '%s'", rest);
	if (msg)
		snprintf(msg, len, "%s", rest + off);
	return rc;
}

/* Reads the tensor t<rank> of checkpoint dir and checks it is stream seed. */
static void verify_rank_tensor(const char *dir, uint32_t rank, uint64_t bytes, uint64_t seed)
{
	struct ckpt_reader *rd = NULL;
	uint64_t shape[1] = { bytes };
	char tname[32];

	snprintf(tname, sizeof(tname), "t%u", rank);
	ck_assert_msg(ckpt_reader_open(dir, &rd) == 0, "open %s: %s", dir, ckpt_last_error());
	ck_assert_msg(td_verify_tensor(rd, tname, CKPT_U8, 1, shape, seed),
		      "%s: tensor %s does not hold the bytes of this attempt (seed %llu)", dir,
		      tname, (unsigned long long)seed);
	ckpt_reader_close(rd);
}

static char *manifest_field(const char *dir, const char *key)
{
	char p[TD_PATH], *text = NULL, *out;
	json_t *m;
	size_t len;

	td_path(p, sizeof(p), "%s/manifest.json", dir);
	ck_assert_int_eq(td_read_file(p, 1 << 24, &text, &len), 0);
	m = json_loads(text, 0, NULL);
	free(text);
	ck_assert_ptr_nonnull(m);
	out = strdup(json_string_value(json_object_get(m, key)) ?: "");
	json_decref(m);
	return out;
}

/* The work area of an attempt with an empty run id and attempt 0 (what a
 * fresh process sends when no run id is set). */
static void work_area(char *buf, size_t len, const char *root, const char *job, const char *name,
		      uint64_t step, uint32_t world)
{
	struct store_key k = { .step = step, .attempt = 0, .world = world };
	char id[STORE_ID_LEN + 1];

	snprintf(k.job, sizeof(k.job), "%s", job);
	snprintf(k.name, sizeof(k.name), "%s", name);
	store_key_id(&k, id);
	td_path(buf, len, "%s/%s%s", root, STORE_WORK_PREFIX, id);
}

/* Lets other users reach the test's directories and socket. */
static void open_up(struct testd *t)
{
	char p[TD_PATH];

	ck_assert_int_eq(chmod(t->dir, 0755), 0);
	td_path(p, sizeof(p), "%s/..", t->dir);
	chmod(p, 0755);
	ck_assert_int_eq(chmod(t->sockdir, 0755), 0);
}

/* A directory owned by uid with mode. */
static void user_dir(const char *path, uid_t uid, mode_t mode)
{
	ck_assert_msg(mkdir(path, mode) == 0 || errno == EEXIST, "mkdir %s: %s", path,
		      strerror(errno));
	ck_assert_int_eq(chown(path, uid, uid), 0);
	ck_assert_int_eq(chmod(path, mode), 0);
}

static bool need_root(const char *name)
{
	if (geteuid() == 0)
		return true;
	td_skip(name, "this test acts as other users and needs root");
	return false;
}

static void no_run_id(void)
{
	/* The attempt ids these tests compute assume no run id. */
	unsetenv("CKPT_RUN_ID");
	unsetenv("TORCHELASTIC_RUN_ID");
	unsetenv("SLURM_JOB_ID");
}

/* ---- 1. work areas of different saves never meet ------------------------------ */

START_TEST(test_two_jobs_similar_names)
{
	struct testd t;
	struct td_child a, b;
	struct rk ra = { .job = "b-c", .name = "a", .world = 1, .step = 1, .umask = -1,
			 .seed = 101, .bytes = 48 * MiB };
	struct rk rb = { .job = "c", .name = "a-b", .world = 1, .step = 2, .umask = -1,
			 .seed = 102, .bytes = 40 * MiB };
	char p[TD_PATH], msg[512];
	char *job;

	td_init(&t, "two_jobs_similar_names");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	ra.sock = rb.sock = td_sock(&t, 0);
	ra.root = rb.root = t.root;
	/* Both at once, through arenas smaller than the saves: their work
	 * areas exist side by side for a while. */
	rk_start(&a, &ra);
	rk_start(&b, &rb);
	ck_assert_msg(rk_expect(&a, "committed", 90000, msg, sizeof(msg)) == 0, "b-c/a: %s", msg);
	ck_assert_msg(rk_expect(&b, "committed", 90000, msg, sizeof(msg)) == 0, "c/a-b: %s", msg);
	td_child_wait(&a, 10000);
	td_child_wait(&b, 10000);

	td_path(p, sizeof(p), "%s/a", t.root);
	verify_rank_tensor(p, 0, ra.bytes, ra.seed);
	job = manifest_field(p, "job");
	ck_assert_str_eq(job, "b-c");
	free(job);
	td_path(p, sizeof(p), "%s/a-b", t.root);
	verify_rank_tensor(p, 0, rb.bytes, rb.seed);
	job = manifest_field(p, "job");
	ck_assert_str_eq(job, "c");
	free(job);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000), "a work area is left");
	td_fini(&t);
}
END_TEST

/* Another user creates the directory the attempt will use, first: the save
 * is refused, the other user's directory is not touched, and the earlier
 * checkpoint stays as it was. */
START_TEST(test_squatted_work_area)
{
	struct testd t;
	struct td_child ch;
	struct rk r = { .job = "sq", .world = 1, .step = 1, .umask = -1, .seed = 7,
			.bytes = 3 * MiB };
	char area[TD_PATH], p[TD_PATH], msg[512];

	if (!need_root("squatted_work_area"))
		return;
	no_run_id();
	td_init(&t, "squatted_work_area");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	r.sock = td_sock(&t, 0);
	r.root = t.root;
	r.name = "before";
	rk_start(&ch, &r);
	ck_assert_int_eq(rk_expect(&ch, "committed", 60000, msg, sizeof(msg)), 0);
	td_child_wait(&ch, 10000);

	work_area(area, sizeof(area), t.root, "sq", "after", 2, 1);
	user_dir(area, UID_A, 0777);
	td_path(p, sizeof(p), "%s/planted", area);
	ck_assert_int_eq(td_write_file(p, "not yours"), 0);
	ck_assert_int_eq(chown(p, UID_A, UID_A), 0);

	r.name = "after";
	r.step = 2;
	r.seed = 8;
	rk_start(&ch, &r);
	int rc = rk_expect(&ch, "committed", 60000, msg, sizeof(msg));
	ck_assert_msg(rc == -EEXIST, "save into a squatted work area: %d (%s), want -EEXIST", rc,
		      msg);
	ck_assert_msg(strstr(msg, "belongs to uid"), "message does not say why: %s", msg);
	td_child_wait(&ch, 10000);
	ck_assert_msg(td_exists(p), "the other user's file in %s was removed", area);
	td_path(p, sizeof(p), "%s/after", t.root);
	ck_assert_msg(!td_exists(p), "a checkpoint was committed through a squatted work area");
	td_path(p, sizeof(p), "%s/before", t.root);
	verify_rank_tensor(p, 0, r.bytes, 7);
	td_fini(&t);
}
END_TEST

/* ---- 2. a retry never adopts the crashed attempt's files ------------------------ */

/*
 * World 2.  Rank 1 saves and its index is written; the daemon (or, with two
 * daemons, rank 1's daemon) is killed before rank 0 ever came.  After the
 * restart the job saves the same name and step again, from new processes
 * (same key): rank 0 must wait for the new rank 1, and the checkpoint must
 * hold the new rank 1's bytes, not the crashed attempt's.
 */
START_TEST(test_retry_never_adopts)
{
	const int two = _i; /* 0: one daemon; 1: rank 1 on a second daemon */
	struct testd t;
	struct td_child c0, c1;
	struct rk r0 = { .job = "rj", .name = "ck", .rank = 0, .world = 2, .step = 5,
			 .umask = -1, .seed = 20, .bytes = 5 * MiB, .hold = true };
	struct rk r1 = r0;
	char area[TD_PATH], p[TD_PATH], msg[512];
	int d1 = two ? 1 : 0;

	no_run_id();
	td_init(&t, two ? "retry_never_adopts_2d" : "retry_never_adopts");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\ncommit_deadline = 2m\n"), 0);
	if (two)
		ck_assert_int_eq(td_daemon_start(&t, 1, "arena_max = 16M\ncommit_deadline = 2m\n"),
				 0);
	r0.sock = td_sock(&t, 0);
	r0.root = r1.root = t.root;
	r1.sock = td_sock(&t, d1);
	r1.rank = 1;
	r1.seed = 11;
	r1.hold = false;
	work_area(area, sizeof(area), t.root, "rj", "ck", 5, 2);

	/* The crashed attempt: rank 1 delivered, rank 0 never came. */
	rk_start(&c1, &r1);
	ck_assert_int_eq(rk_expect(&c1, "staged", 60000, msg, sizeof(msg)), 0);
	td_path(p, sizeof(p), "%s/rank-00001.index.json", area);
	ck_assert_msg(td_wait_exists(p, true, 30000), "rank 1's index never appeared in %s", area);
	td_daemon_kill(&t, d1);
	ck_assert_msg(rk_expect(&c1, "committed", 30000, msg, sizeof(msg)) < 0,
		      "rank 1 was told committed although its daemon died");
	td_child_wait(&c1, 10000);
	ck_assert_msg(td_exists(p), "the crashed attempt's index is gone before the restart");

	/* The retry. */
	ck_assert_int_eq(td_daemon_start(&t, d1, "arena_max = 16M\ncommit_deadline = 2m\n"), 0);
	if (two) /* the restarted daemon first removes what its crashed life made */
		ck_assert_msg(td_wait_exists(area, false, 15000),
			      "the crashed daemon's work area %s was not removed at restart", area);
	rk_start(&c0, &r0);
	ck_assert_int_eq(rk_expect(&c0, "staged", 60000, msg, sizeof(msg)), 0);
	td_sleep_ms(1500);
	td_path(p, sizeof(p), "%s/ck", t.root);
	ck_assert_msg(!td_exists(p), "committed with the crashed attempt's rank 1 (%s)", p);
	td_path(p, sizeof(p), "%s/rank-00001.index.json", area);
	ck_assert_msg(!td_exists(p), "the crashed attempt's rank-1 index is still in the work area");

	r1.seed = 21;
	r1.hold = true;
	rk_start(&c1, &r1);
	ck_assert_msg(rk_expect(&c1, "committed", 90000, msg, sizeof(msg)) == 0, "rank 1: %s", msg);
	ck_assert_msg(rk_expect(&c0, "committed", 90000, msg, sizeof(msg)) == 0, "rank 0: %s", msg);
	td_child_go(&c0);
	td_child_go(&c1);
	td_child_wait(&c0, 20000);
	td_child_wait(&c1, 20000);
	td_path(p, sizeof(p), "%s/ck", t.root);
	verify_rank_tensor(p, 0, r0.bytes, 20);
	verify_rank_tensor(p, 1, r1.bytes, 21);
	td_fini(&t);
}
END_TEST

/* ---- 2b. nothing commits before every rank's bytes are there ------------------------ */

/* The status JSON's save `name`: rank `rank`'s staged bytes (-1: absent). */
static int64_t staged_of(struct testd *t, const char *name, uint32_t rank)
{
	char *out = NULL;
	int64_t v = -1;
	json_t *st, *saves;

	if (td_ckptctl(&out, "-s", td_sock(t, 0), "status", "--json", NULL) != 0) {
		free(out);
		return -1;
	}
	st = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
	free(out);
	saves = json_object_get(st, "saves");
	for (size_t i = 0; i < json_array_size(saves); i++) {
		json_t *sv = json_array_get(saves, i), *ranks = json_object_get(sv, "ranks");
		if (strcmp(json_string_value(json_object_get(sv, "name")) ?: "", name))
			continue;
		for (size_t k = 0; k < json_array_size(ranks); k++) {
			json_t *r = json_array_get(ranks, k);
			if (json_integer_value(json_object_get(r, "rank")) == rank)
				v = json_integer_value(json_object_get(r, "staged"));
		}
	}
	json_decref(st);
	return v;
}

/*
 * World 2 on one daemon: rank 0 is durable at once; rank 1 joins later and
 * is frozen (SIGSTOP) in the middle of staging.  However long it stays
 * frozen, nothing may commit with rank 1's bytes half there; once it goes
 * on, the checkpoint holds all of both ranks.
 */
START_TEST(test_no_commit_before_every_rank)
{
	struct testd t;
	struct td_child c0, c1;
	struct rk r0 = { .job = "late", .name = "both", .rank = 0, .world = 2, .step = 4,
			 .umask = -1, .seed = 71, .bytes = 2 * MiB, .hold = true };
	struct rk r1 = r0;
	char p[TD_PATH], msg[512];
	int64_t staged = -1, end;

	td_init(&t, "no_commit_before_every_rank");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\ncommit_deadline = 2m\n"), 0);
	r0.sock = r1.sock = td_sock(&t, 0);
	r0.root = r1.root = t.root;
	r1.rank = 1;
	r1.seed = 72;
	r1.bytes = 768 * MiB;
	rk_start(&c0, &r0);
	ck_assert_int_eq(rk_expect(&c0, "staged", 60000, msg, sizeof(msg)), 0);
	td_sleep_ms(300); /* rank 0 durable; its daemon waits for rank 1 */
	rk_start(&c1, &r1);
	for (end = td_now_ms() + 60000; td_now_ms() < end; td_sleep_ms(10)) {
		staged = staged_of(&t, "both", 1);
		if (staged > 0)
			break;
	}
	ck_assert_int_eq(kill(c1.pid, SIGSTOP), 0);
	staged = staged_of(&t, "both", 1);
	ck_assert_msg(staged > 0 && (uint64_t)staged < r1.bytes,
		      "test premise: rank 1 frozen mid-staging (staged %lld)", (long long)staged);
	td_sleep_ms(1500); /* many ticks of the daemon */
	td_path(p, sizeof(p), "%s/both", t.root);
	ck_assert_msg(!td_exists(p), "committed while rank 1 had staged %lld of %llu bytes",
		      (long long)staged, (unsigned long long)r1.bytes);
	ck_assert_int_eq(kill(c1.pid, SIGCONT), 0);
	ck_assert_msg(rk_expect(&c1, "committed", 120000, msg, sizeof(msg)) == 0, "rank 1: %s", msg);
	ck_assert_msg(rk_expect(&c0, "committed", 120000, msg, sizeof(msg)) == 0, "rank 0: %s", msg);
	td_child_go(&c0);
	td_child_go(&c1);
	td_child_wait(&c0, 30000);
	td_child_wait(&c1, 30000);
	verify_rank_tensor(p, 0, r0.bytes, 71);
	verify_rank_tensor(p, 1, r1.bytes, 72);
	td_fini(&t);
}
END_TEST

/* ---- 3. a job belongs to its uid while anything of it lives ----------------------- */

static int status_json_as(struct testd *t, uid_t uid, json_t **ret)
{
	char ctl[TD_PATH], uidarg[32], *out = NULL;
	char *argv[12];
	int n = 0, st;

	td_path(ctl, sizeof(ctl), "%s/ckptctl", td_build_dir());
	snprintf(uidarg, sizeof(uidarg), "%u", (unsigned)uid);
	argv[n++] = "/usr/bin/setpriv";
	argv[n++] = "--reuid";
	argv[n++] = uidarg;
	argv[n++] = "--regid";
	argv[n++] = uidarg;
	argv[n++] = "--clear-groups";
	argv[n++] = ctl;
	argv[n++] = "-s";
	argv[n++] = (char *)td_sock(t, 0);
	argv[n++] = "status";
	argv[n++] = "--json";
	argv[n] = NULL;
	st = td_run_capture(argv, 30000, &out);
	if (st != 0) {
		fprintf(stderr, "ckptctl status as uid %u: %s\n%s\n", (unsigned)uid,
			td_status_str(st), out ? out : "");
		free(out);
		return -1;
	}
	*ret = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
	free(out);
	return *ret ? 0 : -1;
}

START_TEST(test_job_owner_persists)
{
	struct testd t;
	struct td_child a, b, a2;
	struct rk ra = { .job = "own", .name = "mine", .rank = 0, .world = 2, .step = 3,
			 .uid = UID_A, .umask = -1, .seed = 31, .bytes = 2 * MiB,
			 .quit_after_staged = true };
	struct rk rb = { .job = "own", .name = "mine", .rank = 1, .world = 3, .step = 3,
			 .uid = UID_B, .umask = -1, .seed = 32, .bytes = 2 * MiB };
	struct rk ra2 = ra;
	char root[TD_PATH], p[TD_PATH], msg[512];
	json_t *st;

	if (!need_root("job_owner_persists"))
		return;
	td_init(&t, "job_owner_persists");
	open_up(&t);
	td_path(root, sizeof(root), "%s/alice", t.root);
	user_dir(root, UID_A, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nsocket_mode = 0666\n"), 0);
	ra.sock = rb.sock = td_sock(&t, 0);
	ra.root = rb.root = root;

	/* The owner stages rank 0 and leaves; the save waits for rank 1. */
	rk_start(&a, &ra);
	ck_assert_int_eq(rk_expect(&a, "staged", 60000, msg, sizeof(msg)), 0);
	td_child_wait(&a, 10000);

	/* Another user claims the job with another world size: refused. */
	rk_start(&b, &rb);
	int rc = rk_expect(&b, "connect", 30000, msg, sizeof(msg));
	ck_assert_msg(rc == -EACCES, "another uid joined the job: %d (%s)", rc, msg);
	ck_assert_msg(strstr(msg, "belongs to another user"), "refusal does not say why: %s", msg);
	td_child_wait(&b, 10000);

	/* Status shows a user only their own saves; root sees all. */
	ck_assert_int_eq(status_json_as(&t, UID_B, &st), 0);
	ck_assert_uint_eq(json_array_size(json_object_get(st, "saves")), 0);
	json_decref(st);
	ck_assert_int_eq(status_json_as(&t, UID_A, &st), 0);
	ck_assert_uint_eq(json_array_size(json_object_get(st, "saves")), 1);
	json_decref(st);

	/* The owner's rank 1 completes the staged save. */
	ra2.sock = ra.sock;
	ra2.root = ra.root;
	ra2.rank = 1;
	ra2.seed = 33;
	ra2.quit_after_staged = false;
	rk_start(&a2, &ra2);
	ck_assert_msg(rk_expect(&a2, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_child_wait(&a2, 10000);
	td_path(p, sizeof(p), "%s/mine", root);
	verify_rank_tensor(p, 0, ra.bytes, 31);
	verify_rank_tensor(p, 1, ra.bytes, 33);
	td_fini(&t);
}
END_TEST

/* ---- 4. a user writes only where they may, as themselves ------------------------ */

START_TEST(test_client_rights)
{
	struct testd t;
	struct td_child ch;
	struct rk r = { .job = "rights", .world = 1, .step = 1, .uid = UID_A, .umask = 027,
			.seed = 41, .bytes = 1 * MiB };
	char priv[TD_PATH], mine[TD_PATH], p[TD_PATH], msg[512];
	struct stat sb;

	if (!need_root("client_rights"))
		return;
	td_init(&t, "client_rights");
	open_up(&t);
	td_path(priv, sizeof(priv), "%s/bob", t.root);
	user_dir(priv, UID_B, 0700);
	td_path(mine, sizeof(mine), "%s/alice", t.root);
	user_dir(mine, UID_A, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nsocket_mode = 0666\n"), 0);
	r.sock = td_sock(&t, 0);

	/* Into another user's 0700 directory: refused, nothing created. */
	r.root = priv;
	r.name = "intrusion";
	rk_start(&ch, &r);
	int rc = rk_expect(&ch, "committed", 60000, msg, sizeof(msg));
	ck_assert_msg(rc == -EACCES, "save into another user's 0700 dir: %d (%s)", rc, msg);
	td_child_wait(&ch, 10000);
	ck_assert_int_eq(td_count_entries(priv, ""), 0);

	/* Below their own directory, in a subdirectory that does not exist
	 * yet: created as the user, with the user's umask. */
	td_path(p, sizeof(p), "%s/run1/deeper", mine);
	r.root = p;
	r.name = "ok";
	rk_start(&ch, &r);
	ck_assert_msg(rk_expect(&ch, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_child_wait(&ch, 10000);
	td_path(p, sizeof(p), "%s/run1", mine);
	ck_assert_int_eq(stat(p, &sb), 0);
	ck_assert_uint_eq(sb.st_uid, UID_A);
	ck_assert_uint_eq(sb.st_mode & 0777, 0750);
	td_path(p, sizeof(p), "%s/run1/deeper/ok", mine);
	ck_assert_int_eq(stat(p, &sb), 0);
	ck_assert_uint_eq(sb.st_uid, UID_A);
	ck_assert_uint_eq(sb.st_mode & 0777, 0750);
	td_path(p, sizeof(p), "%s/run1/deeper/ok/rank-00000.safetensors", mine);
	ck_assert_int_eq(stat(p, &sb), 0);
	ck_assert_uint_eq(sb.st_uid, UID_A);
	ck_assert_uint_eq(sb.st_mode & 0777, 0640);
	td_path(p, sizeof(p), "%s/run1/deeper/ok/manifest.json", mine);
	ck_assert_int_eq(stat(p, &sb), 0);
	ck_assert_uint_eq(sb.st_uid, UID_A);
	td_path(p, sizeof(p), "%s/run1/deeper/ok", mine);
	verify_rank_tensor(p, 0, r.bytes, 41);
	td_fini(&t);
}
END_TEST

/* ---- 5. idle connections cannot lock anyone out ------------------------------------ */

static int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Receives the ERROR a refused connection gets (bounded), returns its err
 * and copies its text. */
static int raw_error(int fd, char *msg, size_t len, int timeout_ms)
{
	struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_error e;
	} u;
	char err[256];
	ssize_t n;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = proto_recv(fd, u.buf, NULL);
	if (n <= 0)
		return n == 0 ? -ECONNRESET : (int)n;
	ck_assert_int_eq(proto_check(u.buf, (size_t)n, err, sizeof(err)), PROTO_ERROR);
	snprintf(msg, len, "%s", u.e.msg);
	return u.e.err;
}

START_TEST(test_idle_connections)
{
	struct testd t;
	struct td_child ch;
	struct rk r = { .job = "busy", .name = "other-user", .world = 1, .step = 1, .uid = UID_A,
			.umask = -1, .seed = 51, .bytes = 1 * MiB };
	struct ckpt_client *c = NULL;
	int idle[3], extra, rc;
	char msg[512], root[TD_PATH];

	if (!need_root("idle_connections"))
		return;
	td_init(&t, "idle_connections");
	open_up(&t);
	td_path(root, sizeof(root), "%s/alice", t.root);
	user_dir(root, UID_A, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nsocket_mode = 0666\n"
						 "max_clients_per_uid = 3\nhandshake_timeout = 1s\n"),
			 0);
	/* td_daemon_start's own probe connection counts until the daemon has
	 * read its close: let that happen first. */
	td_sleep_ms(300);
	for (int i = 0; i < 3; i++)
		idle[i] = raw_connect(td_sock(&t, 0));
	/* The uid's cap: the fourth is refused with a reason. */
	extra = raw_connect(td_sock(&t, 0));
	rc = raw_error(extra, msg, sizeof(msg), 5000);
	ck_assert_msg(rc == -EUSERS, "fourth connection of one uid: %d (%s)", rc, msg);
	ck_assert_msg(strstr(msg, "max_clients_per_uid"), "refusal does not say why: %s", msg);
	close(extra);
	/* Through libckpt, the refusal reads the same (not "Broken pipe"). */
	rc = td_connect_rc(td_sock(&t, 0), "busy", 0, 1, 16 * MiB, &c);
	ck_assert_msg(rc < 0, "a fourth connection of one uid was accepted (%d %s)", rc, ckpt_last_error());
	ck_assert_msg(strstr(ckpt_last_error(), "max_clients_per_uid"),
		      "libckpt does not report the daemon's reason: %s", ckpt_last_error());

	/* Another user is not locked out. */
	r.sock = td_sock(&t, 0);
	r.root = root;
	rk_start(&ch, &r);
	ck_assert_msg(rk_expect(&ch, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_child_wait(&ch, 10000);

	/* The silent ones are told and closed after handshake_timeout. */
	for (int i = 0; i < 3; i++) {
		rc = raw_error(idle[i], msg, sizeof(msg), 10000);
		ck_assert_msg(rc == -ETIMEDOUT, "idle connection %d: %d (%s)", i, rc, msg);
		close(idle[i]);
	}
	/* And the uid can connect again. */
	c = td_connect(td_sock(&t, 0), "busy", 0, 1, 16 * MiB);
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

/* ---- 7. a client that does not read its messages ------------------------------- */

/*
 * A client that sends many requests and reads none of the answers fills
 * the daemon's socket buffer.  The daemon must neither block nor drop it
 * for that (answers wait in a bounded queue), and other clients go on.
 */
START_TEST(test_unread_answers)
{
	struct testd t;
	struct proto_hello h;
	struct proto_save_begin b;
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_hello_ok ok;
		struct proto_save_result res;
	} u;
	char err[256];
	int fd, n_sent = 600, got = 0;
	ssize_t n;

	td_init(&t, "unread_answers");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	fd = raw_connect(td_sock(&t, 0));
	proto_init(&h.h, PROTO_HELLO, sizeof(h));
	h.role = PROTO_ROLE_CLIENT;
	h.world = 1;
	h.umask = 022;
	h.arena_bytes = 16 * MiB;
	snprintf(h.job, sizeof(h.job), "deaf");
	ck_assert_int_eq(proto_send(fd, &h, sizeof(h), -1), 0);
	{
		int afd = -1;
		n = proto_recv(fd, u.buf, &afd);
		ck_assert_int_eq(proto_check(u.buf, (size_t)n, err, sizeof(err)), PROTO_HELLO_OK);
		close(afd);
	}
	/* Each SAVE_BEGIN points at a descriptor of zeros: refused at once
	 * with a SAVE_ACK of 528 bytes, several hundred of which fill a Unix
	 * socket's default send buffer. */
	for (int i = 1; i <= n_sent; i++) {
		proto_init(&b.h, PROTO_SAVE_BEGIN, sizeof(b));
		b.token = (uint32_t)i;
		b.desc_off = 0;
		b.desc_len = 4096;
		ck_assert_int_eq(proto_send(fd, &b, sizeof(b), -1), 0);
	}
	/* Meanwhile another client is served. */
	{
		char *out = NULL;
		int st = td_ckptctl(&out, "-s", td_sock(&t, 0), "status", NULL);
		ck_assert_msg(st == 0, "status while a client does not read: %s", out ? out : "");
		free(out);
	}
	/* Every answer arrives, in order, on a connection still open. */
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while (got < n_sent) {
		n = proto_recv(fd, u.buf, NULL);
		ck_assert_msg(n > 0, "connection ended after %d of %d answers (%zd)", got, n_sent, n);
		ck_assert_int_eq(proto_check(u.buf, (size_t)n, err, sizeof(err)), PROTO_SAVE_ACK);
		ck_assert_uint_eq(u.res.token, (uint32_t)(got + 1));
		ck_assert_int_lt(u.res.err, 0);
		got++;
	}
	close(fd);
	td_fini(&t);
}
END_TEST

/* ---- 6. leftovers of a crash, wherever they are ----------------------------------- */

START_TEST(test_deep_leftovers)
{
	const char *sub = _i ? "a/b/c" : "";
	struct testd t;
	struct td_child ch;
	struct rk r = { .job = "deep", .name = "x", .rank = 1, .world = 2, .step = 9,
			.umask = -1, .seed = 61, .bytes = 3 * MiB };
	char root[TD_PATH], area[TD_PATH], p[TD_PATH], msg[512];

	no_run_id();
	td_init(&t, _i ? "deep_leftovers" : "leftovers_at_root");
	td_path(root, sizeof(root), "%s%s%s", t.root, sub[0] ? "/" : "", sub);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\ncommit_deadline = 10m\n"), 0);
	/* A committed checkpoint next to the leftover must survive. */
	r.sock = td_sock(&t, 0);
	r.root = root;
	r.rank = 0;
	r.world = 1;
	r.name = "kept";
	rk_start(&ch, &r);
	ck_assert_int_eq(rk_expect(&ch, "committed", 60000, msg, sizeof(msg)), 0);
	td_child_wait(&ch, 10000);

	r.rank = 1;
	r.world = 2;
	r.name = "x";
	work_area(area, sizeof(area), root, "deep", "x", 9, 2);
	rk_start(&ch, &r);
	ck_assert_int_eq(rk_expect(&ch, "staged", 60000, msg, sizeof(msg)), 0);
	td_path(p, sizeof(p), "%s/rank-00001.index.json", area);
	ck_assert_msg(td_wait_exists(p, true, 30000), "rank 1's index never appeared");
	td_daemon_kill(&t, 0);
	td_child_wait(&ch, 30000);
	ck_assert_msg(td_exists(area), "no leftover to sweep");

	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\ncommit_deadline = 10m\n"), 0);
	ck_assert_msg(td_wait_exists(area, false, 15000),
		      "the crashed daemon's work area %s was not removed after the restart", area);
	td_path(p, sizeof(p), "%s/kept", root);
	verify_rank_tensor(p, 0, r.bytes, 61);
	td_fini(&t);
}
END_TEST

/* ---- 8. one user cannot starve the others (issue 30) ------------------------------ */

/* Becomes uid (and its group) in a helper child.  0 or -errno. */
static int become(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
		return -errno;
	return 0;
}

/* What a loader child does: as uid, connect to job and load tensor t<rank>
 * (bytes of stream seed) of checkpoint path through its client. */
struct ld {
	const char *sock, *job, *path;
	uid_t uid;
	uint32_t rank;
	uint64_t bytes, seed;
};

/* Reports "connect RC MSG", then "loaded RC FILES_RESIDENT SAME MSG": the
 * load's result, how many files came from the daemon's memory and whether
 * every byte is the saved one (1/0). */
static int ld_main(void *arg, int rep, int go)
{
	const struct ld *a = arg;
	struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
	struct ckpt_client *c = NULL;
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done = NULL;
	uint64_t shape[1] = { a->bytes };
	char tname[32], msg[512] = "";
	uint8_t *buf;
	int rc;

	(void)go;
	if ((rc = become(a->uid)) < 0) {
		td_report(rep, "connect %d cannot become uid %u", rc, (unsigned)a->uid);
		return 9;
	}
	rc = td_connect_rc(a->sock, a->job, 0, 1, 16 * MiB, &c);
	td_report(rep, "connect %d %s", rc, rc < 0 ? ckpt_last_error() : "");
	if (rc < 0) {
		td_report(rep, "loaded %d 0 0 %s", rc, ckpt_last_error());
		return 1;
	}
	buf = calloc(1, a->bytes);
	snprintf(tname, sizeof(tname), "t%u", a->rank);
	rc = buf ? ckpt_reader_open(a->path, &rd) : -ENOMEM;
	if (rc == 0)
		rc = ckpt_load_begin(rd, 0, &ld);
	if (rc == 0) {
		struct ckpt_load_dst dst = { CKPT_LOAD_DST_INIT, .data = buf };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_U8,
					       .name = tname, .global_shape = shape, .ndim = 1,
					       .n_dsts = 1, .dsts = &dst };
		rc = ckpt_load_add_tensor(ld, &lt);
		if (rc == 0)
			rc = ckpt_load_set_client(ld, c);
		if (rc == 0)
			rc = ckpt_load_start(ld, &done);
		if (rc == 0) {
			rc = td_future_wait(done, 60000);
			snprintf(msg, sizeof(msg), "%s", ckpt_future_error(done));
		} else {
			snprintf(msg, sizeof(msg), "%s", ckpt_last_error());
		}
		ckpt_load_stats(ld, &st);
		ckpt_load_free(ld);
	} else {
		snprintf(msg, sizeof(msg), "%s", ckpt_last_error());
	}
	td_report(rep, "loaded %d %u %d %s", rc, st.files_resident,
		  rc == 0 && td_check(buf, a->bytes, a->seed, 0) < 0, msg);
	if (rd)
		ckpt_reader_close(rd);
	free(buf);
	ckpt_disconnect(c);
	return 0;
}

/* Expects "loaded 0 1 1": the whole tensor, right, from the daemon's memory. */
static void expect_loaded_from_memory(struct td_child *ch)
{
	char rest[1024] = "";
	int rc, files = -1, same = -1;

	ck_assert_msg(td_child_expect(ch, "loaded", 90000, rest, sizeof(rest)) == 0,
		      "the loader never reported; it said: %s", ch->out);
	ck_assert_msg(sscanf(rest, "%d %d %d", &rc, &files, &same) == 3, "bad report '%s'", rest);
	ck_assert_msg(rc == 0 && files == 1 && same == 1,
		      "load from memory: rc %d, %d files from memory, bytes %s (%s)", rc, files,
		      same ? "right" : "wrong", rest);
}

/* Root's status report, with every user's clients, images and totals. */
static json_t *status_root(struct testd *t)
{
	json_t *st = NULL;

	ck_assert_int_eq(status_json_as(t, 0, &st), 0);
	return st;
}

/* True if the status lists a resident image of job. */
static bool has_image(json_t *st, const char *job)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(st, "resident"), i, e) {
		const char *j = json_string_value(json_object_get(e, "job"));
		if (j && !strcmp(j, job))
			return true;
	}
	return false;
}

/* The arena bytes of uid in the status' "users", or -1 if not listed. */
static json_int_t user_arena(json_t *st, uid_t uid)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(st, "users"), i, e) {
		if (json_integer_value(json_object_get(e, "uid")) == (json_int_t)uid)
			return json_integer_value(json_object_get(e, "arena_bytes"));
	}
	return -1;
}

/* Polls root's status (bounded) until job has an image and no arena is
 * held (every client gone and its arena freed). */
static void wait_image_alone(struct testd *t, const char *job)
{
	int64_t end = td_now_ms() + 30000;

	for (;;) {
		json_t *st = status_root(t);
		bool ok = has_image(st, job) &&
			  json_integer_value(json_object_get(st, "arena_bytes_total")) == 0 &&
			  json_array_size(json_object_get(st, "saves")) == 0;
		char *text = ok ? NULL : json_dumps(st, JSON_COMPACT);

		json_decref(st);
		if (ok)
			return;
		ck_assert_msg(td_now_ms() < end, "no image of job '%s' alone after 30 s: %s", job,
			      text ? text : "?");
		free(text);
		td_sleep_ms(50);
	}
}

/* A child that, as uid, opens n connections asking arena bytes each,
 * reports "conn I RC MSG" for each, then "opened", and keeps them until
 * its go byte. */
struct many {
	const char *sock, *job;
	uid_t uid;
	unsigned n;
	uint64_t arena;
};

static int many_main(void *arg, int rep, int go)
{
	const struct many *a = arg;
	struct ckpt_client *c[8] = { 0 };
	int rc;

	if ((rc = become(a->uid)) < 0) {
		td_report(rep, "opened %d", rc);
		return 9;
	}
	for (unsigned i = 0; i < a->n && i < 8; i++) {
		rc = td_connect_rc(a->sock, a->job, i, a->n, a->arena, &c[i]);
		td_report(rep, "conn%u %d %s", i, rc, rc < 0 ? ckpt_last_error() : "");
	}
	td_report(rep, "opened 0");
	td_wait_go(go, 120000);
	for (unsigned i = 0; i < 8; i++)
		if (c[i])
			ckpt_disconnect(c[i]);
	return 0;
}

/*
 * Four connections of one uid asking arena_max each would take all of
 * arena_total (4 x 16M of 64M) and evict what other users keep in memory.
 * With arena_per_uid (here its default: half of arena_total), the uid gets
 * two; the others are refused with the reason, and another user's
 * resident image stays and its next client gets an arena.
 */
START_TEST(test_arena_share)
{
	struct testd t;
	struct td_child bs, ms, bl;
	struct rk rb = { .job = "bjob", .name = "bck", .world = 1, .step = 1, .uid = UID_B,
			 .umask = -1, .seed = 81, .bytes = 4 * MiB,
			 .flags = CKPT_CONNECT_RESIDENT };
	struct many ma = { .job = "ajob", .uid = UID_A, .n = 4, .arena = 16 * MiB };
	struct ld lb = { .job = "bjob", .uid = UID_B, .rank = 0, .bytes = 4 * MiB, .seed = 81 };
	char root[TD_PATH], ck[TD_PATH], p[TD_PATH], msg[512];
	json_t *st;

	if (!need_root("arena_share"))
		return;
	td_init(&t, "arena_share");
	open_up(&t);
	td_path(root, sizeof(root), "%s/bob", t.root);
	user_dir(root, UID_B, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\narena_total = 64M\n"
						 "socket_mode = 0666\n"), 0);
	rb.sock = ma.sock = lb.sock = td_sock(&t, 0);
	rb.root = root;

	/* B saves with its image kept in memory, and leaves. */
	rk_start(&bs, &rb);
	ck_assert_msg(rk_expect(&bs, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_child_wait(&bs, 10000);
	wait_image_alone(&t, "bjob");

	/* A asks for four arenas of arena_max: two fit its share. */
	memset(&ms, 0, sizeof(ms));
	ck_assert_int_eq(td_child_start(&ms, many_main, &ma), 0);
	for (unsigned i = 0; i < 4; i++) {
		char what[16];
		int rc;

		snprintf(what, sizeof(what), "conn%u", i);
		rc = rk_expect(&ms, what, 60000, msg, sizeof(msg));
		if (i < 2) {
			ck_assert_msg(rc == 0, "uid A's connection %u within its share: %d (%s)", i,
				      rc, msg);
		} else {
			ck_assert_msg(rc == -ENOMEM,
				      "uid A's connection %u past its share: %d (%s)", i, rc, msg);
			ck_assert_msg(strstr(msg, "arena_per_uid"), "refusal does not say why: %s",
				      msg);
		}
	}
	ck_assert_int_eq(rk_expect(&ms, "opened", 10000, NULL, 0), 0);

	/* B's image was not evicted for A... */
	st = status_root(&t);
	ck_assert_msg(has_image(st, "bjob"), "B's resident image was evicted for A");
	/* (the status shows each user's part; a user sees only its own) */
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(st, "config"),
							    "arena_per_uid")), 32 * MiB);
	ck_assert_msg(user_arena(st, UID_A) == (json_int_t)(32 * MiB), "uid A holds %lld bytes",
		      (long long)user_arena(st, UID_A));
	json_decref(st);
	ck_assert_int_eq(status_json_as(&t, UID_B, &st), 0);
	ck_assert_int_eq(user_arena(st, UID_A), -1);
	ck_assert_int_eq(user_arena(st, UID_B), 0);
	json_decref(st);

	/* ...and B's restart gets an arena and restores from memory (its
	 * shard deleted: only the daemon has the bytes). */
	td_path(ck, sizeof(ck), "%s/bck", root);
	td_path(p, sizeof(p), "%s/rank-00000.safetensors", ck);
	ck_assert_int_eq(unlink(p), 0);
	lb.path = ck;
	memset(&bl, 0, sizeof(bl));
	ck_assert_int_eq(td_child_start(&bl, ld_main, &lb), 0);
	ck_assert_msg(rk_expect(&bl, "connect", 60000, msg, sizeof(msg)) == 0,
		      "uid B got no arena while uid A holds its share: %s", msg);
	expect_loaded_from_memory(&bl);
	td_child_wait(&bl, 10000);

	td_child_go(&ms);
	td_child_wait(&ms, 10000);
	td_fini(&t);
}
END_TEST

/* A child that, as uid, opens n connections and says nothing on them
 * ("opened"); at the Nth go byte it reports, for each, "connI closed ERR
 * MSG" if the daemon closed it with an ERROR, else "connI open", then
 * "checkedN"; it exits at a 'q' (idle_end). */
struct idle {
	const char *sock;
	uid_t uid;
	unsigned n;
};

static int idle_main(void *arg, int rep, int go)
{
	const struct idle *a = arg;
	int fds[8], rc;

	if ((rc = become(a->uid)) < 0) {
		td_report(rep, "opened %d", rc);
		return 9;
	}
	for (unsigned i = 0; i < a->n && i < 8; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };

		fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", a->sock);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			td_report(rep, "opened %d", -errno);
			return 1;
		}
	}
	td_report(rep, "opened 0");
	for (unsigned round = 1;; round++) {
		struct pollfd pf = { .fd = go, .events = POLLIN };
		char b = 'q';

		/* (the go pipe does not close: later children hold its end) */
		if (poll(&pf, 1, 120000) <= 0 || read(go, &b, 1) != 1 || b == 'q')
			break;
		for (unsigned i = 0; i < a->n && i < 8; i++) {
			union {
				char buf[PROTO_MSG_MAX];
				struct proto_error e;
			} u;
			char err[256];
			ssize_t n = recv(fds[i], u.buf, sizeof(u.buf), MSG_DONTWAIT);

			if (n > 0 && proto_check(u.buf, (size_t)n, err, sizeof(err)) == PROTO_ERROR)
				td_report(rep, "conn%u closed %d %s", i, u.e.err, u.e.msg);
			else if (n < 0 && errno == EAGAIN)
				td_report(rep, "conn%u open", i);
			else
				td_report(rep, "conn%u closed 0 (no ERROR)", i);
		}
		td_report(rep, "checked%u", round);
	}
	return 0;
}

/* Asks an idle child for its next report; returns it (the child's whole
 * output from this report on). */
static const char *idle_check(struct td_child *ch)
{
	size_t from = ch->len;
	unsigned round = 1;
	char want[32];

	for (const char *q = ch->out; (q = strstr(q, "checked")); q++)
		round++;
	snprintf(want, sizeof(want), "checked%u", round);
	ck_assert_int_eq(td_child_go(ch), 0);
	ck_assert_msg(td_child_expect(ch, want, 30000, NULL, 0) == 0,
		      "no report from an idle child: %s", ch->out);
	return ch->out + from;
}

/* Ends an idle child. */
static void idle_end(struct td_child *ch)
{
	int st;

	ck_assert_int_eq(write(ch->go, "q", 1), 1);
	st = td_child_wait(ch, 30000);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "an idle child: %s",
		      td_status_str(st));
}

/* As uid, one connection that is refused: returns the ERROR's err (0: the
 * daemon did not refuse it within 20 s). */
static int refused_as(struct testd *t, uid_t uid, char *msg, size_t len);

/*
 * max_clients (5) held by two uids: uid A with a trainer whose save is in
 * flight (rank 0 of 2 staged, waiting for rank 1) and two connections that
 * never say HELLO, uid B with two more.  Were admission first come, first
 * served, a new user could not get in while they keep them open (the
 * report: a real user locked out for 35 s of 35, by uids re-opening idle
 * connections).  Now the new trainer of uid C gets in at once and saves,
 * at the cost of the busiest uid's idle connection idle longest, and so
 * does the next (uid D); the uids that lost one cannot take it back while
 * they hold as many as anyone; and the trainer with a save in flight is
 * never closed: its save commits once rank 1 comes.
 */
START_TEST(test_fair_admission)
{
	struct testd t;
	struct td_child tr0, tr1, ia, ib, tc, td;
	struct rk r0 = { .job = "inflight", .name = "held", .rank = 0, .world = 2, .step = 2,
			 .uid = UID_A, .umask = -1, .seed = 91, .bytes = 2 * MiB };
	struct rk r1 = r0;
	struct rk rc_ = { .job = "late", .name = "newcomer", .world = 1, .step = 1,
			  .uid = UID_C, .umask = -1, .seed = 92, .bytes = 2 * MiB, .hold = true };
	struct rk rd = { .job = "later", .name = "second", .world = 1, .step = 1, .uid = UID_D,
			 .umask = -1, .seed = 93, .bytes = 2 * MiB };
	struct idle xa = { .uid = UID_A, .n = 2 }, xb = { .uid = UID_B, .n = 2 };
	char ra[TD_PATH], rcd[TD_PATH], rdd[TD_PATH], p[TD_PATH], msg[512], *log;
	const char *rep;
	int64_t end;
	int rc;

	if (!need_root("fair_admission"))
		return;
	no_run_id();
	td_init(&t, "fair_admission");
	open_up(&t);
	td_path(ra, sizeof(ra), "%s/alice", t.root);
	user_dir(ra, UID_A, 0755);
	td_path(rcd, sizeof(rcd), "%s/carol", t.root);
	user_dir(rcd, UID_C, 0755);
	td_path(rdd, sizeof(rdd), "%s/dave", t.root);
	user_dir(rdd, UID_D, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nsocket_mode = 0666\n"
						 "max_clients = 5\nhandshake_timeout = 10m\n"
						 "commit_deadline = 10m\n"), 0);
	/* td_daemon_start's probe connection counts until the daemon has read
	 * its close (client 1). */
	log = malloc(1 << 20);
	ck_assert_ptr_nonnull(log);
	for (end = td_now_ms() + 20000;; td_sleep_ms(20)) {
		if (td_read_log(&t, 0, log, 1 << 20) > 0 && strstr(log, "client 1: disconnected"))
			break;
		ck_assert_msg(td_now_ms() < end, "the probe connection never closed");
	}
	free(log);
	r0.sock = r1.sock = rc_.sock = rd.sock = xa.sock = xb.sock = td_sock(&t, 0);
	r0.root = r1.root = ra;
	rc_.root = rcd;
	rd.root = rdd;

	/* A's trainer: rank 0 staged, its save waiting for rank 1. */
	rk_start(&tr0, &r0);
	ck_assert_int_eq(rk_expect(&tr0, "staged", 60000, msg, sizeof(msg)), 0);
	/* The table fills with idle connections: A's two, then B's two. */
	memset(&ia, 0, sizeof(ia));
	ck_assert_int_eq(td_child_start(&ia, idle_main, &xa), 0);
	ck_assert_int_eq(rk_expect(&ia, "opened", 30000, NULL, 0), 0);
	memset(&ib, 0, sizeof(ib));
	ck_assert_int_eq(td_child_start(&ib, idle_main, &xb), 0);
	ck_assert_int_eq(rk_expect(&ib, "opened", 30000, NULL, 0), 0);
	/* Full: first come, first served would refuse this one. */
	rep = idle_check(&ia);
	ck_assert_msg(strstr(rep, "conn0 open") && strstr(rep, "conn1 open"), "%s", rep);

	/* A new user's trainer gets in and saves. */
	rk_start(&tc, &rc_);
	rc = rk_expect(&tc, "connect", 30000, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "a new user's trainer was locked out: %d (%s)", rc, msg);
	ck_assert_msg(rk_expect(&tc, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_path(p, sizeof(p), "%s/newcomer", rcd);
	verify_rank_tensor(p, 0, rc_.bytes, 92);
	/* It cost A (3 connections, the most) the one idle longest, told why. */
	rep = idle_check(&ia);
	ck_assert_msg(strstr(rep, "conn0 closed -24 ") && strstr(rep, "another user") &&
			      strstr(rep, "conn1 open"),
		      "A's oldest idle connection was not the one closed: %s", rep);
	rep = idle_check(&ib);
	ck_assert_msg(strstr(rep, "conn0 open") && strstr(rep, "conn1 open"), "%s", rep);

	/* A and B now hold two each, C one: re-opening gets them nothing. */
	rc = refused_as(&t, UID_A, msg, sizeof(msg));
	ck_assert_msg(rc == -EMFILE && strstr(msg, "max_clients"),
		      "uid A took a slot back: %d (%s)", rc, msg);
	rc = refused_as(&t, UID_B, msg, sizeof(msg));
	ck_assert_msg(rc == -EMFILE, "uid B took a slot: %d (%s)", rc, msg);

	/* The next new user gets in too: A's other idle connection goes (A
	 * and B hold two; A's has been idle longer), never its trainer. */
	rk_start(&td, &rd);
	ck_assert_msg(rk_expect(&td, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	td_child_wait(&td, 10000);
	rep = idle_check(&ia);
	ck_assert_msg(strstr(rep, "conn1 closed -24 "), "A's second idle connection: %s", rep);
	rep = idle_check(&ib);
	ck_assert_msg(strstr(rep, "conn0 open") && strstr(rep, "conn1 open"), "%s", rep);

	/* The save in flight was never touched: rank 1 completes it. */
	r1.rank = 1;
	r1.seed = 94;
	rk_start(&tr1, &r1);
	ck_assert_msg(rk_expect(&tr1, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	ck_assert_msg(rk_expect(&tr0, "committed", 60000, msg, sizeof(msg)) == 0,
		      "the trainer with a save in flight: %s", msg);
	td_path(p, sizeof(p), "%s/held", ra);
	verify_rank_tensor(p, 0, r0.bytes, 91);
	verify_rank_tensor(p, 1, r0.bytes, 94);
	td_child_wait(&tr1, 10000);
	td_child_wait(&tr0, 10000);
	td_child_go(&tc);
	td_child_wait(&tc, 10000);
	idle_end(&ia);
	idle_end(&ib);
	td_fini(&t);
}
END_TEST

struct refused {
	const char *sock;
	uid_t uid;
};

/* Reports "refused ERR MSG" (ERR 0: no ERROR within 20 s). */
static int refused_main(void *arg, int rep, int go)
{
	const struct refused *a = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { 20, 0 };
	union {
		char buf[PROTO_MSG_MAX];
		struct proto_error e;
	} u;
	char err[256];
	ssize_t n;
	int fd, rc;

	(void)go;
	if ((rc = become(a->uid)) < 0) {
		td_report(rep, "refused 0 cannot become uid %u", (unsigned)a->uid);
		return 9;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", a->sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		td_report(rep, "refused 0 connect: %s", strerror(errno));
		return 1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = recv(fd, u.buf, sizeof(u.buf), 0);
	if (n > 0 && proto_check(u.buf, (size_t)n, err, sizeof(err)) == PROTO_ERROR)
		td_report(rep, "refused %d %s", u.e.err, u.e.msg);
	else
		td_report(rep, "refused 0 (no ERROR)");
	close(fd);
	return 0;
}

static int refused_as(struct testd *t, uid_t uid, char *msg, size_t len)
{
	struct refused a = { .sock = td_sock(t, 0), .uid = uid };
	struct td_child ch;
	int rc;

	memset(&ch, 0, sizeof(ch));
	ck_assert_int_eq(td_child_start(&ch, refused_main, &a), 0);
	rc = rk_expect(&ch, "refused", 60000, msg, len);
	td_child_wait(&ch, 10000);
	return rc;
}

/*
 * A trainer of uid A that saved with CKPT_CONNECT_RESIDENT is killed: its
 * job then lives on only in the daemon's memory.  Another uid connecting
 * with the job's name is refused (before, it got in, and then the owner's
 * restart was refused: "job ... belongs to another user"), and the
 * owner's restart restores from memory, its shard deleted.
 */
START_TEST(test_crashed_job_owned)
{
	struct testd t;
	struct td_child a, b, a2;
	struct rk ra = { .job = "crashed", .name = "ck", .world = 1, .step = 5, .uid = UID_A,
			 .umask = -1, .seed = 71, .bytes = 3 * MiB, .hold = true,
			 .flags = CKPT_CONNECT_RESIDENT };
	struct rk rb = { .job = "crashed", .name = "squat", .world = 1, .step = 1, .uid = UID_B,
			 .umask = -1, .seed = 72, .bytes = 1 * MiB };
	struct ld la = { .job = "crashed", .uid = UID_A, .rank = 0, .bytes = 3 * MiB, .seed = 71 };
	char root[TD_PATH], broot[TD_PATH], ck[TD_PATH], p[TD_PATH], msg[512];
	int st, rc;

	if (!need_root("crashed_job_owned"))
		return;
	td_init(&t, "crashed_job_owned");
	open_up(&t);
	td_path(root, sizeof(root), "%s/alice", t.root);
	user_dir(root, UID_A, 0755);
	td_path(broot, sizeof(broot), "%s/bob", t.root);
	user_dir(broot, UID_B, 0755);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\nsocket_mode = 0666\n"), 0);
	ra.sock = rb.sock = la.sock = td_sock(&t, 0);
	ra.root = root;
	rb.root = broot;

	rk_start(&a, &ra);
	ck_assert_msg(rk_expect(&a, "committed", 60000, msg, sizeof(msg)) == 0, "%s", msg);
	kill(a.pid, SIGKILL);
	st = td_child_wait(&a, 10000);
	ck_assert_msg(st >= 0 && WIFSIGNALED(st), "the trainer ended with %s", td_status_str(st));
	/* Nothing of the job is left but its image. */
	wait_image_alone(&t, "crashed");

	/* Another user takes the name: refused, and nothing of its is saved. */
	rk_start(&b, &rb);
	rc = rk_expect(&b, "connect", 30000, msg, sizeof(msg));
	ck_assert_msg(rc == -EACCES, "another uid took a crashed job with resident images: %d (%s)",
		      rc, msg);
	ck_assert_msg(strstr(msg, "belongs to another user"), "refusal does not say why: %s", msg);
	td_child_wait(&b, 10000);
	ck_assert_int_eq(td_count_entries(broot, ""), 0);

	/* The owner's restart gets in and restores from memory. */
	td_path(ck, sizeof(ck), "%s/ck", root);
	td_path(p, sizeof(p), "%s/rank-00000.safetensors", ck);
	ck_assert_int_eq(unlink(p), 0);
	la.path = ck;
	memset(&a2, 0, sizeof(a2));
	ck_assert_int_eq(td_child_start(&a2, ld_main, &la), 0);
	rc = rk_expect(&a2, "connect", 30000, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "the owner's restart was refused: %d (%s)", rc, msg);
	expect_loaded_from_memory(&a2);
	td_child_wait(&a2, 10000);
	td_fini(&t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("adversarial");

	td_case(s, "two_jobs_similar_names", test_two_jobs_similar_names, 180, 0, 1);
	td_case(s, "squatted_work_area", test_squatted_work_area, 120, 0, 1);
	td_case(s, "retry_never_adopts", test_retry_never_adopts, 240, 0, 2);
	td_case(s, "no_commit_before_every_rank", test_no_commit_before_every_rank, 240, 0, 1);
	td_case(s, "job_owner_persists", test_job_owner_persists, 180, 0, 1);
	td_case(s, "client_rights", test_client_rights, 120, 0, 1);
	td_case(s, "idle_connections", test_idle_connections, 120, 0, 1);
	td_case(s, "deep_leftovers", test_deep_leftovers, 180, 0, 2);
	td_case(s, "unread_answers", test_unread_answers, 120, 0, 1);
	td_case(s, "arena_share", test_arena_share, 180, 0, 1);
	td_case(s, "fair_admission", test_fair_admission, 240, 0, 1);
	td_case(s, "crashed_job_owned", test_crashed_job_owned, 180, 0, 1);
	return td_main(s, "check_adversarial");
}
