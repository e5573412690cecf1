/* SPDX-License-Identifier: MIT */
/*
 * check_pending.c - the records of spilled saves a daemon owes a commit
 * (daemon/pending.h): what is written loads back the same, the newest
 * save.json wins, and a damaged or foreign record is reported and left
 * alone, never loaded (a rank's record without its save's is removed).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon/pending.h"
#include "format/layout.h"
#include "format/safetensors.h"
#include "store/fsutil.h"

static char g_dir[256];

static void setup(void)
{
	snprintf(g_dir, sizeof(g_dir), "/tmp/check_pending.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void)
{
	fs_rm_rf_at(AT_FDCWD, g_dir);
}

static struct store_key key_of(uint32_t world)
{
	struct store_key k = { .step = 100, .attempt = 2, .world = world };

	snprintf(k.job, sizeof(k.job), "job");
	snprintf(k.run, sizeof(k.run), "run-1");
	snprintf(k.name, sizeof(k.name), "step-100");
	return k;
}

static void build(struct layout *l, const struct store_key *k, uint32_t rank)
{
	uint64_t sh[2] = { 3, 1 << 19 }, g[2] = { 3 * 8, 1 << 19 }, o[2] = { 3 * rank, 0 };
	char *json;
	size_t len;

	memset(l, 0, sizeof(*l));
	ck_assert_int_eq(layout_init(l, "s3://bucket/p", k->name, k->step), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "w", CKPT_F32, 2, sh, g, o, NULL, 0), 0);
	json_object_set_new(l->meta, "model", json_string("m"));
	ck_assert_int_eq(layout_pack(l), 0);
	ck_assert_int_eq(st_header_json(l, rank, &json, &len), 0);
	ck_assert_int_eq(layout_place(l, len), 0);
	free(json);
	ck_assert_uint_gt(l->n_crcs, 1);
}

static uint32_t *crcs_for(const struct layout *l, uint32_t seed)
{
	uint32_t *c = calloc(l->n_crcs, sizeof(*c));

	ck_assert_ptr_nonnull(c);
	for (uint32_t i = 0; i < l->n_crcs; i++)
		c[i] = seed * 7919u + i;
	return c;
}

static void record(const struct store_key *k, const char *id, uint32_t rank, const uint32_t *local,
		   size_t n_local, uint64_t gen)
{
	struct creds o = { .uid = 1234, .gid = 99, .umask = 027, .n_groups = 2,
			   .groups = { 5, 7 } };
	struct layout l;
	uint32_t *c;
	char err[512] = "";

	build(&l, k, rank);
	c = crcs_for(&l, rank + 1);
	ck_assert_msg(pending_record(g_dir, id, k, "s3://bucket/p", &o, local, n_local, gen, rank,
				     8u << 20, &l, c, err, sizeof(err)) == 0,
		      "%s", err);
	layout_free(&l);
	free(c);
}

/* What pending_load_all handed over. */
struct got {
	struct pending_save *p[4];
	unsigned n, bad, removed;
	char why[512];
};

static void on_save(void *ud, struct pending_save *p)
{
	struct got *g = ud;

	ck_assert_uint_lt(g->n, 4);
	g->p[g->n++] = p;
}

static void on_bad(void *ud, const char *id, const char *why, bool removed)
{
	struct got *g = ud;

	(void)id;
	g->bad++;
	g->removed += removed;
	snprintf(g->why, sizeof(g->why), "%s", why);
}

static void got_free(struct got *g)
{
	for (unsigned i = 0; i < g->n; i++)
		pending_free(g->p[i]);
}

static void rec_path(const char *id, const char *file, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s/%s/%s", g_dir, PENDING_DIR, id, file);
}

START_TEST(test_round_trip)
{
	struct store_key k = key_of(4);
	uint32_t local[3] = { 3, 0, 2 };
	char id[STORE_ID_LEN + 1];
	struct got g = { 0 };
	struct layout want;

	store_key_id(&k, id);
	ck_assert(!pending_exists(g_dir, id));
	record(&k, id, 2, local, 3, 1);
	record(&k, id, 0, local, 3, 2);
	ck_assert(pending_exists(g_dir, id));
	ck_assert_msg(pending_load_all(g_dir, on_save, on_bad, &g) == 1 && !g.bad, "%s", g.why);
	struct pending_save *p = g.p[0];
	ck_assert_str_eq(p->id, id);
	ck_assert_str_eq(p->root, "s3://bucket/p");
	ck_assert_str_eq(p->key.job, "job");
	ck_assert_str_eq(p->key.run, "run-1");
	ck_assert_str_eq(p->key.name, "step-100");
	ck_assert_uint_eq(p->key.step, 100);
	ck_assert_uint_eq(p->key.attempt, 2);
	ck_assert_uint_eq(p->key.world, 4);
	ck_assert_uint_eq(p->owner.uid, 1234);
	ck_assert_uint_eq(p->owner.gid, 99);
	ck_assert_uint_eq(p->owner.umask, 027);
	ck_assert_uint_eq(p->owner.n_groups, 2);
	ck_assert_uint_eq(p->owner.groups[1], 7);
	ck_assert_uint_eq(p->n_local, 3);
	ck_assert_uint_eq(p->local[0], 0);
	ck_assert_uint_eq(p->local[2], 3);
	ck_assert_uint_eq(p->n_ranks, 2);
	for (size_t i = 0; i < 2; i++) {
		struct pending_rank *r = &p->ranks[i];
		uint32_t *c;

		ck_assert_uint_eq(r->rank, i ? 2 : 0);
		ck_assert_uint_eq(r->extent, 8u << 20);
		build(&want, &k, r->rank);
		c = crcs_for(&want, r->rank + 1);
		ck_assert_uint_eq(r->layout.file_size, want.file_size);
		ck_assert_uint_eq(r->layout.data_start, want.data_start);
		ck_assert_uint_eq(r->layout.n_items, 1);
		ck_assert_uint_eq(r->layout.n_crcs, want.n_crcs);
		ck_assert_uint_eq(r->layout.items[0].begin, want.items[0].begin);
		ck_assert_int_eq(memcmp(r->crcs, c, want.n_crcs * 4), 0);
		layout_free(&want);
		free(c);
	}
	got_free(&g);
	pending_remove(g_dir, id);
	ck_assert(!pending_exists(g_dir, id));
}
END_TEST

