/* SPDX-License-Identifier: MIT */
/*
 * ckpt_bench - times saves through libckpt's public API against a running
 * ckptd, and measures the memcpy and O_DIRECT ceilings they are compared to.
 *
 *   ckpt_bench --scenario save    --socket S --root R --saves N --bytes B --tensors T
 *   ckpt_bench --scenario ranks   --socket S --root R --saves N --bytes B --tensors T --ranks K
 *   ckpt_bench --scenario memcpy  --bytes B
 *   ckpt_bench --scenario odirect --path FILE --bytes B
 *
 * Prints one JSON object on stdout (see bench/RESULTS.md for the fields) and
 * exits 0, or prints a reason on stderr and exits 1.  bench/run.py drives it.
 *
 * Timing contract (bench/RESULTS.md): a save's clock starts when the save call
 * starts (ckpt_save_begin), and stops when commit returns (call_ms), when
 * the staged future completes (staged_ms) and when the committed future
 * completes (committed_ms).  In "ranks" every rank's clock starts at the
 * moment the parent releases them all together, so the max across ranks is
 * the job's time.  State buffers are allocated and touched before the first
 * save; connecting (arena creation) is timed on its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "store/fsutil.h"

#define MAX_SAVES   1000
#define MAX_RANKS   256
#define MAX_TENSORS 1000000
#define ERR_LEN     512

struct opts {
	const char *scenario;
	const char *socket_path;
	char root[PATH_MAX];
	const char *path; /* odirect: the file to write */
	unsigned saves;
	uint64_t bytes;
	unsigned tensors;
	unsigned ranks;
	uint64_t arena; /* 0: derived from bytes and tensors */
	unsigned threads;
	unsigned timeout_s;
	bool keep;
};

/* The state of one rank: `count` fp32 tensors laid back to back in one
 * buffer, sizes differing by at most one element so the total is exact.
 * With world > 1 each tensor is this rank's chunk of a global tensor of
 * world chunks (as FSDP shards a model): chunk `rank` at offset rank * n. */
struct state {
	unsigned rank, world;
	float *buf;
	uint64_t bytes;
	unsigned count;
	uint64_t *elems;   /* per tensor */
	uint64_t *first;   /* element index where each tensor starts */
	char **names;
};

/* What one save of one rank measured; absolute CLOCK_MONOTONIC ns, so that
 * records of different processes share one time base.  Sent through a pipe
 * in one write (smaller than PIPE_BUF, hence atomic). */
struct save_rec {
	int32_t rank;
	int32_t save;  /* -1: the connect record */
	int32_t rc;    /* 0 or -errno */
	int32_t pad;
	uint64_t t_start, t_call, t_staged, t_committed;
	double connect_ms;
	uint64_t arena_bytes;
	char err[ERR_LEN];
};

_Static_assert(sizeof(struct save_rec) <= PIPE_BUF, "records must be written atomically");

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double ms_between(uint64_t a, uint64_t b)
{
	return b >= a ? (double)(b - a) / 1e6 : -(double)(a - b) / 1e6;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("ckpt_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: ckpt_bench --scenario save|ranks|memcpy|odirect [options]\n"
		"  --socket PATH    ckptd socket (save, ranks)\n"
		"  --root DIR       checkpoint root, inside one of the daemon's roots\n"
		"  --saves N        number of saves (default 5)\n"
		"  --bytes B        state bytes per rank, a multiple of 4 (K/M/G suffixes)\n"
		"  --tensors T      fp32 tensors per rank (default 256)\n"
		"  --ranks K        processes in the job (ranks; default 8)\n"
		"  --arena B        staging arena to ask for (default: the shard file size)\n"
		"  --threads N      library copy threads (default: the library's)\n"
		"  --timeout S      bound on any wait, seconds (default 900)\n"
		"  --path FILE      file to write (odirect)\n"
		"  --keep           keep the last checkpoint\n");
	exit(2);
}

static uint64_t parse_size(const char *s, const char *what)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		die("bad %s '%s'", what, s);
	switch (*end) {
	case 'K': case 'k': mul = 1ull << 10; end++; break;
	case 'M': case 'm': mul = 1ull << 20; end++; break;
	case 'G': case 'g': mul = 1ull << 30; end++; break;
	case 'T': case 't': mul = 1ull << 40; end++; break;
	default: break;
	}
	if (*end != '\0' || (v && mul > UINT64_MAX / v))
		die("bad %s '%s'", what, s);
	return v * mul;
}

