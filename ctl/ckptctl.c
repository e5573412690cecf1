/* SPDX-License-Identifier: MIT */
/*
 * ckptctl.c - the operator's command: daemon status, and the checkpoints
 * under a root.
 *
 *   ckptctl [-s SOCKET] [-c CONFIG] status [--json]
 *           [--watch [--interval SECONDS] [--count N]]                (status.c)
 *   ckptctl list ROOT [--json]
 *   ckptctl show ROOT/NAME [-v] [--json]
 *   ckptctl wait ROOT NAME|--step N [--timeout SECONDS] [--json]    (wait.c)
 *   ckptctl prune ROOT --dry-run [--force] [--json] RULE...   (prune.c)
 *   ckptctl pin|unpin ROOT NAME                               (prune.c)
 *   ckptctl spill list | spill drop ID|ROOT/NAME              (spill.c)
 *
 * `status` and `spill` ask the running daemon (control role of proto.h); `list`,
 * `show` and `wait` only read the storage, so they work with no daemon at
 * all, on any copy of a root: a directory, or s3://bucket/prefix (read
 * through the S3 backend, store_s3.h, with the credentials and endpoint of
 * the standard AWS_* variables, as ckpt_reader_open() reads S3).
 *
 * --json prints JSON Lines for every command: one compact object per line.
 *
 * Exit status: 0 done, 1 failed (the reason is on stderr), 2 bad usage, 3
 * no daemon answers (status), 4 timed out (wait), 5 done with part of the
 * input unreadable, 6 refused by a safety rule (ctl.h).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl/ctl.h"
#include "daemon/config.h"
#include "format/index.h"
#include "store/fsutil.h"
#include "store/prune.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/s3_http.h"
#include "store/s3_xml.h"
#include "store/store.h"
#include "store/store_s3.h"

#ifndef CKPT_VERSION
#define CKPT_VERSION "unknown"
#endif

#define CTL_NAME_COL_MAX    48              /* widest name column printed */
#define CTL_LIST_DEPTH      8               /* directory levels list searches */
#define CTL_ATTEMPT_MAX     (64u << 10)     /* cap on an attempt.json we read */
#define CTL_S3_RETRIES      3               /* retries of a failed S3 request */
#define CTL_S3_CONNECT_MS   5000

static const char *prog = "ckptctl";

static void die_usage(void) __attribute__((noreturn));

static void errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *clean(char *s);

static void errmsg(const char *fmt, ...)
{
	char buf[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s: %s\n", prog, clean(buf));
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: %s [-s SOCKET] [-c CONFIG] status [--json]\n"
		"             [--watch [--interval SECONDS] [--count N]]\n"
		"       %s list ROOT [RULE...] [--json]\n"
		"       %s show ROOT/NAME|ROOT/latest|ROOT/best [--metric M [--max]] [-v] [--json]\n"
		"       %s wait ROOT NAME [--timeout SECONDS] [--json]\n"
		"       %s wait ROOT --step N [--timeout SECONDS] [--json]\n"
		"       %s prune ROOT [--dry-run] [--force] [--json] RULE...\n"
		"       %s pin|unpin ROOT NAME [--json]\n"
		"       %s verify ROOT/NAME [--json]\n"
		"       %s gc ROOT [--dry-run] [--grace DURATION] [--json]\n"
		"       %s [-s SOCKET] [-c CONFIG] spill list [--json]\n"
		"       %s [-s SOCKET] [-c CONFIG] spill drop ID|ROOT/NAME [--json]\n"
		"       %s --help | --version\n"
		"\n"
		"  status          what the running ckptd is doing: clients, saves in flight\n"
		"                  with their progress, the last commit, totals\n"
		"    --watch       a new report every --interval seconds (default %g,\n"
		"                  %g..%g) until Ctrl-C, or --count reports; redrawn in\n"
		"                  place on a terminal; with --json one line per report\n"
		"  list ROOT       the checkpoints at ROOT and below (%d levels), and the\n"
		"                  saves in progress, incomplete and corrupt ones among them;\n"
		"                  with prune's RULEs, why each checkpoint directly in ROOT\n"
		"                  is kept, or that the policy removes it\n"
		"  show ROOT/NAME  one checkpoint's manifest: files, tensors, blobs\n"
		"                  (ROOT/latest: the greatest step; ROOT/best: the best by\n"
		"                  --metric M, smallest unless --max)\n"
		"                  (ROOT: a directory, or s3://bucket/prefix with the\n"
		"                  credentials and endpoint of the AWS_* variables)\n"
		"  wait ROOT NAME  returns once checkpoint NAME directly in ROOT is\n"
		"                  committed and prints its name (--step N: any checkpoint\n"
		"                  of step N); --timeout SECONDS (default: none; 0: look\n"
		"                  once); ROOT must exist\n"
		"  prune ROOT      removes the committed checkpoints directly in ROOT (a\n"
		"                  directory or s3://bucket/prefix) that a retention\n"
		"                  policy does not keep, crash-safely, and says why each\n"
		"                  stays (--dry-run: only shows the plan); RULE:\n"
		"                  --keep-last N, --keep-every-steps K, --keep-within 7d,\n"
		"                  --keep-hourly N, --keep-daily N, --keep-best N METRIC\n"
		"                  min|max, --max-removals N (more needs --force); the\n"
		"                  newest, the last committed, those being read and the\n"
		"                  names in ROOT/.ckpt-pins are always kept; a user prunes\n"
		"                  only their own checkpoints\n"
		"  pin ROOT NAME   add a committed checkpoint to ROOT/.ckpt-pins (unpin:\n"
		"                  take it off)\n"
		"  verify ROOT/NAME  every file, size and CRC of one checkpoint, and that\n"
		"                  its chunks cover its tensors exactly\n"
		"  gc ROOT         removes dead saves' work areas (no activity for --grace,\n"
		"                  default 24h) and unfinished removals at ROOT and below;\n"
		"                  on S3 lists every unfinished multipart upload; anything\n"
		"                  else unknown is reported, never removed\n"
		"  spill list      the saves the running ckptd owes S3 (spill tier): durable\n"
		"                  on this node, kept through S3 outages, the trainer's exit\n"
		"                  and ckptd restarts until S3 takes them; tries that met S3\n"
		"                  failing and the last error\n"
		"  spill drop ID|ROOT/NAME  gives one of them up (its owner or root only):\n"
		"                  its spilled copy is removed and it never commits\n"
		"\n"
		"  -s SOCKET       the daemon's socket (default: $CKPTD_SOCKET, else the\n"
		"                  'socket' of the config file, else %s)\n"
		"  -c CONFIG       the config file to read the socket from\n"
		"                  (default %s)\n"
		"  --json, -o json print JSON Lines instead of text: one compact JSON object\n"
		"                  per line (status: the report, with \"time\" when watching;\n"
		"                  list: one per entry; show: the manifest; wait: name, step\n"
		"                  and path)\n"
		"  -v, --verbose   show: every chunk of every tensor\n"
		"\n"
		"exit status: 0 done, 1 failed, 2 bad usage, 3 no ckptd answers on the\n"
		"socket (status, spill), 4 timed out (wait), 5 done but part of the input\n"
		"could not be read, 6 refused by a safety rule (spill drop: not yours)\n",
		prog, prog, prog, prog, prog, prog, prog, prog, prog, prog, prog, prog,
		CTL_WATCH_DEFAULT_S,
		CTL_WATCH_MIN_S, CTL_WATCH_MAX_S, CTL_LIST_DEPTH, CKPT_DEFAULT_SOCKET,
		config_default_path);
}

static void die_usage(void)
{
	usage(stderr);
	exit(2);
}

/* ---- formatting helpers ---- */

/* "512 B", "1.5 KiB", "4.0 GiB". */
const char *ctl_human_size(uint64_t n, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	int u = -1;

	if (n < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)n);
		return buf;
	}
	while (v >= 1024.0 && u < 5) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

