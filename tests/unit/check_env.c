/* SPDX-License-Identifier: MIT */
/*
 * check_env.c - what libckpt reads from its process (client/env.c): the
 * default number of copy threads, the umask from /proc/self/status, and the
 * run id from the options or the launcher's environment.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/internal.h"

/* ---- copy threads ---- */

static const struct {
	unsigned cpus;
	const char *lws;
	unsigned want;
	const char *why; /* a part of the explanation */
} threads_cases[] = {
	{ 2, NULL, 2, "2 usable CPUs / 1 local rank = 2" },
	{ 2, "1", 2, "/ 1 local rank" },
	{ 2, "8", 1, "2 usable CPUs / 8 local ranks = 1" },
	{ 16, "4", 4, "= 4" },
	{ 17, "4", 4, "= 4" },
	{ 1, NULL, 1, "= 1" },
	{ 0, NULL, 1, "= 1" },
	{ 256, NULL, 64, "(the cap)" },
	{ 256, "2", 64, "(the cap)" },
	{ 256, "4", 64, "= 64" },
	{ 8, "", 8, "ignored" },
	{ 8, "abc", 8, "ignored" },
	{ 8, "0", 8, "ignored" },
	{ 8, "-2", 8, "ignored" },
	{ 8, " 2", 8, "ignored" },
	{ 8, "+2", 8, "ignored" },
	{ 8, "2x", 8, "ignored" },
	{ 8, "65537", 8, "ignored" },
	{ 8, "99999999999999999999999", 8, "ignored" },
	{ 8, "65536", 1, "65536 local ranks" },
};

START_TEST(test_copy_threads_default)
{
	char why[160];
	unsigned n = env_copy_threads_default(threads_cases[_i].cpus, threads_cases[_i].lws, why,
					      sizeof(why));

	ck_assert_msg(n == threads_cases[_i].want, "%u CPUs, LOCAL_WORLD_SIZE %s: %u threads, "
		      "want %u", threads_cases[_i].cpus,
		      threads_cases[_i].lws ? threads_cases[_i].lws : "unset", n,
		      threads_cases[_i].want);
	ck_assert_msg(strstr(why, threads_cases[_i].why), "why: '%s', want '%s' in it", why,
		      threads_cases[_i].why);
}
END_TEST

START_TEST(test_cpu_count)
{
	cpu_set_t set;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	ck_assert_uint_eq(env_cpu_count(), (unsigned)CPU_COUNT(&set));
	/* Pinned to one CPU, the process may use one. */
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (!CPU_ISSET(cpu, &set))
			continue;
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
		ck_assert_uint_eq(env_cpu_count(), 1);
		ck_assert_int_eq(sched_setaffinity(0, sizeof(set), &set), 0);
		break;
	}
}
END_TEST

/* ---- umask ---- */

static const struct {
	const char *text;
	int ret;
	unsigned mask;
} umask_cases[] = {
	{ "Name:\tx\nUmask:\t0022\nState:\tR\n", 0, 022 },
	{ "Umask:\t0777\n", 0, 0777 },
	{ "Umask:\t0000", 0, 0 },
	{ "Name:\tUmask: 0077\nUmask:  027\n", 0, 027 },
	{ "Name:\tx\nState:\tR\n", -ENOENT, 0 },
	{ "", -ENOENT, 0 },
	{ "Umask:\t\n", -EBADMSG, 0 },
	{ "Umask:\t0028\n", -EBADMSG, 0 },
	{ "Umask:\t01000\n", -EBADMSG, 0 },
	{ "Umask:\t000022\n", -EBADMSG, 0 },
	{ "Umask:\t0022x\n", -EBADMSG, 0 },
};

START_TEST(test_parse_umask)
{
	unsigned m = 12345;
	int r = env_parse_umask(umask_cases[_i].text, &m);

	ck_assert_int_eq(r, umask_cases[_i].ret);
	if (r == 0)
		ck_assert_uint_eq(m, umask_cases[_i].mask);
	else
		ck_assert_uint_eq(m, 12345);
}
END_TEST