static unsigned parse_uint(const char *s, const char *what, unsigned lo, unsigned hi)
{
	uint64_t v = parse_size(s, what);

	if (v < lo || v > hi)
		die("%s must be in %u..%u, not '%s'", what, lo, hi, s);
	return (unsigned)v;
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "scenario", required_argument, NULL, 's' },
		{ "socket", required_argument, NULL, 'S' },
		{ "root", required_argument, NULL, 'r' },
		{ "saves", required_argument, NULL, 'n' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "tensors", required_argument, NULL, 't' },
		{ "ranks", required_argument, NULL, 'k' },
		{ "arena", required_argument, NULL, 'a' },
		{ "threads", required_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "path", required_argument, NULL, 'p' },
		{ "keep", no_argument, NULL, 'K' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *root = NULL;
	int c;

	*o = (struct opts){ .saves = 5, .tensors = 256, .ranks = 8, .timeout_s = 900 };
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': o->scenario = optarg; break;
		case 'S': o->socket_path = optarg; break;
		case 'r': root = optarg; break;
		case 'n': o->saves = parse_uint(optarg, "--saves", 1, MAX_SAVES); break;
		case 'b': o->bytes = parse_size(optarg, "--bytes"); break;
		case 't': o->tensors = parse_uint(optarg, "--tensors", 1, MAX_TENSORS); break;
		case 'k': o->ranks = parse_uint(optarg, "--ranks", 1, MAX_RANKS); break;
		case 'a': o->arena = parse_size(optarg, "--arena"); break;
		case 'j': o->threads = parse_uint(optarg, "--threads", 1, 256); break;
		case 'T': o->timeout_s = parse_uint(optarg, "--timeout", 1, 7 * 86400); break;
		case 'p': o->path = optarg; break;
		case 'K': o->keep = true; break;
		default: usage();
		}
	}
	if (optind != argc || !o->scenario)
		usage();
	if (o->bytes == 0)
		die("--bytes is required and must be > 0");
	if (o->bytes % 4)
		die("--bytes must be a multiple of 4 (fp32 tensors)");

	if (!strcmp(o->scenario, "memcpy"))
		return;
	if (!strcmp(o->scenario, "odirect")) {
		if (!o->path)
			die("--path is required for odirect");
		return;
	}
	if (strcmp(o->scenario, "save") && strcmp(o->scenario, "ranks"))
		die("unknown scenario '%s'", o->scenario);
	if (!o->socket_path || !root)
		die("--socket and --root are required for %s", o->scenario);
	/* The daemon accepts absolute roots only; resolve a relative one here
	 * rather than fail on the first save. */
	if (!realpath(root, o->root))
		die("root '%s': %s", root, strerror(errno));
	if (o->bytes / 4 < o->tensors)
		die("--bytes too small for %u fp32 tensors", o->tensors);
	if (!strcmp(o->scenario, "save"))
		o->ranks = 1;
}

/* ---- state ---------------------------------------------------------------- */

static void state_init(struct state *s, uint64_t bytes, unsigned count, unsigned rank,
		       unsigned world)
{
	uint64_t n = bytes / 4, per = n / count, extra = n % count, at = 0;
	void *p;

	*s = (struct state){ .rank = rank, .world = world, .bytes = bytes, .count = count };
	/* Huge-page alignment, as a tensor allocator would give for big
	 * tensors; the pages are touched below, before any timing. */
	if (posix_memalign(&p, 2u << 20, bytes))
		die("cannot allocate %" PRIu64 " bytes of state", bytes);
	s->buf = p;
	s->elems = calloc(count, sizeof(*s->elems));
	s->first = calloc(count, sizeof(*s->first));
	s->names = calloc(count, sizeof(*s->names));
	if (!s->elems || !s->first || !s->names)
		die("out of memory");
	for (unsigned i = 0; i < count; i++) {
		s->elems[i] = per + (i < extra ? 1 : 0);
		s->first[i] = at;
		at += s->elems[i];
		if (asprintf(&s->names[i], "layer.%06u.weight", i) < 0)
			die("out of memory");
	}
	for (uint64_t i = 0; i < n; i++)
		s->buf[i] = (float)(i & 0xffff) * 0.5f;
}

