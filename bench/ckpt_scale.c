/* SPDX-License-Identifier: MIT */
/*
 * ckpt_scale - how the commit's index merge and a reader's manifest open
 * scale with the number of ranks.  No daemon, no disk: everything timed
 * works on text held in memory.
 *
 *   ckpt_scale [--ranks W,W,...] [--tensors T] [--reps R]
 *
 * For each world size W (default 128,256,512,1024) it first generates,
 * untimed, a synthetic checkpoint of T global tensors (default 500) shaped
 * like a Llama-style model (hidden 4096, MLP 14336, GQA k/v 1024, vocabulary
 * 128256; BF16 weights, F32 norms, I64/F32 scalars).  Every tensor but three
 * small ones is sharded over ALL W ranks: q/k/v/gate/up projections, the
 * embedding and lm_head by rows, o/down projections by columns (as a
 * row-parallel layer is split), norms as 1-D slices; uneven sizes give the
 * first ranks one row more.  The three small tensors (optimizer.step,
 * rotary inv_freq, lr_scheduler.last_epoch) are held whole by rank 0 only.
 * Blobs come on top of T: two on rank 0 (optimizer param groups, data
 * loader state) and one RNG state per rank.  Each rank's layout is packed
 * and placed after its real safetensors header (st_header_json), and its
 * index text is built by index_build_origin with made-up CRCs (the merge
 * copies CRCs, it never recomputes them) and a save attempt's origin.
 *
 * Every world size is generated first and all their indexes are held at
 * once.  Then each world size runs one warm-up round (reported as first_*),
 * and R rounds follow (default 5).  A round runs every step below for every
 * world size, world sizes interleaved and both orders rotating from round
 * to round (BENCH.md: rounds, not blocks), so that a shared machine's load
 * drifting over the run cannot pass for growth with W:
 *
 *   merge         index_merge_fetch of the W index texts into the manifest;
 *                 the fetch callback hands out malloc'd copies, as reading
 *                 the files would
 *   parse         json_loadb (JSON_REJECT_DUPLICATES, as the merge asks) and
 *                 json_decref of each of the same W texts, on as many threads
 *                 as the merge parses with: the baseline of "merging costs
 *                 at most twice a plain JSON parse of the same index bytes"
 *   parse_serial  the same on one thread
 *   open          manifest_parse of the merged manifest: a reader's open;
 *                 then, timed apart as close_ms, its manifest_free.  glibc
 *                 merges the small chunks open's jansson tree freed at the
 *                 next large free, which is manifest_free's: open + close is
 *                 what a reader pays, and open alone can come out below
 *                 open_json
 *   open_json     json_loadb + json_decref of the manifest text: the part of
 *                 open that is jansson's
 *
 * Between steps, untimed, malloc_trim(0) settles the allocator, so no step
 * pays for the frees of the one before it (see run_step).  Each figure is
 * the median over the R rounds (with its min); each ratio is computed per
 * round and reported as median/min/max (merge_vs_parse is that median).
 * Every merged manifest is compared with the warm-up's (the merge is
 * deterministic), and the warm-up's is checked to hold every tensor, blob
 * and chunk generated.
 *
 * Memory is measured once per W, outside the timed rounds, in a forked
 * child per step: the child resets its peak RSS (writing 5 to
 * /proc/self/clear_refs), runs the step, and reports VmHWM - VmRSS(start):
 * the pages the step touched beyond what the process held, i.e. the peak
 * extra memory as the kernel sees it (heap, thread stacks, jansson's tree),
 * rounded to pages.  The parent calls malloc_trim(0) before each fork so
 * that freed heap the step could reuse without a page fault is given back
 * first.  mallinfo2() deltas are no measure of a peak (they see what is
 * left allocated afterwards), so they are used only for open's retained
 * size: what the parsed manifest keeps while a reader holds it.  Without
 * clear_refs the child falls back to ru_maxrss, which can only under-count
 * (its mark starts at the parent's RSS at fork); "memory.method" says
 * which ran.
 *
 * The load planner (plan_hook below) is timed on each round's opened
 * manifest: one rank of a new 1,000-rank job, and all of them.
 *
 * Output: progress and one readable line per W on stderr; on stdout one
 * JSON object per W ("record": "ranks") and a final "record": "summary"
 * with the least-squares slopes of log(ms) over log(W), fitted in each
 * round and reported as the median over rounds (scaling_exponent_merge)
 * with min/max and the slope of the medians.
 * Exit status: 0; 1 on any failure (the reason on stderr); 2 bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "format/errmsg.h"
#include "format/index.h"
#include "format/layout.h"
#include "format/plan.h"
#include "format/safetensors.h"

#define MAX_WORLDS  16        /* entries of --ranks */
#define MAX_RANKS   8192      /* one world size */
#define MAX_TENSORS 100000
/* Cap on ranks x tensors summed over the world sizes (their indexes are
 * all held at once, ~200 bytes a chunk); one world size's open also
 * builds a jansson tree of ~1.4 KiB a chunk (measured: 697 MiB for 510k
 * chunks), so the cap allows ~6 GiB for that. */
#define MAX_CHUNKS  (1ull << 22)
#define MAX_REPS    100
#define ERR_LEN     512

/* index.c parses indexes on min(online CPUs, this, world) threads; the
 * parse baseline uses the same count.  Keep in step with index.c. */
#define MERGE_MAX_THREADS 16

/* The synthetic model. */
#define HIDDEN 4096u
#define INTER  14336u
#define KV     1024u
#define VOCAB  128256u
#define RANKS_PER_NODE 8u     /* ranks sharing one writer daemon id */

#define JOB      "scale-job"
#define CKPT     "step-1000"
#define STEP     1000u
#define T_COMMIT 1795403376   /* 2026-11-23T03:09:36Z: a fixed commit time,
                               * so every merge's text is the same */
#define ATTEMPT  "5c3e0a9d4b7f41e28a6d9f0b1c2e3d4f"
#define CLAIM    "claim-5c3e0a9d"
#define INSTANCE "boot-1"

struct opts {
	uint32_t worlds[MAX_WORLDS];
	unsigned n_worlds;
	unsigned tensors;
	unsigned reps;
};

/* How a tensor is cut over the ranks. */
enum split {
	SPLIT_ROWS,  /* dimension 0 (also 1-D tensors) */
	SPLIT_COLS,  /* dimension 1 */
	SPLIT_RANK0, /* not cut: held whole by rank 0 only */
};

/* One global tensor of the synthetic model. */
struct tspec {
	char name[96];
	enum ckpt_dtype dtype;
	unsigned ndim;
	uint64_t gshape[2];
	enum split split;
};

/* The W index texts of one world size: what the ranks' daemons would have
 * left, held in memory. */
struct corpus {
	uint32_t world;
	char **text;            /* [world], NUL-terminated, owned */
	size_t *len;            /* [world] */
	uint64_t index_bytes;   /* sum of len */
	uint64_t n_chunks;      /* items over all ranks: tensor chunks and blobs */
	size_t n_tensors, n_blobs; /* distinct, as the manifest must list them */
};

/* The steps of a round. */
enum step {
	STEP_MERGE,
	STEP_PARSE,
	STEP_PARSE_SERIAL,
	STEP_OPEN,
	STEP_OPEN_JSON,
	N_STEPS
};

