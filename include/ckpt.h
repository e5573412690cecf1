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
 *   - the library never prints.
 *
 * Thread safety: a client may be used from several threads, but one save must
 * be built (add_*, commit) by one thread at a time.
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

/* Element types; the names are those of the safetensors format. */
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

/* Where a tensor's bytes live; selects the copy engine for that tensor. */
enum ckpt_device {
	CKPT_DEVICE_HOST = 0, /* ordinary (pageable or pinned) host memory */
	CKPT_DEVICE_CUDA = 1, /* CUDA device memory: needs a CUDA build */
};

/* Returns the message of the last failed synchronous call on this thread
 * ("" if none).  The string is valid until the next libckpt call on the same
 * thread. */
CKPT_API const char *ckpt_last_error(void);

/* ---- connection ---------------------------------------------------------- */

struct ckpt_connect_opts {
	const char *socket_path; /* NULL: $CKPTD_SOCKET, else CKPT_DEFAULT_SOCKET */
	const char *job;         /* job id shared by all ranks; required */
	uint32_t rank;           /* 0 <= rank < world */
	uint32_t world;          /* number of ranks in the job, >= 1 */
	uint64_t arena_bytes;    /* staging arena wanted; 0: 1 GiB.  The daemon
	                          * may grant less (its cap); a save larger than
	                          * the arena still works, staging then waits for
	                          * the daemon to drain (backpressure). */
	unsigned copy_threads;   /* host copy threads; 0: 2 */
};

/*
 * Connects to ckptd as rank opts->rank of job opts->job, receives the staging
 * arena, maps it and touches every page once (so the first save pays no page
 * faults).  This can take a while for a large arena; do it once at start-up.
 *
 * Returns 0 and *ret_client, or:
 *   -EINVAL        bad options (see ckpt_last_error())
 *   -ENOENT,
 *   -ECONNREFUSED  no daemon listens on the socket
 *   -EACCES        the socket or the job is not ours
 *   -EPROTO        the daemon speaks another protocol version
 *   -ENOMEM        the arena could not be mapped
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

/*
 * Starts describing a save of checkpoint `name` (e.g. "step-000100") under
 * the directory `root` (absolute; must lie inside one of the daemon's allowed
 * roots).  Every rank of the job saves the same name.  Nothing is sent until
 * ckpt_save_commit().
 *
 * Returns 0 and *ret_save (free with ckpt_save_free()), or -EINVAL for a bad
 * name or root, -ENOMEM.
 */
CKPT_API int ckpt_save_begin(struct ckpt_client *client, const char *root, const char *name,
			     uint64_t step, struct ckpt_save **ret_save);

/* Adds a user metadata string (recorded in manifest.json).  Rank 0's metadata
 * is the checkpoint's.  Returns 0, -EINVAL (bad key/value), -E2BIG, -EEXIST. */
CKPT_API int ckpt_save_set_metadata(struct ckpt_save *save, const char *key, const char *value);

/* Adds a metric (e.g. "loss"), used later for keep-best pruning.  Finite
 * values only.  Returns 0, -EINVAL, -E2BIG, -EEXIST. */
CKPT_API int ckpt_save_set_metric(struct ckpt_save *save, const char *key, double value);

/* One tensor, or one chunk of a sharded tensor. */
struct ckpt_tensor {
	const char *name;          /* unique in the checkpoint across all ranks'
	                            * tensors and blobs, except chunks of one
	                            * sharded tensor, which share it */
	enum ckpt_dtype dtype;
	unsigned ndim;             /* 0 (a scalar) .. CKPT_MAX_NDIM */
	const uint64_t *shape;     /* this chunk's shape, ndim entries */
	const void *data;          /* contiguous, row-major; must stay valid and
	                            * unchanged until the staged future completes */
	enum ckpt_device device;
	int device_index;          /* CUDA device ordinal, for CKPT_DEVICE_CUDA */
	const uint64_t *global_shape; /* NULL: the tensor is not sharded */
	const uint64_t *offsets;      /* where this chunk starts in the global
	                               * tensor; NULL iff global_shape is NULL */
	uint32_t replica;          /* data-parallel copies of the same chunk: only
	                            * replica 0 is written, others are skipped */
};

