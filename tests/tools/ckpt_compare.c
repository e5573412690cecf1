/* SPDX-License-Identifier: MIT */
/*
 * ckpt_compare.c - reads two checkpoints with ckpt_reader and says whether
 * they hold the same state: step, world size, every tensor (name, dtype,
 * shape and bytes) and every blob (key and bytes).  Each side may be a
 * directory or an s3:// URL (the reader's S3 client takes the AWS_*
 * variables), so a test can check a checkpoint that another program wrote
 * to S3 against a local copy.  Every read is CRC-checked by the reader.
 *
 *   ckpt_compare A B
 *
 * Prints "identical: N tensors, M blobs, B bytes" and exits 0; prints the
 * first difference or error and exits 1; exits 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

/* Prints the reason (with ckpt_last_error() when r < 0); returns 1. */
static int fail(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int r, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ckpt_compare: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (r < 0)
		fprintf(stderr, ": %s (%s)", strerror(-r), ckpt_last_error());
	fputc('\n', stderr);
	return 1;
}

/* Reads tensor or blob `name` (len bytes) of both readers and compares the
 * bytes.  0 the same, 1 they differ or a read failed (printed). */
static int same_bytes(struct ckpt_reader *ra, struct ckpt_reader *rb, const char *name,
		      size_t len, bool blob)
{
	const char *what = blob ? "blob" : "tensor";
	unsigned char *a = malloc(len ? len : 1), *b = malloc(len ? len : 1);
	int r, ret = 1;

	if (!a || !b) {
		fail(-ENOMEM, "%s '%s'", what, name);
		goto out;
	}
	r = blob ? ckpt_reader_read_blob(ra, name, a, len) :
		   ckpt_reader_read_tensor(ra, name, a, len);
	if (r < 0) {
		fail(r, "reading %s '%s' of the first", what, name);
		goto out;
	}
	r = blob ? ckpt_reader_read_blob(rb, name, b, len) :
		   ckpt_reader_read_tensor(rb, name, b, len);
	if (r < 0) {
		fail(r, "reading %s '%s' of the second", what, name);
		goto out;
	}
	if (memcmp(a, b, len)) {
		fail(0, "%s '%s': the bytes differ", what, name);
		goto out;
	}
	ret = 0;
out:
	free(a);
	free(b);
	return ret;
}

int main(int argc, char **argv)
{
	struct ckpt_reader *ra = NULL, *rb = NULL;
	uint64_t bytes = 0;
	size_t nt, nb;
	int r, ret = 1;

	if (argc != 3) {
		fprintf(stderr, "usage: ckpt_compare A B (directories or s3:// URLs)\n");
		return 2;
	}
	r = ckpt_reader_open(argv[1], &ra);
	if (r < 0)
		return fail(r, "opening '%s'", argv[1]);
	r = ckpt_reader_open(argv[2], &rb);
	if (r < 0) {
		fail(r, "opening '%s'", argv[2]);
		goto out;
	}
	if (ckpt_reader_step(ra) != ckpt_reader_step(rb) ||
	    ckpt_reader_world(ra) != ckpt_reader_world(rb)) {
		fail(0, "step or world size differ between '%s' and '%s'", argv[1], argv[2]);
		goto out;
	}
	nt = ckpt_reader_tensor_count(ra);
	nb = ckpt_reader_blob_count(ra);
	if (nt != ckpt_reader_tensor_count(rb) || nb != ckpt_reader_blob_count(rb)) {
		fail(0, "'%s' and '%s' hold different numbers of tensors or blobs", argv[1],
		     argv[2]);
		goto out;
	}
	for (size_t i = 0; i < nt; i++) {
		const char *name = ckpt_reader_tensor_name(ra, i);
		uint64_t sa[CKPT_MAX_NDIM], sb[CKPT_MAX_NDIM];
		enum ckpt_dtype da, db;
		unsigned ka, kb;
		uint64_t n = 1;

		/* Names come sorted from both: the same list, in order. */
		if (strcmp(name, ckpt_reader_tensor_name(rb, i))) {
			fail(0, "tensor '%s' of the first is '%s' in the second", name,
			     ckpt_reader_tensor_name(rb, i));
			goto out;
		}
		if ((r = ckpt_reader_tensor_info(ra, name, CKPT_MAX_NDIM, &da, &ka, sa)) < 0 ||
		    (r = ckpt_reader_tensor_info(rb, name, CKPT_MAX_NDIM, &db, &kb, sb)) < 0) {
			fail(r, "tensor '%s'", name);
			goto out;
		}
		if (da != db || ka != kb || memcmp(sa, sb, ka * sizeof(sa[0]))) {
			fail(0, "tensor '%s': dtype or shape differ", name);
			goto out;
		}
		bool over = false;
		for (unsigned d = 0; d < ka; d++)
			over |= __builtin_mul_overflow(n, sa[d], &n);
		over |= __builtin_mul_overflow(n, (uint64_t)ckpt_dtype_size(da), &n);
		if (over || n > SIZE_MAX) {
			fail(0, "tensor '%s': its size overflows", name);
			goto out;
		}
		if (same_bytes(ra, rb, name, (size_t)n, false))
			goto out;
		bytes += n;
	}
	for (size_t i = 0; i < nb; i++) {
		const char *key = ckpt_reader_blob_name(ra, i);
		int64_t la = ckpt_reader_blob_size(ra, key), lb = ckpt_reader_blob_size(rb, key);

		if (la < 0 || la != lb) {
			fail(0, "blob '%s': missing from the second or of another size", key);
			goto out;
		}
		if (same_bytes(ra, rb, key, (size_t)la, true))
			goto out;
		bytes += (uint64_t)la;
	}
	printf("identical: %zu tensors, %zu blobs, %" PRIu64 " bytes\n", nt, nb, bytes);
	ret = 0;
out:
	ckpt_reader_close(ra);
	ckpt_reader_close(rb);
	return ret;
}
