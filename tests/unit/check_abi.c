/* SPDX-License-Identifier: MIT */
/*
 * check_abi.c - libckpt's public ABI rules (ckpt.h, "ABI and versions"):
 * structs read by their size field as openat2() reads its struct, the
 * version macros and ckpt_version(), and the exported symbols.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "client/internal.h"
#include "tests/lib/fake_ckptd.h"

#define MiB (1ull << 20)

/* ---- abi_copy_in on a made-up struct: 8 bytes in its first version, 16
 * now ---- */

static const struct abi_struct made_up = { "struct made_up", "MADE_UP_INIT", 16, 8 };

START_TEST(test_copy_in_rules)
{
	unsigned char src[64], dst[16];
	uint32_t size;

	memset(src, 0xab, sizeof(src));
	/* An older caller (the first version): the rest reads as zero. */
	size = 8;
	memcpy(src, &size, 4);
	memset(dst, 0xee, sizeof(dst));
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), 0);
	ck_assert_int_eq(memcmp(dst, src, 8), 0);
	for (int i = 8; i < 16; i++)
		ck_assert_uint_eq(dst[i], 0);
	/* The current version. */
	size = 16;
	memcpy(src, &size, 4);
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), 0);
	ck_assert_int_eq(memcmp(dst, src, 16), 0);
	/* Too small for any version. */
	size = 7;
	memcpy(src, &size, 4);
	memset(dst, 0xee, sizeof(dst));
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "MADE_UP_INIT"));
	ck_assert_uint_eq(dst[0], 0xee);
	size = 0;
	memcpy(src, &size, 4);
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), -EINVAL);
	/* A newer caller: accepted if it uses nothing this library lacks. */
	memset(src + 16, 0, 48);
	size = 64;
	memcpy(src, &size, 4);
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), 0);
	ck_assert_int_eq(memcmp(dst, src, 16), 0);
	src[63] = 1;
	memset(dst, 0xee, sizeof(dst));
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), -E2BIG);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "byte 63 is set"));
	ck_assert_uint_eq(dst[0], 0xee);
	/* Garbage sizes are refused before anything is read. */
	size = ABI_MAX_STRUCT + 1;
	memcpy(src, &size, 4);
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), -E2BIG);
	size = UINT32_MAX;
	memcpy(src, &size, 4);
	ck_assert_int_eq(abi_copy_in(&made_up, dst, src, "f"), -E2BIG);
}
END_TEST

/* ---- the rules through the public functions ---- */

/* A caller's struct T grown by 8 bytes, as a newer header would. */
#define GROWN(T)                                                                                   \
	struct {                                                                                   \
		T base;                                                                            \
		uint64_t newer;                                                                    \
	}