/*
 * Adds a tensor.  The bytes are not read until the save is committed, and
 * only on library threads.  The strings and arrays of *tensor are copied.
 *
 * Returns 0, or -EINVAL (bad name, dtype, shape, offsets outside the global
 * shape), -EEXIST (name already in this save), -EOPNOTSUPP (device memory in
 * a build without the CUDA engine), -E2BIG (too many items), -EBUSY (already
 * committed), -ENOMEM.
 */
CKPT_API int ckpt_save_add_tensor(struct ckpt_save *save, const struct ckpt_tensor *tensor);

/* Adds an opaque byte blob (data-loader state, RNG state, a config) under
 * `key`.  `data` must stay valid until staged.  Errors as for add_tensor. */
CKPT_API int ckpt_save_add_blob(struct ckpt_save *save, const char *key, const void *data,
				size_t len);

/*
 * Hands the save to the library and returns at once: layout, copies and the
 * hand-off to the daemon happen on library threads.  *ret_staged and
 * *ret_committed are borrowed: they live as long as the save.
 *
 * Returns 0, -EBUSY (committed twice), -ENOTCONN (the connection to the
 * daemon is lost).  Every later failure (refused by the daemon, another rank
 * failed, deadline) is reported through the futures.
 */
CKPT_API int ckpt_save_commit(struct ckpt_save *save, struct ckpt_future **ret_staged,
			      struct ckpt_future **ret_committed);

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
 * Opens the committed checkpoint in directory `path` (<root>/<name>).  Reads
 * and checks manifest.json.  Returns 0, -ENOENT (no such checkpoint, or not
 * committed), -EBADMSG (corrupt manifest), -ENOMEM.
 */
CKPT_API int ckpt_reader_open(const char *path, struct ckpt_reader **ret_reader);
CKPT_API void ckpt_reader_close(struct ckpt_reader *reader);

/* Step and world size recorded at save time. */
CKPT_API uint64_t ckpt_reader_step(const struct ckpt_reader *reader);
CKPT_API uint32_t ckpt_reader_world(const struct ckpt_reader *reader);

/* Number of tensors, and the name of the i-th (borrowed, lives as long as
 * the reader).  Returns NULL if i is out of range. */
CKPT_API size_t ckpt_reader_tensor_count(const struct ckpt_reader *reader);
CKPT_API const char *ckpt_reader_tensor_name(const struct ckpt_reader *reader, size_t i);

/* Dtype and global shape of a tensor.  `shape` must hold CKPT_MAX_NDIM
 * entries.  Returns 0 or -ENOENT. */
CKPT_API int ckpt_reader_tensor_info(const struct ckpt_reader *reader, const char *name,
				     enum ckpt_dtype *ret_dtype, unsigned *ret_ndim,
				     uint64_t *ret_shape);

/*
 * Reads the whole global tensor `name` into buf (len must equal its size in
 * bytes), assembling it from every chunk and verifying each block's CRC32C.
 * Returns 0, -ENOENT, -EINVAL (len mismatch), -EBADMSG (CRC mismatch or a
 * truncated file), or an I/O errno.
 */
CKPT_API int ckpt_reader_read_tensor(struct ckpt_reader *reader, const char *name, void *buf,
				     size_t len);

/* Size of blob `key`, or -ENOENT. */
CKPT_API int64_t ckpt_reader_blob_size(const struct ckpt_reader *reader, const char *key);

/* Reads blob `key` (len must equal its size), CRC-verified.  Errors as for
 * ckpt_reader_read_tensor(). */
CKPT_API int ckpt_reader_read_blob(struct ckpt_reader *reader, const char *key, void *buf,
				   size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */
