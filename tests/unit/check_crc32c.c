/* SPDX-License-Identifier: MIT */
/* check_crc32c.c - CRC32C known values, chaining, and lengths past INT_MAX. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "format/crc32c.h"

/* Bitwise reference (reflected polynomial 0x82F63B78). */
static uint32_t crc_ref(const void *buf, size_t len, uint32_t prev)
{
	const unsigned char *p = buf;
	uint32_t c = ~prev;

	while (len--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
	}
	return ~c;
}

START_TEST(test_known_values)
{
	unsigned char buf[32];

	ck_assert_uint_eq(crc32c("123456789", 9, 0), 0xE3069283u);
	ck_assert_uint_eq(crc32c("", 0, 0), 0);
	ck_assert_uint_eq(crc32c(NULL, 0, 0x12345678u), 0x12345678u);
	ck_assert_uint_eq(crc32c("a", 1, 0), 0xC1D04330u);
	/* RFC 3720 (iSCSI) appendix B.4 vectors. */
	memset(buf, 0, sizeof(buf));
	ck_assert_uint_eq(crc32c(buf, 32, 0), 0x8A9136AAu);
	memset(buf, 0xff, sizeof(buf));
	ck_assert_uint_eq(crc32c(buf, 32, 0), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)i;
	ck_assert_uint_eq(crc32c(buf, 32, 0), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)(31 - i);
	ck_assert_uint_eq(crc32c(buf, 32, 0), 0x113FDB5Cu);
}
END_TEST

START_TEST(test_matches_reference)
{
	enum { N = 10000 };
	unsigned char *buf = malloc(N);

	ck_assert_ptr_nonnull(buf);
	srand(7);
	for (int i = 0; i < N; i++)
		buf[i] = (unsigned char)rand();
	/* Every length up to 300 (all alignments of the tails), then some
	 * longer ones. */
	for (size_t len = 0; len <= 300; len++)
		ck_assert_uint_eq(crc32c(buf + 1, len, 0), crc_ref(buf + 1, len, 0));
	for (size_t len = 1000; len <= N; len += 1111)
		ck_assert_uint_eq(crc32c(buf, len, 0), crc_ref(buf, len, 0));
	free(buf);
}
END_TEST

START_TEST(test_chaining)
{
	enum { N = 4096 };
	unsigned char *buf = malloc(N);
	uint32_t whole;

	ck_assert_ptr_nonnull(buf);
	for (int i = 0; i < N; i++)
		buf[i] = (unsigned char)(i * 131 + 7);
	whole = crc32c(buf, N, 0);
	for (size_t cut = 0; cut <= N; cut += 97) {
		uint32_t a = crc32c(buf, cut, 0);

		ck_assert_uint_eq(crc32c(buf + cut, N - cut, a), whole);
	}
	/* Three pieces, one of them empty. */
	ck_assert_uint_eq(crc32c(buf + 100, N - 100, crc32c(buf + 100, 0, crc32c(buf, 100, 0))),
			  whole);
	free(buf);
}
END_TEST

/* crc32c_combine against the CRC of the joined bytes, at every cut of a
 * buffer, for empty pieces, and for a B longer than 4 GiB (zeros: its CRC
 * by chaining the zero page). */
START_TEST(test_combine)
{
	enum { N = 3000 };
	unsigned char *buf = malloc(N);
	uint32_t whole;

	ck_assert_ptr_nonnull(buf);
	srand(7);
	for (int i = 0; i < N; i++)
		buf[i] = (unsigned char)rand();
	whole = crc32c(buf, N, 0);
	for (size_t cut = 0; cut <= N; cut++) {
		uint32_t a = crc32c(buf, cut, 0), b = crc32c(buf + cut, N - cut, 0);

		ck_assert_uint_eq(crc32c_combine(a, b, N - cut), whole);
	}
	/* Three pieces folded left to right. */
	ck_assert_uint_eq(crc32c_combine(crc32c_combine(crc32c(buf, 10, 0), crc32c(buf + 10, 1000, 0),
							1000),
					 crc32c(buf + 1010, N - 1010, 0), N - 1010),
			  whole);
	/* An empty B leaves A's CRC. */
	ck_assert_uint_eq(crc32c_combine(whole, 0, 0), whole);
	free(buf);

	/* B = 4 GiB + 3 zero bytes: 1 MiB of zeros chained. */
	unsigned char *z = calloc(1, 1 << 20);
	uint64_t blen = ((uint64_t)4 << 30) + 3;
	uint32_t head = crc32c("head", 4, 0), chained = head, zb = 0;

	ck_assert_ptr_nonnull(z);
	for (uint64_t done = 0; done < blen;) {
		size_t n = blen - done < (1u << 20) ? (size_t)(blen - done) : (1u << 20);

		chained = crc32c(z, n, chained);
		zb = crc32c(z, n, zb);
		done += n;
	}
	ck_assert_uint_eq(crc32c_combine(head, zb, blen), chained);
	free(z);
}
END_TEST

/*
 * More than INT_MAX bytes in one call.  The buffer is an untouched private
 * anonymous mapping: every page reads as the shared zero page, so this needs
 * no memory.  The one-call result must equal the chained result of pieces
 * each small enough for ISA-L's int length.
 */
START_TEST(test_over_2gib)
{
	const size_t len = ((size_t)5 << 29) + 12345; /* 2.5 GiB + a tail */
	const size_t piece = (size_t)256 << 20;
	unsigned char *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
				-1, 0);
	uint32_t chained = 0;

	if (p == MAP_FAILED) {
		printf("SKIP: [test_over_2gib] cannot map 2.5 GiB of address space\n");
		fflush(stdout);
		return;
	}
	for (size_t off = 0; off < len; off += piece)
		chained = crc32c(p + off, len - off < piece ? len - off : piece, chained);
	ck_assert_uint_eq(crc32c(p, len, 0), chained);
	/* And the zero-run CRC differs from a shorter run's. */
	ck_assert_uint_ne(crc32c(p, len, 0), crc32c(p, len - 1, 0));
	munmap(p, len);
}
END_TEST

static Suite *crc32c_suite(void)
{
	Suite *s = suite_create("crc32c");
	TCase *tc;

	tc = tcase_create("known_values");
	tcase_add_test(tc, test_known_values);
	suite_add_tcase(s, tc);
	tc = tcase_create("reference");
	tcase_add_test(tc, test_matches_reference);
	suite_add_tcase(s, tc);
	tc = tcase_create("chaining");
	tcase_add_test(tc, test_chaining);
	suite_add_tcase(s, tc);
	tc = tcase_create("combine");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_combine);
	suite_add_tcase(s, tc);
	tc = tcase_create("large");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_over_2gib);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(crc32c_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
