/* SPDX-License-Identifier: MIT */
/*
 * ckpt.h - libckpt, the client library of the ckptd checkpoint daemon.
 *
 * A trainer connects to the per-node daemon (ckptd), describes a save (its
 * tensors and blobs), and commits it.  The commit call returns at once with
 * two futures:
 *
 *   staged     every byte has been copied into the daemon's shared-memory
 *              staging arena; the trainer may mutate its memory again.
 *   committed  the checkpoint is durable and visible under <root>/<name>.
 *
 * The copies run on library threads, never on the caller's thread.  The daemon
 * drains the arena to disk while staging continues, and commits even if the
 * trainer dies after "staged".
 *
 * Conventions (as in liburing and systemd):
 *   - fallible functions return 0 (or a count) on success and a negative errno
 *     on failure; they never set errno;
 *   - ret_* output parameters are written only on success;
 *   - synchronous calls leave a human-readable reason in ckpt_last_error()
 *     (per thread); asynchronous failures are read with ckpt_future_error();
 *   - the library never prints; it can report what it does through a log
 *     callback (ckpt_set_log_fn()).
 *
 * ABI and versions:
 *   - The soname is libckpt.so.0.  Every symbol carries a version node
 *     (LIBCKPT_0.2, and LIBCKPT_0.3 .. 0.6 for what each added); symbols
 *     added later go into a new node,
 *     so a program linked against this release keeps running with later ones.
 *   - Structs the caller fills in (ckpt_connect_opts, ckpt_save_opts,
 *     ckpt_tensor) start with a `size` field, which the caller sets to the
 *     sizeof the struct it was compiled with through the *_INIT macro.  The
 *     library reads only `size` bytes and treats every field beyond them as
 *     zero, so a new field's zero value always means "as before".  A size
 *     smaller than the first version of the struct is -EINVAL; a size larger
 *     than the library knows (a program built against a newer header running
 *     with an older library) is accepted only if every byte the library does
 *     not know is zero, else -E2BIG: the caller asked for something this
 *     library cannot do.  Sizes above 4096 are -E2BIG without being read.
 *     Fields are only ever appended.
 *   - Enums are append-only: values never change meaning or get reused, new
 *     ones are added at the end.  Treat a value you do not know as an error
 *     (or, for log levels, as CKPT_LOG_DEBUG).
 *
 * Initialising a struct: the *_INIT macros expand to a designator, used first
 * inside the braces; every field not named is zero:
 *
 *     struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_F32,
 *                              .ndim = 2, .shape = shape, .data = w };
 *     struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };
 *     o.job = "llama"; ...
 *
 * A struct whose size field is 0 (initialised without the macro, or by a
 * program written for libckpt 0.1) is refused with -EINVAL.
 *
 * Thread safety:
 *   - ckpt_connect/ckpt_disconnect, ckpt_version, ckpt_dtype_*,
 *     ckpt_set_log_fn and ckpt_last_error may be called from any thread.
 *   - A client may be used from several threads at once (each building its
 *     own saves), but one save must be built (set_*, add_*, commit) by one
 *     thread at a time.
 *   - Futures: ckpt_future_poll, ckpt_future_wait and ckpt_future_error may
 *     be called from any number of threads at once, for as long as their save
 *     has not been freed.
 *   - Readers are not thread-safe: use one reader per thread, or hold a lock
 *     around every call on a reader shared between threads.  Several readers,
 *     also of the same checkpoint, may be used from different threads at once.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_API __attribute__((visibility("default")))

/* Version of this header; ckpt_version() is that of the library at run time. */
#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 6
#define CKPT_VERSION_PATCH 0

/* Socket used when neither the options nor $CKPTD_SOCKET name one. */
#define CKPT_DEFAULT_SOCKET "/run/ckptd/ckptd.sock"

/* Limits, enforced by the library and again by the daemon. */
#define CKPT_MAX_JOB_LEN   128  /* job id: [A-Za-z0-9._-]+ */
#define CKPT_MAX_RUN_LEN   128  /* run id: "" or [A-Za-z0-9._-]+ */
#define CKPT_MAX_NAME_LEN  128  /* checkpoint name: [A-Za-z0-9._-]+, no leading '.' */
#define CKPT_MAX_ITEM_NAME 512  /* tensor / blob name: printable ASCII */
#define CKPT_MAX_NDIM      16
#define CKPT_MAX_WORLD     65536
#define CKPT_MAX_ITEMS     1000000 /* tensors + blobs in one save of one rank */
#define CKPT_MAX_META_KEYS 256     /* user metadata entries, and metrics */
#define CKPT_MAX_META_LEN  4096    /* one metadata value */

struct ckpt_client;
struct ckpt_save;
struct ckpt_future;
struct ckpt_reader;

/* Returns the library's version, "MAJOR.MINOR.PATCH" (static storage). */
CKPT_API const char *ckpt_version(void);

/* Element types; the names are those of the safetensors format.  Append-only
 * (CKPT_DTYPE_COUNT moves; do not store it). */
enum ckpt_dtype {
	CKPT_BOOL = 0,
	CKPT_U8,
	CKPT_I8,
	CKPT_I16,
	CKPT_U16,
	CKPT_I32,
	CKPT_U32,
	CKPT_I64,
	CKPT_U64,
	CKPT_F16,
	CKPT_BF16,
	CKPT_F32,
	CKPT_F64,
	CKPT_F8_E4M3,
	CKPT_F8_E5M2,
	CKPT_DTYPE_COUNT
};

/* Returns the safetensors name of a dtype ("F32"), or NULL if out of range. */
CKPT_API const char *ckpt_dtype_name(enum ckpt_dtype dtype);
/* Returns the size in bytes of one element, or 0 if out of range. */
CKPT_API size_t ckpt_dtype_size(enum ckpt_dtype dtype);