/* A training step's worth of change: one element of every tensor. */
static void state_mutate(struct state *s, unsigned save)
{
	for (unsigned i = 0; i < s->count; i++)
		s->buf[s->first[i]] += 1.0f + (float)save;
}

static void state_free(struct state *s)
{
	for (unsigned i = 0; s->names && i < s->count; i++)
		free(s->names[i]);
	free(s->names);
	free(s->first);
	free(s->elems);
	free(s->buf);
}

/* The shard file is the data plus a safetensors header (~100 bytes of JSON
 * per tensor, padded to 4 KiB); ask for an arena that holds all of it, so the
 * figures measure staging and draining rather than backpressure. */
static uint64_t default_arena(uint64_t bytes, unsigned tensors)
{
	uint64_t header = 8 + (uint64_t)tensors * 256 + (1u << 20);

	return bytes + header + (16u << 20);
}

/* ---- one save ------------------------------------------------------------- */

/* Removes <root>/<name> recursively; a missing directory is fine. */
static void remove_checkpoint(const char *root, const char *name)
{
	char path[PATH_MAX];
	int r;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, name) >= sizeof(path))
		die("path too long under '%s'", root);
	r = fs_rm_rf_at(AT_FDCWD, path);
	if (r < 0)
		die("cannot remove '%s': %s", path, strerror(-r));
}

static void save_name(char *buf, size_t len, pid_t job_pid, unsigned i)
{
	snprintf(buf, len, "bench-%ld-%u", (long)job_pid, i);
}

/* Saves the whole state once and fills rec (times absolute).  Returns 0 or
 * -errno with rec->err set. */
static int timed_save(struct ckpt_client *cl, const struct opts *o, const struct state *s,
		      const char *name, unsigned i, struct save_rec *rec)
{
	struct ckpt_save *save = NULL;
	struct ckpt_future *staged, *committed;
	int64_t tmo = (int64_t)o->timeout_s * 1000;
	int r;

	rec->t_start = now_ns();
	r = ckpt_save_begin(cl, o->root, name, i, &save);
	if (r < 0) {
		snprintf(rec->err, sizeof(rec->err), "ckpt_save_begin: %s (%s)", strerror(-r),
			 ckpt_last_error());
		return r;
	}
	for (unsigned t = 0; t < s->count; t++) {
		uint64_t shape[1] = { s->elems[t] };
		uint64_t gshape[1] = { s->elems[t] * s->world };
		uint64_t offs[1] = { s->elems[t] * s->rank };
		struct ckpt_tensor ten = {
			CKPT_TENSOR_INIT,
			.name = s->names[t],
			.dtype = CKPT_F32,
			.ndim = 1,
			.shape = shape,
			.data = s->buf + s->first[t],
			.device = CKPT_DEVICE_HOST,
			.global_shape = s->world > 1 ? gshape : NULL,
			.offsets = s->world > 1 ? offs : NULL,
		};

		r = ckpt_save_add_tensor(save, &ten);
		if (r < 0) {
			snprintf(rec->err, sizeof(rec->err), "ckpt_save_add_tensor '%s': %s (%s)",
				 s->names[t], strerror(-r), ckpt_last_error());
			goto out;
		}
	}
	r = ckpt_save_commit(save, &staged, &committed);
	rec->t_call = now_ns();
	if (r < 0) {
		snprintf(rec->err, sizeof(rec->err), "ckpt_save_commit: %s (%s)", strerror(-r),
			 ckpt_last_error());
		goto out;
	}
	r = ckpt_future_wait(staged, tmo);
	rec->t_staged = now_ns();
	if (r < 0) {
		snprintf(rec->err, sizeof(rec->err), "staged future: %s (%s)", strerror(-r),
			 ckpt_future_error(staged));
		goto out;
	}
	r = ckpt_future_wait(committed, tmo);
	rec->t_committed = now_ns();
	if (r < 0) {
		snprintf(rec->err, sizeof(rec->err), "committed future: %s (%s)", strerror(-r),
			 ckpt_future_error(committed));
		goto out;
	}
out:
	ckpt_save_free(save);
	return r;
}

