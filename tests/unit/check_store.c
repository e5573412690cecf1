/* SPDX-License-Identifier: MIT */
/*
 * check_store.c - the local-directory storage backend (store/local.c)
 * through its ops table: attempt ids, creating and joining work areas and
 * every reason to refuse one, exclusive shards, claims and addressing,
 * counting deliveries, failure cleanup, the commit poll, writes from a
 * registered arena, and the tools' list/read/remove.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "format/index.h"
#include "store/fsutil.h"
#include "store/store.h"

static const struct store_ops *S = &store_local;
static char dir[256];
static const struct store_writer me = { "11111111111111111111111111111111",
					"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" };
static const struct store_writer me_before = { "11111111111111111111111111111111",
					       "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" };
static const struct store_writer other = { "22222222222222222222222222222222",
					   "cccccccccccccccccccccccccccccccc" };

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/check_store.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	char parent[256];
	int fd;

	snprintf(parent, sizeof(parent), "%s", dir);
	*strrchr(parent, '/') = '\0';
	fd = open(parent, O_RDONLY | O_DIRECTORY);
	fs_rm_rf_at(fd, strrchr(dir, '/') + 1);
	close(fd);
}

static struct store_key key(const char *job, const char *name, uint32_t attempt)
{
	struct store_key k = { .step = 10, .attempt = attempt, .world = 2 };

	snprintf(k.job, sizeof(k.job), "%s", job);
	snprintf(k.name, sizeof(k.name), "%s", name);
	return k;
}

static int open_as(const struct store_writer *w, const struct store_key *k,
		   struct store_attempt **ret, bool *created, char *err)
{
	char id[STORE_ID_LEN + 1];

	store_key_id(k, id);
	return S->attempt_open(dir, -1, k, id, w, geteuid(), ret, created, err, 256);
}

static bool exists_in(const char *rel)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	return access(p, F_OK) == 0;
}

/* Trash directories left in dir. */
static int td_count_trash(void)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		n += strncmp(de->d_name, ".ckpt-trash-", 12) == 0;
	closedir(d);
	return n;
}

static void area_path(const struct store_key *k, char *buf, size_t len, const char *file)
{
	char id[STORE_ID_LEN + 1];

	store_key_id(k, id);
	snprintf(buf, len, "%s%s%s%s", STORE_WORK_PREFIX, id, file ? "/" : "", file ? file : "");
}

/* ---- ids ---- */

START_TEST(test_key_ids)
{
	struct store_key a = key("b-c", "a", 0), b = key("c", "a-b", 0), c = key("b-c", "a", 1);
	char ia[33], ib[33], ic[33], ia2[33];

	store_key_id(&a, ia);
	store_key_id(&b, ib);
	store_key_id(&c, ic);
	store_key_id(&a, ia2);
	ck_assert_uint_eq(strlen(ia), STORE_ID_LEN);
	ck_assert_str_eq(ia, ia2);
	ck_assert_str_ne(ia, ib); /* the names that met in ".partial-a-b-c" */
	ck_assert_str_ne(ia, ic); /* a retry is another attempt */
	snprintf(c.run, sizeof(c.run), "r2");
	c.attempt = 0;
	store_key_id(&c, ic);
	ck_assert_str_ne(ia, ic); /* another run */
}
END_TEST

/* ---- work areas ---- */

START_TEST(test_create_and_join)
{
	struct store_key k = key("j", "n", 0);
	struct store_attempt *a = NULL, *b = NULL;
	char err[256], p[256];
	bool created;

	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert(created);
	area_path(&k, p, sizeof(p), STORE_ATTEMPT_FILE);
	ck_assert(exists_in(p));
	/* Another daemon of the same attempt joins. */
	ck_assert_int_eq(open_as(&other, &k, &b, &created, err), 0);
	ck_assert(!created);
	S->attempt_close(a);
	S->attempt_close(b);
}
END_TEST

