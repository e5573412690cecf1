/* SPDX-License-Identifier: MIT */
/*
 * reader.c - reading a committed checkpoint back (ckpt_reader_*).
 *
 * The manifest says, per tensor, which chunks make it up and where each
 * lies in which shard file.  Every chunk is read in pieces on the CRC grid
 * (layout.h), each piece checked against its CRC32C, and the chunk is then
 * placed into the caller's buffer with an N-d box copy.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "client/internal.h"
#include "format/crc32c.h"
#include "format/index.h"
#include "format/plan.h"
#include "store/fsutil.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_route.h"
#include "store/store_s3.h"

#define READER_MAX_MANIFEST (1ull << 30)
#define READER_LEASE_WAIT_MS 30000u /* for a removal holding the lock */
/* S3: how long a reader that found a tombstone waits for the manifest to
 * come back (a removal that saw its lease puts it back at once). */
#define READER_TOMB_WAIT_MS 3000u
#define READER_TOMB_POLL_MS 250u


/* ---- open / close ---- */

void cli_reader_touch(struct ckpt_reader *rd)
{
	if (rd && rd->lease)
		store_s3_lease_renew(rd->lease);
}

void ckpt_reader_close(struct ckpt_reader *reader)
{
	if (!reader)
		return;
	if (reader->fds)
		for (size_t i = 0; i < reader->m.n_files; i++)
			if (reader->fds[i] >= 0)
				close(reader->fds[i]);
	free(reader->fds);
	plan_index_free(reader->plan_ix);
	if (reader->lease)
		store_s3_lease_drop(reader->lease);
	free(reader->lease);
	manifest_free(&reader->m);
	if (reader->dirfd >= 0)
		close(reader->dirfd);
	free(reader->path);
	free(reader);
}