START_TEST(test_connect_opts_size)
{
	char dir[] = "/tmp/check-abi-XXXXXX", sock[64];
	struct ckpt_client *c = (void *)1;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/none.sock", dir);
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = sock, .job = "j",
				       .world = 1 };
	ck_assert_uint_eq(o.size, sizeof(o));
	/* 0.3 appended cuda_pin and a reserved field, which 0.5 made flags. */
	ck_assert_uint_eq(CKPT_CONNECT_OPTS_SIZE_VER0 + 8, sizeof(o));
	/* Valid options reach the socket (which does not exist). */
	ck_assert_int_eq(ckpt_connect(&o, &c), -ENOENT);
	/* A program built against 0.2 (the shorter struct) still connects. */
	struct ckpt_connect_opts old = o;
	old.size = CKPT_CONNECT_OPTS_SIZE_VER0;
	ck_assert_int_eq(ckpt_connect(&old, &c), -ENOENT);
	old = o;
	old.cuda_pin = (enum ckpt_cuda_pin)7;
	ck_assert_int_eq(ckpt_connect(&old, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "cuda_pin"));
	old = o;
	old.flags = 0x80000000u; /* not a flag this library knows */
	ck_assert_int_eq(ckpt_connect(&old, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "unknown flags"));
	old.flags = CKPT_CONNECT_RESIDENT;
	ck_assert_int_eq(ckpt_connect(&old, &c), -ENOENT);

	struct ckpt_connect_opts bad = o;
	bad.size = 0; /* a program written for libckpt 0.1 */
	ck_assert_int_eq(ckpt_connect(&bad, &c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_CONNECT_OPTS_INIT"));
	bad.size = CKPT_CONNECT_OPTS_SIZE_VER0 - 1;
	ck_assert_int_eq(ckpt_connect(&bad, &c), -EINVAL);
	bad.size = ABI_MAX_STRUCT + 1;
	ck_assert_int_eq(ckpt_connect(&bad, &c), -E2BIG);

	GROWN(struct ckpt_connect_opts) g = { .base = o };
	g.base.size = sizeof(g);
	ck_assert_int_eq(ckpt_connect(&g.base, &c), -ENOENT);
	g.newer = 1;
	ck_assert_int_eq(ckpt_connect(&g.base, &c), -E2BIG);
	ck_assert_ptr_eq(c, (void *)1);
	rmdir(dir);
}
END_TEST

START_TEST(test_tensor_and_save_opts_size)
{
	char dir[] = "/tmp/check-abi-XXXXXX", sock[64];
	struct fake_ckptd_opts fo = { .arena_max = 4 * MiB };
	struct fake_ckptd *fake;
	struct ckpt_client *c;
	struct ckpt_save *s = (void *)1;
	struct ckpt_future *st, *cm;
	float w[2] = { 1, 2 };
	uint64_t shape = 2;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/ckptd.sock", dir);
	fo.socket_path = sock;
	ck_assert_int_eq(fake_ckptd_start(&fo, &fake), 0);
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = sock, .job = "j",
				       .world = 1, .arena_bytes = 4 * MiB };
	ck_assert_int_eq(ckpt_connect(&o, &c), 0);

	/* Save options. */
	struct ckpt_save_opts so = { CKPT_SAVE_OPTS_INIT, .root = "/r", .name = "n", .step = 3 };
	ck_assert_uint_eq(so.size, sizeof(so));
	ck_assert_uint_eq(CKPT_SAVE_OPTS_SIZE_VER0, sizeof(so));
	struct ckpt_save_opts bad = so;
	bad.size = 0;
	ck_assert_int_eq(ckpt_save_begin_opts(c, &bad, &s), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_SAVE_OPTS_INIT"));
	bad = so;
	bad.flags = 1;
	ck_assert_int_eq(ckpt_save_begin_opts(c, &bad, &s), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "flags"));
	GROWN(struct ckpt_save_opts) gs = { .base = so, .newer = 5 };
	gs.base.size = sizeof(gs);
	ck_assert_int_eq(ckpt_save_begin_opts(c, &gs.base, &s), -E2BIG);
	ck_assert_ptr_eq(s, (void *)1);
	gs.newer = 0;
	ck_assert_int_eq(ckpt_save_begin_opts(c, &gs.base, &s), 0);

	/* Tensors. */
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32, .ndim = 1,
				 .shape = &shape, .data = w };
	ck_assert_uint_eq(t.size, sizeof(t));
	/* 0.3 appended cuda_stream; a 0.2 program's tensor still adds. */
	ck_assert_uint_eq(CKPT_TENSOR_SIZE_VER0 + 8, sizeof(t));
	struct ckpt_tensor t_old = t;
	t_old.size = CKPT_TENSOR_SIZE_VER0;
	t_old.name = "w_old";
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t_old), 0);
	GROWN(struct ckpt_tensor) gt = { .base = t };
	gt.base.size = sizeof(gt);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &gt.base), 0);
	/* The other initialisation: the macro alone, then assignments. */
	struct ckpt_tensor t2 = { CKPT_TENSOR_INIT };
	t2.name = "w2";
	t2.dtype = CKPT_F32;
	t2.ndim = 1;
	t2.shape = &shape;
	t2.data = w;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t2), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(ckpt_future_wait(cm, 30000), 0);
	ckpt_save_free(s);
	const struct fake_save *fs = fake_ckptd_save(fake, 0);
	ck_assert_uint_eq(fs->layout.n_items, 3);
	ck_assert_uint_eq(fs->layout.step, 3);

	/* A tensor of a newer header using a newer field, and one of an
	 * older program (no size): refused, and the save with them. */
	ck_assert_int_eq(ckpt_save_begin(c, "/r", "m", 4, &s), 0);
	gt.newer = 1;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &gt.base), -E2BIG);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "newer libckpt"));
	t.size = 0;
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_TENSOR_INIT"));
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -E2BIG);
	ckpt_save_free(s);

	/* Several tensors in one call (0.6): an array of the caller's
	 * struct, stepped by its size field, in order. */
	ck_assert_int_eq(ckpt_save_begin(c, "/r", "many", 5, &s), 0);
	uint64_t shapes[3] = { 4, 2, 1 };
	static const float mdata[4] = { 1, 2, 3, 4 }; /* the largest: 4 elements */
	struct ckpt_tensor many[3];
	static const char *const many_names[3] = { "a", "b", "c" };
	for (int i = 0; i < 3; i++)
		many[i] = (struct ckpt_tensor){ CKPT_TENSOR_INIT, .name = many_names[i],
						.dtype = CKPT_F32, .ndim = 1,
						.shape = &shapes[i], .data = mdata };
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 0), 0);
	ck_assert_int_eq(ckpt_save_add_tensors(s, NULL, 0), 0);
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 3), 0);
	GROWN(struct ckpt_tensor) gmany[2] = { { .base = many[0] }, { .base = many[1] } };
	gmany[0].base.name = "d";
	gmany[1].base.name = "e";
	gmany[0].base.size = gmany[1].base.size = sizeof(gmany[0]);
	ck_assert_int_eq(ckpt_save_add_tensors(s, &gmany[0].base, 2), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(ckpt_future_wait(cm, 30000), 0);
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 0), -EBUSY);
	ckpt_save_free(s);
	fs = fake_ckptd_save(fake, 1);
	ck_assert_uint_eq(fs->layout.n_items, 5);
	static const char *const want[5] = { "a", "b", "c", "d", "e" };
	for (int i = 0; i < 5; i++)
		ck_assert_str_eq(fs->layout.items[i].name, want[i]);
	ck_assert_uint_eq(layout_shape(&fs->layout, &fs->layout.items[1])[0], 2);

	/* The first bad tensor stops the call, is named by its index, and
	 * spoils the save; so does an element of another size. */
	ck_assert_int_eq(ckpt_save_begin(c, "/r", "bad", 6, &s), 0);
	many[1].dtype = (enum ckpt_dtype)99;
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 3), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "ckpt_save_add_tensors: tensor 1 of 3:"));
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "unknown dtype"));
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), -EINVAL);
	ckpt_save_free(s);
	ck_assert_int_eq(ckpt_save_begin(c, "/r", "bad2", 7, &s), 0);
	many[1].dtype = CKPT_F32;
	many[0].size = sizeof(many[0]) - 4; /* no array of the struct has that stride */
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 3), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "not a multiple"));
	many[0].size = sizeof(many[0]);
	many[2].size = CKPT_TENSOR_SIZE_VER0;
	ck_assert_int_eq(ckpt_save_add_tensors(s, many, 3), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "tensor 2 of 3 has size"));
	ck_assert_int_eq(ckpt_save_add_tensors(NULL, many, 3), -EINVAL);
	ck_assert_int_eq(ckpt_save_add_tensors(s, NULL, 1), -EINVAL);
	ckpt_save_free(s);

	ckpt_disconnect(c);
	fake_ckptd_stop(fake);
	rmdir(dir);
}
END_TEST