START_TEST(test_refusals)
{
	struct store_key k = key("j", "n", 0), k2 = key("j", "done", 0);
	struct store_attempt *a = NULL;
	char err[256], p[512], id[33];
	bool created;

	/* The checkpoint exists already. */
	snprintf(p, sizeof(p), "%s/done", dir);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(open_as(&me, &k2, &a, &created, err), -EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "already exists"));

	/* An area of that id whose attempt.json holds another key. */
	area_path(&k, p, sizeof(p), NULL);
	{
		char full[1024];
		snprintf(full, sizeof(full), "%s/%s", dir, p);
		ck_assert_int_eq(mkdir(full, 0755), 0);
		snprintf(full, sizeof(full), "%s/%s/%s", dir, p, STORE_ATTEMPT_FILE);
		FILE *f = fopen(full, "w");
		fputs("{\"format\":\"ckpt-attempt-1\",\"id\":\"x\",\"job\":\"other\"}", f);
		fclose(f);
	}
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), -EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "another save"));

	/* An area owned by another uid. */
	store_key_id(&k, id);
	ck_assert_int_eq(S->attempt_open(dir, -1, &k, id, &me, geteuid() + 1, &a, &created, err,
					 sizeof(err)),
			 -EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "belongs to uid"));
}
END_TEST

START_TEST(test_earlier_life_replaced_failed_refused)
{
	struct store_key k = key("j", "n", 0);
	struct store_attempt *a = NULL, *b = NULL;
	struct store_shard *sh = NULL;
	uint32_t one = 1;
	char err[256], p[256];
	bool created;

	/* An earlier life of this daemon made it and left a shard. */
	ck_assert_int_eq(open_as(&me_before, &k, &a, &created, err), 0);
	ck_assert_int_eq(S->shard_create(a, 1, 4096, 1u << 20, false, &sh, err, sizeof(err)), 0);
	S->shard_close(sh);
	S->attempt_close(a);
	area_path(&k, p, sizeof(p), "rank-00001.safetensors");
	ck_assert(exists_in(p));
	/* This life replaces it: none of it is used. */
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert(created);
	ck_assert(!exists_in(p));

	/* A failed attempt stays failed. */
	struct store_fail f = { .mark = true, .made = &one, .n_made = 1, .msg = "rank 1 went away" };
	S->attempt_fail(a, &f);
	ck_assert_int_eq(open_as(&other, &k, &b, &created, err), -ECANCELED);
	ck_assert_ptr_nonnull(strstr(err, "rank 1 went away"));
	S->attempt_close(a);
}
END_TEST

/* ---- shards, claims, deliveries ---- */

static void publish(struct store_attempt *a, uint32_t rank, const char *to)
{
	char text[512], err[256];

	snprintf(text, sizeof(text), "{\"rank\":%u,\"to\":\"%s\"}", rank, to);
	ck_assert_int_eq(S->rank_publish(a, rank, text, err, sizeof(err)), 0);
}

