/* SPDX-License-Identifier: MIT */
/*
 * prune.c - ckptctl prune: the retention plan of one root (format/retention.h)
 * for the committed checkpoints directly in it, shown as a KEEP/REMOVE
 * table with the reasons.  This step previews (--dry-run); removing is the
 * next step of the retention work.
 *
 * Candidates are the directories directly in ROOT that hold a manifest.json
 * that parses; a work area, an incomplete or a corrupt checkpoint is never
 * a candidate (nor removed): it is reported on stderr.  Pins are the names
 * in ROOT/.ckpt-pins, one per line ('#' starts a comment).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "format/index.h"
#include "format/names.h"
#include "format/retention.h"
#include "store/fsutil.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

#define PRUNE_MANIFEST_MAX (1024ull << 20)
#define PRUNE_PINS_MAX     (1u << 20)
#define PINS_FILE          ".ckpt-pins"
#define PRUNE_URL_MAX      (PATH_MAX + S3_KEY_MAX + 8) /* a root and a name */

struct cand {
	char *name;         /* as on disk */
	char *shown;        /* fit to print (ctl_display) */
	char time[40];
	struct ret_ckpt rc;
	uint32_t keep;
	uid_t uid;          /* the directory's owner (STORE_NO_OWNER on S3) */
	int res;            /* the removal's outcome (0 removed) */
	char *why;          /* its error, or NULL */
};

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

/* The names of a pin list's text (consumed), as a NULL-terminated array
 * (empty if none); NULL with *ret_err on failure. */
static char **parse_pins(char *text, size_t len, int *ret_err)
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

/* Names pinned in ROOT/.ckpt-pins (see parse_pins). */
static char **read_pins(int rootfd, int *ret_err)
{
	char *text = NULL;
	size_t len = 0;
	int r = fs_read_file_at(rootfd, PINS_FILE, PRUNE_PINS_MAX, &text, &len);

	if (r == -ENOENT)
		return parse_pins(NULL, 0, ret_err);
	if (r < 0) {
		*ret_err = r;
		return NULL;
	}
	return parse_pins(text, len, ret_err);
}