/* "850ms", "12.5s", "3m 4s", "2h 5m", "3d 4h". */
const char *ctl_human_duration(double s, char *buf, size_t len)
{
	uint64_t t, big, small;
	char bu, su;

	if (!(s >= 0) || s > 1e12) {
		snprintf(buf, len, "?");
		return buf;
	}
	if (s < 1.0) {
		snprintf(buf, len, "%.0fms", s * 1000.0);
		return buf;
	}
	if (s < 60.0) {
		snprintf(buf, len, "%.1fs", s);
		return buf;
	}
	t = (uint64_t)s;
	/* Two units at most, the smaller left out when it is zero ("10m"). */
	if (t < 3600) {
		big = t / 60, small = t % 60, bu = 'm', su = 's';
	} else if (t < 86400) {
		big = t / 3600, small = t % 3600 / 60, bu = 'h', su = 'm';
	} else {
		big = t / 86400, small = t % 86400 / 3600, bu = 'd', su = 'h';
	}
	if (small)
		snprintf(buf, len, "%llu%c %llu%c", (unsigned long long)big, bu,
			 (unsigned long long)small, su);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)big, bu);
	return buf;
}

/*
 * --json prints JSON Lines: every object compact on one line, so a script
 * can read a report as one document and a listing line by line.  `flags`
 * adds JSON_REAL_PRECISION for reports of measured values (seconds rounded
 * to milliseconds read as 43.101, not 43.100999999999999); a manifest keeps
 * jansson's exact default.  Returns 0 or -ENOMEM.
 */
static int print_json_line(const json_t *j, size_t flags)
{
	char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | flags);

	if (!s)
		return -ENOMEM;
	puts(s);
	free(s);
	return 0;
}

int ctl_json_line(const json_t *j)
{
	return print_json_line(j, 0);
}

int ctl_json_print(const json_t *j, size_t flags)
{
	return print_json_line(j, flags);
}

