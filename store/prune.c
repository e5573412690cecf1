/* SPDX-License-Identifier: MIT */
/* prune.c - one retention pass over one root (prune.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/index.h"
#include "format/retention.h"
#include "store/fsutil.h"
#include "store/prune.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

#define PRUNE_MANIFEST_MAX (1024ull << 20)
#define PRUNE_URL_MAX      (PATH_MAX + S3_KEY_MAX + 8) /* a root and a name */

/* "2026-11-23T03:09:36Z" (exactly that form, a real date and time: the
 * daemon writes it so) -> seconds since the epoch. */
static bool parse_time(const char *s, int64_t *ret)
{
	static const char form[] = "dddd-dd-ddTdd:dd:ddZ";
	struct tm tm, back;
	time_t t;

	if (strlen(s) != sizeof(form) - 1)
		return false;
	for (size_t i = 0; form[i]; i++)
		if (form[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != form[i])
			return false;
	memset(&tm, 0, sizeof(tm));
	tm.tm_year = atoi(s) - 1900;
	tm.tm_mon = atoi(s + 5) - 1;
	tm.tm_mday = atoi(s + 8);
	tm.tm_hour = atoi(s + 11);
	tm.tm_min = atoi(s + 14);
	tm.tm_sec = atoi(s + 17);
	back = tm;
	t = timegm(&tm);
	/* timegm normalizes 02-31 to 03-03 and :60 to the next minute: a
	 * date that does not come back the same was not a real one. */
	if (tm.tm_year != back.tm_year || tm.tm_mon != back.tm_mon ||
	    tm.tm_mday != back.tm_mday || tm.tm_hour != back.tm_hour ||
	    tm.tm_min != back.tm_min || tm.tm_sec != back.tm_sec)
		return false;
	*ret = (int64_t)t;
	return true;
}

char **prune_parse_pins(char *text, size_t len, int *ret_err)
{
	char **v = calloc(1, sizeof(*v)), *save = NULL;
	size_t n = 0;

	*ret_err = 0;
	if (!v || (text && memchr(text, '\0', len))) {
		/* (a NUL would hide every pin after it) */
		*ret_err = v ? -EBADMSG : -ENOMEM;
		free(text);
		free(v);
		return NULL;
	}
	for (char *line = text ? strtok_r(text, "\n", &save) : NULL; line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *hash = strchr(line, '#'), **nv;
		size_t l;

		if (hash)
			*hash = '\0';
		while (*line == ' ' || *line == '\t')
			line++;
		l = strlen(line);
		while (l && (line[l - 1] == ' ' || line[l - 1] == '\t' || line[l - 1] == '\r'))
			line[--l] = '\0';
		if (!l)
			continue;
		nv = realloc(v, (n + 2) * sizeof(*v));
		if (!nv || !(nv[n] = strdup(line))) {
			if (nv)
				v = nv;
			v[n] = NULL;
			for (size_t i = 0; i < n; i++)
				free(v[i]);
			free(v);
			free(text);
			*ret_err = -ENOMEM;
			return NULL;
		}
		v = nv;
		v[++n] = NULL;
	}
	free(text);
	return v;
}

char **prune_read_pins(int rootfd, const char *s3_root, int *ret_err, char *err,
		       size_t errlen)
{
	char *text = NULL;
	size_t len = 0;
	int r;

	err[0] = '\0';
	if (s3_root)
		r = store_s3_get(s3_root, PRUNE_PINS_FILE, PRUNE_PINS_MAX, &text, &len, err, errlen);
	else
		r = fs_read_file_at(rootfd, PRUNE_PINS_FILE, PRUNE_PINS_MAX, &text, &len);
	if (r == -ENOENT)
		return prune_parse_pins(NULL, 0, ret_err);
	if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s", strerror(-r));
		*ret_err = r;
		return NULL;
	}
	return prune_parse_pins(text, len, ret_err);
}

