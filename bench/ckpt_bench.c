/* SPDX-License-Identifier: MIT */
/*
 * ckpt_bench - ckptd's side of `make bench`, and the two limits that are
 * measured on the very bytes ckptd saves.  bench/run.py drives it; it also
 * runs by hand (commands on stdin).
 *
 *   ckpt_bench --socket S --root R --bytes B [--tensors T] [--ranks K]
 *              [--client NAME:THREADS]... [--arena B] [--max-depth D]
 *              [--timeout S] [--gpu] [--cols C] [--reshard M] [--loader-arena B]
 *              [--job PREFIX] [--resident] [--no-limits]
 *
 * It forks K rank processes (also for K = 1, so that every command runs the
 * same way).  Each rank builds its state (B bytes in T fp32 tensors, touched
 * before anything is timed), connects one ckptd client per --client (each
 * client is rank r of its own job, so one state can be saved with several
 * copy-thread settings: THREADS 0 is the library's default), and makes the
 * limits' buffer: a memfd of B bytes made exactly like an arena
 * (arena_create: huge pages advised, every page allocated and faulted in),
 * holding a copy of the state, registered with io_uring in <= 1 GiB iovecs
 * (a kernel limit on one registered buffer).  Then the program prints
 * {"event": "ready", ...} and runs commands read from stdin, one per line,
 * printing one JSON line for each:
 *
 *   save CLIENT [one] [notify] [keep]
 *                               one save of the whole state through CLIENT;
 *                               "one": the same bytes described as one
 *                               tensor per rank; "notify": print
 *                               {"event": "staged"} once every rank is staged;
 *                               "keep": save the state as it is (no training
 *                               step first) and keep the checkpoint for
 *                               "load" and "read" (see "loads" below)
 *   copy memcpy|stream CLIENT   the copy limit: the state copied into the
 *                               limits' memfd by as many threads as CLIENT
 *                               copies with, in pieces of CLIENT's slot size,
 *                               with glibc memcpy or with SSE2 streaming
 *                               stores (the client's own host engine)
 *   d2h whole|chunked CLIENT    (--gpu) the D2H limit: the state's device
 *                               bytes copied into the limits' memfd, pinned
 *                               (see "device memory" below)
 *   write DIR DEPTH             the built-in disk writer: a fresh file per
 *                               rank in DIR, fallocate, the memfd written
 *                               from its registered buffers in 8 MiB O_DIRECT
 *                               blocks, DEPTH in flight, fsync of the file and
 *                               then of DIR; timed from open to the last fsync
 *   load [one] [reshard] [via CLIENT] [from NAME]
 *                               the kept checkpoint (of the "one" view with
 *                               "one") loaded back with ckpt_load_*, page
 *                               cache dropped first; "reshard": by the first
 *                               M ranks (--reshard M), each loading a column
 *                               band of every tensor; "via": through CLIENT
 *                               (ckpt_load_set_client: files whose image
 *                               ckptd holds come from its memory, the other
 *                               local files are lent to ckptd, which reads
 *                               them with io_uring and O_DIRECT into CLIENT's
 *                               arena; "bytes_daemon" says how many bytes it
 *                               read, "bytes_resident" how many came from
 *                               images); without it the library reads the
 *                               files itself (buffered preadv); "from":
 *                               checkpoint NAME under the root instead, saved
 *                               by another ckpt_bench (see "restarts" below)
 *   read DEPTH [one]            the built-in reader (the read limit): each
 *                               rank's shard files of the kept checkpoint
 *                               read with O_DIRECT io_uring in 8 MiB blocks,
 *                               DEPTH in flight, into the registered memfd
 *   quit
 *
 * --cols C makes every tensor 2-D, [rows, C] (row-major; with ranks, rank r
 * holds rows [r * rows, (r + 1) * rows) of a global [K * rows, C] tensor, as
 * a row-parallel layer is sharded), and the "one" view [1, B / 4] per rank.
 * --reshard M (2-D only, M <= K) gives ranks 0..M-1 a buffer for their band,
 * allocated and touched before anything is timed; --loader-arena B gives
 * their clients an arena of B bytes instead of --arena's (a load "via" a
 * client reads into its arena, at most half of it per read, so loaders want
 * a larger one than ranks that only save; both at least 64 MiB, so that
 * every rank's arena is cut into slots of the same size).
 *
 * Loads.  A "save ... keep" leaves its checkpoint in place (one per view; a
 * later keep of the same view replaces it, "quit" removes them) and does not
 * change the state first, so the two views kept one after the other hold
 * the same bytes.  "load" then restores it:
 *
 *   - plainly, every rank its own chunk of every tensor, into its state
 *     buffers (already faulted: a restore reuses the model's memory): the
 *     state is copied to the limits' memfd and overwritten with NaNs first,
 *     and the loaded bytes are compared with that copy afterwards;
 *   - with "reshard", rank j < M its band of columns, [j * C / M, (j + 1) *
 *     C / M) (split as evenly as integers allow), of every global tensor, as
 *     a column-parallel layer shards it, into its band buffer (overwritten
 *     with NaNs first); every loaded element is checked against the value
 *     its saving rank holds (see state_value()); ranks >= M only wait.
 *
 * Before the load is released, every file of the checkpoint directory is
 * dropped from the page cache (posix_fadvise DONTNEED; how much stayed
 * resident is measured with mincore and printed).  A load is timed from
 * ckpt_reader_open until its done future completes (with "via",
 * ckpt_load_set_client is called inside that time), and prints what
 * ckpt_load_stats says it read (bytes_read, bytes_wanted, reads, and of
 * bytes_read what came from ckptd: bytes_resident and files_resident from
 * its images, bytes_daemon read by it into the client's arena) and the
 * "floor": the bytes of the CRC pieces its boxes touch, which any loader that
 * verifies what it uses must read (format/layout.h: LAYOUT_CRC_BLOCK).
 * Verification runs after the clock has stopped.  Loads and reads need a
 * directory root and a host state (no --gpu).
 *
 * Restarts.  A trainer killed after a committed save and started again
 * loads what its earlier life saved.  Two ckpt_bench processes play the two
 * lives: both get the same --job PREFIX (each client is then rank r of job
 * PREFIX-CLIENT in either process, not of a job named after the process),
 * the first connects with --resident (CKPT_CONNECT_RESIDENT) and runs "save
 * CLIENT keep" as its first save, and is then killed; the second runs "load
 * via CLIENT from NAME".  A first save never changes the state first, and
 * state_init makes the same state in every process with the same --bytes,
 * --tensors, --ranks and --cols, so the second process verifies the loaded
 * bytes against its own state as state_init made it: "from" is refused once
 * this process's state has changed.  A checkpoint loaded "from" is not
 * this program's: it is never removed here.  --no-limits leaves out the
 * limits' memfd (a second copy of the state: memory and set-up time a
 * process that only saves, or only loads "from", has no use for); copy,
 * write, read, d2h and loads of a kept checkpoint are then refused.
 *
 * Every rank runs each command at once: the parent hands the command to
 * every rank, waits until all are ready (state mutated, names chosen), then
 * releases them together.  A command's figure is the job's: from the
 * earliest rank's start to the latest rank's end (CLOCK_MONOTONIC, shared by
 * all processes; the absolute times are printed too, as t_*_ns).  The
 * previous checkpoint (unless kept) and the writer's files are removed
 * before the result is printed, so nothing of one measurement is still
 * being deleted while the next one runs.
 *
 * R may be an S3 root (s3://bucket/prefix, one of the daemon's roots): saves
 * then go to S3 and are left there, and a save's line names the checkpoint
 * ("name") for the caller to remove (this program has no S3 client); the
 * limits and the built-in writer work as with a directory root.
 *
 * A save's clock starts when ckpt_save_begin is called and stops when
 * ckpt_save_commit returns (call_ms), when the staged future completes
 * (staged_ms) and when the committed future completes (committed_ms).
 *
 * Exit status: 0 after "quit" or EOF; 1 on any failure (the reason on
 * stderr and, for a failed command, as {"cmd": ..., "error": ...}); 2 bad
 * usage.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


#include "ckpt.h"
#include "client/internal.h"
#include "format/layout.h"
#include "shm/arena.h"
#include "store/fsutil.h"
#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"
#endif

#define MAX_RANKS     256
#define MAX_CLIENTS   4
#define MAX_TENSORS   1000000
#define MAX_THREADS   256
#define ERR_LEN       512
#define CMD_LEN       1024
#define WRITE_BLOCK   (8u << 20)  /* the built-in writer's block (fio: --bs=8m) */
#define REG_IOV_MAX   (1ull << 30) /* one registered buffer may be at most 1 GiB */
#define DIO_ALIGN     4096u       /* O_DIRECT length and offset alignment */
/* Threads a ckpt_client starts besides its copy threads (receive, save):
 * only used to tell how many copy threads a client runs (client_copy_threads). */
#define LIB_SERVICE_THREADS 2

struct client_spec {
	char name[32];
	unsigned threads; /* 0: the library's default */
};

struct opts {
	const char *socket_path;
	char root[PATH_MAX];
	uint64_t bytes;   /* per rank */
	unsigned tensors; /* per rank */
	unsigned ranks;
	uint64_t arena;   /* 0: derived from bytes and tensors */
	unsigned max_depth;
	unsigned timeout_s;
	bool gpu;         /* the state on a CUDA device */
	bool s3_root;     /* root is s3://...: saves are not removed here */
	uint64_t cols;    /* 0: 1-D tensors; else [rows, cols] (--cols) */
	unsigned reshard; /* loaders of "load reshard" (--reshard); 0: none */
	uint64_t loader_arena; /* --loader-arena: ranks < reshard's arena; 0: --arena's */
	char job[64];     /* --job: clients' jobs are JOB-CLIENT; "": bench-PID-CLIENT */
	bool resident;    /* --resident: connect with CKPT_CONNECT_RESIDENT */
	bool no_limits;   /* --no-limits: no limits' memfd */
	struct client_spec clients[MAX_CLIENTS];
	unsigned n_clients;
};

/* One way to describe the state: `count` fp32 tensors back to back, sizes
 * differing by at most one element (1-D) or one row (2-D).  With world > 1,
 * each tensor is this rank's chunk of a global tensor of world chunks, cut
 * along its first dimension (as FSDP shards a model, or a row-parallel
 * layer): chunk `rank` at element rank * n (1-D) or row rank * rows (2-D). */
struct view {
	unsigned count;
	uint64_t cols;   /* 0: 1-D; else every tensor is [elems / cols, cols] */
	uint64_t *elems; /* per tensor */
	uint64_t *first; /* element index where each tensor starts */
	char **names;
};

enum { VIEW_MANY, VIEW_ONE, N_VIEWS };

struct state {
	unsigned rank, world;
	float *buf;
	uint64_t bytes;
	struct view many, one;
	uint64_t version; /* bumped by every change (state_mutate) */
};

/* What a rank sends the parent (one write, smaller than PIPE_BUF, so
 * atomic).  Times are absolute CLOCK_MONOTONIC ns. */
enum rec_kind { REC_HELLO = 1, REC_SETUP, REC_STAGED, REC_RESULT };

struct rec {
	int32_t rank;
	int32_t kind;
	int32_t rc;     /* 0 or -errno */
	int32_t client; /* REC_HELLO: which client */
	uint64_t t_start, t_call, t_staged, t_end;
	/* REC_HELLO */
	double connect_ms;
	uint64_t arena_bytes, slot_bytes;
	uint32_t copy_threads, threads_started, expected_threads;
	/* REC_RESULT of a load (its loaders), or a read */
	uint32_t idle;  /* this rank took no part (a rank >= M of a reshard) */
	uint64_t bytes_read, bytes_wanted, reads, floor_bytes; /* floor: UINT64_MAX unknown */
	uint64_t bytes_resident; /* of bytes_read, from images in ckptd's memory ("via") */
	uint32_t files_resident;
	uint64_t bytes_daemon;   /* of bytes_read, read by ckptd into the client's arena ("via") */
	uint64_t bytes_shared;   /* of bytes_daemon, read from storage for another loader */
	double verify_ms;
	/* REC_RESULT of a save (to staged) or a copy (to its end) */
	struct cost {
		double cpu_ms;      /* this rank process, every thread */
		double sys_busy_ms; /* every CPU, from /proc/stat: running anything */
		double sys_idle_ms; /* idle or waiting for I/O */
		double sys_steal_ms; /* taken by the hypervisor */
		uint64_t minflt, nivcsw;
	} cost;
	/* REC_SETUP */
	uint32_t registered;
	double setup_ms;
	int32_t gpu_device, gpu_devices, cuda_version, gpu_fake; /* --gpu */
	double gpu_setup_ms;
	char cuda_runtime[256];
	char err[ERR_LEN];
};

_Static_assert(sizeof(struct rec) <= PIPE_BUF, "records must be written atomically");

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- where a measurement's CPU went ----------------------------------------- */

/* A snapshot for struct cost: this process's rusage and the machine's CPU
 * time by kind from /proc/stat's first line (clock ticks: 10 ms each on most
 * kernels, so the machine-wide figures are coarse).  Taken outside the timed
 * window; what cannot be read stays zero. */
struct cost_snap {
	struct rusage ru;
	bool stat_ok;                         /* /proc/stat was read */
	unsigned long long busy, idle, steal; /* ticks */
};

static void cost_snap(struct cost_snap *cs)
{
	unsigned long long v[8];
	FILE *f;

	memset(cs, 0, sizeof(*cs));
	(void)getrusage(RUSAGE_SELF, &cs->ru);
	f = fopen("/proc/stat", "re");
	if (!f)
		return;
	/* user nice system idle iowait irq softirq steal */
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]) == 8) {
		cs->busy = v[0] + v[1] + v[2] + v[5] + v[6];
		cs->idle = v[3] + v[4];
		cs->steal = v[7];
		cs->stat_ok = true;
	}
	fclose(f);
}

static double tv_ms(const struct timeval *tv)
{
	return (double)tv->tv_sec * 1e3 + (double)tv->tv_usec / 1e3;
}

static void cost_since(struct cost *c, const struct cost_snap *a)
{
	struct cost_snap b;

	cost_snap(&b);

	c->cpu_ms = tv_ms(&b.ru.ru_utime) + tv_ms(&b.ru.ru_stime) - tv_ms(&a->ru.ru_utime) -
		    tv_ms(&a->ru.ru_stime);
	double tick_ms = 1e3 / (double)sysconf(_SC_CLK_TCK);

	if (a->stat_ok && b.stat_ok) {
		c->sys_busy_ms = (double)(b.busy - a->busy) * tick_ms;
		c->sys_idle_ms = (double)(b.idle - a->idle) * tick_ms;
		c->sys_steal_ms = (double)(b.steal - a->steal) * tick_ms;
	}
	c->minflt = (uint64_t)(b.ru.ru_minflt - a->ru.ru_minflt);
	c->nivcsw = (uint64_t)(b.ru.ru_nivcsw - a->ru.ru_nivcsw);
}

