/* SPDX-License-Identifier: MIT */
/*
 * check_retention.c - the retention plan as tables: each case lists
 * checkpoints (name, step, commit time, metric, pinned, in use), the
 * policy's rules as text, and the reasons each checkpoint must be kept for
 * ("" = removed), so every rule, their union, the protections (newest,
 * pins, leases) and the refusals are read off one line each.  Then the
 * rule parser, valid and not.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/retention.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAXC 8
#define H 3600
#define D 86400
/* 2026-01-10 00:00:00 UTC, a day boundary (and an hour's). */
#define T0 1768003200

enum { NOM = 0, MET, NAN_M }; /* metric: none, a value, NaN */

struct ck {
	const char *name;
	uint64_t step;
	int64_t t;
	int m;
	double v;
	bool pin, use;
	const char *want; /* reasons, as ret_reasons spells them; "" removed */
};

static const struct {
	const char *what;
	const char *rules[4];
	bool force;
	int rc;
	size_t removed;
	struct ck c[MAXC];
} cases[] = {
	{ "no rule keeps everything", { NULL }, false, 0, 0,
	  { { "a", 100, T0, NOM, 0, false, false, "no-policy" },
	    { "b", 200, T0 + 60, NOM, 0, false, false, "no-policy" },
	    { "c", 300, T0 + 120, NOM, 0, false, false, "newest,no-policy,last-commit" } } },
	{ "keep_last 2", { "keep_last 2" }, false, 0, 3,
	  { { "s100", 100, T0, NOM, 0, false, false, "" },
	    { "s500", 500, T0 + 400, NOM, 0, false, false, "newest,last,last-commit" },
	    { "s300", 300, T0 + 200, NOM, 0, false, false, "" },
	    { "s400", 400, T0 + 300, NOM, 0, false, false, "last" },
	    { "s200", 200, T0 + 100, NOM, 0, false, false, "" } } },
	{ "keep_last orders by step; the last commit is kept too", { "keep_last 1" }, false, 0, 1,
	  { { "late-small", 100, T0 + 999, NOM, 0, false, false, "last-commit" },
	    { "mid", 150, T0 + 500, NOM, 0, false, false, "" },
	    { "early-big", 200, T0, NOM, 0, false, false, "newest,last" } } },
	{ "a job rolled back: what it resumes from stays", { "keep_last 2" }, false, 0, 1,
	  { { "run1-s900", 900, T0, NOM, 0, false, false, "last" },
	    { "run1-s1000", 1000, T0 + H, NOM, 0, false, false, "newest,last" },
	    { "run2-s600", 600, T0 + 2 * H, NOM, 0, false, false, "" },
	    { "run2-s700", 700, T0 + 3 * H, NOM, 0, false, false, "last-commit" } } },
	{ "equal steps: the later commit is newer", { "keep_last 1" }, false, 0, 1,
	  { { "x", 100, T0, NOM, 0, false, false, "" },
	    { "y", 100, T0 + 5, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "keep_last larger than the root", { "keep_last 10" }, false, 0, 0,
	  { { "a", 1, T0, NOM, 0, false, false, "last" },
	    { "b", 2, T0 + 1, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "keep_every_steps 200", { "keep_every_steps 200" }, false, 0, 2,
	  { { "s100", 100, T0, NOM, 0, false, false, "" },
	    { "s200", 200, T0 + 1, NOM, 0, false, false, "every" },
	    { "s300", 300, T0 + 2, NOM, 0, false, false, "" },
	    { "s400", 400, T0 + 3, NOM, 0, false, false, "every" },
	    { "s500", 500, T0 + 4, NOM, 0, false, false, "newest,last-commit" },
	    { "s0", 0, T0 - 1, NOM, 0, false, false, "every" } } },
	{ "keep_within 1h of the newest commit, boundary included", { "keep_within 1h" }, false,
	  0, 2,
	  { { "old", 1, T0, NOM, 0, false, false, "" },
	    { "edge", 2, T0 + 10 * H - H, NOM, 0, false, false, "within" },
	    { "out", 3, T0 + 10 * H - H - 1, NOM, 0, false, false, "" },
	    { "new", 4, T0 + 10 * H, NOM, 0, false, false, "newest,within,last-commit" } } },
	{ "keep_hourly 2: the newest of each of the 2 latest hours", { "keep_hourly 2" }, false,
	  0, 3,
	  { { "h10a", 1, T0 + 10 * H + 5 * 60, NOM, 0, false, false, "" },
	    { "h10b", 2, T0 + 10 * H + 40 * 60, NOM, 0, false, false, "" },
	    { "h11a", 3, T0 + 11 * H + 10 * 60, NOM, 0, false, false, "" },
	    { "h11b", 4, T0 + 11 * H + 50 * 60, NOM, 0, false, false, "hourly" },
	    { "h13", 5, T0 + 13 * H + 30 * 60, NOM, 0, false, false, "newest,hourly,last-commit" } } },
	{ "keep_daily 2, UTC days", { "keep_daily 2" }, false, 0, 2,
	  { { "d0", 1, T0 + 2 * H, NOM, 0, false, false, "" },
	    { "d1a", 2, T0 + D, NOM, 0, false, false, "" },
	    { "d1b", 3, T0 + 2 * D - 1, NOM, 0, false, false, "daily" },
	    { "d2", 4, T0 + 2 * D, NOM, 0, false, false, "newest,daily,last-commit" } } },
	{ "keep_best 2 min: NaN and missing unranked, ties to the newer",
	  { "keep_best 2 loss min" }, false, 0, 4,
	  { { "s1", 1, T0, MET, 0.5, false, false, "" },
	    { "s2", 2, T0 + 1, MET, 0.3, false, false, "best" },
	    { "s3", 3, T0 + 2, NAN_M, 0, false, false, "" },
	    { "s4", 4, T0 + 3, NOM, 0, false, false, "" },
	    { "s5", 5, T0 + 4, MET, 0.3, false, false, "newest,best,last-commit" },
	    { "s0", 0, T0 - 1, MET, 0.9, false, false, "" } } },
	{ "keep_best 1 min: a tie goes to the newer step", { "keep_best 1 loss min" }, false, 0,
	  1,
	  { { "s1", 1, T0, MET, 0.3, false, false, "" },
	    { "s2", 2, T0 + 1, MET, 0.3, false, false, "best" },
	    { "s3", 3, T0 + 2, MET, 0.7, false, false, "newest,last-commit" } } },
	{ "keep_best max", { "keep_best 1 acc max" }, false, 0, 1,
	  { { "s1", 1, T0, MET, 0.90, false, false, "" },
	    { "s2", 2, T0 + 1, MET, 0.95, false, false, "best" },
	    { "s3", 3, T0 + 2, NAN_M, 0, false, false, "newest,last-commit" } } },
	{ "keep_best never removes the newest, however bad", { "keep_best 1 loss min" }, false, 0,
	  1,
	  { { "good", 1, T0, MET, 0.1, false, false, "best" },
	    { "mid", 2, T0 + 1, MET, 0.5, false, false, "" },
	    { "worst", 3, T0 + 2, MET, 9.0, false, false, "newest,last-commit" } } },
	{ "keep_best with no ranked checkpoint: no rule keeps anything, refused",
	  { "keep_best 3 loss min" }, false, -EPERM, 1,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "b", 2, T0 + 1, NAN_M, 0, false, false, "newest,last-commit" } } },
	{ "pins and leases are kept", { "keep_last 1" }, false, 0, 1,
	  { { "pinned", 1, T0, NOM, 0, true, false, "pinned" },
	    { "leased", 2, T0 + 1, NOM, 0, false, true, "in-use" },
	    { "plain", 3, T0 + 2, NOM, 0, false, false, "" },
	    { "both", 4, T0 + 3, NOM, 0, true, true, "pinned,in-use" },
	    { "top", 5, T0 + 4, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "rules unite", { "keep_last 1", "keep_every_steps 300", "keep_best 1 loss min" }, false,
	  0, 2,
	  { { "s100", 100, T0, MET, 0.2, false, false, "best" },
	    { "s200", 200, T0 + 1, MET, 0.4, false, false, "" },
	    { "s300", 300, T0 + 2, MET, 0.5, false, false, "every" },
	    { "s400", 400, T0 + 3, MET, 0.3, false, false, "" },
	    { "s600", 600, T0 + 4, MET, 0.6, false, false, "newest,last,every,last-commit" } } },
	{ "more removals than max_removals: refused", { "keep_last 1", "max_removals 2" }, false,
	  -EPERM, 3,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "b", 2, T0 + 1, NOM, 0, false, false, "" },
	    { "c", 3, T0 + 2, NOM, 0, false, false, "" },
	    { "d", 4, T0 + 3, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "...and with force, done", { "keep_last 1", "max_removals 2" }, true, 0, 3,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "b", 2, T0 + 1, NOM, 0, false, false, "" },
	    { "c", 3, T0 + 2, NOM, 0, false, false, "" },
	    { "d", 4, T0 + 3, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "exactly max_removals is allowed", { "keep_last 2", "max_removals 2" }, false, 0, 2,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "b", 2, T0 + 1, NOM, 0, false, false, "" },
	    { "c", 3, T0 + 2, NOM, 0, false, false, "last" },
	    { "d", 4, T0 + 3, NOM, 0, false, false, "newest,last,last-commit" } } },
	{ "keep_within counts from the newest step's commit, not a stray future one",
	  { "keep_within 7d" }, false, 0, 1,
	  { { "future", 50, T0 + 3650 * D, NOM, 0, false, false, "within,last-commit" },
	    { "s100", 100, T0 - 8 * D, NOM, 0, false, false, "" },
	    { "s200", 200, T0 - 2 * D, NOM, 0, false, false, "within" },
	    { "s300", 300, T0, NOM, 0, false, false, "newest,within" } } },
	{ "keep_within wider than all time keeps all (no overflow before 1970)",
	  { "keep_within 9223372036854775807" }, false, 0, 0,
	  { { "a", 1, -120, NOM, 0, false, false, "within" },
	    { "b", 2, -60, NOM, 0, false, false, "newest,within,last-commit" } } },
	{ "hours before 1970 and near the limits bucket without overflow", { "keep_hourly 2" },
	  false, 0, 1,
	  { { "min", 1, INT64_MIN, NOM, 0, false, false, "" },
	    { "neg", 2, -1, NOM, 0, false, false, "hourly" },
	    { "max", 3, INT64_MAX, NOM, 0, false, false, "newest,hourly,last-commit" } } },
	{ "a refused no-rule-keeps plan goes with force", { "keep_best 3 loss min" }, true, 0, 1,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "b", 2, T0 + 1, NAN_M, 0, false, false, "newest,last-commit" } } },
	{ "a name listed twice", { "keep_last 1" }, false, -EINVAL, 0,
	  { { "a", 1, T0, NOM, 0, false, false, "" },
	    { "a", 2, T0 + 1, NOM, 0, false, false, "" } } },
};