static const char *const step_key[N_STEPS] = {
	[STEP_MERGE] = "merge_ms",
	[STEP_PARSE] = "parse_ms",
	[STEP_PARSE_SERIAL] = "parse_serial_ms",
	[STEP_OPEN] = "open_ms",
	[STEP_OPEN_JSON] = "open_json_ms",
};

/* Peak memory of the steps that have one worth knowing (see the top). */
struct mem {
	bool hwm;                /* measured with clear_refs + VmHWM, not ru_maxrss */
	int64_t merge_peak, parse_peak, open_peak; /* bytes */
	int64_t open_retained;   /* bytes, mallinfo2 delta while the manifest is held */
};

/* What the planner hook measured (see plan_hook). */
struct plan_times {
	double one_rank_ms;
	double all_ranks_ms;
	uint64_t one_rank_bytes;  /* what one rank's plan holds */
	uint64_t max_rank_bytes;  /* the largest plan of all ranks */
	uint64_t index_bytes;     /* the chunk index after planning every rank */
};

#define PLAN_READERS 1000 /* the new job: "one rank out of 1,000" */

/* One world size: its indexes, the manifest they merge into, its figures. */
struct world {
	struct corpus c;
	char *ref;                 /* the warm-up's manifest, which every open reads */
	size_t ref_len;
	double first[N_STEPS];
	double *ms[N_STEPS];       /* [reps] */
	double *plan_one, *plan_all; /* [reps]; valid when plan_ok */
	bool plan_ok;
	struct plan_times plan_last; /* the last round's plan sizes */
	double *close;             /* [reps]: manifest_free after each open */
	double first_close, close_med, close_min;
	double med[N_STEPS], min[N_STEPS];
	double generate_ms;
	struct mem mem;
};

static unsigned merge_threads_for(uint32_t world);

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("ckpt_scale: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double ms_since(uint64_t t0)
{
	return (double)(now_ns() - t0) / 1e6;
}

/* ---- options ------------------------------------------------------------------ */

static void usage(FILE *f, int status) __attribute__((noreturn));
static void usage(FILE *f, int status)
{
	fprintf(f,
		"usage: ckpt_scale [--ranks W,W,...] [--tensors T] [--reps R]\n"
		"  Times the commit's merge of W rank indexes (index_merge_fetch) against a\n"
		"  plain jansson parse of the same bytes, and a reader's open of the merged\n"
		"  manifest (manifest_parse), for each world size W; measures their peak\n"
		"  memory; fits how merge time grows with W.  In memory: no daemon, no disk.\n"
		"  --ranks LIST   world sizes, comma-separated, 1..%u each, at most %d\n"
		"                 (default 128,256,512,1024)\n"
		"  --tensors T    global tensors of the synthetic model, 1..%u (default 500);\n"
		"                 all but 3 small ones (rank 0 only) are sharded over every\n"
		"                 rank; blobs come on top: 2 on rank 0 and 1 per rank\n"
		"  --reps R       measured rounds after one warm-up round, 1..%u (default 5)\n"
		"  --help         this text\n"
		"Output: readable lines on stderr; on stdout one JSON object per W\n"
		"(\"record\": \"ranks\": merge_ms, parse_ms, parse_serial_ms, open_ms,\n"
		"open_json_ms, close_ms as medians with *_min, merge_vs_parse (median of\n"
		"the per-round ratios; ratios.* with min/max), index_bytes,\n"
		"manifest_bytes, memory.{merge,parse,open}_peak_bytes, open_retained_bytes,\n"
		"plan_one_rank_ms and plan_all_ranks_ms (the load planner: one rank and all\n"
		"1000 ranks of a new job)), then\n"
		"a summary (\"record\": \"summary\") with scaling_exponent_merge, the\n"
		"least-squares slope of log(merge_ms) over log(W) in each round (the world\n"
		"sizes are interleaved in every round), median over rounds.\n"
		"The sum of W x T over the list is capped at %llu chunks (all indexes\n"
		"are held at once; open's parse tree is ~1.4 KiB a chunk).\n",
		MAX_RANKS, MAX_WORLDS, MAX_TENSORS, MAX_REPS, (unsigned long long)MAX_CHUNKS);
	exit(status);
}

static unsigned parse_uint(const char *s, const char *what, unsigned lo, unsigned hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end != '\0' || *s == '-' || v < lo || v > hi) {
		fprintf(stderr, "ckpt_scale: %s must be an integer in %u..%u, not '%s'\n", what, lo,
			hi, s);
		exit(2);
	}
	return (unsigned)v;
}

static void parse_worlds(struct opts *o, const char *arg)
{
	char buf[256], *rest = buf, *tok;

	if (strlen(arg) >= sizeof(buf)) {
		fprintf(stderr, "ckpt_scale: --ranks list too long\n");
		exit(2);
	}
	strcpy(buf, arg);
	o->n_worlds = 0;
	/* strsep, not strtok: an empty entry ("4,,8") is an error, not skipped. */
	while ((tok = strsep(&rest, ",")) != NULL) {
		if (o->n_worlds == MAX_WORLDS) {
			fprintf(stderr, "ckpt_scale: at most %d world sizes\n", MAX_WORLDS);
			exit(2);
		}
		o->worlds[o->n_worlds++] = parse_uint(tok, "a --ranks entry", 1, MAX_RANKS);
	}
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "ranks", required_argument, NULL, 'k' },
		{ "tensors", required_argument, NULL, 't' },
		{ "reps", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t total = 0;
	int c;

	*o = (struct opts){ .worlds = { 128, 256, 512, 1024 }, .n_worlds = 4, .tensors = 500,
			    .reps = 5 };
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'k': parse_worlds(o, optarg); break;
		case 't': o->tensors = parse_uint(optarg, "--tensors", 1, MAX_TENSORS); break;
		case 'r': o->reps = parse_uint(optarg, "--reps", 1, MAX_REPS); break;
		case 'h': usage(stdout, 0);
		default: usage(stderr, 2);
		}
	}
	if (optind != argc)
		usage(stderr, 2);
	for (unsigned i = 0; i < o->n_worlds; i++)
		total += (uint64_t)o->worlds[i] * o->tensors;
	if (total > MAX_CHUNKS) {
		fprintf(stderr, "ckpt_scale: the world sizes x %u tensors add up to %llu chunks, "
			"over the cap of %llu\n", o->tensors, (unsigned long long)total,
			(unsigned long long)MAX_CHUNKS);
		exit(2);
	}
}

/* ---- the synthetic checkpoint ------------------------------------------------- */

/*
 * The i-th global tensor: three small rank-0-only tensors, the embedding,
 * the final norm and lm_head, then decoder layers of nine tensors each for
 * as long as i goes.
 */
