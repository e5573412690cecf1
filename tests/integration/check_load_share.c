/* SPDX-License-Identifier: MIT */
/*
 * check_load_share.c - integration: loaders of one node share their reads
 * through ckptd's pool of their user and job (daemon/share.h), driven
 * through the real libckpt.
 *
 * A checkpoint is saved by 8 rank processes, each holding a band of rows of
 * two F32 tensors whose rows are short (12-16 KiB), so every 1 MiB CRC
 * block of every shard holds rows of every column band.  Then three loaders
 * (threads of the test, each with its own client) load one column band
 * each: each needs every block of every shard, so without the pool the
 * disk would be read three times.  Checked: every loaded byte against the
 * saved pattern; ckptd's own count of the bytes it read from storage
 * (status loads.disk_bytes) grows by the shards' size once, not three
 * times, and the loaders say they got bytes from one another's reads
 * (bytes_shared); nothing stays in the pool once the loads are done.
 * CKPT_LOAD_SHARE=0 turns sharing off for a client.  A shard truncated
 * while its old bytes are in the pool fails the load naming the file, and
 * the daemon serves the next save and loads.  A loader's read that starts
 * past the end of a file cut within the cell it starts in, while the only
 * room the pool has left is its last 4 KiB (load_share 16M, filled by
 * another checkpoint's cells), fails that load as a truncated file, and its
 * client goes on saving and loading (earlier builds answered it with an
 * offset past the pool's end, and the library dropped the connection).
 * As root: loaders of another uid, loading the same files at the same
 * time, get nothing from the first uid's pool, only from their own.
 */
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 60000
#define SAVE_WORLD 8
#define N_LOADERS 3
#define MAX_DEFS 2
/* 16 slots of 8 MiB: a loader's read of a shard of bands_defs (one read
 * per shard, 8.75 MiB from the end of its header) takes 2 slots, so its 8
 * load threads never wait for slots (a thread that waited 2 s would read
 * by itself: bytes_daemon < bytes_read, which the checks name). */
#define LOADER_ARENA (128 * MiB)
/* Every loader arena and pool of a case fit arena_total (the other-user
 * case has two pools and four loaders), so no pool is refused or freed for
 * room; a pool (256 MiB) holds every cell of the checkpoint (16 cells, of
 * 8 MiB and 0.75 MiB), so nothing is evicted (its status says "evicted" 0,
 * "refused" 0) and each cell is read once while the loads hold their
 * files. */
#define DAEMON_CONF \
	"arena_max = 128M\narena_total = 2G\nload_share = 256M\ncommit_deadline = 60s\n"
#define UID_NOBODY 65534

/* ---- the checkpoint ------------------------------------------------------- */

/* An F32 [rows, cols] tensor whose bytes are stream `seed`. */
struct tdef {
	const char *name;
	uint64_t shape[2];
	uint64_t seed;
};

/* 64 MiB + 6 MiB: 8.75 MiB per shard, two 8 MiB cells per file. */
static const struct tdef bands_defs[] = {
	{ "w", { 4096, 4096 }, 601 }, /* 16 KiB rows */
	{ "e", { 512, 3072 }, 602 },  /* 12 KiB rows */
};
#define N_BANDS_DEFS (sizeof(bands_defs) / sizeof(bands_defs[0]))

/* The checkpoint a single rank saves after the damage (case truncated). */
static const struct tdef fresh_defs[] = {
	{ "x", { 2048, 4096 }, 701 }, /* 32 MiB */
};

struct save_args {
	const char *sock, *root, *name;
	uint32_t rank;
};

/* A saving rank process: rows [R*rank/8, R*(rank+1)/8) of every tensor of
 * bands_defs.  Reports; the parent asserts. */