/* The process's umask is read, and left as it was. */
START_TEST(test_umask)
{
	unsigned m = 0;

	umask(0027);
	ck_assert_int_eq(env_umask(&m), 0);
	ck_assert_uint_eq(m, 0027);
	ck_assert_uint_eq(umask(0077), 0027);
	ck_assert_int_eq(env_umask(&m), 0);
	ck_assert_uint_eq(m, 0077);
	ck_assert_uint_eq(umask(0022), 0077);
}
END_TEST

/* ---- run id ---- */

/* The environment a case sees: "NAME=value" entries. */
static const char *const *fake_env;

static char *fake_getenv(const char *name)
{
	size_t n = strlen(name);

	for (const char *const *e = fake_env; e && *e; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return (char *)*e + n + 1;
	return NULL;
}

#define ENV(...) ((const char *const[]){ __VA_ARGS__, NULL })
/* 130 characters: more than CKPT_MAX_RUN_LEN. */
#define LONG130                                                                           \
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"                   \
	"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static const struct {
	const char *opt;
	const char *const *env;
	int ret;
	const char *run;    /* NULL: only check the length and charset */
	const char *source;
} run_cases[] = {
	{ "r-1.x_y", NULL, 0, "r-1.x_y", "options" },
	{ "", ENV("CKPT_RUN_ID=env"), 0, "", "options" },
	{ "a b", NULL, -EINVAL, NULL, NULL },
	{ "a/b", NULL, -EINVAL, NULL, NULL },
	{ LONG130, NULL, -EINVAL, NULL, NULL },
	{ NULL, NULL, 0, "", "none" },
	{ NULL, ENV("CKPT_RUN_ID=run-7"), 0, "run-7", "CKPT_RUN_ID" },
	{ NULL, ENV("CKPT_RUN_ID=my run/2", "SLURM_JOB_ID=5"), 0, "my_run_2", "CKPT_RUN_ID" },
	{ NULL, ENV("CKPT_RUN_ID=", "SLURM_JOB_ID=5"), 0, "5.0",
	  "SLURM_JOB_ID.SLURM_RESTART_COUNT" },
	{ NULL,
	  ENV("TORCHELASTIC_RUN_ID=abc", "TORCHELASTIC_RESTART_COUNT=3", "SLURM_JOB_ID=5"), 0,
	  "abc-3", "TORCHELASTIC_RUN_ID-TORCHELASTIC_RESTART_COUNT" },
	{ NULL, ENV("TORCHELASTIC_RUN_ID=none"), 0, "none-0",
	  "TORCHELASTIC_RUN_ID-TORCHELASTIC_RESTART_COUNT" },
	{ NULL, ENV("SLURM_JOB_ID=12345", "SLURM_RESTART_COUNT=2"), 0, "12345.2",
	  "SLURM_JOB_ID.SLURM_RESTART_COUNT" },
	{ NULL, ENV("SLURM_RESTART_COUNT=2"), 0, "", "none" },
	{ NULL, ENV("CKPT_RUN_ID=" LONG130), 0, NULL, "CKPT_RUN_ID" },
	{ NULL, ENV("CKPT_RUN_ID=\xc3\xa9t\xc3\xa9"), 0, "__t__", "CKPT_RUN_ID" },
};

START_TEST(test_run_id)
{
	char run[CKPT_MAX_RUN_LEN + 1] = "untouched";
	const char *source = NULL;
	char err[256] = "";
	int r;

	fake_env = run_cases[_i].env;
	r = env_run_id(run_cases[_i].opt, fake_getenv, run, &source, err, sizeof(err));
	ck_assert_int_eq(r, run_cases[_i].ret);
	if (r < 0) {
		ck_assert_str_eq(run, "untouched");
		ck_assert_ptr_nonnull(strstr(err, "run id"));
		return;
	}
	ck_assert_str_eq(source, run_cases[_i].source);
	if (run_cases[_i].run)
		ck_assert_str_eq(run, run_cases[_i].run);
	ck_assert_uint_le(strlen(run), CKPT_MAX_RUN_LEN);
	for (const char *p = run; *p; p++)
		ck_assert_msg(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				     "0123456789._-", *p), "run id '%s' has '%c'", run, *p);
}
END_TEST