static void model_spec(unsigned i, struct tspec *t)
{
	static const struct head {
		const char *name;
		enum ckpt_dtype dtype;
		unsigned ndim;
		uint64_t d0, d1;
		enum split split;
	} head[] = {
		{ "optimizer.step", CKPT_I64, 0, 0, 0, SPLIT_RANK0 },
		{ "model.rotary_emb.inv_freq", CKPT_F32, 1, 64, 0, SPLIT_RANK0 },
		{ "lr_scheduler.last_epoch", CKPT_I64, 0, 0, 0, SPLIT_RANK0 },
		{ "model.embed_tokens.weight", CKPT_BF16, 2, VOCAB, HIDDEN, SPLIT_ROWS },
		{ "model.norm.weight", CKPT_F32, 1, HIDDEN, 0, SPLIT_ROWS },
		{ "lm_head.weight", CKPT_BF16, 2, VOCAB, HIDDEN, SPLIT_ROWS },
	}, layer[] = {
		{ "input_layernorm.weight", CKPT_F32, 1, HIDDEN, 0, SPLIT_ROWS },
		{ "self_attn.q_proj.weight", CKPT_BF16, 2, HIDDEN, HIDDEN, SPLIT_ROWS },
		{ "self_attn.k_proj.weight", CKPT_BF16, 2, KV, HIDDEN, SPLIT_ROWS },
		{ "self_attn.v_proj.weight", CKPT_BF16, 2, KV, HIDDEN, SPLIT_ROWS },
		{ "self_attn.o_proj.weight", CKPT_BF16, 2, HIDDEN, HIDDEN, SPLIT_COLS },
		{ "post_attention_layernorm.weight", CKPT_F32, 1, HIDDEN, 0, SPLIT_ROWS },
		{ "mlp.gate_proj.weight", CKPT_BF16, 2, INTER, HIDDEN, SPLIT_ROWS },
		{ "mlp.up_proj.weight", CKPT_BF16, 2, INTER, HIDDEN, SPLIT_ROWS },
		{ "mlp.down_proj.weight", CKPT_BF16, 2, HIDDEN, INTER, SPLIT_COLS },
	};
	const unsigned n_head = sizeof(head) / sizeof(head[0]);
	const unsigned n_layer = sizeof(layer) / sizeof(layer[0]);
	const struct head *h;

	if (i < n_head) {
		h = &head[i];
		snprintf(t->name, sizeof(t->name), "%s", h->name);
	} else {
		h = &layer[(i - n_head) % n_layer];
		snprintf(t->name, sizeof(t->name), "model.layers.%u.%s", (i - n_head) / n_layer,
			 h->name);
	}
	t->dtype = h->dtype;
	t->ndim = h->ndim;
	t->gshape[0] = h->d0;
	t->gshape[1] = h->d1;
	t->split = h->split;
}

/* Rank r's part of n rows split over w ranks: the first n % w ranks get one
 * more (ranks get none when n < w: an empty chunk, which is still listed). */
static void share(uint64_t n, uint32_t w, uint32_t r, uint64_t *ret_off, uint64_t *ret_len)
{
	uint64_t q = n / w, rem = n % w;

	*ret_off = r * q + (r < rem ? r : rem);
	*ret_len = q + (r < rem ? 1 : 0);
}

/* Writer daemon of rank r: one per node of RANKS_PER_NODE ranks. */
static void writer_id(uint32_t rank, char *buf, size_t len)
{
	snprintf(buf, len, "node-%05u", rank / RANKS_PER_NODE);
}

static int add_blob(struct layout *l, const char *name, uint64_t len, char *err, size_t errlen)
{
	return layout_add(l, ITEM_BLOB, name, CKPT_U8, 1, &len, NULL, NULL, err, errlen);
}

/*
 * Builds rank `rank`'s index text as its daemon would write it.  Returns 0
 * with a malloc'd NUL-terminated *ret_text of *ret_len bytes and the rank's
 * item count in *ret_items, or -EINVAL / -ENOMEM / -EOVERFLOW (reason in err).
 */
static int build_rank(const struct tspec *specs, unsigned n_specs, uint32_t rank, uint32_t world,
		      char **ret_text, size_t *ret_len, size_t *ret_items, char *err,
		      size_t errlen)
{
	char wid[32], name[64], *hdr = NULL, *text = NULL;
	struct index_origin origin = { .attempt = ATTEMPT, .instance = INSTANCE, .to = CLAIM };
	struct layout l;
	uint32_t *crcs = NULL;
	size_t hlen;
	int ret;

	ret = layout_init(&l, "/data/ckpt", CKPT, STEP);
	if (ret)
		return errmsg_set(err, errlen, ret, "layout_init: %s", strerror(-ret));
	for (unsigned i = 0; i < n_specs && !ret; i++) {
		const struct tspec *t = &specs[i];
		uint64_t shape[2] = { t->gshape[0], t->gshape[1] }, offs[2] = { 0, 0 };
		unsigned d = t->split == SPLIT_COLS ? 1 : 0;

		if (t->split == SPLIT_RANK0) {
			if (rank == 0)
				ret = layout_add(&l, ITEM_TENSOR, t->name, t->dtype, t->ndim,
						 t->gshape, NULL, NULL, err, errlen);
			continue;
		}
		share(t->gshape[d], world, rank, &offs[d], &shape[d]);
		ret = layout_add(&l, ITEM_TENSOR, t->name, t->dtype, t->ndim, shape, t->gshape, offs,
				 err, errlen);
	}
	/* Sizes as torch would have them: param groups as JSON, a data
	 * loader's state, torch's CPU RNG state (5056 bytes). */
	if (!ret && rank == 0)
		ret = add_blob(&l, "optimizer.param_groups", 2048, err, errlen);
	if (!ret && rank == 0)
		ret = add_blob(&l, "dataloader.state", 65536, err, errlen);
	if (!ret) {
		snprintf(name, sizeof(name), "rng_state.rank%05u", rank);
		ret = add_blob(&l, name, 5056, err, errlen);
	}
	if (ret)
		goto out;
	if (json_object_set_new(l.meta, "framework", json_string("torch")) ||
	    json_object_set_new(l.meta, "run", json_string("scale-bench")) ||
	    json_object_set_new(l.metrics, "loss", json_real(2.25)) ||
	    json_object_set_new(l.metrics, "tokens", json_real(4.1e9))) {
		ret = errmsg_set(err, errlen, -ENOMEM, "rank %u: metadata: out of memory", rank);
		goto out;
	}
	ret = layout_pack(&l);
	if (!ret)
		ret = st_header_json(&l, rank, &hdr, &hlen);
	if (!ret)
		ret = layout_place(&l, hlen);
	if (ret) {
		ret = errmsg_set(err, errlen, ret, "rank %u: placing the layout: %s", rank,
				 strerror(-ret));
		goto out;
	}
	crcs = malloc((l.n_crcs ? l.n_crcs : 1) * sizeof(*crcs));
	if (!crcs) {
		ret = errmsg_set(err, errlen, -ENOMEM, "rank %u: CRCs: out of memory", rank);
		goto out;
	}
	/* Any values will do, but distinct ones print as many digits as
	 * real CRCs do. */
	for (uint32_t k = 0; k < l.n_crcs; k++)
		crcs[k] = 0x9E3779B9u * (rank * 7919u + k + 1u);
	writer_id(rank, wid, sizeof(wid));
	origin.writer_id = wid;
	ret = index_build_origin(&l, crcs, JOB, rank, world, &origin, &text);
	if (ret) {
		ret = errmsg_set(err, errlen, ret, "rank %u: index_build_origin: %s", rank,
				 strerror(-ret));
		goto out;
	}
	*ret_text = text;
	*ret_len = strlen(text);
	*ret_items = l.n_items;
out:
	free(crcs);
	free(hdr);
	layout_free(&l);
	return ret;
}

/* Frees what corpus_build made; accepts a zeroed or half-built corpus. */
static void corpus_free(struct corpus *c)
{
	if (c->text)
		for (uint32_t r = 0; r < c->world; r++)
			free(c->text[r]);
	free(c->text);
	free(c->len);
	memset(c, 0, sizeof(*c));
}

/* Generates the W index texts.  Returns 0, or -errno (reason in err; *c
 * is then freed). */
