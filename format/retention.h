/* SPDX-License-Identifier: MIT */
/*
 * retention.h - which committed checkpoints a retention policy keeps.
 *
 * One pure function of (checkpoints, pins, leases, policy), shared by ckptd
 * (after each commit, on its sweep) and ckptctl (prune, ls): no I/O, no
 * clock.  Every rule gives a keep-set with its reason; the sets are joined
 * (union), and what no rule keeps is removed.  Rules:
 *
 *   keep_last N            the N newest (by step, then commit time, then name)
 *   keep_every_steps K     every checkpoint whose step is a multiple of K
 *   keep_within S          committed at most S seconds before the commit of
 *                          the newest checkpoint (greatest step; not the
 *                          clock: a root whose job stopped long ago keeps
 *                          what it kept)
 *   keep_hourly N          the newest of each of the N latest UTC hours that
 *   keep_daily N           (days) hold a checkpoint
 *   keep_best N METRIC min|max
 *                          the N best by METRIC; a missing or NaN metric is
 *                          unranked (never "best"); ties go to the newer step
 *
 * Always kept, whatever the rules: the newest checkpoint (greatest step)
 * and the one committed last (they differ after a job rolled back to an
 * earlier step: what it resumes from is the last commit), pinned ones, and
 * ones in use (being restored, saved over or uploaded).  Safety: a policy
 * with no rule keeps everything; a plan whose rules keep none of the
 * checkpoints (only the protections do: a misspelled metric, say) is
 * refused, as is one that removes more than max_removals, unless forced.
 * A rule may be given once.
 */
#ifndef CKPT_FORMAT_RETENTION_H
#define CKPT_FORMAT_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RET_METRIC_LEN 128

/* Why a checkpoint is kept: a bit per rule or protection. */
enum {
	RET_NEWEST = 1u << 0,
	RET_PINNED = 1u << 1,
	RET_IN_USE = 1u << 2,
	RET_NO_POLICY = 1u << 3,
	RET_LAST = 1u << 4,
	RET_EVERY = 1u << 5,
	RET_WITHIN = 1u << 6,
	RET_HOURLY = 1u << 7,
	RET_DAILY = 1u << 8,
	RET_BEST = 1u << 9,
	RET_LATEST = 1u << 10, /* committed last (see above) */
};
/* The bits of the policy's rules (not of the protections). */
#define RET_RULES (RET_LAST | RET_EVERY | RET_WITHIN | RET_HOURLY | RET_DAILY | RET_BEST)

/* One committed checkpoint, as the caller found it. */
struct ret_ckpt {
	const char *name;
	uint64_t step;
	int64_t time_s;     /* commit time, seconds since the epoch (UTC) */
	bool has_metric;    /* the policy's keep_best metric, if recorded */
	double metric;
	bool pinned;        /* named in the root's pin list */
	bool in_use;        /* a lease: being restored, saved or uploaded */
};

struct ret_policy {
	uint32_t keep_last;        /* 0: rule off (as for every count below) */
	uint64_t keep_every_steps;
	int64_t keep_within_s;     /* <= 0: off */
	uint32_t keep_hourly;
	uint32_t keep_daily;
	uint32_t keep_best;
	char best_metric[RET_METRIC_LEN];
	bool best_max;             /* larger is better (else smaller) */
	uint32_t max_removals;     /* more in one pass needs force (0: no cap) */
};

/* True if p has no rule (it keeps everything). */
bool ret_policy_empty(const struct ret_policy *p);

/*
 * Parses one rule of a policy written as text, "keep_last 3",
 * "keep_every_steps 1000", "keep_within 7d" (s, m, h, d, w), "keep_hourly
 * 24", "keep_daily 7", "keep_best 3 val_loss min", "max_removals 50",
 * into p.  A METRIC is 1-127 of [A-Za-z0-9_.:/-], not starting with '-'.
 * Returns 0, or -EINVAL with the reason in err (also for a rule p has
 * already).
 */
int ret_policy_parse_rule(struct ret_policy *p, const char *text, char *err, size_t errlen);

/*
 * The plan for the n checkpoints c[]: keep[i] gets the reasons checkpoint
 * c[i] is kept (0: removed), *ret_removed how many are removed.  Returns
 * 0; -EPERM if a safety rule refuses the plan (err says which; keep[] and
 * *ret_removed still describe the plan, for a dry run to show); -EINVAL
 * for duplicate names (err).
 */
int ret_plan(const struct ret_ckpt *c, size_t n, const struct ret_policy *p, bool force,
	     uint32_t *keep, size_t *ret_removed, char *err, size_t errlen);

/* A duration, "90", "30m", "24h", "7d", "2w" (s, m, h, d, w; 0 allowed)
 * into *ret seconds.  0 or -EINVAL. */
int ret_parse_duration(const char *s, int64_t *ret);

/* "newest,pinned,last" for the bits of a keep value, into buf. */
void ret_reasons(uint32_t keep, char *buf, size_t len);

#endif