static int do_connect(const struct opts *o, const char *job, unsigned rank, unsigned world,
		      struct ckpt_client **ret_cl, struct save_rec *rec)
{
	struct ckpt_connect_opts co = {
		CKPT_CONNECT_OPTS_INIT,
		.socket_path = o->socket_path,
		.job = job,
		.rank = rank,
		.world = world,
		.arena_bytes = o->arena ? o->arena : default_arena(o->bytes, o->tensors),
		.copy_threads = o->threads,
	};
	uint64_t t0 = now_ns();
	int r;

	r = ckpt_connect(&co, ret_cl);
	rec->connect_ms = ms_between(t0, now_ns());
	if (r < 0) {
		snprintf(rec->err, sizeof(rec->err), "ckpt_connect to '%s': %s (%s)", o->socket_path,
			 strerror(-r), ckpt_last_error());
		return r;
	}
	rec->arena_bytes = ckpt_client_arena_bytes(*ret_cl);
	return 0;
}

/* ---- JSON output ---------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of v[from..n) (all of v if that is empty). */
static double median_from(const double *v, unsigned n, unsigned from)
{
	double tmp[MAX_SAVES];
	unsigned m;

	if (from >= n)
		from = 0;
	m = n - from;
	memcpy(tmp, v + from, m * sizeof(*v));
	qsort(tmp, m, sizeof(*tmp), cmp_double);
	return m % 2 ? tmp[m / 2] : (tmp[m / 2 - 1] + tmp[m / 2]) / 2;
}

static void print_array(const char *key, const double *v, unsigned n)
{
	printf("\"%s\": [", key);
	for (unsigned i = 0; i < n; i++)
		printf("%s%.3f", i ? ", " : "", v[i]);
	printf("]");
}

/* The times of one rank (or of the job: max across ranks), per save. */
struct series {
	double call[MAX_SAVES], staged[MAX_SAVES], committed[MAX_SAVES];
};

static void print_series_summary(const struct series *s, unsigned n)
{
	printf("\"call_ms\": %.3f, \"staged_ms\": %.3f, \"committed_ms\": %.3f, "
	       "\"first_call_ms\": %.3f, \"first_staged_ms\": %.3f, \"first_committed_ms\": %.3f, ",
	       median_from(s->call, n, 1), median_from(s->staged, n, 1),
	       median_from(s->committed, n, 1), s->call[0], s->staged[0], s->committed[0]);
	print_array("per_save_call_ms", s->call, n);
	printf(", ");
	print_array("per_save_staged_ms", s->staged, n);
	printf(", ");
	print_array("per_save_committed_ms", s->committed, n);
}

/* ---- scenarios ------------------------------------------------------------ */

static void scenario_save(const struct opts *o)
{
	struct ckpt_client *cl = NULL;
	struct state st;
	struct save_rec rec = { 0 };
	struct series *ser = calloc(1, sizeof(*ser));
	char name[CKPT_MAX_NAME_LEN + 1], prev[CKPT_MAX_NAME_LEN + 1] = "";
	char job[64];
	pid_t pid = getpid();
	double connect_ms;
	uint64_t arena;

	if (!ser)
		die("out of memory");
	state_init(&st, o->bytes, o->tensors, 0, 1);
	snprintf(job, sizeof(job), "bench-%ld", (long)pid);
	if (do_connect(o, job, 0, 1, &cl, &rec) < 0)
		die("%s", rec.err);
	connect_ms = rec.connect_ms;
	arena = rec.arena_bytes;

	for (unsigned i = 0; i < o->saves; i++) {
		if (i > 0)
			state_mutate(&st, i);
		if (prev[0])
			remove_checkpoint(o->root, prev);
		save_name(name, sizeof(name), pid, i);
		memset(&rec, 0, sizeof(rec));
		if (timed_save(cl, o, &st, name, i, &rec) < 0)
			die("save %u of %u ('%s'): %s", i + 1, o->saves, name, rec.err);
		ser->call[i] = ms_between(rec.t_start, rec.t_call);
		ser->staged[i] = ms_between(rec.t_start, rec.t_staged);
		ser->committed[i] = ms_between(rec.t_start, rec.t_committed);
		snprintf(prev, sizeof(prev), "%s", name);
	}
	ckpt_disconnect(cl);
	if (!o->keep)
		remove_checkpoint(o->root, prev);

	printf("{\"scenario\": \"save\", \"bytes\": %" PRIu64 ", \"tensors\": %u, \"saves\": %u, "
	       "\"ranks\": 1, \"arena_bytes\": %" PRIu64 ", \"connect_ms\": %.3f, ",
	       o->bytes, o->tensors, o->saves, arena, connect_ms);
	print_series_summary(ser, o->saves);
	printf("}\n");
	state_free(&st);
	free(ser);
}