static int corpus_build(struct corpus *c, const struct tspec *specs, unsigned n_specs,
			uint32_t world, char *err, size_t errlen)
{
	int ret = 0;

	memset(c, 0, sizeof(*c));
	c->world = world;
	c->text = calloc(world, sizeof(*c->text));
	c->len = calloc(world, sizeof(*c->len));
	if (!c->text || !c->len) {
		corpus_free(c);
		return errmsg_set(err, errlen, -ENOMEM, "corpus of %u ranks: out of memory", world);
	}
	for (uint32_t r = 0; r < world; r++) {
		size_t items = 0;

		ret = build_rank(specs, n_specs, r, world, &c->text[r], &c->len[r], &items, err,
				 errlen);
		if (ret) {
			corpus_free(c);
			return ret;
		}
		c->index_bytes += c->len[r];
		c->n_chunks += items;
	}
	c->n_tensors = n_specs;
	c->n_blobs = world + 2;
	return 0;
}

/* The merge's fetch: a malloc'd copy of the rank's text, as a read of its
 * file would give.  Called from the merge's parse threads; reads only. */
static int fetch_text(void *ud, uint32_t rank, char **ret_text, size_t *ret_len, char *err,
		      size_t errlen)
{
	const struct corpus *c = ud;
	char *p;

	(void)err;
	(void)errlen;
	if (rank >= c->world)
		return -ENOENT;
	p = malloc(c->len[rank] + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p, c->text[rank], c->len[rank] + 1);
	*ret_text = p;
	*ret_len = c->len[rank];
	return 0;
}

/* ---- the timed steps ----------------------------------------------------------- */

static double time_merge(const struct corpus *c, char **ret_text, size_t *ret_len)
{
	const struct index_origin origin = { .attempt = ATTEMPT, .writer_id = "node-00000",
					     .instance = INSTANCE, .to = CLAIM };
	char err[ERR_LEN] = "", *text = NULL;
	uint64_t t0 = now_ns();
	double ms;
	int ret;

	ret = index_merge_fetch(-1, fetch_text, (void *)c, JOB, CKPT, c->world, T_COMMIT, &origin,
				NULL, 0, &text, err, sizeof(err));
	ms = ms_since(t0);
	if (ret)
		die("merge of %u ranks: %s (%s)", c->world, err, strerror(-ret));
	*ret_text = text;
	*ret_len = strlen(text);
	return ms;
}

/* The parse baseline's work queue: ranks handed out one at a time, as the
 * merge's parse phase hands them out. */
struct parse_job {
	const struct corpus *c;
	atomic_uint next;
	atomic_uint failed;   /* first rank that failed + 1, or 0 */
};

static void *parse_worker(void *arg)
{
	struct parse_job *j = arg;
	unsigned r;

	while ((r = atomic_fetch_add(&j->next, 1)) < j->c->world) {
		json_t *root = json_loadb(j->c->text[r], j->c->len[r], JSON_REJECT_DUPLICATES, NULL);

		if (!root) {
			unsigned none = 0;

			atomic_compare_exchange_strong(&j->failed, &none, r + 1);
			continue;
		}
		json_decref(root);
	}
	return NULL;
}

/* Parses every index text on `threads` threads (the caller's included),
 * building and freeing each jansson tree, and nothing else. */
static double time_parse(const struct corpus *c, unsigned threads)
{
	pthread_t th[MERGE_MAX_THREADS];
	struct parse_job j = { .c = c };
	unsigned started = 0;
	uint64_t t0 = now_ns();
	double ms;

	for (unsigned i = 1; i < threads; i++)
		if (pthread_create(&th[started], NULL, parse_worker, &j) == 0)
			started++;
	parse_worker(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	ms = ms_since(t0);
	if (atomic_load(&j.failed))
		die("rank %u's index is not valid JSON", atomic_load(&j.failed) - 1);
	if (started + 1 != threads)
		die("parse baseline: started %u of %u threads", started + 1, threads);
	return ms;
}

/* Opens the manifest into *m (zeroed by the caller; the caller frees it). */
static double time_open(const char *text, size_t len, struct manifest *m)
{
	char err[ERR_LEN] = "";
	uint64_t t0 = now_ns();
	double ms;
	int ret;

	ret = manifest_parse(text, len, m, err, sizeof(err));
	ms = ms_since(t0);
	if (ret)
		die("manifest_parse: %s (%s)", err, strerror(-ret));
	return ms;
}

static double time_open_json(const char *text, size_t len)
{
	uint64_t t0 = now_ns();
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
	double ms;

	if (!root)
		die("the manifest is not valid JSON");
	json_decref(root);
	ms = ms_since(t0);
	return ms;
}

/* ---- load planner hook --------------------------------------------------------- */

/*
 * The load planner (format/plan.h), timed on the parsed manifest of a
 * world of `world` ranks: the new job has PLAN_READERS ranks with another
 * sharding -- each tensor cut into PLAN_READERS parts along the dimension
 * it was saved split along (so a new rank's box meets one or two saved
 * chunks, more where world > PLAN_READERS); a tensor saved whole is wanted
 * whole by every rank; blob r % world by rank r.  "One rank": a fresh
 * chunk index and the plan of rank PLAN_READERS / 2, as a restarted rank
 * that plans only its own load pays.  "All ranks": one index and the plans
 * of every rank, as a planner of the whole job's reads (read-once across
 * replicas) does; each plan is freed after it is counted.
 *
 * (Cutting along another dimension than the saved one, rows saved and
 * columns loaded, makes every new rank's box meet every saved chunk: world x
 * PLAN_READERS intersections per tensor, which is the size of the answer,
 * not of the planner's work, so it is not what this measures.)
 */
static uint64_t plan_bytes(const struct plan *p, const struct manifest *m)
{
	uint64_t b = sizeof(*p) + p->n_reads * sizeof(*p->reads) +
		     p->n_copies * sizeof(*p->copies) + p->n_checks * sizeof(*p->checks);

	for (size_t i = 0; i < p->n_copies; i++)
		b += 2u * m->items[p->copies[i].item].ndim * sizeof(uint64_t);
	return b;
}

/* Rank r's wants (one per item) into w, their dims into dims. */
static size_t rank_wants(const struct manifest *m, uint32_t world, uint32_t r,
			 struct plan_want *w, uint64_t *dims)
{
	size_t n = 0;

	for (size_t i = 0; i < m->n_items; i++) {
		const struct manifest_tensor *t = &m->items[i];
		uint64_t *o = dims + 2u * CKPT_MAX_NDIM * i, *sh = o + CKPT_MAX_NDIM;
		unsigned cut = 0;
		bool split = false;

		if (t->kind == ITEM_BLOB && i - m->n_tensors != r % world)
			continue;
		for (unsigned d = 0; d < t->ndim; d++) {
			o[d] = 0;
			sh[d] = t->shape[d];
			if (t->n_chunks > 1 && t->chunks[0].shape[d] != t->shape[d] && !split) {
				cut = d;
				split = true;
			}
		}
		if (split) {
			o[cut] = t->shape[cut] * r / PLAN_READERS;
			sh[cut] = t->shape[cut] * (r + 1) / PLAN_READERS - o[cut];
		}
		w[n++] = (struct plan_want){ .item = (uint32_t)i, .tag = (uint32_t)i, .offsets = o,
					     .shape = sh };
	}
	return n;
}

static int plan_hook(const struct manifest *m, uint32_t world, struct plan_times *ret)
{
	struct plan_want *w = malloc((m->n_items + 1) * sizeof(*w));
	uint64_t *dims = malloc((m->n_items + 1) * 2u * CKPT_MAX_NDIM * sizeof(uint64_t));
	struct plan_index *ix = NULL;
	struct plan *p = NULL;
	char err[256] = "";
	uint64_t t0;
	size_t n;
	int r;

	if (!w || !dims)
		die("out of memory");
	memset(ret, 0, sizeof(*ret));
	/* One rank. */
	n = rank_wants(m, world, PLAN_READERS / 2, w, dims);
	t0 = now_ns();
	r = plan_index_new(m, &ix);
	if (!r)
		r = plan_build(ix, w, n, NULL, &p, err, sizeof(err));
	ret->one_rank_ms = ms_since(t0);
	if (r)
		die("planning one rank: %s", err[0] ? err : strerror(-r));
	ret->one_rank_bytes = plan_bytes(p, m);
	plan_free(p);
	plan_index_free(ix);
	/* Every rank (their wants made outside the clock). */
	double ms = 0;
	r = plan_index_new(m, &ix);
	for (uint32_t k = 0; k < PLAN_READERS && !r; k++) {
		n = rank_wants(m, world, k, w, dims);
		t0 = now_ns();
		r = plan_build(ix, w, n, NULL, &p, err, sizeof(err));
		ms += ms_since(t0);
		if (!r) {
			uint64_t b = plan_bytes(p, m);
			if (b > ret->max_rank_bytes)
				ret->max_rank_bytes = b;
			plan_free(p);
		}
	}
	if (r)
		die("planning all ranks: %s", err[0] ? err : strerror(-r));
	ret->all_ranks_ms = ms;
	for (size_t i = 0; i < m->n_items; i++)
		ret->index_bytes += m->items[i].n_chunks * sizeof(uint32_t);
	plan_index_free(ix);
	free(w);
	free(dims);
	return 0;
}

/* ---- memory --------------------------------------------------------------------- */

/* The "Key:  N kB" line of /proc/self/status, in bytes; -1 if unreadable. */
static int64_t status_bytes(const char *key)
{
	size_t klen = strlen(key);
	char line[256];
	int64_t v = -1;
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			v = strtoll(line + klen + 1, NULL, 10) * 1024;
			break;
		}
	fclose(f);
	return v;
}