START_TEST(test_plan)
{
	struct ret_policy p;
	struct ret_ckpt c[MAXC];
	uint32_t keep[MAXC];
	size_t n = 0, removed = 99;
	char err[512] = "", got[128];
	int rc;

	memset(&p, 0, sizeof(p));
	for (int r = 0; r < 4 && cases[_i].rules[r]; r++)
		ck_assert_msg(ret_policy_parse_rule(&p, cases[_i].rules[r], err, sizeof(err)) == 0,
			      "%s: '%s': %s", cases[_i].what, cases[_i].rules[r], err);
	while (n < MAXC && cases[_i].c[n].name) {
		const struct ck *k = &cases[_i].c[n];
		c[n] = (struct ret_ckpt){ .name = k->name, .step = k->step, .time_s = k->t,
					  .has_metric = k->m != NOM,
					  .metric = k->m == NAN_M ? NAN : k->v, .pinned = k->pin,
					  .in_use = k->use };
		n++;
	}
	rc = ret_plan(c, n, &p, cases[_i].force, keep, &removed, err, sizeof(err));
	ck_assert_msg(rc == cases[_i].rc, "%s: %d (%s), want %d", cases[_i].what, rc, err,
		      cases[_i].rc);
	if (rc == -EINVAL) {
		ck_assert_msg(strstr(err, "twice"), "%s: '%s'", cases[_i].what, err);
		return;
	}
	if (rc == -EPERM)
		ck_assert_msg(strstr(err, "refused") && strstr(err, "--force"), "%s: '%s'",
			      cases[_i].what, err);
	ck_assert_msg(removed == cases[_i].removed, "%s: %zu removed, want %zu", cases[_i].what,
		      removed, cases[_i].removed);
	for (size_t i = 0; i < n; i++) {
		ret_reasons(keep[i], got, sizeof(got));
		ck_assert_msg(!strcmp(got, cases[_i].c[i].want), "%s: %s kept for '%s', want '%s'",
			      cases[_i].what, c[i].name, got, cases[_i].c[i].want);
	}
}
END_TEST

/* The plan is a function of the set, not of the order it is listed in. */
START_TEST(test_order_free)
{
	struct ret_policy p;
	struct ret_ckpt c[6], r[6];
	uint32_t k1[6], k2[6];
	size_t rm1, rm2;
	char err[256];

	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_last 2", err, sizeof(err)), 0);
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_hourly 1", err, sizeof(err)), 0);
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_best 1 loss min", err, sizeof(err)), 0);
	for (int i = 0; i < 6; i++) {
		static const char *names[] = { "a", "b", "c", "d", "e", "f" };
		c[i] = (struct ret_ckpt){ .name = names[i], .step = (uint64_t)(i % 3) * 10,
					  .time_s = T0 + (i / 2) * H, .has_metric = true,
					  .metric = (double)(i % 2) };
		r[5 - i] = c[i];
	}
	ck_assert_int_eq(ret_plan(c, 6, &p, false, k1, &rm1, err, sizeof(err)), 0);
	ck_assert_int_eq(ret_plan(r, 6, &p, false, k2, &rm2, err, sizeof(err)), 0);
	ck_assert_uint_eq(rm1, rm2);
	for (int i = 0; i < 6; i++)
		ck_assert_msg(k1[i] == k2[5 - i], "%s: %#x vs %#x", c[i].name, k1[i], k2[5 - i]);
}
END_TEST