/* Where a tensor's bytes live; selects the copy engine for that tensor.
 * Append-only. */
enum ckpt_device {
	CKPT_DEVICE_HOST = 0, /* ordinary (pageable or pinned) host memory */
	CKPT_DEVICE_CUDA = 1, /* CUDA device memory: needs a CUDA build */
};

/* Whether the client pins its staging arena for CUDA copies
 * (cudaHostRegister, once, at connect or at the first device tensor).
 * Copies from a device into pinned memory run on the GPU's copy engine
 * without a CPU; into pageable memory they are slower and hold the copying
 * thread.  Append-only. */
enum ckpt_cuda_pin {
	CKPT_CUDA_PIN_AUTO = 0, /* pin at the first device tensor (in
	                         * ckpt_save_add_tensor, with that tensor's
	                         * device current): a client that saves only
	                         * host memory never pins.  A failure to pin is
	                         * logged, and copies go unpinned */
	CKPT_CUDA_PIN_ON = 1,   /* load CUDA and pin at connect, in the calling
	                         * thread's current CUDA context; ckpt_connect
	                         * fails if either fails */
	CKPT_CUDA_PIN_OFF = 2,  /* never pin */
};

/* Returns the message of the last failed synchronous call on this thread
 * ("" if none).  The string is valid until the next libckpt call on the same
 * thread. */
CKPT_API const char *ckpt_last_error(void);

/* ---- logging ------------------------------------------------------------- */

/* Severity of a log message, most severe first.  Append-only: a level added
 * later is less severe than every existing one. */
enum ckpt_log_level {
	CKPT_LOG_ERROR = 0,   /* a save or the connection failed */
	CKPT_LOG_WARNING = 1, /* a fallback was taken (e.g. the umask could not
	                       * be read) or an input was corrected */
	CKPT_LOG_INFO = 2,    /* once per connection: what was negotiated */
	CKPT_LOG_DEBUG = 3,   /* per save: timings; the defaults picked */
};

/* msg is one line without a trailing newline, valid during the call. */
typedef void (*ckpt_log_fn)(enum ckpt_log_level level, const char *msg, void *userdata);

/*
 * Sets the process-wide log callback (NULL: none, the default; the library
 * then formats nothing).  It receives every level: filter in the callback.
 *
 * The callback runs on library threads and on the caller's threads, at any
 * time and possibly while the library holds internal locks: it must be
 * thread-safe, return quickly, and call no libckpt function.  When
 * ckpt_set_log_fn() returns, no call to the previous callback is running or
 * will start, so its userdata may be freed.
 */
CKPT_API void ckpt_set_log_fn(ckpt_log_fn fn, void *userdata);

/* ---- connection ---------------------------------------------------------- */

/* Connect timeout used when ckpt_connect_opts.timeout_ms is 0: generous,
 * because the daemon allocates and touches the whole arena before it
 * answers, which takes seconds for tens of GiB. */
#define CKPT_DEFAULT_CONNECT_TIMEOUT_MS 60000

struct ckpt_connect_opts {
	uint32_t size;           /* set by CKPT_CONNECT_OPTS_INIT */
	uint32_t rank;           /* 0 <= rank < world */
	uint32_t world;          /* number of ranks in the job, >= 1 */
	uint32_t copy_threads;   /* host copy threads (at most 64).  0: the
	                          * CPUs this process may run on
	                          * (sched_getaffinity) divided by the ranks on
	                          * this node ($LOCAL_WORLD_SIZE when set, as
	                          * torchrun does; else 1), at least 1, at most
	                          * 64. */
	uint64_t arena_bytes;    /* staging arena wanted; 0: 1 GiB.  The daemon
	                          * may grant less (its cap); a save larger than
	                          * the arena still works, staging then waits for
	                          * the daemon to drain (backpressure). */
	int64_t timeout_ms;      /* limit on connecting, sending HELLO and
	                          * waiting for the daemon's answer (not on
	                          * mapping the arena afterwards).  0:
	                          * CKPT_DEFAULT_CONNECT_TIMEOUT_MS; < 0: none */
	const char *socket_path; /* NULL: $CKPTD_SOCKET, else CKPT_DEFAULT_SOCKET */
	const char *job;         /* job id shared by all ranks; required */
	const char *run;         /* run id (see below); NULL: from the
	                          * environment; "": none */
	/* libckpt 0.3: */
	enum ckpt_cuda_pin cuda_pin; /* see enum ckpt_cuda_pin; 0: AUTO */
	uint32_t flags;          /* 0 or CKPT_CONNECT_* (libckpt 0.5; was a
	                          * reserved field that had to be 0) */
};

/*
 * flags: keep this rank's newest committed checkpoint resident in ckptd's
 * memory (LIBCKPT_0.5).  The daemon copies every byte of each save into a
 * per-rank image as it checksums it, and once the save commits keeps that
 * image until a newer save of the same rank commits, the daemon stops, or
 * it needs the memory for staging arenas (images count against the
 * daemon's arena_total; the oldest go first).  A trainer of the same user
 * and job that restarts on this node (after kill -9, say) loads from there
 * with ckpt_load_set_client(): a memory copy instead of a read from
 * storage, every block still CRC-checked against the manifest.  Costs: up
 * to two images of the rank's shard size (the newest committed one and the
 * one the next save fills); the first two saves also allocate them.
 */
#define CKPT_CONNECT_RESIDENT 0x1u

#define CKPT_CONNECT_OPTS_INIT .size = sizeof(struct ckpt_connect_opts)
/* Size of the first version of the struct (libckpt 0.2). */
#define CKPT_CONNECT_OPTS_SIZE_VER0 (offsetof(struct ckpt_connect_opts, run) + sizeof(const char *))