void prune_pins_free(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

bool prune_pinned(char **pins, const char *name)
{
	for (size_t i = 0; pins && pins[i]; i++)
		if (!strcmp(pins[i], name))
			return true;
	return false;
}

/* Fills c from checkpoint `name`'s manifest text: 1, or < 0 corrupt
 * (reason in err). */
static int cand_from_text(const char *name, char *text, size_t len, const struct ret_policy *p,
			  struct prune_item *c, char *err, size_t errlen)
{
	struct manifest m;
	json_t *metrics, *v;
	int r;

	memset(&m, 0, sizeof(m));
	r = manifest_parse(text, len, &m, err, errlen);
	if (r < 0)
		return r;
	memset(c, 0, sizeof(*c));
	c->uid = STORE_NO_OWNER;
	c->name = strdup(name);
	if (!c->name) {
		manifest_free(&m);
		return -ENOMEM;
	}
	c->rc.name = c->name;
	c->rc.step = m.step;
	if (strcmp(m.name, name)) {
		/* A copy or a plant: what it says it is, it is not here. */
		snprintf(err, errlen, "its manifest names checkpoint '%.100s', not '%.100s'", m.name,
			 name);
		free(c->name);
		manifest_free(&m);
		return -EBADMSG;
	}
	if (!parse_time(m.time, &c->rc.time_s)) {
		snprintf(err, errlen, "its manifest's time '%.40s' is not YYYY-MM-DDTHH:MM:SSZ",
			 m.time);
		free(c->name);
		manifest_free(&m);
		return -EBADMSG;
	}
	{
		/* Printed as parsed: the manifest's text could carry
		 * anything after what was read. */
		time_t t = (time_t)c->rc.time_s;
		struct tm tm;

		if (!gmtime_r(&t, &tm) ||
		    !strftime(c->time, sizeof(c->time), "%Y-%m-%dT%H:%M:%SZ", &tm))
			snprintf(c->time, sizeof(c->time), "?");
	}
	if (m.has_uid)
		c->uid = (uid_t)m.uid; /* (S3: whose; local: the directory's owner wins) */
	metrics = json_object_get(m.json, "metrics");
	v = p->keep_best ? json_object_get(metrics, p->best_metric) : NULL;
	if (json_is_number(v)) {
		c->rc.has_metric = true;
		c->rc.metric = json_number_value(v);
	}
	manifest_free(&m);
	return 1;
}

/* Reads checkpoint `name` of the directory rootfd: 1 a candidate (filled
 * in), 0 not a checkpoint (no manifest), < 0 unreadable or corrupt (reason
 * in err). */
static int read_local_max(int rootfd, const char *name, const struct ret_policy *p,
			  struct prune_item *c, size_t max, char *err, size_t errlen);

int prune_read_local(int rootfd, const char *name, const struct ret_policy *p,
		     struct prune_item *c, char *err, size_t errlen)
{
	return read_local_max(rootfd, name, p, c, PRUNE_MANIFEST_MAX, err, errlen);
}

static int read_local_max(int rootfd, const char *name, const struct ret_policy *p,
			  struct prune_item *c, size_t max, char *err, size_t errlen)
{
	char rel[NAME_MAX + sizeof(MANIFEST_FILE) + 2], *text = NULL;
	struct stat st;
	size_t len = 0;
	int r;

	/* Directories only, never through a symbolic link (one could stand
	 * for a checkpoint outside ROOT, or one of ROOT's twice). */
	if (fstatat(rootfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		snprintf(err, errlen, "%s", strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode))
		return 0;
	snprintf(rel, sizeof(rel), "%s/%s", name, MANIFEST_FILE);
	r = fs_read_file_at(rootfd, rel, max, &text, &len);
	if (r == -ENOENT || r == -ENOTDIR)
		return 0;
	if (r < 0) {
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	r = cand_from_text(name, text, len, p, c, err, errlen);
	free(text);
	if (r > 0) {
		c->uid = st.st_uid;
		c->dev = (uint64_t)st.st_dev;
		c->ino = (uint64_t)st.st_ino;
	}
	return r;
}

void prune_policy_text(const struct ret_policy *p, char *buf, size_t len)
{
	size_t at = 0;

#define ADD(...)                                                                            \
	do {                                                                                \
		if (at < len) {                                                             \
			int w_ = snprintf(buf + at, len - at, "%s", at ? ", " : "");        \
			at += w_ > 0 ? (size_t)w_ : 0;                                      \
		}                                                                           \
		if (at < len) {                                                             \
			int w_ = snprintf(buf + at, len - at, __VA_ARGS__);                 \
			at += w_ > 0 ? (size_t)w_ : 0;                                      \
		}                                                                           \
	} while (0)
	buf[0] = '\0';
	if (p->keep_last)
		ADD("keep_last %u", p->keep_last);
	if (p->keep_every_steps)
		ADD("keep_every_steps %llu", (unsigned long long)p->keep_every_steps);
	if (p->keep_within_s > 0)
		ADD("keep_within %llds", (long long)p->keep_within_s);
	if (p->keep_hourly)
		ADD("keep_hourly %u", p->keep_hourly);
	if (p->keep_daily)
		ADD("keep_daily %u", p->keep_daily);
	if (p->keep_best)
		ADD("keep_best %u %s %s", p->keep_best, p->best_metric, p->best_max ? "max" : "min");
	if (p->max_removals)
		ADD("max_removals %u", p->max_removals);
	if (!buf[0])
		snprintf(buf, len, "none (everything is kept)");
#undef ADD
}


/* root "/" name into buf (one '/' whatever root ends with). */
static void join(char *buf, size_t len, const char *root, const char *name)
{
	size_t l = strlen(root);

	snprintf(buf, len, "%s%s%s", root, l && root[l - 1] == '/' ? "" : "/", name);
}

static void warn(struct prune_run *pr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(struct prune_run *pr, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!pr->warn)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pr->warn(pr->ud, msg);
}

static int item_cmp(const void *pa, const void *pb)
{
	const struct prune_item *a = pa, *b = pb;

	if (a->rc.step != b->rc.step)
		return a->rc.step < b->rc.step ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* What a pass works on, beyond what prune_run says. */
struct scan {
	struct prune_run *pr;
	int rootfd;          /* local */
	char **pins;
	size_t cap;
	struct tomb {        /* S3: checkpoints a removal left as a tombstone */
		char *name;
		char etag[STORE_ETAG_LEN]; /* the tombstone's, as scanned */
	} *tomb;
	size_t n_tomb;
	int res;
};

static int scan_add(struct scan *S, struct prune_item *c)
{
	struct prune_run *pr = S->pr;

	if (pr->only_uid != STORE_NO_OWNER && c->uid != pr->only_uid) {
		free(c->name);
		pr->others++;
		return 0; /* another user's: not this pass's */
	}
	if (pr->n == S->cap) {
		size_t cap = S->cap ? 2 * S->cap : 64;
		struct prune_item *nv = realloc(pr->v, cap * sizeof(*nv));

		if (!nv) {
			free(c->name);
			return -ENOMEM;
		}
		pr->v = nv;
		S->cap = cap;
	}
	c->rc.pinned = prune_pinned(S->pins, c->name);
	pr->v[pr->n++] = *c;
	return 0;
}

/* The local candidates: directories directly in the root. */
static int scan_local(struct scan *S)
{
	struct prune_run *pr = S->pr;
	int fd = dup(S->rootfd);
	struct dirent *de;
	char err[512];
	DIR *d;
	int r = 0;

	if (fd < 0 || !(d = fdopendir(fd))) {
		r = -errno;
		snprintf(pr->err, sizeof(pr->err), "reading root '%s': %s", pr->root, strerror(-r));
		if (fd >= 0)
			close(fd);
		return r;
	}
	rewinddir(d);
	while ((errno = 0, de = readdir(d))) {
		struct prune_item c;

		/* Hidden entries (work areas, the trash, the pin list) are
		 * never candidates. */
		if (de->d_name[0] == '.')
			continue;
		if (pr->cancel && *pr->cancel) {
			snprintf(pr->err, sizeof(pr->err), "cancelled");
			r = -ECANCELED;
			break;
		}
		if (pr->only_uid != STORE_NO_OWNER) {
			struct stat st;

			/* Another user's entry is not read at all (its manifest
			 * could be made huge to cost this pass). */
			if (fstatat(S->rootfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISDIR(st.st_mode) && st.st_uid != pr->only_uid) {
				pr->others++;
				continue;
			}
		}
		r = read_local_max(S->rootfd, de->d_name, pr->policy, &c,
				   pr->manifest_max ? pr->manifest_max : PRUNE_MANIFEST_MAX, err,
				   sizeof(err));
		if (r == -ENOMEM)
			break;
		if (r < 0) {
			/* The plan is made without it: it only keeps more,
			 * but the caller learns the scan was partial. */
			warn(pr, "'%s' is not a candidate (never removed): %s", de->d_name, err);
			pr->skipped++;
			r = 0;
			continue;
		}
		if (r == 0)
			continue;
		/* In use: a reader holds its lease (remove.h). */
		c.rc.in_use = store_lease_busy(S->rootfd, c.name) == 1;
		r = scan_add(S, &c);
		if (r < 0)
			break;
	}
	if (r == 0 && errno) {
		r = -errno;
		snprintf(pr->err, sizeof(pr->err), "reading root '%s': %s", pr->root, strerror(-r));
	} else if (r == -ECANCELED) {
		/* (said) */
	} else if (r == -ENOMEM) {
		snprintf(pr->err, sizeof(pr->err), "out of memory");
	}
	closedir(d);
	return r < 0 ? r : 0;
}

static int s3_child(void *ud, const char *name, enum store_entry kind)
{
	struct scan *S = ud;
	struct prune_run *pr = S->pr;
	char url[PRUNE_URL_MAX], err[512], *text = NULL, etag[STORE_ETAG_LEN];
	size_t len = 0;
	struct prune_item c;
	int r;

	if (kind != STORE_ENTRY_CHECKPOINT || name[0] == '.')
		return 0;
	if (pr->cancel && *pr->cancel) {
		snprintf(pr->err, sizeof(pr->err), "cancelled");
		return S->res = -ECANCELED;
	}
	join(url, sizeof(url), pr->root, name);
	r = store_s3_get_etag(url, MANIFEST_FILE,
			      pr->manifest_max ? pr->manifest_max : PRUNE_MANIFEST_MAX, &text, &len,
			      etag, err, sizeof(err));
	if (r == -ENOENT)
		return 0; /* gone since the listing */
	if (r < 0) {
		/* S3 unreachable or denied: no plan on half a view. */
		snprintf(pr->err, sizeof(pr->err), "'%.400s': %s", url, err);
		return S->res = r;
	}
	if (store_is_tombstone(text, len)) {
		struct tomb *nv = realloc(S->tomb, (S->n_tomb + 1) * sizeof(*nv));

		free(text);
		if (nv)
			S->tomb = nv;
		if (!nv || !(nv[S->n_tomb].name = strdup(name)))
			return S->res = -ENOMEM;
		snprintf(nv[S->n_tomb].etag, sizeof(nv[S->n_tomb].etag), "%s", etag);
		S->n_tomb++;
		return 0;
	}
	r = cand_from_text(name, text, len, pr->policy, &c, err, sizeof(err));
	free(text);
	if (r == -ENOMEM)
		return S->res = r;
	if (r < 0) {
		warn(pr, "'%s' is not a candidate (never removed): %s", name, err);
		pr->skipped++;
		return 0;
	}
	snprintf(c.etag, sizeof(c.etag), "%s", etag);
	r = scan_add(S, &c);
	return r < 0 ? (S->res = r) : 0;
}

static int scan_s3(struct scan *S)
{
	struct prune_run *pr = S->pr;
	int r = store_s3.list(pr->root, "", s3_child, S);

	if (S->res == -ENOMEM || r == -ENOMEM) {
		snprintf(pr->err, sizeof(pr->err), "out of memory");
		return -ENOMEM;
	}
	if (S->res)
		return S->res; /* pr->err says */
	if (r < 0) {
		snprintf(pr->err, sizeof(pr->err), "listing '%s': %s", pr->root, strerror(-r));
		return r;
	}
	return 0;
}

int prune_pin_recheck(void *ud, char *why, size_t whylen)
{
	struct prune_recheck *c = ud;
	char err[256];
	char **pins;
	int r;

	pins = prune_read_pins(-1, c->root, &r, err, sizeof(err));
	if (!pins) {
		/* Cannot tell: kept, the safe answer. */
		c->failed = true;
		snprintf(why, whylen, "the pin list could not be read again (%.100s)",
			 r == -EBADMSG ? "it holds a NUL byte" : err);
		return 1;
	}
	c->pinned = prune_pinned(pins, c->name);
	prune_pins_free(pins);
	if (c->pinned)
		snprintf(why, whylen, "pinned since the plan was made");
	return c->pinned;
}

/* Removes what the plan removes. */
static void remove_planned(struct scan *S)
{
	struct prune_run *pr = S->pr;
	struct store_rm_target *t = calloc(pr->n ? pr->n : 1, sizeof(*t));
	struct store_rm_result *res = calloc(pr->n ? pr->n : 1, sizeof(*res));
	size_t *at = calloc(pr->n ? pr->n : 1, sizeof(*at)), k = 0;

	if (!t || !res || !at) {
		for (size_t i = 0; i < pr->n; i++) {
			if (!pr->v[i].keep) {
				pr->v[i].res = -ENOMEM;
				pr->failed++;
			}
		}
		goto out;
	}
	for (size_t i = 0; i < pr->n; i++)
		res[i].res = -ECANCELED; /* until a removal says otherwise */
	for (size_t i = 0; i < pr->n; i++) {
		if (pr->v[i].keep)
			continue;
		t[k].name = pr->v[i].name;
		t[k].dev = pr->v[i].dev;
		t[k].ino = pr->v[i].ino;
		at[k++] = i;
	}
	if (S->rootfd >= 0) {
		/* In batches, so that a cancel is heard between them. */
		for (size_t at0 = 0; at0 < k; at0 += 64) {
			size_t m = k - at0 < 64 ? k - at0 : 64;

			if (pr->cancel && *pr->cancel)
				break; /* the rest stay "not reached" */
			(void)store_local_remove(S->rootfd, t + at0, m, pr->remover, res + at0);
		}
	} else {
		for (size_t i = 0; i < k; i++) {
			if (pr->cancel && *pr->cancel) {
				res[i].res = -ECANCELED;
				snprintf(res[i].err, sizeof(res[i].err), "cancelled");
				continue;
			}
			char url[PRUNE_URL_MAX];
			struct prune_recheck rc = { .root = pr->root, .name = t[i].name };

			join(url, sizeof(url), pr->root, t[i].name);
			/* Pins are looked at again once the checkpoint is
			 * tombstoned: a pin written since the plan keeps it. */
			res[i].res = store_s3_remove(url, "prune", pr->v[at[i]].etag,
						     prune_pin_recheck, &rc, res[i].err,
						     sizeof(res[i].err));
			if (res[i].res == 0 && res[i].err[0])
				/* Removed, with what is nested in it left. */
				warn(pr, "'%s' removed; %s", url, res[i].err);
			if (res[i].res == -EBUSY && rc.pinned)
				pr->v[at[i]].keep |= RET_PINNED;
			else if (res[i].res == -EBUSY && rc.failed)
				res[i].res = -EIO;
			else
				res[i].in_use = res[i].res == -EBUSY; /* a reader's lease */
		}
	}
	for (size_t i = 0; i < k; i++) {
		struct prune_item *c = &pr->v[at[i]];

		c->res = res[i].res;
		if (c->res == 0) {
			pr->removed++;
			continue;
		}
		c->why = strdup(res[i].err);
		if (S->rootfd < 0 && (c->res == -EINPROGRESS || c->res == -ENOENT)) {
			/* Another removal has it, or is done with it. */
			c->res = -EINPROGRESS;
			pr->taken++;
		} else if (res[i].in_use)
			pr->busy++; /* kept, and rightly so */
		else if (c->keep || c->res == -ESTALE || c->res == -ECANCELED)
			pr->kept_late++; /* pinned or changed since the plan, or not reached */
		else
			pr->failed++;
	}
out:
	free(t);
	free(res);
	free(at);
}

void prune_run_free(struct prune_run *pr)
{
	for (size_t i = 0; i < pr->n; i++) {
		free(pr->v[i].name);
		free(pr->v[i].why);
	}
	free(pr->v);
	pr->v = NULL;
	pr->n = 0;
}

int prune_run(struct prune_run *pr)
{
	struct scan S = { .pr = pr, .rootfd = -1 };
	struct ret_ckpt *rc = NULL;
	uint32_t *keep = NULL, *gkeep = NULL;
	bool s3 = s3_is_url(pr->root);
	char err[512];
	int r;

	pr->v = NULL;
	pr->n = pr->skipped = pr->others = pr->planned = pr->removed = pr->busy = pr->failed = 0;
	pr->kept_late = pr->taken = 0;
	pr->finished = 0;
	pr->plan_res = 0;
	pr->err[0] = '\0';
	if (!s3) {
		S.rootfd = pr->dirfd_set ? fcntl(pr->dirfd, F_DUPFD_CLOEXEC, 0) :
					   open(pr->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (S.rootfd < 0) {
			r = -errno;
			snprintf(pr->err, sizeof(pr->err), "cannot open root '%s': %s", pr->root,
				 strerror(-r));
			return r;
		}
		if (pr->lock_root && flock(S.rootfd, LOCK_EX | LOCK_NB) < 0) {
			r = errno == EWOULDBLOCK ? -EAGAIN : -errno;
			snprintf(pr->err, sizeof(pr->err), "root '%s' is locked: another prune or pin "
				 "of it is running", pr->root);
			goto out;
		}
	}
	S.pins = prune_read_pins(S.rootfd, s3 ? pr->root : NULL, &r, err, sizeof(err));
	if (!S.pins) {
		snprintf(pr->err, sizeof(pr->err), "reading %.400s/%s: %s", pr->root, PRUNE_PINS_FILE,
			 r == -EBADMSG ? "it holds a NUL byte" : err);
		goto out;
	}
	/* First, removals a crash cut short: not checkpoints any more, only
	 * space to give back. */
	if (!pr->dry_run && !s3) {
		size_t problems = 0;

		pr->finished = store_local_trash_sweep(S.rootfd, pr->remover, pr->warn, pr->ud,
						       &problems);
		if (pr->finished < 0) {
			r = (int)pr->finished;
			pr->finished = 0;
			snprintf(pr->err, sizeof(pr->err), "reading root '%.400s': %s", pr->root,
				 strerror(-r));
			goto out;
		}
		/* A trash directory that cannot be finished is reported and
		 * left: it must not stop the prune. */
		pr->skipped += problems;
	}
	r = s3 ? scan_s3(&S) : scan_local(&S);
	if (r < 0)
		goto out;
	for (size_t i = 0; !pr->dry_run && i < S.n_tomb; i++) {
		char url[PRUNE_URL_MAX];

		struct prune_recheck again = { .root = pr->root, .name = S.tomb[i].name };

		join(url, sizeof(url), pr->root, S.tomb[i].name);
		/* Only the tombstone scanned (a manifest put back since, or
		 * committed again, stays), and with the pins looked at again:
		 * a removal finished is one decided again. */
		r = store_s3_remove(url, "prune", S.tomb[i].etag, prune_pin_recheck, &again, err,
				    sizeof(err));
		if (r == -EBUSY) {
			/* A reader's lease or a pin: its manifest is back. */
			warn(pr, "'%s', whose removal was cut short, is kept: %s", url, err);
			continue;
		}
		if (r == -ESTALE || r == -ENOENT || r == -EINPROGRESS)
			continue; /* changed, gone or taken since the scan: not ours now */
		if (r < 0) {
			/* Reported; the rest of the root is pruned all the same. */
			warn(pr, "finishing the removal of '%s': %s", url, err);
			pr->skipped++;
			continue;
		}
		if (err[0])
			warn(pr, "finished the removal of '%s'; %s", url, err);
		pr->finished++;
	}
	qsort(pr->v, pr->n, sizeof(*pr->v), item_cmp);
	for (size_t i = 0; S.pins[i]; i++) {
		bool found = false;

		for (size_t k = 0; k < pr->n && !found; k++)
			found = !strcmp(pr->v[k].name, S.pins[i]);
		if (!found && pr->only_uid == STORE_NO_OWNER)
			warn(pr, "%s names '%s', which is not a committed checkpoint in the root",
			     PRUNE_PINS_FILE, S.pins[i]);
	}
	rc = calloc(pr->n ? pr->n : 1, sizeof(*rc));
	keep = calloc(pr->n ? pr->n : 1, sizeof(*keep));
	gkeep = calloc(pr->n ? pr->n : 1, sizeof(*gkeep));
	if (!rc || !keep || !gkeep) {
		r = -ENOMEM;
		snprintf(pr->err, sizeof(pr->err), "out of memory");
		goto out;
	}
	/* One plan per owner (the items are grouped by uid: a stable pass
	 * over the sorted list per distinct uid). */
	pr->planned = 0;
	for (size_t i = 0; i < pr->n; i++) {
		size_t m = 0, removed = 0;
		uid_t u = pr->v[i].uid;
		bool first = true;
		char e[512];

		for (size_t k = 0; k < i && first; k++)
			first = pr->v[k].uid != u;
		if (!first)
			continue;
		for (size_t k = i; k < pr->n; k++)
			if (pr->v[k].uid == u)
				rc[m++] = pr->v[k].rc;
		r = ret_plan(rc, m, pr->policy, pr->force, gkeep, &removed, e, sizeof(e));
		if (r < 0 && r != -EPERM) {
			snprintf(pr->err, sizeof(pr->err), "%s", e);
			goto out;
		}
		for (size_t k = i, g = 0; k < pr->n; k++)
			if (pr->v[k].uid == u)
				keep[k] = gkeep[g++];
		pr->planned += removed;
		if (r == -EPERM && !pr->plan_res) {
			pr->plan_res = r;
			if (u == STORE_NO_OWNER)
				snprintf(pr->err, sizeof(pr->err), "%s", e);
			else
				snprintf(pr->err, sizeof(pr->err), "uid %u's checkpoints: %s",
					 (unsigned)u, e);
		}
	}
	r = pr->plan_res;
	/* A user prunes only their own checkpoints: a plan that would remove
	 * another's is refused whole, before anything goes. */
	for (size_t i = 0; i < pr->n; i++) {
		struct prune_item *c = &pr->v[i];

		c->keep = keep[i];
		if (!keep[i] && pr->remover != STORE_NO_OWNER && pr->remover != 0 &&
		    c->uid != STORE_NO_OWNER && c->uid != pr->remover && !pr->plan_res) {
			pr->plan_res = -EPERM;
			snprintf(pr->err, sizeof(pr->err),
				 "'%s' belongs to uid %u, not to uid %u: a user prunes only their "
				 "own checkpoints", c->name, (unsigned)c->uid, (unsigned)pr->remover);
		}
	}
	if (!pr->plan_res && !pr->dry_run && pr->planned)
		remove_planned(&S);
	r = 0;
out:
	free(rc);
	free(keep);
	free(gkeep);
	prune_pins_free(S.pins);
	for (size_t i = 0; i < S.n_tomb; i++)
		free(S.tomb[i].name);
	free(S.tomb);
	if (S.rootfd >= 0)
		close(S.rootfd); /* (drops the lock) */
	return r;
}