/* Too long an id is cut, and ends in a hash of the whole value: two ids
 * that differ only past the cut stay different. */
START_TEST(test_run_id_long)
{
	char a[CKPT_MAX_RUN_LEN + 1], b[CKPT_MAX_RUN_LEN + 1];
	const char *source;
	char err[64];

	fake_env = ENV("CKPT_RUN_ID=" LONG130 "x");
	ck_assert_int_eq(env_run_id(NULL, fake_getenv, a, &source, err, sizeof(err)), 0);
	fake_env = ENV("CKPT_RUN_ID=" LONG130 "y");
	ck_assert_int_eq(env_run_id(NULL, fake_getenv, b, &source, err, sizeof(err)), 0);
	ck_assert_uint_eq(strlen(a), CKPT_MAX_RUN_LEN);
	ck_assert_uint_eq(strlen(b), CKPT_MAX_RUN_LEN);
	ck_assert_str_ne(a, b);
	ck_assert_uint_eq(strlen(LONG130), 130);
	ck_assert_int_eq(memcmp(a, LONG130, CKPT_MAX_RUN_LEN - 9), 0);
	ck_assert_int_eq(a[CKPT_MAX_RUN_LEN - 9], '-');
	/* The same value gives the same id on every rank. */
	fake_env = ENV("CKPT_RUN_ID=" LONG130 "x");
	ck_assert_int_eq(env_run_id(NULL, fake_getenv, b, &source, err, sizeof(err)), 0);
	ck_assert_str_eq(a, b);
}
END_TEST

/* ---- copy threads' nice value ---- */

START_TEST(test_copy_nice)
{
	ck_assert_int_eq(env_copy_nice(NULL), CLI_COPY_NICE_DEFAULT);
	ck_assert_int_eq(env_copy_nice(""), CLI_COPY_NICE_DEFAULT);
	ck_assert_int_eq(env_copy_nice("0"), 0);
	ck_assert_int_eq(env_copy_nice("7"), 7);
	ck_assert_int_eq(env_copy_nice("19"), 19);
	static const char *const bad[] = { "20", "-1", "+3", " 3", "3 ", "x", "1e3",
					   "99999999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(env_copy_nice(bad[i]) == CLI_COPY_NICE_DEFAULT, "'%s'", bad[i]);
}
END_TEST

static Suite *env_suite(void)
{
	Suite *s = suite_create("env");
	TCase *tc;

	tc = tcase_create("copy_threads_default");
	tcase_add_loop_test(tc, test_copy_threads_default, 0,
			    sizeof(threads_cases) / sizeof(threads_cases[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("copy_nice");
	tcase_add_test(tc, test_copy_nice);
	suite_add_tcase(s, tc);
	tc = tcase_create("cpu_count");
	tcase_add_test(tc, test_cpu_count);
	suite_add_tcase(s, tc);
	tc = tcase_create("parse_umask");
	tcase_add_loop_test(tc, test_parse_umask, 0, sizeof(umask_cases) / sizeof(umask_cases[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("umask");
	tcase_add_test(tc, test_umask);
	suite_add_tcase(s, tc);
	tc = tcase_create("run_id");
	tcase_add_loop_test(tc, test_run_id, 0, sizeof(run_cases) / sizeof(run_cases[0]));
	tcase_add_test(tc, test_run_id_long);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(env_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
