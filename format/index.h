/* SPDX-License-Identifier: MIT */
/*
 * index.h - the per-rank index and the checkpoint manifest.
 *
 * Each writing rank's daemon leaves <workdir>/rank-NNNNN.index.json once that
 * rank's shard is durable.  The coordinator (rank 0's daemon) merges the
 * `world` indexes into manifest.json.  ckptctl and the reader parse the
 * manifest.
 *
 * Index (format "ckpt-index-1"):
 *   {"format":"ckpt-index-1", "job":J, "name":N, "step":S, "rank":r,
 *    "world":W, "attempt":ID, "writer":{"id":D,"instance":I}, "to":NONCE,
 *    "file":"rank-00003.safetensors", "file_size":F,
 *    "crc_block":1048576, "meta":{...}, "metrics":{...},
 *    "items":[{"name","kind":"tensor"|"blob","dtype","shape","global_shape",
 *              "offsets","begin","end","crc32c":[u32,...]}]}
 *
 * Manifest (format "ckpt-1"):
 *   {"format":"ckpt-1", "name":N, "step":S, "time":"2026-11-23T03:09:36Z",
 *    "job":J, "attempt":ID, "world_size":W, "crc_block":1048576,
 *    "metadata":{...rank 0's...}, "metrics":{...rank 0's...},
 *    "files":[{"rank":r, "path":"rank-00000.safetensors", "size":F}, ...],
 *    "total_bytes": sum of file sizes,
 *    "tensors":{NAME:{"dtype":"F32","shape":[global],
 *        "chunks":[{"file":i (index into files), "offsets":[...],
 *                   "shape":[...], "begin":b, "end":e, "crc32c":[...]}]}},
 *    "blobs":{KEY:{"size":n, "file":i, "begin":b, "end":e, "crc32c":[...]}}}
 *
 *  Files with no items are still listed.  CRC pieces: see layout.h.
 */
#ifndef CKPT_FORMAT_INDEX_H
#define CKPT_FORMAT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "format/layout.h"

#define INDEX_FORMAT    "ckpt-index-1"
#define MANIFEST_FORMAT "ckpt-1"
#define MANIFEST_FILE   "manifest.json"
/* An object in place of a manifest.json with this key (and no "format")
 * is the tombstone of a checkpoint being removed (store/remove.h). */
#define MANIFEST_TOMBSTONE_KEY "ckpt_tombstone"
#define INDEX_MAX_BYTES (1ull << 30)  /* cap on one rank index we read */

/* "rank-00003.safetensors" / "rank-00003.index.json" into buf (>= 32 bytes). */
void index_shard_name(uint32_t rank, char *buf, size_t len);
/* With a tag (a backend's per-attempt name part, see index_origin):
 * "rank-00003.<tag>.safetensors"; NULL or "": index_shard_name(). */
#define INDEX_SHARD_NAME_MAX 96
#define INDEX_SHARD_TAG_MAX 32
void index_shard_name_tag(uint32_t rank, const char *tag, char *buf, size_t len);
void index_index_name(uint32_t rank, char *buf, size_t len);

/* Who wrote an index and for which save attempt (store.h): written into
 * indexes and checked by the merge, so that an index of another attempt, or
 * one an earlier life of this daemon left behind, is never merged. */
struct index_origin {
	const char *attempt;   /* the attempt id */
	const char *writer_id; /* the writing daemon's stable id */
	const char *instance;  /* and its life */
	const char *to;        /* the coordinator claim it is addressed to
	                        * (store.h); "" when there was none yet */
	const char *shard_tag; /* NULL, or [0-9a-f]{1,32} in the shard file
	                        * names (index_shard_name_tag): a backend that
	                        * writes shards in place (S3) names them per
	                        * attempt, so that no two attempts share one */
	bool has_uid;          /* the manifest records "uid": the committing */
	uint32_t uid;          /* user's, where the store keeps no owner (S3) */
};

/*
 * Serialises one rank's index: the placed layout, its CRCs (l->n_crcs
 * entries, item i's at crcs[item.crc0..]) and who wrote it.
 * Returns 0 and a malloc'd NUL-terminated *ret_text, or -ENOMEM.
 */
int index_build(const struct layout *l, const uint32_t *crcs, const char *job, uint32_t rank,
		uint32_t world, char **ret_text);
/* The same, recording the origin ("attempt", "writer":{"id","instance"}). */
int index_build_origin(const struct layout *l, const uint32_t *crcs, const char *job,
		       uint32_t rank, uint32_t world, const struct index_origin *o,
		       char **ret_text);

/* A rank whose index the caller has in memory (the daemon's own ranks):
 * its layout and CRCs, as index_build() would write them. */
