/* SPDX-License-Identifier: MIT */
/*
 * check_save.c - integration: saves through a real ckptd that must read back
 * byte for byte (with libckpt's reader and with the safetensors library),
 * and what ckptctl and manifest.json show about them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <check.h>
#include <jansson.h>

#include "ckpt.h"
#include "store/store.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 90000

/* Checks the committed checkpoint's directory: manifest present, no work
 * directory left in root. */
static void assert_committed(const struct testd *t, const char *name)
{
	char p[TD_PATH];

	td_path(p, sizeof(p), "%s/%s/manifest.json", t->root, name);
	ck_assert_msg(td_exists(p), "%s missing after a successful commit", p);
	ck_assert_msg(td_wait_count(t->root, STORE_WORK_PREFIX, 0, 10000),
		      "a .partial work dir is still in %s after the commit", t->root);
}

static struct ckpt_reader *open_reader(const struct testd *t, const char *name)
{
	char p[TD_PATH];
	struct ckpt_reader *r = NULL;
	int rc;

	td_path(p, sizeof(p), "%s/%s", t->root, name);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "ckpt_reader_open(%s) = %d (%s): %s", p, rc, strerror(-rc),
		      ckpt_last_error());
	return r;
}

static void commit_ok(struct ckpt_save *s, const char *what)
{
	int st, cm;
	char msg[1024];
	int r = td_commit_wait(s, WAIT_MS, &st, &cm, msg, sizeof(msg));

	ck_assert_msg(r == 0, "%s: ckpt_save_commit = %d (%s): %s", what, r, strerror(-r), msg);
	ck_assert_msg(st == 0, "%s: staged future = %d (%s): %s", what, st, strerror(-st), msg);
	ck_assert_msg(cm == 0, "%s: committed future = %d (%s): %s", what, cm, strerror(-cm), msg);
}

/* ---- 1. one rank, 1 GiB, mixed dtypes -------------------------------------- */

START_TEST(test_one_gib)
{
	static const enum ckpt_dtype dts[4] = { CKPT_F32, CKPT_BF16, CKPT_I64, CKPT_U8 };
	const unsigned n = 64;
	const uint64_t tbytes = 16 * MiB;
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r;
	struct td_spec *sp;
	unsigned char *data;
	uint64_t shapes[64][2];
	char names[64][32], p[TD_PATH];
	int rc;

	td_init(&t, "one_gib");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 1G\n"), 0);

	data = malloc(n * tbytes);
	ck_assert_ptr_nonnull(data);
	for (unsigned i = 0; i < n; i++) {
		size_t es = td_dtype_size(dts[i % 4]);

		/* 2-D shapes of 16 MiB: rows x cols with cols depending on i */
		shapes[i][1] = (uint64_t)(1024u << (i % 3)) / es;
		shapes[i][0] = tbytes / es / shapes[i][1];
		snprintf(names[i], sizeof(names[i]), "layers.%02u.%s", i, td_dtype_name(dts[i % 4]));
		td_fill(data + i * tbytes, tbytes, 1000 + i, 0);
	}

	c = td_connect(td_sock(&t, 0), "job1", 0, 1, 0);
	rc = ckpt_save_begin(c, t.root, "gib", 42, &s);
	ck_assert_msg(rc == 0, "save_begin = %d: %s", rc, ckpt_last_error());
	for (unsigned i = 0; i < n; i++)
		td_add(s, names[i], dts[i % 4], 2, shapes[i], data + i * tbytes);
	commit_ok(s, "1 GiB save");
	ckpt_save_free(s);
	ckpt_disconnect(c);

	assert_committed(&t, "gib");
	/* The source is no longer needed: reuse the memory for reading. */
	free(data);

	r = open_reader(&t, "gib");
	ck_assert_uint_eq(ckpt_reader_step(r), 42);
	ck_assert_uint_eq(ckpt_reader_world(r), 1);
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), n);
	for (unsigned i = 0; i < n; i++)
		ck_assert_msg(td_verify_tensor(r, names[i], dts[i % 4], 2, shapes[i], 1000 + i),
			      "tensor %s does not read back (see above)", names[i]);
	ckpt_reader_close(r);

	sp = td_spec_new();
	for (unsigned i = 0; i < n; i++)
		td_spec_add(sp, "rank-00000.safetensors", names[i], dts[i % 4], 2, shapes[i], NULL,
			    NULL, 1000 + i);
	td_path(p, sizeof(p), "%s/gib", t.root);
	ck_assert_msg(td_st_verify(&t, p, sp) >= 0, "safetensors disagrees (see above)");
	td_spec_free(sp);
	td_fini(&t);
}
END_TEST