/*
 * The run id.  ckptd tells one save attempt from another by (job, run,
 * checkpoint name, step, attempt).  A job that restarts after a failure
 * keeps its job id, so every restart of the job must bring a new run id,
 * the same on all its ranks on all nodes; otherwise a restarted rank could
 * be taken for a rank of the run that failed.  torchrun and SLURM give one
 * automatically, so most jobs need not set it.  In order, the first that is
 * set wins:
 *
 *   1. opts->run (checked: "" or [A-Za-z0-9._-]+, at most CKPT_MAX_RUN_LEN,
 *      else -EINVAL);
 *   2. $CKPT_RUN_ID;
 *   3. $TORCHELASTIC_RUN_ID "-" $TORCHELASTIC_RESTART_COUNT (0 if unset)
 *      (torchrun; note that without --rdzv-id its run id is "none", so only
 *      the restart count tells two launches apart);
 *   4. $SLURM_JOB_ID "." $SLURM_RESTART_COUNT (0 if unset);
 *   5. "" (no run id).
 *
 * Values from the environment are made to fit: characters outside
 * [A-Za-z0-9._-] become '_', and a value longer than CKPT_MAX_RUN_LEN is cut
 * and ends in a hash of the whole value.
 */

/*
 * Connects to ckptd as rank opts->rank of job opts->job, receives the staging
 * arena, maps it and touches every page once (so the first save pays no page
 * faults).  This can take a while for a large arena; do it once at start-up.
 * HELLO also tells the daemon the process's umask (files of its saves are
 * created with it) and the run id.
 *
 * Returns 0 and *ret_client, or:
 *   -EINVAL        bad options (see ckpt_last_error())
 *   -E2BIG         opts->size is larger than this library knows and the
 *                  extra bytes are not zero
 *   -ENOENT,
 *   -ECONNREFUSED  no daemon listens on the socket
 *   -EACCES        the socket or the job is not ours
 *   -ETIMEDOUT     the daemon did not accept or answer within the timeout
 *   -EPROTO        the daemon speaks another protocol version
 *   -ENOMEM        the arena could not be mapped
 *   or the errno the daemon refused the connection with (e.g. -EUSERS, too
 *   many clients), with the daemon's reason in ckpt_last_error().
 */
CKPT_API int ckpt_connect(const struct ckpt_connect_opts *opts, struct ckpt_client **ret_client);

/*
 * Waits until every save committed on this client is staged (so the daemon
 * owns it and will finish it), then closes the connection and frees the
 * client.  Saves not yet committed are abandoned.  Futures of this client's
 * saves stay readable until their save is freed; a committed future still
 * pending fails with -ECONNABORTED.  Accepts NULL.
 */
CKPT_API void ckpt_disconnect(struct ckpt_client *client);

/* Size of the staging arena the daemon granted. */
CKPT_API uint64_t ckpt_client_arena_bytes(const struct ckpt_client *client);

/* ---- save ---------------------------------------------------------------- */

struct ckpt_save_opts {
	uint32_t size;        /* set by CKPT_SAVE_OPTS_INIT */
	uint32_t flags;       /* none defined yet: must be 0 */
	const char *root;     /* absolute directory inside one of the daemon's
	                       * allowed roots */
	const char *name;     /* checkpoint name, e.g. "step-000100" */
	uint64_t step;        /* training step, recorded in the manifest */
};

#define CKPT_SAVE_OPTS_INIT .size = sizeof(struct ckpt_save_opts)
#define CKPT_SAVE_OPTS_SIZE_VER0 (offsetof(struct ckpt_save_opts, step) + sizeof(uint64_t))

/*
 * Starts describing a save of checkpoint opts->name under opts->root.  Every
 * rank of the job saves the same name.  Nothing is sent until
 * ckpt_save_commit().
 *
 * Attempts: each call counts as one attempt of that checkpoint name on this
 * client (the client remembers the last 64 names), and the daemon is told
 * the attempt number.  Ranks retry in step, so after a failed save every
 * rank that begins the same name again is at the same attempt, and the new
 * attempt never reuses anything written by the failed one.
 *
 * Returns 0 and *ret_save (free with ckpt_save_free()), or -EINVAL for a bad
 * name, root, flags or size, -E2BIG (see the ABI rules above), -ENOMEM.
 */
CKPT_API int ckpt_save_begin_opts(struct ckpt_client *client, const struct ckpt_save_opts *opts,
				  struct ckpt_save **ret_save);

/* The same, without options struct: ckpt_save_begin_opts() with root, name
 * and step. */
CKPT_API int ckpt_save_begin(struct ckpt_client *client, const char *root, const char *name,
			     uint64_t step, struct ckpt_save **ret_save);

/*
 * Building a save: set_metadata, set_metric, add_tensor and add_blob.  A
 * save must be saved whole or not at all, so the first of these calls that
 * fails (for any reason other than -EBUSY, the save being committed
 * already) makes the save incomplete: later calls still check their
 * arguments, but ckpt_save_commit() then refuses the save with that first
 * failure's errno and a message naming the failed call.  Free it and begin
 * again.
 */

/* Adds a user metadata string (recorded in manifest.json).  Rank 0's metadata
 * is the checkpoint's.  Returns 0, -EINVAL (bad key/value), -E2BIG, -EEXIST,
 * -EBUSY (already committed). */
CKPT_API int ckpt_save_set_metadata(struct ckpt_save *save, const char *key, const char *value);

/* Adds a metric (e.g. "loss"), used later for keep-best pruning.  Finite
 * values only.  Returns 0, -EINVAL, -E2BIG, -EEXIST, -EBUSY. */
CKPT_API int ckpt_save_set_metric(struct ckpt_save *save, const char *key, double value);

/* One tensor, or one chunk of a sharded tensor. */
struct ckpt_tensor {
	uint32_t size;             /* set by CKPT_TENSOR_INIT */
	enum ckpt_dtype dtype;
	const char *name;          /* unique in the checkpoint across all ranks'
	                            * tensors and blobs, except chunks of one
	                            * sharded tensor, which share it */
	const uint64_t *shape;     /* this chunk's shape, ndim entries */
	const void *data;          /* contiguous, row-major; must stay valid and
	                            * unchanged until the staged future completes */
	const uint64_t *global_shape; /* NULL: the tensor is not sharded */
	const uint64_t *offsets;      /* where this chunk starts in the global
	                               * tensor; NULL iff global_shape is NULL */
	uint32_t ndim;             /* 0 (a scalar) .. CKPT_MAX_NDIM */
	enum ckpt_device device;
	int32_t device_index;      /* CUDA device ordinal, for CKPT_DEVICE_CUDA */
	uint32_t replica;          /* data-parallel copies of the same chunk: only
	                            * replica 0 is written, others are skipped */
	/* libckpt 0.3: */
	void *cuda_stream;         /* CKPT_DEVICE_CUDA: the cudaStream_t the
	                            * tensor was produced on; the copy waits for
	                            * the work queued on it before the commit.
	                            * NULL: the save's stream
	                            * (ckpt_save_set_cuda_stream) */
};

#define CKPT_TENSOR_INIT .size = sizeof(struct ckpt_tensor)
#define CKPT_TENSOR_SIZE_VER0 (offsetof(struct ckpt_tensor, replica) + sizeof(uint32_t))

/*
 * Adds a tensor.  The bytes are not read until the save is committed, and
 * only on library threads.  The strings and arrays of *tensor are copied.
 *
 * Returns 0, or -EINVAL (bad size, name, dtype, shape, offsets outside the
 * global shape), -E2BIG (too many items, or see the ABI rules above),
 * -EEXIST (name already in this save), -EOPNOTSUPP (device memory in a build
 * without the CUDA engine), -EBUSY (already committed), -ENOMEM.
 */
CKPT_API int ckpt_save_add_tensor(struct ckpt_save *save, const struct ckpt_tensor *tensor);

/*
 * Adds n tensors, as n calls of ckpt_save_add_tensor() in order would, in
 * one call (a binding from another language pays its per-call cost once).
 * The array's elements are each tensors[0].size bytes long: initialise
 * every one with CKPT_TENSOR_INIT.  The first tensor that fails stops the
 * call, whose return value is then that failure's, with a message naming
 * the tensor's index; as after any failed add, the save is spoiled.
 * Returns 0 (also for n == 0), or the errors of ckpt_save_add_tensor, and
 * -EINVAL for elements of differing sizes or a size that is no multiple of
 * the struct's alignment.  (LIBCKPT_0.6)
 */
CKPT_API int ckpt_save_add_tensors(struct ckpt_save *save, const struct ckpt_tensor *tensors,
				   size_t n);

/* Adds an opaque byte blob (data-loader state, RNG state, a config) under
 * `key`.  `data` must stay valid until staged.  Errors as for add_tensor. */
CKPT_API int ckpt_save_add_blob(struct ckpt_save *save, const char *key, const void *data,
				size_t len);

/*
 * The CUDA stream (a cudaStream_t) the save's device tensors were produced
 * on, for those whose ckpt_tensor.cuda_stream is NULL.  Default: NULL, the
 * legacy default stream.  At ckpt_save_commit() the library records an
 * event on each such stream (on the calling thread, leaving its current
 * device as it was) and copies each tensor only after the work queued on
 * its stream before that point, without waiting for the device.  Returns
 * 0, -EINVAL (NULL save), -EBUSY (already committed).  (LIBCKPT_0.3)
 */
CKPT_API int ckpt_save_set_cuda_stream(struct ckpt_save *save, void *stream);

/*
 * Hands the save to the library and returns at once: layout, copies and the
 * hand-off to the daemon happen on library threads.  *ret_staged and
 * *ret_committed are borrowed: they live as long as the save.
 *
 * Returns 0, or:
 *   the errno of the first failed set_ or add_ call on this save (the save
 *   is incomplete, see above; ckpt_last_error() names the call): the save
 *   is not committed;
 *   -EBUSY      committed twice;
 *   -ENOTCONN   the connection to the daemon is lost.
 * Every later failure (refused by the daemon, another rank failed, deadline)
 * is reported through the futures.
 */
CKPT_API int ckpt_save_commit(struct ckpt_save *save, struct ckpt_future **ret_staged,
			      struct ckpt_future **ret_committed);

/*
 * The save's third future, borrowed like the other two: it completes when
 * this rank's bytes are durable at the first tier, before the checkpoint is
 * committed.  What that is depends on the root:
 *   a local root: the rank's shard is on disk (fsynced) and its index
 *   written; the commit follows once every rank is;
 *   an S3 root with the daemon's spill tier (s3_spill_dir): the shard is on
 *   the node's disk, and the upload to S3 goes on from there;
 *   an S3 root without it: the shard is in S3.
 * It completes with 0 then, never before the staged future.  If the save
 * fails before, it fails with the committed future's error and reason; once
 * it completed it stays 0 even if the save fails later: durable says only
 * that the rank's bytes reached that tier (a failed save removes them);
 * the committed future alone says the checkpoint is whole and visible.
 * Returns NULL (see ckpt_last_error()) if save is NULL or not committed yet.
 */
CKPT_API struct ckpt_future *ckpt_save_durable(struct ckpt_save *save);

/* Releases the caller's reference.  A committed save goes on to completion in
 * the background; its futures must not be used afterwards.  Accepts NULL. */