/* Resets this process's peak RSS (VmHWM) to its current RSS (Linux 4.0+). */
static bool reset_hwm(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
	bool ok;

	if (fd < 0)
		return false;
	ok = write(fd, "5", 1) == 1;
	close(fd);
	return ok;
}

static int64_t heap_in_use(void)
{
	struct mallinfo2 mi = mallinfo2();

	return (int64_t)(mi.uordblks + mi.hblkhd);
}

struct mem_rec {
	int32_t ok;
	int32_t hwm;
	int64_t peak, retained;
};

/* In the forked child: runs one step and reports its peak extra memory. */
static void mem_child(enum step s, const struct corpus *c, const char *manifest, size_t mlen,
		      int fd)
{
	struct mem_rec rec = { .ok = 1 };
	struct rusage ru;
	int64_t start, end;
	char *text = NULL;
	size_t len;

	rec.hwm = reset_hwm();
	if (rec.hwm) {
		start = status_bytes("VmRSS");
	} else {
		getrusage(RUSAGE_SELF, &ru);
		start = (int64_t)ru.ru_maxrss * 1024;
	}
	switch (s) {
	case STEP_MERGE:
		time_merge(c, &text, &len);
		free(text);
		break;
	case STEP_PARSE:
		time_parse(c, merge_threads_for(c->world));
		break;
	case STEP_OPEN: {
		struct manifest m;
		int64_t before = heap_in_use();

		memset(&m, 0, sizeof(m));
		time_open(manifest, mlen, &m);
		rec.retained = heap_in_use() - before;
		manifest_free(&m);
		break;
	}
	default:
		rec.ok = 0;
		break;
	}
	if (rec.hwm) {
		end = status_bytes("VmHWM");
	} else {
		getrusage(RUSAGE_SELF, &ru);
		end = (int64_t)ru.ru_maxrss * 1024;
	}
	if (start < 0 || end < 0)
		rec.ok = 0;
	rec.peak = end - start;
	if (write(fd, &rec, sizeof(rec)) != (ssize_t)sizeof(rec))
		_exit(1);
	_exit(0);
}

/* Measures step s in a forked child (see the top).  Returns 0 with *ret, or
 * -errno. */
static int measure_mem(enum step s, const struct corpus *c, const char *manifest, size_t mlen,
		       struct mem_rec *ret)
{
	struct mem_rec rec = { 0 };
	int p[2], status;
	ssize_t got;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	/* Freed heap the child could reuse without faulting a page in would
	 * hide from its peak: give it back first. */
	malloc_trim(0);
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		int e = -errno;

		close(p[0]);
		close(p[1]);
		return e;
	}
	if (pid == 0) {
		close(p[0]);
		mem_child(s, c, manifest, mlen, p[1]);
	}
	close(p[1]);
	do
		got = read(p[0], &rec, sizeof(rec));
	while (got < 0 && errno == EINTR);
	close(p[0]);
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	if (got != (ssize_t)sizeof(rec) || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
	    !rec.ok)
		return -EIO;
	*ret = rec;
	return 0;
}

/* ---- statistics ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median and minimum of v[0..n) (n >= 1); v is left as it was. */
static void med_min(const double *v, unsigned n, double *ret_med, double *ret_min)
{
	double s[MAX_REPS];

	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	*ret_med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	*ret_min = s[0];
}

/*
 * Natural logarithm of a positive, normal x.  The bench programs link
 * without libm (the Makefile's LDLIBS has no -lm), and a slope over a few
 * points needs nothing better than this: x = f * 2^e with f in [1, 2), and
 * ln f = 2 atanh(z), z = (f - 1) / (f + 1) <= 1/3, by its series (30 terms
 * take the error far below a double's precision).
 */
static double ln_pos(double x)
{
	const double ln2 = 0.69314718055994530942;
	double f, z, z2, term, sum = 0;
	uint64_t bits;
	int e;

	memcpy(&bits, &x, sizeof(bits));
	e = (int)((bits >> 52) & 0x7ff) - 1023;
	bits = (bits & ~(0x7ffull << 52)) | (1023ull << 52);
	memcpy(&f, &bits, sizeof(f));
	z = (f - 1) / (f + 1);
	z2 = z * z;
	term = z;
	for (int k = 1; k < 60; k += 2) {
		sum += term / k;
		term *= z2;
	}
	return e * ln2 + 2 * sum;
}

/* Least-squares slope of ln(y) over ln(x).  Returns false when it is not
 * defined (fewer than two distinct x, or a y that is not positive). */
static bool loglog_slope(const uint32_t *x, const double *y, unsigned n, double *ret)
{
	double lx[MAX_WORLDS], ly[MAX_WORLDS], mx = 0, my = 0, sxy = 0, sxx = 0;

	for (unsigned i = 0; i < n; i++) {
		if (!(y[i] > 0))
			return false;
		lx[i] = ln_pos((double)x[i]);
		ly[i] = ln_pos(y[i]);
		mx += lx[i];
		my += ly[i];
	}
	if (n < 2)
		return false;
	mx /= n;
	my /= n;
	for (unsigned i = 0; i < n; i++) {
		sxy += (lx[i] - mx) * (ly[i] - my);
		sxx += (lx[i] - mx) * (lx[i] - mx);
	}
	if (!(sxx > 0))
		return false;
	*ret = sxy / sxx;
	return true;
}