static double ms_between(uint64_t a, uint64_t b)
{
	return b >= a ? (double)(b - a) / 1e6 : -(double)(a - b) / 1e6;
}

static double gibps(uint64_t bytes, double ms)
{
	return ms > 0 ? (double)bytes / (double)(1ull << 30) / (ms / 1e3) : 0;
}

/* A record's error message (truncated to fit: paths can be long). */
static void rec_err(struct rec *rec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rec_err(struct rec *rec, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rec->err, sizeof(rec->err), fmt, ap);
	va_end(ap);
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
		"usage: ckpt_bench --socket PATH --root DIR --bytes B [options]; commands on stdin\n"
		"  --socket PATH        ckptd socket\n"
		"  --root DIR           checkpoint root, inside one of the daemon's roots (or s3://bucket/prefix)\n"
		"  --bytes B            state bytes per rank, a multiple of 4 (K/M/G suffixes)\n"
		"  --tensors T          fp32 tensors per rank (default 256)\n"
		"  --ranks K            rank processes of each job (default 1)\n"
		"  --client NAME:N      a client with N copy threads (0: the library's\n"
		"                       default); repeatable; default default:0\n"
		"  --arena B            staging arena to ask for (default: the shard file size)\n"
		"  --max-depth D        deepest 'write' allowed (default 64)\n"
		"  --timeout S          bound on any wait, seconds (default 900)\n"
		"  --gpu                the state on a CUDA device (rank r: device r %% count)\n"
		"  --cols C             2-D tensors of C columns, row-sharded across ranks\n"
		"  --reshard M          ranks 0..M-1 load column bands ('load reshard'; 2-D)\n"
		"  --loader-arena B     (with --reshard) ranks 0..M-1's arena (default: --arena's)\n"
		"  --job PREFIX         clients' jobs: PREFIX-CLIENT (default bench-PID-CLIENT)\n"
		"  --resident           connect with CKPT_CONNECT_RESIDENT (images kept by ckptd)\n"
		"  --no-limits          no limits' memfd: no copy, write, read, d2h;\n"
		"                       loads 'from' only\n"
		"commands: save CLIENT [one] [notify] [keep] | copy memcpy|stream CLIENT |\n"
		"          write DIR DEPTH | d2h whole|chunked CLIENT (--gpu) |\n"
		"          load [one] [reshard] [via CLIENT] [from NAME] | read DEPTH [one] |\n"
		"          quit\n");
	exit(2);
}

static uint64_t parse_size(const char *s, const char *what)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
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

static void parse_client(struct opts *o, const char *arg)
{
	const char *colon = strchr(arg, ':');
	struct client_spec *c;
	size_t n;

	if (o->n_clients == MAX_CLIENTS)
		die("at most %d --client", MAX_CLIENTS);
	if (!colon || colon == arg)
		die("--client wants NAME:THREADS, not '%s'", arg);
	n = (size_t)(colon - arg);
	c = &o->clients[o->n_clients];
	if (n >= sizeof(c->name))
		die("--client name too long in '%s'", arg);
	for (size_t i = 0; i < n; i++)
		if (!(arg[i] == '-' || arg[i] == '_' || (arg[i] >= '0' && arg[i] <= '9') ||
		      (arg[i] >= 'a' && arg[i] <= 'z') || (arg[i] >= 'A' && arg[i] <= 'Z')))
			die("--client name '%.*s': letters, digits, '-' and '_' only", (int)n, arg);
	memcpy(c->name, arg, n);
	c->name[n] = '\0';
	for (unsigned i = 0; i < o->n_clients; i++)
		if (!strcmp(o->clients[i].name, c->name))
			die("--client '%s' given twice", c->name);
	c->threads = parse_uint(colon + 1, "--client threads", 0, MAX_THREADS);
	o->n_clients++;
}

/* --job PREFIX: the characters a job id may hold ([A-Za-z0-9._-]), and room
 * for "-CLIENT" (a client's name is shorter than 32) within a job id. */
static void parse_job(struct opts *o, const char *arg)
{
	size_t n = strlen(arg);

	_Static_assert(sizeof(o->job) + 32 <= CKPT_MAX_JOB_LEN, "PREFIX-CLIENT fits a job id");
	if (n == 0 || n >= sizeof(o->job))
		die("--job: 1 to %zu characters, not '%s'", sizeof(o->job) - 1, arg);
	for (size_t i = 0; i < n; i++)
		if (!(arg[i] == '-' || arg[i] == '_' || arg[i] == '.' ||
		      (arg[i] >= '0' && arg[i] <= '9') || (arg[i] >= 'a' && arg[i] <= 'z') ||
		      (arg[i] >= 'A' && arg[i] <= 'Z')))
			die("--job '%s': letters, digits, '.', '-' and '_' only", arg);
	memcpy(o->job, arg, n + 1);
}

static uint64_t default_arena(uint64_t bytes, unsigned tensors);

static void parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "root", required_argument, NULL, 'r' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "tensors", required_argument, NULL, 't' },
		{ "ranks", required_argument, NULL, 'k' },
		{ "client", required_argument, NULL, 'c' },
		{ "arena", required_argument, NULL, 'a' },
		{ "max-depth", required_argument, NULL, 'd' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "gpu", no_argument, NULL, 'g' },
		{ "cols", required_argument, NULL, 'C' },
		{ "reshard", required_argument, NULL, 'M' },
		{ "loader-arena", required_argument, NULL, 'L' },
		{ "job", required_argument, NULL, 'J' },
		{ "resident", no_argument, NULL, 'R' },
		{ "no-limits", no_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *root = NULL;
	int c;

	*o = (struct opts){ .tensors = 256, .ranks = 1, .max_depth = 64, .timeout_s = 900 };
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'S': o->socket_path = optarg; break;
		case 'r': root = optarg; break;
		case 'b': o->bytes = parse_size(optarg, "--bytes"); break;
		case 't': o->tensors = parse_uint(optarg, "--tensors", 1, MAX_TENSORS); break;
		case 'k': o->ranks = parse_uint(optarg, "--ranks", 1, MAX_RANKS); break;
		case 'c': parse_client(o, optarg); break;
		case 'a': o->arena = parse_size(optarg, "--arena"); break;
		case 'd': o->max_depth = parse_uint(optarg, "--max-depth", 1, 4096); break;
		case 'T': o->timeout_s = parse_uint(optarg, "--timeout", 1, 7 * 86400); break;
		case 'g': o->gpu = true; break;
		case 'C': o->cols = parse_size(optarg, "--cols"); break;
		case 'M': o->reshard = parse_uint(optarg, "--reshard", 1, MAX_RANKS); break;
		case 'L': o->loader_arena = parse_size(optarg, "--loader-arena"); break;
		case 'J': parse_job(o, optarg); break;
		case 'R': o->resident = true; break;
		case 'N': o->no_limits = true; break;
		default: usage();
		}
	}
	if (optind != argc || !o->socket_path || !root)
		usage();
	if (o->bytes == 0 || o->bytes % 4)
		die("--bytes is required, > 0 and a multiple of 4 (fp32 tensors)");
	if (o->bytes / 4 < o->tensors)
		die("--bytes too small for %u fp32 tensors", o->tensors);
	if (o->bytes > (uint64_t)SIZE_MAX / 2)
		die("--bytes too large");
	if (o->cols && (o->bytes / 4 % o->cols || o->bytes / 4 / o->cols < o->tensors))
		die("--cols %" PRIu64 ": --bytes must hold a whole number of rows, at least one "
		    "per tensor", o->cols);
	if (o->reshard && (!o->cols || o->reshard > o->ranks || o->reshard > o->cols))
		die("--reshard %u wants --cols and at most --ranks loaders (and columns)",
		    o->reshard);
	if (o->loader_arena && !o->reshard)
		die("--loader-arena is the arena of --reshard's loaders: give --reshard M");
	/* Every rank's arena must be cut into slots of one size (the ready
	 * line checks it): 64 MiB and more get the largest slots. */
	if (o->loader_arena && (o->loader_arena < (64ull << 20) ||
				(o->arena ? o->arena : default_arena(o->bytes, o->tensors)) < (64ull << 20)))
		die("--loader-arena: both it and the other ranks' arena must be at least 64 MiB");
	if (o->no_limits && o->gpu)
		die("--no-limits: --gpu pins the limits' memfd (its D2H limit copies into it)");
	/* The daemon accepts absolute roots only; resolve a relative one here
	 * rather than fail on the first save.  An S3 root goes as it is. */
	if (!strncmp(root, "s3://", 5)) {
		if ((size_t)snprintf(o->root, sizeof(o->root), "%s", root) >= sizeof(o->root))
			die("root '%s': too long", root);
		o->s3_root = true;
	} else if (!realpath(root, o->root)) {
		die("root '%s': %s", root, strerror(errno));
	}
	if (o->n_clients == 0)
		parse_client(o, "default:0");
}

/* ---- the library's structs -------------------------------------------------
 *
 * The one place that fills libckpt's option and tensor structs, each started
 * from its _INIT macro (which sets the size the library checks).
 */

static struct ckpt_connect_opts connect_opts(const char *socket_path, const char *job,
					     unsigned rank, unsigned world, uint64_t arena_bytes,
					     unsigned copy_threads, bool pin, bool resident)
{
	return (struct ckpt_connect_opts){
		CKPT_CONNECT_OPTS_INIT,
		.socket_path = socket_path,
		.job = job,
		.rank = rank,
		.world = world,
		.arena_bytes = arena_bytes,
		.copy_threads = copy_threads,
		/* --gpu: pinned at connect (failing it if it cannot be), not
		 * inside the first save, and never silently pageable. */
		.cuda_pin = pin ? CKPT_CUDA_PIN_ON : CKPT_CUDA_PIN_AUTO,
		.flags = resident ? CKPT_CONNECT_RESIDENT : 0,
	};
}

/* device < 0: host memory; else the CUDA device of that ordinal (the
 * tensor produced on the legacy default stream). */
static struct ckpt_tensor f32_tensor(const char *name, unsigned ndim, const uint64_t *shape,
				     const float *data, int device, const uint64_t *global_shape,
				     const uint64_t *offsets)
{
	return (struct ckpt_tensor){
		CKPT_TENSOR_INIT,
		.name = name,
		.dtype = CKPT_F32,
		.ndim = ndim,
		.shape = shape,
		.data = data,
		.device = device < 0 ? CKPT_DEVICE_HOST : CKPT_DEVICE_CUDA,
		.device_index = device < 0 ? 0 : device,
		.global_shape = global_shape,
		.offsets = offsets,
	};
}

/* One box of a load: host memory, row-major and contiguous in `shape`. */
static struct ckpt_load_dst load_dst(const uint64_t *offsets, const uint64_t *shape, void *data)
{
	return (struct ckpt_load_dst){
		CKPT_LOAD_DST_INIT,
		.device = CKPT_DEVICE_HOST,
		.offsets = offsets,
		.shape = shape,
		.data = data,
	};
}

static struct ckpt_load_tensor load_tensor(const char *name, unsigned ndim,
					   const uint64_t *global_shape,
					   const struct ckpt_load_dst *dst)
{
	return (struct ckpt_load_tensor){
		CKPT_LOAD_TENSOR_INIT,
		.dtype = CKPT_F32,
		.name = name,
		.global_shape = global_shape,
		.ndim = ndim,
		.n_dsts = 1,
		.dsts = dst,
	};
}

/* ---- copy threads ----------------------------------------------------------
 *
 * The copy limit must copy with as many threads as the client does.  The
 * public API does not say how many it started, so count this process's
 * threads around ckpt_connect (a rank connects its clients one at a time,
 * from one thread, and nothing else starts threads meanwhile).
 * `expected` is the documented default (CPUs this process may use divided
 * by LOCAL_WORLD_SIZE, at least 1) or the number asked for; run.py notes a
 * mismatch.
 */

static unsigned count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	unsigned n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static unsigned expected_copy_threads(unsigned asked)
{
	cpu_set_t set;
	const char *lws = getenv("LOCAL_WORLD_SIZE");
	unsigned long local = 1;
	unsigned cpus = 1;

	if (asked)
		return asked;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		cpus = (unsigned)CPU_COUNT(&set);
	if (lws && *lws) {
		char *end;
		unsigned long v = strtoul(lws, &end, 10);

		if (*end == '\0' && v > 0)
			local = v;
	}
	return cpus / local > 0 ? (unsigned)(cpus / local) : 1;
}

/* ---- state ---------------------------------------------------------------- */

/* n elements in `count` tensors; with cols, in whole rows of cols elements
 * (parse_opts checked that n is a whole number of rows, >= count). */
static void view_init(struct view *v, uint64_t n, unsigned count, uint64_t cols,
		      const char *prefix, const char *suffix)
{
	uint64_t unit = cols ? cols : 1;
	uint64_t per = n / unit / count, extra = n / unit % count, at = 0;

	v->count = count;
	v->cols = cols;
	v->elems = calloc(count, sizeof(*v->elems));
	v->first = calloc(count, sizeof(*v->first));
	v->names = calloc(count, sizeof(*v->names));
	if (!v->elems || !v->first || !v->names)
		die("out of memory");
	for (unsigned i = 0; i < count; i++) {
		v->elems[i] = (per + (i < extra ? 1 : 0)) * unit;
		v->first[i] = at;
		at += v->elems[i];
		if (asprintf(&v->names[i], "%s%06u%s", prefix, i, suffix) < 0)
			die("out of memory");
	}
}

/* Tensor t of view v as rank `rank` of `world` saves it: its chunk's shape,
 * the global shape and the chunk's offsets (ndim entries each).  Returns
 * ndim (1, or 2 with cols). */
static unsigned view_shape(const struct view *v, unsigned t, unsigned rank, unsigned world,
			   uint64_t *shape, uint64_t *gshape, uint64_t *offs)
{
	if (!v->cols) {
		shape[0] = v->elems[t];
		gshape[0] = v->elems[t] * world;
		offs[0] = v->elems[t] * rank;
		return 1;
	}
	shape[0] = v->elems[t] / v->cols;
	shape[1] = v->cols;
	gshape[0] = shape[0] * world;
	gshape[1] = v->cols;
	offs[0] = shape[0] * rank;
	offs[1] = 0;
	return 2;
}

static void view_free(struct view *v)
{
	for (unsigned i = 0; v->names && i < v->count; i++)
		free(v->names[i]);
	free(v->names);
	free(v->first);
	free(v->elems);
}

/*
 * Element i of rank `rank`'s state as state_init makes it: a hash of both,
 * so that a chunk of another rank, or a band one column off, does not pass
 * for the right one when a load is verified.  The values are halves below
 * 16384: state_mutate's integer steps keep them exact in fp32, so element i
 * of any rank is state_value(rank, i) + the same change on every rank
 * (every rank runs every command), which a loader recovers from its own
 * state: st.buf[i] - state_value(own rank, i).
 */
static float state_value(unsigned rank, uint64_t i)
{
	uint64_t x = (i + ((uint64_t)rank << 48)) * 0x9e3779b97f4a7c15ull;

	return (float)(x >> 49) * 0.5f;
}

static void state_init(struct state *s, uint64_t bytes, unsigned count, uint64_t cols,
		       unsigned rank, unsigned world)
{
	uint64_t n = bytes / 4;
	void *p;

	*s = (struct state){ .rank = rank, .world = world, .bytes = bytes };
	/* Huge-page alignment, as a tensor allocator would give for big
	 * tensors; every page is touched below, before any timing. */
	if (posix_memalign(&p, 2u << 20, bytes))
		die("cannot allocate %" PRIu64 " bytes of state", bytes);
	s->buf = p;
	view_init(&s->many, n, count, cols, "layer.", ".weight");
	view_init(&s->one, n, 1, cols ? n : 0, "flat.", "");
	for (uint64_t i = 0; i < n; i++)
		s->buf[i] = state_value(rank, i);
}

/* A training step's worth of change: one element of every tensor. */
static void state_mutate(struct state *s, const struct view *v, unsigned step)
{
	for (unsigned i = 0; i < v->count; i++)
		s->buf[v->first[i]] += 1.0f + (float)step;
	s->version++;
}

static void state_free(struct state *s)
{
	view_free(&s->many);
	view_free(&s->one);
	free(s->buf);
}

/* The shard file is the data plus a safetensors header (~100 bytes of JSON
 * per tensor, padded); ask for an arena that holds all of it, so the figures
 * measure staging and draining rather than backpressure. */
static uint64_t default_arena(uint64_t bytes, unsigned tensors)
{
	uint64_t header = 8 + (uint64_t)tensors * 256 + (1u << 20);

	return bytes + header + (16u << 20);
}

/* ---- one save ------------------------------------------------------------- */

/* Saves the state once as view v and fills rec's times: its bytes at base
 * (the host copy, or with device >= 0 its copy on that CUDA device).  With
 * notify_fd >= 0, sends a REC_STAGED record as soon as the staged future
 * completes.  Returns 0 or -errno with rec->err set. */
static int timed_save(struct ckpt_client *cl, const struct opts *o, const struct state *s,
		      const float *base, int device, const struct view *v, const char *name,
		      unsigned step, int notify_fd, struct rec *rec)
{
	struct ckpt_save *save = NULL;
	struct ckpt_future *staged, *committed;
	struct cost_snap cs;
	int64_t tmo = (int64_t)o->timeout_s * 1000;
	int r;

	cost_snap(&cs);
	rec->t_start = now_ns();
	r = ckpt_save_begin(cl, o->root, name, step, &save);
	if (r < 0) {
		rec_err(rec, "ckpt_save_begin: %s (%s)", strerror(-r),
			 ckpt_last_error());
		return r;
	}
	for (unsigned t = 0; t < v->count; t++) {
		uint64_t shape[2], gshape[2], offs[2];
		unsigned ndim = view_shape(v, t, s->rank, s->world, shape, gshape, offs);
		struct ckpt_tensor ten = f32_tensor(v->names[t], ndim, shape, base + v->first[t],
						    device, s->world > 1 ? gshape : NULL,
						    s->world > 1 ? offs : NULL);

		r = ckpt_save_add_tensor(save, &ten);
		if (r < 0) {
			rec_err(rec, "ckpt_save_add_tensor '%s': %s (%s)",
				 v->names[t], strerror(-r), ckpt_last_error());
			goto out;
		}
	}
	r = ckpt_save_commit(save, &staged, &committed);
	rec->t_call = now_ns();
	if (r < 0) {
		rec_err(rec, "ckpt_save_commit: %s (%s)", strerror(-r),
			 ckpt_last_error());
		goto out;
	}
	r = ckpt_future_wait(staged, tmo);
	rec->t_staged = now_ns();
	cost_since(&rec->cost, &cs);
	if (r < 0) {
		rec_err(rec, "staged future: %s (%s)", strerror(-r),
			 ckpt_future_error(staged));
		goto out;
	}
	if (notify_fd >= 0) {
		struct rec st = *rec;

		st.kind = REC_STAGED;
		if (write(notify_fd, &st, sizeof(st)) != (ssize_t)sizeof(st)) {
			r = -EPIPE;
			rec_err(rec, "parent gone");
			goto out;
		}
	}
	r = ckpt_future_wait(committed, tmo);
	rec->t_end = now_ns();
	if (r < 0) {
		rec_err(rec, "committed future: %s (%s)", strerror(-r),
			 ckpt_future_error(committed));
		goto out;
	}
out:
	ckpt_save_free(save);
	return r;
}

/* ---- the copy limit ------------------------------------------------------- */

/* The client's own host engine (client/copy.c): on x86-64 its streaming
 * stores for pieces of 64 KiB and more, then its fence, as it fills a slot. */
#if defined(__x86_64__)
#define HAVE_STREAM 1
#else
#define HAVE_STREAM 0
#endif

static void stream_copy(char *dst, const char *src, size_t len)
{
	char err[64];

	copy_engine_host.copy(dst, src, len, err, sizeof(err));
	if (copy_engine_host.sync)
		copy_engine_host.sync(err, sizeof(err));
}

/* One copy: src to dst in pieces, claimed one at a time. */
struct copy_job {
	const char *src;
	char *dst;
	uint64_t bytes, piece;
	bool stream;
	atomic_uint_fast64_t next;
};

/*
 * The copy limit's threads.  Like the client's copy threads they are started
 * once (at set-up, not per measurement) and wait on a condition variable for
 * work, so a measurement pays neither their creation nor their first
 * placement on a CPU, which the client's copies do not pay either.
 */
struct copy_pool {
	pthread_t tid[MAX_THREADS];
	unsigned n;
	pthread_mutex_t lock;
	pthread_cond_t work_cv, done_cv;
	uint64_t generation;  /* bumped for each job */
	unsigned running;     /* threads still copying the current job */
	bool quit;
	struct copy_job *job;
};

static void copy_job_run(struct copy_job *j)
{
	uint64_t n = (j->bytes + j->piece - 1) / j->piece;

	for (;;) {
		uint64_t k = atomic_fetch_add(&j->next, 1), off, len;

		if (k >= n)
			break;
		off = k * j->piece;
		len = j->bytes - off < j->piece ? j->bytes - off : j->piece;
#if HAVE_STREAM
		if (j->stream) {
			stream_copy(j->dst + off, j->src + off, (size_t)len);
			continue;
		}
#endif
		memcpy(j->dst + off, j->src + off, (size_t)len);
	}
}

static void *copy_thread(void *arg)
{
	struct copy_pool *p = arg;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->quit && p->generation == seen)
			pthread_cond_wait(&p->work_cv, &p->lock);
		if (p->quit)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->lock);
		copy_job_run(p->job);
		pthread_mutex_lock(&p->lock);
		if (--p->running == 0)
			pthread_cond_signal(&p->done_cv);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void copy_pool_stop(struct copy_pool *p);

/* Starts n threads.  Returns 0 or -errno (no thread left running). */
static int copy_pool_start(struct copy_pool *p, unsigned n)
{
	int r = 0;

	memset(p, 0, sizeof(*p));
	if (n < 1 || n > MAX_THREADS)
		return -EINVAL;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work_cv, NULL);
	pthread_cond_init(&p->done_cv, NULL);
	for (; p->n < n; p->n++) {
		r = -pthread_create(&p->tid[p->n], NULL, copy_thread, p);
		if (r < 0)
			break;
	}
	if (r < 0)
		copy_pool_stop(p);
	return r;
}

static void copy_pool_stop(struct copy_pool *p)
{
	if (p->n == 0)
		return;
	pthread_mutex_lock(&p->lock);
	p->quit = true;
	pthread_cond_broadcast(&p->work_cv);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->n; i++)
		pthread_join(p->tid[i], NULL);
	p->n = 0;
}

/* Copies bytes from src to dst with the pool's threads in pieces of `piece`
 * bytes; t_start when the threads are woken, t_end when the last is done.
 * Returns 0 or -errno with rec->err set. */
static int copy_limit(struct copy_pool *p, const char *src, char *dst, uint64_t bytes,
		      uint64_t piece, bool stream, struct rec *rec)
{
	struct copy_job j = { .src = src, .dst = dst, .bytes = bytes, .piece = piece,
			      .stream = stream };
	struct cost_snap cs;

	if (p->n == 0 || piece == 0) {
		rec_err(rec, "copy limit: %u threads, piece %" PRIu64, p->n, piece);
		return -EINVAL;
	}
	atomic_init(&j.next, 0);
	cost_snap(&cs);
	pthread_mutex_lock(&p->lock);
	p->job = &j;
	p->running = p->n;
	rec->t_start = now_ns();
	p->generation++;
	pthread_cond_broadcast(&p->work_cv);
	while (p->running > 0)
		pthread_cond_wait(&p->done_cv, &p->lock);
	rec->t_end = now_ns();
	p->job = NULL;
	pthread_mutex_unlock(&p->lock);
	cost_since(&rec->cost, &cs);
	/* A cheap check that the copy happened: the first bytes of every piece
	 * and the very last one. */
	for (uint64_t off = 0; off < bytes; off += piece) {
		size_t n = bytes - off < 64 ? (size_t)(bytes - off) : 64;

		if (memcmp(dst + off, src + off, n)) {
			rec_err(rec, "copy limit miscopied at %" PRIu64, off);
			return -EIO;
		}
	}
	if (dst[bytes - 1] != src[bytes - 1]) {
		rec_err(rec, "copy limit miscopied the last byte");
		return -EIO;
	}
	return 0;
}

/* ---- the built-in disk writer --------------------------------------------- */

struct limit_buf {
	char *addr;      /* the memfd's mapping */
	uint64_t bytes;  /* mapped bytes (state bytes rounded up to 4 KiB) */
	struct io_uring ring;
	bool ring_ok;
	bool registered; /* buffers registered; else plain writes */
	char why_not[ERR_LEN];
};

static int limit_buf_init(struct limit_buf *lb, const struct state *s, unsigned max_depth)
{
	struct iovec iov[64];
	unsigned n = 0;
	void *addr;
	int fd, r;

	memset(lb, 0, sizeof(*lb));
	lb->bytes = (s->bytes + 4095) & ~4095ull;
	/* Made the way the daemon makes an arena, so the limit's memory is
	 * no worse than ckptd's (huge pages advised, pre-faulted). */
	fd = arena_create("ckpt-bench-limit", lb->bytes, &addr);
	if (fd < 0)
		return fd;
	close(fd); /* the mapping keeps the memory */
	lb->addr = addr;
	memcpy(lb->addr, s->buf, s->bytes);

	r = io_uring_queue_init(max_depth, &lb->ring, 0);
	if (r < 0)
		return r;
	lb->ring_ok = true;
	for (uint64_t off = 0; off < lb->bytes; off += REG_IOV_MAX) {
		if (n == sizeof(iov) / sizeof(iov[0]))
			return -E2BIG;
		iov[n].iov_base = lb->addr + off;
		iov[n].iov_len = (size_t)(lb->bytes - off < REG_IOV_MAX ? lb->bytes - off :
									 REG_IOV_MAX);
		n++;
	}
	r = io_uring_register_buffers(&lb->ring, iov, n);
	if (r < 0) {
		/* e.g. RLIMIT_MEMLOCK for an unprivileged user: the writer still
		 * runs, and the result says it was not registered. */
		snprintf(lb->why_not, sizeof(lb->why_not), "io_uring_register_buffers: %s",
			 strerror(-r));
	} else {
		lb->registered = true;
	}
	return 0;
}

/* Writes lb's bytes to a new file `path`: open, fallocate, DEPTH writes of
 * WRITE_BLOCK in flight, fsync.  t_start before open, t_end after fsync
 * (the directory's fsync is the parent's, after every rank).  Returns 0 or
 * -errno with rec->err set. */
static int disk_write(struct limit_buf *lb, const char *path, unsigned depth, struct rec *rec)
{
	struct io_uring *ring = &lb->ring;
	uint64_t submitted = 0, done = 0;
	unsigned inflight = 0;
	bool fixed_file = false;
	int fd, r = 0;

	rec->t_start = now_ns();
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
		rec_err(rec, "open '%s' O_DIRECT: %s", path, strerror(-r));
		return r;
	}
	if (fallocate(fd, 0, 0, (off_t)lb->bytes) < 0 && errno != EOPNOTSUPP) {
		r = -errno;
		rec_err(rec, "fallocate '%s': %s", path, strerror(-r));
		goto out;
	}
	fixed_file = io_uring_register_files(ring, &fd, 1) == 0;
	while (done < lb->bytes) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		while (inflight < depth && submitted < lb->bytes) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
			uint64_t len = lb->bytes - submitted < WRITE_BLOCK ? lb->bytes - submitted :
									     WRITE_BLOCK;

			if (!sqe)
				break;
			if (lb->registered)
				io_uring_prep_write_fixed(sqe, fixed_file ? 0 : fd,
							  lb->addr + submitted, (unsigned)len,
							  submitted,
							  (int)(submitted / REG_IOV_MAX));
			else
				io_uring_prep_write(sqe, fixed_file ? 0 : fd, lb->addr + submitted,
						    (unsigned)len, submitted);
			if (fixed_file)
				sqe->flags |= IOSQE_FIXED_FILE;
			io_uring_sqe_set_data64(sqe, len);
			submitted += len;
			inflight++;
		}
		r = io_uring_submit_and_wait(ring, 1);
		if (r < 0 && r != -EINTR) {
			rec_err(rec, "io_uring_submit: %s", strerror(-r));
			goto out;
		}
		r = 0;
		io_uring_for_each_cqe(ring, head, cqe) {
			if (cqe->res < 0 || (uint64_t)cqe->res != io_uring_cqe_get_data64(cqe)) {
				r = cqe->res < 0 ? cqe->res : -EIO;
				rec_err(rec, "write '%s': %s", path,
					 cqe->res < 0 ? strerror(-cqe->res) : "short write");
				/* Writes may still be in flight: the ring is not
				 * reused, the rank exits after a failed command. */
				goto out;
			}
			done += (uint64_t)cqe->res;
			inflight--;
			seen++;
		}
		io_uring_cq_advance(ring, seen);
	}
	if (fsync(fd) < 0) {
		r = -errno;
		rec_err(rec, "fsync '%s': %s", path, strerror(-r));
		goto out;
	}
	rec->t_end = now_ns();
out:
	if (fixed_file)
		io_uring_unregister_files(ring);
	close(fd);
	return r;
}

/* ---- the built-in reader (the read limit) -------------------------------- */

#define MAX_RANK_FILES 16 /* shard files one rank reads ("read") */

struct read_files {
	unsigned n;
	char path[MAX_RANK_FILES][PATH_MAX];
	uint64_t size[MAX_RANK_FILES];
};

/* The files of checkpoint `path` that rank `rank` saved, from its manifest.
 * Returns 0 or -errno with rec->err set. */
static int rank_files(const char *path, unsigned rank, struct read_files *f, struct rec *rec)
{
	struct ckpt_reader *rd;
	int r = ckpt_reader_open(path, &rd);

	if (r < 0) {
		rec_err(rec, "ckpt_reader_open '%s': %s (%s)", path, strerror(-r), ckpt_last_error());
		return r;
	}
	f->n = 0;
	for (size_t i = 0; i < rd->m.n_files; i++) {
		if (rd->m.files[i].rank != rank)
			continue;
		if (f->n == MAX_RANK_FILES) {
			rec_err(rec, "rank %u has more than %d files in '%s'", rank, MAX_RANK_FILES,
				path);
			r = -E2BIG;
			break;
		}
		if ((size_t)snprintf(f->path[f->n], PATH_MAX, "%s/%s", path, rd->m.files[i].path) >=
		    PATH_MAX) {
			rec_err(rec, "path too long under '%s'", path);
			r = -ENAMETOOLONG;
			break;
		}
		f->size[f->n++] = rd->m.files[i].size;
	}
	if (r == 0 && f->n == 0) {
		rec_err(rec, "no file of rank %u in '%s'", rank, path);
		r = -ENOENT;
	}
	ckpt_reader_close(rd);
	return r;
}

/*
 * Reads files f whole, one after the other, with O_DIRECT in WRITE_BLOCK
 * reads, `depth` in flight, into lb's registered buffers.  Block k lands at
 * block k modulo the blocks that fit in lb, so a file longer than the state
 * (its header) wraps around: only the rate matters, the bytes are not kept.
 * A file's last block is read with its length rounded up to DIO_ALIGN and
 * must come back short by exactly that rounding.  t_start before the first
 * open, t_end after the last completion.  Returns 0 or -errno with rec->err
 * set; rec->bytes_read: the bytes read.
 */
static int disk_read(struct limit_buf *lb, const struct read_files *f, unsigned depth,
		     struct rec *rec)
{
	struct io_uring *ring = &lb->ring;
	uint64_t wrap = lb->bytes / WRITE_BLOCK * WRITE_BLOCK;
	int r = 0;

	if (wrap == 0) {
		rec_err(rec, "read: the state is smaller than one %u-byte block", WRITE_BLOCK);
		return -EINVAL;
	}
	rec->t_start = now_ns();
	for (unsigned i = 0; i < f->n && r == 0; i++) {
		uint64_t size = f->size[i], submitted = 0, done = 0;
		unsigned inflight = 0;
		bool fixed_file;
		int fd = open(f->path[i], O_RDONLY | O_DIRECT | O_CLOEXEC);

		if (fd < 0) {
			r = -errno;
			rec_err(rec, "open '%s' O_DIRECT: %s", f->path[i], strerror(-r));
			return r;
		}
		fixed_file = io_uring_register_files(ring, &fd, 1) == 0;
		while (done < size) {
			struct io_uring_cqe *cqe;
			unsigned head, seen = 0;

			while (inflight < depth && submitted < size) {
				struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
				uint64_t len = size - submitted < WRITE_BLOCK ? size - submitted :
										 WRITE_BLOCK;
				uint64_t dlen = (len + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
				uint64_t place = submitted % wrap;

				if (!sqe)
					break;
				if (lb->registered)
					io_uring_prep_read_fixed(sqe, fixed_file ? 0 : fd,
								 lb->addr + place, (unsigned)dlen,
								 submitted,
								 (int)(place / REG_IOV_MAX));
				else
					io_uring_prep_read(sqe, fixed_file ? 0 : fd, lb->addr + place,
							   (unsigned)dlen, submitted);
				if (fixed_file)
					sqe->flags |= IOSQE_FIXED_FILE;
				io_uring_sqe_set_data64(sqe, len);
				submitted += len;
				inflight++;
			}
			r = io_uring_submit_and_wait(ring, 1);
			if (r < 0 && r != -EINTR) {
				rec_err(rec, "io_uring_submit: %s", strerror(-r));
				break;
			}
			r = 0;
			io_uring_for_each_cqe(ring, head, cqe) {
				if (cqe->res < 0 || (uint64_t)cqe->res != io_uring_cqe_get_data64(cqe)) {
					r = cqe->res < 0 ? cqe->res : -EIO;
					rec_err(rec, "read '%s': %s", f->path[i],
						cqe->res < 0 ? strerror(-cqe->res) : "short read");
					/* Reads may still be in flight: the rank exits
					 * after a failed command, the ring with it. */
					break;
				}
				done += (uint64_t)cqe->res;
				inflight--;
				seen++;
			}
			io_uring_cq_advance(ring, seen);
			if (r < 0)
				break;
		}
		if (fixed_file)
			io_uring_unregister_files(ring);
		close(fd);
		rec->bytes_read += done;
	}
	rec->t_end = now_ns();
	return r;
}

/* ---- loads ---------------------------------------------------------------- */

/* Loader j's columns of `cols` split among `loaders`: [*c0, *c0 + *w). */
static void band_of(uint64_t cols, unsigned loaders, unsigned j, uint64_t *c0, uint64_t *w)
{
	uint64_t per = cols / loaders, extra = cols % loaders;

	*c0 = j * per + (j < extra ? j : extra);
	*w = per + (j < extra ? 1 : 0);
}

/* Elements of loader j's band of view v (2-D): the band of every global
 * tensor, [world * rows, w] each, back to back in the band buffer. */
static uint64_t band_elems(const struct view *v, unsigned world, unsigned loaders, unsigned j)
{
	uint64_t c0, w, total = 0;

	band_of(v->cols, loaders, j, &c0, &w);
	for (unsigned t = 0; t < v->count; t++)
		total += v->elems[t] / v->cols * world * w;
	return total;
}

/* [a, b) of a chunk's bytes [begin, end) widened to the CRC pieces it
 * touches (the grid of LAYOUT_CRC_BLOCK, cut at the chunk's ends). */
static void widen(uint64_t begin, uint64_t end, uint64_t *a, uint64_t *b)
{
	*a = *a / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
	*b = (*b + LAYOUT_CRC_BLOCK - 1) / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
	if (*a < begin)
		*a = begin;
	if (*b > end)
		*b = end;
}

/*
 * The floor of loading box (offs, shape) of fp32 tensor t: the bytes of the
 * CRC pieces the box touches, each counted once.  A piece can only be
 * verified whole, so a loader that uses verified bytes only reads at least
 * these, whatever it does with the gaps.  2-D: the chunks must span every
 * column (the row-sharded layout saved here), one run per row; returns
 * UINT64_MAX for any other layout.
 */
static uint64_t floor_bytes(const struct manifest_tensor *t, const uint64_t *offs,
			    const uint64_t *shape)
{
	uint64_t total = 0;

	for (size_t k = 0; k < t->n_chunks; k++) {
		const struct manifest_chunk *c = &t->chunks[k];
		uint64_t lo = offs[0] > c->offsets[0] ? offs[0] : c->offsets[0];
		uint64_t hi = offs[0] + shape[0] < c->offsets[0] + c->shape[0] ?
				      offs[0] + shape[0] : c->offsets[0] + c->shape[0];
		uint64_t covered = 0; /* end of the pieces counted so far */

		if (t->ndim == 1) {
			if (lo < hi) {
				uint64_t a = c->begin + (lo - c->offsets[0]) * 4;
				uint64_t b = c->begin + (hi - c->offsets[0]) * 4;

				widen(c->begin, c->end, &a, &b);
				total += b - a;
			}
			continue;
		}
		if (t->ndim != 2 || c->offsets[1] != 0 || c->shape[1] != t->shape[1])
			return UINT64_MAX;
		/* Rows in file order: their pieces come in order, so the
		 * union is a running maximum. */
		for (uint64_t row = lo; row < hi; row++) {
			uint64_t a = c->begin + ((row - c->offsets[0]) * t->shape[1] + offs[1]) * 4;
			uint64_t b = a + shape[1] * 4;

			widen(c->begin, c->end, &a, &b);
			if (a < covered)
				a = covered;
			if (b > a) {
				total += b - a;
				covered = b;
			}
		}
	}
	return total;
}

/*
 * Loads checkpoint `path` as view v: plainly (loader < 0: this rank's own
 * chunk of every tensor into its state buffers) or as loader `loader` of
 * o->reshard (its column band of every global tensor into dst, back to
 * back); with `via`, through that client (ckpt_load_set_client), so that
 * files whose image ckptd holds are copied from its memory.  Timed from
 * ckpt_reader_open until the done future completes; fills rec's times,
 * cost, ckpt_load_stats figures and floor.  Returns 0 or -errno with
 * rec->err set.
 */
static int timed_load(const struct opts *o, const struct state *s, const struct view *v,
		      const char *path, int loader, float *dst, struct ckpt_client *via,
		      struct rec *rec)
{
	struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done;
	struct cost_snap cs;
	uint64_t boff[CKPT_MAX_NDIM], bshape[CKPT_MAX_NDIM];
	uint64_t at = 0;
	int r;

	cost_snap(&cs);
	rec->t_start = now_ns();
	r = ckpt_reader_open(path, &rd);
	if (r < 0) {
		rec_err(rec, "ckpt_reader_open '%s': %s (%s)", path, strerror(-r), ckpt_last_error());
		return r;
	}
	r = ckpt_load_begin(rd, 0, &ld);
	if (r < 0) {
		rec_err(rec, "ckpt_load_begin: %s (%s)", strerror(-r), ckpt_last_error());
		goto out;
	}
	for (unsigned t = 0; t < v->count; t++) {
		uint64_t shape[2], gshape[2], offs[2];
		unsigned ndim = view_shape(v, t, s->rank, s->world, shape, gshape, offs);
		struct ckpt_load_dst box;
		struct ckpt_load_tensor ten;

		if (loader < 0) {
			box = load_dst(offs, shape, s->buf + v->first[t]);
		} else {
			uint64_t c0, w;

			band_of(v->cols, o->reshard, (unsigned)loader, &c0, &w);
			boff[0] = 0;
			boff[1] = c0;
			bshape[0] = gshape[0];
			bshape[1] = w;
			box = load_dst(boff, bshape, dst + at);
			at += gshape[0] * w;
		}
		ten = load_tensor(v->names[t], ndim, gshape, &box);
		r = ckpt_load_add_tensor(ld, &ten);
		if (r < 0) {
			rec_err(rec, "ckpt_load_add_tensor '%s': %s (%s)", v->names[t], strerror(-r),
				ckpt_last_error());
			goto out;
		}
	}
	if (via) {
		r = ckpt_load_set_client(ld, via);
		if (r < 0) {
			rec_err(rec, "ckpt_load_set_client: %s (%s)", strerror(-r),
				ckpt_last_error());
			goto out;
		}
	}
	r = ckpt_load_start(ld, &done);
	if (r < 0) {
		rec_err(rec, "ckpt_load_start: %s (%s)", strerror(-r), ckpt_last_error());
		goto out;
	}
	r = ckpt_future_wait(done, (int64_t)o->timeout_s * 1000);
	rec->t_end = now_ns();
	cost_since(&rec->cost, &cs);
	if (r < 0) {
		rec_err(rec, "load future: %s (%s)", strerror(-r), ckpt_future_error(done));
		goto out;
	}
	r = ckpt_load_stats(ld, &st);
	if (r < 0) {
		rec_err(rec, "ckpt_load_stats: %s", strerror(-r));
		goto out;
	}
	rec->bytes_read = st.bytes_read;
	rec->bytes_wanted = st.bytes_wanted;
	rec->reads = st.reads;
	rec->bytes_resident = st.bytes_resident;
	rec->files_resident = st.files_resident;
	rec->bytes_daemon = st.bytes_daemon;
	rec->bytes_shared = st.bytes_shared;