/* ---- 3. 10,000 small tensors ----------------------------------------------- */

START_TEST(test_many_tensors)
{
	static const enum ckpt_dtype dts[6] = { CKPT_F32, CKPT_BF16, CKPT_I64,
						CKPT_U8, CKPT_F16, CKPT_I32 };
	const unsigned n = 10000;
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r;
	unsigned char *data;
	uint64_t *lens;
	size_t *offs, total = 0;
	char name[32];
	int rc;

	td_init(&t, "many_tensors");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 256M\n"), 0);

	lens = calloc(n, sizeof(*lens));
	offs = calloc(n, sizeof(*offs));
	ck_assert(lens && offs);
	for (unsigned i = 0; i < n; i++) {
		lens[i] = 1 + (i * 37) % 300; /* elements */
		offs[i] = total;
		total += lens[i] * td_dtype_size(dts[i % 6]);
	}
	data = malloc(total);
	ck_assert_ptr_nonnull(data);
	for (unsigned i = 0; i < n; i++)
		td_fill(data + offs[i], lens[i] * td_dtype_size(dts[i % 6]), 50000 + i, 0);

	c = td_connect(td_sock(&t, 0), "job3", 0, 1, 64 * MiB);
	rc = ckpt_save_begin(c, t.root, "many", 3, &s);
	ck_assert_msg(rc == 0, "save_begin = %d: %s", rc, ckpt_last_error());
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "p.%05u", i);
		td_add(s, name, dts[i % 6], 1, &lens[i], data + offs[i]);
	}
	commit_ok(s, "10,000-tensor save");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	assert_committed(&t, "many");

	r = open_reader(&t, "many");
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), n);
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "p.%05u", i);
		ck_assert_msg(td_verify_tensor(r, name, dts[i % 6], 1, &lens[i], 50000 + i),
			      "tensor %s does not read back (see above)", name);
	}
	/* names come back complete: the i-th name exists once */
	{
		size_t seen = 0;

		for (size_t i = 0; i < ckpt_reader_tensor_count(r); i++) {
			const char *nm = ckpt_reader_tensor_name(r, i);

			ck_assert_ptr_nonnull(nm);
			seen += strncmp(nm, "p.", 2) == 0;
		}
		ck_assert_uint_eq(seen, n);
		ck_assert_ptr_null(ckpt_reader_tensor_name(r, n));
	}
	ckpt_reader_close(r);
	free(data);
	free(lens);
	free(offs);
	td_fini(&t);
}
END_TEST

/* ---- 4. a checkpoint 3x the arena ------------------------------------------ */