CKPT_API void ckpt_save_free(struct ckpt_save *save);

/* ---- futures ------------------------------------------------------------- */

/* Returns 0 if done, -EINPROGRESS if pending, or the negative errno it
 * failed with. */
CKPT_API int ckpt_future_poll(const struct ckpt_future *future);

/* Waits up to timeout_ms (< 0: forever).  Returns as ckpt_future_poll(), with
 * -ETIMEDOUT instead of -EINPROGRESS. */
CKPT_API int ckpt_future_wait(struct ckpt_future *future, int64_t timeout_ms);

/* Human-readable reason of a failure ("" while pending or done).  Valid as
 * long as the future. */
CKPT_API const char *ckpt_future_error(const struct ckpt_future *future);

/* ---- reading a checkpoint ------------------------------------------------ */

/*
 * Opens the committed checkpoint `path` (<root>/<name>: a directory, or
 * s3://bucket/prefix/name).  Reads manifest.json and checks all of it once:
 * every chunk inside its file and its tensor, and the chunks of each tensor
 * tiling it (no overlap, no hole).  Returns 0, -ENOENT (no such checkpoint,
 * or not committed), -EBADMSG (corrupt manifest), -EPROTONOSUPPORT (a
 * manifest of a newer format than this library reads), -ENOMEM.
 */
CKPT_API int ckpt_reader_open(const char *path, struct ckpt_reader **ret_reader);
/*
 * Opens the newest committed checkpoint directly under `root` (a directory
 * or s3://bucket/prefix): the one with the greatest step, then the latest
 * commit time, then the greatest name.  Only checkpoints with a manifest
 * are considered (a save in progress or one that failed has none); one
 * whose manifest is corrupt or of a newer format is skipped, with a warning
 * to the log callback.  Any other failure to read a manifest (I/O, S3
 * unreachable) fails the call rather than risk taking an older checkpoint
 * for the newest.  Returns as ckpt_reader_open(), and -ENOENT if the root
 * holds no committed checkpoint.  (LIBCKPT_0.5)
 */
CKPT_API int ckpt_reader_open_latest(const char *root, struct ckpt_reader **ret_reader);

/* Closes the reader and frees it; names it returned become invalid.  Accepts
 * NULL. */
CKPT_API void ckpt_reader_close(struct ckpt_reader *reader);

/* Step and world size recorded at save time. */
CKPT_API uint64_t ckpt_reader_step(const struct ckpt_reader *reader);
CKPT_API uint32_t ckpt_reader_world(const struct ckpt_reader *reader);

/* Number of tensors, and the name of the i-th in byte order of the names
 * (borrowed, lives as long as the reader).  Returns NULL if i is out of
 * range. */
CKPT_API size_t ckpt_reader_tensor_count(const struct ckpt_reader *reader);
CKPT_API const char *ckpt_reader_tensor_name(const struct ckpt_reader *reader, size_t i);

/*
 * Dtype, number of dimensions and global shape of tensor `name`.  ret_shape
 * has room for shape_cap entries; it may be NULL with shape_cap 0 to learn
 * the dtype and ndim only.  Any of the ret_* may be NULL.
 *
 * Returns 0, -ENOENT (no such tensor), or -ERANGE: ret_shape is not NULL and
 * the tensor has more than shape_cap dimensions (nothing is written; ask
 * again with shape_cap >= ndim, or CKPT_MAX_NDIM, which always suffices).
 */
CKPT_API int ckpt_reader_tensor_info(const struct ckpt_reader *reader, const char *name,
				     size_t shape_cap, enum ckpt_dtype *ret_dtype,
				     unsigned *ret_ndim, uint64_t *ret_shape);

/*
 * Reads the whole global tensor `name` into buf (len must equal its size in
 * bytes), assembling it from every chunk and verifying each block's CRC32C.
 * Returns 0, -ENOENT, -EINVAL (len mismatch), -EBADMSG (CRC mismatch or a
 * truncated file), or an I/O errno.
 */
CKPT_API int ckpt_reader_read_tensor(struct ckpt_reader *reader, const char *name, void *buf,
				     size_t len);

/* Number of blobs, and the key of the i-th in byte order of the keys
 * (borrowed, lives as long as the reader).  Returns NULL if i is out of
 * range. */
CKPT_API size_t ckpt_reader_blob_count(const struct ckpt_reader *reader);
CKPT_API const char *ckpt_reader_blob_name(const struct ckpt_reader *reader, size_t i);

/* Size of blob `key`, or -ENOENT. */
CKPT_API int64_t ckpt_reader_blob_size(const struct ckpt_reader *reader, const char *key);

/* Reads blob `key` (len must equal its size), CRC-verified.  Errors as for
 * ckpt_reader_read_tensor(). */
CKPT_API int ckpt_reader_read_blob(struct ckpt_reader *reader, const char *key, void *buf,
				   size_t len);

/*
 * What the manifest says of the checkpoint (LIBCKPT_0.6).  Strings are
 * borrowed: they live as long as the reader.
 *   ckpt_reader_path      the path or URL the reader was opened with (for
 *                         ckpt_reader_open_latest: <root>/<name> of the one
 *                         it picked); NULL for a NULL reader
 *   ckpt_reader_time      when it was committed, UTC, ISO 8601
 *   ckpt_reader_metadata  the user metadata value of `key` (rank 0's, see
 *                         ckpt_save_set_metadata), or NULL if it has none
 *   ckpt_reader_metric    0 and *ret_value (may be NULL), -ENOENT if the
 *                         checkpoint has no such metric, -EINVAL (NULL)
 */