/* ---- one world size ------------------------------------------------------------ */

static unsigned merge_threads_for(uint32_t world)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = world;

	if (ncpu > 0 && n > (unsigned long)ncpu)
		n = (unsigned)ncpu;
	if (n > MERGE_MAX_THREADS)
		n = MERGE_MAX_THREADS;
	return n;
}

/* Checks the warm-up's manifest: every tensor, blob and chunk generated is
 * in it, so the rounds time a merge and an open of the whole checkpoint. */
static void check_manifest(const struct corpus *c, const struct manifest *m)
{
	uint64_t chunks = 0;

	for (size_t i = 0; i < m->n_items; i++)
		chunks += m->items[i].n_chunks;
	if (m->world != c->world || m->n_files != c->world || m->n_tensors != c->n_tensors ||
	    m->n_items != c->n_tensors + c->n_blobs || chunks != c->n_chunks)
		die("manifest of %u ranks lists %zu files, %zu tensors, %zu items, %" PRIu64
		    " chunks; expected %u, %zu, %zu, %" PRIu64,
		    c->world, m->n_files, m->n_tensors, m->n_items, chunks, c->world, c->n_tensors,
		    c->n_tensors + c->n_blobs, c->n_chunks);
}

/* What a round's open step measures besides the open itself. */
struct open_extra {
	int plan_ret;            /* plan_hook's return */
	struct plan_times plan;  /* valid if plan_ret == 0 */
	double close_ms;         /* manifest_free */
};

/*
 * Runs one step of a round and returns its time.  The merge's text is
 * compared with the reference (*ref NULL in the warm-up, which sets it);
 * open's manifest goes to the planner hook and is then closed, timed into
 * *ox.
 *
 * Afterwards, untimed, the allocator is settled with malloc_trim(0).  glibc
 * leaves freed small chunks (fastbins) unmerged until some later large
 * malloc or free consolidates them, and keeps freed heap mapped: without
 * this, the millions of nodes one step's jansson tree frees would be paid
 * for on the next step's clock, and a step would run faster or slower
 * depending on which step ran before it.  So every step starts from a heap
 * holding only the corpus and the reference manifest, and pays for the
 * pages it faults in, as a reader opening a manifest in a fresh process
 * does.
 */
static double run_step(enum step s, const struct corpus *c, char **ref, size_t *ref_len,
		       struct open_extra *ox)
{
	struct manifest m;
	char *text;
	size_t len;
	double ms = 0;
	uint64_t t0;

	switch (s) {
	case STEP_MERGE:
		ms = time_merge(c, &text, &len);
		if (!*ref) {
			*ref = text;
			*ref_len = len;
		} else {
			if (len != *ref_len || memcmp(text, *ref, len) != 0)
				die("two merges of the same %u indexes made different manifests",
				    c->world);
			free(text);
		}
		break;
	case STEP_PARSE:
		ms = time_parse(c, merge_threads_for(c->world));
		break;
	case STEP_PARSE_SERIAL:
		ms = time_parse(c, 1);
		break;
	case STEP_OPEN:
		memset(&m, 0, sizeof(m));
		ms = time_open(*ref, *ref_len, &m);
		check_manifest(c, &m);
		ox->plan_ret = plan_hook(&m, c->world, &ox->plan);
		t0 = now_ns();
		manifest_free(&m);
		ox->close_ms = ms_since(t0);
		break;
	case STEP_OPEN_JSON:
		ms = time_open_json(*ref, *ref_len);
		break;
	default:
		die("unknown step %d", (int)s);
	}
	malloc_trim(0);
	return ms;
}

static void world_free(struct world *w)
{
	for (int s = 0; s < N_STEPS; s++)
		free(w->ms[s]);
	free(w->plan_one);
	free(w->plan_all);
	free(w->close);
	free(w->ref);
	corpus_free(&w->c);
	memset(w, 0, sizeof(*w));
}

/* Generates world size `world`'s indexes and runs its warm-up round, which
 * makes the manifest its opens read. */
static void world_init(struct world *w, const struct opts *o, const struct tspec *specs,
		       uint32_t world)
{
	char err[ERR_LEN] = "";
	struct open_extra ox = { 0 };
	uint64_t t0;
	int ret;

	memset(w, 0, sizeof(*w));
	for (int s = 0; s < N_STEPS; s++)
		if (!(w->ms[s] = calloc(o->reps, sizeof(double))))
			die("out of memory");
	w->plan_one = calloc(o->reps, sizeof(double));
	w->plan_all = calloc(o->reps, sizeof(double));
	w->close = calloc(o->reps, sizeof(double));
	if (!w->plan_one || !w->plan_all || !w->close)
		die("out of memory");

	fprintf(stderr, "ckpt_scale: %u ranks: generating the indexes of %u tensors...\n", world,
		o->tensors);
	t0 = now_ns();
	ret = corpus_build(&w->c, specs, o->tensors, world, err, sizeof(err));
	if (ret)
		die("generating %u ranks: %s", world, err);
	w->generate_ms = ms_since(t0);

	malloc_trim(0);
	for (int s = 0; s < N_STEPS; s++)
		w->first[s] = run_step((enum step)s, &w->c, &w->ref, &w->ref_len, &ox);
	w->first_close = ox.close_ms;
	w->plan_ok = true;
}

/*
 * Round k: every step of every world size.  World sizes are interleaved
 * within the round, not measured one after the other, so that the load of
 * a shared machine drifting over the run moves all of them alike and the
 * slope over W (computed per round) does not mistake the drift for
 * scaling.  Both the order of the world sizes and the order of the steps
 * rotate from round to round.
 */
static void run_round(const struct opts *o, struct world *ws, unsigned k)
{
	for (unsigned j = 0; j < o->n_worlds; j++) {
		struct world *w = &ws[(k + j) % o->n_worlds];

		for (unsigned i = 0; i < N_STEPS; i++) {
			enum step s = (enum step)((k + i) % N_STEPS);
			struct open_extra ox = { .plan_ret = -EOPNOTSUPP };

			w->ms[s][k] = run_step(s, &w->c, &w->ref, &w->ref_len, &ox);
			if (s != STEP_OPEN)
				continue;
			w->close[k] = ox.close_ms;
			if (ox.plan_ret) {
				w->plan_ok = false;
			} else {
				w->plan_one[k] = ox.plan.one_rank_ms;
				w->plan_all[k] = ox.plan.all_ranks_ms;
				w->plan_last = ox.plan;
			}
		}
		fprintf(stderr, "ckpt_scale: round %u/%u: %u ranks: merge %.1f ms, parse %.1f ms, "
			"open %.1f ms\n", k + 1, o->reps, w->c.world, w->ms[STEP_MERGE][k],
			w->ms[STEP_PARSE][k], w->ms[STEP_OPEN][k]);
	}
}

static void world_stats(const struct opts *o, struct world *w)
{
	for (int s = 0; s < N_STEPS; s++)
		med_min(w->ms[s], o->reps, &w->med[s], &w->min[s]);
	med_min(w->close, o->reps, &w->close_med, &w->close_min);
}