struct index_local {
	uint32_t rank;
	const struct layout *layout;
	const uint32_t *crcs;
};

/*
 * Reads the `world` indexes rank-00000..(world-1).index.json in directory
 * fd `dirfd` -- except the n_local ranks given in `local`, taken from memory
 * (they must have been validated, e.g. by desc_parse) -- and merges them
 * into the manifest text.  Checks: every index
 * parses and names this job, save name, rank and world; every tensor has the
 * same dtype and global shape in every chunk; chunks of a tensor do not
 * overlap and their volumes add up to the global volume (they cover it);
 * blob keys and tensor names do not collide across ranks.  `time_utc` is the
 * commit time written to "time".
 *
 * Returns 0 and a malloc'd NUL-terminated *ret_text, or -ENOENT (an index is
 * missing: err names the rank), -EBADMSG (inconsistent or corrupt: err says
 * which tensor/rank), -ENOMEM.
 */
int index_merge(int dirfd, const char *job, const char *name, uint32_t world, int64_t time_utc,
		const struct index_local *local, size_t n_local, char **ret_text, char *err,
		size_t errlen);
/* The same for one attempt: every index read from dirfd must name
 * origin->attempt, be addressed to origin->to, and must not come from
 * origin->writer_id with another instance; the manifest records "attempt". */
int index_merge_origin(int dirfd, const char *job, const char *name, uint32_t world,
		       int64_t time_utc, const struct index_origin *origin,
		       const struct index_local *local, size_t n_local, char **ret_text,
		       char *err, size_t errlen);

/* The same, with each rank's index text from fetch(ud, rank, ...) instead of
 * dirfd (a malloc'd buffer of at most INDEX_MAX_BYTES, or -ENOENT if the
 * rank has none; on another failure fetch may say why in err, which the
 * merge's message then quotes).  fetch may be called from several threads
 * at once. */
typedef int (*index_fetch_fn)(void *ud, uint32_t rank, char **ret_text, size_t *ret_len,
			      char *err, size_t errlen);
int index_merge_fetch(int dirfd, index_fetch_fn fetch, void *fetch_ud, const char *job,
		      const char *name, uint32_t world, int64_t time_utc,
		      const struct index_origin *origin, const struct index_local *local,
		      size_t n_local, char **ret_text, char *err, size_t errlen);

/* ---- the parsed manifest, for readers and ckptctl ---- */

struct manifest_chunk {
	uint32_t file;        /* index into files */
	uint64_t *offsets;    /* ndim entries (points into the manifest's pool) */
	uint64_t *shape;      /* ndim entries */
	uint64_t begin, end;  /* absolute byte range in the file */
	uint32_t *crcs;       /* layout_crc_count(begin, end) entries */
};

struct manifest_tensor {
	char *name;
	uint8_t kind;         /* ITEM_TENSOR or ITEM_BLOB */
	uint8_t dtype;        /* enum ckpt_dtype */
	uint8_t ndim;
	uint64_t shape[CKPT_MAX_NDIM]; /* global shape (blobs: {size}) */
	size_t n_chunks;
	struct manifest_chunk *chunks;
};

struct manifest_file {
	uint32_t rank;
	char *path;           /* relative to the checkpoint directory; validated:
	                       * a plain file name, no '/' */
	uint64_t size;
};

struct manifest {
	char name[CKPT_MAX_NAME_LEN + 1];
	char job[CKPT_MAX_JOB_LEN + 1];
	char attempt[33];     /* the attempt id that committed it, or "" */
	bool has_uid;         /* "uid": the committing user (S3 manifests) */
	uint32_t uid;
	uint64_t step;
	uint32_t world;
	char time[40];
	uint64_t total_bytes;
	void *json;           /* the parsed json_t (metadata, metrics) ; owned */
	size_t n_files;
	struct manifest_file *files;
	size_t n_items;       /* tensors first, then blobs, each sorted by name */
	size_t n_tensors;
	struct manifest_tensor *items;
	void *pool;           /* private */
};

/*
 * Parses and validates manifest text (as index_merge makes it): every
 * chunk's range lies inside its file's size, its byte count matches its
 * shape and dtype, its CRC count matches, and the chunks of each tensor
 * tile it (no overlap, no hole: format/boxcheck.h).  Returns 0, -EBADMSG
 * (reason in err), -EPROTONOSUPPORT (format "ckpt-N" newer than this
 * reader's), -ENOMEM.  *m must be zeroed; on failure it is left freed.
 */
int manifest_parse(const char *text, size_t len, struct manifest *m, char *err, size_t errlen);
void manifest_free(struct manifest *m);

/* Finds an item by name and kind; NULL if absent. */
const struct manifest_tensor *manifest_find(const struct manifest *m, enum item_kind kind,
					    const char *name);

#endif
