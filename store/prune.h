/* SPDX-License-Identifier: MIT */
/*
 * prune.h - applying a retention policy (format/retention.h) to the
 * committed checkpoints directly in one root: ckptctl prune and ckptd's
 * own retention (after each commit and on its sweep) run this one engine.
 *
 * prune_run() reads the candidates (directories holding a manifest that
 * parses, never symbolic links, hidden names or trash; on S3 the prefixes
 * whose manifest.json parses), the pins (ROOT/.ckpt-pins) and the leases
 * (local: a reader's lock, remove.h), makes the plan, and unless it is a
 * dry run or refused, removes what the plan removes (remove.h).  First it
 * finishes removals a crash cut short (trash, tombstones).  It prints
 * nothing: warnings go to the caller's callback.
 */
#ifndef CKPT_STORE_PRUNE_H
#define CKPT_STORE_PRUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "format/retention.h"

#define PRUNE_PINS_FILE ".ckpt-pins"
#define PRUNE_PINS_MAX (1u << 20) /* bytes of a pin list read */

/* One candidate and what became of it. */
struct prune_item {
	char *name;
	char time[40];        /* its commit time, as parsed */
	struct ret_ckpt rc;
	uid_t uid;            /* the directory's owner; on S3 the uid its manifest
			       * records, or STORE_NO_OWNER */
	uint64_t dev, ino;    /* the directory as scanned (local) */
	char etag[132];       /* its manifest's ETag as scanned (S3) */
	uint32_t keep;        /* the plan's reasons; 0: removed */
	int res;              /* the removal: 0 removed, -EBUSY in use, -ESTALE
			       * changed since the plan, -EINPROGRESS another
			       * removal's (S3), ... */
	char *why;            /* the removal's error, or NULL */
};

struct prune_run {
	/* in */
	const char *root;              /* a directory or s3://bucket/prefix */
	const struct ret_policy *policy;
	bool force, dry_run;
	uid_t only_uid;                /* candidates owned by this uid only
					* (STORE_NO_OWNER: all, each owner's
					* planned on their own: one user's
					* checkpoints never take "newest" or
					* "last" from another's) */
	uid_t remover;                 /* who removes: a plan that removes a
					* checkpoint of another uid is refused
					* whole (STORE_NO_OWNER or 0: any) */
	bool lock_root;                /* hold ROOT's lock (one prune or pin
					* at a time); -EAGAIN if held */
	int dirfd;                     /* >= 0: ROOT opened by the caller
					* (safely: ckptd opens it without
					* following links), used instead of
					* opening root; 0 is taken as unset
					* unless dirfd_set */
	bool dirfd_set;
	size_t manifest_max;           /* bytes of a manifest read (0: 1 GiB) */
	const volatile bool *cancel;   /* if it turns true, the pass stops
					* between checkpoints (-ECANCELED) */
	void (*warn)(void *ud, const char *msg);
	void *ud;
	/* out (prune_run_free releases) */
	struct prune_item *v;          /* sorted by step, then name */
	size_t n;
	size_t skipped;                /* unreadable or corrupt: left out */
	size_t others;                 /* other owners' (only_uid): left out */
	long finished;                 /* earlier removals finished */
	size_t planned;                /* the plan's removals */
	size_t removed, busy, failed;  /* busy: kept in use (a reader's lease) */
	size_t kept_late;              /* kept though planned: pinned or changed
					* since the plan, or not reached (cancel) */
	size_t taken;                  /* S3: another removal has it, or has
					* removed it (item res -EINPROGRESS) */
	int plan_res;                  /* 0, or -EPERM: refused (err) */
	char err[1024];
};

/*
 * Runs the prune described by pr's inputs.  Returns 0 when a plan was
 * made (pr->plan_res says whether it was refused; the outcome per item is
 * in pr->v), or -errno when the root could not be read (the reason in
 * pr->err; -EAGAIN: another prune holds the root).
 */
int prune_run(struct prune_run *pr);
void prune_run_free(struct prune_run *pr);

/* The pin list of a root (NULL-terminated; empty if there is none), or
 * NULL with *ret_err (-EBADMSG: it holds a NUL byte).  rootfd for a local
 * root, else s3 root URL. */
char **prune_read_pins(int rootfd, const char *s3_root, int *ret_err, char *err,
		       size_t errlen);
/* The names of a pin list's text (consumed; NULL: none), as a
 * NULL-terminated array (empty if none); NULL with *ret_err on failure. */
char **prune_parse_pins(char *text, size_t len, int *ret_err);
void prune_pins_free(char **pins);
bool prune_pinned(char **pins, const char *name);

/* store_s3_remove()'s recheck for a prune of S3 root `root`: keeps
 * checkpoint `name` if the pin list names it now (pinned), or cannot be
 * read (failed). */
struct prune_recheck {
	const char *root, *name;
	bool pinned, failed;
};
int prune_pin_recheck(void *ud, char *why, size_t whylen);

/* Whether `name` directly in rootfd is a committed checkpoint: 1 (its
 * step and time into c, owner into *uid), 0 not one, < 0 unreadable or
 * corrupt (err). */
int prune_read_local(int rootfd, const char *name, const struct ret_policy *p,
		     struct prune_item *c, char *err, size_t errlen);

/* The policy in words ("keep_last 3, keep_best 2 loss min"). */
void prune_policy_text(const struct ret_policy *p, char *buf, size_t len);

#endif