START_TEST(test_larger_than_arena)
{
	const unsigned n = 12;
	const uint64_t tbytes = 16 * MiB;
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r;
	unsigned char *data;
	uint64_t shape[1] = { tbytes / 4 };
	char name[32];
	int rc;

	td_init(&t, "larger_than_arena");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);

	data = malloc(n * tbytes);
	ck_assert_ptr_nonnull(data);
	for (unsigned i = 0; i < n; i++)
		td_fill(data + i * tbytes, tbytes, 4000 + i, 0);

	/* Ask for 1 GiB; the daemon caps it at 64 MiB. */
	c = td_connect(td_sock(&t, 0), "job4", 0, 1, 1024 * MiB);
	ck_assert_msg(ckpt_client_arena_bytes(c) <= 64 * MiB && ckpt_client_arena_bytes(c) > 0,
		      "arena granted %llu, cap is 64 MiB",
		      (unsigned long long)ckpt_client_arena_bytes(c));
	rc = ckpt_save_begin(c, t.root, "big", 4, &s);
	ck_assert_msg(rc == 0, "save_begin = %d: %s", rc, ckpt_last_error());
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "w%02u", i);
		td_add(s, name, CKPT_F32, 1, shape, data + i * tbytes);
	}
	commit_ok(s, "192 MiB save through a 64 MiB arena");
	ckpt_save_free(s);

	/* The arena is reused: a second save on the same client works too. */
	rc = ckpt_save_begin(c, t.root, "big2", 5, &s);
	ck_assert_int_eq(rc, 0);
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "w%02u", i);
		td_add(s, name, CKPT_F32, 1, shape, data + i * tbytes);
	}
	commit_ok(s, "second save on the same client");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(data);

	assert_committed(&t, "big");
	assert_committed(&t, "big2");
	for (int k = 0; k < 2; k++) {
		r = open_reader(&t, k ? "big2" : "big");
		ck_assert_uint_eq(ckpt_reader_tensor_count(r), n);
		for (unsigned i = 0; i < n; i++) {
			snprintf(name, sizeof(name), "w%02u", i);
			ck_assert_msg(td_verify_tensor(r, name, CKPT_F32, 1, shape, 4000 + i),
				      "tensor %s does not read back", name);
		}
		ckpt_reader_close(r);
	}
	td_fini(&t);
}
END_TEST

/* ---- 5. blobs ---------------------------------------------------------------- */

START_TEST(test_blobs)
{
	static const struct {
		const char *key;
		size_t len;
	} blobs[] = {
		{ "empty", 0 },
		{ "rng.state", 13 },
		{ "loader/shard-3", 4096 + 5 },
		{ "config.yaml", 1000 },
		{ "big.bin", 3 * MiB },
	};
	const size_t nb = sizeof(blobs) / sizeof(blobs[0]);
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	struct ckpt_reader *r;
	unsigned char *bufs[8];
	uint64_t tshape[2] = { 3, 5 };
	float tdata[15];
	int rc;

	td_init(&t, "blobs");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	for (size_t i = 0; i < nb; i++) {
		bufs[i] = malloc(blobs[i].len + 1);
		ck_assert_ptr_nonnull(bufs[i]);
		td_fill(bufs[i], blobs[i].len, 7000 + i, 0);
	}
	td_fill(tdata, sizeof(tdata), 7100, 0);

	c = td_connect(td_sock(&t, 0), "job5", 0, 1, 64 * MiB);
	rc = ckpt_save_begin(c, t.root, "blobs", 5, &s);
	ck_assert_int_eq(rc, 0);
	for (size_t i = 0; i < nb; i++) {
		rc = ckpt_save_add_blob(s, blobs[i].key, bufs[i], blobs[i].len);
		ck_assert_msg(rc == 0, "add_blob(%s, %zu) = %d: %s", blobs[i].key, blobs[i].len, rc,
			      ckpt_last_error());
	}
	td_add(s, "tensor", CKPT_F32, 2, tshape, tdata);
	commit_ok(s, "save with blobs");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	assert_committed(&t, "blobs");

	r = open_reader(&t, "blobs");
	for (size_t i = 0; i < nb; i++) {
		int64_t sz = ckpt_reader_blob_size(r, blobs[i].key);
		unsigned char *back;
		int64_t bad;

		ck_assert_msg(sz == (int64_t)blobs[i].len, "blob %s: size %lld, saved %zu",
			      blobs[i].key, (long long)sz, blobs[i].len);
		back = malloc(blobs[i].len + 1);
		ck_assert_ptr_nonnull(back);
		memset(back, 0xee, blobs[i].len + 1);
		rc = ckpt_reader_read_blob(r, blobs[i].key, back, blobs[i].len);
		ck_assert_msg(rc == 0, "read_blob(%s) = %d (%s): %s", blobs[i].key, rc,
			      strerror(-rc), ckpt_last_error());
		bad = td_check(back, blobs[i].len, 7000 + i, 0);
		ck_assert_msg(bad < 0, "blob %s differs at byte %lld", blobs[i].key, (long long)bad);
		ck_assert_msg(back[blobs[i].len] == 0xee, "read_blob(%s) wrote past len",
			      blobs[i].key);
		/* A wrong length is refused, not truncated. */
		if (blobs[i].len > 0) {
			rc = ckpt_reader_read_blob(r, blobs[i].key, back, blobs[i].len - 1);
			ck_assert_msg(rc == -EINVAL, "read_blob(%s, len-1) = %d, want -EINVAL",
				      blobs[i].key, rc);
		}
		free(back);
	}
	ck_assert_int_eq(ckpt_reader_blob_size(r, "no-such-blob"), -ENOENT);
	{
		unsigned char x;

		ck_assert_int_eq(ckpt_reader_read_blob(r, "no-such-blob", &x, 1), -ENOENT);
	}
	/* Blobs are not tensors: one tensor in this checkpoint. */
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), 1);
	ck_assert(td_verify_tensor(r, "tensor", CKPT_F32, 2, tshape, 7100));
	ckpt_reader_close(r);
	for (size_t i = 0; i < nb; i++)
		free(bufs[i]);
	td_fini(&t);
}
END_TEST