void ctl_err(const char *fmt, ...)
{
	char buf[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	errmsg("%s", buf);
}

/*
 * A directory name fit to print and to put in JSON: control characters (a
 * name could carry terminal escapes) and non-ASCII bytes (it need not be
 * UTF-8, which JSON requires) become '?'.  Checkpoint names are plain ASCII
 * by rule, so only stray entries are changed.
 */
/* Control and non-ASCII bytes as '?', in place: text from storage (names,
 * manifests, S3's messages) must not drive the terminal. */
static char *clean(char *s)
{
	for (char *p = s; p && *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '?';
	return s;
}

static char *display_name(const char *s)
{
	return clean(strdup(s));
}

char *ctl_display(const char *s)
{
	return display_name(s);
}

/* Display width of a name column: the longest name, capped. */
int ctl_name_width(size_t longest, size_t header)
{
	size_t w = longest > header ? longest : header;

	return (int)(w > CTL_NAME_COL_MAX ? CTL_NAME_COL_MAX : w);
}

/* ---- list ---- */

/*
 * The layout list follows (README "On-disk layout"):
 *
 *   - a checkpoint is a directory holding manifest.json; list never looks
 *     inside one;
 *   - a work directory of a save in progress is a hidden directory named
 *     .ckpt-work-<32 hex digits> (holding attempt.json) or, from older
 *     daemons, .partial-*;
 *   - a directory with rank-*.safetensors but no manifest.json is an
 *     incomplete checkpoint (a commit that never finished, or a copy);
 *   - any other directory is a container (the daemon's per-job directories,
 *     an admin's folders): list looks inside, down to CTL_LIST_DEPTH levels
 *     below the root, and shows nothing for it unless it holds checkpoints.
 *
 * Other hidden entries, plain files and symlinks are not shown.
 */
#define WORK_PREFIX       ".ckpt-work-"
#define WORK_HEX          32
#define LEGACY_PREFIX     ".partial-"
#define ATTEMPT_FILE      "attempt.json"

/* ENT_NEWER: a manifest of a later format than this ckptctl reads: most
 * likely a good checkpoint that a newer ckptd wrote, so never "corrupt". */
enum entry_state {
	ENT_COMMITTED,
	ENT_IN_PROGRESS,
	ENT_INCOMPLETE,
	ENT_CORRUPT,
	ENT_NEWER,
	ENT_REMOVING, /* an S3 checkpoint's tombstone: a removal under way */
};

static const char *const state_names[] = {
	[ENT_COMMITTED] = "committed",
	[ENT_IN_PROGRESS] = "in_progress",
	[ENT_INCOMPLETE] = "incomplete",
	[ENT_CORRUPT] = "corrupt",
	[ENT_NEWER] = "newer_format",
	[ENT_REMOVING] = "removing",
};

struct entry {
	char *path;             /* relative to the root, fit to print */
	enum entry_state state;
	bool has_step, has_world, has_attempt;
	uint64_t step, total_bytes, attempt;
	uint32_t world;
	char time[40];
	char *name, *job, *run; /* from manifest.json or attempt.json, or NULL */
	double age_s;           /* in progress: since the attempt began */
	bool has_age;           /* age_s known (S3: only from attempt.json) */
	char *error;            /* corrupt: why */
	bool planned;           /* list with rules: in the plan of the root */
	uint32_t keep;          /* its reasons (0: the plan removes it) */
};

struct listing {
	struct entry *v;
	size_t n, cap;
	size_t longest;   /* longest path, for the column */
	size_t too_deep;  /* containers not searched: deeper than the limit */
};

/* Entries sorted by the directory that holds them; in one directory the
 * committed checkpoints first, by step, then the rest by name. */
static int entry_cmp(const void *pa, const void *pb)
{
	const struct entry *a = pa, *b = pb;
	const char *sa = strrchr(a->path, '/'), *sb = strrchr(b->path, '/');
	size_t la = sa ? (size_t)(sa - a->path) : 0, lb = sb ? (size_t)(sb - b->path) : 0;
	int c = strncmp(a->path, b->path, la < lb ? la : lb);

	if (c == 0 && la != lb)
		c = la < lb ? -1 : 1;
	if (c)
		return c;
	if ((a->state == ENT_COMMITTED) != (b->state == ENT_COMMITTED))
		return a->state == ENT_COMMITTED ? -1 : 1;
	if (a->state == ENT_COMMITTED && a->step != b->step)
		return a->step < b->step ? -1 : 1;
	return strcmp(a->path, b->path);
}

static void entry_free(struct entry *e)
{
	free(e->path);
	free(e->name);
	free(e->job);
	free(e->run);
	free(e->error);
}

/* A new zeroed entry for `rel`, or NULL (out of memory). */
static struct entry *entry_add(struct listing *L, const char *rel, enum entry_state state)
{
	struct entry *e;

	if (L->n == L->cap) {
		size_t ncap = L->cap ? 2 * L->cap : 64;
		struct entry *nv = realloc(L->v, ncap * sizeof(*nv));
		if (!nv)
			return NULL;
		L->v = nv;
		L->cap = ncap;
	}
	e = &L->v[L->n];
	memset(e, 0, sizeof(*e));
	e->path = display_name(rel);
	if (!e->path)
		return NULL;
	e->state = state;
	if (strlen(e->path) > L->longest)
		L->longest = strlen(e->path);
	L->n++;
	return e;
}

static bool is_work_dir(const char *name)
{
	size_t n = strlen(WORK_PREFIX);

	if (strncmp(name, WORK_PREFIX, n) != 0 || strlen(name) != n + WORK_HEX)
		return false;
	for (size_t i = n; name[i]; i++)
		if (!isxdigit((unsigned char)name[i]))
			return false;
	return true;
}

static double seconds_since(const struct timespec *t)
{
	struct timespec now;
	double age;

	clock_gettime(CLOCK_REALTIME, &now);
	age = (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
	return age < 0 ? 0 : age;
}

/* A string member of a hostile object, fit to print, or NULL. */
static char *jdup_str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? display_name(s) : NULL;
}

static bool jget_uint(const json_t *o, const char *key, uint64_t *ret)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*ret = (uint64_t)json_integer_value(v);
	return true;
}

/*
 * What attempt.json (when there and readable) tells of a save in progress:
 * which checkpoint it will be and when the attempt began.  Nothing in it is
 * trusted beyond being printed.
 */
static void attempt_fill(struct entry *e, const char *text, size_t len)
{
	json_t *a = json_loadb(text, len, 0, NULL), *c;
	uint64_t v;

	if (!json_is_object(a)) {
		json_decref(a);
		return;
	}
	e->name = jdup_str(a, "name");
	e->job = jdup_str(a, "job");
	e->run = jdup_str(a, "run");
	e->has_step = jget_uint(a, "step", &e->step);
	e->has_attempt = jget_uint(a, "attempt", &e->attempt);
	if (jget_uint(a, "world", &v) && v <= UINT32_MAX) {
		e->world = (uint32_t)v;
		e->has_world = true;
	}
	c = json_object_get(a, "created");
	/* Bounded before the cast: a hostile attempt.json's 1e300 would not
	 * fit a time_t (year 5138 is far enough). */
	if (json_is_number(c) && json_number_value(c) > 0 && json_number_value(c) < 1e11) {
		double created = json_number_value(c);
		struct timespec ts = { .tv_sec = (time_t)created,
				       .tv_nsec = (long)((created - (double)(time_t)created) * 1e9) };
		e->age_s = seconds_since(&ts);
		e->has_age = true;
	}
	json_decref(a);
}

/* A save in progress in a directory; without attempt.json its age is the
 * work directory's last change.  Returns 0 or -ENOMEM. */
static int add_in_progress(struct listing *L, int dfd, const char *name, const char *rel,
			   const struct stat *st)
{
	struct entry *e = entry_add(L, rel, ENT_IN_PROGRESS);
	char path[NAME_MAX + sizeof(ATTEMPT_FILE) + 2];
	char *text = NULL;
	size_t len = 0;

	if (!e)
		return -ENOMEM;
	e->age_s = seconds_since(&st->st_mtim);
	e->has_age = true;
	if (strncmp(name, WORK_PREFIX, strlen(WORK_PREFIX)) != 0)
		return 0;
	snprintf(path, sizeof(path), "%s/%s", name, ATTEMPT_FILE);
	if (fs_read_file_at(dfd, path, CTL_ATTEMPT_MAX, &text, &len) < 0)
		return 0;
	attempt_fill(e, text, len);
	free(text);
	return 0;
}

/*
 * The one rule of what is committed, for list and wait: a checkpoint's
 * manifest.json is read whole and parses as a manifest of our format.
 */
int ctl_manifest_judge(int r, char *text, size_t len, struct manifest *m, char *err,
		       size_t errlen)
{
	int ret;

	if (r < 0) {
		free(text);
		snprintf(err, errlen, "%s: %s", MANIFEST_FILE,
			 r == -EFBIG ? "larger than ckptctl reads" :
			 r == -EINVAL ? "not a regular file" : strerror(-r));
		return r == -ENOMEM ? r : CTL_CKPT_CORRUPT;
	}
	memset(m, 0, sizeof(*m));
	err[0] = '\0';
	ret = manifest_parse(text, len, m, err, errlen);
	free(text);
	if (ret == -ENOMEM)
		return ret;
	if (ret < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s", strerror(-ret));
		return ret == -EPROTONOSUPPORT ? CTL_CKPT_NEWER :
		       ret == -ENOENT ? CTL_CKPT_REMOVING : CTL_CKPT_CORRUPT;
	}
	return CTL_CKPT_COMMITTED;
}

/*
 * A directory that holds manifest.json: committed, or corrupt if the
 * manifest cannot be read or parsed (one bad checkpoint must not hide the
 * rest).  `r` and the text are fs_read_file_at's result.
 */
static int add_checkpoint(struct listing *L, const char *rel, int r, char *text, size_t len)
{
	struct entry *e = entry_add(L, rel, ENT_CORRUPT);
	char err[512] = "";
	struct manifest m;
	int ret;

	if (!e) {
		free(text);
		return -ENOMEM;
	}
	ret = ctl_manifest_judge(r, text, len, &m, err, sizeof(err));
	if (ret < 0)
		return ret;
	if (ret != CTL_CKPT_COMMITTED) {
		if (ret == CTL_CKPT_NEWER)
			e->state = ENT_NEWER;
		if (ret == CTL_CKPT_REMOVING)
			e->state = ENT_REMOVING;
		e->error = strdup(err);
		return e->error ? 0 : -ENOMEM;
	}
	e->state = ENT_COMMITTED;
	e->step = m.step;
	e->has_step = true;
	e->total_bytes = m.total_bytes;
	e->world = m.world;
	e->has_world = true;
	snprintf(e->time, sizeof(e->time), "%s", m.time);
	clean(e->time);
	e->name = display_name(m.name);
	e->job = display_name(m.job);
	manifest_free(&m);
	return e->name && e->job ? 0 : -ENOMEM;
}

/* rank-*.safetensors: a shard's name (S3's carry the attempt's tag too). */
static bool is_shard_name(const char *name)
{
	static const char suffix[] = ".safetensors";
	size_t n = strlen(name);

	return strncmp(name, "rank-", 5) == 0 && n > 5 + sizeof(suffix) - 1 &&
	       strcmp(name + n - (sizeof(suffix) - 1), suffix) == 0;
}

/* True if the directory holds a rank-*.safetensors file.  Leaves the stream
 * rewound. */
static bool has_shards(DIR *d)
{
	struct dirent *de;
	bool found = false;

	while (!found && (de = readdir(d)) != NULL)
		found = is_shard_name(de->d_name);
	rewinddir(d);
	return found;
}

/* Lists what the container `d` (at `rel`, `depth` levels below the root)
 * holds.  Returns 0, or -ENOMEM / a read error of the directory. */
static int list_dir(struct listing *L, DIR *d, const char *rel, unsigned depth)
{
	int dfd = dirfd(d);
	struct dirent *de;

	while ((errno = 0, de = readdir(d)) != NULL) {
		const char *name = de->d_name;
		char child[PATH_MAX];
		char *text = NULL;
		size_t len = 0;
		struct stat st;
		DIR *cd;
		int cfd, r;

		if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
			continue;
		if (snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "", name) >=
		    (int)sizeof(child))
			continue;
		/* Symlinks are aliases, not what the root stores: not shown,
		 * and never followed, so the walk cannot loop. */
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (!S_ISDIR(st.st_mode))
			continue;
		if (is_work_dir(name) || strncmp(name, LEGACY_PREFIX, strlen(LEGACY_PREFIX)) == 0) {
			r = add_in_progress(L, dfd, name, child, &st);
			if (r < 0)
				return r;
			continue;
		}
		if (name[0] == '.')
			continue; /* other hidden entries are not ours */

		cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
		if (cfd < 0) {
			errmsg("'%s': %s (not listed)", child, strerror(errno));
			continue;
		}
		r = fs_read_file_at(cfd, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len);
		if (r == -ENOMEM) {
			close(cfd);
			return r;
		}
		if (r != -ENOENT) {
			close(cfd);
			r = add_checkpoint(L, child, r, text, len);
			if (r < 0)
				return r;
			continue;
		}
		cd = fdopendir(cfd);
		if (!cd) {
			errmsg("'%s': %s (not listed)", child, strerror(errno));
			close(cfd);
			continue;
		}
		r = 0;
		if (has_shards(cd)) {
			if (!entry_add(L, child, ENT_INCOMPLETE))
				r = -ENOMEM;
		} else if (depth >= CTL_LIST_DEPTH) {
			L->too_deep++;
		} else {
			r = list_dir(L, cd, child, depth + 1);
			if (r < 0 && r != -ENOMEM) {
				errmsg("reading '%s': %s (not listed)", child, strerror(-r));
				r = 0;
			}
		}
		closedir(cd);
		if (r < 0)
			return r;
	}
	return errno ? -errno : 0;
}