int ckpt_reader_open(const char *path, struct ckpt_reader **ret_reader)
{
	struct ckpt_reader *rd;
	char err[512];
	char *text = NULL;
	size_t text_len = 0;
	int r;

	if (!path || !ret_reader) {
		cli_set_error("ckpt_reader_open: NULL argument");
		return -EINVAL;
	}
	rd = calloc(1, sizeof(*rd));
	if (!rd) {
		cli_set_error("ckpt_reader_open: out of memory");
		return -ENOMEM;
	}
	rd->dirfd = -1;
	rd->path = strdup(path);
	if (!rd->path) {
		r = -ENOMEM;
		cli_set_error("ckpt_reader_open: out of memory");
		goto out_free;
	}
	if (s3_is_url(path)) {
		/* The process's S3 client, from the AWS_* environment. */
		struct store_s3_settings set = { 0 };
		rd->s3 = true;
		r = store_s3_start_settings(&set, err, sizeof(err));
		if (r < 0) {
			cli_set_error("ckpt_reader_open: '%s': %s", path, err);
			goto out_free;
		}
		/* The lease first, then the manifest (store/remove.h). */
		rd->lease = calloc(1, sizeof(*rd->lease));
		if (!rd->lease) {
			r = -ENOMEM;
			cli_set_error("ckpt_reader_open: out of memory");
			goto out_free;
		}
		r = store_s3_lease_take(path, rd->lease, err, sizeof(err));
		if (r == -EACCES || r == -EPERM) {
			/* Credentials that may only read: read without a lease. */
			free(rd->lease);
			rd->lease = NULL;
		} else if (r < 0) {
			cli_set_error("ckpt_reader_open: '%s': taking a lease: %s", path, err);
			goto out_free;
		}
		for (unsigned waited = 0;; waited += READER_TOMB_POLL_MS) {
			r = store_s3_get(path, MANIFEST_FILE, READER_MAX_MANIFEST, &text, &text_len,
					 err, sizeof(err));
			/* A tombstone, with our lease put: a removal that saw
			 * the lease puts the manifest back at once. */
			if (r < 0 || !rd->lease || !store_is_tombstone(text, text_len) ||
			    store_tombstone_deleting(text, text_len) ||
			    waited >= READER_TOMB_WAIT_MS)
				break;
			free(text);
			text = NULL;
			usleep(READER_TOMB_POLL_MS * 1000);
		}
		if (r < 0 && r != -ENOENT) {
			cli_set_error("ckpt_reader_open: %s", err);
			goto out_free;
		}
	} else {
		rd->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rd->dirfd < 0) {
			r = -errno;
			cli_set_error("ckpt_reader_open: '%s': %s", path, strerror(-r));
			goto out_free;
		}
		/* The lease: a prune leaves the checkpoint alone while this
		 * reader holds it (store/remove.h).  A prune already under way
		 * holds it for a moment; after it, the manifest is gone. */
		r = store_lease_take(rd->dirfd, READER_LEASE_WAIT_MS);
		if (r == -EBUSY) {
			cli_set_error("ckpt_reader_open: '%s' is locked by a removal (waited %u s)",
				      path, READER_LEASE_WAIT_MS / 1000);
			goto out_free;
		}
		/* (A file system without flock: read without a lease.) */
		r = fs_read_file_at(rd->dirfd, MANIFEST_FILE, READER_MAX_MANIFEST, &text,
				    &text_len);
	}
	if (r == -ENOENT) {
		cli_set_error("ckpt_reader_open: no %s in '%s': not a committed checkpoint",
			      MANIFEST_FILE, path);
		goto out_free;
	}
	if (r == -EFBIG || r == -EISDIR || r == -EINVAL || (r == 0 && text_len == 0)) {
		r = -EBADMSG;
		cli_set_error("ckpt_reader_open: '%s/%s' is not a manifest (not a regular file "
			      "of 1..%llu bytes)", path, MANIFEST_FILE,
			      (unsigned long long)READER_MAX_MANIFEST);
		goto out_free;
	}
	if (r < 0) {
		cli_set_error("ckpt_reader_open: reading '%s/%s': %s", path, MANIFEST_FILE,
			      strerror(-r));
		goto out_free;
	}
	err[0] = '\0';
	r = manifest_parse(text, text_len, &rd->m, err, sizeof(err));
	if (r < 0) {
		cli_set_error("ckpt_reader_open: '%s/%s': %s", path, MANIFEST_FILE,
			      err[0] ? err : strerror(-r));
		goto out_free;
	}
	rd->fds = malloc((rd->m.n_files ? rd->m.n_files : 1) * sizeof(int));
	if (!rd->fds) {
		r = -ENOMEM;
		cli_set_error("ckpt_reader_open: out of memory");
		goto out_free;
	}
	for (size_t i = 0; i < rd->m.n_files; i++)
		rd->fds[i] = -1;
	free(text);
	*ret_reader = rd;
	return 0;

out_free:
	free(text);
	ckpt_reader_close(rd);
	return r;
}

/* ---- queries ---- */

uint64_t ckpt_reader_step(const struct ckpt_reader *reader)
{
	return reader ? reader->m.step : 0;
}

uint32_t ckpt_reader_world(const struct ckpt_reader *reader)
{
	return reader ? reader->m.world : 0;
}

size_t ckpt_reader_tensor_count(const struct ckpt_reader *reader)
{
	return reader ? reader->m.n_tensors : 0;
}

const char *ckpt_reader_tensor_name(const struct ckpt_reader *reader, size_t i)
{
	if (!reader || i >= reader->m.n_tensors)
		return NULL;
	return reader->m.items[i].name;
}

static const struct manifest_tensor *find(const struct ckpt_reader *reader, enum item_kind kind,
					  const char *name, const char *fn)
{
	const struct manifest_tensor *t = NULL;

	if (reader && name)
		t = manifest_find(&reader->m, kind, name);
	if (!t)
		cli_set_error("%s: no %s '%s' in the checkpoint", fn,
			      kind == ITEM_BLOB ? "blob" : "tensor", name ? name : "(null)");
	return t;
}

