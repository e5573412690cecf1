/* SPDX-License-Identifier: MIT */
/* check_arena.c - slot sizes, rounding, the slot allocator, memfd arenas. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "format/layout.h"
#include "shm/arena.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* ---- slot sizes ---- */

static const struct {
	uint64_t bytes, slot;
} slot_cases[] = {
	{ 0, 1 * MiB },
	{ 1, 1 * MiB },
	{ 4 * MiB, 1 * MiB },
	{ 8 * MiB, 1 * MiB },
	{ 16 * MiB - 1, 1 * MiB },
	{ 16 * MiB, 2 * MiB },
	{ 32 * MiB, 4 * MiB },
	{ 63 * MiB, 4 * MiB },
	{ 64 * MiB, 8 * MiB },
	{ 1 * GiB, 8 * MiB },
	{ 64 * GiB, 8 * MiB },
};

START_TEST(test_slot_bytes)
{
	uint64_t s = arena_slot_bytes(slot_cases[_i].bytes);

	ck_assert_uint_eq(s, slot_cases[_i].slot);
	ck_assert_uint_eq(s % LAYOUT_CRC_BLOCK, 0);
	ck_assert_uint_eq(s & (s - 1), 0);
}
END_TEST

static const struct {
	uint64_t in, out;
} round_cases[] = {
	{ 0, 4 * MiB },
	{ 1, 4 * MiB },
	{ 4 * MiB, 4 * MiB },
	{ 4 * MiB + 1, 5 * MiB },
	{ 17 * MiB, 18 * MiB },
	{ 63 * MiB, 64 * MiB },
	{ 1 * GiB, 1 * GiB },
	{ 1 * GiB + 1, 1 * GiB + 8 * MiB },
};

START_TEST(test_round)
{
	uint64_t r = arena_round(round_cases[_i].in);

	ck_assert_uint_eq(r, round_cases[_i].out);
	ck_assert_uint_ge(r, ARENA_MIN_BYTES);
	ck_assert_uint_eq(r % arena_slot_bytes(r), 0);
}
END_TEST

/* Every rounded size is a whole number of its own slots. */
START_TEST(test_round_consistent)
{
	for (uint64_t b = 0; b < 300 * MiB; b += 3 * MiB + 12345) {
		uint64_t r = arena_round(b);
		ck_assert_uint_ge(r, b);
		ck_assert_uint_eq(r % arena_slot_bytes(r), 0);
		ck_assert_uint_eq(arena_round(r), r);
	}
}
END_TEST

/* ---- slot allocator ---- */

START_TEST(test_slots_take_put)
{
	struct arena_slots s;

	ck_assert_int_eq(arena_slots_init(&s, 8 * MiB, 1 * MiB), 0);
	ck_assert_uint_eq(s.n_slots, 8);
	ck_assert_uint_eq(s.n_free, 8);
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(arena_slots_take(&s, 1), i);
	ck_assert_int_eq(arena_slots_take(&s, 1), -ENOSPC);
	ck_assert_uint_eq(s.n_free, 0);
	ck_assert_int_eq(arena_slots_put(&s, 5, 1), 0);
	ck_assert_int_eq(arena_slots_take(&s, 1), 5);
	ck_assert_int_eq(arena_slots_put(&s, 0, 8), 0);
	ck_assert_uint_eq(s.n_free, 8);
	arena_slots_free(&s);
	arena_slots_free(&s); /* idempotent */
}
END_TEST

START_TEST(test_slots_runs)
{
	struct arena_slots s;

	ck_assert_int_eq(arena_slots_init(&s, 10 * MiB, 1 * MiB), 0);
	ck_assert_int_eq(arena_slots_take(&s, 3), 0);  /* 0..2 */
	ck_assert_int_eq(arena_slots_take(&s, 1), 3);
	ck_assert_int_eq(arena_slots_take(&s, 4), 4);  /* 4..7 */
	ck_assert_int_eq(arena_slots_take(&s, 3), -ENOSPC); /* only 8, 9 left */
	ck_assert_int_eq(arena_slots_put(&s, 1, 1), 0);
	ck_assert_int_eq(arena_slots_take(&s, 2), 8);  /* 1 alone is too short */
	ck_assert_int_eq(arena_slots_put(&s, 4, 4), 0);
	ck_assert_int_eq(arena_slots_take(&s, 4), 4);
	ck_assert_int_eq(arena_slots_take(&s, 0), -ENOSPC);
	ck_assert_int_eq(arena_slots_take(&s, 11), -ENOSPC);
	arena_slots_free(&s);
}
END_TEST

/* Many slots: runs across 64-bit word boundaries. */
START_TEST(test_slots_words)
{
	struct arena_slots s;

	ck_assert_int_eq(arena_slots_init(&s, 200 * MiB, 1 * MiB), 0);
	ck_assert_uint_eq(s.n_slots, 200);
	ck_assert_int_eq(arena_slots_take(&s, 60), 0);
	ck_assert_int_eq(arena_slots_take(&s, 10), 60); /* crosses bit 64 */
	for (int i = 70; i < 200; i++)
		ck_assert_int_eq(arena_slots_take(&s, 1), i);
	ck_assert_int_eq(arena_slots_take(&s, 1), -ENOSPC);
	ck_assert_int_eq(arena_slots_put(&s, 130, 1), 0);
	ck_assert_int_eq(arena_slots_take(&s, 1), 130);
	arena_slots_free(&s);
}
END_TEST