/* save.json of a later gen is never replaced by an earlier one's (two
 * ranks' jobs finish in either order). */
START_TEST(test_gen_order)
{
	struct store_key k = key_of(3);
	uint32_t newer[2] = { 0, 1 }, older[1] = { 0 };
	char id[STORE_ID_LEN + 1];
	struct got g = { 0 };

	store_key_id(&k, id);
	record(&k, id, 1, newer, 2, 7);
	record(&k, id, 0, older, 1, 6);
	ck_assert_msg(pending_load_all(g_dir, on_save, on_bad, &g) == 1, "%s", g.why);
	ck_assert_uint_eq(g.p[0]->n_local, 2);
	ck_assert_uint_eq(g.p[0]->n_ranks, 2);
	got_free(&g);
}
END_TEST

/* A byte changed anywhere in a rank's record: reported, left, not loaded. */
START_TEST(test_damaged)
{
	struct store_key k = key_of(2);
	uint32_t local[1] = { 0 };
	char id[STORE_ID_LEN + 1], path[512];
	struct got g = { 0 };
	struct stat st;
	unsigned char b;
	int fd;

	store_key_id(&k, id);
	record(&k, id, 0, local, 1, 1);
	rec_path(id, "rank-00000.rec", path, sizeof(path));
	ck_assert_int_eq(stat(path, &st), 0);
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	off_t at = (off_t)(_i * (st.st_size - 1) / 4);
	ck_assert_int_eq(pread(fd, &b, 1, at), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
	close(fd);
	ck_assert_uint_eq(pending_load_all(g_dir, on_save, on_bad, &g), 0);
	ck_assert_uint_eq(g.bad, 1);
	ck_assert_uint_eq(g.removed, 0);
	ck_assert_msg(strstr(g.why, "rank-00000.rec"), "%s", g.why);
	ck_assert(pending_exists(g_dir, id));
}
END_TEST

/* A save.json that is not this attempt's (another key, another id), or
 * is not JSON: reported, left, not loaded. */
START_TEST(test_foreign)
{
	struct store_key k = key_of(2), other = key_of(2);
	uint32_t local[1] = { 0 };
	char id[STORE_ID_LEN + 1], oid[STORE_ID_LEN + 1], path[512];
	struct got g = { 0 };
	char *text;
	size_t len;

	store_key_id(&k, id);
	other.step = 101;
	store_key_id(&other, oid);
	record(&k, id, 0, local, 1, 1);
	rec_path(id, "save.json", path, sizeof(path));
	ck_assert_int_eq(fs_read_file_at(AT_FDCWD, path, 1 << 16, &text, &len), 0);
	if (_i == 0) {
		/* the step of another key */
		char *at = strstr(text, "\"step\":100");
		ck_assert_ptr_nonnull(at);
		at[9] = '1';
	} else if (_i == 1) {
		/* another attempt's id */
		char *at = strstr(text, id);
		ck_assert_ptr_nonnull(at);
		memcpy(at, oid, STORE_ID_LEN);
	} else {
		text[0] = '[';
	}
	ck_assert_int_eq(fs_write_file_at(AT_FDCWD, path, text, len, 0), 0);
	free(text);
	ck_assert_uint_eq(pending_load_all(g_dir, on_save, on_bad, &g), 0);
	ck_assert_uint_eq(g.bad, 1);
	ck_assert(pending_exists(g_dir, id));
}
END_TEST

/* A rank's record whose save.json never came (the daemon stopped between
 * the two writes, before SAVE_DURABLE): removed; a directory that is not
 * an attempt id: reported, left. */
START_TEST(test_half_written)
{
	struct store_key k = key_of(2);
	uint32_t local[1] = { 0 };
	char id[STORE_ID_LEN + 1], path[512];
	struct got g = { 0 };

	store_key_id(&k, id);
	record(&k, id, 0, local, 1, 1);
	rec_path(id, "save.json", path, sizeof(path));
	ck_assert_int_eq(unlink(path), 0);
	snprintf(path, sizeof(path), "%s/%s/not-an-id", g_dir, PENDING_DIR);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_uint_eq(pending_load_all(g_dir, on_save, on_bad, &g), 0);
	ck_assert_uint_eq(g.bad, 2);
	ck_assert_uint_eq(g.removed, 1);
	ck_assert(!pending_exists(g_dir, id));
	ck_assert_int_eq(access(path, F_OK), 0);
}
END_TEST

static Suite *pending_suite(void)
{
	Suite *s = suite_create("pending");
	TCase *tc = tcase_create("records");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_gen_order);
	tcase_add_loop_test(tc, test_damaged, 0, 5);
	tcase_add_loop_test(tc, test_foreign, 0, 3);
	tcase_add_test(tc, test_half_written);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(pending_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