	/* The floor, from the same boxes (after the clock stopped). */
	for (unsigned t = 0; t < v->count && rec->floor_bytes != UINT64_MAX; t++) {
		uint64_t shape[2], gshape[2], offs[2], fb;
		const struct manifest_tensor *mt = manifest_find(&rd->m, ITEM_TENSOR, v->names[t]);

		view_shape(v, t, s->rank, s->world, shape, gshape, offs);
		if (loader >= 0) {
			band_of(v->cols, o->reshard, (unsigned)loader, &boff[1], &bshape[1]);
			boff[0] = 0;
			bshape[0] = gshape[0];
		}
		fb = mt ? floor_bytes(mt, loader < 0 ? offs : boff, loader < 0 ? shape : bshape) :
			  UINT64_MAX;
		rec->floor_bytes = fb == UINT64_MAX ? UINT64_MAX : rec->floor_bytes + fb;
	}
out:
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	return r;
}

/* A plain load against the copy of the state taken before it (expect).
 * Returns 0 or -EIO with err naming the first wrong byte. */
static int verify_plain(const struct state *s, const char *expect, char *err, size_t errlen)
{
	const char *got = (const char *)s->buf;

	if (!memcmp(got, expect, s->bytes))
		return 0;
	for (uint64_t i = 0; i < s->bytes; i++) {
		if (got[i] != expect[i]) {
			snprintf(err, errlen, "load: byte %" PRIu64 " of the state differs from "
				 "what was saved", i);
			break;
		}
	}
	return -EIO;
}

/* A plain load "from" another process's checkpoint against the state as
 * state_init makes it (what that process saved, and what this one held
 * before its state was overwritten for the load).  Returns 0 or -EIO with
 * err naming the first wrong element. */
static int verify_initial(const struct state *s, char *err, size_t errlen)
{
	for (uint64_t i = 0; i < s->bytes / 4; i++) {
		float want = state_value(s->rank, i);

		if (memcmp(&s->buf[i], &want, sizeof(want))) {
			snprintf(err, errlen, "load: element %" PRIu64 " of the state is %g, the "
				 "saving process held %g", i, (double)s->buf[i], (double)want);
			return -EIO;
		}
	}
	return 0;
}

/* Loader j's band of view v against the values of the ranks that saved
 * each row (state_value(), plus the change every rank made alike).
 * Returns 0 or -EIO with err naming the first wrong element. */
static int verify_band(const struct state *s, const struct view *v, unsigned loaders,
		       unsigned j, const float *band, char *err, size_t errlen)
{
	uint64_t c0, w, at = 0;

	band_of(v->cols, loaders, j, &c0, &w);
	for (unsigned t = 0; t < v->count; t++) {
		uint64_t rows = v->elems[t] / v->cols;

		for (uint64_t gr = 0; gr < rows * s->world; gr++) {
			unsigned q = (unsigned)(gr / rows);
			uint64_t i0 = v->first[t] + gr % rows * v->cols + c0;

			for (uint64_t c = 0; c < w; c++, at++) {
				uint64_t i = i0 + c;
				float want = state_value(q, i) + (s->buf[i] - state_value(s->rank, i));

				if (band[at] != want) {
					snprintf(err, errlen, "load reshard: tensor '%s' row %" PRIu64
						 " column %" PRIu64 " is %g, rank %u saved %g",
						 v->names[t], gr, c0 + c, (double)band[at], q,
						 (double)want);
					return -EIO;
				}
			}
		}
	}
	return 0;
}

/* ---- device memory and the D2H limit (--gpu) ------------------------------
 *
 * With --gpu the state lives on a CUDA device (rank r on device r % count),
 * written there once from the host copy built by state_init; saves describe
 * it as CKPT_DEVICE_CUDA tensors produced on the legacy default stream.
 * The D2H limit copies the same device bytes into the limits' memfd, pinned
 * with cudaHostRegister as the client pins its arena, with
 * cudaMemcpyAsync on a non-blocking stream of the rank's own: in one call
 * ("whole") or in pieces of the client's slot size ("chunked": the largest
 * copy the engine issues, which copies each tensor's part of an extent
 * separately); timed from the first call to the end of
 * cudaStreamSynchronize.  The client connects with pinning ON after the
 * rank's device is made current, so its arena is pinned as the limit's
 * memory is, before anything is timed.  The runtime is libckpt's own (cuda/cudart.c,
 * $CKPT_CUDART included), so the bench runs against the fake runtime of the
 * tests as well; cudaMalloc and cudaFree, which libckpt never calls, are
 * looked up in the same library.
 */
struct gpu {
	bool on;
	bool fake;       /* the runtime is the tests' fake (it has their hooks) */
	int device, devices;
	char runtime[256];
	int version;
	double setup_ms; /* cudaMalloc, the copy to the device, the pinning */
#ifdef CKPT_HAVE_CUDA
	const struct cudart *rt;
	__typeof__(cudaMalloc) *malloc_;
	__typeof__(cudaFree) *free_;
	cudaStream_t stream; /* the D2H limit's */
	float *dbuf;         /* the state on the device */
	void *pinned;        /* the limits' memfd while registered */
#endif
};

#ifdef CKPT_HAVE_CUDA
static int gpu_fail(struct gpu *g, cudaError_t e, char *err, size_t errlen, const char *call)
{
	cudart_errmsg(g->rt, e, err, errlen, "%s", call);
	return cudart_errno(e);
}

/* Loads the runtime and makes the rank's device current (before the
 * client connects and pins its arena there).  Returns 0 or -errno with the
 * reason in err. */
static int gpu_select(struct gpu *g, unsigned rank, char *err, size_t errlen)
{
	cudaError_t e;
	void *dl;

	g->rt = cudart_get(err, errlen);
	if (!g->rt)
		return -ENODEV;
	snprintf(g->runtime, sizeof(g->runtime), "%s", g->rt->path);
	g->version = g->rt->version;
	dl = dlopen(g->rt->path, RTLD_NOW | RTLD_NOLOAD);
	if (!dl) {
		snprintf(err, errlen, "dlopen '%s' again: %s", g->rt->path, dlerror());
		return -ENODEV;
	}
	*(void **)&g->malloc_ = dlsym(dl, "cudaMalloc");
	*(void **)&g->free_ = dlsym(dl, "cudaFree");
	/* Whatever the file is called: a figure measured on the fake must
	 * never pass for a GPU's. */
	g->fake = dlsym(dl, "fake_cuda_stat") != NULL;
	dlclose(dl); /* libckpt's own reference keeps it loaded */
	if (!g->malloc_ || !g->free_) {
		snprintf(err, errlen, "'%s' has no cudaMalloc or cudaFree", g->rt->path);
		return -ENODEV;
	}
	e = g->rt->GetDeviceCount(&g->devices);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "cudaGetDeviceCount");
	if (g->devices < 1) {
		snprintf(err, errlen, "no CUDA device");
		return -ENODEV;
	}
	g->device = (int)(rank % (unsigned)g->devices);
	e = g->rt->SetDevice(g->device);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "cudaSetDevice");
	return 0;
}

/* The state copied to the device and the limit's memory pinned.  Returns
 * 0 or -errno with the reason in err. */
static int gpu_init(struct gpu *g, const struct state *s, struct limit_buf *lb, char *err,
		    size_t errlen)
{
	uint64_t t0 = now_ns();
	cudaError_t e;
	void *p = NULL;

	e = g->malloc_(&p, s->bytes);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "cudaMalloc of the state");
	g->dbuf = p;
	e = g->rt->StreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "cudaStreamCreateWithFlags");
	e = g->rt->MemcpyAsync(g->dbuf, s->buf, s->bytes, cudaMemcpyHostToDevice, g->stream);
	if (e == cudaSuccess)
		e = g->rt->StreamSynchronize(g->stream);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "copying the state to the device");
	e = g->rt->HostRegister(lb->addr, lb->bytes, cudaHostRegisterPortable);
	if (e != cudaSuccess)
		return gpu_fail(g, e, err, errlen, "cudaHostRegister of the limit's buffer");
	g->pinned = lb->addr;
	g->on = true;
	g->setup_ms = ms_between(t0, now_ns());
	return 0;
}

static const float *gpu_base(const struct gpu *g)
{
	return g->dbuf;
}

static void gpu_free(struct gpu *g)
{
	if (!g->rt)
		return;
	if (g->pinned)
		g->rt->HostUnregister(g->pinned);
	if (g->stream)
		g->rt->StreamDestroy(g->stream);
	if (g->dbuf)
		g->free_(g->dbuf);
	*g = (struct gpu){ 0 };
}

/* A training step's worth of change on the device: the host copy's
 * changed elements (state_mutate) written over, then the device idle, so
 * that every measurement starts with nothing queued. */
static int gpu_mutate(struct gpu *g, const struct state *s, const struct view *v, char *err,
		      size_t errlen)
{
	cudaError_t e = cudaSuccess;

	for (unsigned i = 0; i < v->count && e == cudaSuccess; i++)
		e = g->rt->MemcpyAsync(g->dbuf + v->first[i], s->buf + v->first[i], sizeof(float),
				       cudaMemcpyHostToDevice, NULL);
	if (e == cudaSuccess)
		e = g->rt->StreamSynchronize(NULL);
	return e == cudaSuccess ? 0 : gpu_fail(g, e, err, errlen, "updating the device state");
}

static int d2h_limit(struct gpu *g, const struct state *s, char *dst, uint64_t piece, bool whole,
		     struct rec *rec)
{
	const char *src = (const char *)g->dbuf;
	struct cost_snap cs;
	cudaError_t e = cudaSuccess;
	size_t n = s->bytes < 64 ? (size_t)s->bytes : 64;

	if (whole)
		piece = s->bytes;
	memset(dst, 0, n);
	memset(dst + s->bytes - n, 0, n);
	cost_snap(&cs);
	rec->t_start = now_ns();
	for (uint64_t off = 0; off < s->bytes && e == cudaSuccess; off += piece)
		e = g->rt->MemcpyAsync(dst + off, src + off,
				       s->bytes - off < piece ? s->bytes - off : piece,
				       cudaMemcpyDeviceToHost, g->stream);
	if (e == cudaSuccess)
		e = g->rt->StreamSynchronize(g->stream);
	rec->t_end = now_ns();
	cost_since(&rec->cost, &cs);
	if (e != cudaSuccess) {
		gpu_fail(g, e, rec->err, sizeof(rec->err), "D2H limit: cudaMemcpyAsync");
		return cudart_errno(e);
	}
	/* The device holds the host copy's values (gpu_mutate keeps them in
	 * step): a cheap check that the copy happened. */
	if (memcmp(dst, s->buf, n) || memcmp(dst + s->bytes - n, (const char *)s->buf + s->bytes - n, n)) {
		rec_err(rec, "D2H limit: the copy does not hold the device's bytes");
		return -EIO;
	}
	return 0;
}
#else
static int gpu_select(struct gpu *g, unsigned rank, char *err, size_t errlen)
{
	(void)g, (void)rank;
	snprintf(err, errlen, "this ckpt_bench was built without CUDA (CUDA=0 or no toolkit headers)");
	return -EOPNOTSUPP;
}

static int gpu_init(struct gpu *g, const struct state *s, struct limit_buf *lb, char *err,
		    size_t errlen)
{
	(void)g, (void)s, (void)lb;
	snprintf(err, errlen, "built without CUDA");
	return -EOPNOTSUPP;
}

static void gpu_free(struct gpu *g)
{
	(void)g;
}

static int gpu_mutate(struct gpu *g, const struct state *s, const struct view *v, char *err,
		      size_t errlen)
{
	(void)g, (void)s, (void)v;
	snprintf(err, errlen, "built without CUDA");
	return -EOPNOTSUPP;
}

static const float *gpu_base(const struct gpu *g)
{
	(void)g;
	return NULL;
}

static int d2h_limit(struct gpu *g, const struct state *s, char *dst, uint64_t piece, bool whole,
		     struct rec *rec)
{
	(void)g, (void)s, (void)dst, (void)piece, (void)whole;
	rec_err(rec, "built without CUDA");
	return -EOPNOTSUPP;
}
#endif

/* ---- pipes ---------------------------------------------------------------- */

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

/* Reads one line (without its '\n') of at most len - 1 bytes; false on EOF. */
static bool read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;

	for (;;) {
		char ch;

		if (!read_all(fd, &ch, 1))
			return false;
		if (ch == '\n')
			break;
		if (n + 1 < len)
			buf[n++] = ch;
	}
	buf[n] = '\0';
	return true;
}

/* ---- commands ------------------------------------------------------------- */

enum cmd_kind { CMD_SAVE, CMD_COPY, CMD_WRITE, CMD_D2H, CMD_LOAD, CMD_READ, CMD_QUIT };

struct cmd {
	enum cmd_kind kind;
	int client;    /* save, copy; load "via" (-1: none) */
	bool one;      /* save, load, read: the "one" view */
	bool notify;   /* save */
	bool keep;     /* save */
	bool reshard;  /* load */
	char from[CKPT_MAX_NAME_LEN + 1]; /* load: another process's checkpoint; "": the kept one */
	bool stream;   /* copy */
	bool whole;    /* d2h */
	char dir[PATH_MAX]; /* write */
	unsigned depth;     /* write, read */
};

static int find_client(const struct opts *o, const char *name)
{
	for (unsigned i = 0; i < o->n_clients; i++)
		if (!strcmp(o->clients[i].name, name))
			return (int)i;
	return -1;
}

/* c->client for the client named `name`; false with err set if none is. */
static bool cmd_client(const struct opts *o, const char *name, struct cmd *c, char *err,
		       size_t errlen)
{
	c->client = find_client(o, name);
	if (c->client < 0) {
		snprintf(err, errlen, "no client '%s'", name);
		return false;
	}
	return true;
}

/* Parses a command line; returns false with err set if it is not one. */
static bool parse_cmd(const struct opts *o, char *line, struct cmd *c, char *err, size_t errlen)
{
	char *argv[8], *save_ptr = NULL;
	int argc = 0;

	memset(c, 0, sizeof(*c));
	for (char *t = strtok_r(line, " \t\r", &save_ptr); t; t = strtok_r(NULL, " \t\r", &save_ptr)) {
		if (argc == 8) {
			snprintf(err, errlen, "too many words");
			return false;
		}
		argv[argc++] = t;
	}
	if (argc == 0) {
		snprintf(err, errlen, "empty command");
		return false;
	}
	if (!strcmp(argv[0], "quit") && argc == 1) {
		c->kind = CMD_QUIT;
		return true;
	}
	if (!strcmp(argv[0], "save") && argc >= 2) {
		c->kind = CMD_SAVE;
		if (!cmd_client(o, argv[1], c, err, errlen))
			return false;
		for (int i = 2; i < argc; i++) {
			if (!strcmp(argv[i], "one")) {
				c->one = true;
			} else if (!strcmp(argv[i], "notify")) {
				c->notify = true;
			} else if (!strcmp(argv[i], "keep")) {
				if (o->s3_root) {
					snprintf(err, errlen, "save keep: the root is on S3 (loads read "
						 "a directory root)");
					return false;
				}
				c->keep = true;
			} else {
				snprintf(err, errlen, "save: unknown word '%s'", argv[i]);
				return false;
			}
		}
		return true;
	}
	if (o->no_limits && (!strcmp(argv[0], "copy") || !strcmp(argv[0], "write") ||
			     !strcmp(argv[0], "read") || !strcmp(argv[0], "d2h"))) {
		snprintf(err, errlen, "%s: no limits' memfd (--no-limits)", argv[0]);
		return false;
	}
	if (!strcmp(argv[0], "copy") && argc == 3) {
		c->kind = CMD_COPY;
		if (!strcmp(argv[1], "stream")) {
			if (!HAVE_STREAM) {
				snprintf(err, errlen, "copy stream: SSE2 streaming stores are x86-64 only");
				return false;
			}
			c->stream = true;
		} else if (strcmp(argv[1], "memcpy")) {
			snprintf(err, errlen, "copy: method '%s' is not memcpy or stream", argv[1]);
			return false;
		}
		return cmd_client(o, argv[2], c, err, errlen);
	}
	if (!strcmp(argv[0], "write") && argc == 3) {
		char *end;
		unsigned long d;

		c->kind = CMD_WRITE;
		if (!realpath(argv[1], c->dir)) {
			snprintf(err, errlen, "write: directory '%s': %s", argv[1], strerror(errno));
			return false;
		}
		errno = 0;
		d = strtoul(argv[2], &end, 10);
		if (errno || *end || d < 1 || d > o->max_depth) {
			snprintf(err, errlen, "write: depth '%s' is not in 1..%u", argv[2], o->max_depth);
			return false;
		}
		c->depth = (unsigned)d;
		return true;
	}
	if (!strcmp(argv[0], "d2h") && argc == 3) {
		c->kind = CMD_D2H;
		if (!o->gpu) {
			snprintf(err, errlen, "d2h: the state is not on a device (no --gpu)");
			return false;
		}
		if (!strcmp(argv[1], "whole")) {
			c->whole = true;
		} else if (strcmp(argv[1], "chunked")) {
			snprintf(err, errlen, "d2h: method '%s' is not whole or chunked", argv[1]);
			return false;
		}
		return cmd_client(o, argv[2], c, err, errlen);
	}
	if ((!strcmp(argv[0], "load") && argc <= 7) || (!strcmp(argv[0], "read") && argc >= 2 &&
							 argc <= 3)) {
		bool load = argv[0][0] == 'l';

		c->kind = load ? CMD_LOAD : CMD_READ;
		c->client = -1;
		if (o->s3_root || o->gpu) {
			snprintf(err, errlen, "%s: needs a directory root and a host state", argv[0]);
			return false;
		}
		if (!load) {
			char *end;
			unsigned long d;

			errno = 0;
			d = strtoul(argv[1], &end, 10);
			if (errno || *end || d < 1 || d > o->max_depth) {
				snprintf(err, errlen, "read: depth '%s' is not in 1..%u", argv[1],
					 o->max_depth);
				return false;
			}
			c->depth = (unsigned)d;
		}
		for (int i = load ? 1 : 2; i < argc; i++) {
			if (!strcmp(argv[i], "one") && !c->one) {
				c->one = true;
			} else if (load && !strcmp(argv[i], "reshard") && !c->reshard) {
				if (!o->reshard) {
					snprintf(err, errlen, "load reshard: no --reshard M given");
					return false;
				}
				c->reshard = true;
			} else if (load && i + 1 < argc && !strcmp(argv[i], "via") &&
				   c->client < 0) {
				if (!cmd_client(o, argv[++i], c, err, errlen))
					return false;
			} else if (load && i + 1 < argc && !strcmp(argv[i], "from") &&
				   !c->from[0]) {
				const char *n = argv[++i];

				/* A name directly under the root, as saves make them. */
				if (strlen(n) > CKPT_MAX_NAME_LEN || n[0] == '.' ||
				    strchr(n, '/')) {
					snprintf(err, errlen, "load from: '%s' is not a "
						 "checkpoint name", n);
					return false;
				}
				snprintf(c->from, sizeof(c->from), "%s", n);
			} else {
				snprintf(err, errlen, "%s: unknown word '%s'", argv[0], argv[i]);
				return false;
			}
		}
		if (load && o->no_limits && !c->from[0]) {
			snprintf(err, errlen, "load: --no-limits: only 'load ... from NAME' "
				 "(the kept checkpoint is verified against the limits' memfd)");
			return false;
		}
		return true;
	}
	snprintf(err, errlen, "unknown command '%s' (save, copy, write, d2h, load, read, quit)",
		 argv[0]);
	return false;
}

