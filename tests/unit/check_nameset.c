/* SPDX-License-Identifier: MIT */
/*
 * check_nameset.c - the name map used to find duplicate and matching names
 * among many items: first put adds, a second put of an equal name (any
 * buffer) returns the first value and changes nothing, names that differ
 * in any byte are distinct, the table is sized for its load, and the cap.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/nameset.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

START_TEST(test_put_get)
{
	struct nameset s;
	char copy[16];

	ck_assert_int_eq(nameset_init(&s, 8), 0);
	ck_assert_int_eq(nameset_put(&s, "alpha", 3), -1);
	ck_assert_uint_eq(s.count, 1);
	/* Present: the first value, whatever value is offered now. */
	ck_assert_int_eq(nameset_put(&s, "alpha", 9), 3);
	ck_assert_int_eq(nameset_put(&s, "alpha", 3), 3);
	ck_assert_uint_eq(s.count, 1);
	/* Equal content in another buffer is the same name. */
	snprintf(copy, sizeof(copy), "%s", "alpha");
	ck_assert_int_eq(nameset_put(&s, copy, 0), 3);
	/* The largest value round-trips. */
	ck_assert_int_eq(nameset_put(&s, "max", UINT32_MAX), -1);
	ck_assert_int_eq(nameset_put(&s, "max", 0), (int64_t)UINT32_MAX);
	ck_assert_int_eq(nameset_put(&s, "zero", 0), -1);
	ck_assert_int_eq(nameset_put(&s, "zero", 1), 0);
	ck_assert_uint_eq(s.count, 3);
	nameset_free(&s);
}
END_TEST

/* Pairs of names that must be told apart. */
static const struct {
	const char *a, *b;
} distinct[] = {
	{ "", "a" },
	{ "a", "ab" },
	{ "ab", "ba" },
	{ "layer.0.weight", "layer.0.weigh" },
	{ "layer.0.weight", "layer.1.weight" },
	{ "x", "X" },
	{ "a\x80", "a\x81" },
	{ "model.layers.10.mlp", "model.layers.1.0mlp" },
};

START_TEST(test_distinct)
{
	struct nameset s;

	ck_assert_int_eq(nameset_init(&s, 2), 0);
	ck_assert_int_eq(nameset_put(&s, distinct[_i].a, 1), -1);
	ck_assert_int_eq(nameset_put(&s, distinct[_i].b, 2), -1);
	ck_assert_int_eq(nameset_put(&s, distinct[_i].a, 7), 1);
	ck_assert_int_eq(nameset_put(&s, distinct[_i].b, 7), 2);
	ck_assert_uint_eq(s.count, 2);
	nameset_free(&s);
}
END_TEST

/* Many names, filled to the declared maximum: every one found again with
 * its own value, none confused with another. */
static const size_t sizes[] = { 1, 2, 15, 16, 17, 1000, 100000 };

START_TEST(test_many)
{
	const size_t n = sizes[_i];
	struct nameset s;
	char (*names)[40] = malloc(n * sizeof(*names));
	char probe[40];

	ck_assert_ptr_nonnull(names);
	ck_assert_int_eq(nameset_init(&s, n), 0);
	/* At most half full, a power of two. */
	ck_assert_uint_ge(s.mask + 1, 2 * n);
	ck_assert_uint_eq((s.mask + 1) & s.mask, 0);
	for (size_t i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "tensor.%zu.weight", i);
		ck_assert_int_eq(nameset_put(&s, names[i], (uint32_t)i), -1);
	}
	ck_assert_uint_eq(s.count, n);
	for (size_t i = 0; i < n; i++) {
		snprintf(probe, sizeof(probe), "tensor.%zu.weight", i);
		ck_assert_int_eq(nameset_put(&s, probe, UINT32_MAX), (int64_t)i);
	}
	ck_assert_uint_eq(s.count, n);
	nameset_free(&s);
	free(names);
}
END_TEST

/* More names than declared: refused (-1, not added), the set unchanged;
 * the names already in are still found. */
START_TEST(test_over_max)
{
	static const char *const names[] = { "a", "b", "c", "d" };
	struct nameset s;

	ck_assert_int_eq(nameset_init(&s, 3), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(nameset_put(&s, names[i], (uint32_t)i), -1);
	ck_assert_int_eq(nameset_put(&s, names[3], 3), -1);
	ck_assert_uint_eq(s.count, 3);
	ck_assert_int_eq(nameset_put(&s, names[3], 3), -1); /* still absent */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(nameset_put(&s, names[i], 9), i);
	nameset_free(&s);

	/* A set for no names holds none. */
	ck_assert_int_eq(nameset_init(&s, 0), 0);
	ck_assert_int_eq(nameset_put(&s, "a", 1), -1);
	ck_assert_int_eq(nameset_put(&s, "a", 1), -1);
	ck_assert_uint_eq(s.count, 0);
	nameset_free(&s);
}
END_TEST

START_TEST(test_free)
{
	struct nameset s;

	memset(&s, 0, sizeof(s));
	nameset_free(&s);
	nameset_free(NULL);
	ck_assert_int_eq(nameset_init(&s, 4), 0);
	nameset_put(&s, "x", 1);
	nameset_free(&s);
	ck_assert_ptr_null(s.slots);
	ck_assert_uint_eq(s.count, 0);
	nameset_free(&s);
}
END_TEST

/* A zeroed set grows by reserve and keeps every entry through each rehash;
 * get never adds. */
START_TEST(test_reserve_get)
{
	static char names[3000][16];
	struct nameset s = { 0 };

	ck_assert_int_eq(nameset_get(&s, "absent"), -1);
	for (uint32_t i = 0; i < 3000; i++) {
		snprintf(names[i], sizeof(names[i]), "n%u", i);
		if (i + 1 > s.max)
			ck_assert_int_eq(nameset_reserve(&s, 2 * (i + 1)), 0);
		ck_assert_int_eq(nameset_get(&s, names[i]), -1);
		ck_assert_int_eq(nameset_put(&s, names[i], i), -1);
	}
	ck_assert_uint_eq(s.count, 3000);
	for (uint32_t i = 0; i < 3000; i++)
		ck_assert_int_eq(nameset_get(&s, names[i]), (int64_t)i);
	ck_assert_int_eq(nameset_get(&s, "n3000"), -1);
	ck_assert_uint_eq(s.count, 3000);
	/* A smaller reserve changes nothing. */
	ck_assert_int_eq(nameset_reserve(&s, 10), 0);
	ck_assert_int_eq(nameset_get(&s, "n17"), 17);
	nameset_free(&s);
}
END_TEST

static Suite *nameset_suite(void)
{
	Suite *s = suite_create("nameset");
	TCase *tc;

	tc = tcase_create("put");
	tcase_add_test(tc, test_put_get);
	tcase_add_loop_test(tc, test_distinct, 0, N(distinct));
	tcase_add_loop_test(tc, test_many, 0, N(sizes));
	tcase_add_test(tc, test_over_max);
	tcase_add_test(tc, test_free);
	tcase_add_test(tc, test_reserve_get);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(nameset_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