CKPT_API const char *ckpt_reader_path(const struct ckpt_reader *reader);
CKPT_API const char *ckpt_reader_time(const struct ckpt_reader *reader);
CKPT_API const char *ckpt_reader_metadata(const struct ckpt_reader *reader, const char *key);
CKPT_API int ckpt_reader_metric(const struct ckpt_reader *reader, const char *key,
				double *ret_value);

/*
 * Calls fn(ud, name) on the calling thread for each entry directly under
 * `root` (a directory or s3://bucket/prefix) that holds a manifest, in no
 * particular order: the candidates for ckpt_reader_open(<root>/<name>),
 * which is what tells whether one is whole (a manifest that does not parse
 * fails there).  Work areas of saves in progress, trash and other files
 * are not passed.  fn returns 0 to go on; a non-zero return stops the
 * listing and is returned as it is.  Returns 0, or -EINVAL (NULL root or
 * fn), -ENOENT (an S3 bucket that does not exist), or the listing's errno,
 * with the reason in ckpt_last_error().  (LIBCKPT_0.6)
 */
CKPT_API int ckpt_list(const char *root, int (*fn)(void *ud, const char *name), void *ud);

/* ---- loading into any layout (libckpt 0.5) ------------------------------- */

/*
 * A load fills destination boxes of the caller's memory from a checkpoint
 * opened with a reader, in whatever layout the caller now has: the
 * checkpoint may have been saved by N ranks with one sharding and be loaded
 * by M ranks with another.  Per tensor the caller names the dtype and
 * global shape it expects and one or more boxes of the global tensor it
 * holds (global offsets and sizes) with where they go (a pointer and
 * element strides).  Only the byte ranges those boxes need are read,
 * widened to the checkpoint's CRC blocks (every block read is verified
 * before any of its bytes are used) and merged into large reads, several
 * in flight; the bytes are then copied into place.
 *
 *     struct ckpt_load *ld;
 *     struct ckpt_future *done;
 *     uint64_t gshape[2] = { 4096, 1024 }, offs[2] = { 0, 512 }, box[2] = { 4096, 512 };
 *     struct ckpt_load_dst dst = { CKPT_LOAD_DST_INIT, .offsets = offs,
 *                                  .shape = box, .data = my_half };
 *     struct ckpt_load_tensor t = { CKPT_LOAD_TENSOR_INIT, .name = "w",
 *                                   .dtype = CKPT_F32, .ndim = 2,
 *                                   .global_shape = gshape, .dsts = &dst,
 *                                   .n_dsts = 1 };
 *     ckpt_load_begin(reader, 0, &ld);
 *     ckpt_load_add_tensor(ld, &t);
 *     ckpt_load_start(ld, &done);
 *     ckpt_future_wait(done, -1);
 *     ckpt_load_free(ld);
 *
 * Like a save, a load is whole or refused: the first add_* call that fails
 * makes ckpt_load_start() refuse the load with that call's errno and
 * message.  Strict by default: a tensor or blob the checkpoint lacks, a
 * dtype, rank or global-shape mismatch, or a box outside the global shape
 * fails with a message naming the tensor.  CKPT_LOAD_PARTIAL lets tensors
 * and blobs the checkpoint lacks be skipped instead (counted in
 * ckpt_load_stats.missing); every mismatch still fails.
 *
 * Lifetimes: the reader must stay open until the load is freed; strings
 * and arrays of the add_* arguments are copied; destination memory must
 * stay valid until the done future completes.  If a load fails after it
 * started (an I/O error, a CRC mismatch), destination memory may have been
 * partly written: the future's error says so, and names the file, the
 * tensor and the offset of a bad block.
 *
 * A load with device boxes makes its own CUDA context, with its read
 * buffers pinned until ckpt_load_free().  Its copies run after the work
 * already queued on the legacy default stream; work on other streams must
 * not use the destinations before the done future completes.
 */
struct ckpt_load;

#define CKPT_LOAD_PARTIAL 0x1u /* skip tensors and blobs the checkpoint lacks */

/* One destination box of a tensor. */
struct ckpt_load_dst {
	uint32_t size;            /* set by CKPT_LOAD_DST_INIT */
	enum ckpt_device device;  /* CKPT_DEVICE_HOST, or CKPT_DEVICE_CUDA:
	                           * memory of CUDA device device_index (a
	                           * CUDA build).  Bytes reach a device only
	                           * after their CRC blocks were verified in
	                           * host memory; each contiguous run of a
	                           * strided device box is one copy, so prefer
	                           * contiguous device boxes */
	int32_t device_index;
	uint32_t reserved;        /* must be 0 */
	const uint64_t *offsets;  /* ndim: where the box starts in the global
	                           * tensor; NULL: at the origin */
	const uint64_t *shape;    /* ndim: the box's extent; NULL: the whole
	                           * global shape (offsets must be NULL too) */
	const int64_t *strides;   /* ndim element strides of data, >= 0; NULL:
	                           * row-major and contiguous in `shape` */
	void *data;               /* element [0,..,0] of the box */
};

#define CKPT_LOAD_DST_INIT .size = sizeof(struct ckpt_load_dst)

struct ckpt_load_tensor {
	uint32_t size;                /* set by CKPT_LOAD_TENSOR_INIT */
	enum ckpt_dtype dtype;        /* expected dtype */
	const char *name;
	const uint64_t *global_shape; /* ndim: expected global shape */
	uint32_t ndim;
	uint32_t n_dsts;              /* 1 .. CKPT_LOAD_MAX_DSTS boxes */
	const struct ckpt_load_dst *dsts;
};

#define CKPT_LOAD_TENSOR_INIT .size = sizeof(struct ckpt_load_tensor)
#define CKPT_LOAD_MAX_DSTS 65536

