/* SPDX-License-Identifier: MIT */
/*
 * verify.c - ckptctl verify ROOT/NAME: is one committed checkpoint whole?
 *
 * What is checked, in this order:
 *
 *   1. manifest.json parses: manifest_parse() is the reader's own check
 *      (every chunk inside its file and its tensor, byte counts against
 *      shapes and dtypes, CRC counts against the grid, no two chunks
 *      sharing a byte, and each tensor's chunks tiling it: boxcheck.h).
 *      What a reader would refuse, verify reports; nothing is re-checked
 *      by a second implementation that could disagree with it.
 *   2. every file the manifest lists exists, is a regular file and has the
 *      size the manifest says;
 *   3. its safetensors header (the one part of a shard no CRC covers)
 *      agrees with the manifest: dtype, shape and data_offsets of every
 *      chunk the file holds, and no entry the manifest does not list;
 *   4. every CRC32C piece (layout.h) of every chunk is recomputed over the
 *      stored bytes: the file is read once, front to back, in blocks of
 *      VFY_BLOCK bytes (local files with pread, S3 objects with ranged
 *      GETs), so memory stays one block whatever the checkpoint's size;
 *   5. entries of the checkpoint directory (prefix) that the manifest does
 *      not name are warnings, not errors: they do not make the checkpoint
 *      any less loadable.  The files the local backend leaves beside the
 *      manifest (attempt.json, coordinator.json, the rank indexes) are
 *      expected.
 *
 * Output: one line (--json: one object) per finding, then a summary.  A
 * checkpoint with only warnings is whole (exit 0); any error makes it
 * damaged (exit 1).  A path that holds no checkpoint to verify (no
 * manifest, a work area, a manifest of a newer format, unreadable) is
 * said on stderr and exits 1 too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl/ctl.h"
#include "format/crc32c.h"
#include "format/errmsg.h"
#include "format/index.h"
#include "format/layout.h"
#include "store/fsutil.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/s3_http.h"
#include "store/store.h"
#include "store/store_s3.h"

#define VFY_BLOCK          (8u << 20)      /* bytes per read */
#define VFY_SHOW_MAX       100             /* findings shown per file */
#define VFY_CLAIM_FILE     "coordinator.json" /* left by the local backend */

enum sev { SEV_ERROR, SEV_WARNING };

/* A chunk of the manifest, for walking a file's chunks in file order. */
struct cref {
	uint32_t file, item, chunk;
};

/* A stored file being checked: a local fd, or an S3 object by name. */
struct vfile {
	int fd;
	const char *name;
	uint64_t size;      /* as stored */
};

struct verify {
	const char *path;   /* as given */
	char *shown;        /* fit to print */
	bool json, s3;
	int dfd;            /* the local checkpoint directory */
	struct manifest m;
	uint8_t *buf;       /* VFY_BLOCK bytes */
	uint64_t win_off, win_len; /* the file bytes buf holds */
	uint64_t pieces;    /* CRC pieces recomputed */
	size_t problems, warnings;
	size_t shown_now, hidden_now; /* findings of the current file */
	bool nomem;
};

/* Control and non-ASCII bytes as '?': what storage says must not drive
 * the terminal, and JSON strings must be UTF-8. */
static void clean(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			*s = '?';
}

static void emit(struct verify *v, json_t *o)
{
	if (!o || ctl_json_line(o) < 0)
		v->nomem = true;
	json_decref(o);
}

/*
 * One finding of kind `kind` about `file` (a stored name, or NULL): a line
 * "error: FILE: message", or one JSON object {"problem", "severity",
 * "file", the fields of `extra` (taken over), "message"}.  Past
 * VFY_SHOW_MAX findings of one file they are only counted (file_done()
 * says how many), so that a shard of garbage prints a screenful, not one
 * line per MiB.
 */
static void finding(struct verify *v, enum sev sev, const char *kind, const char *file,
		    json_t *extra, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void finding(struct verify *v, enum sev sev, const char *kind, const char *file,
		    json_t *extra, const char *fmt, ...)
{
	char msg[1024], *f = file ? ctl_display(file) : NULL;
	va_list ap;

	if (sev == SEV_ERROR)
		v->problems++;
	else
		v->warnings++;
	if (file && !f)
		v->nomem = true;
	if (v->shown_now++ >= VFY_SHOW_MAX) {
		v->hidden_now++;
		goto out;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	clean(msg);
	if (v->json) {
		json_t *o = json_pack("{sssssn}", "problem", kind, "severity",
				      sev == SEV_ERROR ? "error" : "warning", "file");

		if (o && f)
			json_object_set_new(o, "file", json_string(f));
		if (o && extra)
			json_object_update(o, extra);
		if (o)
			json_object_set_new(o, "message", json_string(msg));
		emit(v, o);
	} else {
		printf("%s: %s%s%s\n", sev == SEV_ERROR ? "error" : "warning", f ? f : "",
		       f ? ": " : "", msg);
	}
out:
	json_decref(extra);
	free(f);
}

/* Starts the findings of another file. */
static void file_begin(struct verify *v)
{
	v->shown_now = 0;
	v->hidden_now = 0;
}

/* Says how many findings of the file (NULL: of the directory) were
 * counted but not shown (they are counted in the summary). */
static void file_done(struct verify *v, enum sev sev, const char *file)
{
	const char *sn = sev == SEV_ERROR ? "error" : "warning";
	size_t n = v->hidden_now;
	char *f;

	if (!n)
		return;
	f = file ? ctl_display(file) : NULL;
	if (v->json) {
		json_t *o = json_pack("{sssssnsIss}", "problem", "more", "severity", sn, "file",
				      "count", (json_int_t)n, "message", "further findings not shown");

		if (o && f)
			json_object_set_new(o, "file", json_string(f));
		emit(v, o);
	} else {
		printf("%s: %s%s%zu more finding%s not shown\n", sn, f ? f : "", f ? ": " : "", n,
		       n == 1 ? "" : "s");
	}
	free(f);
}

/* ---- S3 ---- */

/* HEAD of `name` in the checkpoint: 0 and its size, -ENOENT, or -errno
 * with why. */
static int s3_size(const char *ckpt, const char *name, uint64_t *ret, char *why, size_t len)
{
	char key[S3_KEY_MAX + 1];
	struct s3_loc loc;
	int r;

	r = s3_url_parse(ckpt, &loc, why, len);
	if (r == 0)
		r = s3_key_join(&loc, name, key, sizeof(key), why, len);
	if (r < 0)
		return r;
	struct s3_req q = { .method = "HEAD", .bucket = loc.bucket, .key = key,
			    .fail_404_quietly = true };
	r = s3_call(store_s3_client(), &q, why, len);
	if (r == 0)
		*ret = q.content_length;
	s3_req_free(&q);
	return r;
}

/* ---- reading stored files ---- */

/* Opens file `name` of the checkpoint: 0 and f, -ENOENT, or -errno with
 * why.  A local file must be a regular file reached without a symlink. */
static int src_open(struct verify *v, const char *name, struct vfile *f, char *why, size_t len)
{
	struct stat st;
	int fd;

	f->fd = -1;
	f->name = name;
	v->win_len = 0;
	if (v->s3)
		return s3_size(v->path, name, &f->size, why, len);
	/* O_NONBLOCK: a FIFO in a shard's place must not hang the open. */
	fd = openat(v->dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		int e = errno;

		snprintf(why, len, "%s", e == ELOOP ? "a symbolic link, not a file" : strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0) {
		int e = errno;

		snprintf(why, len, "%s", strerror(e));
		close(fd);
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, len, "not a regular file");
		close(fd);
		return -EINVAL;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	f->fd = fd;
	f->size = (uint64_t)st.st_size;
	return 0;
}

static void src_close(struct vfile *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
}

/* Reads exactly len bytes at off.  0, or -errno with why. */
static int src_read(struct verify *v, struct vfile *f, uint64_t off, size_t len, void *buf,
		    char *why, size_t wlen)
{
	size_t done = 0;

	if (v->s3)
		return store_s3_read_range_err(v->path, f->name, off, len, buf, why, wlen);
	while (done < len) {
		ssize_t n = pread(f->fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(why, wlen, "%s", strerror(errno));
			return -errno;
		}
		if (n == 0) {
			snprintf(why, wlen, "the file ends at %llu (it shrank)",
				 (unsigned long long)(off + done));
			return -EBADMSG;
		}
		done += (size_t)n;
	}
	return 0;
}

/* ---- the manifest ---- */

/*
 * Reads manifest.json into *ret_text.  0, or 1 with why there is no
 * checkpoint to verify at v->path in `why` ("" when it was printed
 * already) and its kind for JSON in *kind ("not_checkpoint", "work_area",
 * "unreadable").
 */
static int read_manifest(struct verify *v, char **ret_text, size_t *ret_len, const char **kind,
			 char *why, size_t wlen)
{
	const char *base = strrchr(v->path, '/');
	char err[768] = "";
	bool work;
	int r;

	base = base ? base + 1 : v->path;
	work = !strncmp(base, STORE_WORK_PREFIX, strlen(STORE_WORK_PREFIX));
	*kind = "unreadable";
	if (v->s3) {
		struct s3_loc loc;

		/* ckptctl.c's S3 helpers say what went wrong themselves. */
		if (s3_url_parse(v->path, &loc, err, sizeof(err)) < 0) {
			snprintf(why, wlen, "'%s': %s", v->shown, err);
			return 1;
		}
		if (ctl_s3_start(v->path) < 0)
			return 1;
		r = store_s3_get(v->path, MANIFEST_FILE, CTL_MANIFEST_MAX, ret_text, ret_len, err,
				 sizeof(err));
		if (r == -EACCES) {
			ctl_s3_denied(v->path, err);
			return 1;
		}
		if (r == -ENOENT) {
			/* A missing bucket, or nothing at all under the name? */
			int any = ctl_s3_probe(v->path, &loc);

			if (any < 0)
				return 1;
			if (!any) {
				*kind = "not_checkpoint";
				snprintf(why, wlen, "'%s' is not a committed checkpoint (no %s; "
					 "nothing is stored under it)", v->shown, MANIFEST_FILE);
				return 1;
			}
		}
	} else {
		v->dfd = open(v->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (v->dfd < 0) {
			int e = errno;

			snprintf(why, wlen, "cannot open checkpoint '%s': %s", v->shown,
				 e == ELOOP ? "a loop of symbolic links (or too many)" : strerror(e));
			return 1;
		}
		r = fs_read_file_at(v->dfd, MANIFEST_FILE, CTL_MANIFEST_MAX, ret_text, ret_len);
		if (r == -ELOOP)
			snprintf(err, sizeof(err), "a symbolic link, not a file");
		else if (r == -EINVAL || r == -EISDIR)
			snprintf(err, sizeof(err), "not a regular file");
		else if (r < 0 && r != -EFBIG)
			snprintf(err, sizeof(err), "%s", strerror(-r));
		if (r == -ENOENT && !work)
			work = faccessat(v->dfd, STORE_ATTEMPT_FILE, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	}
	if (r == 0)
		return 0;
	if (r == -EFBIG)
		snprintf(err, sizeof(err), "larger than %llu MiB, the most a reader reads",
			 (unsigned long long)(CTL_MANIFEST_MAX >> 20));
	clean(err);
	if (r == -ENOENT && work) {
		*kind = "work_area";
		snprintf(why, wlen, "'%s' is the work area of a save in progress or of a failed "
			 "one (no %s): not a committed checkpoint", v->shown, MANIFEST_FILE);
	} else if (r == -ENOENT) {
		*kind = "not_checkpoint";
		snprintf(why, wlen, "'%s' is not a committed checkpoint (no %s; `ckptctl list` "
			 "finds the checkpoints below a root)", v->shown, MANIFEST_FILE);
	} else {
		snprintf(why, wlen, "cannot read '%s/%s': %s", v->shown, MANIFEST_FILE,
			 err[0] ? err : strerror(-r));
	}
	return 1;
}

/* Orders chunk references by file, then by where they begin in it. */
static int cref_cmp(const void *pa, const void *pb, void *ud)
{
	const struct manifest *m = ud;
	const struct cref *a = pa, *b = pb;
	const struct manifest_chunk *ca = &m->items[a->item].chunks[a->chunk];
	const struct manifest_chunk *cb = &m->items[b->item].chunks[b->chunk];

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	if (ca->begin != cb->begin)
		return ca->begin < cb->begin ? -1 : 1;
	return ca->end < cb->end ? -1 : ca->end > cb->end;
}

/* Every chunk of every item, sorted by file and offset; NULL if out of
 * memory.  Counts are bounded by the manifest's text (each chunk is some
 * bytes of it), so they fit 32 bits. */
static struct cref *chunk_refs(const struct manifest *m, size_t *ret_n)
{
	size_t n = 0, k = 0;
	struct cref *r;

	for (size_t i = 0; i < m->n_items; i++)
		n += m->items[i].n_chunks;
	r = malloc((n ? n : 1) * sizeof(*r));
	if (!r)
		return NULL;
	for (size_t i = 0; i < m->n_items; i++)
		for (size_t c = 0; c < m->items[i].n_chunks; c++)
			r[k++] = (struct cref){ m->items[i].chunks[c].file, (uint32_t)i,
						(uint32_t)c };
	qsort_r(r, n, sizeof(*r), cref_cmp, (void *)m);
	*ret_n = n;
	return r;
}

/* The end of the CRC piece that starts at `at` of a chunk ending at `end`:
 * the next line of the LAYOUT_CRC_BLOCK grid, or the chunk's end.  (No
 * rounding up, which would overflow for a hostile range near 2^64.) */
static uint64_t piece_end(uint64_t at, uint64_t end)
{
	uint64_t room = LAYOUT_CRC_BLOCK - at % LAYOUT_CRC_BLOCK;

	return end - at <= room ? end : at + room;
}

static const char *item_kind_name(const struct manifest_tensor *t)
{
	return t->kind == ITEM_BLOB ? "blob" : "tensor";
}

/* True if j is an array of exactly the n values of d. */
static bool dims_equal(const json_t *j, const uint64_t *d, size_t n)
{
	if (!json_is_array(j) || json_array_size(j) != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(j, i);

		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    (uint64_t)json_integer_value(e) != d[i])
			return false;
	}
	return true;
}

/* ---- one file ---- */

/*
 * The safetensors header of f (the file's first `limit` bytes are read):
 * an 8-byte little-endian length, then that much JSON, then the data.
 * Each chunk the manifest puts in this file must be an entry of the
 * header with its dtype, its shape and its byte range relative to the
 * data, and the header must hold nothing else (but "__metadata__"), or
 * safetensors readers see another checkpoint than ours.
 */
static void check_header(struct verify *v, struct vfile *f, const struct cref *r, size_t n,
			 uint64_t limit)
{
	const char *name = f->name;
	uint8_t len8[8];
	uint64_t hlen = 0, ds;
	char why[512], b1[192], b2[192];
	json_error_t jerr;
	json_t *h;
	char *text;
	size_t entries, matched = 0;

	if (limit < 8) {
		finding(v, SEV_ERROR, "header", name, NULL,
			"%llu bytes: too short for a safetensors header", (unsigned long long)limit);
		return;
	}
	if (src_read(v, f, 0, 8, len8, why, sizeof(why)) < 0) {
		finding(v, SEV_ERROR, "read_error", name, NULL, "cannot read its header: %s", why);
		return;
	}
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | len8[i];
	if (hlen > limit - 8 || hlen > LAYOUT_MAX_HEADER) {
		finding(v, SEV_ERROR, "header", name, NULL,
			"safetensors header length %llu: more than %s",
			(unsigned long long)hlen, hlen > limit - 8 ? "the file holds" :
			"the 256 MiB a header may have");
		return;
	}
	ds = 8 + hlen;
	text = malloc(hlen ? hlen : 1);
	if (!text) {
		v->nomem = true;
		return;
	}
	if (src_read(v, f, 8, hlen, text, why, sizeof(why)) < 0) {
		finding(v, SEV_ERROR, "read_error", name, NULL, "cannot read its header: %s", why);
		free(text);
		return;
	}
	h = json_loadb(text, hlen, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	if (!json_is_object(h)) {
		clean(jerr.text);
		finding(v, SEV_ERROR, "header", name, NULL,
			"safetensors header is not a JSON object: %s",
			h ? "another JSON value" : jerr.text);
		json_decref(h);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = &v->m.items[r[i].item];
		const struct manifest_chunk *c = &t->chunks[r[i].chunk];
		json_t *e = json_object_get(h, t->name);
		const char *dt = json_string_value(json_object_get(e, "dtype"));
		const char *want = ckpt_dtype_name((enum ckpt_dtype)t->dtype);
		uint64_t offs[2];

		if (c->begin < ds) {
			finding(v, SEV_ERROR, "header", name,
				json_pack("{sssI}", "item", t->name, "chunk", (json_int_t)r[i].chunk),
				"%s '%s' chunk %u: bytes [%llu, %llu) overlap the safetensors header "
				"([0, %llu))", item_kind_name(t), t->name, r[i].chunk,
				(unsigned long long)c->begin, (unsigned long long)c->end,
				(unsigned long long)ds);
			continue;
		}
		if (!json_is_object(e)) {
			finding(v, SEV_ERROR, "header", name, json_pack("{ss}", "item", t->name),
				"safetensors header has no entry for %s '%s'", item_kind_name(t),
				t->name);
			continue;
		}
		matched++;
		offs[0] = c->begin - ds;
		offs[1] = c->end - ds;
		if (!dt || !want || strcmp(dt, want))
			finding(v, SEV_ERROR, "header", name, json_pack("{ss}", "item", t->name),
				"safetensors header gives '%s' dtype %s, the manifest %s", t->name,
				dt ? dt : "(none)", want ? want : "?");
		if (!dims_equal(json_object_get(e, "shape"), c->shape, t->ndim))
			finding(v, SEV_ERROR, "header", name, json_pack("{ss}", "item", t->name),
				"safetensors header gives '%s' another shape than the manifest's %s",
				t->name, errmsg_dims(c->shape, t->ndim, b1, sizeof(b1)));
		if (!dims_equal(json_object_get(e, "data_offsets"), offs, 2))
			finding(v, SEV_ERROR, "header", name, json_pack("{ss}", "item", t->name),
				"safetensors header gives '%s' other data_offsets than the manifest's "
				"%s (bytes [%llu, %llu) of the file; data starts at %llu)", t->name,
				errmsg_dims(offs, 2, b2, sizeof(b2)), (unsigned long long)c->begin,
				(unsigned long long)c->end, (unsigned long long)ds);
	}
	entries = json_object_size(h) - (json_object_get(h, "__metadata__") ? 1 : 0);
	if (entries > matched)
		finding(v, SEV_ERROR, "header", name, NULL,
			"safetensors header has %zu entr%s that the manifest does not place in "
			"this file", entries - matched, entries - matched == 1 ? "y" : "ies");
	json_decref(h);
}

/*
 * Recomputes the CRC32C pieces of the chunks r[0..n) (all of file f,
 * sorted by offset) that lie inside the file's first `limit` bytes.  The
 * chunks are disjoint (manifest_parse), so the reads go front to back,
 * each VFY_BLOCK bytes or up to `limit`; a piece may straddle two reads.
 * A read error stops this file, with the offset named.
 */
static void check_pieces(struct verify *v, struct vfile *f, const struct cref *r, size_t n,
			 uint64_t limit)
{
	char why[512];

	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = &v->m.items[r[i].item];
		const struct manifest_chunk *c = &t->chunks[r[i].chunk];
		uint64_t at = c->begin;

		for (uint32_t k = 0; at < c->end; k++) {
			uint64_t pe = piece_end(at, c->end), ps = at;
			uint32_t crc = 0;

			if (pe > limit)
				return; /* past the stored end: said with the size */
			while (at < pe) {
				uint64_t take;

				if (at < v->win_off || at >= v->win_off + v->win_len) {
					uint64_t want = limit - at < VFY_BLOCK ? limit - at : VFY_BLOCK;

					v->win_len = 0;
					if (src_read(v, f, at, (size_t)want, v->buf, why,
						     sizeof(why)) < 0) {
						finding(v, SEV_ERROR, "read_error", f->name,
							json_pack("{sI}", "offset", (json_int_t)at),
							"cannot read bytes [%llu, %llu): %s (the rest "
							"of the file is not checked)",
							(unsigned long long)at,
							(unsigned long long)(at + want), why);
						return;
					}
					v->win_off = at;
					v->win_len = want;
				}
				take = (pe < v->win_off + v->win_len ? pe : v->win_off + v->win_len) -
				       at;
				crc = crc32c(v->buf + (at - v->win_off), (size_t)take, crc);
				at += take;
			}
			v->pieces++;
			if (crc != c->crcs[k])
				finding(v, SEV_ERROR, "crc", f->name,
					json_pack("{sIsIsssssIsIsIsI}", "begin", (json_int_t)ps, "end",
						  (json_int_t)pe, "item", t->name, "item_kind",
						  item_kind_name(t), "chunk", (json_int_t)r[i].chunk,
						  "piece", (json_int_t)k, "expected",
						  (json_int_t)c->crcs[k], "actual", (json_int_t)crc),
					"bytes [%llu, %llu) (%s '%s' chunk %u, CRC piece %u): CRC32C "
					"0x%08x, the manifest says 0x%08x", (unsigned long long)ps,
					(unsigned long long)pe, item_kind_name(t), t->name, r[i].chunk,
					k, crc, c->crcs[k]);
		}
	}
}

/* CRC pieces of the chunks r[0..n) that end past `limit`. */
static uint64_t pieces_past(const struct manifest *m, const struct cref *r, size_t n,
			    uint64_t limit)
{
	uint64_t past = 0;

	for (size_t i = 0; i < n; i++) {
		const struct manifest_chunk *c = &m->items[r[i].item].chunks[r[i].chunk];

		for (uint64_t at = c->begin; at < c->end; at = piece_end(at, c->end))
			past += piece_end(at, c->end) > limit;
	}
	return past;
}

/* File `fi` of the manifest, holding the chunks r[0..n). */
static void verify_file(struct verify *v, uint32_t fi, const struct cref *r, size_t n)
{
	const struct manifest_file *mf = &v->m.files[fi];
	struct vfile f = { .fd = -1 };
	char why[512];
	uint64_t limit;
	int ret;

	file_begin(v);
	ret = src_open(v, mf->path, &f, why, sizeof(why));
	if (ret == -ENOENT) {
		finding(v, SEV_ERROR, "missing", mf->path,
			json_pack("{sI}", "expected_size", (json_int_t)mf->size),
			"missing (the manifest lists it with %llu bytes)",
			(unsigned long long)mf->size);
		return;
	}
	if (ret < 0) {
		clean(why);
		finding(v, SEV_ERROR, "unreadable", mf->path, NULL, "cannot open: %s", why);
		return;
	}
	limit = f.size < mf->size ? f.size : mf->size;
	if (f.size != mf->size) {
		uint64_t d = f.size < mf->size ? mf->size - f.size : f.size - mf->size;
		uint64_t past = pieces_past(&v->m, r, n, limit);
		char tail[96] = "";

		if (past)
			snprintf(tail, sizeof(tail), "; %llu CRC piece%s past its end not checked",
				 (unsigned long long)past, past == 1 ? "" : "s");
		finding(v, SEV_ERROR, "size", mf->path,
			json_pack("{sIsI}", "expected_size", (json_int_t)mf->size, "actual_size",
				  (json_int_t)f.size),
			"%llu bytes stored, the manifest says %llu (%llu byte%s %s%s)",
			(unsigned long long)f.size, (unsigned long long)mf->size,
			(unsigned long long)d, d == 1 ? "" : "s",
			f.size < mf->size ? "short" : "too many", tail);
	}
	check_header(v, &f, r, n, limit);
	check_pieces(v, &f, r, n, limit);
	src_close(&f);
	file_done(v, SEV_ERROR, mf->path);
}

/* ---- what the manifest does not name ---- */

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names the local backend leaves in a committed checkpoint: the work
 * area's attempt.json, the coordinator's claim and rank r's index for
 * r < world. */
static bool bookkeeping_name(const char *name, uint32_t world)
{
	char want[64];
	unsigned long r;
	char *end;

	if (!strcmp(name, STORE_ATTEMPT_FILE) || !strcmp(name, VFY_CLAIM_FILE))
		return true;
	if (strncmp(name, "rank-", 5) || name[5] < '0' || name[5] > '9')
		return false;
	r = strtoul(name + 5, &end, 10);
	if (r >= world)
		return false;
	index_index_name((uint32_t)r, want, sizeof(want));
	return !strcmp(name, want);
}

struct lister {
	struct verify *v;
	const char **names; /* the manifest's, sorted */
	size_t n;
};

static void unlisted(struct lister *L, const char *name, bool dir)
{
	const char *key = name;

	if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, MANIFEST_FILE))
		return;
	if (!dir && bsearch(&key, L->names, L->n, sizeof(*L->names), str_cmp))
		return;
	if (!dir && bookkeeping_name(name, L->v->m.world))
		return;
	if (!dir && L->v->s3 &&
	    store_is_lease_name(name))
		return; /* a reader's lease (store/remove.h) */
	finding(L->v, SEV_WARNING, "unlisted", name, NULL, "%s that the manifest does not name",
		dir ? "a directory" : "a file");
}

static int s3_entry(void *ud, const char *name, enum store_entry kind)
{
	if (name[0]) /* "": the prefix's own folder object */
		unlisted(ud, name, kind != STORE_ENTRY_FILE);
	return 0;
}

/* Warns of every entry of the checkpoint the manifest does not name. */
static void find_unlisted(struct verify *v)
{
	struct lister L = { .v = v };
	struct dirent *de;
	DIR *d;
	int fd, r = 0;

	file_begin(v);
	L.names = malloc((v->m.n_files ? v->m.n_files : 1) * sizeof(*L.names));
	if (!L.names) {
		v->nomem = true;
		return;
	}
	for (size_t i = 0; i < v->m.n_files; i++)
		L.names[i] = v->m.files[i].path;
	L.n = v->m.n_files;
	qsort(L.names, L.n, sizeof(*L.names), str_cmp);
	if (v->s3) {
		r = store_s3.list(v->path, "", s3_entry, &L);
	} else {
		fd = openat(v->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		d = fd >= 0 ? fdopendir(fd) : NULL;
		if (!d) {
			r = -errno;
			if (fd >= 0)
				close(fd);
		} else {
			while ((errno = 0, de = readdir(d)) != NULL) {
				struct stat st;
				bool dir = de->d_type == DT_DIR;

				if (de->d_type == DT_UNKNOWN &&
				    fstatat(v->dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
					dir = S_ISDIR(st.st_mode);
				unlisted(&L, de->d_name, dir);
			}
			r = -errno;
			closedir(d);
		}
	}
	if (r < 0)
		finding(v, SEV_WARNING, "unlisted", NULL, NULL,
			"cannot list the checkpoint for files the manifest does not name: %s",
			strerror(-r));
	file_done(v, SEV_WARNING, NULL);
	free(L.names);
}

/* ---- the whole checkpoint ---- */

/* The manifest lists each file once: two entries of one name would let
 * two chunks share bytes through different file numbers. */
static void check_file_names(struct verify *v)
{
	const char **names = malloc((v->m.n_files ? v->m.n_files : 1) * sizeof(*names));

	if (!names) {
		v->nomem = true;
		return;
	}
	for (size_t i = 0; i < v->m.n_files; i++)
		names[i] = v->m.files[i].path;
	qsort(names, v->m.n_files, sizeof(*names), str_cmp);
	for (size_t i = 1; i < v->m.n_files; i++)
		if (!strcmp(names[i], names[i - 1]) && (i < 2 || strcmp(names[i], names[i - 2])))
			finding(v, SEV_ERROR, "manifest", MANIFEST_FILE, NULL,
				"lists the file '%s' more than once", names[i]);
	free(names);
}

static void summary(struct verify *v, bool parsed)
{
	bool ok = parsed && v->problems == 0;

	if (v->json) {
		json_t *s = json_pack("{sssbsIsIsIsIsI}", "path", v->shown, "ok", ok, "files",
				      (json_int_t)(parsed ? v->m.n_files : 0), "bytes",
				      (json_int_t)(parsed ? v->m.total_bytes : 0), "pieces",
				      (json_int_t)v->pieces, "problems", (json_int_t)v->problems,
				      "warnings", (json_int_t)v->warnings);

		if (s && parsed)
			json_object_set_new(s, "name", json_string(v->m.name));
		emit(v, s ? json_pack("{so}", "summary", s) : NULL);
		return;
	}
	if (!ok) {
		printf("%s: DAMAGED: %zu problem%s", v->shown, v->problems,
		       v->problems == 1 ? "" : "s");
	} else {
		printf("%s: OK, %zu file%s, %llu bytes, %llu CRC pieces checked", v->shown,
		       v->m.n_files, v->m.n_files == 1 ? "" : "s",
		       (unsigned long long)v->m.total_bytes, (unsigned long long)v->pieces);
	}
	if (v->warnings)
		printf(" (%zu warning%s)", v->warnings, v->warnings == 1 ? "" : "s");
	putchar('\n');
}

/* There is nothing to verify: why on stderr and, with --json, as a
 * problem and a summary (so that a script always gets one). */
static void cannot_verify(struct verify *v, const char *kind, const char *file, const char *why)
{
	json_t *o;

	if (why[0])
		ctl_err("verify: %s", why);
	if (!v->json)
		return;
	o = json_pack("{sssssnss}", "problem", kind, "severity", "error", "file", "message",
		      why[0] ? why : "no committed checkpoint to verify (why is on stderr)");

	if (o && file)
		json_object_set_new(o, "file", json_string(file));
	emit(v, o);
	v->problems = 1;
	summary(v, false);
}

int ctl_verify(const char *path, bool json)
{
	struct verify v = { .path = path, .json = json, .dfd = -1 };
	char *text = NULL, err[1024] = "", why[2048];
	const char *kind = NULL;
	struct cref *refs = NULL;
	size_t len = 0, n_refs = 0;
	int r, ret = CTL_EXIT_ERROR;

	v.s3 = s3_is_url(path);
	v.shown = ctl_display(path);
	if (!v.shown) {
		ctl_err("verify: out of memory");
		return CTL_EXIT_ERROR;
	}
	why[0] = '\0';
	if (read_manifest(&v, &text, &len, &kind, why, sizeof(why))) {
		cannot_verify(&v, kind, NULL, why);
		goto out;
	}
	r = manifest_parse(text, len, &v.m, err, sizeof(err));
	free(text);
	if (r == -ENOMEM) {
		ctl_err("verify: out of memory");
		goto out;
	}
	if (r == -ENOENT) {
		/* A tombstone: the checkpoint is being removed. */
		snprintf(why, sizeof(why), "'%s': %s", v.shown, err);
		cannot_verify(&v, "not_checkpoint", MANIFEST_FILE, why);
		goto out;
	}
	if (r == -EPROTONOSUPPORT) {
		/* Most likely a good checkpoint of a newer ckptd: not damaged,
		 * but nothing this version can vouch for. */
		snprintf(why, sizeof(why), "'%s/%s': %s", v.shown, MANIFEST_FILE, err);
		cannot_verify(&v, "newer_format", MANIFEST_FILE, why);
		goto out;
	}
	if (r < 0) {
		finding(&v, SEV_ERROR, "manifest", MANIFEST_FILE, NULL, "%s", err);
		summary(&v, false);
		goto out;
	}
	v.buf = malloc(VFY_BLOCK);
	refs = chunk_refs(&v.m, &n_refs);
	if (!v.buf || !refs) {
		ctl_err("verify: out of memory");
		goto out;
	}
	check_file_names(&v);
	for (size_t i = 0, j = 0; i < v.m.n_files; i++) {
		size_t k = j;

		while (k < n_refs && refs[k].file == i)
			k++;
		verify_file(&v, (uint32_t)i, refs + j, k - j);
		j = k;
	}
	find_unlisted(&v);
	if (v.nomem) {
		ctl_err("verify: out of memory");
		goto out;
	}
	summary(&v, true);
	if (!v.problems)
		ret = 0;
out:
	/* (main stops the S3 client: ctl_s3_stop) */
	if (v.dfd >= 0)
		close(v.dfd);
	manifest_free(&v.m);
	free(refs);
	free(v.buf);
	free(v.shown);
	return ret;
}