/* ---- 6. the trainer mutates its memory right after staged -------------------- */

/*
 * What "staged" promises: once it completes, the trainer may write its
 * tensors again, and the checkpoint still holds the bytes of the moment of
 * the save.  Six saves back to back through one arena (each begins while the
 * one before is still draining), every tensor refilled with new bytes as soon
 * as its save is staged; sizes on both sides of the host engine's
 * streaming-store threshold and of 4 KiB, odd lengths included.  Each
 * checkpoint must read back with its own bytes, none with a neighbour's.
 */
START_TEST(test_mutate_after_staged)
{
	enum { SAVES = 6, N = 7 };
	static const uint64_t elems[N] = { 2 * 1024 * 1024 + 3, 262144 + 1, 16384, 16383,
					   1000, 5, 3 * 1024 * 1024 };
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s[SAVES] = { 0 };
	struct ckpt_future *fs, *fc[SAVES];
	struct ckpt_reader *r;
	float *buf[N];
	char name[32], tname[32];
	int rc;

	td_init(&t, "mutate_after_staged");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 256M\n"), 0);
	for (unsigned i = 0; i < N; i++) {
		buf[i] = malloc(elems[i] * sizeof(float));
		ck_assert_ptr_nonnull(buf[i]);
		td_fill(buf[i], elems[i] * sizeof(float), 7000 + i, 0);
	}
	c = td_connect(td_sock(&t, 0), "job6", 0, 1, 128 * MiB);
	for (unsigned k = 0; k < SAVES; k++) {
		snprintf(name, sizeof(name), "step-%u", k);
		rc = ckpt_save_begin(c, t.root, name, k, &s[k]);
		ck_assert_msg(rc == 0, "save_begin %s = %d: %s", name, rc, ckpt_last_error());
		for (unsigned i = 0; i < N; i++) {
			snprintf(tname, sizeof(tname), "t%u", i);
			td_add(s[k], tname, CKPT_F32, 1, &elems[i], buf[i]);
		}
		ck_assert_int_eq(ckpt_save_commit(s[k], &fs, &fc[k]), 0);
		rc = td_future_wait(fs, WAIT_MS);
		ck_assert_msg(rc == 0, "%s: staged = %d: %s", name, rc, ckpt_future_error(fs));
		/* Staged: the next step's values, at once. */
		for (unsigned i = 0; i < N; i++)
			td_fill(buf[i], elems[i] * sizeof(float), 7000 + 100 * (k + 1) + i, 0);
	}
	for (unsigned k = 0; k < SAVES; k++) {
		rc = td_future_wait(fc[k], WAIT_MS);
		ck_assert_msg(rc == 0, "step-%u: committed = %d: %s", k, rc,
			      ckpt_future_error(fc[k]));
		ckpt_save_free(s[k]);
	}
	ckpt_disconnect(c);

	for (unsigned k = 0; k < SAVES; k++) {
		snprintf(name, sizeof(name), "step-%u", k);
		assert_committed(&t, name);
		r = open_reader(&t, name);
		for (unsigned i = 0; i < N; i++) {
			snprintf(tname, sizeof(tname), "t%u", i);
			ck_assert_msg(td_verify_tensor(r, tname, CKPT_F32, 1, &elems[i],
						       7000 + 100 * k + i),
				      "%s/%s does not hold the bytes of its own save", name, tname);
		}
		ckpt_reader_close(r);
	}
	for (unsigned i = 0; i < N; i++)
		free(buf[i]);
	td_fini(&t);
}
END_TEST