/* What a load read and skipped.  Filled by ckpt_load_stats(). */
struct ckpt_load_stats {
	uint32_t size;           /* set by CKPT_LOAD_STATS_INIT */
	uint32_t missing;        /* tensors and blobs skipped (CKPT_LOAD_PARTIAL) */
	uint64_t bytes_wanted;   /* bytes of the destinations */
	uint64_t bytes_read;     /* bytes read from storage (>= wanted, unless
	                          * boxes overlap: CRC blocks are read whole,
	                          * small gaps with them, shared bytes once) */
	uint64_t reads;          /* read requests */
	/* libckpt 0.5, ckpt_load_set_client(): */
	uint64_t bytes_resident; /* of bytes_read, copied from images resident
	                          * in ckptd's memory instead of storage */
	uint32_t files_resident; /* files served from such images */
	uint32_t reserved;
	uint64_t bytes_daemon;   /* of bytes_read, read by ckptd for this load
	                          * (O_DIRECT, io_uring), into the client's
	                          * arena or its uid's shared pool */
	/* later libckpt 0.5 builds (ckpt_load_stats fills what the size holds): */
	uint64_t bytes_shared;   /* of bytes_daemon, read from storage for
	                          * another load of the same job on this node
	                          * and shared through ckptd's pool: this load
	                          * cost the storage nothing for them */
	uint64_t bytes_local;    /* of bytes_read, of an S3 checkpoint: read
	                          * from this node's copy in ckptd's spill
	                          * tier, not from S3 */
	uint32_t files_local;    /* files read from such copies */
	uint32_t reserved2;
};

#define CKPT_LOAD_STATS_INIT .size = sizeof(struct ckpt_load_stats)

/*
 * Starts describing a load from `reader`.  flags: 0 or CKPT_LOAD_PARTIAL.
 * Returns 0 and *ret_load (free with ckpt_load_free()), or -EINVAL (NULL
 * argument, unknown flags), -ENOMEM.
 */
CKPT_API int ckpt_load_begin(struct ckpt_reader *reader, uint32_t flags,
			     struct ckpt_load **ret_load);

/*
 * Adds a tensor and its destination boxes.  Returns 0, or -EINVAL (bad
 * arguments, a dtype/ndim/global-shape mismatch, a box outside the global
 * shape, bad strides, a device box whose first or last byte is not memory
 * of that device, an unknown device), -ENOENT (the checkpoint has no such
 * tensor; 0 with CKPT_LOAD_PARTIAL, the tensor skipped), -EEXIST (tensor
 * already added), -ENODEV (no CUDA runtime or driver, or no device
 * device_index), -EOPNOTSUPP (a device box in a build without CUDA),
 * -E2BIG, -EBUSY (started), -ENOMEM.
 */
CKPT_API int ckpt_load_add_tensor(struct ckpt_load *load, const struct ckpt_load_tensor *tensor);

/* Adds blob `key`, read into buf (len must equal its size).  Errors as for
 * ckpt_load_add_tensor(). */
CKPT_API int ckpt_load_add_blob(struct ckpt_load *load, const char *key, void *buf, size_t len);

/*
 * Serves the load through ckptd (LIBCKPT_0.5):
 *   - every file of the checkpoint whose image the daemon holds in memory
 *     for this client's user and job (saved by a client connected with
 *     CKPT_CONNECT_RESIDENT, the same checkpoint path, attempt and size as
 *     the manifest says) is read from that image, read-only, instead of
 *     from storage, so a shard deleted or unreachable since is no
 *     obstacle;
 *   - the other local files are opened by the library (with the caller's
 *     rights) and lent to the daemon, which reads them with io_uring and
 *     O_DIRECT into the client's staging arena, where the library checks
 *     and scatters them (a read larger than half the arena is done by the
 *     library itself; S3 files are read with ranged GETs as without it).
 * Every block is still checked against the manifest's CRCs.  A block of an
 * image that does not match sends the rest of that file to storage (a
 * warning is logged); storage that does not match fails the load.  The
 * client must stay connected and must not be freed until the load is:
 * reads go over its connection and into its arena, which saves on the same
 * client share (a load waits for free slots).  Returns 0, -EINVAL (NULL
 * argument), -EBUSY (started).
 */
CKPT_API int ckpt_load_set_client(struct ckpt_load *load, struct ckpt_client *client);

/*
 * Read once across replicas.  Every rank of an NCCL communicator loads the
 * SAME checkpoint (each into its own destinations) with the group set, and
 * every rank calls ckpt_load_start(): the start is then collective.  The
 * ranks exchange which bytes their loads need; each byte range wanted by
 * several ranks is read from storage by one of them (a pure function of
 * what all ask: every rank computes the same readers, balanced) and sent
 * to the others with NCCL through a device buffer on the caller's stream.
 * Every rank checks every CRC block it uses, received or read.
 * ckpt_load_stats() then counts in bytes_read only what this rank read
 * from storage.
 *
 * nccl_comm: the caller's ncclComm_t (NCCL is loaded at run time:
 * $CKPT_NCCL_LIB, else libnccl.so.2; NCCL 2.19 or later).  cuda_stream:
 * the cudaStream_t the transfers go on (NULL: the legacy default stream).
 * device_index: the CUDA device of the communicator.  The communicator
 * and the stream must stay valid, and must not be used by anything else
 * that talks to the same peers, until the done future completed: the load
 * issues collective calls on them from a library thread.  A rank whose
 * load fails locally (a bad block) still takes part to the end, so the
 * others do not hang; a failed NCCL call fails the load and may leave the
 * other ranks waiting, as any NCCL failure does.  Returns 0, -EINVAL (NULL
 * argument, bad size, reserved fields not 0, no communicator), -E2BIG (a
 * larger struct with fields this library does not know set), -ENODEV
 * (NCCL or the CUDA runtime cannot be loaded), -EIO (the communicator
 * cannot say its size and rank), -EBUSY (started), -EOPNOTSUPP (a build
 * without CUDA).  (LIBCKPT_0.5)
 */
