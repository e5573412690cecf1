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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <jansson.h>
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
#include "store/s3_addr.h"

#define PRUNE_MANIFEST_MAX (1024ull << 20)
#define PRUNE_PINS_MAX     (1u << 20)
#define PINS_FILE          ".ckpt-pins"

struct cand {
	char *name;         /* as on disk */
	char *shown;        /* fit to print (ctl_display) */
	char time[40];
	struct ret_ckpt rc;
	uint32_t keep;
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

/* Names pinned in ROOT/.ckpt-pins (NULL-terminated array; empty if none). */
static char **read_pins(int rootfd, int *ret_err)
{
	char *text = NULL, **v = calloc(1, sizeof(*v)), *save = NULL;
	size_t len = 0, n = 0;
	int r;

	*ret_err = 0;
	if (!v) {
		*ret_err = -ENOMEM;
		return NULL;
	}
	r = fs_read_file_at(rootfd, PINS_FILE, PRUNE_PINS_MAX, &text, &len);
	if (r == -ENOENT)
		return v;
	if (r == 0 && memchr(text, '\0', len))
		r = -EBADMSG; /* (would hide every pin after it) */
	if (r < 0) {
		*ret_err = r;
		free(text);
		free(v);
		return NULL;
	}
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
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
			free(nv ? nv : v);
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

/* Reads checkpoint `name` of root: 1 a candidate (filled in), 0 not a
 * checkpoint (no manifest), < 0 unreadable or corrupt (reason in err). */
static int read_cand(int rootfd, const char *name, const struct ret_policy *p, struct cand *c,
		     char *err, size_t errlen)
{
	char rel[NAME_MAX + sizeof(MANIFEST_FILE) + 2], *text = NULL;
	struct manifest m;
	struct stat st;
	size_t len = 0;
	json_t *metrics, *v;
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
	memset(&m, 0, sizeof(m));
	r = manifest_parse(text, len, &m, err, errlen);
	free(text);
	if (r < 0)
		return r;
	memset(c, 0, sizeof(*c));
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
		 * anything after what strptime read. */
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

int ctl_prune(const char *root, const struct ret_policy *p, bool force, bool dry_run, bool json)
{
	struct cand *v = NULL;
	struct ret_ckpt *rc = NULL;
	uint32_t *keep = NULL;
	size_t n = 0, cap = 0, removed = 0, width = 4, skipped = 0;
	char **pins = NULL, err[512] = "", pol[512], *shown_root = NULL;
	struct dirent *de;
	DIR *d = NULL;
	int rootfd, r, ret = CTL_EXIT_ERROR;

	if (!dry_run) {
		ctl_err("prune: only --dry-run is available in this version");
		return CTL_EXIT_USAGE;
	}
	if (s3_is_url(root)) {
		ctl_err("prune: S3 roots are not supported yet: '%s'", root);
		return CTL_EXIT_ERROR;
	}
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0 || !(d = fdopendir(rootfd))) {
		ctl_err("prune: cannot open root '%s': %s", root, strerror(errno));
		if (rootfd >= 0)
			close(rootfd);
		return CTL_EXIT_ERROR;
	}
	shown_root = ctl_display(root);
	pins = read_pins(rootfd, &r);
	if (!pins || !shown_root) {
		ctl_err("prune: reading %s/%s: %s", root, PINS_FILE,
			r == -EBADMSG ? "it holds a NUL byte" : strerror(r ? -r : ENOMEM));
		goto out;
	}
	while ((errno = 0, de = readdir(d))) {
		struct cand c;

		/* Hidden entries (work areas, the pin list) are never
		 * candidates. */
		if (de->d_name[0] == '.')
			continue;
		r = read_cand(rootfd, de->d_name, p, &c, err, sizeof(err));
		if (r == -ENOMEM) {
			ctl_err("prune: out of memory");
			goto out;
		}
		if (r < 0) {
			/* (ctl_err shows control bytes as '?'.)  The plan is
			 * made without it: it only keeps more, but the exit
			 * status says the scan was partial. */
			ctl_err("prune: '%s' is not a candidate (never removed): %s", de->d_name, err);
			skipped++;
			continue;
		}
		if (r == 0)
			continue;
		if (n == cap) {
			struct cand *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(*v));
			if (!nv) {
				free(c.name);
				free(c.shown);
				ctl_err("prune: out of memory");
				goto out;
			}
			v = nv;
		}
		c.rc.pinned = pinned(pins, c.name);
		v[n++] = c;
	}
	if (errno) {
		ctl_err("prune: reading root '%s': %s", root, strerror(errno));
		goto out;
	}
	qsort(v, n, sizeof(*v), cand_cmp);
	for (size_t i = 0; pins[i]; i++) {
		bool found = false;
		for (size_t k = 0; k < n && !found; k++)
			found = !strcmp(v[k].name, pins[i]);
		if (!found)
			ctl_err("prune: %s names '%s', which is not a committed checkpoint in the root",
				PINS_FILE, pins[i]);
	}
	rc = calloc(n ? n : 1, sizeof(*rc));
	keep = calloc(n ? n : 1, sizeof(*keep));
	if (!rc || !keep) {
		ctl_err("prune: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		rc[i] = v[i].rc;
		if (strlen(v[i].shown) > width)
			width = strlen(v[i].shown);
	}
	r = ret_plan(rc, n, p, force, keep, &removed, err, sizeof(err));
	if (r < 0 && r != -EPERM) {
		ctl_err("prune: %s", err);
		goto out;
	}
	policy_text(p, pol, sizeof(pol));
	if (!json) {
		printf("root %s\npolicy: %s\n\n", shown_root, pol);
		printf("%-6s  %-*s  %10s  %-20s  %s\n", "ACTION", (int)width, "NAME", "STEP", "TIME",
		       "KEPT FOR");
	}
	for (size_t i = 0; i < n; i++) {
		char why[128];

		ret_reasons(keep[i], why, sizeof(why));
		if (json) {
			json_t *reasons = json_array(), *o;
			char *save = NULL;

			for (char *t = strtok_r(why, ",", &save); reasons && t;
			     t = strtok_r(NULL, ",", &save))
				json_array_append_new(reasons, json_string(t));
			o = reasons ? json_pack("{s:s, s:I, s:s, s:s, s:o}", "name", v[i].shown,
						"step", (json_int_t)v[i].rc.step, "time", v[i].time,
						"action", keep[i] ? "keep" : "remove", "reasons",
						reasons) : NULL;
			if (emit(o) < 0)
				goto out;
		} else {
			printf("%-6s  %-*s  %10llu  %-20s  %s\n", keep[i] ? "KEEP" : "REMOVE",
			       (int)width, v[i].shown, (unsigned long long)v[i].rc.step, v[i].time,
			       keep[i] ? why : "-");
		}
	}
	if (json) {
		json_t *o = json_pack("{s:{s:s, s:s, s:I, s:I, s:I, s:b, s:b, s:s?}}", "summary",
				      "root", shown_root, "policy", pol, "checkpoints", (json_int_t)n,
				      "remove", (json_int_t)removed, "not_candidates",
				      (json_int_t)skipped, "dry_run", true, "refused", r == -EPERM,
				      "error", r == -EPERM ? err : NULL);
		if (emit(o) < 0)
			goto out;
	} else {
		printf("\n%zu of %zu checkpoint%s would be removed (dry run: nothing was removed)\n",
		       removed, n, n == 1 ? "" : "s");
	}
	if (r == -EPERM) {
		ctl_err("prune: %s", err);
		ret = CTL_EXIT_REFUSED;
		goto out;
	}
	ret = skipped ? CTL_EXIT_DEGRADED : 0;
	if (skipped)
		ctl_err("prune: %zu entr%s of the root could not be read (above): the plan leaves "
			"them out", skipped, skipped == 1 ? "y" : "ies");
out:
	for (size_t i = 0; i < n; i++) {
		free(v[i].name);
		free(v[i].shown);
	}
	free(v);
	free(rc);
	free(keep);
	pins_free(pins);
	free(shown_root);
	closedir(d);
	return ret;
}