static void save_name(char *buf, size_t len, pid_t job_pid, const char *client, unsigned i)
{
	snprintf(buf, len, "bench-%ld-%s-%u", (long)job_pid, client, i);
}

/* The job of client i: named after this program's process, so that two
 * runs never share one, unless --job names it (a restarted trainer's). */
static void job_name(char *buf, size_t len, const struct opts *o, pid_t job_pid, unsigned i)
{
	if (o->job[0])
		snprintf(buf, len, "%s-%s", o->job, o->clients[i].name);
	else
		snprintf(buf, len, "bench-%ld-%s", (long)job_pid, o->clients[i].name);
}

static void limit_path(char *buf, size_t len, const char *dir, pid_t job_pid, unsigned rank)
{
	if ((size_t)snprintf(buf, len, "%s/.ckpt-bench-limit-%ld-r%03u", dir, (long)job_pid, rank) >=
	    len)
		die("path too long under '%s'", dir);
}

/* ---- one rank ------------------------------------------------------------- */

struct rank_client {
	struct ckpt_client *cl;
	uint64_t slot_bytes;
	unsigned copy_threads;
	unsigned steps;
	struct copy_pool pool; /* copy_threads threads for the copy limit */
};

/* A kept checkpoint of one view, as this rank saved it. */
struct kept {
	char name[CKPT_MAX_NAME_LEN + 1]; /* "": none */
	uint64_t version;                 /* the state's version it holds */
};

/* The checkpoint directory of kept checkpoint `name`. */
static void kept_path(char *buf, size_t len, const struct opts *o, const char *name)
{
	if ((size_t)snprintf(buf, len, "%s/%s", o->root, name) >= len)
		die("path too long under '%s'", o->root);
}

/* One rank, in a child process.  Protocol with the parent: one REC_HELLO
 * per client and one REC_SETUP; then per command (one line on cmd_fd):
 * prepare, send one byte on the shared ready pipe, wait for one byte on
 * this rank's go pipe, run, send REC_STAGED (save notify) and REC_RESULT.
 * Exits on "quit", on EOF and on any failure (after its record). */
static void rank_main(const struct opts *o, unsigned rank, pid_t job_pid, int cmd_fd, int ready_fd,
		      int go_fd, int rec_fd)
{
	struct rank_client rc[MAX_CLIENTS] = { 0 };
	struct kept kept[N_VIEWS] = { 0 };
	struct gpu gpu = { 0 };
	struct limit_buf lb;
	struct state st;
	struct rec rec;
	float *band = NULL; /* this loader's band buffer (--reshard, rank < M) */
	uint64_t t0;
	char line[CMD_LEN], err[ERR_LEN];
	int r;

	/* A rank must not outlive an aborted parent. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != job_pid)
		_exit(3);

	state_init(&st, o->bytes, o->tensors, o->cols, rank, o->ranks);
	if (o->reshard && rank < o->reshard) {
		uint64_t a = band_elems(&st.many, o->ranks, o->reshard, rank);
		uint64_t b = band_elems(&st.one, o->ranks, o->reshard, rank);
		size_t len = (size_t)((a > b ? a : b) * 4);
		void *p;

		/* Touched now: a load fills memory the process already has,
		 * as a restore into a model's parameters does. */
		if (posix_memalign(&p, 2u << 20, len))
			die("cannot allocate %zu bytes of band buffer", len);
		memset(p, 0, len);
		band = p;
	}
	if (o->gpu) {
		r = gpu_select(&gpu, rank, err, sizeof(err));
		if (r < 0) {
			memset(&rec, 0, sizeof(rec));
			rec.rank = (int32_t)rank;
			rec.kind = REC_HELLO;
			rec.rc = r;
			rec_err(&rec, "--gpu: %s", err);
			(void)write_all(rec_fd, &rec, sizeof(rec));
			_exit(1);
		}
	}
	for (unsigned i = 0; i < o->n_clients; i++) {
		char job[CKPT_MAX_JOB_LEN + 1];
		struct ckpt_connect_opts co;
		unsigned before, after;

		job_name(job, sizeof(job), o, job_pid, i);
		co = connect_opts(o->socket_path, job, rank, o->ranks,
				  o->loader_arena && rank < o->reshard ? o->loader_arena :
				  o->arena ? o->arena : default_arena(o->bytes, o->tensors),
				  o->clients[i].threads, o->gpu, o->resident);
		memset(&rec, 0, sizeof(rec));
		rec.rank = (int32_t)rank;
		rec.kind = REC_HELLO;
		rec.client = (int32_t)i;
		rec.expected_threads = expected_copy_threads(o->clients[i].threads);
		before = count_threads();
		t0 = now_ns();
		r = ckpt_connect(&co, &rc[i].cl);
		rec.connect_ms = ms_between(t0, now_ns());
		after = count_threads();
		rec.rc = r;
		if (r < 0) {
			rec_err(&rec, "ckpt_connect '%s' as job '%s': %s (%s)",
				 o->socket_path, job, strerror(-r), ckpt_last_error());
		} else {
			rec.arena_bytes = ckpt_client_arena_bytes(rc[i].cl);
			/* The daemon cuts the arena it granted the same way. */
			rec.slot_bytes = arena_slot_bytes(rec.arena_bytes);
			rec.threads_started = after > before ? after - before : 0;
			rec.copy_threads = rec.threads_started > LIB_SERVICE_THREADS ?
						   rec.threads_started - LIB_SERVICE_THREADS :
						   rec.expected_threads;
			rc[i].slot_bytes = rec.slot_bytes;
			rc[i].copy_threads = rec.copy_threads;
			r = copy_pool_start(&rc[i].pool, rec.copy_threads);
			rec.rc = r;
			if (r < 0)
				rec_err(&rec, "starting %u copy-limit threads: %s", rec.copy_threads,
					strerror(-r));
		}
		if (!write_all(rec_fd, &rec, sizeof(rec)) || r < 0)
			_exit(1);
	}

	memset(&rec, 0, sizeof(rec));
	rec.rank = (int32_t)rank;
	rec.kind = REC_SETUP;
	t0 = now_ns();
	/* --no-limits: lb stays empty; no command that uses it is accepted. */
	memset(&lb, 0, sizeof(lb));
	r = o->no_limits ? 0 : limit_buf_init(&lb, &st, o->max_depth);
	rec.setup_ms = ms_between(t0, now_ns());
	rec.rc = r;
	if (r < 0)
		rec_err(&rec, "limit buffer of %" PRIu64 " bytes: %s", o->bytes,
			 strerror(-r));
	else if (!lb.registered && !o->no_limits)
		rec_err(&rec, "%s", lb.why_not);
	rec.registered = lb.registered;
	if (r == 0 && o->gpu) {
		r = gpu_init(&gpu, &st, &lb, rec.err, sizeof(rec.err));
		rec.rc = r;
		rec.gpu_device = gpu.device;
		rec.gpu_devices = gpu.devices;
		rec.gpu_fake = gpu.fake;
		rec.gpu_setup_ms = gpu.setup_ms;
		rec.cuda_version = gpu.version;
		snprintf(rec.cuda_runtime, sizeof(rec.cuda_runtime), "%s", gpu.runtime);
	}
	if (!write_all(rec_fd, &rec, sizeof(rec)) || r < 0)
		_exit(1);

	while (read_line(cmd_fd, line, sizeof(line))) {
		struct cmd c;
		char name[CKPT_MAX_NAME_LEN + 1], path[PATH_MAX];
		struct rank_client *cli = NULL;
		const struct view *v = NULL;
		struct read_files *files = NULL;
		struct kept *kp = NULL;
		int loader = -1; /* load: -1 plain, else this rank's band */
		char b = 'r';

		if (!parse_cmd(o, line, &c, err, sizeof(err)))
			_exit(1); /* the parent checked it: cannot happen */
		if (c.kind == CMD_QUIT)
			break;
		memset(&rec, 0, sizeof(rec));
		rec.rank = (int32_t)rank;
		rec.kind = REC_RESULT;
		if (c.kind == CMD_SAVE || c.kind == CMD_COPY || c.kind == CMD_D2H)
			cli = &rc[c.client];
		if (c.kind == CMD_LOAD && c.from[0]) {
			/* The parent refuses "from" once the state changed. */
			v = c.one ? &st.one : &st.many;
			if (st.version != 0) {
				fprintf(stderr, "ckpt_bench rank %u: load from: the state "
					"changed\n", rank);
				_exit(1);
			}
			kept_path(path, sizeof(path), o, c.from);
		} else if (c.kind == CMD_LOAD || c.kind == CMD_READ) {
			/* The parent refuses these without a kept checkpoint
			 * that still holds the state. */
			v = c.one ? &st.one : &st.many;
			kp = &kept[c.one ? VIEW_ONE : VIEW_MANY];
			if (!kp->name[0] || (c.kind == CMD_LOAD && kp->version != st.version)) {
				fprintf(stderr, "ckpt_bench rank %u: no kept checkpoint of the state\n",
					rank);
				_exit(1);
			}
			kept_path(path, sizeof(path), o, kp->name);
		}
		if (c.kind == CMD_LOAD) {
			if (c.reshard)
				loader = rank < o->reshard ? (int)rank : -2;
			/* The bytes to restore are first overwritten (NaNs), so
			 * a load that leaves one out fails verification; a plain
			 * load of the kept checkpoint keeps the state's copy in
			 * the limits' memfd ("from": the state is state_init's,
			 * which verify_initial recomputes). */
			if (loader == -1) {
				if (!c.from[0])
					memcpy(lb.addr, st.buf, st.bytes);
				memset(st.buf, 0xff, st.bytes);
			} else if (loader >= 0) {
				memset(band, 0xff, band_elems(v, o->ranks, o->reshard, rank) * 4);
			}
		} else if (c.kind == CMD_READ) {
			files = malloc(sizeof(*files));
			if (!files)
				die("out of memory");
		}
		if (c.kind == CMD_SAVE) {
			v = c.one ? &st.one : &st.many;
			/* A kept save holds the state as it is: the views kept
			 * one after the other hold the same bytes. */
			if (cli->steps > 0 && !c.keep) {
				state_mutate(&st, v, cli->steps);
				if (gpu.on && gpu_mutate(&gpu, &st, v, err, sizeof(err)) < 0) {
					fprintf(stderr, "ckpt_bench rank %u: %s\n", rank, err);
					_exit(1);
				}
			}
			save_name(name, sizeof(name), job_pid, o->clients[c.client].name, cli->steps);
		} else if (c.kind == CMD_WRITE) {
			limit_path(path, sizeof(path), c.dir, job_pid, rank);
			(void)unlink(path); /* left by a killed run */
		}
		if (!write_all(ready_fd, &b, 1) || !read_all(go_fd, &b, 1))
			_exit(1);
		switch (c.kind) {
		case CMD_SAVE:
			rec.rc = timed_save(cli->cl, o, &st, gpu.on ? gpu_base(&gpu) : st.buf,
					    gpu.on ? gpu.device : -1, v, name, cli->steps,
					    c.notify ? rec_fd : -1, &rec);
			cli->steps++;
			break;
		case CMD_COPY:
			rec.rc = copy_limit(&cli->pool, (const char *)st.buf, lb.addr, st.bytes,
					    cli->slot_bytes, c.stream, &rec);
			break;
		case CMD_WRITE:
			rec.rc = disk_write(&lb, path, c.depth, &rec);
			break;
		case CMD_D2H:
			rec.rc = d2h_limit(&gpu, &st, lb.addr, cli->slot_bytes, c.whole, &rec);
			break;
		case CMD_LOAD:
			if (loader == -2) {
				rec.idle = 1;
				break;
			}
			rec.rc = timed_load(o, &st, v, path, loader, band,
					    c.client >= 0 ? rc[c.client].cl : NULL, &rec);
			if (rec.rc == 0) {
				uint64_t tv = now_ns();

				if (loader >= 0)
					rec.rc = verify_band(&st, v, o->reshard, (unsigned)loader,
							     band, rec.err, sizeof(rec.err));
				else if (c.from[0])
					rec.rc = verify_initial(&st, rec.err, sizeof(rec.err));
				else
					rec.rc = verify_plain(&st, lb.addr, rec.err,
							      sizeof(rec.err));
				rec.verify_ms = ms_between(tv, now_ns());
			}
			break;
		case CMD_READ:
			/* The file list comes from the manifest, before the
			 * reader's clock starts (disk_read sets t_start). */
			rec.rc = rank_files(path, rank, files, &rec);
			if (rec.rc == 0)
				rec.rc = disk_read(&lb, files, c.depth, &rec);
			break;
		case CMD_QUIT:
			break;
		}
		if (c.kind == CMD_SAVE && c.keep && rec.rc == 0) {
			kp = &kept[c.one ? VIEW_ONE : VIEW_MANY];
			snprintf(kp->name, sizeof(kp->name), "%s", name);
			kp->version = st.version;
		}
		free(files);
		if (!write_all(rec_fd, &rec, sizeof(rec)) || rec.rc < 0)
			_exit(1);
	}
	for (unsigned i = 0; i < o->n_clients; i++) {
		copy_pool_stop(&rc[i].pool);
		ckpt_disconnect(rc[i].cl);
	}
	gpu_free(&gpu);
	free(band);
	state_free(&st);
	_exit(0);
}