static json_t *entry_json(const struct entry *e)
{
	json_t *o = json_object();

	if (!o)
		return NULL;
	json_object_set_new(o, "path", json_string(e->path));
	json_object_set_new(o, "state", json_string(state_names[e->state]));
	if (e->name)
		json_object_set_new(o, "name", json_string(e->name));
	if (e->job)
		json_object_set_new(o, "job", json_string(e->job));
	if (e->has_step)
		json_object_set_new(o, "step", json_integer((json_int_t)e->step));
	if (e->has_world)
		json_object_set_new(o, "world", json_integer(e->world));
	switch (e->state) {
	case ENT_COMMITTED:
		json_object_set_new(o, "total_bytes", json_integer((json_int_t)e->total_bytes));
		json_object_set_new(o, "time", json_string(e->time));
		if (e->planned) {
			char why[128], *save = NULL;
			json_t *r = json_array();

			ret_reasons(e->keep, why, sizeof(why));
			for (char *t = strtok_r(why, ",", &save); r && e->keep && t;
			     t = strtok_r(NULL, ",", &save))
				json_array_append_new(r, json_string(t));
			json_object_set_new(o, "retention",
					    json_pack("{s:s, s:o}", "action",
						      e->keep ? "keep" : "remove", "reasons",
						      r ? r : json_array()));
		}
		break;
	case ENT_IN_PROGRESS:
		if (e->run)
			json_object_set_new(o, "run", json_string(e->run));
		if (e->has_attempt)
			json_object_set_new(o, "attempt", json_integer((json_int_t)e->attempt));
		/* to the millisecond (ages are >= 0) */
		if (e->has_age)
			json_object_set_new(o, "age_s",
					    json_real((double)(uint64_t)(e->age_s * 1000.0 + 0.5) /
						      1000.0));
		break;
	case ENT_CORRUPT:
	case ENT_NEWER:
	case ENT_REMOVING:
		json_object_set_new(o, "error", json_string(e->error ? e->error : ""));
		break;
	case ENT_INCOMPLETE:
		break;
	}
	return o;
}

static void list_print(const struct listing *L)
{
	int w = ctl_name_width(L->longest, 4);
	char sz[32], age[32], step[24], world[16];

	printf("%-*s %10s %10s  %-20s %6s  %s\n", w, "PATH", "STEP", "SIZE", "TIME", "WORLD",
	       "STATE");
	for (size_t i = 0; i < L->n; i++) {
		const struct entry *e = &L->v[i];

		snprintf(step, sizeof(step), "%llu", (unsigned long long)e->step);
		snprintf(world, sizeof(world), "%u", e->world);
		printf("%-*s %10s %10s  %-20s %6s  ", w, e->path, e->has_step ? step : "-",
		       e->state == ENT_COMMITTED ? ctl_human_size(e->total_bytes, sz, sizeof(sz)) :
						   "-",
		       e->state == ENT_COMMITTED ? e->time : "-", e->has_world ? world : "-");
		switch (e->state) {
		case ENT_COMMITTED:
			if (e->planned && e->keep) {
				char why[128];

				ret_reasons(e->keep, why, sizeof(why));
				printf("committed, kept for %s\n", why);
			} else if (e->planned) {
				printf("committed, the policy removes it\n");
			} else {
				printf("committed\n");
			}
			break;
		case ENT_IN_PROGRESS:
			printf("in progress");
			if (e->has_age)
				printf(" (%s old)", ctl_human_duration(e->age_s, age, sizeof(age)));
			if (e->name)
				printf(": %s", e->name);
			if (e->job)
				printf(" of job %s", e->job);
			putchar('\n');
			break;
		case ENT_INCOMPLETE:
			printf("incomplete (shards but no %s)\n", MANIFEST_FILE);
			break;
		case ENT_CORRUPT:
			printf("corrupt: %s\n", e->error ? e->error : "?");
			break;
		case ENT_NEWER:
			printf("newer format: %s\n", e->error ? e->error : "?");
			break;
		case ENT_REMOVING:
			printf("being removed (a tombstone: the next prune finishes it)\n");
			break;
		}
	}
}

static void listing_free(struct listing *L)
{
	for (size_t i = 0; i < L->n; i++)
		entry_free(&L->v[i]);
	free(L->v);
}

/*
 * Prints what list found under `root`, sorted; `empty_note` follows "no
 * checkpoints in ROOT" when there is nothing.  Returns the exit status.
 */
/* list with rules: the plan of `policy` for the committed checkpoints
 * directly in root, as prune --dry-run would make it, onto the entries. */
static const struct ret_policy *g_list_policy;

static void list_plan(struct listing *L, const char *root)
{
	struct prune_run pr;

	if (!g_list_policy || ret_policy_empty(g_list_policy))
		return;
	memset(&pr, 0, sizeof(pr));
	pr.root = root;
	pr.policy = g_list_policy;
	pr.dry_run = true;
	pr.only_uid = geteuid() ? geteuid() : STORE_NO_OWNER;
	pr.remover = geteuid();
	if (prune_run(&pr) < 0) {
		errmsg("list: no retention plan: %s", pr.err);
		return;
	}
	for (size_t i = 0; i < pr.n; i++) {
		for (size_t k = 0; k < L->n; k++) {
			struct entry *e = &L->v[k];

			if (e->state != ENT_COMMITTED || strchr(e->path, '/') ||
			    strcmp(e->path, pr.v[i].name))
				continue;
			e->planned = true;
			e->keep = pr.v[i].keep;
		}
	}
	if (pr.plan_res < 0)
		errmsg("list: the plan would be refused: %s", pr.err);
	prune_run_free(&pr);
}

static int list_emit(struct listing *L, const char *root, bool json, const char *empty_note)
{
	if (L->n)
		qsort(L->v, L->n, sizeof(*L->v), entry_cmp);
	list_plan(L, root);
	if (json) {
		for (size_t i = 0; i < L->n; i++) {
			json_t *o = entry_json(&L->v[i]);
			if (!o || print_json_line(o, JSON_REAL_PRECISION(15)) < 0) {
				json_decref(o);
				errmsg("out of memory");
				return 1;
			}
			json_decref(o);
		}
	} else if (L->n == 0) {
		printf("no checkpoints in '%s'%s\n", root, empty_note);
	} else {
		list_print(L);
	}
	if (L->too_deep)
		errmsg("note: %zu director%s more than %d levels below '%s' not searched",
		       L->too_deep, L->too_deep == 1 ? "y" : "ies", CTL_LIST_DEPTH, root);
	return 0;
}

/* ---- S3 roots ---- */

/*
 * s3://bucket/prefix is read through the S3 backend (store_s3.h): its list
 * hook (ListObjectsV2 with a '/' delimiter, every page, and a HEAD of each
 * name's manifest.json) and GETs of manifests and attempt.json files.  The
 * layout is the one on disk (store/s3.c), prefixes standing for
 * directories, so everything above applies; two things S3 cannot tell as a
 * directory can:
 *
 *   - a file from a prefix: a name that is neither a checkpoint nor a work
 *     area is listed in turn, and was a file if that finds nothing;
 *   - a work area's age without its attempt.json (no mtime): shown as
 *     unknown.
 */
static bool ctl_s3_up;

/* Starts the process's S3 client from the AWS_* environment, as
 * ckpt_reader_open() does.  0, or -errno with the reason printed. */
int ctl_s3_start(const char *url)
{
	struct store_s3_settings set = { .retries = CTL_S3_RETRIES,
					 .connect_timeout_ms = CTL_S3_CONNECT_MS };
	char err[512] = "";
	int r;

	if (ctl_s3_up)
		return 0;
	r = store_s3_start_settings(&set, err, sizeof(err));
	if (r == -ENOENT)
		errmsg("'%s': no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
		       "(and AWS_SESSION_TOKEN with temporary ones); the endpoint is taken from "
		       "AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, the region from AWS_REGION",
		       url);
	else if (r < 0)
		errmsg("'%s': cannot set up S3: %s", url, err);
	else
		ctl_s3_up = true;
	return r;
}

void ctl_s3_stop(void)
{
	if (ctl_s3_up)
		store_s3_stop(); /* wipes the credentials */
	ctl_s3_up = false;
}

/* A 403 (or another refusal of the credentials), with S3's words in err. */
void ctl_s3_denied(const char *url, const char *err)
{
	errmsg("'%s': access denied: check the credentials (AWS_ACCESS_KEY_ID, "
	       "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), AWS_REGION and the bucket's policy "
	       "(%s)", url, err);
}

static int count_one(void *ud, const char *inner, size_t len)
{
	(void)ud, (void)inner, (void)len;
	return 0;
}

/*
 * Asks S3 for one key under loc's prefix (ListObjectsV2, max-keys=1), which
 * tells a missing bucket, refused access and an unreachable endpoint from
 * an empty prefix, in S3's own words.  Returns 1 if something is stored
 * under the prefix, 0 if nothing is, or -errno with the reason printed.
 */