static void measure_world_mem(struct world *w)
{
	static const enum step steps[] = { STEP_MERGE, STEP_PARSE, STEP_OPEN };
	struct mem *mem = &w->mem;
	struct mem_rec rec = { 0 };

	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		int ret = measure_mem(steps[i], &w->c, w->ref, w->ref_len, &rec);

		if (ret)
			die("memory of %s at %u ranks: %s", step_key[steps[i]], w->c.world,
			    strerror(-ret));
		mem->hwm = rec.hwm;
		if (steps[i] == STEP_MERGE)
			mem->merge_peak = rec.peak;
		else if (steps[i] == STEP_PARSE)
			mem->parse_peak = rec.peak;
		else {
			mem->open_peak = rec.peak;
			mem->open_retained = rec.retained;
		}
	}
}

/* ---- output ---------------------------------------------------------------------- */

static void print_ms_array(const char *key, const double *v, unsigned n)
{
	printf("\"%s\": [", key);
	for (unsigned i = 0; i < n; i++)
		printf("%s%.3f", i ? ", " : "", v[i]);
	printf("]");
}

/* A ratio a/b computed per round: {"median", "min", "max"}. */
static void print_ratio(const char *key, const double *a, const double *b, unsigned n)
{
	double r[MAX_REPS], med, min, max = 0;

	for (unsigned i = 0; i < n; i++) {
		r[i] = a[i] / b[i];
		if (i == 0 || r[i] > max)
			max = r[i];
	}
	med_min(r, n, &med, &min);
	printf("\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}", key, med, min, max);
}

static double ratio_median(const double *a, const double *b, unsigned n)
{
	double r[MAX_REPS], med, min;

	for (unsigned i = 0; i < n; i++)
		r[i] = a[i] / b[i];
	med_min(r, n, &med, &min);
	return med;
}

static void print_world(const struct opts *o, const struct world *w)
{
	const struct corpus *c = &w->c;
	const struct mem *mem = &w->mem;
	unsigned n = o->reps;
	double pm, pmin;

	printf("{\"record\": \"ranks\", \"ranks\": %u, \"tensors\": %zu, \"blobs\": %zu, "
	       "\"chunks\": %" PRIu64 ", \"reps\": %u, \"index_bytes\": %" PRIu64
	       ", \"manifest_bytes\": %" PRIu64,
	       c->world, c->n_tensors, c->n_blobs, c->n_chunks, n, c->index_bytes,
	       (uint64_t)w->ref_len);
	for (int s = 0; s < N_STEPS; s++)
		printf(", \"%s\": %.3f, \"%s_min\": %.3f", step_key[s], w->med[s], step_key[s],
		       w->min[s]);
	printf(", \"close_ms\": %.3f, \"close_ms_min\": %.3f", w->close_med, w->close_min);
	printf(", \"merge_vs_parse\": %.3f",
	       ratio_median(w->ms[STEP_MERGE], w->ms[STEP_PARSE], n));
	printf(", \"ratios\": {");
	print_ratio("merge_vs_parse", w->ms[STEP_MERGE], w->ms[STEP_PARSE], n);
	printf(", ");
	print_ratio("merge_vs_parse_serial", w->ms[STEP_MERGE], w->ms[STEP_PARSE_SERIAL], n);
	printf(", ");
	print_ratio("open_vs_open_json", w->ms[STEP_OPEN], w->ms[STEP_OPEN_JSON], n);
	if (w->plan_ok) {
		printf(", ");
		print_ratio("plan_one_vs_open", w->plan_one, w->ms[STEP_OPEN], n);
	}
	printf("}");
	for (int s = 0; s < N_STEPS; s++)
		printf(", \"first_%s\": %.3f", step_key[s], w->first[s]);
	printf(", \"first_close_ms\": %.3f", w->first_close);
	printf(", \"memory\": {\"method\": \"%s\", \"merge_peak_bytes\": %" PRId64
	       ", \"parse_peak_bytes\": %" PRId64 ", \"open_peak_bytes\": %" PRId64
	       ", \"open_retained_bytes\": %" PRId64 "}",
	       mem->hwm ? "fork+clear_refs:VmHWM-VmRSS" : "fork+ru_maxrss (lower bound)",
	       mem->merge_peak, mem->parse_peak, mem->open_peak, mem->open_retained);
	if (w->plan_ok) {
		med_min(w->plan_one, n, &pm, &pmin);
		printf(", \"plan_one_rank_ms\": %.3f", pm);
		med_min(w->plan_all, n, &pm, &pmin);
		printf(", \"plan_all_ranks_ms\": %.3f", pm);
		printf(", \"plan_one_vs_open\": %.4f",
		       ratio_median(w->plan_one, w->ms[STEP_OPEN], n));
		printf(", \"plan_readers\": %u, \"plan_one_rank_bytes\": %" PRIu64
		       ", \"plan_max_rank_bytes\": %" PRIu64 ", \"plan_index_bytes\": %" PRIu64,
		       PLAN_READERS, w->plan_last.one_rank_bytes, w->plan_last.max_rank_bytes,
		       w->plan_last.index_bytes);
	} else {
		printf(", \"plan_one_rank_ms\": null, \"plan_all_ranks_ms\": null");
	}
	printf(", \"rounds\": {");
	for (int s = 0; s < N_STEPS; s++) {
		printf("%s", s ? ", " : "");
		print_ms_array(step_key[s], w->ms[s], n);
	}
	printf(", ");
	print_ms_array("close_ms", w->close, n);
	if (w->plan_ok) {
		printf(", ");
		print_ms_array("plan_one_rank_ms", w->plan_one, n);
		printf(", ");
		print_ms_array("plan_all_ranks_ms", w->plan_all, n);
	}
	printf("}, \"detail\": {\"merge_threads\": %u, \"parse_threads\": %u, \"cpus\": %ld, "
	       "\"generate_ms\": %.1f, \"json_flags\": \"JSON_REJECT_DUPLICATES\", "
	       "\"fetch\": \"malloc'd copy per rank\", "
	       "\"between_steps\": \"malloc_trim(0), untimed\"}",
	       merge_threads_for(c->world), merge_threads_for(c->world),
	       sysconf(_SC_NPROCESSORS_ONLN), w->generate_ms);
	printf(", \"notes\": [");
	if (!w->plan_ok)
		printf("\"plan_*: no load planner yet (plan_hook)\"");
	printf("]}\n");
	fflush(stdout);

	fprintf(stderr,
		"ckpt_scale: %u ranks: %" PRIu64 " chunks, indexes %.1f MiB, manifest %.1f MiB | "
		"merge %.1f ms (min %.1f), parse %.1f ms on %u threads (serial %.1f), "
		"merge/parse %.2f | open %.1f ms (json %.1f), close %.1f ms | peak: merge %.1f MiB, "
		"open %.1f MiB (keeps %.1f MiB)\n",
		c->world, c->n_chunks, (double)c->index_bytes / 1048576.0,
		(double)(uint64_t)w->ref_len / 1048576.0, w->med[STEP_MERGE], w->min[STEP_MERGE],
		w->med[STEP_PARSE], merge_threads_for(c->world), w->med[STEP_PARSE_SERIAL],
		ratio_median(w->ms[STEP_MERGE], w->ms[STEP_PARSE], n), w->med[STEP_OPEN],
		w->med[STEP_OPEN_JSON], w->close_med, (double)mem->merge_peak / 1048576.0,
		(double)mem->open_peak / 1048576.0, (double)mem->open_retained / 1048576.0);
}

/* The slope of log(ms) over log(W) of one step: per round (each round
 * holds every world size, see run_round) as median/min/max, and of the
 * medians over rounds. */
struct slope {
	bool ok;
	double median, min, max, of_medians;
};

static struct slope step_slope(const struct opts *o, const struct world *ws, enum step s)
{
	double y[MAX_WORLDS], per[MAX_REPS];
	struct slope r = { 0 };

	for (unsigned k = 0; k < o->reps; k++) {
		for (unsigned j = 0; j < o->n_worlds; j++)
			y[j] = ws[j].ms[s][k];
		if (!loglog_slope(o->worlds, y, o->n_worlds, &per[k]))
			return r;
		if (k == 0 || per[k] > r.max)
			r.max = per[k];
	}
	for (unsigned j = 0; j < o->n_worlds; j++)
		y[j] = ws[j].med[s];
	if (!loglog_slope(o->worlds, y, o->n_worlds, &r.of_medians))
		return r;
	med_min(per, o->reps, &r.median, &r.min);
	r.ok = true;
	return r;
}

static void print_slope(const char *key, const struct slope *sl)
{
	if (sl->ok)
		printf("\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f, "
		       "\"of_medians\": %.3f}", key, sl->median, sl->min, sl->max, sl->of_medians);
	else
		printf("\"%s\": null", key);
}

/* Target check: value <= limit. */
static void print_target(const char *key, bool have, double value, double limit, bool *first)
{
	printf("%s\"%s\": {\"value\": ", *first ? "" : ", ", key);
	*first = false;
	if (have)
		printf("%.3f", value);
	else
		printf("null");
	printf(", \"max\": %.1f, \"status\": %s}", limit,
	       !have ? "null" : value <= limit ? "\"met\"" : "\"missed\"");
}

static void print_summary(const struct opts *o, const struct world *ws)
{
	static const enum step fit[] = { STEP_MERGE, STEP_PARSE, STEP_PARSE_SERIAL, STEP_OPEN };
	static const char *const fit_key[] = { "merge", "parse", "parse_serial", "open" };
	double med[MAX_WORLDS], worst = 0;
	struct slope merge = step_slope(o, ws, STEP_MERGE);
	bool first = true;

	for (unsigned i = 0; i < o->n_worlds; i++) {
		double r = ratio_median(ws[i].ms[STEP_MERGE], ws[i].ms[STEP_PARSE], o->reps);

		if (i == 0 || r > worst)
			worst = r;
	}
	printf("{\"record\": \"summary\", \"tensors\": %u, \"reps\": %u, \"ranks\": [", o->tensors,
	       o->reps);
	for (unsigned i = 0; i < o->n_worlds; i++)
		printf("%s%u", i ? ", " : "", o->worlds[i]);
	printf("]");
	for (size_t f = 0; f < sizeof(fit) / sizeof(fit[0]); f++) {
		for (unsigned i = 0; i < o->n_worlds; i++)
			med[i] = ws[i].med[fit[f]];
		printf(", ");
		print_ms_array(step_key[fit[f]], med, o->n_worlds);
	}
	if (merge.ok)
		printf(", \"scaling_exponent_merge\": %.3f", merge.median);
	else
		printf(", \"scaling_exponent_merge\": null");
	printf(", \"scaling_exponents\": {");
	for (size_t f = 0; f < sizeof(fit) / sizeof(fit[0]); f++) {
		struct slope sl = step_slope(o, ws, fit[f]);

		printf("%s", f ? ", " : "");
		print_slope(fit_key[f], &sl);
	}
	/* The planner: its worst one-rank/open ratio, and the slope of
	 * all-ranks planning over the world sizes, per round. */
	bool plan_ok = o->n_worlds > 0;
	double plan_worst = 0, per[MAX_REPS], y[MAX_WORLDS], plan_slope = 0, pmin;
	for (unsigned i = 0; i < o->n_worlds; i++) {
		plan_ok = plan_ok && ws[i].plan_ok;
		if (!ws[i].plan_ok)
			continue;
		double r = ratio_median(ws[i].plan_one, ws[i].ms[STEP_OPEN], o->reps);
		if (r > plan_worst)
			plan_worst = r;
	}
	bool slope_ok = plan_ok;
	for (unsigned k = 0; k < o->reps && slope_ok; k++) {
		for (unsigned j = 0; j < o->n_worlds; j++)
			y[j] = ws[j].plan_all[k];
		slope_ok = loglog_slope(o->worlds, y, o->n_worlds, &per[k]);
	}
	if (slope_ok)
		med_min(per, o->reps, &plan_slope, &pmin);
	printf("}, \"plan_one_vs_open_worst\": ");
	if (plan_ok)
		printf("%.4f", plan_worst);
	else
		printf("null");
	printf(", \"scaling_exponent_plan_all\": ");
	if (slope_ok)
		printf("%.3f", plan_slope);
	else
		printf("null");
	printf(", \"merge_vs_parse_worst\": %.3f, \"targets\": {", worst);
	print_target("merge_vs_parse", true, worst, 2.0, &first);
	print_target("plan_one_vs_open", plan_ok, plan_worst, 0.1, &first);
	print_target("scaling_exponent_merge", merge.ok, merge.median, 1.2, &first);
	print_target("scaling_exponent_plan_all", slope_ok, plan_slope, 1.2, &first);
	printf("}, \"notes\": [\"merge_vs_parse: the worst world size's median\", "
	       "\"scaling exponents: least-squares slope of log(ms) over log(ranks) in each "
	       "round (world sizes interleaved), median over rounds\"");
	if (!merge.ok)
		printf(", \"scaling exponents need two or more distinct world sizes\"");
	printf("]}\n");
	fflush(stdout);

	if (plan_ok)
		fprintf(stderr, "ckpt_scale: plan one rank / open worst %.4f (target <= 0.1); "
			"all-ranks planning scaling exponent %.3f (target <= 1.2)\n", plan_worst,
			slope_ok ? plan_slope : -1.0);
	fprintf(stderr, "ckpt_scale: merge/parse worst %.2f (target <= 2)", worst);
	if (merge.ok)
		fprintf(stderr, ", merge scaling exponent %.3f (rounds %.3f..%.3f; of medians "
			"%.3f; target <= 1.2)\n", merge.median, merge.min, merge.max,
			merge.of_medians);
	else
		fprintf(stderr, ", merge scaling exponent n/a\n");
}

int main(int argc, char **argv)
{
	struct world ws[MAX_WORLDS];
	struct tspec *specs;
	struct opts o;

	parse_opts(argc, argv, &o);
	/* jansson seeds its hash function when the first object is made; make
	 * it here, before any parse thread runs. */
	json_decref(json_object());
	specs = calloc(o.tensors, sizeof(*specs));
	if (!specs)
		die("out of memory");
	for (unsigned i = 0; i < o.tensors; i++)
		model_spec(i, &specs[i]);

	for (unsigned i = 0; i < o.n_worlds; i++)
		world_init(&ws[i], &o, specs, o.worlds[i]);
	for (unsigned k = 0; k < o.reps; k++)
		run_round(&o, ws, k);
	for (unsigned i = 0; i < o.n_worlds; i++) {
		world_stats(&o, &ws[i]);
		measure_world_mem(&ws[i]);
		print_world(&o, &ws[i]);
	}
	print_summary(&o, ws);
	for (unsigned i = 0; i < o.n_worlds; i++)
		world_free(&ws[i]);
	free(specs);
	return 0;
}