struct ckpt_load_group {
	uint32_t size;          /* set by CKPT_LOAD_GROUP_INIT */
	uint32_t reserved;
	void *nccl_comm;        /* ncclComm_t */
	void *cuda_stream;      /* cudaStream_t, or NULL */
	int32_t device_index;   /* CUDA device of the communicator */
	uint32_t reserved2;
};

#define CKPT_LOAD_GROUP_INIT .size = sizeof(struct ckpt_load_group)

CKPT_API int ckpt_load_set_group(struct ckpt_load *load, const struct ckpt_load_group *group);

/*
 * Plans the load and starts it on library threads; returns at once with
 * *ret_done (borrowed: lives as long as the load), which completes when
 * every destination is filled and verified, or fails with the reason.
 * Returns 0, or the errno of the first failed add_* call (the load is
 * refused, see above), -EBUSY (started twice), -ENOMEM.
 */
CKPT_API int ckpt_load_start(struct ckpt_load *load, struct ckpt_future **ret_done);

/* The load's figures; complete once the done future has.  Returns 0 or
 * -EINVAL (NULL, or a size the library does not know, see the ABI rules). */
CKPT_API int ckpt_load_stats(const struct ckpt_load *load, struct ckpt_load_stats *ret_stats);

/* Waits for a started load to finish, then frees it.  Accepts NULL. */
CKPT_API void ckpt_load_free(struct ckpt_load *load);

/* ---- data-loader state that reshards (libckpt 0.5) ------------------------ */

/*
 * A data loader's position travels as one int64 tensor, the "table", of
 * global shape [n_shards, k]: one row per logical data shard (a file, a
 * piece of a data set) and k columns (CKPT_DL_MIN_COLS .. CKPT_DL_MAX_COLS):
 *
 *   CKPT_DL_COL_ID      shard id, >= 0, unique
 *   CKPT_DL_COL_CURSOR  samples of the shard the training loop has CONSUMED
 *                       in the current epoch (not what workers prefetched)
 *   CKPT_DL_COL_DONE    1 once the shard is finished for this epoch, else 0
 *   3 .. k-1            the caller's own columns (epoch, length, seed...),
 *                       carried along with the row
 *
 * Each data-parallel (DP) rank holds a contiguous block of rows and saves
 * it with ckpt_save_add_dl_table() at the row0 it was given (by
 * ckpt_dl_first() on the first run, by ckpt_dl_restore() after a restore).
 * Every DP rank saves its block, even an empty one; of the TP/PP ranks of
 * one DP group (which hold the same rows) one writes (replica 0).
 *
 * Restoring with the same DP world gives every rank back exactly its rows;
 * with another DP world the rows are dealt out again, unfinished and
 * finished shards each spread evenly (counts differ by at most 1; no
 * divisibility needed), the same way on every rank and every TP/PP peer, so
 * that every shard has exactly one owner.  The guarantee: within an epoch
 * no shard is visited twice and none is skipped.  Seen again are only the
 * samples prefetched but not consumed at the save (at most prefetch depth x
 * batch size x loader workers per DP rank), and those consumed after the
 * last committed save (the usual rollback).  Per-rank state that is not in
 * the table (worker snapshots, RNG) is saved as blobs per DP rank and is
 * only valid when ckpt_dl_restore() reports the same topology.
 */
#define CKPT_DL_COL_ID     0
#define CKPT_DL_COL_CURSOR 1
#define CKPT_DL_COL_DONE   2
#define CKPT_DL_MIN_COLS   3
#define CKPT_DL_MAX_COLS   64

/*
 * First run: the shards 0 .. n_shards-1 dealt to dp_world ranks.  Returns 0
 * with *ret_ids (the shard ids of rank dp_rank, malloc'd: free() it),
 * *ret_n and *ret_row0 (where its block starts in the table), or -EINVAL,
 * -E2BIG (more than 2^28 shards), -ENOMEM.
 */
CKPT_API int ckpt_dl_first(uint64_t n_shards, uint32_t dp_world, uint32_t dp_rank,
			   int64_t **ret_ids, uint64_t *ret_n, uint64_t *ret_row0);

/*
 * Adds this DP rank's block of the table `name`: n rows of k columns
 * (row-major, rows[n * k]) at rows [row0, row0 + n) of a table of n_shards
 * rows.  replica: 0 for the one rank of the DP group that writes, its
 * index among the group's TP/PP ranks otherwise.  As ckpt_save_add_tensor.
 */
CKPT_API int ckpt_save_add_dl_table(struct ckpt_save *save, const char *name,
				    const int64_t *rows, uint64_t n, uint32_t k, uint64_t row0,
				    uint64_t n_shards, uint32_t replica);

/*
 * Reads table `name` from the checkpoint and gives DP rank dp_rank of
 * dp_world its rows: *ret_rows (n x k int64, row-major, malloc'd: free()
 * it), *ret_n, *ret_k, *ret_row0, and *ret_same_topology (true when the
 * checkpoint was saved by dp_world DP ranks: per-rank blobs then still
 * match).  Every byte read is CRC-checked.  Returns 0, -ENOENT (no such
 * tensor), -EBADMSG (not an int64 [n, k] table, blocks that do not tile
 * it, a duplicate shard id, a bad cursor or done value: the message says
 * which row), -EINVAL, -ENOMEM, or a read error.
 */
CKPT_API int ckpt_dl_restore(struct ckpt_reader *reader, const char *name, uint32_t dp_world,
			     uint32_t dp_rank, int64_t **ret_rows, uint64_t *ret_n,
			     uint32_t *ret_k, uint64_t *ret_row0, bool *ret_same_topology);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */
