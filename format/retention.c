/* SPDX-License-Identifier: MIT */
/* retention.c - the retention plan (see retention.h). */
#include "format/retention.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ret_policy_empty(const struct ret_policy *p)
{
	return !p->keep_last && !p->keep_every_steps && p->keep_within_s <= 0 &&
	       !p->keep_hourly && !p->keep_daily && !p->keep_best;
}

/* ---- ordering ---- */

static int cmp_str(const char *a, const char *b)
{
	int r = strcmp(a, b);
	return r < 0 ? -1 : r > 0;
}

/* Newest first: greater step, then later commit, then greater name (a
 * total order, so every caller computes the same plan). */
static int cmp_newest(const void *pa, const void *pb)
{
	const struct ret_ckpt *a = *(const struct ret_ckpt *const *)pa;
	const struct ret_ckpt *b = *(const struct ret_ckpt *const *)pb;

	if (a->step != b->step)
		return a->step > b->step ? -1 : 1;
	if (a->time_s != b->time_s)
		return a->time_s > b->time_s ? -1 : 1;
	return -cmp_str(a->name, b->name);
}

/* Latest commit first (for the hourly and daily buckets), then as above. */
static int cmp_latest(const void *pa, const void *pb)
{
	const struct ret_ckpt *a = *(const struct ret_ckpt *const *)pa;
	const struct ret_ckpt *b = *(const struct ret_ckpt *const *)pb;

	if (a->time_s != b->time_s)
		return a->time_s > b->time_s ? -1 : 1;
	return cmp_newest(pa, pb);
}

static int cmp_name(const void *pa, const void *pb)
{
	const struct ret_ckpt *a = *(const struct ret_ckpt *const *)pa;
	const struct ret_ckpt *b = *(const struct ret_ckpt *const *)pb;

	return cmp_str(a->name, b->name);
}

/* keep_best's order: the best first; ranked ones (a finite metric) before
 * unranked ones; ties to the newer. */
static _Thread_local bool g_best_max; /* qsort has no context argument */

static bool ranked(const struct ret_ckpt *c)
{
	return c->has_metric && isfinite(c->metric);
}

static int cmp_best(const void *pa, const void *pb)
{
	const struct ret_ckpt *a = *(const struct ret_ckpt *const *)pa;
	const struct ret_ckpt *b = *(const struct ret_ckpt *const *)pb;

	if (ranked(a) != ranked(b))
		return ranked(a) ? -1 : 1;
	if (ranked(a) && a->metric != b->metric)
		return (a->metric < b->metric) != g_best_max ? -1 : 1;
	return cmp_newest(pa, pb);
}

/* The bucket of a commit time (floor division: times before 1970 too,
 * without negating t, which overflows at INT64_MIN). */
static int64_t bucket(int64_t t, int64_t width)
{
	int64_t q = t / width;

	return t % width < 0 ? q - 1 : q;
}

/* Keeps the newest checkpoint of each of the n latest buckets of `width`
 * seconds; by is sorted latest first. */
static void keep_buckets(const struct ret_ckpt *base, const struct ret_ckpt **by, size_t n_ck,
			 uint32_t n, int64_t width, uint32_t why, uint32_t *keep)
{
	uint32_t seen = 0;
	int64_t last = 0;

	for (size_t i = 0; i < n_ck; i++) {
		int64_t b = bucket(by[i]->time_s, width);

		if (seen && b == last)
			continue; /* an older one of a bucket already kept */
		if (seen == n)
			break;
		seen++;
		last = b;
		keep[by[i] - base] |= why;
	}
}