int ckpt_reader_tensor_info(const struct ckpt_reader *reader, const char *name,
			    size_t shape_cap, enum ckpt_dtype *ret_dtype, unsigned *ret_ndim,
			    uint64_t *ret_shape)
{
	const struct manifest_tensor *t;

	t = find(reader, ITEM_TENSOR, name, "ckpt_reader_tensor_info");
	if (!t)
		return -ENOENT;
	if (ret_shape && t->ndim > shape_cap) {
		cli_set_error("ckpt_reader_tensor_info: tensor '%s' has %u dimensions, the shape "
			      "array room for %zu", name, t->ndim, shape_cap);
		return -ERANGE;
	}
	if (ret_dtype)
		*ret_dtype = (enum ckpt_dtype)t->dtype;
	if (ret_ndim)
		*ret_ndim = t->ndim;
	if (ret_shape)
		memcpy(ret_shape, t->shape, t->ndim * sizeof(uint64_t));
	return 0;
}

size_t ckpt_reader_blob_count(const struct ckpt_reader *reader)
{
	return reader ? reader->m.n_items - reader->m.n_tensors : 0;
}

const char *ckpt_reader_blob_name(const struct ckpt_reader *reader, size_t i)
{
	if (!reader || i >= reader->m.n_items - reader->m.n_tensors)
		return NULL;
	return reader->m.items[reader->m.n_tensors + i].name;
}

int64_t ckpt_reader_blob_size(const struct ckpt_reader *reader, const char *key)
{
	const struct manifest_tensor *t = find(reader, ITEM_BLOB, key, "ckpt_reader_blob_size");

	if (!t)
		return -ENOENT;
	return (int64_t)t->shape[0];
}

/* ---- reading ---- */