/* Writes all of buf; returns false if the other side is gone. */
static bool write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		len -= (size_t)w;
	}
	return true;
}

/* Reads exactly len bytes; returns false on EOF or error. */
static bool read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t r = read(fd, p, len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		len -= (size_t)r;
	}
	return true;
}

/* One rank of the "ranks" scenario, in a child process.  Protocol with the
 * parent: send the connect record; then per save: send one byte on the
 * shared `ready` pipe once the state is mutated, wait for one byte on this
 * rank's own `go` pipe, save, send the save record.  Never returns. */
static void rank_main(const struct opts *o, unsigned rank, pid_t job_pid, int ready_fd, int go_fd,
		      int rec_fd)
{
	struct ckpt_client *cl = NULL;
	struct state st;
	struct save_rec rec = { .rank = (int32_t)rank, .save = -1 };
	char name[CKPT_MAX_NAME_LEN + 1], job[64];
	int r;

	/* A rank must not outlive an aborted parent. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != job_pid)
		_exit(3);

	state_init(&st, o->bytes, o->tensors, rank, o->ranks);
	snprintf(job, sizeof(job), "bench-%ld", (long)job_pid);
	r = do_connect(o, job, rank, o->ranks, &cl, &rec);
	rec.rc = r;
	if (!write_all(rec_fd, &rec, sizeof(rec)) || r < 0)
		_exit(1);

	for (unsigned i = 0; i < o->saves; i++) {
		char b = 'r';

		if (i > 0)
			state_mutate(&st, i);
		if (!write_all(ready_fd, &b, 1) || !read_all(go_fd, &b, 1))
			_exit(1);
		save_name(name, sizeof(name), job_pid, i);
		memset(&rec, 0, sizeof(rec));
		rec.rank = (int32_t)rank;
		rec.save = (int32_t)i;
		rec.rc = timed_save(cl, o, &st, name, i, &rec);
		if (!write_all(rec_fd, &rec, sizeof(rec)) || rec.rc < 0)
			_exit(1);
	}
	ckpt_disconnect(cl);
	state_free(&st);
	_exit(0);
}

static pid_t children[MAX_RANKS];
static unsigned n_children;

static void kill_children(void)
{
	for (unsigned i = 0; i < n_children; i++) {
		if (children[i] > 0) {
			kill(children[i], SIGKILL);
			waitpid(children[i], NULL, 0);
			children[i] = 0;
		}
	}
}

static void die_children(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_children(const char *fmt, ...)
{
	va_list ap;

	kill_children();
	fputs("ckpt_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void scenario_ranks(const struct opts *o)
{
	unsigned k = o->ranks, n = o->saves;
	int ready[2], go[MAX_RANKS][2], recp[MAX_RANKS][2];
	struct series *ser = calloc(k + 1, sizeof(*ser)); /* [k] = max across ranks */
	double connect_ms[MAX_RANKS];
	uint64_t arena[MAX_RANKS];
	char name[CKPT_MAX_NAME_LEN + 1];
	pid_t pid = getpid();

	if (!ser)
		die("out of memory");
	if (pipe2(ready, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	for (unsigned r = 0; r < k; r++) {
		if (pipe2(recp[r], O_CLOEXEC) < 0 || pipe2(go[r], O_CLOEXEC) < 0)
			die_children("pipe: %s", strerror(errno));
		fflush(NULL);
		children[r] = fork();
		if (children[r] < 0)
			die_children("fork: %s", strerror(errno));
		if (children[r] == 0) {
			close(ready[0]);
			for (unsigned q = 0; q <= r; q++) {
				close(recp[q][0]);
				close(go[q][1]);
			}
			rank_main(o, r, pid, ready[1], go[r][0], recp[r][1]);
		}
		n_children = r + 1;
		close(recp[r][1]);
		close(go[r][0]);
	}
	close(ready[1]);

	for (unsigned r = 0; r < k; r++) {
		struct save_rec rec;

		if (!read_all(recp[r][0], &rec, sizeof(rec)))
			die_children("rank %u exited before connecting", r);
		if (rec.rc < 0)
			die_children("rank %u: %s", r, rec.err);
		connect_ms[r] = rec.connect_ms;
		arena[r] = rec.arena_bytes;
	}

	for (unsigned i = 0; i < n; i++) {
		char buf[MAX_RANKS], g = 'g';
		uint64_t t0;

		/* Every rank is connected, mutated and waiting on `go`. */
		if (!read_all(ready[0], buf, k))
			die_children("a rank exited before save %u", i + 1);
		if (i > 0) {
			save_name(name, sizeof(name), pid, i - 1);
			remove_checkpoint(o->root, name);
		}
		/* One pipe per rank, so that a byte can only start its own
		 * rank; the k writes take microseconds. */
		t0 = now_ns();
		for (unsigned r = 0; r < k; r++)
			if (!write_all(go[r][1], &g, 1))
				die_children("rank %u exited before save %u", r, i + 1);
		ser[k].call[i] = ser[k].staged[i] = ser[k].committed[i] = 0;
		for (unsigned r = 0; r < k; r++) {
			struct save_rec rec;

			if (!read_all(recp[r][0], &rec, sizeof(rec)))
				die_children("rank %u exited during save %u", r, i + 1);
			if (rec.rc < 0)
				die_children("rank %u, save %u of %u: %s", r, i + 1, n, rec.err);
			ser[r].call[i] = ms_between(t0, rec.t_call);
			ser[r].staged[i] = ms_between(t0, rec.t_staged);
			ser[r].committed[i] = ms_between(t0, rec.t_committed);
			if (ser[r].call[i] > ser[k].call[i])
				ser[k].call[i] = ser[r].call[i];
			if (ser[r].staged[i] > ser[k].staged[i])
				ser[k].staged[i] = ser[r].staged[i];
			if (ser[r].committed[i] > ser[k].committed[i])
				ser[k].committed[i] = ser[r].committed[i];
		}
	}
	for (unsigned r = 0; r < k; r++) {
		int status;

		if (waitpid(children[r], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			die_children("rank %u did not exit cleanly", r);
		children[r] = 0;
	}
	if (!o->keep) {
		save_name(name, sizeof(name), pid, n - 1);
		remove_checkpoint(o->root, name);
	}

	double cmax = 0;
	for (unsigned r = 0; r < k; r++)
		cmax = connect_ms[r] > cmax ? connect_ms[r] : cmax;
	printf("{\"scenario\": \"ranks\", \"bytes\": %" PRIu64 ", \"tensors\": %u, \"saves\": %u, "
	       "\"ranks\": %u, \"total_bytes\": %" PRIu64 ", \"arena_bytes\": %" PRIu64 ", "
	       "\"connect_ms\": %.3f, ",
	       o->bytes, o->tensors, n, k, o->bytes * k, arena[0], cmax);
	print_series_summary(&ser[k], n);
	printf(", \"per_rank\": [");
	for (unsigned r = 0; r < k; r++) {
		printf("%s{\"rank\": %u, \"connect_ms\": %.3f, ", r ? ", " : "", r, connect_ms[r]);
		print_series_summary(&ser[r], n);
		printf("}");
	}
	printf("]}\n");
	free(ser);
}

static void scenario_memcpy(const struct opts *o)
{
	const unsigned rounds = 5;
	double best = 0, all[5];
	char *src, *dst;

	src = mmap(NULL, o->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst = mmap(NULL, o->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || dst == MAP_FAILED)
		die("cannot map 2 x %" PRIu64 " bytes: %s", o->bytes, strerror(errno));
	/* Same treatment as the state buffers: touched once beforehand, so the
	 * copies measure bandwidth, not page faults. */
	memset(src, 0x5a, o->bytes);
	memset(dst, 0, o->bytes);
	for (unsigned i = 0; i < rounds; i++) {
		uint64_t t0 = now_ns(), t1;

		src[(i * 4096) % o->bytes] ^= 1;
		memcpy(dst, src, o->bytes);
		t1 = now_ns();
		all[i] = (double)o->bytes / (1u << 30) / ((double)(t1 - t0) / 1e9);
		best = all[i] > best ? all[i] : best;
	}
	if (dst[0] != src[0])
		die("memcpy miscopied");
	printf("{\"scenario\": \"memcpy\", \"bytes\": %" PRIu64 ", \"gibps\": %.4f, ", o->bytes, best);
	print_array("rounds_gibps", all, rounds);
	printf("}\n");
	munmap(src, o->bytes);
	munmap(dst, o->bytes);
}

/* The fallback for fio: `bytes` written sequentially from one registered
 * buffer in 8 MiB O_DIRECT blocks, 8 in flight, then fsync; timed from open
 * to the end of fsync. */
static void scenario_odirect(const struct opts *o)
{
	const unsigned bs = 8u << 20, depth = 8;
	struct io_uring ring;
	struct iovec iov;
	uint64_t submitted = 0, done = 0, t0, t1;
	unsigned inflight = 0;
	void *buf;
	int fd, r;

	if (posix_memalign(&buf, 2u << 20, (size_t)bs * depth))
		die("out of memory");
	memset(buf, 0xa5, (size_t)bs * depth);
	r = io_uring_queue_init(depth * 2, &ring, 0);
	if (r < 0)
		die("io_uring_queue_init: %s", strerror(-r));
	iov = (struct iovec){ .iov_base = buf, .iov_len = (size_t)bs * depth };
	r = io_uring_register_buffers(&ring, &iov, 1);
	if (r < 0)
		die("io_uring_register_buffers: %s", strerror(-r));

	t0 = now_ns();
	fd = open(o->path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
	if (fd < 0)
		die("open '%s' with O_DIRECT: %s", o->path, strerror(errno));
	while (done < o->bytes) {
		while (inflight < depth && submitted < o->bytes) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			uint64_t len = o->bytes - submitted < bs ? o->bytes - submitted : bs;
			unsigned slot = (unsigned)((submitted / bs) % depth);

			/* O_DIRECT needs 4 KiB multiples: round a short tail up;
			 * the file is truncated back to size afterwards. */
			len = (len + 4095) & ~4095ull;
			io_uring_prep_write_fixed(sqe, fd, (char *)buf + (size_t)slot * bs,
						  (unsigned)len, submitted, 0);
			io_uring_sqe_set_data64(sqe, len);
			submitted += len;
			inflight++;
		}
		r = io_uring_submit_and_wait(&ring, 1);
		if (r < 0 && r != -EINTR)
			die("io_uring_submit: %s", strerror(-r));
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		io_uring_for_each_cqe(&ring, head, cqe) {
			if (cqe->res < 0)
				die("write '%s': %s", o->path, strerror(-cqe->res));
			if ((uint64_t)cqe->res != io_uring_cqe_get_data64(cqe))
				die("short write to '%s'", o->path);
			done += (uint64_t)cqe->res;
			inflight--;
			seen++;
		}
		io_uring_cq_advance(&ring, seen);
	}
	if (ftruncate(fd, (off_t)o->bytes) < 0 || fsync(fd) < 0)
		die("fsync '%s': %s", o->path, strerror(errno));
	t1 = now_ns();
	close(fd);
	unlink(o->path);
	io_uring_queue_exit(&ring);
	free(buf);
	printf("{\"scenario\": \"odirect\", \"bytes\": %" PRIu64 ", \"seconds\": %.6f, "
	       "\"gibps\": %.4f, \"engine\": \"built-in io_uring O_DIRECT, bs=8M, depth=8, fsync\"}\n",
	       o->bytes, (double)(t1 - t0) / 1e9,
	       (double)o->bytes / (1u << 30) / ((double)(t1 - t0) / 1e9));
}

int main(int argc, char **argv)
{
	struct opts o;

	parse_opts(argc, argv, &o);
	/* A dead daemon must fail a write to its socket, not kill us. */
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(o.scenario, "memcpy"))
		scenario_memcpy(&o);
	else if (!strcmp(o.scenario, "odirect"))
		scenario_odirect(&o);
	else if (!strcmp(o.scenario, "save"))
		scenario_save(&o);
	else
		scenario_ranks(&o);
	fflush(stdout);
	return 0;
}