int ret_plan(const struct ret_ckpt *c, size_t n, const struct ret_policy *p, bool force,
	     uint32_t *keep, size_t *ret_removed, char *err, size_t errlen)
{
	const struct ret_ckpt **by = NULL;
	size_t removed = 0, by_rule = 0;
	int64_t newest_time, since;

	*ret_removed = 0;
	if (n == 0)
		return 0;
	by = malloc(n * sizeof(*by));
	if (!by) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (!c[i].name) {
			free(by);
			snprintf(err, errlen, "checkpoint %zu has no name", i);
			return -EINVAL;
		}
		by[i] = &c[i];
		keep[i] = 0;
	}
	qsort(by, n, sizeof(*by), cmp_name);
	for (size_t i = 1; i < n; i++) {
		if (!strcmp(by[i - 1]->name, by[i]->name)) {
			snprintf(err, errlen, "checkpoint '%s' is listed twice", by[i]->name);
			free(by);
			return -EINVAL;
		}
	}

	/* Protections: the newest, and the one committed last. */
	qsort(by, n, sizeof(*by), cmp_latest);
	keep[by[0] - c] |= RET_LATEST;
	qsort(by, n, sizeof(*by), cmp_newest);
	keep[by[0] - c] |= RET_NEWEST;
	newest_time = by[0]->time_s;
	/* (Saturated: a window wider than the time before it keeps all.) */
	since = p->keep_within_s > 0 && newest_time >= INT64_MIN + p->keep_within_s ?
			newest_time - p->keep_within_s :
			INT64_MIN;
	for (size_t i = 0; i < n; i++) {
		if (c[i].pinned)
			keep[i] |= RET_PINNED;
		if (c[i].in_use)
			keep[i] |= RET_IN_USE;
		if (ret_policy_empty(p))
			keep[i] |= RET_NO_POLICY;
	}

	/* The rules. */
	for (size_t i = 0; i < n && i < p->keep_last; i++)
		keep[by[i] - c] |= RET_LAST;
	for (size_t i = 0; i < n; i++) {
		if (p->keep_every_steps && c[i].step % p->keep_every_steps == 0)
			keep[i] |= RET_EVERY;
		if (p->keep_within_s > 0 && c[i].time_s >= since)
			keep[i] |= RET_WITHIN;
	}
	if (p->keep_hourly || p->keep_daily) {
		qsort(by, n, sizeof(*by), cmp_latest);
		if (p->keep_hourly)
			keep_buckets(c, by, n, p->keep_hourly, 3600, RET_HOURLY, keep);
		if (p->keep_daily)
			keep_buckets(c, by, n, p->keep_daily, 86400, RET_DAILY, keep);
	}
	if (p->keep_best) {
		g_best_max = p->best_max;
		qsort(by, n, sizeof(*by), cmp_best);
		for (size_t i = 0; i < n && i < p->keep_best && ranked(by[i]); i++)
			keep[by[i] - c] |= RET_BEST;
	}
	free(by);

	for (size_t i = 0; i < n; i++) {
		removed += keep[i] == 0;
		by_rule += (keep[i] & RET_RULES) != 0;
	}
	*ret_removed = removed;
	if (removed && !by_rule && !ret_policy_empty(p) && !force) {
		snprintf(err, errlen, "refused: no rule of the policy keeps any of the %zu "
			 "checkpoints (only the newest, pins and ones in use are kept), so it would "
			 "remove every other one; a misspelled metric?  --force removes them", n);
		return -EPERM;
	}
	if (p->max_removals && removed > p->max_removals && !force) {
		snprintf(err, errlen, "refused: the plan removes %zu checkpoints, more than "
			 "max_removals (%" PRIu32 ") allows in one pass; --force removes them",
			 removed, p->max_removals);
		return -EPERM;
	}
	return 0;
}

/* ---- text ---- */

static const struct {
	uint32_t bit;
	const char *name;
} reason_names[] = {
	{ RET_NEWEST, "newest" }, { RET_PINNED, "pinned" }, { RET_IN_USE, "in-use" },
	{ RET_NO_POLICY, "no-policy" }, { RET_LAST, "last" },	 { RET_EVERY, "every" },
	{ RET_WITHIN, "within" },	 { RET_HOURLY, "hourly" }, { RET_DAILY, "daily" },
	{ RET_BEST, "best" },	  { RET_LATEST, "last-commit" },
};

void ret_reasons(uint32_t keep, char *buf, size_t len)
{
	size_t at = 0;

	if (len)
		buf[0] = '\0';
	for (size_t i = 0; i < sizeof(reason_names) / sizeof(reason_names[0]); i++) {
		if (!(keep & reason_names[i].bit) || at >= len)
			continue;
		int w = snprintf(buf + at, len - at, "%s%s", at ? "," : "", reason_names[i].name);
		at = w < 0 ? len : at + (size_t)w;
	}
}