/* ---- the parent ----------------------------------------------------------- */

struct rank_io {
	pid_t pid;
	int cmd_w, go_w, rec_r;
};

static struct rank_io ranks_io[MAX_RANKS];
static unsigned n_ranks_started;

/* Whether the limits' buffers are registered with io_uring (every rank). */
static bool limit_registered;

/* What the ranks reported for each client (the same on every rank). */
static struct {
	unsigned copy_threads;
	uint64_t slot_bytes;
} client_info[MAX_CLIENTS];

/* The kept checkpoints, as the parent knows them ("save ... keep"). */
static struct {
	char name[CKPT_MAX_NAME_LEN + 1]; /* "": none */
	char path[PATH_MAX];
	uint64_t version;                 /* state_version when saved */
} kept_ckpt[N_VIEWS];

static void kill_ranks(void)
{
	for (unsigned i = 0; i < n_ranks_started; i++) {
		if (ranks_io[i].pid > 0) {
			kill(ranks_io[i].pid, SIGKILL);
			waitpid(ranks_io[i].pid, NULL, 0);
			ranks_io[i].pid = 0;
		}
	}
}

static void die_ranks(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_ranks(const char *fmt, ...)
{
	va_list ap;

	kill_ranks();
	/* Best effort: a failed run leaves no kept checkpoint behind. */
	for (int v = 0; v < N_VIEWS; v++)
		if (kept_ckpt[v].name[0])
			(void)fs_rm_rf_at(AT_FDCWD, kept_ckpt[v].path);
	fputs("ckpt_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* Prints a JSON string (the values printed here are names, paths and error
 * messages: escape what JSON requires). */
static void print_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void fail_cmd(const char *cmd, unsigned rank, const char *err)
{
	printf("{\"cmd\": \"%s\", \"rank\": %u, \"error\": ", cmd, rank);
	print_json_str(err);
	printf("}\n");
	fflush(stdout);
	die_ranks("%s failed on rank %u: %s", cmd, rank, err);
}

static void read_rec(unsigned r, struct rec *rec, const char *what)
{
	if (!read_all(ranks_io[r].rec_r, rec, sizeof(*rec)))
		die_ranks("rank %u exited during %s", r, what);
}

/* Where the CPU went during a save's staging or a copy (see struct cost). */
static void print_cost(const char *key, const struct cost *c)
{
	printf(", \"%s\": {\"cpu_ms\": %.1f, \"sys_busy_ms\": %.0f, \"sys_idle_ms\": %.0f, "
	       "\"sys_steal_ms\": %.0f, \"minflt\": %" PRIu64 ", \"nivcsw\": %" PRIu64 "}",
	       key, c->cpu_ms, c->sys_busy_ms, c->sys_idle_ms, c->sys_steal_ms, c->minflt,
	       c->nivcsw);
}

static void print_ms_array(const char *key, const double *v, unsigned n)
{
	printf(", \"%s\": [", key);
	for (unsigned i = 0; i < n; i++)
		printf("%s%.3f", i ? ", " : "", v[i]);
	printf("]");
}

/* Reads every rank's hello and setup records and prints the ready line. */
static void gather_ready(const struct opts *o, pid_t pid)
{
	unsigned k = o->ranks;
	double setup_max = 0;
	bool registered = true;
	char why_not[ERR_LEN] = "", runtime[256] = "";
	int devices = 0, version = 0;
	bool fake = false;
	double gpu_setup_max = 0;
	uint64_t device_mask = 0;
	char job[CKPT_MAX_JOB_LEN + 1];

	printf("{\"event\": \"ready\", \"pid\": %ld, \"ranks\": %u, \"bytes_per_rank\": %" PRIu64
	       ", \"tensors\": %u, \"clients\": {",
	       (long)pid, k, o->bytes, o->tensors);
	for (unsigned i = 0; i < o->n_clients; i++) {
		double connect_max = 0;
		unsigned threads = 0, started = 0, expected = 0;
		uint64_t arena = 0, slot = 0, loader_arena = 0;
		bool same = true;

		for (unsigned r = 0; r < k; r++) {
			struct rec rec;

			read_rec(r, &rec, "connect");
			if (rec.kind != REC_HELLO || rec.client != (int32_t)i)
				die_ranks("rank %u: unexpected record %d at connect", r, rec.kind);
			if (rec.rc < 0)
				fail_cmd("connect", r, rec.err);
			if (r > 0 && (rec.copy_threads != threads || rec.slot_bytes != slot))
				same = false;
			connect_max = rec.connect_ms > connect_max ? rec.connect_ms : connect_max;
			threads = rec.copy_threads;
			started = rec.threads_started;
			expected = rec.expected_threads;
			arena = rec.arena_bytes;
			slot = rec.slot_bytes;
			if (r == 0)
				loader_arena = rec.arena_bytes;
		}
		if (!same)
			die_ranks("client '%s': ranks got different arenas or copy threads",
				  o->clients[i].name);
		client_info[i].copy_threads = threads;
		client_info[i].slot_bytes = slot;
		job_name(job, sizeof(job), o, pid, i);
		printf("%s", i ? ", " : "");
		print_json_str(o->clients[i].name);
		printf(": {\"job\": ");
		print_json_str(job);
		printf(", \"resident\": %s, \"threads_asked\": %u, \"copy_threads\": %u, "
		       "\"threads_started\": %u, \"expected_copy_threads\": %u, \"arena_bytes\": %"
		       PRIu64 ", \"slot_bytes\": %" PRIu64 ", \"connect_ms\": %.3f",
		       o->resident ? "true" : "false", o->clients[i].threads, threads, started,
		       expected, arena, slot, connect_max);
		/* --loader-arena: what ranks 0..M-1 (rank 0's) got; arena_bytes
		 * is then the last rank's. */
		if (o->loader_arena)
			printf(", \"loader_arena_bytes\": %" PRIu64 "}", loader_arena);
		else
			printf(", \"loader_arena_bytes\": null}");
	}
	for (unsigned r = 0; r < k; r++) {
		struct rec rec;

		read_rec(r, &rec, "set-up");
		if (rec.kind != REC_SETUP)
			die_ranks("rank %u: unexpected record %d at set-up", r, rec.kind);
		if (rec.rc < 0)
			fail_cmd("setup", r, rec.err);
		if (!rec.registered && !o->no_limits) {
			registered = false;
			snprintf(why_not, sizeof(why_not), "%s", rec.err);
		}
		if (o->gpu) {
			devices = rec.gpu_devices;
			version = rec.cuda_version;
			fake |= rec.gpu_fake != 0;
			if (rec.gpu_setup_ms > gpu_setup_max)
				gpu_setup_max = rec.gpu_setup_ms;
			if (rec.gpu_device >= 0 && rec.gpu_device < 64)
				device_mask |= 1ull << rec.gpu_device;
			snprintf(runtime, sizeof(runtime), "%.*s", (int)sizeof(rec.cuda_runtime),
				 rec.cuda_runtime);
		}
		setup_max = rec.setup_ms > setup_max ? rec.setup_ms : setup_max;
	}
	limit_registered = registered;
	if (o->no_limits) {
		printf("}, \"limit_buffer\": null");
	} else {
		printf("}, \"limit_buffer\": {\"setup_ms\": %.3f, \"registered\": %s, "
		       "\"stream_copy\": %s", setup_max, registered ? "true" : "false",
		       HAVE_STREAM ? "true" : "false");
		if (!registered) {
			printf(", \"not_registered\": ");
			print_json_str(why_not);
		}
		printf("}");
	}
	if (o->gpu) {
		printf(", \"gpu\": {\"devices\": %d, \"devices_used\": %d, \"cuda_runtime\": ", devices,
		       __builtin_popcountll(device_mask));
		print_json_str(runtime);
		printf(", \"cuda_runtime_version\": %d, \"fake\": %s, \"arena_pinned\": true, "
		       "\"setup_ms\": %.3f}", version, fake ? "true" : "false", gpu_setup_max);
	}
	printf("}\n");
	fflush(stdout);
}

/* What drop_cache did. */
struct drop_info {
	unsigned files;
	uint64_t bytes;    /* the files' sizes */
	uint64_t resident; /* of those, still in the page cache afterwards */
	double ms;
};

/*
 * Drops every regular file directly in `dir` from the page cache with
 * posix_fadvise(DONTNEED), then counts with mincore how much of them stayed
 * resident.  DONTNEED drops clean pages only; the daemon writes shards with
 * O_DIRECT and fsyncs what it commits, so a committed checkpoint has no
 * dirty page to keep.  The host of a VM may still cache its virtual disk:
 * nothing in the guest can drop that.  Returns 0 or -errno with err set.
 */
static int drop_cache(const char *dir, struct drop_info *ret, char *err, size_t errlen)
{
	struct drop_info di = { 0 };
	uint64_t t0 = now_ns();
	long page = sysconf(_SC_PAGESIZE);
	struct dirent *e;
	DIR *d = opendir(dir);
	int r = 0;

	if (!d) {
		r = -errno;
		snprintf(err, errlen, "opendir '%s': %s", dir, strerror(-r));
		return r;
	}
	while (r == 0 && (e = readdir(d))) {
		struct stat sb;
		unsigned char *vec;
		void *map;
		size_t pages;
		int fd;

		if (e->d_name[0] == '.')
			continue;
		fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &sb) < 0) {
			r = -errno;
			snprintf(err, errlen, "'%s/%s': %s", dir, e->d_name, strerror(-r));
			if (fd >= 0)
				close(fd);
			break;
		}
		if (!S_ISREG(sb.st_mode) || sb.st_size == 0) {
			close(fd);
			continue;
		}
		r = -posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		if (r < 0) {
			snprintf(err, errlen, "posix_fadvise '%s/%s': %s", dir, e->d_name,
				 strerror(-r));
			close(fd);
			break;
		}
		di.files++;
		di.bytes += (uint64_t)sb.st_size;
		/* A mapping that nothing touches: mincore only looks. */
		pages = ((size_t)sb.st_size + (size_t)page - 1) / (size_t)page;
		map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
		vec = map != MAP_FAILED ? malloc(pages) : NULL;
		if (vec && mincore(map, (size_t)sb.st_size, vec) == 0)
			for (size_t i = 0; i < pages; i++)
				di.resident += (vec[i] & 1) ? (uint64_t)page : 0;
		free(vec);
		if (map != MAP_FAILED)
			munmap(map, (size_t)sb.st_size);
		close(fd);
	}
	closedir(d);
	di.ms = ms_between(t0, now_ns());
	if (r == 0)
		*ret = di;
	return r;
}


/* How many times the ranks changed their states: every rank does
 * state_mutate before each save but a client's first and kept ones (the
 * parent's count mirrors the ranks' struct state.version). */
static uint64_t state_version;

/* Removes checkpoint `name` under the root (a directory root). */
static void remove_ckpt(const struct opts *o, const char *name)
{
	char path[PATH_MAX];
	int r;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", o->root, name) >= sizeof(path))
		die_ranks("path too long under '%s'", o->root);
	r = fs_rm_rf_at(AT_FDCWD, path);
	if (r < 0)
		die_ranks("cannot remove '%s': %s", path, strerror(-r));
}