START_TEST(test_empty_root)
{
	struct ret_policy p = { .keep_last = 1 };
	size_t removed = 7;
	char err[64];

	ck_assert_int_eq(ret_plan(NULL, 0, &p, false, NULL, &removed, err, sizeof(err)), 0);
	ck_assert_uint_eq(removed, 0);
}
END_TEST

static const struct {
	const char *text;
	bool ok;
} rules[] = {
	{ "keep_last 3", true },
	{ "keep_last   3", true },
	{ "keep_every_steps 1000", true },
	{ "keep_within 7d", true },
	{ "keep_within 90", true },
	{ "keep_within 2w", true },
	{ "keep_hourly 24", true },
	{ "keep_daily 7", true },
	{ "keep_best 3 val_loss min", true },
	{ "keep_best 1 acc max", true },
	{ "max_removals 50", true },
	{ "keep_last 0", false },
	{ "keep_last -1", false },
	{ "keep_last 3x", false },
	{ "keep_last", false },
	{ "keep_last 1 2", false },
	{ "keep_last 4294967296", false },
	{ "keep_within 7y", false },
	{ "keep_within 0s", false },
	{ "keep_within 99999999999999999999d", false },
	{ "keep_best 3 loss", false },
	{ "keep_best 3 loss lowest", false },
	{ "keep_best 0 loss min", false },
	{ "keep_best 3 loss min extra", false },
	{ "keep_forever 1", false },
	{ "keep_best 3 --json min", false },
	{ "keep_best 3 lo\x1bss min", false },
	{ "keep_best 3 eval/loss:val-1.2 min", true },
	{ "", false },
};

START_TEST(test_parse)
{
	struct ret_policy p;
	char err[512] = "";
	int rc;

	memset(&p, 0, sizeof(p));
	rc = ret_policy_parse_rule(&p, rules[_i].text, err, sizeof(err));
	ck_assert_msg((rc == 0) == rules[_i].ok, "'%s': %d %s", rules[_i].text, rc, err);
	if (!rules[_i].ok)
		ck_assert_msg(rc == -EINVAL && strstr(err, "expected") && ret_policy_empty(&p),
			      "'%s': %d '%s'", rules[_i].text, rc, err);
	else
		ck_assert(!ret_policy_empty(&p) || !strncmp(rules[_i].text, "max_removals", 12));
}
END_TEST

START_TEST(test_parse_values)
{
	struct ret_policy p;
	char err[256];

	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_within 36h", err, sizeof(err)), 0);
	ck_assert_int_eq(p.keep_within_s, 36 * H);
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_best 5 val_loss max", err, sizeof(err)),
			 0);
	ck_assert_uint_eq(p.keep_best, 5);
	ck_assert_str_eq(p.best_metric, "val_loss");
	ck_assert(p.best_max);
	ck_assert_int_eq(ret_policy_parse_rule(&p, "keep_every_steps 18446744073709551615", err,
					       sizeof(err)),
			 0);
	ck_assert_uint_eq(p.keep_every_steps, UINT64_MAX);
}
END_TEST

/* A rule given twice is an error (not silently the second one). */
START_TEST(test_parse_twice)
{
	static const char *const twice[][2] = {
		{ "keep_last 2", "keep_last 5" },
		{ "keep_best 1 val_loss min", "keep_best 1 other max" },
		{ "keep_within 1h", "keep_within 2h" },
		{ "max_removals 3", "max_removals 4" },
	};
	for (int i = 0; i < N(twice); i++) {
		struct ret_policy p;
		char err[512];

		memset(&p, 0, sizeof(p));
		ck_assert_int_eq(ret_policy_parse_rule(&p, twice[i][0], err, sizeof(err)), 0);
		ck_assert_int_eq(ret_policy_parse_rule(&p, twice[i][1], err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "given twice"), "'%s'", err);
	}
}
END_TEST

static Suite *retention_suite(void)
{
	Suite *s = suite_create("retention");
	TCase *tc = tcase_create("plan");

	tcase_add_loop_test(tc, test_plan, 0, N(cases));
	tcase_add_test(tc, test_order_free);
	tcase_add_test(tc, test_empty_root);
	tcase_add_loop_test(tc, test_parse, 0, N(rules));
	tcase_add_test(tc, test_parse_values);
	tcase_add_test(tc, test_parse_twice);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(retention_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