START_TEST(test_slots_bad_put)
{
	struct arena_slots s;

	ck_assert_int_eq(arena_slots_init(&s, 4 * MiB, 1 * MiB), 0);
	ck_assert_int_eq(arena_slots_put(&s, 0, 1), -EINVAL); /* already free */
	ck_assert_int_eq(arena_slots_take(&s, 2), 0);
	ck_assert_int_eq(arena_slots_put(&s, 0, 1), 0);
	ck_assert_int_eq(arena_slots_put(&s, 0, 1), -EINVAL); /* double put */
	/* a range with one free slot in it changes nothing */
	ck_assert_int_eq(arena_slots_put(&s, 0, 2), -EINVAL);
	ck_assert_uint_eq(s.n_free, 3);
	ck_assert_int_eq(arena_slots_put(&s, 4, 1), -EINVAL); /* out of range */
	ck_assert_int_eq(arena_slots_put(&s, 3, 2), -EINVAL);
	ck_assert_int_eq(arena_slots_put(&s, UINT32_MAX, 2), -EINVAL);
	ck_assert_int_eq(arena_slots_put(&s, 1, 0), -EINVAL);
	ck_assert_int_eq(arena_slots_put(&s, 1, 1), 0);
	ck_assert_uint_eq(s.n_free, 4);
	arena_slots_free(&s);
}
END_TEST

START_TEST(test_slots_init_bad)
{
	struct arena_slots s;

	ck_assert_int_eq(arena_slots_init(&s, 5 * MiB + 1, 1 * MiB), -EINVAL);
	ck_assert_int_eq(arena_slots_init(&s, 1 * MiB, 0), -EINVAL);
	ck_assert_int_eq(arena_slots_init(&s, 0, 1 * MiB), -EINVAL);
}
END_TEST

/* ---- memfd arenas ---- */

START_TEST(test_create_map)
{
	uint64_t bytes = arena_round(8 * MiB);
	void *a = NULL, *b = NULL;
	int fd = arena_create("check-arena", bytes, &a);

	ck_assert_int_ge(fd, 0);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	int seals = fcntl(fd, F_GET_SEALS);
	ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	ck_assert_int_lt(ftruncate(fd, 4096), 0); /* sealed */

	ck_assert_int_eq(arena_map(fd, bytes, &b), 0);
	ck_assert_ptr_ne(a, b);
	/* Both mappings see the same pages. */
	memset(a, 0x5a, 4096);
	((char *)a)[bytes - 1] = 7;
	ck_assert_int_eq(((unsigned char *)b)[100], 0x5a);
	ck_assert_int_eq(((char *)b)[bytes - 1], 7);
	((char *)b)[12345] = 9;
	ck_assert_int_eq(((char *)a)[12345], 9);

	munmap(b, bytes);
	munmap(a, bytes);
	close(fd);
}
END_TEST

START_TEST(test_map_wrong_size)
{
	uint64_t bytes = 4 * MiB;
	void *a = NULL, *b = (void *)1;
	int fd = arena_create("check-arena", bytes, &a);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(arena_map(fd, bytes * 2, &b), -EBADMSG);
	ck_assert_int_eq(arena_map(fd, bytes - 4096, &b), -EBADMSG);
	ck_assert_ptr_eq(b, (void *)1); /* untouched on failure */
	ck_assert_int_eq(arena_map(-1, bytes, &b), -EINVAL);
	munmap(a, bytes);
	close(fd);

	/* Not a memfd at all: a pipe. */
	int p[2];
	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(arena_map(p[0], bytes, &b), -EBADMSG);
	close(p[0]);
	close(p[1]);
}
END_TEST

static Suite *arena_suite(void)
{
	Suite *s = suite_create("arena");
	TCase *tc;

	tc = tcase_create("slot_bytes");
	tcase_add_loop_test(tc, test_slot_bytes, 0, sizeof(slot_cases) / sizeof(slot_cases[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("round");
	tcase_add_loop_test(tc, test_round, 0, sizeof(round_cases) / sizeof(round_cases[0]));
	tcase_add_test(tc, test_round_consistent);
	suite_add_tcase(s, tc);
	tc = tcase_create("slots_take_put");
	tcase_add_test(tc, test_slots_take_put);
	tcase_add_test(tc, test_slots_words);
	suite_add_tcase(s, tc);
	tc = tcase_create("slots_runs");
	tcase_add_test(tc, test_slots_runs);
	suite_add_tcase(s, tc);
	tc = tcase_create("slots_bad_put");
	tcase_add_test(tc, test_slots_bad_put);
	tcase_add_test(tc, test_slots_init_bad);
	suite_add_tcase(s, tc);
	tc = tcase_create("memfd");
	tcase_add_test(tc, test_create_map);
	tcase_add_test(tc, test_map_wrong_size);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(arena_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