/* ---- 16. ckptctl list / show -------------------------------------------------- */

static void save_small(const struct testd *t, struct ckpt_client *c, const char *name,
		       uint64_t step)
{
	struct ckpt_save *s = NULL;
	uint64_t sh1[2] = { 4, 8 }, sh2[1] = { 8 };
	static float w[32], b[8];
	int rc;

	td_fill(w, sizeof(w), 1, 0);
	td_fill(b, sizeof(b), 2, 0);
	rc = ckpt_save_begin(c, t->root, name, step, &s);
	ck_assert_msg(rc == 0, "save_begin(%s) = %d: %s", name, rc, ckpt_last_error());
	td_add(s, "encoder.layer0.weight", CKPT_F32, 2, sh1, w);
	td_add(s, "encoder.layer0.bias", CKPT_F32, 1, sh2, b);
	commit_ok(s, name);
	ckpt_save_free(s);
}

START_TEST(test_ckptctl_list_show)
{
	struct testd t;
	struct ckpt_client *c;
	char *out = NULL, p[TD_PATH];
	int st;

	td_init(&t, "ckptctl");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	c = td_connect(td_sock(&t, 0), "job16", 0, 1, 16 * MiB);
	save_small(&t, c, "alpha", 1234567);
	save_small(&t, c, "beta", 7654321);
	ckpt_disconnect(c);
	/* An uncommitted work dir is not a checkpoint. */
	td_path(p, sizeof(p), "%s/.partial-gamma-jobx", t.root);
	ck_assert_int_eq(mkdir(p, 0755), 0);

	st = td_ckptctl(&out, "list", t.root, NULL);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl list: %s\n%s", td_status_str(st), out);
	ck_assert_msg(strstr(out, "alpha") && strstr(out, "1234567"),
		      "ckptctl list lacks alpha / step 1234567:\n%s", out);
	ck_assert_msg(strstr(out, "beta") && strstr(out, "7654321"),
		      "ckptctl list lacks beta / step 7654321:\n%s", out);
	/* A work dir may be listed, but never as committed. */
	{
		char *g = strstr(out, "gamma");
		char *eol = g ? strchr(g, '\n') : NULL;

		if (eol)
			*eol = '\0';
		ck_assert_msg(!g || !strstr(g, "committed"),
			      "ckptctl list shows a work dir as committed: %s", g);
	}
	free(out);

	td_path(p, sizeof(p), "%s/alpha", t.root);
	st = td_ckptctl(&out, "show", p, NULL);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl show: %s\n%s", td_status_str(st), out);
	ck_assert_msg(strstr(out, "encoder.layer0.weight") && strstr(out, "encoder.layer0.bias"),
		      "ckptctl show lacks the tensors:\n%s", out);
	ck_assert_msg(strstr(out, "F32"), "ckptctl show lacks the dtype:\n%s", out);
	free(out);

	/* show of something that is not a checkpoint fails */
	td_path(p, sizeof(p), "%s/nonexistent", t.root);
	st = td_ckptctl(&out, "show", p, NULL);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0,
		      "ckptctl show of a missing checkpoint: %s\n%s", td_status_str(st), out);
	free(out);

	/* status --json is valid JSON naming our root */
	st = td_ckptctl(&out, "-s", (char *)td_sock(&t, 0), "status", "--json", NULL);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl status --json: %s\n%s", td_status_str(st), out);
	{
		json_error_t je;
		json_t *j = json_loads(out, 0, &je);

		ck_assert_msg(j != NULL, "status --json is not JSON (%s):\n%s", je.text, out);
		ck_assert_msg(json_is_array(json_object_get(j, "clients")),
			      "status lacks \"clients\":\n%s", out);
		ck_assert_msg(json_is_integer(json_object_get(j, "arena_bytes_total")),
			      "status lacks \"arena_bytes_total\":\n%s", out);
		json_decref(j);
	}
	free(out);
	td_fini(&t);
}
END_TEST

