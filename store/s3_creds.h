/* SPDX-License-Identifier: MIT */
/*
 * s3_creds.h - the credentials and region S3 requests are signed with.
 *
 * From the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN; AWS_REGION, else AWS_DEFAULT_REGION; the endpoint from
 * AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL), or from a credentials file
 * in the AWS shared-credentials form ("[profile]" sections of
 * "key = value" lines) when the config names one.
 *
 * One source gives the whole key pair and its session token, never a mix
 * (a key id of one with the secret of another signs nothing, and a token
 * belongs to the pair it was issued with): the environment when it sets
 * AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY (then both, or it is an
 * error), else the file's profile (both keys, or an error).  Region and
 * endpoint: the environment's, else the file's.
 *
 * Secrets stay in this struct: nothing here prints them, and s3_creds_wipe()
 * clears them before the memory is reused.  A credentials file must be a
 * regular file that group and others cannot read or write (as ssh insists
 * for its keys), and at most S3_CREDS_FILE_MAX bytes.
 */
#ifndef CKPT_STORE_S3_CREDS_H
#define CKPT_STORE_S3_CREDS_H

#include <stdbool.h>
#include <stddef.h>

#define S3_CREDS_FILE_MAX (64u << 10)

struct s3_creds {
	char key_id[129];
	char secret[129];
	char token[4097];   /* "" if none */
	char region[64];    /* "" if neither variable nor file says */
	char endpoint[256]; /* "" if neither says */
};

/*
 * Fills *ret from getenv-like `get` (NULL: the process environment) and
 * `file` (NULL: none; read whenever named) with its `profile` (NULL or "":
 * "default"), in the order above.  Returns 0; -ENOENT if no pair was found
 * (or the file, or its profile when the pair must come from it, is
 * missing); -EACCES if the file is readable or writable by others; -EINVAL
 * for half a pair, a token without a pair, a malformed file or a value
 * too long (the reason in err: never a secret's value).
 */
int s3_creds_load(const char *(*get)(const char *name), const char *file, const char *profile,
		  struct s3_creds *ret, char *err, size_t errlen);

/* Clears the secrets (memset that the compiler keeps). */
void s3_creds_wipe(struct s3_creds *c);

#endif