static int save_rank(void *arg, int rep, int go)
{
	const struct save_args *a = arg;
	struct ckpt_client *c = NULL;
	struct ckpt_save *sv = NULL;
	char msg[512];
	void *bufs[N_BANDS_DEFS] = { 0 };
	uint64_t offs[N_BANDS_DEFS][2], shape[N_BANDS_DEFS][2];
	int rc, st, cm;

	(void)go;
	rc = td_connect_rc(a->sock, "loadshare-save", a->rank, SAVE_WORLD, 16 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "connect %d: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 1, &sv);
	if (rc < 0) {
		td_report(rep, "begin %d: %s", rc, ckpt_last_error());
		return 12;
	}
	for (unsigned i = 0; i < N_BANDS_DEFS; i++) {
		const struct tdef *d = &bands_defs[i];

		offs[i][0] = d->shape[0] * a->rank / SAVE_WORLD;
		offs[i][1] = 0;
		shape[i][0] = d->shape[0] * (a->rank + 1) / SAVE_WORLD - offs[i][0];
		shape[i][1] = d->shape[1];
		bufs[i] = malloc(td_nbytes(4, 2, shape[i]));
		if (!bufs[i])
			return 10;
		td_fill_chunk(bufs[i], 4, 2, d->shape, offs[i], shape[i], d->seed);
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = d->name, .dtype = CKPT_F32,
					  .ndim = 2, .shape = shape[i], .data = bufs[i],
					  .global_shape = d->shape, .offsets = offs[i] };
		rc = ckpt_save_add_tensor(sv, &tn);
		if (rc < 0) {
			td_report(rep, "add %s %d: %s", d->name, rc, ckpt_last_error());
			return 13;
		}
	}
	rc = td_commit_wait(sv, WAIT_MS, &st, &cm, msg, sizeof(msg));
	if (rc < 0) {
		td_report(rep, "commit %d: %s", rc, msg);
		return 14;
	}
	td_report(rep, "committed %d %s", cm, msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	for (unsigned i = 0; i < N_BANDS_DEFS; i++)
		free(bufs[i]);
	return st == 0 && cm == 0 ? 0 : 1;
}

/* 8 rank processes save bands_defs as <root>/<name>; its path into path.
 * Forks: only while this process has no client. */
static void save_bands(struct testd *t, const char *name, char *path, size_t len)
{
	struct td_child ch[SAVE_WORLD];
	struct save_args a[SAVE_WORLD];

	for (uint32_t r = 0; r < SAVE_WORLD; r++) {
		a[r] = (struct save_args){ .sock = td_sock(t, 0), .root = t->root, .name = name,
					   .rank = r };
		ck_assert_int_eq(td_child_start(&ch[r], save_rank, &a[r]), 0);
	}
	for (uint32_t r = 0; r < SAVE_WORLD; r++) {
		int st = td_child_wait(&ch[r], 90000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
	td_path(path, len, "%s/%s", t->root, name);
}

/* One rank of this process saves defs whole as <root>/<name>. */
static void save_whole(struct testd *t, const char *name, const struct tdef *defs, unsigned n,
		       char *path, size_t len)
{
	struct ckpt_client *c = td_connect(td_sock(t, 0), "loadshare-fresh", 0, 1, 64 * MiB);
	struct ckpt_save *sv;
	void *bufs[MAX_DEFS] = { 0 };
	uint64_t zero[2] = { 0, 0 };
	char msg[512];
	int st, cm;

	ck_assert_uint_le(n, MAX_DEFS);
	ck_assert_int_eq(ckpt_save_begin(c, t->root, name, 1, &sv), 0);
	for (unsigned i = 0; i < n; i++) {
		bufs[i] = malloc(td_nbytes(4, 2, defs[i].shape));
		ck_assert_ptr_nonnull(bufs[i]);
		td_fill_chunk(bufs[i], 4, 2, defs[i].shape, zero, defs[i].shape, defs[i].seed);
		td_add(sv, defs[i].name, CKPT_F32, 2, defs[i].shape, bufs[i]);
	}
	ck_assert_int_eq(td_commit_wait(sv, WAIT_MS, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == 0 && cm == 0, "save %s: staged %d, committed %d: %s", name, st, cm,
		      msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	for (unsigned i = 0; i < n; i++)
		free(bufs[i]);
	td_path(path, len, "%s/%s", t->root, name);
}

/* The bytes of the checkpoint's shard files (what one read of every cell
 * of them costs the disk); asserts there are `files` of them. */
static uint64_t shard_bytes(const char *path, unsigned files)
{
	DIR *d = opendir(path);
	struct dirent *e;
	uint64_t sum = 0;
	unsigned n = 0;

	ck_assert_msg(d, "opendir %s: %s", path, strerror(errno));
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		char p[TD_PATH];
		struct stat sb;

		if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors"))
			continue;
		td_path(p, sizeof(p), "%s/%s", path, e->d_name);
		ck_assert_int_eq(stat(p, &sb), 0);
		sum += (uint64_t)sb.st_size;
		n++;
	}
	closedir(d);
	ck_assert_uint_eq(n, files);
	return sum;
}

/* ---- a loader --------------------------------------------------------------- */

/*
 * One load of columns [C*band/n_bands, C*(band+1)/n_bands) of rows
 * [row0, row0 + rows) (rows 0: all from row0) of the first n_defs tensors
 * of defs, through client c.  loader_begin/run/end may run on any thread (no ck_assert
 * there: they record what failed); loader_verify asserts.
 */
struct loader {
	const char *path;
	const struct tdef *defs;
	unsigned n_defs;
	unsigned band, n_bands;
	uint64_t rows;
	uint64_t row0;   /* the first row loaded (rows 0: all from there) */
	struct ckpt_client *c;
	pthread_barrier_t *start, *finish; /* loader_main only */
	/* between loader_begin and loader_end */
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	/* kept until loader_release */
	float *mem[MAX_DEFS];
	uint64_t offs[MAX_DEFS][2], shape[MAX_DEFS][2];
	/* outcome */
	int rc;          /* the first failed call or the done future's result */
	char msg[1024];
	struct ckpt_load_stats st;
};

static int loader_fail(struct loader *l, int rc, const char *what, const char *why)
{
	if (!l->rc) {
		l->rc = rc;
		snprintf(l->msg, sizeof(l->msg), "%s: %d %s", what, rc, why);
	}
	return rc;
}

/* Opens the reader, describes the load and sets the client.  0 or -errno. */
static int loader_begin(struct loader *l)
{
	int rc;

	l->rc = 0;
	l->msg[0] = '\0';
	l->st = (struct ckpt_load_stats){ CKPT_LOAD_STATS_INIT };
	rc = ckpt_reader_open(l->path, &l->rd);
	if (rc < 0)
		return loader_fail(l, rc, "reader_open", ckpt_last_error());
	rc = ckpt_load_begin(l->rd, 0, &l->ld);
	if (rc < 0)
		return loader_fail(l, rc, "load_begin", ckpt_last_error());
	for (unsigned i = 0; i < l->n_defs; i++) {
		const struct tdef *d = &l->defs[i];
		uint64_t c0 = d->shape[1] * l->band / l->n_bands;
		uint64_t c1 = d->shape[1] * (l->band + 1) / l->n_bands;

		l->offs[i][0] = l->row0;
		l->offs[i][1] = c0;
		l->shape[i][0] = l->rows ? l->rows : d->shape[0] - l->row0;
		l->shape[i][1] = c1 - c0;
		l->mem[i] = malloc(td_nbytes(4, 2, l->shape[i]));
		if (!l->mem[i])
			return loader_fail(l, -ENOMEM, "malloc", "out of memory");
		/* Not the pattern: bytes never written cannot pass for loaded. */
		memset(l->mem[i], 0xA5, td_nbytes(4, 2, l->shape[i]));
		struct ckpt_load_dst dst = { CKPT_LOAD_DST_INIT, .offsets = l->offs[i],
					     .shape = l->shape[i], .data = l->mem[i] };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32,
					       .name = d->name, .ndim = 2,
					       .global_shape = d->shape, .n_dsts = 1,
					       .dsts = &dst };
		rc = ckpt_load_add_tensor(l->ld, &lt);
		if (rc < 0)
			return loader_fail(l, rc, "add_tensor", ckpt_last_error());
	}
	rc = ckpt_load_set_client(l->ld, l->c);
	if (rc < 0)
		return loader_fail(l, rc, "set_client", ckpt_last_error());
	return 0;
}

/* Starts the load and waits for it; l->rc and l->msg say how it ended. */
static void loader_run(struct loader *l)
{
	int rc = ckpt_load_start(l->ld, &l->done);

	if (rc < 0) {
		loader_fail(l, rc, "start", ckpt_last_error());
		return;
	}
	rc = td_future_wait(l->done, WAIT_MS);
	if (rc)
		loader_fail(l, rc, "load", ckpt_future_error(l->done));
	rc = ckpt_load_stats(l->ld, &l->st);
	if (rc < 0)
		loader_fail(l, rc, "stats", ckpt_last_error());
}

/* Frees the load (which gives its files back to the daemon) and the
 * reader; the destinations stay for loader_verify. */
static void loader_end(struct loader *l)
{
	ckpt_load_free(l->ld);
	ckpt_reader_close(l->rd);
	l->ld = NULL;
	l->rd = NULL;
}

static void loader_release(struct loader *l)
{
	for (unsigned i = 0; i < l->n_defs; i++) {
		free(l->mem[i]);
		l->mem[i] = NULL;
	}
}

/* True if every destination holds the saved bytes; else says where not. */
static bool loader_check(const struct loader *l, char *why, size_t len)
{
	for (unsigned i = 0; i < l->n_defs; i++) {
		const struct tdef *d = &l->defs[i];
		uint64_t n = td_nbytes(4, 2, l->shape[i]);
		uint8_t *want = malloc(n);

		if (!want) {
			snprintf(why, len, "out of memory");
			return false;
		}
		td_fill_chunk(want, 4, 2, d->shape, l->offs[i], l->shape[i], d->seed);
		if (memcmp(want, l->mem[i], n)) {
			const uint8_t *got = (const uint8_t *)l->mem[i];
			uint64_t b = 0;
			while (got[b] == want[b])
				b++;
			snprintf(why, len, "'%s' band %u: byte %llu (row %llu) differs", d->name,
				 l->band, (unsigned long long)b,
				 (unsigned long long)(b / 4 / l->shape[i][1]));
			free(want);
			return false;
		}
		free(want);
	}
	return true;
}

static void loader_verify(const struct loader *l, const char *who)
{
	char why[256];

	ck_assert_msg(l->rc == 0, "%s: %s", who, l->msg);
	ck_assert_msg(loader_check(l, why, sizeof(why)), "%s: %s", who, why);
}

/* A loader's thread: describe, wait for the others, load, and keep the
 * files lent until every loader is done (see run_loaders). */
static void *loader_main(void *arg)
{
	struct loader *l = arg;
	int rc = loader_begin(l);

	pthread_barrier_wait(l->start);
	if (rc == 0)
		loader_run(l);
	pthread_barrier_wait(l->finish);
	loader_end(l);
	return NULL;
}

/*
 * Runs n loaders at once, each on its own thread; they start together.
 * None frees its load (giving its files back) before all are done: the
 * pool keeps cells only while some loader has their file lent, so this
 * makes "each cell read once" hold however the threads are scheduled,
 * rather than only when the loads happen to overlap.
 */
static void run_loaders(struct loader *l, unsigned n)
{
	pthread_barrier_t start, finish;
	pthread_t th[N_LOADERS];

	ck_assert_uint_le(n, N_LOADERS);
	ck_assert_int_eq(pthread_barrier_init(&start, NULL, n), 0);
	ck_assert_int_eq(pthread_barrier_init(&finish, NULL, n), 0);
	for (unsigned k = 0; k < n; k++) {
		l[k].start = &start;
		l[k].finish = &finish;
		ck_assert_int_eq(pthread_create(&th[k], NULL, loader_main, &l[k]), 0);
	}
	for (unsigned k = 0; k < n; k++)
		ck_assert_int_eq(pthread_join(th[k], NULL), 0);
	pthread_barrier_destroy(&start);
	pthread_barrier_destroy(&finish);
}

/* ---- ckptd's view ------------------------------------------------------------- */

/* What the status report says about loads.  The node's totals are shown
 * to root only (totals: they were there); the pool fields are those of the
 * pool of the (uid, job) asked about (have: there is one). */
struct loads_now {
	bool totals;
	int64_t disk, shared, pool_bytes;
	size_t n_pools;
	unsigned of_uid;       /* pools listed for the uid */
	bool have, ready;
	int64_t bytes;         /* the pool's size */
	int64_t entries, pins, held;
	int64_t evicted, refused;  /* cells dropped for room, reads not taken */
};

static char *status_text(struct testd *t)
{
	char *out = NULL;
	int st = td_ckptctl(&out, "-s", td_sock(t, 0), "status", "--json", NULL);

	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl status --json: %s: %s", td_status_str(st), out ? out : "");
	return out;
}

static int64_t int_field(json_t *o, const char *key, const char *text)
{
	json_t *v = json_object_get(o, key);

	ck_assert_msg(json_is_integer(v), "no integer \"%s\" in the status: %s", key, text);
	return (int64_t)json_integer_value(v);
}

/* job NULL: any pool of the uid (a pool that names no job is the uid's). */
static void loads_now(struct testd *t, uid_t uid, const char *job, struct loads_now *ret)
{
	char *out = status_text(t);
	json_error_t je;
	json_t *j = json_loads(out, 0, &je), *loads, *pools, *p;
	size_t i;

	ck_assert_msg(j, "status is not JSON (%s): %s", je.text, out);
	loads = json_object_get(j, "loads");
	ck_assert_msg(json_is_object(loads), "no \"loads\" in the status: %s", out);
	pools = json_object_get(loads, "pools");
	ck_assert_msg(json_is_array(pools), "no \"loads.pools\" in the status: %s", out);
	memset(ret, 0, sizeof(*ret));
	ret->totals = json_object_get(loads, "disk_bytes") != NULL;
	ck_assert_msg(ret->totals || geteuid() != 0, "root sees no loads.disk_bytes: %s", out);
	if (ret->totals) {
		ret->disk = int_field(loads, "disk_bytes", out);
		ret->shared = int_field(loads, "shared_bytes", out);
		ret->pool_bytes = int_field(loads, "pool_bytes", out);
	}
	ret->n_pools = json_array_size(pools);
	json_array_foreach(pools, i, p) {
		const char *pj = json_string_value(json_object_get(p, "job"));

		if (int_field(p, "uid", out) != (int64_t)uid)
			continue;
		ret->of_uid++;
		if (job && pj && strcmp(pj, job))
			continue;
		ck_assert_msg(!ret->have, "two pools of uid %u job %s: %s", (unsigned)uid,
			      job ? job : "(any)", out);
		ret->have = true;
		ck_assert_msg(json_is_boolean(json_object_get(p, "ready")), "pool: %s", out);
		ret->ready = json_is_true(json_object_get(p, "ready"));
		ret->bytes = int_field(p, "bytes", out);
		ret->entries = int_field(p, "entries", out);
		ret->pins = int_field(p, "pins", out);
		ret->held = int_field(p, "held_bytes", out);
		ret->evicted = int_field(p, "evicted", out);
		ret->refused = int_field(p, "refused", out);
	}
	json_decref(j);
	free(out);
}

/* Polls (bounded, 20 s) until the pool of (uid, job) is ready. */
static void wait_pool_ready(struct testd *t, uid_t uid, const char *job)
{
	int64_t end = td_now_ms() + 20000;
	struct loads_now s;

	for (;;) {
		loads_now(t, uid, job, &s);
		if (s.have && s.ready)
			return;
		if (td_now_ms() >= end) {
			char *text = status_text(t);
			ck_abort_msg("after 20 s there is no ready pool of uid %u job %s: %s",
				     (unsigned)uid, job, text);
		}
		td_sleep_ms(50);
	}
}

/* Polls (bounded, 15 s) until the pool of (uid, job) holds no entry and no
 * pin: nothing is kept once no load has the files lent. */
static void wait_pool_empty(struct testd *t, uid_t uid, const char *job)
{
	int64_t end = td_now_ms() + 15000;
	struct loads_now s;

	for (;;) {
		loads_now(t, uid, job, &s);
		ck_assert_msg(s.have, "the pool of uid %u job %s is gone", (unsigned)uid, job);
		if (s.entries == 0 && s.pins == 0 && s.held == 0)
			return;
		if (td_now_ms() >= end) {
			char *text = status_text(t);
			ck_abort_msg("after 15 s the pool of uid %u job %s still holds "
				     "something: %s",
				     (unsigned)uid, job, text);
		}
		td_sleep_ms(50);
	}
}

/*
 * Small loads (16 rows of the first tensor) through a and b, clients of
 * job `job`, the first kept until the second is done: the pool of the job
 * is made once two of its clients have the same file lent (earlier builds:
 * on its first read), on a worker, and until it is ready reads land in the
 * clients' arenas.  So the measured loads come after it is ready.  Without
 * a child process to spare (the nobody case), returns false instead of
 * asserting when a load failed, with why.
 */
static bool warm_up_rc(const char *path, const struct tdef *defs, struct ckpt_client *a,
		       struct ckpt_client *b, char *why, size_t len)
{
	struct loader l[2];
	bool ok = true;

	for (unsigned k = 0; k < 2; k++) {
		l[k] = (struct loader){ .path = path, .defs = defs, .n_defs = 1, .band = 0,
					.n_bands = 1, .rows = 16, .c = k ? b : a };
		if (loader_begin(&l[k]) == 0)
			loader_run(&l[k]);
	}
	for (unsigned k = 0; k < 2; k++) {
		loader_end(&l[k]);
		if (ok && l[k].rc) {
			snprintf(why, len, "warm-up load %u: %s", k, l[k].msg);
			ok = false;
		} else if (ok && !loader_check(&l[k], why, len)) {
			ok = false;
		} else if (ok && l[k].st.bytes_daemon == 0) {
			snprintf(why, len, "warm-up load %u read nothing through ckptd", k);
			ok = false;
		}
		loader_release(&l[k]);
	}
	return ok;
}

/* Warms up the pool of job with the first tensor of defs (of path). */
static void warm_up_defs(struct testd *t, const char *path, const struct tdef *defs,
			 const char *job, struct ckpt_client *a, struct ckpt_client *b)
{
	char why[1024];

	ck_assert_msg(warm_up_rc(path, defs, a, b, why, sizeof(why)), "%s", why);
	wait_pool_ready(t, geteuid(), job);
}

static void warm_up(struct testd *t, const char *path, const char *job, struct ckpt_client *a,
		    struct ckpt_client *b)
{
	warm_up_defs(t, path, bands_defs, job, a, b);
}

#define LOAD_JOB "loadshare-load"

/* Three loaders of the column bands of bands_defs, clients c[k]. */
static void bands_loaders(struct loader *l, const char *path, struct ckpt_client **c)
{
	for (unsigned k = 0; k < N_LOADERS; k++)
		l[k] = (struct loader){ .path = path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
					.band = k, .n_bands = N_LOADERS, .c = c[k] };
}

/* Ranks of one job: a pool serves the loaders of one job. */
static void connect_loaders(struct testd *t, struct ckpt_client **c)
{
	for (unsigned k = 0; k < N_LOADERS; k++)
		c[k] = td_connect(td_sock(t, 0), LOAD_JOB, k, N_LOADERS, LOADER_ARENA);
}

/* ---- 1. three column bands: the disk is read once ------------------------------ */

START_TEST(test_three_bands)
{
	struct testd t;
	struct ckpt_client *c[N_LOADERS];
	struct loader l[N_LOADERS];
	struct loads_now before, after;
	char path[TD_PATH], who[32];
	uint64_t total, sum_read = 0, sum_daemon = 0, sum_shared = 0, own = 0;
	int64_t disk;

	/* Whatever the environment of the run says: these clients share. */
	unsetenv("CKPT_LOAD_SHARE");
	td_init(&t, "three_bands");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	save_bands(&t, "bands", path, sizeof(path));
	total = shard_bytes(path, SAVE_WORLD);
	connect_loaders(&t, c);
	warm_up(&t, path, LOAD_JOB, c[0], c[1]);

	loads_now(&t, geteuid(), LOAD_JOB, &before);
	bands_loaders(l, path, c);
	run_loaders(l, N_LOADERS);
	loads_now(&t, geteuid(), LOAD_JOB, &after);

	for (unsigned k = 0; k < N_LOADERS; k++) {
		snprintf(who, sizeof(who), "loader %u", k);
		loader_verify(&l[k], who);
		/* Each band needs a part of every CRC block: nearly all of every
		 * shard, and all of it through ckptd (no read fell back to the
		 * library's own). */
		ck_assert_msg(l[k].st.bytes_daemon == l[k].st.bytes_read,
			      "%s: %llu of %llu bytes read through ckptd", who,
			      (unsigned long long)l[k].st.bytes_daemon,
			      (unsigned long long)l[k].st.bytes_read);
		ck_assert_uint_le(l[k].st.bytes_shared, l[k].st.bytes_daemon);
		sum_read += l[k].st.bytes_read;
		sum_daemon += l[k].st.bytes_daemon;
		sum_shared += l[k].st.bytes_shared;
		own += l[k].st.bytes_daemon - l[k].st.bytes_shared;
	}
	printf("three_bands: shards %llu bytes, loaders read %llu (%llu shared)\n",
	       (unsigned long long)total, (unsigned long long)sum_read,
	       (unsigned long long)sum_shared);
	ck_assert_msg(sum_read >= total * 5 / 2,
		      "the loaders read %llu bytes of %llu: they did not each need the shards",
		      (unsigned long long)sum_read, (unsigned long long)total);
	ck_assert_msg(sum_shared > 0, "no loader got a byte another had read: %llu of %llu",
		      (unsigned long long)sum_shared, (unsigned long long)sum_daemon);
	/* The pool had room for every cell: the one reason it may read a
	 * cell twice (its first copy evicted, or a read it could not take)
	 * did not arise. */
	ck_assert_msg(after.evicted == before.evicted && after.refused == before.refused,
		      "the pool evicted %lld cells and refused %lld reads during the loads",
		      (long long)(after.evicted - before.evicted),
		      (long long)(after.refused - before.refused));
	/* Each cell was read for one loader and given to the others, however
	 * the loaders' reads were cut and whichever came first: what the
	 * loaders did not get from another's read is about the shards once,
	 * not three times. */
	ck_assert_msg(own * 10 <= total * 11,
		      "the loaders got %llu bytes not from another's read, of %llu bytes of "
		      "shards: more than one read of each",
		      (unsigned long long)own, (unsigned long long)total);
	if (!after.totals) {
		td_skip("three_bands_disk", "ckptd shows its loads.disk_bytes only to root");
	} else {
		disk = after.disk - before.disk;
		printf("three_bands: ckptd read %lld bytes, shared %lld\n", (long long)disk,
		       (long long)(after.shared - before.shared));
		ck_assert_msg(disk >= 0 && (uint64_t)disk * 10 <= total * 11,
			      "ckptd read %lld bytes from storage for %llu bytes of shards (more "
			      "than 1.1 times): the loaders did not share",
			      (long long)disk, (unsigned long long)total);
		ck_assert_msg((uint64_t)disk * 10 >= total * 9,
			      "ckptd read %lld bytes from storage for %llu bytes of shards needed",
			      (long long)disk, (unsigned long long)total);
		/* What a loader did not get from another's read, ckptd read for
		 * it. */
		ck_assert_msg(own <= (uint64_t)disk,
			      "the loaders got %llu bytes not shared, ckptd read only %lld",
			      (unsigned long long)own, (long long)disk);
		/* ckptd counts the bytes it answered from another's read on
		 * the O_DIRECT grid; the loaders only those of their reads. */
		ck_assert_msg(after.shared - before.shared >= (int64_t)sum_shared,
			      "ckptd says it shared %lld bytes, the loaders %llu",
			      (long long)(after.shared - before.shared),
			      (unsigned long long)sum_shared);
	}

	/* The loads are freed: nothing stays in the pool. */
	wait_pool_empty(&t, geteuid(), LOAD_JOB);
	for (unsigned k = 0; k < N_LOADERS; k++) {
		loader_release(&l[k]);
		ckpt_disconnect(c[k]);
	}
	td_fini(&t);
}
END_TEST

/* ---- 2. CKPT_LOAD_SHARE=0: every loader reads for itself ------------------------- */

START_TEST(test_no_share_env)
{
	struct testd t;
	struct ckpt_client *c[N_LOADERS];
	struct loader l[N_LOADERS];
	struct loads_now before, after;
	char path[TD_PATH], who[32];
	uint64_t total;
	int64_t disk;

	td_init(&t, "no_share_env");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	save_bands(&t, "bands", path, sizeof(path));
	total = shard_bytes(path, SAVE_WORLD);
	/* Read at ckpt_connect: the clients keep what they saw. */
	ck_assert_int_eq(setenv("CKPT_LOAD_SHARE", "0", 1), 0);
	connect_loaders(&t, c);
	ck_assert_int_eq(unsetenv("CKPT_LOAD_SHARE"), 0);

	loads_now(&t, geteuid(), LOAD_JOB, &before);
	bands_loaders(l, path, c);
	run_loaders(l, N_LOADERS);
	loads_now(&t, geteuid(), LOAD_JOB, &after);

	for (unsigned k = 0; k < N_LOADERS; k++) {
		snprintf(who, sizeof(who), "loader %u", k);
		loader_verify(&l[k], who);
		ck_assert_msg(l[k].st.bytes_daemon == l[k].st.bytes_read,
			      "%s: %llu of %llu bytes read through ckptd", who,
			      (unsigned long long)l[k].st.bytes_daemon,
			      (unsigned long long)l[k].st.bytes_read);
		ck_assert_msg(l[k].st.bytes_shared == 0, "%s: %llu bytes shared without the pool",
			      who, (unsigned long long)l[k].st.bytes_shared);
	}
	/* No client asked for the pool: none was made. */
	ck_assert_uint_eq(after.n_pools, 0);
	if (!after.totals) {
		td_skip("no_share_env_disk", "ckptd shows its loads.disk_bytes only to root");
	} else {
		disk = after.disk - before.disk;
		printf("no_share_env: shards %llu bytes, disk read %lld\n",
		       (unsigned long long)total, (long long)disk);
		ck_assert_msg(disk >= 0 && (uint64_t)disk * 2 >= total * 5,
			      "ckptd read %lld bytes for three loads of %llu bytes of shards "
			      "each, without sharing",
			      (long long)disk, (unsigned long long)total);
		ck_assert_int_eq(after.shared, before.shared);
		ck_assert_int_eq(after.pool_bytes, 0);
	}
	for (unsigned k = 0; k < N_LOADERS; k++) {
		loader_release(&l[k]);
		ckpt_disconnect(c[k]);
	}
	td_fini(&t);
}
END_TEST

/* ---- 3. a shard cut while its old bytes are in the pool -------------------------- */

START_TEST(test_truncated_while_shared)
{
	struct testd t;
	struct ckpt_client *a, *b;
	struct loader la, lb, x1, x2;
	char path[TD_PATH], shard[TD_PATH], fresh[TD_PATH];
	struct stat sb;

	unsetenv("CKPT_LOAD_SHARE");
	td_init(&t, "truncated_while_shared");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	save_bands(&t, "bands", path, sizeof(path));
	a = td_connect(td_sock(&t, 0), LOAD_JOB, 0, 2, LOADER_ARENA);
	b = td_connect(td_sock(&t, 0), LOAD_JOB, 1, 2, LOADER_ARENA);
	warm_up(&t, path, LOAD_JOB, a, b);

	/* a loads band 0 and keeps its files lent: every cell of every shard
	 * stays in the pool, under the files as they were. */
	la = (struct loader){ .path = path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
			      .band = 0, .n_bands = N_LOADERS, .c = a };
	if (loader_begin(&la) == 0)
		loader_run(&la);
	loader_verify(&la, "band 0");

	/* Cut rank 3's shard in half behind everybody's back. */
	td_path(shard, sizeof(shard), "%s/rank-00003.safetensors", path);
	ck_assert_int_eq(stat(shard, &sb), 0);
	ck_assert_int_eq(truncate(shard, sb.st_size / 2), 0);

	/* b's load must not be answered with the old bytes, nor succeed. */
	lb = (struct loader){ .path = path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
			      .band = 1, .n_bands = N_LOADERS, .c = b };
	if (loader_begin(&lb) == 0)
		loader_run(&lb);
	ck_assert_msg(lb.rc != 0, "the load of a truncated shard succeeded");
	ck_assert_msg(lb.rc == -EBADMSG, "load of a truncated shard: %s", lb.msg);
	ck_assert_msg(strstr(lb.msg, "rank-00003.safetensors") &&
			      (strstr(lb.msg, "truncated") || strstr(lb.msg, "CRC mismatch")),
		      "the error does not name the truncated shard: %s", lb.msg);
	loader_end(&lb);
	loader_end(&la);
	loader_release(&la);
	loader_release(&lb);
	wait_pool_empty(&t, geteuid(), LOAD_JOB);

	/* The daemon goes on: a new save, loaded by two loaders whose loads
	 * overlap (the first keeps its files lent), the second getting every
	 * byte from the first one's reads.  The first loads the whole tensor:
	 * CRC blocks lie on the file's MiB grid, so the last 4 KiB of the file
	 * (the end of the last row) are in a cell only the right half needs. */
	save_whole(&t, "fresh", fresh_defs, 1, fresh, sizeof(fresh));
	x1 = (struct loader){ .path = fresh, .defs = fresh_defs, .n_defs = 1, .band = 0,
			      .n_bands = 1, .c = a };
	x2 = (struct loader){ .path = fresh, .defs = fresh_defs, .n_defs = 1, .band = 1,
			      .n_bands = 2, .c = b };
	if (loader_begin(&x1) == 0)
		loader_run(&x1);
	loader_verify(&x1, "fresh, whole");
	if (loader_begin(&x2) == 0)
		loader_run(&x2);
	loader_verify(&x2, "fresh band 1");
	ck_assert_msg(x2.st.bytes_daemon == x2.st.bytes_read &&
			      x2.st.bytes_shared == x2.st.bytes_daemon,
		      "the second load of 'fresh': %llu bytes read, %llu through ckptd, %llu "
		      "shared (all of them, from the first load's reads)",
		      (unsigned long long)x2.st.bytes_read, (unsigned long long)x2.st.bytes_daemon,
		      (unsigned long long)x2.st.bytes_shared);
	loader_end(&x1);
	loader_end(&x2);
	loader_release(&x1);
	loader_release(&x2);
	wait_pool_empty(&t, geteuid(), LOAD_JOB);
	ckpt_disconnect(a);
	ckpt_disconnect(b);
	td_fini(&t);
}
END_TEST

/* ---- 4. a pool serves one user ----------------------------------------------------- */

#define NOBODY_JOB "loadshare-nobody"

struct nobody_args {
	const char *sock, *path;
};

/*
 * Two loaders of uid nobody in one process: waits for a go, connects both
 * and warms their pool up (warm_up_rc), reports "warm RC MSG"; waits for a
 * go, loads band 1 and reports "load RC READS READ DAEMON SHARED OK MSG";
 * waits for a go before it frees that load (its files stay lent
 * meanwhile) and leaves.
 */
static int nobody_main(void *arg, int rep, int go)
{
	const struct nobody_args *a = arg;
	struct ckpt_client *c[2] = { NULL, NULL };
	struct loader l = { .path = a->path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
			    .band = 1, .n_bands = N_LOADERS };
	char why[1024] = "";
	bool ok;
	int rc;

	if (setgroups(0, NULL) < 0 || setgid(UID_NOBODY) < 0 || setuid(UID_NOBODY) < 0) {
		td_report(rep, "warm %d cannot become uid %u", -errno, UID_NOBODY);
		return 9;
	}
	/* A change of uid clears the parent-death signal testd.h set. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (td_wait_go(go, WAIT_MS) < 0)
		return 8;
	unsetenv("CKPT_LOAD_SHARE");
	for (uint32_t k = 0; k < 2; k++) {
		rc = td_connect_rc(a->sock, NOBODY_JOB, k, 2, LOADER_ARENA, &c[k]);
		if (rc < 0) {
			td_report(rep, "warm %d connect: %s", rc, ckpt_last_error());
			return 10;
		}
	}
	ok = warm_up_rc(a->path, bands_defs, c[0], c[1], why, sizeof(why));
	td_report(rep, "warm %d %s", ok ? 0 : -EBADMSG, why);
	if (!ok || td_wait_go(go, WAIT_MS) < 0)
		return 11;
	l.c = c[0];
	if (loader_begin(&l) == 0)
		loader_run(&l);
	ok = l.rc == 0 && loader_check(&l, why, sizeof(why));
	td_report(rep, "load %d %llu %llu %llu %llu %d %s%s", l.rc, (unsigned long long)l.st.reads,
		  (unsigned long long)l.st.bytes_read, (unsigned long long)l.st.bytes_daemon,
		  (unsigned long long)l.st.bytes_shared, ok, l.msg, ok ? "" : why);
	td_wait_go(go, WAIT_MS);
	loader_end(&l);
	loader_release(&l);
	ckpt_disconnect(c[0]);
	ckpt_disconnect(c[1]);
	return ok ? 0 : 1;
}

START_TEST(test_other_user_pool)
{
	struct testd t;
	struct td_child ch;
	struct nobody_args na;
	struct ckpt_client *c[2];
	struct loader l;
	struct loads_now mine, theirs;
	char path[TD_PATH], p[TD_PATH], rest[1024];
	unsigned long long reads, rd, dm, sh;
	int rc, ok;

	if (geteuid() != 0) {
		td_skip("other_user_pool", "loading as another user needs root");
		return;
	}
	unsetenv("CKPT_LOAD_SHARE");
	td_init(&t, "other_user_pool");
	/* nobody reaches the socket and reads the checkpoint (0644 files
	 * under 0755 directories: the savers' umask is the test's). */
	ck_assert_int_eq(chmod(t.dir, 0755), 0);
	td_path(p, sizeof(p), "%s/..", t.dir);
	chmod(p, 0755);
	ck_assert_int_eq(chmod(t.sockdir, 0755), 0);
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF "socket_mode = 0666\n"), 0);
	save_bands(&t, "bands", path, sizeof(path));
	ck_assert_int_eq(chmod(path, 0755), 0);

	/* Forked before this process has a client of its own. */
	na = (struct nobody_args){ .sock = td_sock(&t, 0), .path = path };
	ck_assert_int_eq(td_child_start(&ch, nobody_main, &na), 0);

	/* Root loads band 0 and keeps it: every cell is in root's pool. */
	c[0] = td_connect(td_sock(&t, 0), LOAD_JOB, 0, 2, LOADER_ARENA);
	c[1] = td_connect(td_sock(&t, 0), LOAD_JOB, 1, 2, LOADER_ARENA);
	warm_up(&t, path, LOAD_JOB, c[0], c[1]);
	l = (struct loader){ .path = path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
			     .band = 0, .n_bands = N_LOADERS, .c = c[0] };
	if (loader_begin(&l) == 0)
		loader_run(&l);
	loader_verify(&l, "root's band 0");

	/* nobody's loaders have a pool of their own made. */
	ck_assert_int_eq(td_child_go(&ch), 0);
	ck_assert_msg(td_child_expect(&ch, "warm", WAIT_MS, rest, sizeof(rest)) == 0,
		      "no warm-up report from nobody; it said: %s", ch.out);
	ck_assert_msg(strncmp(rest, "0 ", 2) == 0, "nobody's warm-up loads: %s", rest);
	wait_pool_ready(&t, UID_NOBODY, NOBODY_JOB);

	/* nobody loads band 1 of the same files while root's cells of them
	 * are in root's pool: it gets none of them. */
	ck_assert_int_eq(td_child_go(&ch), 0);
	ck_assert_msg(td_child_expect(&ch, "load", WAIT_MS, rest, sizeof(rest)) == 0,
		      "no load report from nobody; it said: %s", ch.out);
	ck_assert_msg(sscanf(rest, "%d %llu %llu %llu %llu %d", &rc, &reads, &rd, &dm, &sh, &ok) ==
			      6,
		      "bad report '%s'", rest);
	ck_assert_msg(rc == 0 && ok, "nobody's load: %s", rest);
	/* One read per shard (8.75 MiB each, reads through ckptd go up to
	 * 16 MiB): no cell was asked for twice by this load, so whatever it
	 * got from the pool it read itself. */
	ck_assert_msg(reads == SAVE_WORLD, "nobody's load made %llu reads, not one per shard",
		      reads);
	ck_assert_msg(dm == rd && dm > 0, "nobody: %llu of %llu bytes through ckptd", dm, rd);
	ck_assert_msg(sh == 0, "nobody got %llu bytes from root's reads", sh);

	/* Both hold cells of the same files, each in a pool of its own. */
	loads_now(&t, 0, LOAD_JOB, &mine);
	loads_now(&t, UID_NOBODY, NOBODY_JOB, &theirs);
	ck_assert_uint_eq(mine.n_pools, 2);
	ck_assert_uint_eq(mine.of_uid, 1);
	ck_assert_uint_eq(theirs.of_uid, 1);
	ck_assert_msg(mine.entries > 0 && theirs.entries > 0,
		      "entries: %lld of uid 0, %lld of uid %u", (long long)mine.entries,
		      (long long)theirs.entries, UID_NOBODY);

	ck_assert_int_eq(td_child_go(&ch), 0);
	rc = td_child_wait(&ch, WAIT_MS);
	ck_assert_msg(rc >= 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "nobody: %s; it said:\n%s",
		      td_status_str(rc), ch.out);
	loader_end(&l);
	loader_release(&l);
	wait_pool_empty(&t, 0, LOAD_JOB);
	wait_pool_empty(&t, UID_NOBODY, NOBODY_JOB);
	ckpt_disconnect(c[0]);
	ckpt_disconnect(c[1]);
	td_fini(&t);
}
END_TEST

/* ---- 5. reads cut in different places share their cells --------------------- */

/*
 * A loader that reads a little of one shard (16 rows of 'w': the start of
 * rank 0's file) keeps it lent; then another, on a client of its own,
 * loads a column band of everything, its reads cut elsewhere (a whole
 * shard each).  What the second needs of the cell the first read comes
 * from the pool, whichever client either is and whatever they read
 * before: the pool keeps cells, not the bytes one read asked for.
 */
START_TEST(test_other_cuts)
{
	struct testd t;
	struct ckpt_client *a, *b, *p, *q;
	struct loader lp, lq;
	struct loads_now before, after;
	char path[TD_PATH];
	uint64_t total;
	int64_t disk;

	unsetenv("CKPT_LOAD_SHARE");
	td_init(&t, "other_cuts");
	ck_assert_int_eq(td_daemon_start(&t, 0, DAEMON_CONF), 0);
	save_bands(&t, "bands", path, sizeof(path));
	total = shard_bytes(path, SAVE_WORLD);
	a = td_connect(td_sock(&t, 0), LOAD_JOB, 0, 4, LOADER_ARENA);
	b = td_connect(td_sock(&t, 0), LOAD_JOB, 1, 4, LOADER_ARENA);
	warm_up(&t, path, LOAD_JOB, a, b);
	wait_pool_empty(&t, geteuid(), LOAD_JOB);
	/* Clients that never read through the pool before. */
	p = td_connect(td_sock(&t, 0), LOAD_JOB, 2, 4, LOADER_ARENA);
	q = td_connect(td_sock(&t, 0), LOAD_JOB, 3, 4, LOADER_ARENA);

	loads_now(&t, geteuid(), LOAD_JOB, &before);
	lp = (struct loader){ .path = path, .defs = bands_defs, .n_defs = 1, .band = 0,
			      .n_bands = 1, .rows = 16, .c = p };
	if (loader_begin(&lp) == 0)
		loader_run(&lp);
	loader_verify(&lp, "16 rows");
	lq = (struct loader){ .path = path, .defs = bands_defs, .n_defs = N_BANDS_DEFS,
			      .band = 1, .n_bands = N_LOADERS, .c = q };
	if (loader_begin(&lq) == 0)
		loader_run(&lq);
	loader_verify(&lq, "band 1");
	loads_now(&t, geteuid(), LOAD_JOB, &after);

	ck_assert_msg(lp.st.bytes_daemon == lp.st.bytes_read && lp.st.bytes_shared == 0,
		      "16 rows: %llu bytes read, %llu through ckptd, %llu shared (none: the "
		      "pool was empty)",
		      (unsigned long long)lp.st.bytes_read, (unsigned long long)lp.st.bytes_daemon,
		      (unsigned long long)lp.st.bytes_shared);
	ck_assert_msg(lq.st.bytes_daemon == lq.st.bytes_read,
		      "band 1: %llu of %llu bytes read through ckptd",
		      (unsigned long long)lq.st.bytes_daemon, (unsigned long long)lq.st.bytes_read);
	/* The band's read of rank 0's shard starts in the first cell, all of
	 * which (but its header) it needs. */
	ck_assert_msg(lq.st.bytes_shared >= 4 * MiB && lq.st.bytes_shared <= 8 * MiB,
		      "band 1 got %llu bytes from the first loader's read of the first cell of "
		      "rank 0's shard (%llu of the 16 rows' read)",
		      (unsigned long long)lq.st.bytes_shared, (unsigned long long)lp.st.bytes_read);
	ck_assert_msg(after.evicted == before.evicted && after.refused == before.refused,
		      "the pool evicted %lld cells and refused %lld reads",
		      (long long)(after.evicted - before.evicted),
		      (long long)(after.refused - before.refused));
	if (!after.totals) {
		td_skip("other_cuts_disk", "ckptd shows its loads.disk_bytes only to root");
	} else {
		/* The first cell of rank 0's shard once, for the first loader;
		 * everything else once, for the second.  That cell read again
		 * would be 8 MiB more. */
		disk = after.disk - before.disk;
		printf("other_cuts: shards %llu bytes, ckptd read %lld, band 1 got %llu shared\n",
		       (unsigned long long)total, (long long)disk,
		       (unsigned long long)lq.st.bytes_shared);
		ck_assert_msg(disk >= 0 && (uint64_t)disk < total + 4 * MiB,
			      "ckptd read %lld bytes from storage for %llu bytes of shards: a "
			      "cell twice",
			      (long long)disk, (unsigned long long)total);
	}
	loader_end(&lq);
	loader_end(&lp);
	loader_release(&lq);
	loader_release(&lp);
	wait_pool_empty(&t, geteuid(), LOAD_JOB);
	ckpt_disconnect(a);
	ckpt_disconnect(b);
	ckpt_disconnect(p);
	ckpt_disconnect(q);
	td_fini(&t);
}
END_TEST

/* ---- 6. a read past the end of a cut file, the pool's room at its end ------------- */

#define EOF_JOB "loadshare-eof"
/* The smallest pool: 16 MiB, two whole cells. */
#define EOF_CONF \
	"arena_max = 128M\narena_total = 2G\nload_share = 16M\ncommit_deadline = 60s\n"
#define EOF_FILL_SIZE (16 * MiB - 4096)
#define EOF_CUT_SIZE (2 * MiB + 4096)

/* One file of 16 MiB - 4 KiB (a 4 KiB header, then 4094 rows of 4 KiB):
 * its two cells take all of a 16 MiB pool but its last 4 KiB. */
static const struct tdef fill_defs[] = {
	{ "f", { 4094, 1024 }, 801 },
};
/* 2 MiB + 4 KiB, one cell; cut to its header before rows [256, 512) of it
 * are read (from 1 MiB on): past the new end, inside the first cell. */
static const struct tdef cut_defs[] = {
	{ "v", { 512, 1024 }, 802 },
};
/* Saved by both clients after the failed load. */
static const struct tdef after_defs[] = {
	{ "y", { 1024, 1024 }, 803 },
};

/* Clients c[0] and c[1] (ranks 0 and 1 of a job of 2) save d as
 * <root>/<name>, half of its rows each; its path into path. */
static void save_two(struct testd *t, struct ckpt_client **c, const char *name,
		     const struct tdef *d, char *path, size_t len)
{
	struct ckpt_save *sv[2];
	struct ckpt_future *st[2], *cm[2];
	void *buf[2];
	uint64_t offs[2][2], shape[2][2];
	int rc;

	for (unsigned r = 0; r < 2; r++) {
		offs[r][0] = d->shape[0] * r / 2;
		offs[r][1] = 0;
		shape[r][0] = d->shape[0] * (r + 1) / 2 - offs[r][0];
		shape[r][1] = d->shape[1];
		buf[r] = malloc(td_nbytes(4, 2, shape[r]));
		ck_assert_ptr_nonnull(buf[r]);
		td_fill_chunk(buf[r], 4, 2, d->shape, offs[r], shape[r], d->seed);
		rc = ckpt_save_begin(c[r], t->root, name, 1, &sv[r]);
		ck_assert_msg(rc == 0, "rank %u: save_begin %d: %s", r, rc, ckpt_last_error());
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = d->name, .dtype = CKPT_F32,
					  .ndim = 2, .shape = shape[r], .data = buf[r],
					  .global_shape = d->shape, .offsets = offs[r] };
		rc = ckpt_save_add_tensor(sv[r], &tn);
		ck_assert_msg(rc == 0, "rank %u: add %d: %s", r, rc, ckpt_last_error());
	}
	for (unsigned r = 0; r < 2; r++) {
		rc = ckpt_save_commit(sv[r], &st[r], &cm[r]);
		ck_assert_msg(rc == 0, "rank %u: commit %d: %s", r, rc, ckpt_last_error());
	}
	for (unsigned r = 0; r < 2; r++) {
		int s = td_future_wait(st[r], WAIT_MS), m = td_future_wait(cm[r], WAIT_MS);

		ck_assert_msg(s == 0 && m == 0, "save '%s', rank %u: staged %d, committed %d: %s",
			      name, r, s, m, ckpt_future_error(m ? cm[r] : st[r]));
		ckpt_save_free(sv[r]);
		free(buf[r]);
	}
	td_path(path, len, "%s/%s", t->root, name);
}