int ctl_s3_probe(const char *url, const struct s3_loc *loc)
{
	char pre[S3_PREFIX_MAX + 2], enc[3 * sizeof(pre)], query[sizeof(enc) + 64], err[768] = "";
	struct s3_req q = { .method = "GET", .bucket = loc->bucket, .key = "", .query = query,
			    .max_resp = 1u << 20 };
	int r;

	snprintf(pre, sizeof(pre), "%s%s", loc->prefix, loc->prefix[0] ? "/" : "");
	if (s3_encode_query(pre, enc, sizeof(enc)) < 0) {
		errmsg("'%s': prefix too long", url);
		return -ENAMETOOLONG;
	}
	/* Sorted: libcurl 7.88 signs the query as it is written. */
	snprintf(query, sizeof(query), "list-type=2&max-keys=1&prefix=%s", enc);
	r = s3_call(store_s3_client(), &q, err, sizeof(err));
	if (r == 0) {
		r = q.resp ? s3_xml_each(q.resp, q.resp_len, "ListBucketResult/Contents", count_one,
					 NULL) : 0;
		if (r < 0)
			errmsg("'%s': an S3 listing we cannot read", url);
		else
			r = r > 0;
	} else if (!strcmp(q.code, "NoSuchBucket")) {
		errmsg("'%s': bucket '%s' does not exist (%s)", url, loc->bucket, err);
	} else if (r == -EACCES) {
		ctl_s3_denied(url, err);
	} else {
		errmsg("'%s': %s", url, err);
	}
	s3_req_free(&q);
	return r;
}

/* The names one level below a prefix, sorted, each once. */
struct s3_names {
	struct s3_name {
		char *name;
		enum store_entry kind;
	} *v;
	size_t n, cap;
};

static void s3_names_free(struct s3_names *N)
{
	for (size_t i = 0; i < N->n; i++)
		free(N->v[i].name);
	free(N->v);
	memset(N, 0, sizeof(*N));
}

static int s3_name_add(void *ud, const char *name, enum store_entry kind)
{
	struct s3_names *N = ud;

	if (N->n == N->cap) {
		size_t ncap = N->cap ? 2 * N->cap : 64;
		struct s3_name *nv = realloc(N->v, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		N->v = nv;
		N->cap = ncap;
	}
	N->v[N->n].name = strdup(name);
	if (!N->v[N->n].name)
		return -ENOMEM;
	N->v[N->n++].kind = kind;
	return 0;
}

static int s3_name_cmp(const void *pa, const void *pb)
{
	const struct s3_name *a = pa, *b = pb;

	return strcmp(a->name, b->name);
}

/*
 * The names directly below `rel` of root ("" for the root itself) into
 * *ret.  A file and a prefix of one name (S3 allows both) are one entry,
 * of the prefix's kind if that is a checkpoint or a work area.  0 or
 * -errno.
 */
static int s3_names_get(const char *root, const char *rel, struct s3_names *ret)
{
	struct s3_names N = { 0 };
	size_t k = 0;
	int r;

	r = store_s3.list(root, rel, s3_name_add, &N);
	if (r < 0) {
		s3_names_free(&N);
		return r;
	}
	if (N.n)
		qsort(N.v, N.n, sizeof(*N.v), s3_name_cmp);
	for (size_t i = 0; i < N.n; i++) {
		if (k && !strcmp(N.v[k - 1].name, N.v[i].name)) {
			/* the prefix's kind wins over the file's */
			if (N.v[i].kind != STORE_ENTRY_FILE &&
			    (N.v[k - 1].kind == STORE_ENTRY_FILE || N.v[i].kind != STORE_ENTRY_OTHER))
				N.v[k - 1].kind = N.v[i].kind;
			free(N.v[i].name);
			continue;
		}
		N.v[k++] = N.v[i];
	}
	N.n = k;
	*ret = N;
	return 0;
}

/* A checkpoint the listing found (its manifest's HEAD answered): read
 * like a directory's.  0 or -ENOMEM. */
static int add_checkpoint_s3(struct listing *L, const char *root, const char *rel)
{
	char file[S3_KEY_MAX + sizeof(MANIFEST_FILE) + 2], err[512] = "";
	char *text = NULL;
	size_t len = 0;
	int r;

	snprintf(file, sizeof(file), "%s/%s", rel, MANIFEST_FILE);
	r = store_s3_get(root, file, CTL_MANIFEST_MAX, &text, &len, err, sizeof(err));
	if (r == -ENOENT)
		return 0; /* removed since the listing saw it */
	if (r == -ENOMEM)
		return r;
	return add_checkpoint(L, rel, r, text, len);
}

/* A work area: a save in progress.  0 or -ENOMEM. */
static int add_in_progress_s3(struct listing *L, const char *root, const char *rel)
{
	struct entry *e = entry_add(L, rel, ENT_IN_PROGRESS);
	char file[S3_KEY_MAX + sizeof(ATTEMPT_FILE) + 2], err[512];
	char *text = NULL;
	size_t len = 0;

	if (!e)
		return -ENOMEM;
	snprintf(file, sizeof(file), "%s/%s", rel, ATTEMPT_FILE);
	if (store_s3_get(root, file, CTL_ATTEMPT_MAX, &text, &len, err, sizeof(err)) < 0)
		return 0;
	attempt_fill(e, text, len);
	free(text);
	return 0;
}

static int list_s3_level(struct listing *L, const char *root, const char *rel, unsigned depth,
			 const struct s3_names *N);

/* A prefix below `rel` that is neither a checkpoint nor a work area: an
 * incomplete checkpoint (shards, no manifest) or a container to look
 * into.  0 or -ENOMEM. */
static int list_s3_other(struct listing *L, const char *root, const char *child, unsigned depth)
{
	struct s3_names C = { 0 };
	bool shards = false;
	int r;

	r = s3_names_get(root, child, &C);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		errmsg("'%s/%s': %s (not listed)", root, child, strerror(-r));
		return 0;
	}
	for (size_t i = 0; i < C.n && !shards; i++)
		shards = C.v[i].kind == STORE_ENTRY_FILE && is_shard_name(C.v[i].name);
	r = 0;
	if (C.n == 0)
		; /* emptied since the listing */
	else if (shards)
		r = entry_add(L, child, ENT_INCOMPLETE) ? 0 : -ENOMEM;
	else if (depth >= CTL_LIST_DEPTH)
		L->too_deep++;
	else
		r = list_s3_level(L, root, child, depth + 1, &C);
	s3_names_free(&C);
	return r;
}

/* Lists what the names N below `rel` (at `depth` levels below the root)
 * hold, as list_dir() does a directory.  0 or -ENOMEM. */
static int list_s3_level(struct listing *L, const char *root, const char *rel, unsigned depth,
			 const struct s3_names *N)
{
	for (size_t i = 0; i < N->n; i++) {
		const char *name = N->v[i].name;
		char child[S3_KEY_MAX + 1];
		int r = 0;

		if (!name[0] || snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "",
					 name) >= (int)sizeof(child))
			continue; /* "" is the prefix's own folder object */
		if (N->v[i].kind == STORE_ENTRY_WORK) {
			if (is_work_dir(name))
				r = add_in_progress_s3(L, root, child);
		} else if (name[0] == '.') {
			continue; /* other hidden entries are not ours */
		} else if (N->v[i].kind == STORE_ENTRY_CHECKPOINT) {
			r = add_checkpoint_s3(L, root, child);
		} else if (N->v[i].kind == STORE_ENTRY_OTHER) {
			r = list_s3_other(L, root, child, depth);
		} /* a file: nothing to look into, no request */
		if (r < 0)
			return r;
	}
	return 0;
}

