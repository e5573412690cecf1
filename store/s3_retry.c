/* SPDX-License-Identifier: MIT */
/* s3_retry.c - retry classification and backoff for S3 requests (s3_retry.h). */
#include <errno.h>
#include <string.h>

#include "store/s3_retry.h"

/* S3 codes that mean "the service could not do it now". */
static const char *const later_codes[] = {
	"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable",
	"OperationAborted", "RequestTimeoutException", "Throttling", "ThrottlingException",
	"BadDigest", "IncompleteBody", "XAmzContentSHA256Mismatch",
	/* a conditional PUT meeting one of ours still in progress */
	"ConditionalRequestConflict",
};

static bool later(const char *code)
{
	for (size_t i = 0; i < sizeof(later_codes) / sizeof(later_codes[0]); i++)
		if (!strcmp(code, later_codes[i]))
			return true;
	return false;
}

enum s3_verdict s3_classify(enum s3_transport net, long status, const char *code)
{
	if (!code)
		code = "";
	if (net != S3_NET_OK)
		return net == S3_NET_OTHER ? S3_FAIL : S3_RETRY;
	if (*code)
		return later(code) ? S3_RETRY : S3_FAIL;
	if (status >= 200 && status < 300)
		return S3_DONE;
	if (status == 500 || status == 502 || status == 503 || status == 504 || status == 429)
		return S3_RETRY;
	return S3_FAIL;
}

int s3_errno(enum s3_transport net, long status, const char *code)
{
	if (!code)
		code = "";
	switch (net) {
	case S3_NET_TIMEOUT: return -ETIMEDOUT;
	case S3_NET_RESET: return -ECONNRESET;
	case S3_NET_TRUNCATED: return -EPROTO;
	case S3_NET_OTHER: return -EIO;
	case S3_NET_OK: break;
	}
	if (!strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchUpload") ||
	    !strcmp(code, "NoSuchBucket") || status == 404)
		return -ENOENT;
	if (!strcmp(code, "AccessDenied") || !strcmp(code, "InvalidAccessKeyId") ||
	    !strcmp(code, "SignatureDoesNotMatch") || !strcmp(code, "ExpiredToken") ||
	    !strcmp(code, "InvalidToken") || status == 403 || status == 401)
		return -EACCES;
	if (!strcmp(code, "EntityTooLarge") || !strcmp(code, "EntityTooSmall"))
		return -EFBIG;
	if (!strcmp(code, "PreconditionFailed") || status == 412)
		return -EEXIST;
	if (!strcmp(code, "BadDigest") || !strcmp(code, "InvalidDigest"))
		return -EBADMSG;
	if (!strcmp(code, "SlowDown") || status == 503)
		return -EAGAIN;
	if (status == 400)
		return -EINVAL;
	return -EIO;
}

uint64_t s3_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms, uint64_t *seed)
{
	uint64_t top = base_ms, x = *seed ? *seed : 0x9e3779b97f4a7c15ull;

	for (unsigned i = 1; i < attempt && top < cap_ms; i++)
		top *= 2;
	if (top > cap_ms)
		top = cap_ms;
	/* xorshift64 */
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*seed = x;
	return top ? x % (top + 1) : 0;
}
