/* SPDX-License-Identifier: MIT */
/* check_log.c - daemon logging: "<N>" prefix, one line per event, level filter. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"

/* stderr goes to a pipe for the test (each test runs in its own process). */
static int pipe_rd = -1;

static void capture_setup(void)
{
	int p[2];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
	close(p[1]);
	ck_assert_int_eq(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
	pipe_rd = p[0];
}

static void capture_teardown(void)
{
	close(pipe_rd);
	pipe_rd = -1;
}

/* Everything logged so far, NUL-terminated, into buf. */
static size_t captured(char *buf, size_t len)
{
	ssize_t n = read(pipe_rd, buf, len - 1);

	if (n < 0) {
		ck_assert_int_eq(errno, EAGAIN);
		n = 0;
	}
	buf[n] = '\0';
	return (size_t)n;
}

START_TEST(test_prefix)
{
	char buf[8192];

	log_err("cannot open '%s': %s", "/data/x", "No such file or directory");
	log_warn("w %d", 1);
	log_info("i");
	captured(buf, sizeof(buf));
	ck_assert_str_eq(buf, "<3>cannot open '/data/x': No such file or directory\n"
			      "<4>w 1\n"
			      "<6>i\n");
}
END_TEST

START_TEST(test_level)
{
	char buf[8192];

	log_debug("hidden by default");
	captured(buf, sizeof(buf));
	ck_assert_str_eq(buf, "");

	log_set_level(LOG_DEBUG);
	log_debug("d");
	captured(buf, sizeof(buf));
	ck_assert_str_eq(buf, "<7>d\n");

	log_set_level(LOG_WARNING);
	log_info("dropped");
	log_warn("kept");
	log_msg(LOG_CRIT, "crit");
	captured(buf, sizeof(buf));
	ck_assert_str_eq(buf, "<4>kept\n<2>crit\n");
}
END_TEST

START_TEST(test_one_line)
{
	char buf[8192];

	/* Embedded newlines would split one event over journal entries. */
	log_info("a\nb\r\nc");
	captured(buf, sizeof(buf));
	ck_assert_str_eq(buf, "<6>a b  c\n");
}
END_TEST

START_TEST(test_long_line)
{
	char buf[16384];
	char *big = malloc(10000);
	size_t n;

	ck_assert_ptr_nonnull(big);
	memset(big, 'x', 9999);
	big[9999] = '\0';
	log_err("%s", big);
	free(big);
	n = captured(buf, sizeof(buf));
	/* Cut to one line of at most 4096 bytes, marked as cut. */
	ck_assert_uint_le(n, 4096);
	ck_assert_uint_gt(n, 4000);
	ck_assert_int_eq(strncmp(buf, "<3>xxx", 6), 0);
	ck_assert_int_eq(strcmp(buf + n - 4, "...\n"), 0);
	ck_assert_ptr_eq(strchr(buf, '\n'), buf + n - 1);
}
END_TEST

START_TEST(test_errno_kept)
{
	char buf[256];

	errno = EXDEV;
	log_info("x");
	ck_assert_int_eq(errno, EXDEV);
	captured(buf, sizeof(buf));
}
END_TEST

static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc;

	tc = tcase_create("prefix");
	tcase_add_checked_fixture(tc, capture_setup, capture_teardown);
	tcase_add_test(tc, test_prefix);
	suite_add_tcase(s, tc);

	tc = tcase_create("level");
	tcase_add_checked_fixture(tc, capture_setup, capture_teardown);
	tcase_add_test(tc, test_level);
	suite_add_tcase(s, tc);

	tc = tcase_create("one_line");
	tcase_add_checked_fixture(tc, capture_setup, capture_teardown);
	tcase_add_test(tc, test_one_line);
	tcase_add_test(tc, test_long_line);
	suite_add_tcase(s, tc);

	tc = tcase_create("errno");
	tcase_add_checked_fixture(tc, capture_setup, capture_teardown);
	tcase_add_test(tc, test_errno_kept);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(log_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