static int cmd_list_s3(const char *root, bool json)
{
	struct listing L = { .longest = 4 };
	struct s3_names N = { 0 };
	struct s3_loc loc;
	char err[512] = "", note[600] = "";
	int r, any, ret = 1;

	r = s3_url_parse(root, &loc, err, sizeof(err));
	if (r < 0) {
		errmsg("'%s': %s", root, err);
		return 1;
	}
	if (ctl_s3_start(root) < 0)
		return 1;
	any = ctl_s3_probe(root, &loc);
	if (any < 0)
		return 1;
	r = s3_names_get(root, "", &N);
	if (r == 0)
		r = list_s3_level(&L, root, "", 1, &N);
	if (r < 0) {
		errmsg("listing '%s': %s", root, strerror(-r));
		goto out;
	}
	if (L.n == 0 && !any)
		snprintf(note, sizeof(note), " (nothing is stored under it)");
	else if (L.n == 0 && store_s3_exists(root, MANIFEST_FILE) == 1)
		snprintf(note, sizeof(note), " (it is a checkpoint itself: ckptctl show '%s')",
			 root);
	ret = list_emit(&L, root, json, note);

out:
	s3_names_free(&N);
	listing_free(&L);
	return ret;
}

/* ---- list: directories ---- */

static int cmd_list(const char *root, bool json)
{
	struct listing L = { .longest = 4 };
	char note[PATH_MAX + 64] = "";
	struct stat st;
	DIR *dir;
	int rootfd, r, ret = 1;

	if (s3_is_url(root))
		return cmd_list_s3(root, json);
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		errmsg("cannot open root '%s': %s", root, strerror(errno));
		return 1;
	}
	dir = fdopendir(rootfd);
	if (!dir) {
		errmsg("cannot read root '%s': %s", root, strerror(errno));
		close(rootfd);
		return 1;
	}
	r = list_dir(&L, dir, "", 1);
	if (r < 0) {
		errmsg("reading root '%s': %s", root, strerror(-r));
		goto out;
	}
	if (L.n == 0 && fstatat(rootfd, MANIFEST_FILE, &st, 0) == 0)
		snprintf(note, sizeof(note), " (it is a checkpoint itself: ckptctl show '%s')",
			 root);
	ret = list_emit(&L, root, json, note);

out:
	listing_free(&L);
	closedir(dir);
	return ret;
}

/* ---- show ---- */

static void print_dims(const uint64_t *d, unsigned n)
{
	putchar('[');
	for (unsigned i = 0; i < n; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)d[i]);
	putchar(']');
}

static void print_kv_object(const char *title, json_t *obj)
{
	const char *key;
	json_t *v;

	printf("%s:", title);
	if (json_object_size(obj) == 0) {
		printf(" (none)\n");
		return;
	}
	putchar('\n');
	json_object_foreach(obj, key, v) {
		char *k = display_name(key), *s;

		if (json_is_number(v))
			s = NULL;
		else if (json_is_string(v))
			s = display_name(json_string_value(v));
		else
			s = clean(json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY));
		if (json_is_number(v))
			printf("  %s = %.10g\n", k ? k : "?", json_number_value(v));
		else
			printf("  %s = %s\n", k ? k : "?", s ? s : "?");
		free(k);
		free(s);
	}
}

static const char *file_name(const struct manifest *m, uint32_t i)
{
	return i < m->n_files ? m->files[i].path : "?";
}

static void show_print(const char *path, const struct manifest *m, bool verbose)
{
	json_t *root = m->json;
	size_t longest = 4, n_blobs = m->n_items - m->n_tensors;
	char a[32];

	printf("checkpoint %s  (%s)\n", m->name, path);
	printf("  step     %llu\n", (unsigned long long)m->step);
	printf("  time     %s\n", m->time);
	printf("  job      %s\n", m->job);
	printf("  world    %u\n", m->world);
	printf("  size     %s in %zu file(s), %zu tensor(s), %zu blob(s)\n",
	       ctl_human_size(m->total_bytes, a, sizeof(a)), m->n_files, m->n_tensors, n_blobs);
	print_kv_object("metadata", json_object_get(root, "metadata"));
	print_kv_object("metrics", json_object_get(root, "metrics"));

	printf("files:\n");
	for (size_t i = 0; i < m->n_files; i++)
		printf("  %-28s rank %-6u %12s  (%llu bytes)\n", m->files[i].path,
		       m->files[i].rank, ctl_human_size(m->files[i].size, a, sizeof(a)),
		       (unsigned long long)m->files[i].size);

	for (size_t i = 0; i < m->n_items; i++) {
		size_t l = strlen(m->items[i].name);
		longest = l > longest ? l : longest;
	}
	int w = ctl_name_width(longest, 4);

	printf("tensors: %zu\n", m->n_tensors);
	if (m->n_tensors)
		printf("  %-*s %-8s %-24s %7s %12s\n", w, "NAME", "DTYPE", "SHAPE", "CHUNKS",
		       "BYTES");
	for (size_t i = 0; i < m->n_items; i++) {
		const struct manifest_tensor *t = &m->items[i];
		const char *dn = ckpt_dtype_name((enum ckpt_dtype)t->dtype);
		uint64_t bytes = 0;
		char shape[256];
		size_t off = 0;

		if (i == m->n_tensors) {
			printf("blobs: %zu\n", n_blobs);
			printf("  %-*s %12s  %s\n", w, "KEY", "SIZE", "WHERE");
		}
		for (size_t k = 0; k < t->n_chunks; k++)
			bytes += t->chunks[k].end - t->chunks[k].begin;

		if (t->kind == ITEM_BLOB) {
			const struct manifest_chunk *ch = t->n_chunks ? &t->chunks[0] : NULL;
			printf("  %-*s %12s  ", w, t->name, ctl_human_size(bytes, a, sizeof(a)));
			if (ch)
				printf("%s [%llu, %llu)\n", file_name(m, ch->file),
				       (unsigned long long)ch->begin, (unsigned long long)ch->end);
			else
				printf("-\n");
			continue;
		}

		shape[0] = '\0';
		off += (size_t)snprintf(shape, sizeof(shape), "[");
		for (unsigned d = 0; d < t->ndim && off < sizeof(shape); d++)
			off += (size_t)snprintf(shape + off, sizeof(shape) - off, "%s%llu",
						d ? ", " : "", (unsigned long long)t->shape[d]);
		if (off < sizeof(shape))
			snprintf(shape + off, sizeof(shape) - off, "]");
		printf("  %-*s %-8s %-24s %7zu %12s\n", w, t->name, dn ? dn : "?", shape,
		       t->n_chunks, ctl_human_size(bytes, a, sizeof(a)));
		if (!verbose)
			continue;
		for (size_t k = 0; k < t->n_chunks; k++) {
			const struct manifest_chunk *ch = &t->chunks[k];
			printf("      chunk %zu: %s offsets ", k, file_name(m, ch->file));
			print_dims(ch->offsets, t->ndim);
			printf(" shape ");
			print_dims(ch->shape, t->ndim);
			printf(" bytes [%llu, %llu)\n", (unsigned long long)ch->begin,
			       (unsigned long long)ch->end);
		}
	}
	if (n_blobs == 0)
		printf("blobs: 0\n");
}

/* Prints manifest `text` of checkpoint `path` (taken over).  Returns the
 * exit status. */
static int show_text(const char *path, char *text, size_t len, bool json, bool verbose)
{
	char err[512] = "";
	struct manifest m;
	int ret;

	memset(&m, 0, sizeof(m));
	ret = manifest_parse(text, len, &m, err, sizeof(err));
	if (ret < 0) {
		errmsg(ret == -EPROTONOSUPPORT ? "'%s/%s': %s" : "'%s/%s' is corrupt: %s", path,
		       MANIFEST_FILE, err[0] ? err : strerror(-ret));
		free(text);
		return 1;
	}
	if (json) {
		/* The manifest itself (checked above), on one line. */
		json_t *j = json_loadb(text, len, 0, NULL);
		ret = j ? print_json_line(j, 0) : -ENOMEM;
		json_decref(j);
		if (ret < 0)
			errmsg("out of memory");
	} else {
		show_print(path, &m, verbose);
	}
	manifest_free(&m);
	free(text);
	return ret < 0 ? 1 : 0;
}

/* show s3://bucket/prefix/NAME: its manifest.json by one GET; when there
 * is none, a listing tells a missing bucket from a missing checkpoint. */