int cli_reader_fd(struct ckpt_reader *rd, uint32_t file, char *err, size_t errlen)
{
	if (rd->fds[file] < 0) {
		/* O_NONBLOCK: a FIFO (or device) put in a shard's place must
		 * not hang the open; only a regular file is read. */
		int fd = openat(rd->dirfd, rd->m.files[file].path,
				O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
		struct stat st;
		if (fd < 0) {
			int r = -errno;
			snprintf(err, errlen, "opening %s/%s: %s", rd->path, rd->m.files[file].path,
				 strerror(-r));
			return r;
		}
		int r = fstat(fd, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EBADMSG;
		if (r < 0) {
			snprintf(err, errlen, "%s/%s: %s", rd->path, rd->m.files[file].path,
				 r == -EBADMSG ? "not a regular file" : strerror(-r));
			close(fd);
			return r;
		}
		rd->fds[file] = fd;
	}
	return rd->fds[file];
}

static int file_fd(struct ckpt_reader *rd, uint32_t file, const char *fn, const char *name)
{
	char err[512];
	int fd = cli_reader_fd(rd, file, err, sizeof(err));

	if (fd < 0)
		cli_set_error("%s: '%s': %s", fn, name, err);
	return fd;
}

/*
 * Reads a chunk's file bytes [begin, end) into dst, one CRC piece at a time,
 * checking each piece.  Returns 0, -EBADMSG (CRC mismatch or short file), or
 * an I/O errno.
 */
static int read_chunk(struct ckpt_reader *rd, const struct manifest_chunk *ch, char *dst,
		      const char *fn, const char *name)
{
	const char *file = rd->m.files[ch->file].path;
	uint64_t pos = ch->begin;
	uint32_t piece = 0;
	int fd = -1;

	if (rd->s3) {
		/* One ranged GET for the whole chunk; the pieces are checked
		 * below as they are for a file. */
		int r;

		cli_reader_touch(rd);
		r = store_s3.read_range(rd->path, file, ch->begin, ch->end - ch->begin, dst);
		if (r < 0) {
			cli_set_error("%s: '%s': reading %s/%s [%llu, %llu) from S3: %s", fn, name,
				      rd->path, file, (unsigned long long)ch->begin,
				      (unsigned long long)ch->end, strerror(-r));
			return r;
		}
	} else if ((fd = file_fd(rd, ch->file, fn, name)) < 0) {
		return fd;
	}
	while (pos < ch->end) {
		uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
		uint64_t stop = grid < ch->end ? grid : ch->end;
		char *p = dst + (pos - ch->begin);
		uint64_t got = rd->s3 ? stop - pos : 0;

		while (got < stop - pos) {
			ssize_t n = pread(fd, p + got, (size_t)(stop - pos - got),
					  (off_t)(pos + got));
			if (n < 0) {
				int r = -errno;
				if (r == -EINTR)
					continue;
				cli_set_error("%s: '%s': reading %s at offset %llu: %s", fn, name,
					      file, (unsigned long long)(pos + got), strerror(-r));
				return r;
			}
			if (n == 0) {
				cli_set_error("%s: '%s': %s is truncated at offset %llu", fn, name,
					      file, (unsigned long long)(pos + got));
				return -EBADMSG;
			}
			got += (uint64_t)n;
		}
		if (crc32c(p, (size_t)(stop - pos), 0) != ch->crcs[piece]) {
			cli_set_error("%s '%s': CRC mismatch in %s at offset %llu",
				      strcmp(fn, "ckpt_reader_read_blob") ? "tensor" : "blob", name,
				      file, (unsigned long long)pos);
			return -EBADMSG;
		}
		piece++;
		pos = stop;
	}
	return 0;
}

/* True if the chunk's box is one contiguous run of the global array, so it
 * can be read straight into place. */
static bool chunk_contiguous(const struct manifest_tensor *t, const struct manifest_chunk *ch)
{
	unsigned d = 0;

	while (d < t->ndim && ch->shape[d] == 1)
		d++;
	/* dim d may be partial; every later dim must be whole */
	for (d = d + 1; d < t->ndim; d++)
		if (ch->shape[d] != t->shape[d])
			return false;
	return true;
}

static uint64_t row_major_offset(const struct manifest_tensor *t, const uint64_t *offs)
{
	uint64_t off = 0;

	for (unsigned d = 0; d < t->ndim; d++)
		off = off * t->shape[d] + offs[d];
	return off;
}

static int read_item(struct ckpt_reader *rd, enum item_kind kind, const char *name, void *buf,
		     size_t len, const char *fn)
{
	const struct manifest_tensor *t = find(rd, kind, name, fn);
	size_t esize;
	uint64_t want;
	char *tmp = NULL;
	size_t tmp_cap = 0;
	int r = 0;

	if (!t)
		return -ENOENT;
	esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	want = esize;
	for (unsigned d = 0; d < t->ndim; d++)
		want *= t->shape[d]; /* manifest_parse checked for overflow */
	if (len != want) {
		cli_set_error("%s: '%s' holds %llu bytes, the buffer %zu", fn, name,
			      (unsigned long long)want, len);
		return -EINVAL;
	}
	if (len && !buf) {
		cli_set_error("%s: buffer is NULL", fn);
		return -EINVAL;
	}

	for (size_t i = 0; i < t->n_chunks; i++) {
		const struct manifest_chunk *ch = &t->chunks[i];
		uint64_t bytes = ch->end - ch->begin;

		if (bytes == 0)
			continue;
		if (kind == ITEM_BLOB || chunk_contiguous(t, ch)) {
			uint64_t at = kind == ITEM_BLOB ? 0 : row_major_offset(t, ch->offsets) * esize;
			if (at > len || bytes > len - at) {
				/* manifest_parse checks that chunks lie inside
				 * the tensor; never trust it blindly here. */
				cli_set_error("%s: '%s': chunk %zu lies outside the tensor", fn,
					      name, i);
				r = -EBADMSG;
				goto out;
			}
			r = read_chunk(rd, ch, (char *)buf + at, fn, name);
			if (r < 0)
				goto out;
			continue;
		}
		if (bytes > tmp_cap) {
			free(tmp);
			tmp = malloc((size_t)bytes);
			if (!tmp) {
				tmp_cap = 0;
				cli_set_error("%s: out of memory for a %llu-byte chunk", fn,
					      (unsigned long long)bytes);
				r = -ENOMEM;
				goto out;
			}
			tmp_cap = bytes;
		}
		r = read_chunk(rd, ch, tmp, fn, name);
		if (r < 0)
			goto out;
		/* The chunk, row-major in tmp, into its place in the tensor. */
		uint64_t ds[CKPT_MAX_NDIM], ss[CKPT_MAX_NDIM];
		char *at = (char *)buf;
		for (unsigned d = t->ndim; d-- > 0;) {
			ds[d] = d + 1 < t->ndim ? ds[d + 1] * t->shape[d + 1] : esize;
			ss[d] = d + 1 < t->ndim ? ss[d + 1] * ch->shape[d + 1] : esize;
		}
		for (unsigned d = 0; d < t->ndim; d++)
			at += ch->offsets[d] * ds[d];
		cli_box_copy(at, ds, tmp, ss, ch->shape, t->ndim, esize);
	}
out:
	free(tmp);
	return r;
}

int ckpt_reader_read_tensor(struct ckpt_reader *reader, const char *name, void *buf, size_t len)
{
	return read_item(reader, ITEM_TENSOR, name, buf, len, "ckpt_reader_read_tensor");
}

int ckpt_reader_read_blob(struct ckpt_reader *reader, const char *key, void *buf, size_t len)
{
	return read_item(reader, ITEM_BLOB, key, buf, len, "ckpt_reader_read_blob");
}

/* ---- the newest committed checkpoint of a root ---- */

/*
 * <root>/<name>, malloc'd (NULL: out of memory).  A root may end with '/'
 * (s3_url_parse takes one, as people write prefixes that way): no second
 * one is added, since "a//b" in an S3 prefix is an empty segment that the
 * URL parser refuses, which would make every checkpoint under such a root
 * unreadable.
 */
static char *child_path(const char *root, const char *name)
{
	size_t n = strlen(root);
	char *path;

	if (asprintf(&path, "%s%s%s", root, n && root[n - 1] == '/' ? "" : "/", name) < 0)
		return NULL;
	return path;
}

struct latest {
	const char *root;
	struct ckpt_reader *best; /* the best so far, kept open */
	char *best_name;
	unsigned skipped;    /* checkpoints whose manifest could not be read */
	int err;
};

/* A committed checkpoint under the root: read its manifest's step and
 * time; keep the greatest (step, time, name). */
static int latest_add(void *ud, const char *name, enum store_entry kind)
{
	struct latest *L = ud;
	struct ckpt_reader *rd;
	char *path;
	int r;

	if (kind != STORE_ENTRY_CHECKPOINT)
		return 0;
	path = child_path(L->root, name);
	if (!path) {
		L->err = -ENOMEM;
		return -ENOMEM;
	}
	r = ckpt_reader_open(path, &rd);
	/* Skipped: a manifest that is corrupt, of a newer format, gone
	 * since the listing, or locked by its removal (-EBUSY).  Any other
	 * failure (I/O, S3 unreachable) stops the search: skipping it could
	 * pick an older checkpoint than the newest committed one. */
	if (r == -EBADMSG || r == -EPROTONOSUPPORT || r == -ENOENT || r == -EBUSY) {
		L->skipped++;
		cli_log(CKPT_LOG_WARNING, "ckpt_reader_open_latest: skipping '%s': %s", path,
			ckpt_last_error());
	} else if (r < 0) {
		char msg[512];
		snprintf(msg, sizeof(msg), "%s", ckpt_last_error());
		cli_set_error("ckpt_reader_open_latest: '%s': %s", path, msg);
		L->err = r;
	}
	free(path);
	if (r < 0)
		return L->err;
	const struct manifest *b = L->best ? &L->best->m : NULL;
	int cmp = !b ? 1 : rd->m.step != b->step ? (rd->m.step > b->step ? 1 : -1) :
		  strcmp(rd->m.time, b->time) ? strcmp(rd->m.time, b->time) :
						strcmp(name, L->best_name);
	if (cmp <= 0) {
		ckpt_reader_close(rd);
		return 0;
	}
	char *n = strdup(name);
	if (!n) {
		ckpt_reader_close(rd);
		L->err = -ENOMEM;
		return -ENOMEM;
	}
	/* The winner stays open: its manifest is not read a second time. */
	ckpt_reader_close(L->best);
	free(L->best_name);
	L->best = rd;
	L->best_name = n;
	return 0;
}

/*
 * Lists root with store_routed.list, calling fn for each entry.  Sets up
 * the process's S3 client for an s3:// root first.  On failure the message
 * names `what` (the public function) and the root; a failure fn reported
 * itself (-ECANCELED from fn means "my message stands": returned as
 * *fn_err) is returned without a new message.
 */
static int list_root(const char *root, const char *what,
		     int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud,
		     const int *fn_err)
{
	struct s3_loc loc;
	bool s3 = false;
	int r;

	if (s3_is_url(root)) {
		struct store_s3_settings set = { 0 };
		char err[512];
		/* Parsed here for its message: the listing returns an errno
		 * only. */
		r = s3_url_parse(root, &loc, err, sizeof(err));
		if (r == 0)
			r = store_s3_start_settings(&set, err, sizeof(err));
		if (r < 0) {
			cli_set_error("%s: '%s': %s", what, root, err);
			return r;
		}
		s3 = true;
	}
	r = store_routed.list(root, "", fn, ud);
	if (*fn_err && *fn_err != -ENOMEM)
		return *fn_err; /* fn's message stands */
	if (r < 0 || *fn_err) {
		r = *fn_err ? *fn_err : r;
		/* A prefix that holds nothing lists as empty: on S3 -ENOENT
		 * is the bucket's answer (NoSuchBucket). */
		if (s3 && r == -ENOENT)
			cli_set_error("%s: listing '%s': the bucket '%s' does not exist", what,
				      root, loc.bucket);
		else
			cli_set_error("%s: listing '%s': %s", what, root, strerror(-r));
		return r;
	}
	return 0;
}

int ckpt_reader_open_latest(const char *root, struct ckpt_reader **ret_reader)
{
	struct latest L = { .root = root };
	int r;

	if (!root || !ret_reader) {
		cli_set_error("ckpt_reader_open_latest: NULL argument");
		return -EINVAL;
	}
	r = list_root(root, "ckpt_reader_open_latest", latest_add, &L, &L.err);
	if (r < 0) {
		ckpt_reader_close(L.best);
		free(L.best_name);
		return r;
	}
	if (!L.best) {
		cli_set_error("ckpt_reader_open_latest: no committed checkpoint under '%s'%s", root,
			      L.skipped ? " (some could not be read: see the log)" : "");
		return -ENOENT;
	}
	free(L.best_name);
	*ret_reader = L.best;
	return 0;
}

/* ---- what a reader tells, and the checkpoints of a root (LIBCKPT_0.6) ---- */

const char *ckpt_reader_path(const struct ckpt_reader *reader)
{
	return reader ? reader->path : NULL;
}

const char *ckpt_reader_time(const struct ckpt_reader *reader)
{
	return reader ? reader->m.time : NULL;
}

const char *ckpt_reader_metadata(const struct ckpt_reader *reader, const char *key)
{
	if (!reader || !key || !reader->m.json)
		return NULL;
	json_t *v = json_object_get(json_object_get(reader->m.json, "metadata"), key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

int ckpt_reader_metric(const struct ckpt_reader *reader, const char *key, double *ret_value)
{
	if (!reader || !key)
		return -EINVAL;
	json_t *v = reader->m.json ? json_object_get(json_object_get(reader->m.json, "metrics"), key) :
				     NULL;
	if (!json_is_number(v))
		return -ENOENT;
	if (ret_value)
		*ret_value = json_number_value(v);
	return 0;
}

struct list_names {
	int (*fn)(void *ud, const char *name);
	void *ud;
	int err;
};

static int list_names_add(void *ud, const char *name, enum store_entry kind)
{
	struct list_names *L = ud;
	int r;

	if (kind != STORE_ENTRY_CHECKPOINT)
		return 0;
	r = L->fn(L->ud, name);
	if (r != 0) {
		/* The caller's own stop: its value, no message of ours. */
		L->err = r;
		return r;
	}
	return 0;
}

int ckpt_list(const char *root, int (*fn)(void *ud, const char *name), void *ud)
{
	struct list_names L = { .fn = fn, .ud = ud };
	int r;

	if (!root || !fn) {
		cli_set_error("ckpt_list: NULL argument");
		return -EINVAL;
	}
	r = list_root(root, "ckpt_list", list_names_add, &L, &L.err);
	return r;
}