START_TEST(test_shards_claims_counts)
{
	struct store_key k = key("j", "n", 0);
	struct store_attempt *a = NULL, *b = NULL;
	struct store_shard *s0 = NULL, *s0b = NULL, *s1 = NULL;
	char err[256], nonce[33], n2[33], seen[33], p[256], full[1024];
	uint32_t n, local[1] = { 0 };
	struct stat st;
	bool created;

	k.world = 3;
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert_int_eq(open_as(&other, &k, &b, &created, err), 0);
	ck_assert_int_eq(S->shard_create(a, 0, 10000, 1u << 20, true, &s0, err, sizeof(err)), 0);
	/* A rank is written once per attempt. */
	ck_assert_int_eq(S->shard_create(b, 0, 10000, 1u << 20, true, &s0b, err, sizeof(err)), -EEXIST);
	ck_assert_ptr_null(s0b);
	ck_assert_int_eq(S->attempt_addressee(b, seen), -ENOENT);
	ck_assert_int_eq(S->attempt_claim(a, &me, nonce, err, sizeof(err)), 0);
	ck_assert_int_eq(S->attempt_addressee(b, seen), 0);
	ck_assert_str_eq(seen, nonce);

	/* The shard is cut to its size when it is finished. */
	ck_assert_int_eq(S->shard_create(b, 1, 8192, 1u << 20, false, &s1, err, sizeof(err)), 0);
	ck_assert_int_eq(S->shard_finish(s1, 5000, err, sizeof(err)), 0);
	area_path(&k, p, sizeof(p), "rank-00001.safetensors");
	snprintf(full, sizeof(full), "%s/%s", dir, p);
	ck_assert_int_eq(stat(full, &st), 0);
	ck_assert_int_eq(st.st_size, 5000);

	/* Only deliveries addressed to the claim count; local ranks do. */
	publish(b, 1, "");
	n = 0;
	ck_assert_int_eq(S->attempt_count(a, 3, nonce, local, 1, &n, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 1);
	publish(b, 1, nonce);
	publish(b, 2, "ffffffffffffffffffffffffffffffff");
	ck_assert_int_eq(S->attempt_count(a, 3, nonce, local, 1, &n, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 2);
	publish(b, 2, nonce);
	ck_assert_int_eq(S->attempt_count(a, 3, nonce, local, 1, &n, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 3);
	/* A new claim makes every earlier delivery void. */
	ck_assert_int_eq(S->attempt_claim(a, &me, n2, err, sizeof(err)), 0);
	ck_assert_str_ne(n2, nonce);
	n = 0;
	ck_assert_int_eq(S->attempt_count(a, 3, n2, local, 1, &n, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 1);
	S->shard_close(s0);
	S->shard_close(s1);
	S->attempt_close(a);
	S->attempt_close(b);
}
END_TEST

START_TEST(test_fail_and_poll)
{
	struct store_key k = key("j", "n", 0);
	struct store_attempt *co = NULL, *nc = NULL;
	struct store_shard *sh = NULL;
	char err[256], id[33], p[256], full[1024];
	uint32_t one = 1;
	bool created;

	store_key_id(&k, id);
	ck_assert_int_eq(open_as(&me, &k, &co, &created, err), 0);
	ck_assert_int_eq(open_as(&other, &k, &nc, &created, err), 0);
	ck_assert_int_eq(S->attempt_poll(nc, id, err, sizeof(err)), 0);
	ck_assert_int_eq(S->shard_create(nc, 1, 4096, 1u << 20, false, &sh, err, sizeof(err)), 0);
	S->shard_close(sh);
	/* Delivered: a failing non-coordinator writes nothing any more. */
	struct store_fail late = { .delivered = true, .mark = true, .made = &one, .n_made = 1, .msg = "late" };
	S->attempt_fail(nc, &late);
	area_path(&k, p, sizeof(p), "failed");
	ck_assert(!exists_in(p));
	/* A rank refused because another daemon holds it: nothing of that
	 * daemon's is deleted, and no marker fails its attempt. */
	struct store_fail dup = { .created = true, .msg = "rank 1 is someone else's" };
	S->attempt_fail(co, &dup);
	ck_assert(!exists_in(p));
	area_path(&k, p, sizeof(p), "rank-00001.safetensors");
	ck_assert(exists_in(p));
	area_path(&k, p, sizeof(p), "failed");
	/* Not delivered: a marker for the others, its shard gone. */
	struct store_fail own = { .mark = true, .made = &one, .n_made = 1, .msg = "rank 1 failed" };
	S->attempt_fail(nc, &own);
	ck_assert(exists_in(p));
	area_path(&k, p, sizeof(p), "rank-00001.safetensors");
	ck_assert(!exists_in(p));
	ck_assert_int_eq(S->attempt_poll(nc, id, err, sizeof(err)), -ECANCELED);
	ck_assert_str_eq(err, "rank 1 failed");
	/* The coordinator removes the whole area; the other daemon sees it. */
	struct store_fail coord = { .coordinator = true, .msg = "x" };
	S->attempt_fail(co, &coord);
	area_path(&k, p, sizeof(p), NULL);
	ck_assert(!exists_in(p));
	ck_assert_int_eq(S->attempt_poll(nc, id, err, sizeof(err)), -ECANCELED);
	S->attempt_close(co);
	S->attempt_close(nc);

	/* A checkpoint of that name committed by another attempt. */
	snprintf(full, sizeof(full), "%s/other", dir);
	ck_assert_int_eq(mkdir(full, 0755), 0);
	k = key("j", "other", 0);
	store_key_id(&k, id);
	ck_assert_int_eq(open_as(&other, &k, &nc, &created, err), -EEXIST);
}
END_TEST

/* No deletion runs through a directory renamed into place: a coordinator
 * whose work area was committed (renamed to its name) before its failure
 * cleanup ran leaves the checkpoint whole; a marker left by another daemon
 * fails the attempt even when every rank was counted. */
START_TEST(test_fail_after_commit_and_marker)
{
	struct store_key k = key("j", "c", 0);
	struct store_attempt *co = NULL, *nc = NULL;
	struct store_shard *sh = NULL;
	char err[256], w[256], full[1024], to[1024], nonce[33];
	uint32_t one = 1, n, local[2] = { 0, 1 };
	bool created;

	ck_assert_int_eq(open_as(&me, &k, &co, &created, err), 0);
	ck_assert_int_eq(open_as(&other, &k, &nc, &created, err), 0);
	ck_assert_int_eq(S->shard_create(co, 0, 4096, 1u << 20, false, &sh, err, sizeof(err)), 0);
	S->shard_close(sh);
	ck_assert_int_eq(S->shard_create(nc, 1, 4096, 1u << 20, false, &sh, err, sizeof(err)), 0);
	S->shard_close(sh);
	ck_assert_int_eq(S->attempt_claim(co, &me, nonce, err, sizeof(err)), 0);

	/* Another daemon marks the attempt failed while it holds rank 1:
	 * the count finds every rank (both local here) and still cancels. */
	struct store_fail own = { .mark = true, .made = &one, .n_made = 1, .msg = "rank 1 failed" };
	S->attempt_fail(nc, &own);
	n = 0;
	ck_assert_int_eq(S->attempt_count(co, 2, nonce, local, 2, &n, err, sizeof(err)), -ECANCELED);

	/* The area is renamed into place (as a commit does) before the
	 * coordinator's cleanup runs: the cleanup finds nothing to remove. */
	area_path(&k, w, sizeof(w), NULL);
	snprintf(full, sizeof(full), "%s/%s", dir, w);
	snprintf(to, sizeof(to), "%s/c", dir);
	ck_assert_int_eq(rename(full, to), 0);
	struct store_fail coord = { .coordinator = true, .msg = "x" };
	S->attempt_fail(co, &coord);
	ck_assert(exists_in("c/rank-00000.safetensors"));
	ck_assert(exists_in("c/" STORE_ATTEMPT_FILE));
	ck_assert_int_eq(td_count_trash(), 0);
	S->attempt_close(co);
	S->attempt_close(nc);
}
END_TEST

/* A creator whose own rank failed before anyone claimed the area removes
 * it (no coordinator would); once a claim exists the area is the
 * coordinator's, and the creator leaves it with its marker. */
START_TEST(test_creator_fails)
{
	struct store_key k = key("j", "solo", 0);
	struct store_attempt *a = NULL, *b = NULL;
	char err[256], w[256], nonce[33];
	bool created;

	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert(created);
	area_path(&k, w, sizeof(w), NULL);
	struct store_fail alone = { .mark = true, .created = true, .msg = "no room" };
	S->attempt_fail(a, &alone);
	ck_assert(!exists_in(w));
	ck_assert_int_eq(td_count_trash(), 0);
	S->attempt_close(a);

	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert(created);
	ck_assert_int_eq(open_as(&other, &k, &b, &created, err), 0);
	ck_assert_int_eq(S->attempt_claim(b, &other, nonce, err, sizeof(err)), 0);
	S->attempt_fail(a, &alone);
	ck_assert(exists_in(w));
	area_path(&k, w, sizeof(w), "failed");
	ck_assert(exists_in(w));
	S->attempt_close(a);
	S->attempt_close(b);
}
END_TEST

/* ---- writes from a registered arena ---- */

static int wres = 1;
static void wdone(void *ud, int res)
{
	(void)ud;
	wres = res;
}

START_TEST(test_arena_write)
{
	const uint64_t len = 8u << 20;
	struct store_key k = key("j", "w", 0);
	struct store_attempt *a = NULL;
	struct store_arena *ar = NULL;
	struct store_shard *sh = NULL;
	char err[256], p[256];
	uint8_t *mem, *back;
	bool created;
	int fd;

	fd = memfd_create("arena", MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(mem, MAP_FAILED);
	for (uint64_t i = 0; i < len; i++)
		mem[i] = (uint8_t)(i * 31 + 7);
	err[0] = '\0';
	ck_assert_int_eq(S->arena_attach(mem, len, 4, &ar, err, sizeof(err)), 0);
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	ck_assert_int_eq(S->shard_create(a, 0, 2u << 20, 1u << 20, true, &sh, err, sizeof(err)), 0);
	/* The second MiB of the arena to the start of the shard, twice over. */
	S->shard_write(sh, ar, 1u << 20, 0, 1u << 20, wdone, NULL);
	ck_assert_uint_gt(S->arena_busy(ar), 0);
	for (int i = 0; i < 500 && S->arena_busy(ar); i++) {
		usleep(2000);
		S->arena_reap(ar);
	}
	ck_assert_int_eq(wres, 0);
	S->shard_write(sh, ar, 4u << 20, 1u << 20, 1u << 20, wdone, NULL);
	for (int i = 0; i < 500 && S->arena_busy(ar); i++) {
		usleep(2000);
		S->arena_reap(ar);
	}
	ck_assert_int_eq(wres, 0);
	ck_assert_int_eq(S->shard_finish(sh, 2u << 20, err, sizeof(err)), 0);
	back = malloc(2u << 20);
	area_path(&k, p, sizeof(p), NULL);
	{
		char full[1024];
		snprintf(full, sizeof(full), "%s/%s", dir, p);
		ck_assert_int_eq(S->read_range(full, "rank-00000.safetensors", 0, 2u << 20, back), 0);
		ck_assert_int_eq(S->read_range(full, "rank-00000.safetensors", 1, 2u << 20, back),
				 -EBADMSG);
		ck_assert_int_eq(S->read_range(full, "rank-00000.safetensors", 0, 2u << 20, back), 0);
	}
	ck_assert(memcmp(back, mem + (1u << 20), 1u << 20) == 0);
	ck_assert(memcmp(back + (1u << 20), mem + (4u << 20), 1u << 20) == 0);
	free(back);
	S->shard_close(sh);
	S->attempt_close(a);
	S->arena_detach(ar);
	munmap(mem, len);
	close(fd);
}
END_TEST

/* The disk's cap on writes in flight is shared by every arena: with a cap
 * of 2 and two arenas of depth 4 submitting 8 writes each at once, every
 * write completes, the arenas take turns (the second arena's writes do not
 * all wait for the first's), and the shards hold the right bytes. */
#define DD_N 8
#define DD_LEN (256u << 10)
struct dd_write {
	int arena;
	int *order, *n_done, *res;
};

static void dd_done(void *ud, int res)
{
	struct dd_write *w = ud;

	w->order[(*w->n_done)++] = w->arena;
	if (res != 0)
		*w->res = res;
}

START_TEST(test_disk_depth)
{
	const uint64_t len = DD_N * DD_LEN;
	struct store_key k = key("j", "dd", 0);
	struct store_attempt *a = NULL;
	struct store_arena *ar[2] = { NULL, NULL };
	struct store_shard *sh[2] = { NULL, NULL };
	struct dd_write w[2][DD_N];
	int order[2 * DD_N], n_done = 0, res = 0, fds[2];
	uint8_t *mem[2];
	char err[256], p[256], full[1024];
	bool created;

	S->set_disk_depth(2);
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	for (int i = 0; i < 2; i++) {
		fds[i] = memfd_create("arena", MFD_CLOEXEC);
		ck_assert_int_ge(fds[i], 0);
		ck_assert_int_eq(ftruncate(fds[i], (off_t)len), 0);
		mem[i] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		ck_assert_ptr_ne(mem[i], MAP_FAILED);
		for (uint64_t b = 0; b < len; b++)
			mem[i][b] = (uint8_t)(b * 13 + 5 + 101 * i);
		ck_assert_int_eq(S->arena_attach(mem[i], len, 4, &ar[i], err, sizeof(err)), 0);
		ck_assert_int_eq(S->shard_create(a, (uint32_t)i, len, 1u << 20, true, &sh[i], err, sizeof(err)),
				 0);
	}
	/* Arena 0 queues all of its writes first, then arena 1. */
	for (int i = 0; i < 2; i++)
		for (int e = 0; e < DD_N; e++) {
			w[i][e] = (struct dd_write){ i, order, &n_done, &res };
			S->shard_write(sh[i], ar[i], (uint64_t)e * DD_LEN, (uint64_t)e * DD_LEN, DD_LEN,
				       dd_done, &w[i][e]);
		}
	ck_assert_uint_eq(S->arena_busy(ar[0]) + S->arena_busy(ar[1]), 2 * DD_N);
	for (int t = 0; t < 5000 && n_done < 2 * DD_N; t++) {
		usleep(1000);
		S->arena_reap(ar[0]);
		S->arena_reap(ar[1]);
	}
	ck_assert_int_eq(n_done, 2 * DD_N);
	ck_assert_int_eq(res, 0);
	ck_assert_uint_eq(S->arena_busy(ar[0]) + S->arena_busy(ar[1]), 0);
	/* Taking turns: arena 1 finished some writes before arena 0's last. */
	int last0 = 0, first1 = 2 * DD_N;
	for (int i = 0; i < 2 * DD_N; i++) {
		if (order[i] == 0)
			last0 = i;
		else if (i < first1)
			first1 = i;
	}
	ck_assert_int_lt(first1, last0);
	area_path(&k, p, sizeof(p), NULL);
	snprintf(full, sizeof(full), "%s/%s", dir, p);
	for (int i = 0; i < 2; i++) {
		char name[64];
		uint8_t *back = malloc(len);
		ck_assert_int_eq(S->shard_finish(sh[i], len, err, sizeof(err)), 0);
		snprintf(name, sizeof(name), "rank-%05d.safetensors", i);
		ck_assert_int_eq(S->read_range(full, name, 0, len, back), 0);
		ck_assert(memcmp(back, mem[i], len) == 0);
		free(back);
		S->shard_close(sh[i]);
		S->arena_detach(ar[i]);
		munmap(mem[i], len);
		close(fds[i]);
	}
	S->attempt_close(a);
	S->set_disk_depth(0);
}
END_TEST

/* ---- tools ---- */

struct seen {
	int ckpt, work, other;
};

static int count_fn(void *ud, const char *name, enum store_entry kind)
{
	struct seen *s = ud;

	(void)name;
	s->ckpt += kind == STORE_ENTRY_CHECKPOINT;
	s->work += kind == STORE_ENTRY_WORK;
	s->other += kind == STORE_ENTRY_OTHER;
	return 0;
}

START_TEST(test_list_remove)
{
	struct store_key k = key("j", "n", 0);
	struct store_attempt *a = NULL;
	struct seen s = { 0 };
	char p[512], err[256];
	bool created;

	snprintf(p, sizeof(p), "%s/ck", dir);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/ck/%s", dir, MANIFEST_FILE);
	fclose(fopen(p, "w"));
	snprintf(p, sizeof(p), "%s/jobdir", dir);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(open_as(&me, &k, &a, &created, err), 0);
	S->attempt_close(a);
	ck_assert_int_eq(S->list(dir, "", count_fn, &s), 0);
	ck_assert_int_eq(s.ckpt, 1);
	ck_assert_int_eq(s.work, 1);
	ck_assert_int_eq(s.other, 1);
	ck_assert_int_eq(S->list(dir, "missing", count_fn, &s), -ENOENT);
	ck_assert_int_eq(S->remove(dir, "ck"), 0);
	ck_assert(!exists_in("ck"));
	ck_assert_int_eq(S->remove(dir, "ck"), 0);
}
END_TEST

static Suite *store_suite(void)
{
	Suite *s = suite_create("store");
	struct {
		const char *name;
		const TTest *fn;
	} cases[] = {
		{ "key_ids", test_key_ids },
		{ "create_and_join", test_create_and_join },
		{ "refusals", test_refusals },
		{ "earlier_life_replaced_failed_refused", test_earlier_life_replaced_failed_refused },
		{ "shards_claims_counts", test_shards_claims_counts },
		{ "fail_and_poll", test_fail_and_poll },
		{ "fail_after_commit_and_marker", test_fail_after_commit_and_marker },
		{ "creator_fails", test_creator_fails },
		{ "arena_write", test_arena_write },
		{ "disk_depth", test_disk_depth },
		{ "list_remove", test_list_remove },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		tcase_add_test(tc, cases[i].fn);
		suite_add_tcase(s, tc);
	}
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(store_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
