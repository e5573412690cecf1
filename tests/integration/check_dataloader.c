/* SPDX-License-Identifier: MIT */
/*
 * check_dataloader.c - integration: data-loader state across topologies.
 *
 * 4 DP ranks x 2 TP ranks save a 37-shard loader table (each DP group's
 * TP rank 0 writes its block and its per-rank blob) through a real ckptd;
 * the state is then restored by 4 (exactly as saved), by 3 and by 6 DP
 * ranks (x 2 TP): every logical shard owned exactly once, its cursor and
 * columns preserved, TP peers given the same rows, unfinished and finished
 * shards each balanced.  A 3-rank restore saved again and restored by 6
 * still holds every shard once.  A DP rank with no rows still saves its
 * (empty) block, so the topology is recognised.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <check.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define K 5        /* id, cursor, done, epoch, length */
#define SHARDS 37
#define MAX_DP 8
#define TP 2

/* A table block per DP rank, as a rank holds it. */
struct dp_block {
	int64_t *rows;
	uint64_t n, row0;
};

struct job {
	uint32_t dp;
	uint64_t n_shards;
	struct dp_block b[MAX_DP];
};

struct rank_args {
	const char *sock, *root, *name;
	const struct job *j;
	uint32_t dp, tp;
	uint64_t step;
};