static void pins_free(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

static bool pinned(char **pins, const char *name)
{
	for (size_t i = 0; pins && pins[i]; i++)
		if (!strcmp(pins[i], name))
			return true;
	return false;
}

/* Fills c from checkpoint `name`'s manifest text: 1, or < 0 corrupt
 * (reason in err). */
static int cand_from_text(const char *name, char *text, size_t len, const struct ret_policy *p,
			  struct cand *c, char *err, size_t errlen)
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
	c->shown = ctl_display(name);
	if (!c->name || !c->shown) {
		free(c->name);
		free(c->shown);
		manifest_free(&m);
		return -ENOMEM;
	}
	c->rc.name = c->name;
	c->rc.step = m.step;
	if (!parse_time(m.time, &c->rc.time_s)) {
		snprintf(err, errlen, "its manifest's time '%.40s' is not YYYY-MM-DDTHH:MM:SSZ",
			 m.time);
		free(c->name);
		free(c->shown);
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
static int read_cand(int rootfd, const char *name, const struct ret_policy *p, struct cand *c,
		     char *err, size_t errlen)
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
	r = fs_read_file_at(rootfd, rel, PRUNE_MANIFEST_MAX, &text, &len);
	if (r == -ENOENT || r == -ENOTDIR)
		return 0;
	if (r < 0) {
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	r = cand_from_text(name, text, len, p, c, err, errlen);
	free(text);
	if (r > 0)
		c->uid = st.st_uid;
	return r;
}

static int cand_cmp(const void *pa, const void *pb)
{
	const struct cand *a = pa, *b = pb;

	if (a->rc.step != b->rc.step)
		return a->rc.step < b->rc.step ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* One JSON line; o is consumed.  0, or -ENOMEM (said on stderr). */
static int emit(json_t *o)
{
	int r = o ? ctl_json_line(o) : -ENOMEM;

	json_decref(o);
	if (r < 0)
		ctl_err("prune: out of memory");
	return r;
}

/* The policy in words, for the heading. */
static void policy_text(const struct ret_policy *p, char *buf, size_t len)
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

/*
 * ckptctl pin|unpin ROOT NAME: adds NAME to (or removes it from) the pin
 * list.  The list is read, changed and written whole (a new file renamed
 * over the old, then the root fsynced) under an exclusive lock on the
 * root, so two pins at once both land and a crash leaves the old list or
 * the new, never half of one.  Only a committed checkpoint directly in
 * ROOT can be pinned; unpinning what is not pinned is an error.
 */
int ctl_pin(const char *root, const char *name, bool pin)
{
	char err[512], **pins = NULL, *text = NULL;
	struct cand c;
	bool have = false;
	size_t len = 0;
	int rootfd, r, ret = CTL_EXIT_ERROR;
	FILE *f;

	if (!name_checkpoint_ok(name, err, sizeof(err))) {
		ctl_err("%s: %s", pin ? "pin" : "unpin", err);
		return CTL_EXIT_USAGE;
	}
	if (s3_is_url(root)) {
		ctl_err("%s: S3 roots are not supported yet: '%s'", pin ? "pin" : "unpin", root);
		return CTL_EXIT_ERROR;
	}
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		ctl_err("%s: cannot open root '%s': %s", pin ? "pin" : "unpin", root,
			strerror(errno));
		return CTL_EXIT_ERROR;
	}
	if (flock(rootfd, LOCK_EX) < 0) {
		ctl_err("%s: cannot lock root '%s': %s", pin ? "pin" : "unpin", root,
			strerror(errno));
		goto out;
	}
	pins = read_pins(rootfd, &r);
	if (!pins) {
		ctl_err("%s: reading %s/%s: %s", pin ? "pin" : "unpin", root, PINS_FILE,
			r == -EBADMSG ? "it holds a NUL byte" : strerror(-r));
		goto out;
	}
	have = pinned(pins, name);
	if (pin) {
		struct ret_policy none;

		memset(&none, 0, sizeof(none));
		r = read_cand(rootfd, name, &none, &c, err, sizeof(err));
		if (r <= 0) {
			ctl_err("pin: '%s' in '%s' is not a committed checkpoint%s%s", name, root,
				r < 0 ? ": " : "", r < 0 ? err : "");
			goto out;
		}
		free(c.name);
		free(c.shown);
		if (have) {
			printf("%s is pinned already\n", name);
			ret = 0;
			goto out;
		}
	} else if (!have) {
		ctl_err("unpin: '%s' is not in %s/%s", name, root, PINS_FILE);
		goto out;
	}
	/* The whole list, written through a temporary name and renamed over
	 * the old (fs_write_file_at), then the root synced for the rename. */
	f = open_memstream(&text, &len);
	if (!f) {
		ctl_err("%s: out of memory", pin ? "pin" : "unpin");
		goto out;
	}
	fprintf(f, "# checkpoints kept whatever the retention policy (ckptctl pin/unpin)\n");
	for (size_t i = 0; pins[i]; i++)
		if (strcmp(pins[i], name))
			fprintf(f, "%s\n", pins[i]);
	if (pin)
		fprintf(f, "%s\n", name);
	if (fclose(f) != 0) {
		ctl_err("%s: out of memory", pin ? "pin" : "unpin");
		goto out;
	}
	r = fs_write_file_at(rootfd, PINS_FILE, text, len, FS_ATOMIC);
	if (r == 0 && fsync(rootfd) < 0)
		r = -errno;
	if (r < 0) {
		ctl_err("%s: writing %s/%s: %s", pin ? "pin" : "unpin", root, PINS_FILE,
			strerror(-r));
		goto out;
	}
	printf("%s %s\n", pin ? "pinned" : "unpinned", name);
	ret = 0;
out:
	free(text);
	pins_free(pins);
	close(rootfd); /* (drops the lock) */
	return ret;
}

/* What a prune works on: the candidates of one root. */
struct scan {
	const char *root;
	bool s3;
	int rootfd;          /* local */
	char **pins;
	struct cand *v;
	size_t n, cap;
	size_t skipped;      /* unreadable or corrupt: left out */
	char **tomb;         /* S3: checkpoints a removal left as a tombstone */
	size_t n_tomb;
};

static void scan_free(struct scan *S)
{
	for (size_t i = 0; i < S->n; i++) {
		free(S->v[i].name);
		free(S->v[i].shown);
		free(S->v[i].why);
	}
	free(S->v);
	for (size_t i = 0; i < S->n_tomb; i++)
		free(S->tomb[i]);
	free(S->tomb);
	pins_free(S->pins);
}

static int scan_add(struct scan *S, struct cand *c)
{
	if (S->n == S->cap) {
		size_t cap = S->cap ? 2 * S->cap : 64;
		struct cand *nv = realloc(S->v, cap * sizeof(*nv));

		if (!nv) {
			free(c->name);
			free(c->shown);
			return -ENOMEM;
		}
		S->v = nv;
		S->cap = cap;
	}
	c->rc.pinned = pinned(S->pins, c->name);
	S->v[S->n++] = *c;
	return 0;
}

/* The local candidates: directories directly in the root. */
static int scan_local(struct scan *S, const struct ret_policy *p)
{
	int fd = dup(S->rootfd);
	struct dirent *de;
	char err[512];
	DIR *d;
	int r = 0;

	if (fd < 0 || !(d = fdopendir(fd))) {
		ctl_err("prune: reading root '%s': %s", S->root, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	rewinddir(d);
	while ((errno = 0, de = readdir(d))) {
		struct cand c;

		/* Hidden entries (work areas, the trash, the pin list) are
		 * never candidates. */
		if (de->d_name[0] == '.')
			continue;
		r = read_cand(S->rootfd, de->d_name, p, &c, err, sizeof(err));
		if (r == -ENOMEM)
			break;
		if (r < 0) {
			/* (ctl_err shows control bytes as '?'.)  The plan is
			 * made without it: it only keeps more, but the exit
			 * status says the scan was partial. */
			ctl_err("prune: '%s' is not a candidate (never removed): %s", de->d_name, err);
			S->skipped++;
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
		ctl_err("prune: reading root '%s': %s", S->root, strerror(errno));
		r = -1;
	} else if (r == -ENOMEM) {
		ctl_err("prune: out of memory");
	}
	closedir(d);
	return r < 0 ? -1 : 0;
}

struct s3_scan {
	struct scan *S;
	const struct ret_policy *p;
	int res;
};

static int s3_child(void *ud, const char *name, enum store_entry kind)
{
	struct s3_scan *x = ud;
	struct scan *S = x->S;
	char url[PRUNE_URL_MAX], err[512], *text = NULL;
	size_t len = 0;
	struct cand c;
	int r;

	if (kind != STORE_ENTRY_CHECKPOINT || name[0] == '.')
		return 0;
	snprintf(url, sizeof(url), "%s/%s", S->root, name);
	r = store_s3_get(url, MANIFEST_FILE, PRUNE_MANIFEST_MAX, &text, &len, err, sizeof(err));
	if (r == -ENOENT)
		return 0; /* gone since the listing */
	if (r < 0) {
		ctl_err("prune: '%s': %s", url, err);
		x->res = r;
		return r; /* S3 unreachable or denied: no plan on half a view */
	}
	if (store_is_tombstone(text, len)) {
		char **nv = realloc(S->tomb, (S->n_tomb + 1) * sizeof(*nv));

		free(text);
		if (!nv || !(nv[S->n_tomb] = strdup(name))) {
			if (nv)
				S->tomb = nv;
			return x->res = -ENOMEM;
		}
		S->tomb = nv;
		S->n_tomb++;
		return 0;
	}
	r = cand_from_text(name, text, len, x->p, &c, err, sizeof(err));
	free(text);
	if (r == -ENOMEM)
		return x->res = r;
	if (r < 0) {
		ctl_err("prune: '%s' is not a candidate (never removed): %s", name, err);
		S->skipped++;
		return 0;
	}
	r = scan_add(S, &c);
	return r < 0 ? (x->res = r) : 0;
}

static int scan_s3(struct scan *S, const struct ret_policy *p)
{
	struct s3_scan x = { S, p, 0 };
	int r = store_s3.list(S->root, "", s3_child, &x);

	if (x.res == -ENOMEM || r == -ENOMEM) {
		ctl_err("prune: out of memory");
		return -1;
	}
	if (x.res)
		return -1; /* said */
	if (r < 0) {
		ctl_err("prune: listing '%s': %s", S->root, strerror(-r));
		return -1;
	}
	return 0;
}

/* S3 pins: the object ROOT/.ckpt-pins (see parse_pins). */
static char **read_pins_s3(const char *root, int *ret_err)
{
	char *text = NULL, err[512];
	size_t len = 0;
	int r = store_s3_get(root, PINS_FILE, PRUNE_PINS_MAX, &text, &len, err, sizeof(err));

	if (r == -ENOENT)
		return parse_pins(NULL, 0, ret_err);
	if (r < 0) {
		ctl_err("prune: reading %s/%s: %s", root, PINS_FILE, err);
		*ret_err = -EIO; /* (said) */
		return NULL;
	}
	return parse_pins(text, len, ret_err);
}

/* Removes the checkpoints the plan removes.  Returns how many failed. */
static size_t remove_planned(struct scan *S, bool json)
{
	size_t failed = 0, k = 0;
	const char **names = calloc(S->n ? S->n : 1, sizeof(*names));
	struct store_rm_result *res = calloc(S->n ? S->n : 1, sizeof(*res));
	size_t *at = calloc(S->n ? S->n : 1, sizeof(*at));

	(void)json;
	if (!names || !res || !at) {
		ctl_err("prune: out of memory");
		free(names);
		free(res);
		free(at);
		for (size_t i = 0; i < S->n; i++)
			if (!S->v[i].keep)
				S->v[i].res = -ENOMEM;
		return S->n;
	}
	for (size_t i = 0; i < S->n; i++) {
		if (S->v[i].keep)
			continue;
		names[k] = S->v[i].name;
		at[k++] = i;
	}
	if (!S->s3) {
		(void)store_local_remove(S->rootfd, names, k, geteuid(), res);
	} else {
		for (size_t i = 0; i < k; i++) {
			char url[PRUNE_URL_MAX];

			snprintf(url, sizeof(url), "%s/%s", S->root, names[i]);
			res[i].res = store_s3_remove(url, "ckptctl prune", res[i].err,
						     sizeof(res[i].err));
		}
	}
	for (size_t i = 0; i < k; i++) {
		struct cand *c = &S->v[at[i]];

		c->res = res[i].res;
		if (c->res < 0) {
			c->why = strdup(res[i].err);
			if (c->res != -EBUSY)
				failed++;
		}
	}
	free(names);
	free(res);
	free(at);
	return failed;
}

int ctl_prune(const char *root, const struct ret_policy *p, bool force, bool dry_run, bool json)
{
	struct scan S = { .root = root, .s3 = s3_is_url(root), .rootfd = -1 };
	struct ret_ckpt *rc = NULL;
	uint32_t *keep = NULL;
	size_t removed = 0, width = 4, failed = 0, busy = 0, done = 0, foreign = 0;
	char err[512] = "", pol[512], *shown_root = NULL;
	long swept = 0;
	int r, ret = CTL_EXIT_ERROR;

	shown_root = ctl_display(root);
	if (!shown_root) {
		ctl_err("prune: out of memory");
		return CTL_EXIT_ERROR;
	}
	if (S.s3) {
		struct store_s3_settings set = { .retries = 3, .connect_timeout_ms = 5000 };

		r = store_s3_start_settings(&set, err, sizeof(err));
		if (r < 0) {
			ctl_err("prune: '%s': cannot set up S3: %s", root, err);
			goto out;
		}
		S.pins = read_pins_s3(root, &r);
	} else {
		S.rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (S.rootfd < 0) {
			ctl_err("prune: cannot open root '%s': %s", root, strerror(errno));
			goto out;
		}
		/* One prune (or pin) of a root at a time; a dry run only
		 * reads. */
		if (!dry_run && flock(S.rootfd, LOCK_EX | LOCK_NB) < 0) {
			ctl_err("prune: root '%s' is locked: another prune or pin of it is running",
				root);
			goto out;
		}
		S.pins = read_pins(S.rootfd, &r);
	}
	if (!S.pins) {
		if (r != -EIO || !S.s3)
			ctl_err("prune: reading %s/%s: %s", root, PINS_FILE,
				r == -EBADMSG ? "it holds a NUL byte" : strerror(r ? -r : ENOMEM));
		goto out;
	}
	/* First, removals a crash cut short: they are not checkpoints any
	 * more, only space to give back. */
	if (!dry_run && !S.s3) {
		swept = store_local_trash_sweep(S.rootfd, geteuid(), err, sizeof(err));
		if (swept < 0) {
			ctl_err("prune: finishing an earlier removal in '%s': %s", root, err);
			goto out;
		}
	}
	if ((S.s3 ? scan_s3(&S, p) : scan_local(&S, p)) < 0)
		goto out;
	if (!dry_run && S.s3) {
		for (size_t i = 0; i < S.n_tomb; i++) {
			char url[PRUNE_URL_MAX];

			snprintf(url, sizeof(url), "%s/%s", root, S.tomb[i]);
			r = store_s3_remove(url, "ckptctl prune", err, sizeof(err));
			if (r < 0 && r != -ENOENT) {
				ctl_err("prune: finishing the removal of '%s': %s", url, err);
				goto out;
			}
			swept++;
		}
	}
	qsort(S.v, S.n, sizeof(*S.v), cand_cmp);
	for (size_t i = 0; S.pins[i]; i++) {
		bool found = false;
		for (size_t k = 0; k < S.n && !found; k++)
			found = !strcmp(S.v[k].name, S.pins[i]);
		if (!found)
			ctl_err("prune: %s names '%s', which is not a committed checkpoint in the root",
				PINS_FILE, S.pins[i]);
	}
	rc = calloc(S.n ? S.n : 1, sizeof(*rc));
	keep = calloc(S.n ? S.n : 1, sizeof(*keep));
	if (!rc || !keep) {
		ctl_err("prune: out of memory");
		goto out;
	}
	for (size_t i = 0; i < S.n; i++) {
		rc[i] = S.v[i].rc;
		if (strlen(S.v[i].shown) > width)
			width = strlen(S.v[i].shown);
	}
	r = ret_plan(rc, S.n, p, force, keep, &removed, err, sizeof(err));
	if (r < 0 && r != -EPERM) {
		ctl_err("prune: %s", err);
		goto out;
	}
	/* A user prunes only their own checkpoints: a plan that would remove
	 * another's is refused whole, before anything goes. */
	for (size_t i = 0; i < S.n; i++) {
		S.v[i].keep = keep[i];
		if (!keep[i] && S.v[i].uid != STORE_NO_OWNER && geteuid() != 0 &&
		    S.v[i].uid != geteuid()) {
			if (!foreign++)
				snprintf(err, sizeof(err),
					 "'%s' belongs to uid %u, not to you (uid %u): a user "
					 "prunes only their own checkpoints", S.v[i].shown,
					 (unsigned)S.v[i].uid, (unsigned)geteuid());
		}
	}
	if (foreign)
		r = -EPERM;
	if (r == 0 && !dry_run && removed)
		failed = remove_planned(&S, json);
	policy_text(p, pol, sizeof(pol));
	if (!json) {
		printf("root %s\npolicy: %s\n\n", shown_root, pol);
		printf("%-7s  %-*s  %10s  %-20s  %s\n", "ACTION", (int)width, "NAME", "STEP", "TIME",
		       "KEPT FOR");
	}
	for (size_t i = 0; i < S.n; i++) {
		const struct cand *c = &S.v[i];
		const char *act;
		char why[128];

		ret_reasons(keep[i], why, sizeof(why));
		if (keep[i])
			act = "keep";
		else if (dry_run || r < 0)
			act = "remove";
		else if (c->res == 0)
			act = "removed", done++;
		else if (c->res == -EBUSY)
			act = "in_use", busy++;
		else
			act = "failed";
		if (json) {
			json_t *reasons = json_array(), *o;
			char *save = NULL;

			for (char *t = strtok_r(why, ",", &save); reasons && t;
			     t = strtok_r(NULL, ",", &save))
				json_array_append_new(reasons, json_string(t));
			o = reasons ? json_pack("{s:s, s:I, s:s, s:s, s:o}", "name", c->shown, "step",
						(json_int_t)c->rc.step, "time", c->time, "action",
						act, "reasons", reasons) : NULL;
			if (o && c->why)
				json_object_set_new(o, "error", json_string(c->why));
			if (emit(o) < 0)
				goto out;
		} else {
			char up[8];

			for (size_t k = 0; k < sizeof(up) - 1; k++)
				up[k] = (char)(act[k] == '_' ? ' ' : toupper((unsigned char)act[k]));
			up[sizeof(up) - 1] = '\0';
			printf("%-7s  %-*s  %10llu  %-20s  %s\n", up, (int)width, c->shown,
			       (unsigned long long)c->rc.step, c->time, keep[i] ? why :
			       c->why ? c->why : "-");
		}
	}
	if (json) {
		json_t *o = json_pack("{s:{s:s, s:s, s:I, s:I, s:I, s:b, s:b, s:s?}}", "summary",
				      "root", shown_root, "policy", pol, "checkpoints",
				      (json_int_t)S.n, "remove", (json_int_t)removed,
				      "not_candidates", (json_int_t)S.skipped, "dry_run", dry_run,
				      "refused", r == -EPERM, "error", r == -EPERM ? err : NULL);
		if (o && !dry_run) {
			json_object_set_new(json_object_get(o, "summary"), "removed",
					    json_integer((json_int_t)done));
			json_object_set_new(json_object_get(o, "summary"), "in_use",
					    json_integer((json_int_t)busy));
			json_object_set_new(json_object_get(o, "summary"), "failed",
					    json_integer((json_int_t)failed));
			json_object_set_new(json_object_get(o, "summary"), "finished_earlier",
					    json_integer(swept));
		}
		if (emit(o) < 0)
			goto out;
	} else if (dry_run || r < 0) {
		printf("\n%zu of %zu checkpoint%s would be removed (%s: nothing was removed)\n",
		       removed, S.n, S.n == 1 ? "" : "s", dry_run ? "dry run" : "refused");
	} else {
		printf("\n%zu of %zu checkpoint%s removed", done, S.n, S.n == 1 ? "" : "s");
		if (busy)
			printf(", %zu kept because in use", busy);
		if (failed)
			printf(", %zu failed", failed);
		if (swept)
			printf("; %ld removal%s a crash had cut short finished", swept,
			       swept == 1 ? "" : "s");
		printf("\n");
	}
	if (r == -EPERM) {
		ctl_err("prune: refused: %s", err);
		ret = CTL_EXIT_REFUSED;
		goto out;
	}
	if (failed) {
		ctl_err("prune: %zu removal%s failed (above); the checkpoints concerned no longer "
			"look committed and the next prune finishes them", failed,
			failed == 1 ? "" : "s");
		goto out;
	}
	ret = S.skipped ? CTL_EXIT_DEGRADED : 0;
	if (S.skipped)
		ctl_err("prune: %zu entr%s of the root could not be read (above): the plan leaves "
			"them out", S.skipped, S.skipped == 1 ? "y" : "ies");
out:
	free(rc);
	free(keep);
	scan_free(&S);
	free(shown_root);
	if (S.rootfd >= 0)
		close(S.rootfd); /* (drops the lock) */
	if (S.s3)
		store_s3_stop();
	return ret;
}
