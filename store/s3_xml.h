/* SPDX-License-Identifier: MIT */
/*
 * s3_xml.h - the XML S3 speaks: reading its answers, writing the one
 * request body that is XML (CompleteMultipartUpload).
 *
 * S3's answers are small documents of plain elements (no namespaces
 * prefixes, no DTDs).  The reader here is a bounded scanner, not a general
 * XML parser: it finds elements by their path from the root ("Error/Code")
 * and returns their text with the five predefined entities and numeric
 * character references decoded.  A body from the network is untrusted: the
 * scanner never reads past len, nests at most S3_XML_DEPTH deep, and
 * answers -EBADMSG for anything it does not understand rather than guess.
 */
#ifndef CKPT_STORE_S3_XML_H
#define CKPT_STORE_S3_XML_H

#include <stddef.h>
#include <stdint.h>

#include "format/jbuf.h"

#define S3_XML_DEPTH 16

/*
 * The text of the first element at `path` (names separated by '/', the
 * first being the root element's), decoded, into buf (NUL-terminated).
 * Returns its length, -ENOENT if there is no such element, -EBADMSG if the
 * body is not well-formed anywhere (a body cut short is refused even where
 * the element came before the cut), -ENAMETOOLONG if the text does not fit.  An element holding child elements has no text: its
 * text is what lies outside them (usually "").
 */
int s3_xml_text(const char *body, size_t len, const char *path, char *buf, size_t buflen);

/*
 * Calls fn for every element at `path`, with the element's inner content
 * (between its start and end tags; "" for <X/>), in document order, so
 * that fn can read its children with s3_xml_text(inner, inner_len, "Child",
 * ...) -- paths inside the slice start below the element.  Stops at fn's
 * first non-zero return and returns it; else the number of elements
 * visited, or -EBADMSG (checked before fn is first called).
 */
int s3_xml_each(const char *body, size_t len, const char *path,
		int (*fn)(void *ud, const char *inner, size_t inner_len), void *ud);

/* A part of a multipart upload, as CompleteMultipartUpload lists it. */
struct s3_part_done {
	uint32_t number;  /* 1..10000 */
	char etag[132];   /* as S3 returned it, quotes included */
	uint32_t crc32c;  /* of the part's bytes */
};

/*
 * Appends the CompleteMultipartUpload document for parts[0..n) (sorted by
 * number, as S3 requires) to b, each with its ETag and ChecksumCRC32C.
 * Characters XML reserves are escaped.
 */
void s3_complete_xml(struct jbuf *b, const struct s3_part_done *parts, uint32_t n);

/*
 * Appends the DeleteObjects document for keys[0..n) (n <= 1000, as S3
 * allows) to b, in quiet mode: the answer lists only the keys that could
 * not be deleted.  Characters XML reserves are escaped.
 */
void s3_delete_xml(struct jbuf *b, const char *const *keys, size_t n);

/* The base64 of a CRC32C as S3's x-amz-checksum-crc32c wants it: the four
 * bytes big-endian, 8 characters and a NUL. */
void s3_crc32c_b64(uint32_t crc, char out[9]);

/*
 * S3's error code and message in the answer to `method` with `status`:
 * read from an <Error> body on a status of 300 or more, and on a 2xx to
 * anything but a GET (CompleteMultipartUpload answers 200 with <Error>
 * when it fails after it began; a GET's body is the object, whatever it
 * holds).  "" where there is none (body NULL, not XML, no Error/Code).
 */
void s3_answer_error(const char *method, long status, const char *body, size_t len, char *code,
		     size_t codelen, char *msg, size_t msglen);

#endif