/* A count: 1 .. 2^32 - 1 (0 would be "off": write no rule instead). */
static int parse_count(const char *s, uint64_t max, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v == 0 || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

/* "90", "90s", "30m", "36h", "7d", "2w": seconds. */
static int parse_span(const char *s, int64_t *ret);

int ret_parse_duration(const char *s, int64_t *ret)
{
	if (s && (!strcmp(s, "0") || (s[0] == '0' && strchr("smhdw", s[1]) && s[1] && !s[2]))) {
		*ret = 0;
		return 0;
	}
	return parse_span(s, ret);
}

static int parse_span(const char *s, int64_t *ret)
{
	static const struct {
		char unit;
		int64_t mult;
	} units[] = { { 's', 1 }, { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 }, { 'w', 604800 } };
	char *end;
	unsigned long long v;
	int64_t mult = 1;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || v == 0)
		return -EINVAL;
	if (*end) {
		size_t i;
		for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
			if (end[0] == units[i].unit && !end[1])
				break;
		if (i == sizeof(units) / sizeof(units[0]))
			return -EINVAL;
		mult = units[i].mult;
	}
	if (v > (unsigned long long)(INT64_MAX / mult))
		return -EINVAL;
	*ret = (int64_t)v * mult;
	return 0;
}

static bool metric_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= RET_METRIC_LEN || s[0] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr("_.:/-", s[i]))
			return false;
	return true;
}

int ret_policy_parse_rule(struct ret_policy *p, const char *text, char *err, size_t errlen)
{
	char buf[512], *tok[5], *save = NULL;
	size_t nt = 0;
	uint64_t v = 0;

	if (!text || strlen(text) >= sizeof(buf)) {
		snprintf(err, errlen, "retention rule missing or too long");
		return -EINVAL;
	}
	memcpy(buf, text, strlen(text) + 1);
	for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
		if (nt == 5) {
			nt++;
			break;
		}
		tok[nt++] = t;
	}
	if (nt == 0 || nt > 4)
		goto bad;
	if ((!strcmp(tok[0], "keep_last") && p->keep_last) ||
	    (!strcmp(tok[0], "keep_every_steps") && p->keep_every_steps) ||
	    (!strcmp(tok[0], "keep_within") && p->keep_within_s > 0) ||
	    (!strcmp(tok[0], "keep_hourly") && p->keep_hourly) ||
	    (!strcmp(tok[0], "keep_daily") && p->keep_daily) ||
	    (!strcmp(tok[0], "keep_best") && p->keep_best) ||
	    (!strcmp(tok[0], "max_removals") && p->max_removals)) {
		snprintf(err, errlen, "retention rule '%s': %s is given twice (a rule may be "
			 "given once)", text, tok[0]);
		return -EINVAL;
	}
	if (!strcmp(tok[0], "keep_within")) {
		if (nt != 2 || parse_span(tok[1], &p->keep_within_s) < 0)
			goto bad;
		return 0;
	}
	if (!strcmp(tok[0], "keep_best")) {
		if (nt != 4 || parse_count(tok[1], UINT32_MAX, &v) < 0 || !metric_ok(tok[2]) ||
		    (strcmp(tok[3], "min") && strcmp(tok[3], "max")))
			goto bad;
		p->keep_best = (uint32_t)v;
		memcpy(p->best_metric, tok[2], strlen(tok[2]) + 1);
		p->best_max = !strcmp(tok[3], "max");
		return 0;
	}
	if (nt != 2)
		goto bad;
	if (!strcmp(tok[0], "keep_every_steps")) {
		if (parse_count(tok[1], UINT64_MAX, &p->keep_every_steps) < 0)
			goto bad;
		return 0;
	}
	if (parse_count(tok[1], UINT32_MAX, &v) < 0)
		goto bad;
	if (!strcmp(tok[0], "keep_last"))
		p->keep_last = (uint32_t)v;
	else if (!strcmp(tok[0], "keep_hourly"))
		p->keep_hourly = (uint32_t)v;
	else if (!strcmp(tok[0], "keep_daily"))
		p->keep_daily = (uint32_t)v;
	else if (!strcmp(tok[0], "max_removals"))
		p->max_removals = (uint32_t)v;
	else
		goto bad;
	return 0;
bad:
	snprintf(err, errlen, "retention rule '%s': expected keep_last N, keep_every_steps K, "
		 "keep_within DURATION (s/m/h/d/w), keep_hourly N, keep_daily N, "
		 "keep_best N METRIC min|max or max_removals N (N, K >= 1)", text);
	return -EINVAL;
}