/* Runs one checked command on every rank and prints its JSON line. */
static void run_cmd(const struct opts *o, const struct cmd *c, const char *line, pid_t pid,
		    int ready_r, unsigned *save_no)
{
	static const char *names[] = { "save", "copy", "write", "d2h", "load", "read", "quit" };
	unsigned k = o->ranks, active = 0;
	struct rec *recs = calloc(k, sizeof(*recs));
	double *staged = calloc(k, sizeof(*staged)), *end = calloc(k, sizeof(*end));
	uint64_t start = UINT64_MAX, t_call = 0, t_staged = 0, t_end = 0;
	uint64_t bytes_read = 0, bytes_wanted = 0, reads = 0, floor = 0, bytes_resident = 0;
	uint64_t files_resident = 0, bytes_daemon = 0, bytes_shared = 0;
	double verify_ms = 0;
	struct cost cost = { 0 };
	struct drop_info drop = { 0 };
	char buf[MAX_RANKS], g = 'g';
	char saved[CKPT_MAX_NAME_LEN + 1] = ""; /* a save's checkpoint name */
	char ckpt_dir[PATH_MAX] = "";          /* load, read: the checkpoint read */
	const char *ckpt_name = "";
	const char *what = names[c->kind];
	uint64_t total = o->bytes * k;
	int view = c->one ? VIEW_ONE : VIEW_MANY;

	_Static_assert(sizeof(names) / sizeof(names[0]) == CMD_QUIT + 1, "a name per command");
	if (!recs || !staged || !end)
		die_ranks("out of memory");
	if (c->kind == CMD_LOAD && c->from[0]) {
		kept_path(ckpt_dir, sizeof(ckpt_dir), o, c->from);
		ckpt_name = c->from;
	} else if (c->kind == CMD_LOAD || c->kind == CMD_READ) {
		snprintf(ckpt_dir, sizeof(ckpt_dir), "%s", kept_ckpt[view].path);
		ckpt_name = kept_ckpt[view].name;
	}
	for (unsigned r = 0; r < k; r++)
		if (!write_all(ranks_io[r].cmd_w, line, strlen(line)) ||
		    !write_all(ranks_io[r].cmd_w, "\n", 1))
			die_ranks("rank %u is gone", r);
	if (!read_all(ready_r, buf, k))
		die_ranks("a rank exited before %s", what);
	/* After every rank has prepared (its destination overwritten), so
	 * nothing reads the checkpoint between the drop and the start. */
	if (ckpt_dir[0]) {
		char err[ERR_LEN];

		if (drop_cache(ckpt_dir, &drop, err, sizeof(err)) < 0)
			die_ranks("%s: %s", what, err);
	}
	/* One pipe per rank, so a byte can only release its own rank; the k
	 * writes take microseconds. */
	for (unsigned r = 0; r < k; r++)
		if (!write_all(ranks_io[r].go_w, &g, 1))
			die_ranks("rank %u exited before %s", r, what);
	if (c->kind == CMD_SAVE && c->notify) {
		for (unsigned r = 0; r < k; r++) {
			read_rec(r, &recs[r], what);
			if (recs[r].rc < 0)
				fail_cmd(what, r, recs[r].err);
			if (recs[r].kind != REC_STAGED)
				die_ranks("rank %u: expected a staged record", r);
		}
		printf("{\"event\": \"staged\"}\n");
		fflush(stdout);
	}
	for (unsigned r = 0; r < k; r++) {
		read_rec(r, &recs[r], what);
		if (recs[r].kind != REC_RESULT)
			die_ranks("rank %u: unexpected record %d", r, recs[r].kind);
		if (recs[r].rc < 0)
			fail_cmd(what, r, recs[r].err);
		if (recs[r].idle)
			continue;
		active++;
		start = recs[r].t_start < start ? recs[r].t_start : start;
		t_call = recs[r].t_call > t_call ? recs[r].t_call : t_call;
		t_staged = recs[r].t_staged > t_staged ? recs[r].t_staged : t_staged;
		t_end = recs[r].t_end > t_end ? recs[r].t_end : t_end;
		bytes_read += recs[r].bytes_read;
		bytes_wanted += recs[r].bytes_wanted;
		reads += recs[r].reads;
		bytes_resident += recs[r].bytes_resident;
		files_resident += recs[r].files_resident;
		bytes_daemon += recs[r].bytes_daemon;
		bytes_shared += recs[r].bytes_shared;
		floor = floor == UINT64_MAX || recs[r].floor_bytes == UINT64_MAX ?
				UINT64_MAX : floor + recs[r].floor_bytes;
		verify_ms = recs[r].verify_ms > verify_ms ? recs[r].verify_ms : verify_ms;
	}
	for (unsigned r = 0; r < k; r++) {
		if (recs[r].idle)
			continue;
		staged[r] = ms_between(start, recs[r].t_staged);
		end[r] = ms_between(start, recs[r].t_end);
		/* Ranks' own CPU adds up; the machine-wide figures overlap. */
		cost.cpu_ms += recs[r].cost.cpu_ms;
		cost.minflt += recs[r].cost.minflt;
		cost.nivcsw += recs[r].cost.nivcsw;
		if (recs[r].cost.sys_busy_ms > cost.sys_busy_ms)
			cost.sys_busy_ms = recs[r].cost.sys_busy_ms;
		if (recs[r].cost.sys_idle_ms > cost.sys_idle_ms)
			cost.sys_idle_ms = recs[r].cost.sys_idle_ms;
		if (recs[r].cost.sys_steal_ms > cost.sys_steal_ms)
			cost.sys_steal_ms = recs[r].cost.sys_steal_ms;
	}

	if (c->kind == CMD_WRITE) {
		/* The last fsync: the directory that names the new files. */
		int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (dfd < 0 || fsync(dfd) < 0)
			die_ranks("fsync '%s': %s", c->dir, strerror(errno));
		t_end = now_ns();
		close(dfd);
		for (unsigned r = 0; r < k; r++) {
			char path[PATH_MAX];

			limit_path(path, sizeof(path), c->dir, pid, r);
			if (unlink(path) < 0)
				die_ranks("unlink '%s': %s", path, strerror(errno));
		}
	}
	if (c->kind == CMD_SAVE) {
		/* The ranks changed their states before this save unless it
		 * was the client's first or a kept one (rank_main). */
		if (save_no[c->client] > 0 && !c->keep)
			state_version++;
		/* Removed before the result is printed: nothing of this save
		 * is still being deleted while the next measurement runs.  An
		 * S3 checkpoint is the caller's to remove (its line names it).
		 * A kept one replaces the view's previous kept checkpoint. */
		save_name(saved, sizeof(saved), pid, o->clients[c->client].name, save_no[c->client]++);
		if (c->keep) {
			if (kept_ckpt[view].name[0])
				remove_ckpt(o, kept_ckpt[view].name);
			snprintf(kept_ckpt[view].name, sizeof(kept_ckpt[view].name), "%s", saved);
			kept_path(kept_ckpt[view].path, sizeof(kept_ckpt[view].path), o, saved);
			kept_ckpt[view].version = state_version;
		} else if (!o->s3_root) {
			remove_ckpt(o, saved);
		}
	}
	if (c->kind == CMD_LOAD) {
		/* A load's bytes are what its boxes wanted, over every loader. */
		total = bytes_wanted;
	}

	printf("{\"cmd\": \"%s\", \"ranks\": %u, \"bytes\": %" PRIu64, what, k, total);
	switch (c->kind) {
	case CMD_SAVE:
		printf(", \"client\": ");
		print_json_str(o->clients[c->client].name);
		printf(", \"name\": ");
		print_json_str(saved);
		printf(", \"removed\": %s, \"kept\": %s", o->s3_root || c->keep ? "false" : "true",
		       c->keep ? "true" : "false");
		printf(", \"tensors_per_rank\": %u, \"call_ms\": %.3f, \"staged_ms\": %.3f, "
		       "\"committed_ms\": %.3f, \"t_start_ns\": %" PRIu64 ", \"t_staged_ns\": %" PRIu64
		       ", \"t_committed_ns\": %" PRIu64,
		       c->one ? 1 : o->tensors, ms_between(start, t_call), ms_between(start, t_staged),
		       ms_between(start, t_end), start, t_staged, t_end);
		if (k > 1) {
			print_ms_array("rank_staged_ms", staged, k);
			print_ms_array("rank_committed_ms", end, k);
		}
		print_cost("staging_cost", &cost);
		break;
	case CMD_COPY:
		printf(", \"method\": \"%s\", \"client\": ", c->stream ? "stream" : "memcpy");
		print_json_str(o->clients[c->client].name);
		printf(", \"threads_per_rank\": %u, \"piece_bytes\": %" PRIu64
		       ", \"ms\": %.3f, \"gibps\": %.4f",
		       client_info[c->client].copy_threads, client_info[c->client].slot_bytes,
		       ms_between(start, t_end), gibps(total, ms_between(start, t_end)));
		print_cost("cost", &cost);
		break;
	case CMD_WRITE:
		printf(", \"depth\": %u, \"block_bytes\": %u, \"ms\": %.3f, \"gibps\": %.4f", c->depth,
		       WRITE_BLOCK, ms_between(start, t_end), gibps(total, ms_between(start, t_end)));
		if (k > 1)
			print_ms_array("rank_fsynced_ms", end, k);
		break;
	case CMD_D2H:
		printf(", \"method\": \"%s\", \"client\": ", c->whole ? "whole" : "chunked");
		print_json_str(o->clients[c->client].name);
		printf(", \"piece_bytes\": %" PRIu64 ", \"ms\": %.3f, \"gibps\": %.4f",
		       c->whole ? o->bytes : client_info[c->client].slot_bytes,
		       ms_between(start, t_end), gibps(total, ms_between(start, t_end)));
		if (k > 1)
			print_ms_array("rank_ms", end, k);
		print_cost("cost", &cost);
		break;
	case CMD_LOAD:
	case CMD_READ:
		printf(", \"view\": \"%s\", \"name\": ", c->one ? "one" : "many");
		print_json_str(ckpt_name);
		printf(", \"ms\": %.3f, \"gibps\": %.4f, \"bytes_read\": %" PRIu64,
		       ms_between(start, t_end),
		       gibps(c->kind == CMD_LOAD ? total : bytes_read, ms_between(start, t_end)),
		       bytes_read);
		if (c->kind == CMD_LOAD) {
			printf(", \"reshard\": %s, \"loaders\": %u, \"bytes_wanted\": %" PRIu64
			       ", \"reads\": %" PRIu64 ", \"read_amplification\": %.4f",
			       c->reshard ? "true" : "false", active, bytes_wanted, reads,
			       bytes_wanted ? (double)bytes_read / (double)bytes_wanted : 0.0);
			/* Summed over the loaders: a file served to two of them
			 * counts twice, as its bytes do in bytes_read. */
			printf(", \"from\": %s, \"via\": ", c->from[0] ? "true" : "false");
			if (c->client >= 0)
				print_json_str(o->clients[c->client].name);
			else
				printf("null");
			printf(", \"bytes_resident\": %" PRIu64 ", \"files_resident\": %" PRIu64
			       ", \"bytes_daemon\": %" PRIu64 ", \"bytes_shared\": %" PRIu64,
			       bytes_resident, files_resident, bytes_daemon, bytes_shared);
			if (floor != UINT64_MAX)
				printf(", \"floor_bytes\": %" PRIu64 ", \"floor_amplification\": %.4f",
				       floor, bytes_wanted ? (double)floor / (double)bytes_wanted : 0.0);
			else
				printf(", \"floor_bytes\": null, \"floor_amplification\": null");
			printf(", \"verify_ms\": %.1f", verify_ms);
			print_cost("cost", &cost);
		} else {
			printf(", \"depth\": %u, \"block_bytes\": %u, \"registered\": %s", c->depth,
			       WRITE_BLOCK, limit_registered ? "true" : "false");
		}
		printf(", \"drop\": {\"files\": %u, \"bytes\": %" PRIu64 ", \"resident_bytes\": %"
		       PRIu64 ", \"ms\": %.1f}", drop.files, drop.bytes, drop.resident, drop.ms);
		if (active > 1) {
			double *ms = calloc(active, sizeof(*ms));
			unsigned n = 0;

			if (!ms)
				die_ranks("out of memory");
			for (unsigned r = 0; r < k; r++)
				if (!recs[r].idle)
					ms[n++] = end[r];
			print_ms_array("rank_ms", ms, n);
			free(ms);
		}
		break;
	case CMD_QUIT:
		break;
	}
	printf("}\n");
	fflush(stdout);
	free(recs);
	free(staged);
	free(end);
}

/* Whether c can run now: a load or a read needs a kept checkpoint of its
 * view, and a load one that still holds the state (the ranks verify the
 * loaded bytes against it); a load "from" another process's checkpoint
 * needs the state as start-up made it (see "restarts").  Sets err if not. */
static bool cmd_allowed(const struct cmd *c, char *err, size_t errlen)
{
	int view = c->one ? VIEW_ONE : VIEW_MANY;

	if (c->kind == CMD_LOAD && c->from[0]) {
		if (state_version == 0)
			return true;
		snprintf(err, errlen, "load from: the state changed since start-up (a save without "
			 "keep came first), so the bytes cannot be verified");
		return false;
	}
	if (c->kind != CMD_LOAD && c->kind != CMD_READ)
		return true;
	if (!kept_ckpt[view].name[0]) {
		snprintf(err, errlen, "%s: no kept checkpoint of the '%s' view (save CLIENT%s keep "
			 "first)", c->kind == CMD_LOAD ? "load" : "read", c->one ? "one" : "many",
			 c->one ? " one" : "");
		return false;
	}
	if (c->kind == CMD_LOAD && kept_ckpt[view].version != state_version) {
		snprintf(err, errlen, "load: the state changed since the kept checkpoint was saved "
			 "(a save without keep came after it)");
		return false;
	}
	return true;
}

static void serve(const struct opts *o)
{
	unsigned k = o->ranks;
	unsigned save_no[MAX_CLIENTS] = { 0 };
	int ready[2];
	pid_t pid = getpid();
	char line[CMD_LEN], err[ERR_LEN];

	if (pipe2(ready, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	for (unsigned r = 0; r < k; r++) {
		int cmd[2], go[2], recp[2];

		if (pipe2(cmd, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0 ||
		    pipe2(recp, O_CLOEXEC) < 0)
			die_ranks("pipe: %s", strerror(errno));
		fflush(NULL);
		ranks_io[r].pid = fork();
		if (ranks_io[r].pid < 0)
			die_ranks("fork: %s", strerror(errno));
		if (ranks_io[r].pid == 0) {
			/* Only this rank's ends stay open in it, so a rank that
			 * dies is seen as EOF by the parent. */
			close(ready[0]);
			close(cmd[1]);
			close(go[1]);
			close(recp[0]);
			for (unsigned q = 0; q < r; q++) {
				close(ranks_io[q].cmd_w);
				close(ranks_io[q].go_w);
				close(ranks_io[q].rec_r);
			}
			rank_main(o, r, pid, cmd[0], ready[1], go[0], recp[1]);
		}
		n_ranks_started = r + 1;
		close(cmd[0]);
		close(go[0]);
		close(recp[1]);
		ranks_io[r].cmd_w = cmd[1];
		ranks_io[r].go_w = go[1];
		ranks_io[r].rec_r = recp[0];
	}
	close(ready[1]);
	gather_ready(o, pid);

	while (fgets(line, sizeof(line), stdin)) {
		struct cmd c;
		char copy[CMD_LEN];

		line[strcspn(line, "\n")] = '\0';
		snprintf(copy, sizeof(copy), "%s", line);
		if (!parse_cmd(o, copy, &c, err, sizeof(err)) || !cmd_allowed(&c, err, sizeof(err))) {
			printf("{\"error\": ");
			print_json_str(err);
			printf("}\n");
			fflush(stdout);
			continue;
		}
		if (c.kind == CMD_QUIT)
			break;
		run_cmd(o, &c, line, pid, ready[0], save_no);
	}
	/* Kept checkpoints go with the program. */
	for (int v = 0; v < N_VIEWS; v++) {
		if (kept_ckpt[v].name[0])
			remove_ckpt(o, kept_ckpt[v].name);
		kept_ckpt[v].name[0] = '\0';
	}
	for (unsigned r = 0; r < k; r++) {
		int status;

		if (!write_all(ranks_io[r].cmd_w, "quit\n", 5))
			die_ranks("rank %u is gone", r);
		if (waitpid(ranks_io[r].pid, &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			die_ranks("rank %u did not exit cleanly", r);
		ranks_io[r].pid = 0;
	}
}

int main(int argc, char **argv)
{
	struct opts o;

	parse_opts(argc, argv, &o);
	/* A dead daemon or rank must fail a write, not kill us. */
	signal(SIGPIPE, SIG_IGN);
	serve(&o);
	fflush(stdout);
	return 0;
}