static int save_rank(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	const struct dp_block *b = &a->j->b[a->dp];
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_future *fs, *fc;
	uint32_t rank = a->dp * TP + a->tp, world = a->j->dp * TP;
	char key[32], blob[64];
	int rc, st, cm;

	(void)go;
	rc = td_connect_rc(a->sock, "dljob", rank, world, 8 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "connect %d: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, a->step, &s);
	if (rc == 0)
		rc = ckpt_save_add_dl_table(s, "loader.table", b->rows, b->n, K, b->row0,
					    a->j->n_shards, a->tp);
	if (rc == 0 && a->tp == 0) {
		/* Per-rank state that does not reshard: one blob per DP rank. */
		snprintf(key, sizeof(key), "loader/dp-%u", a->dp);
		snprintf(blob, sizeof(blob), "workers of dp %u of %u", a->dp, a->j->dp);
		rc = ckpt_save_add_blob(s, key, blob, strlen(blob));
	}
	if (rc < 0) {
		td_report(rep, "add %d: %s", rc, ckpt_last_error());
		return 12;
	}
	rc = ckpt_save_commit(s, &fs, &fc);
	if (rc < 0) {
		td_report(rep, "commit %d: %s", rc, ckpt_last_error());
		return 13;
	}
	st = td_future_wait(fs, 60000);
	cm = td_future_wait(fc, 60000);
	td_report(rep, "committed %d %s", cm, ckpt_future_error(fc));
	ckpt_save_free(s);
	ckpt_disconnect(c);
	return st == 0 && cm == 0 ? 0 : 1;
}

static void save_job(struct testd *t, const struct job *j, const char *name, uint64_t step)
{
	struct td_child ch[MAX_DP * TP];
	struct rank_args a[MAX_DP * TP];
	uint32_t n = j->dp * TP;

	for (uint32_t r = 0; r < n; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(t, 0), .root = t->root, .name = name,
					   .j = j, .dp = r / TP, .tp = r % TP, .step = step };
		ck_assert_int_eq(td_child_start(&ch[r], save_rank, &a[r]), 0);
	}
	for (uint32_t r = 0; r < n; r++) {
		int st = td_child_wait(&ch[r], 90000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
}

/* The first run: ckpt_dl_first's deal, then some progress per shard. */
static void first_job(struct job *j, uint32_t dp, uint64_t shards)
{
	memset(j, 0, sizeof(*j));
	j->dp = dp;
	j->n_shards = shards;
	for (uint32_t d = 0; d < dp; d++) {
		int64_t *ids;
		ck_assert_int_eq(ckpt_dl_first(shards, dp, d, &ids, &j->b[d].n, &j->b[d].row0), 0);
		j->b[d].rows = malloc(j->b[d].n * K * sizeof(int64_t) + 1);
		for (uint64_t i = 0; i < j->b[d].n; i++) {
			int64_t *r = j->b[d].rows + i * K, len = 100 + ids[i] % 50;
			r[0] = ids[i];
			r[3] = 2;                       /* epoch */
			r[4] = len;                     /* length */
			r[2] = ids[i] % 4 == 0;         /* done */
			r[1] = r[2] ? len : (ids[i] * 7) % len; /* cursor */
		}
		free(ids);
	}
}

static void job_free(struct job *j)
{
	for (uint32_t d = 0; d < j->dp; d++)
		free(j->b[d].rows);
}

/* Restores `name` on M DP ranks x TP: checks the TP peers agree, every
 * shard is owned once with the row it had in `before`, blocks tile the
 * table, counts are balanced; fills *after. */
static void restore_job(const char *path, const struct job *before, uint32_t M, struct job *after)
{
	struct ckpt_reader *rd;
	int64_t *by_id[SHARDS] = { 0 };
	uint32_t owners[SHARDS] = { 0 };
	uint64_t next_row0 = 0, total = 0;
	uint64_t unf_min = UINT64_MAX, unf_max = 0, fin_min = UINT64_MAX, fin_max = 0;

	for (uint32_t d = 0; d < before->dp; d++)
		for (uint64_t i = 0; i < before->b[d].n; i++)
			by_id[before->b[d].rows[i * K]] = before->b[d].rows + i * K;
	memset(after, 0, sizeof(*after));
	after->dp = M;
	after->n_shards = before->n_shards;
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	for (uint32_t d = 0; d < M; d++) {
		int64_t *rows[TP];
		uint64_t n[TP], row0[TP];
		uint32_t k[TP];
		bool same[TP];

		for (uint32_t tp = 0; tp < TP; tp++) {
			int rc = ckpt_dl_restore(rd, "loader.table", M, d, &rows[tp], &n[tp], &k[tp],
						 &row0[tp], &same[tp]);
			ck_assert_msg(rc == 0, "restore dp %u: %d %s", d, rc, ckpt_last_error());
			ck_assert_uint_eq(k[tp], K);
			ck_assert(same[tp] == (M == before->dp));
		}
		/* TP peers: the same rows. */
		ck_assert_uint_eq(n[0], n[1]);
		ck_assert_uint_eq(row0[0], row0[1]);
		ck_assert(!memcmp(rows[0], rows[1], n[0] * K * sizeof(int64_t)));
		free(rows[1]);
		ck_assert_uint_eq(row0[0], next_row0);
		next_row0 += n[0];
		uint64_t unf = 0, fin = 0;
		for (uint64_t i = 0; i < n[0]; i++) {
			const int64_t *r = rows[0] + i * K;
			ck_assert(r[0] >= 0 && r[0] < SHARDS);
			ck_assert_ptr_nonnull(by_id[r[0]]);
			ck_assert_msg(!memcmp(r, by_id[r[0]], K * sizeof(int64_t)),
				      "shard %lld changed", (long long)r[0]);
			owners[r[0]]++;
			if (r[2])
				fin++;
			else
				unf++;
		}
		if (M == before->dp) {
			/* Same topology: exactly the saved block, in order. */
			ck_assert_uint_eq(n[0], before->b[d].n);
			ck_assert_uint_eq(row0[0], before->b[d].row0);
			ck_assert(!memcmp(rows[0], before->b[d].rows, n[0] * K * sizeof(int64_t)));
		}
		unf_min = unf < unf_min ? unf : unf_min;
		unf_max = unf > unf_max ? unf : unf_max;
		fin_min = fin < fin_min ? fin : fin_min;
		fin_max = fin > fin_max ? fin : fin_max;
		total += n[0];
		after->b[d] = (struct dp_block){ .rows = rows[0], .n = n[0], .row0 = row0[0] };
	}
	ck_assert_uint_eq(total, before->n_shards);
	for (uint64_t i = 0; i < before->n_shards; i++)
		ck_assert_msg(owners[i] == 1, "shard %llu owned %u times", (unsigned long long)i,
			      owners[i]);
	if (M != before->dp) { /* dealt again: balanced */
		ck_assert_uint_le(unf_max - unf_min, 1);
		ck_assert_uint_le(fin_max - fin_min, 1);
	}
	ckpt_reader_close(rd);
}

START_TEST(test_reshard_table)
{
	struct testd t;
	struct job j4, j3, j6, j4b, j6b;
	struct ckpt_reader *rd;
	char p[TD_PATH], key[32], buf[64];

	td_init(&t, "dl_reshard");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\ncommit_deadline = 60s\n"), 0);
	first_job(&j4, 4, SHARDS);
	save_job(&t, &j4, "dl-4", 100);
	td_path(p, sizeof(p), "%s/dl-4", t.root);
	restore_job(p, &j4, 4, &j4b); /* the identity */
	restore_job(p, &j4, 3, &j3);
	restore_job(p, &j4, 6, &j6);

	/* Same topology: the per-rank blobs match their ranks. */
	ck_assert_int_eq(ckpt_reader_open(p, &rd), 0);
	for (uint32_t d = 0; d < 4; d++) {
		char want[64];
		snprintf(key, sizeof(key), "loader/dp-%u", d);
		snprintf(want, sizeof(want), "workers of dp %u of 4", d);
		ck_assert_int_eq(ckpt_reader_blob_size(rd, key), (int64_t)strlen(want));
		ck_assert_int_eq(ckpt_reader_read_blob(rd, key, buf, strlen(want)), 0);
		ck_assert(!memcmp(buf, want, strlen(want)));
	}
	/* Not a table, or no such tensor. */
	int64_t *rows;
	uint64_t n, row0;
	uint32_t k;
	bool same;
	ck_assert_int_eq(ckpt_dl_restore(rd, "nope", 4, 0, &rows, &n, &k, &row0, &same), -ENOENT);
	ck_assert_int_eq(ckpt_dl_restore(rd, "loader.table", 4, 4, &rows, &n, &k, &row0, &same),
			 -EINVAL);
	ckpt_reader_close(rd);

	/* The 3-rank job saves at its new blocks; a 6-rank job restores. */
	save_job(&t, &j3, "dl-3", 200);
	td_path(p, sizeof(p), "%s/dl-3", t.root);
	restore_job(p, &j3, 6, &j6b);
	job_free(&j4);
	job_free(&j4b);
	job_free(&j3);
	job_free(&j6);
	job_free(&j6b);
	td_fini(&t);
}
END_TEST

/* A DP rank with no rows saves an empty block: restoring with the same
 * world is still recognised as the same topology. */
START_TEST(test_empty_block)
{
	struct testd t;
	struct job j, back;
	char p[TD_PATH];

	td_init(&t, "dl_empty");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	first_job(&j, 3, 2); /* ranks 0 and 1 get a shard, rank 2 none */
	ck_assert_uint_eq(j.b[2].n, 0);
	save_job(&t, &j, "dl-empty", 1);
	td_path(p, sizeof(p), "%s/dl-empty", t.root);
	restore_job(p, &j, 3, &back);
	ck_assert_uint_eq(back.b[2].n, 0);
	job_free(&j);
	job_free(&back);
	td_fini(&t);
}
END_TEST

static Suite *dl_suite(void)
{
	Suite *s = suite_create("integration_dataloader");

	td_case(s, "reshard_table", test_reshard_table, 180, 0, 1);
	td_case(s, "empty_block", test_empty_block, 60, 0, 1);
	return s;
}

int main(void)
{
	return td_main(dl_suite(), "check_dataloader");
}