static int cmd_show_s3(const char *path, bool json, bool verbose)
{
	char err[768] = "";
	struct s3_loc loc;
	char *text = NULL;
	size_t len = 0;
	int r;

	r = s3_url_parse(path, &loc, err, sizeof(err));
	if (r < 0) {
		errmsg("'%s': %s", path, err);
		return 1;
	}
	if (ctl_s3_start(path) < 0)
		return 1;
	r = store_s3_get(path, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len, err, sizeof(err));
	if (r == -ENOENT) {
		r = ctl_s3_probe(path, &loc);
		if (r >= 0)
			errmsg("'%s' is not a committed checkpoint (no %s%s)", path, MANIFEST_FILE,
			       r ? "" : "; nothing is stored under it");
		return 1;
	}
	if (r == -EACCES) {
		ctl_s3_denied(path, err);
		return 1;
	}
	if (r < 0) {
		errmsg("cannot read '%s/%s': %s", path, MANIFEST_FILE,
		       r == -EFBIG ? "larger than ckptctl reads" : err[0] ? err : strerror(-r));
		return 1;
	}
	return show_text(path, text, len, json, verbose);
}

/*
 * ROOT/latest and ROOT/best (when no checkpoint has that name): the
 * committed checkpoint directly in ROOT with the greatest step (ties: the
 * later commit), or the best by `metric` (smallest, or largest with
 * best_max; a missing or NaN metric never best; ties: the greater step).
 * Returns a malloc'd path to show, NULL with the reason said.
 */
static char *resolve_alias(const char *path, const char *metric, bool best_max)
{
	const char *slash = strrchr(path, '/');
	const char *alias = slash ? slash + 1 : path;
	bool latest = !strcmp(alias, "latest");
	struct ret_policy none;
	struct prune_run pr;
	const struct prune_item *pick = NULL;
	char root[PATH_MAX + 1024], *ret = NULL;

	memset(&none, 0, sizeof(none));
	if (!latest) {
		if (!metric) {
			errmsg("show: '%s' needs --metric NAME (and --max if larger is better)",
			       path);
			return NULL;
		}
		none.keep_best = 1;
		snprintf(none.best_metric, sizeof(none.best_metric), "%s", metric);
	}
	snprintf(root, sizeof(root), "%.*s", slash ? (int)(slash - path) : 1,
		 slash ? path : ".");
	if (!root[0])
		snprintf(root, sizeof(root), "/");
	if (s3_is_url(root) && ctl_s3_start(root) < 0)
		return NULL;
	memset(&pr, 0, sizeof(pr));
	pr.root = root;
	pr.policy = &none;
	pr.dry_run = true;
	pr.only_uid = STORE_NO_OWNER;
	pr.remover = STORE_NO_OWNER;
	if (prune_run(&pr) < 0) {
		errmsg("show: %s", pr.err);
		prune_run_free(&pr);
		return NULL;
	}
	for (size_t i = 0; i < pr.n; i++) {
		const struct prune_item *c = &pr.v[i];

		if (latest) {
			if (!pick || c->rc.step > pick->rc.step ||
			    (c->rc.step == pick->rc.step && c->rc.time_s > pick->rc.time_s))
				pick = c;
		} else if (c->rc.has_metric && c->rc.metric == c->rc.metric) {
			double a = c->rc.metric, b = pick ? pick->rc.metric : 0;

			if (!pick || (best_max ? a > b : a < b) ||
			    (a == b && c->rc.step > pick->rc.step))
				pick = c;
		}
	}
	if (!pick)
		errmsg("show: no committed checkpoint in '%s'%s%s%s", root,
		       latest ? "" : " records the metric '", latest ? "" : metric,
		       latest ? "" : "'");
	else if (asprintf(&ret, "%s%s%s", root, root[strlen(root) - 1] == '/' ? "" : "/",
			  pick->name) < 0)
		ret = NULL;
	prune_run_free(&pr);
	return ret;
}

static int cmd_show(const char *path, bool json, bool verbose)
{
	char *text = NULL;
	size_t len = 0;
	int dfd, ret;

	if (s3_is_url(path))
		return cmd_show_s3(path, json, verbose);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		errmsg("cannot open checkpoint '%s': %s", path, strerror(errno));
		return 1;
	}
	ret = fs_read_file_at(dfd, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len);
	close(dfd);
	if (ret == -ENOENT) {
		errmsg("'%s' is not a committed checkpoint (no %s)", path, MANIFEST_FILE);
		return 1;
	}
	if (ret < 0) {
		errmsg("cannot read '%s/%s': %s", path, MANIFEST_FILE,
		       ret == -EFBIG ? "not a regular file of a sane size" : strerror(-ret));
		return 1;
	}
	return show_text(path, text, len, json, verbose);
}

/* ---- main ---- */

/*
 * Whether argv[*i] is option `name` of the command, which takes a value:
 * "--name VALUE" or "--name=VALUE".  Then the value is in *ret and *i
 * points at the last word used; a missing value is a usage error.
 */
static bool opt_value(int argc, char **argv, int *i, const char *cmd, const char *name,
		      const char **ret)
{
	const char *a = argv[*i];
	size_t n = strlen(name);

	if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
		return false;
	if (a[n] == '=') {
		*ret = a + n + 1;
		return true;
	}
	if (*i + 1 >= argc) {
		errmsg("%s: %s needs a value", cmd, name);
		die_usage();
	}
	*ret = argv[++*i];
	return true;
}

/* A plain decimal number ("2", "0.5": no sign, exponent, "inf" or hex) in
 * [lo, hi] for an option; anything else is a usage error. */
static double parse_seconds(const char *cmd, const char *opt, const char *s, double lo,
			    double hi)
{
	char *end;
	double v;

	if (!*s || strspn(s, "0123456789.") != strlen(s) || strspn(s, ".") == strlen(s)) {
		errmsg("%s: %s takes a number of seconds, not '%s'", cmd, opt, s);
		die_usage();
	}
	errno = 0;
	v = strtod(s, &end);
	if (*end || errno || !(v >= lo && v <= hi)) {
		errmsg("%s: %s '%s' is out of range (%.10g..%.10g seconds)", cmd, opt, s, lo, hi);
		die_usage();
	}
	return v;
}

/* A whole decimal number in [lo, hi]; anything else is a usage error. */
static uint64_t parse_count(const char *cmd, const char *opt, const char *s, uint64_t lo,
			    uint64_t hi)
{
	unsigned long long v;
	char *end;

	if (!*s || strspn(s, "0123456789") != strlen(s)) {
		errmsg("%s: %s takes a whole number, not '%s'", cmd, opt, s);
		die_usage();
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end || errno || v < lo || v > hi) {
		errmsg("%s: %s '%s' is out of range (%llu..%llu)", cmd, opt, s,
		       (unsigned long long)lo, (unsigned long long)hi);
		die_usage();
	}
	return (uint64_t)v;
}