/* ---- 17. metadata and metrics in manifest.json -------------------------------- */

START_TEST(test_manifest_metadata)
{
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s = NULL;
	uint64_t sh[1] = { 100 };
	static int32_t v[100];
	char *text = NULL, p[TD_PATH], longval[CKPT_MAX_META_LEN + 1];
	json_t *j, *meta, *met;
	json_error_t je;
	int rc;

	td_init(&t, "manifest_meta");
	ck_assert_int_eq(td_daemon_start(&t, 0, NULL), 0);
	td_fill(v, sizeof(v), 17, 0);
	memset(longval, 'x', CKPT_MAX_META_LEN);
	longval[CKPT_MAX_META_LEN] = '\0';

	c = td_connect(td_sock(&t, 0), "job17", 0, 1, 16 * MiB);
	rc = ckpt_save_begin(c, t.root, "meta", 17, &s);
	ck_assert_int_eq(rc, 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "git_sha", "0123abcd"), 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "note", "quote \" backslash \\ tab\t end"), 0);
	ck_assert_int_eq(ckpt_save_set_metadata(s, "long", longval), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "loss", 1.25), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "accuracy", 0.875), 0);
	ck_assert_int_eq(ckpt_save_set_metric(s, "neg", -3.5e-7), 0);
	td_add(s, "v", CKPT_I32, 1, sh, v);
	commit_ok(s, "save with metadata");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	assert_committed(&t, "meta");

	td_path(p, sizeof(p), "%s/meta/manifest.json", t.root);
	ck_assert_int_eq(td_read_file(p, 64 * MiB, &text, NULL), 0);
	j = json_loads(text, 0, &je);
	ck_assert_msg(j != NULL, "manifest.json does not parse: %s (line %d)", je.text, je.line);
	ck_assert_str_eq(json_string_value(json_object_get(j, "format")), "ckpt-1");
	ck_assert_str_eq(json_string_value(json_object_get(j, "name")), "meta");
	ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), 17);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "world_size")), 1);
	ck_assert_str_eq(json_string_value(json_object_get(j, "job")), "job17");

	meta = json_object_get(j, "metadata");
	ck_assert_msg(json_is_object(meta), "manifest lacks \"metadata\":\n%s", text);
	ck_assert_str_eq(json_string_value(json_object_get(meta, "git_sha")), "0123abcd");
	ck_assert_str_eq(json_string_value(json_object_get(meta, "note")),
			 "quote \" backslash \\ tab\t end");
	ck_assert_str_eq(json_string_value(json_object_get(meta, "long")), longval);

	met = json_object_get(j, "metrics");
	ck_assert_msg(json_is_object(met), "manifest lacks \"metrics\":\n%s", text);
	ck_assert(json_is_number(json_object_get(met, "loss")));
	ck_assert(json_number_value(json_object_get(met, "loss")) == 1.25);
	ck_assert(json_number_value(json_object_get(met, "accuracy")) == 0.875);
	ck_assert(fabs(json_number_value(json_object_get(met, "neg")) - -3.5e-7) < 1e-20);

	/* and the tensor is described */
	ck_assert_msg(json_is_object(json_object_get(json_object_get(j, "tensors"), "v")),
		      "manifest lacks tensors.v:\n%s", text);
	json_decref(j);
	free(text);
	td_fini(&t);
}
END_TEST

static Suite *save_suite(void)
{
	Suite *s = suite_create("integration_save");

	td_case(s, "one_rank_1gib", test_one_gib, 180, 0, 1);
	td_case(s, "ten_thousand_tensors", test_many_tensors, 120, 0, 1);
	td_case(s, "larger_than_arena", test_larger_than_arena, 120, 0, 1);
	td_case(s, "mutate_after_staged", test_mutate_after_staged, 120, 0, 1);
	td_case(s, "blobs", test_blobs, 60, 0, 1);
	td_case(s, "ckptctl_list_show", test_ckptctl_list_show, 60, 0, 1);
	td_case(s, "manifest_metadata", test_manifest_metadata, 60, 0, 1);
	return s;
}

int main(void)
{
	return td_main(save_suite(), "check_save");
}