/* The first error the library logs (ckpt_set_log_fn): a connection it
 * drops says why there. */
struct first_error {
	pthread_mutex_t lock;
	char msg[1024];
};

static void keep_first_error(enum ckpt_log_level level, const char *msg, void *ud)
{
	struct first_error *f = ud;

	if (level != CKPT_LOG_ERROR)
		return;
	pthread_mutex_lock(&f->lock);
	if (!f->msg[0])
		snprintf(f->msg, sizeof(f->msg), "%s", msg);
	pthread_mutex_unlock(&f->lock);
}

static void first_error(struct first_error *f, char *buf, size_t len)
{
	pthread_mutex_lock(&f->lock);
	snprintf(buf, len, "%s", f->msg[0] ? f->msg : "(nothing)");
	pthread_mutex_unlock(&f->lock);
}

/* Runs and checks l's whole load, and that every byte of it came through
 * ckptd. */
static void load_via_daemon(struct loader *l, const char *what)
{
	if (loader_begin(l) == 0)
		loader_run(l);
	loader_verify(l, what);
	ck_assert_msg(l->st.bytes_daemon == l->st.bytes_read && l->st.bytes_read > 0,
		      "%s: %llu of %llu bytes read through ckptd", what,
		      (unsigned long long)l->st.bytes_daemon, (unsigned long long)l->st.bytes_read);
}

