/* SPDX-License-Identifier: MIT */
/* check_names.c - validation of checkpoint, job, item and root names. */
#include <check.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "format/names.h"

static char long_name[CKPT_MAX_NAME_LEN + 2];  /* 129 chars: too long */
static char max_name[CKPT_MAX_NAME_LEN + 1];   /* 128 chars: fits */
static char long_item[CKPT_MAX_ITEM_NAME + 2];
static char max_item[CKPT_MAX_ITEM_NAME + 1];
static char long_root[PATH_MAX];
static char max_root[PATH_MAX];

static void setup(void)
{
	memset(long_name, 'a', CKPT_MAX_NAME_LEN + 1);
	long_name[CKPT_MAX_NAME_LEN + 1] = '\0';
	memset(max_name, 'b', CKPT_MAX_NAME_LEN);
	max_name[CKPT_MAX_NAME_LEN] = '\0';
	memset(long_item, 'x', CKPT_MAX_ITEM_NAME + 1);
	long_item[CKPT_MAX_ITEM_NAME + 1] = '\0';
	memset(max_item, 'y', CKPT_MAX_ITEM_NAME);
	max_item[CKPT_MAX_ITEM_NAME] = '\0';
	long_root[0] = '/';
	memset(long_root + 1, 'r', PATH_MAX - 256);
	long_root[PATH_MAX - 255] = '\0'; /* PATH_MAX - 255 bytes */
	max_root[0] = '/';
	memset(max_root + 1, 'r', PATH_MAX - 257);
	max_root[PATH_MAX - 256] = '\0';
}

struct ncase {
	const char *name;
	bool ok;
};

static const struct ncase ckpt_cases[] = {
	{ "step-000100", true },
	{ "a", true },
	{ "A.b_c-9", true },
	{ "x..y", true },
	{ "", false },
	{ ".hidden", false },
	{ ".", false },
	{ "..", false },
	{ "../x", false },
	{ "a/b", false },
	{ "a b", false },
	{ "tab\there", false },
	{ "nl\n", false },
	{ "caf\xc3\xa9", false },
	{ "a:b", false },
	{ "@long", false },  /* placeholders, see below */
	{ "@max", true },
};

/* "@long" / "@max" stand for the generated names (not constant). */
static const char *pick(const char *s, const char *lng, const char *mx)
{
	if (strcmp(s, "@long") == 0)
		return lng;
	if (strcmp(s, "@max") == 0)
		return mx;
	return s;
}

START_TEST(test_checkpoint_name)
{
	const struct ncase *c = &ckpt_cases[_i];
	const char *name = pick(c->name, long_name, max_name);
	char err[256] = "";

	ck_assert_msg(name_checkpoint_ok(name, err, sizeof(err)) == c->ok, "'%s'", c->name);
	if (!c->ok)
		ck_assert_msg(strstr(err, "checkpoint name") != NULL, "reason: %s", err);
	else
		ck_assert_str_eq(err, "");
	/* NULL err is allowed. */
	ck_assert(name_checkpoint_ok(name, NULL, 0) == c->ok);
}
END_TEST

static const struct ncase job_cases[] = {
	{ "job-1", true },  { ".job", true },  { "a.b_c", true }, { "", false },
	{ "a/b", false },   { "a b", false },  { "\x01", false }, { "@long", false },
	{ "@max", true },
};

START_TEST(test_job_name)
{
	const struct ncase *c = &job_cases[_i];
	const char *name = pick(c->name, long_name, max_name);
	char err[256] = "";

	ck_assert_msg(name_job_ok(name, err, sizeof(err)) == c->ok, "'%s'", c->name);
	if (!c->ok)
		ck_assert_msg(strstr(err, "job id") != NULL, "reason: %s", err);
}
END_TEST

static const struct ncase item_cases[] = {
	{ "model.layers.0.weight", true },
	{ "w", true },
	{ "../x", true },              /* items are not paths */
	{ "a/b", true },
	{ "with space and \"quotes\" \\", true },
	{ "_single", true },
	{ "~", true },
	{ "", false },
	{ "__metadata__", false },
	{ "__x", false },
	{ "ctl\x01", false },
	{ "tab\t", false },
	{ "del\x7f", false },
	{ "caf\xc3\xa9", false },
	{ "@long", false },
	{ "@max", true },
};

START_TEST(test_item_name)
{
	const struct ncase *c = &item_cases[_i];
	const char *name = pick(c->name, long_item, max_item);
	char err[256] = "";

	ck_assert_msg(name_item_ok(name, err, sizeof(err)) == c->ok, "'%s'", c->name);
	if (!c->ok) {
		ck_assert_msg(strstr(err, "item name") != NULL, "reason: %s", err);
		/* Messages never carry the raw control bytes. */
		for (const char *p = err; *p; p++)
			ck_assert((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
	}
}
END_TEST

static const struct ncase root_cases[] = {
	{ "/", true },
	{ "/data/ckpt", true },
	{ "/data/ckpt/", true },
	{ "/a/.b/c..", true },
	{ "/with space", true },
	{ "", false },
	{ "data", false },
	{ "./data", false },
	{ "/data/../etc", false },
	{ "/data/./x", false },
	{ "/data/..", false },
	{ "/.", false },
	{ "//data", false },
	{ "/data//x", false },
	{ "/data//", false },
	{ "@long", false },
	{ "@max", true },
};

START_TEST(test_root_name)
{
	const struct ncase *c = &root_cases[_i];
	const char *name = pick(c->name, long_root, max_root);
	char err[256] = "";

	ck_assert_msg(name_root_ok(name, err, sizeof(err)) == c->ok, "'%s'", c->name);
	if (!c->ok)
		ck_assert_msg(strstr(err, "root directory") != NULL, "reason: %s", err);
}
END_TEST

START_TEST(test_messages)
{
	char err[256];

	ck_assert(!name_checkpoint_ok("../x", err, sizeof(err)));
	ck_assert_str_eq(err, "checkpoint name '../x' contains '/'");
	ck_assert(!name_checkpoint_ok(".x", err, sizeof(err)));
	ck_assert_str_eq(err, "checkpoint name '.x' starts with '.'");
	ck_assert(!name_item_ok("a\x02", err, sizeof(err)));
	ck_assert_str_eq(err, "item name 'a?' has a byte outside printable ASCII at 1");
	ck_assert(!name_root_ok("/a/../b", err, sizeof(err)));
	ck_assert_str_eq(err, "root directory '/a/../b' has a '..' component");
	/* A tiny buffer is cut, never overrun. */
	ck_assert(!name_checkpoint_ok("", err, 4));
	ck_assert_str_eq(err, "che");
	ck_assert(!name_checkpoint_ok(NULL, err, sizeof(err)));
	ck_assert(!name_item_ok(NULL, err, sizeof(err)));
	ck_assert(!name_root_ok(NULL, err, sizeof(err)));
	ck_assert(!name_job_ok(NULL, err, sizeof(err)));
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static Suite *names_suite(void)
{
	Suite *s = suite_create("names");
	TCase *tc;

	tc = tcase_create("checkpoint");
	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, test_checkpoint_name, 0, N(ckpt_cases));
	suite_add_tcase(s, tc);
	tc = tcase_create("job");
	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, test_job_name, 0, N(job_cases));
	suite_add_tcase(s, tc);
	tc = tcase_create("item");
	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, test_item_name, 0, N(item_cases));
	suite_add_tcase(s, tc);
	tc = tcase_create("root");
	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, test_root_name, 0, N(root_cases));
	suite_add_tcase(s, tc);
	tc = tcase_create("messages");
	tcase_add_test(tc, test_messages);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(names_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