int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "config", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *opt_socket = NULL, *opt_config = NULL, *cmd, *arg = NULL, *arg2 = NULL, *val;
	bool json = false, verbose = false, dry_run = false, force = false;
	int64_t grace_s = CTL_GC_GRACE_S;
	const char *best_metric = NULL;
	bool best_max = false;
	struct ctl_watch watch = { .interval_s = CTL_WATCH_DEFAULT_S };
	bool interval_set = false, count_set = false, step_set = false;
	double timeout_s = -1.0; /* wait: forever */
	uint64_t step = 0;
	struct ret_policy policy;
	int c, ret;

	memset(&policy, 0, sizeof(policy));

	/* "+": options stop at the command; its own options follow it. */
	while ((c = getopt_long(argc, argv, "+s:c:hV", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			opt_socket = optarg;
			break;
		case 'c':
			opt_config = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("ckptctl %s\n", CKPT_VERSION);
			return 0;
		default:
			die_usage();
		}
	}
	if (optind >= argc) {
		errmsg("no command given");
		die_usage();
	}
	cmd = argv[optind++];

	for (int i = optind; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--json") == 0 || !strcmp(a, "-o=json") ||
		    !strcmp(a, "--output=json")) {
			json = true;
		} else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && i + 1 < argc) {
			/* -o json (as kubectl and friends spell it) or -o text. */
			if (!strcmp(argv[i + 1], "json")) {
				json = true;
			} else if (strcmp(argv[i + 1], "text")) {
				errmsg("%s: -o takes json or text, not '%s'", cmd, argv[i + 1]);
				die_usage();
			}
			i++;
		} else if ((strcmp(a, "-s") == 0 || strcmp(a, "-c") == 0) && i + 1 < argc) {
			/* Also accepted after the command: "ckptctl status -s PATH". */
			if (a[1] == 's')
				opt_socket = argv[++i];
			else
				opt_config = argv[++i];
		} else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
			verbose = true;
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 0;
		} else if (!strcmp(cmd, "status") && !strcmp(a, "--watch")) {
			watch.on = true;
		} else if (!strcmp(cmd, "status") &&
			   opt_value(argc, argv, &i, cmd, "--interval", &val)) {
			watch.interval_s = parse_seconds(cmd, "--interval", val, CTL_WATCH_MIN_S,
							 CTL_WATCH_MAX_S);
			interval_set = true;
		} else if (!strcmp(cmd, "status") &&
			   opt_value(argc, argv, &i, cmd, "--count", &val)) {
			watch.count = parse_count(cmd, "--count", val, 1, UINT64_MAX);
			count_set = true;
		} else if (!strcmp(cmd, "wait") &&
			   opt_value(argc, argv, &i, cmd, "--timeout", &val)) {
			timeout_s = parse_seconds(cmd, "--timeout", val, 0, CTL_WAIT_MAX_S);
		} else if (!strcmp(cmd, "wait") && opt_value(argc, argv, &i, cmd, "--step", &val)) {
			step = parse_count(cmd, "--step", val, 0, UINT64_MAX);
			step_set = true;
		} else if (!strcmp(cmd, "show") && !strcmp(a, "--metric") && i + 1 < argc) {
			best_metric = argv[++i];
		} else if (!strcmp(cmd, "show") && !strcmp(a, "--max")) {
			best_max = true;
		} else if (!strcmp(cmd, "gc") && !strcmp(a, "--dry-run")) {
			dry_run = true;
		} else if (!strcmp(cmd, "gc") && !strcmp(a, "--grace")) {
			if (i + 1 >= argc || ret_parse_duration(argv[++i], &grace_s) < 0) {
				errmsg("gc: --grace takes a duration: 30m, 24h, 7d (s, m, h, d, w)");
				die_usage();
			}
		} else if (!strcmp(cmd, "prune") && !strcmp(a, "--dry-run")) {
			dry_run = true;
		} else if (!strcmp(cmd, "prune") && !strcmp(a, "--force")) {
			force = true;
		} else if ((!strcmp(cmd, "prune") || !strcmp(cmd, "list")) &&
			   (!strncmp(a, "--keep-", 7) || !strcmp(a, "--max-removals"))) {
			/* --keep-last 3 is the rule "keep_last 3"; --keep-best
			 * takes three words: N METRIC min|max. */
			char rule[512], err[512];
			int words = !strcmp(a, "--keep-best") ? 3 : 1;
			size_t at;

			if (i + words >= argc) {
				errmsg("prune: %s needs %s", a, words == 3 ? "N METRIC min|max" :
									      "a value");
				die_usage();
			}
			at = strlen(a + 2);
			for (int w = 1; w <= words; w++)
				at += 1 + strlen(argv[i + w]);
			if (at >= sizeof(rule)) {
				errmsg("prune: %s: the rule is too long", a);
				die_usage();
			}
			at = (size_t)snprintf(rule, sizeof(rule), "%s", a + 2);
			for (size_t k = 0; k < at; k++)
				rule[k] = rule[k] == '-' ? '_' : rule[k];
			for (int w = 0; w < words; w++)
				at += (size_t)snprintf(rule + at, sizeof(rule) - at, " %s", argv[++i]);
			if (ret_policy_parse_rule(&policy, rule, err, sizeof(err)) < 0) {
				errmsg("prune: %s", err);
				die_usage();
			}
		} else if (a[0] == '-' && a[1] != '\0') {
			errmsg("%s: unknown option '%s'", cmd, a);
			die_usage();
		} else if (!arg) {
			arg = a;
		} else if (!arg2 && (!strcmp(cmd, "pin") || !strcmp(cmd, "unpin") ||
				     !strcmp(cmd, "wait") || !strcmp(cmd, "spill"))) {
			arg2 = a;
		} else {
			errmsg("%s: unexpected argument '%s'", cmd, a);
			die_usage();
		}
	}

	if (strcmp(cmd, "status") == 0) {
		if (arg || verbose) {
			errmsg("status takes only --json, --watch, --interval and --count");
			die_usage();
		}
		if ((interval_set || count_set) && !watch.on) {
			errmsg("status: --interval and --count go with --watch");
			die_usage();
		}
		ret = ctl_status(opt_socket, opt_config, json, &watch);
	} else if (strcmp(cmd, "wait") == 0) {
		if (!arg || verbose || (step_set && arg2) || (!step_set && !arg2)) {
			errmsg(!arg ? "wait: ROOT is missing" :
			       verbose ? "wait takes ROOT, NAME or --step N, --timeout and --json" :
			       arg2 ? "wait: give NAME or --step N, not both" :
				      "wait: NAME (or --step N) is missing");
			die_usage();
		}
		ret = ctl_wait(arg, arg2, step, timeout_s, json);
	} else if (strcmp(cmd, "list") == 0) {
		if (!arg || verbose) {
			errmsg(arg ? "list takes only ROOT, rules and --json" : "list: ROOT is missing");
			die_usage();
		}
		g_list_policy = &policy;
		ret = cmd_list(arg, json);
	} else if (strcmp(cmd, "show") == 0) {
		const char *leaf = arg ? strrchr(arg, '/') : NULL;
		char *real = NULL;

		if (!arg) {
			errmsg("show: ROOT/NAME is missing");
			die_usage();
		}
		leaf = leaf ? leaf + 1 : arg;
		if ((!strcmp(leaf, "latest") || !strcmp(leaf, "best")) && !s3_is_url(arg) &&
		    access(arg, F_OK) == 0)
			leaf = ""; /* a checkpoint of that name: itself */
		if (!strcmp(leaf, "latest") || !strcmp(leaf, "best")) {
			real = resolve_alias(arg, best_metric, best_max);
			if (!real) {
				ctl_s3_stop();
				return 1;
			}
			if (!json)
				printf("%s: %s\n", leaf, real);
		}
		ret = cmd_show(real ? real : arg, json, verbose);
		free(real);
	} else if (strcmp(cmd, "pin") == 0 || strcmp(cmd, "unpin") == 0) {
		if (!arg || !arg2 || verbose) {
			errmsg("%s takes ROOT and NAME", cmd);
			die_usage();
		}
		ret = ctl_pin(arg, arg2, cmd[0] == 'p', json);
	} else if (strcmp(cmd, "prune") == 0) {
		if (!arg || verbose) {
			errmsg(arg ? "prune takes ROOT, --dry-run, --force, --json and rules" :
				     "prune: ROOT is missing");
			die_usage();
		}
		ret = ctl_prune(arg, &policy, force, dry_run, json);
	} else if (strcmp(cmd, "gc") == 0) {
		if (!arg || verbose) {
			errmsg(arg ? "gc takes ROOT, --dry-run, --grace and --json" : "gc: ROOT is missing");
			die_usage();
		}
		ret = ctl_gc(arg, grace_s, dry_run, json);
	} else if (strcmp(cmd, "spill") == 0) {
		bool list = arg && !strcmp(arg, "list"), drop = arg && !strcmp(arg, "drop");

		if ((!list && !drop) || verbose || (list && arg2) || (drop && !arg2)) {
			errmsg(!list && !drop ? "spill takes list or drop" :
			       list	      ? "spill list takes only --json" :
			       arg2	      ? "spill drop takes ID|ROOT/NAME and --json" :
						"spill drop: ID or ROOT/NAME is missing");
			die_usage();
		}
		ret = ctl_spill(opt_socket, opt_config, arg, arg2, json);
	} else if (strcmp(cmd, "verify") == 0) {
		if (!arg || verbose) {
			errmsg(arg ? "verify takes ROOT/NAME and --json" : "verify: ROOT/NAME is missing");
			die_usage();
		}
		ret = ctl_verify(arg, json);
	} else {
		errmsg("unknown command '%s'", cmd);
		die_usage();
	}

	ctl_s3_stop();
	if (fflush(stdout) != 0 && errno != EPIPE) {
		errmsg("writing output: %s", strerror(errno));
		return 1;
	}
	return ret;
}