/* ---- versions and symbols ---- */

START_TEST(test_version)
{
	char want[32];

	snprintf(want, sizeof(want), "%d.%d.%d", CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
		 CKPT_VERSION_PATCH);
	ck_assert_str_eq(ckpt_version(), want);
	/* The build's version (Makefile VERSION) and the header agree. */
	ck_assert_str_eq(ckpt_version(), CKPT_VERSION);
}
END_TEST

/* Every public function is exported from libckpt.so under LIBCKPT_0.2. */
START_TEST(test_symbols)
{
	static const char *const names[] = {
		"ckpt_client_arena_bytes", "ckpt_connect", "ckpt_disconnect", "ckpt_dtype_name",
		"ckpt_dtype_size", "ckpt_future_error", "ckpt_future_poll", "ckpt_future_wait",
		"ckpt_last_error", "ckpt_reader_blob_count", "ckpt_reader_blob_name",
		"ckpt_reader_blob_size", "ckpt_reader_close", "ckpt_reader_open",
		"ckpt_reader_read_blob", "ckpt_reader_read_tensor", "ckpt_reader_step",
		"ckpt_reader_tensor_count", "ckpt_reader_tensor_info", "ckpt_reader_tensor_name",
		"ckpt_reader_world", "ckpt_save_add_blob", "ckpt_save_add_tensor",
		"ckpt_save_begin", "ckpt_save_begin_opts", "ckpt_save_commit", "ckpt_save_free",
		"ckpt_save_set_metadata", "ckpt_save_set_metric", "ckpt_set_log_fn",
		"ckpt_version",
	};
	const char *build = getenv("CKPT_BUILD_DIR");
	char path[4096];
	void *h;

	if (!build)
		build = "build";
	snprintf(path, sizeof(path), "%s/libckpt.so", build);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h != NULL, "dlopen %s: %s", path, dlerror());
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		ck_assert_msg(dlvsym(h, names[i], "LIBCKPT_0.2") != NULL, "%s@LIBCKPT_0.2: %s",
			      names[i], dlerror());
	}
	/* Added in 0.3, in its own node. */
	ck_assert_msg(dlvsym(h, "ckpt_save_set_cuda_stream", "LIBCKPT_0.3") != NULL,
		      "ckpt_save_set_cuda_stream@LIBCKPT_0.3: %s", dlerror());
	ck_assert_msg(dlvsym(h, "ckpt_save_durable", "LIBCKPT_0.4") != NULL,
		      "ckpt_save_durable@LIBCKPT_0.4: %s", dlerror());
	/* 0.5: loads into any layout, latest, the data-loader table. */
	static const char *const v05[] = {
		"ckpt_load_begin", "ckpt_load_add_tensor", "ckpt_load_add_blob",
		"ckpt_load_start", "ckpt_load_stats", "ckpt_load_free",
		"ckpt_reader_open_latest", "ckpt_dl_first", "ckpt_dl_restore",
		"ckpt_save_add_dl_table", "ckpt_load_set_client",
	};
	for (size_t i = 0; i < sizeof(v05) / sizeof(v05[0]); i++)
		ck_assert_msg(dlvsym(h, v05[i], "LIBCKPT_0.5") != NULL, "%s@LIBCKPT_0.5: %s",
			      v05[i], dlerror());
	/* 0.6: what a reader tells, the checkpoints of a root (for Python). */
	static const char *const v06[] = {
		"ckpt_list", "ckpt_reader_metadata", "ckpt_reader_metric",
		"ckpt_reader_path", "ckpt_reader_time", "ckpt_save_add_tensors",
	};
	for (size_t i = 0; i < sizeof(v06) / sizeof(v06[0]); i++)
		ck_assert_msg(dlvsym(h, v06[i], "LIBCKPT_0.6") != NULL, "%s@LIBCKPT_0.6: %s",
			      v06[i], dlerror());
	/* Internal functions stay hidden. */
	ck_assert_ptr_null(dlsym(h, "abi_copy_in"));
	ck_assert_ptr_null(dlsym(h, "cli_set_error"));
	const char *(*version)(void) = (const char *(*)(void))dlsym(h, "ckpt_version");
	ck_assert_ptr_nonnull(version);
	ck_assert_str_eq(version(), ckpt_version());
	dlclose(h);
}
END_TEST

static Suite *abi_suite(void)
{
	Suite *s = suite_create("abi");
	TCase *tc;

	tc = tcase_create("copy_in_rules");
	tcase_add_test(tc, test_copy_in_rules);
	suite_add_tcase(s, tc);
	tc = tcase_create("connect_opts_size");
	tcase_add_test(tc, test_connect_opts_size);
	suite_add_tcase(s, tc);
	tc = tcase_create("tensor_and_save_opts_size");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_tensor_and_save_opts_size);
	suite_add_tcase(s, tc);
	tc = tcase_create("version");
	tcase_add_test(tc, test_version);
	suite_add_tcase(s, tc);
	tc = tcase_create("symbols");
	tcase_add_test(tc, test_symbols);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(abi_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