/*
 * Earlier builds gave a read that starts past the end of a cut file, but
 * inside the cell it starts in, an entry of the cell up to the new end;
 * the answer, no bytes at the entry's offset plus the read's place in the
 * cell, lay past the pool's end when the entry was placed at its end, and
 * the library, taking that for a bad message, dropped its connection to
 * ckptd (every load and save on it failed) instead of failing the load as
 * a truncated file.  Here the only room of a 16 MiB pool is its last
 * 4 KiB when the read comes (the cells of another checkpoint, lent, take
 * the rest), and the cut file's new end is 4 KiB: its entry would be put
 * there, the answer 1 MiB past the pool's end.
 */
START_TEST(test_read_past_cut_end)
{
	struct testd t;
	struct ckpt_client *c[2];
	struct loader lf, lv, lg, ly;
	struct loads_now s;
	char fill[TD_PATH], cut[TD_PATH], after[TD_PATH], shard[TD_PATH], logged[1024];
	static struct first_error errs = { PTHREAD_MUTEX_INITIALIZER, "" };
	struct stat sb;

	unsetenv("CKPT_LOAD_SHARE");
	td_init(&t, "read_past_cut_end");
	ck_assert_int_eq(td_daemon_start(&t, 0, EOF_CONF), 0);
	save_whole(&t, "fill", fill_defs, 1, fill, sizeof(fill));
	save_whole(&t, "cut", cut_defs, 1, cut, sizeof(cut));
	/* The sizes the placement below depends on. */
	td_path(shard, sizeof(shard), "%s/rank-00000.safetensors", fill);
	ck_assert_int_eq(stat(shard, &sb), 0);
	ck_assert_msg(sb.st_size == (off_t)EOF_FILL_SIZE, "%s has %lld bytes, not %llu", shard,
		      (long long)sb.st_size, (unsigned long long)EOF_FILL_SIZE);
	td_path(shard, sizeof(shard), "%s/rank-00000.safetensors", cut);
	ck_assert_int_eq(stat(shard, &sb), 0);
	ck_assert_msg(sb.st_size == (off_t)EOF_CUT_SIZE, "%s has %lld bytes, not %llu", shard,
		      (long long)sb.st_size, (unsigned long long)EOF_CUT_SIZE);

	c[0] = td_connect(td_sock(&t, 0), EOF_JOB, 0, 2, LOADER_ARENA);
	c[1] = td_connect(td_sock(&t, 0), EOF_JOB, 1, 2, LOADER_ARENA);
	warm_up_defs(&t, fill, fill_defs, EOF_JOB, c[0], c[1]);
	wait_pool_empty(&t, geteuid(), EOF_JOB);

	/* c[0] loads all of 'fill' and keeps it lent: its two cells stay in
	 * the pool, side by side from its start, and leave it 4 KiB at its
	 * end (checked). */
	lf = (struct loader){ .path = fill, .defs = fill_defs, .n_defs = 1, .band = 0,
			      .n_bands = 1, .c = c[0] };
	load_via_daemon(&lf, "fill");
	loads_now(&t, geteuid(), EOF_JOB, &s);
	ck_assert_msg(s.have && s.bytes == (int64_t)(16 * MiB) && s.entries == 2 &&
			      s.held == (int64_t)EOF_FILL_SIZE,
		      "the pool after 'fill': %lld bytes, %lld entries holding %lld bytes (want "
		      "%llu, 2, %llu)",
		      (long long)s.bytes, (long long)s.entries, (long long)s.held,
		      (unsigned long long)(16 * MiB), (unsigned long long)EOF_FILL_SIZE);

	/* c[1] describes its load of rows [256, 512) of 'cut' (its reader has
	 * the file's header); then the file is cut to 4 KiB; then the load
	 * runs, its read starting 1 MiB into the cut file's first cell.  It
	 * fails as a truncated file, naming it. */
	lv = (struct loader){ .path = cut, .defs = cut_defs, .n_defs = 1, .band = 0,
			      .n_bands = 1, .row0 = 256, .c = c[1] };
	ck_assert_msg(loader_begin(&lv) == 0, "cut: %s", lv.msg);
	ck_assert_int_eq(truncate(shard, 4096), 0);
	ckpt_set_log_fn(keep_first_error, &errs);
	loader_run(&lv);
	loader_end(&lv);
	loader_release(&lv);
	first_error(&errs, logged, sizeof(logged));
	ck_assert_msg(lv.rc != 0, "the load of rows past the end of a truncated file succeeded");
	ck_assert_msg(lv.rc == -EBADMSG && strstr(lv.msg, "rank-00000.safetensors") &&
			      strstr(lv.msg, "truncated"),
		      "the load of rows past the end of a truncated file (want -EBADMSG, 'the file "
		      "is truncated'): %s; the library's first error: %s",
		      lv.msg, logged);
	ck_assert_msg(!strstr(logged, "connection to ckptd lost"),
		      "the failed load cost its client the connection: %s", logged);
	/* Nothing of the cut file came into the pool. */
	loads_now(&t, geteuid(), EOF_JOB, &s);
	ck_assert_msg(s.entries == 2 && s.held == (int64_t)EOF_FILL_SIZE,
		      "the pool after the failed load: %lld entries holding %lld bytes",
		      (long long)s.entries, (long long)s.held);

	/* c[1]'s connection lives: it loads 'fill' through ckptd, every byte
	 * from c[0]'s cells in the pool... */
	lg = (struct loader){ .path = fill, .defs = fill_defs, .n_defs = 1, .band = 1,
			      .n_bands = 2, .c = c[1] };
	load_via_daemon(&lg, "fill band 1, after the failed load");
	ck_assert_msg(lg.st.bytes_shared == lg.st.bytes_daemon,
		      "'fill' on the client of the failed load: %llu bytes read, %llu through "
		      "ckptd, %llu shared (want all of them, from the pool)",
		      (unsigned long long)lg.st.bytes_read, (unsigned long long)lg.st.bytes_daemon,
		      (unsigned long long)lg.st.bytes_shared);
	loader_end(&lg);
	loader_release(&lg);

	/* ...saves (c[0] the other rank) and loads what it saved. */
	save_two(&t, c, "after", &after_defs[0], after, sizeof(after));
	ly = (struct loader){ .path = after, .defs = after_defs, .n_defs = 1, .band = 0,
			      .n_bands = 1, .c = c[1] };
	load_via_daemon(&ly, "after");
	loader_end(&ly);
	loader_release(&ly);

	loader_end(&lf);
	loader_release(&lf);
	wait_pool_empty(&t, geteuid(), EOF_JOB);
	ckpt_disconnect(c[0]);
	ckpt_disconnect(c[1]);
	ckpt_set_log_fn(NULL, NULL);
	first_error(&errs, logged, sizeof(logged));
	ck_assert_msg(!strstr(logged, "connection to ckptd lost"), "a client lost its connection: %s",
		      logged);
	td_fini(&t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("integration_load_share");

	td_case(s, "three_bands", test_three_bands, 120, 0, 1);
	td_case(s, "no_share_env", test_no_share_env, 120, 0, 1);
	td_case(s, "truncated_while_shared", test_truncated_while_shared, 120, 0, 1);
	td_case(s, "other_user_pool", test_other_user_pool, 120, 0, 1);
	td_case(s, "other_cuts", test_other_cuts, 120, 0, 1);
	td_case(s, "read_past_cut_end", test_read_past_cut_end, 120, 0, 1);
	return td_main(s, "check_load_share");
}
