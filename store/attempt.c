/* SPDX-License-Identifier: MIT */
/* attempt.c - work-area documents (attempt.h). */
#include "store/attempt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static bool str_is(json_t *o, const char *key, const char *want)
{
	const char *v = json_string_value(json_object_get(o, key));
	return v && strcmp(v, want) == 0;
}

static bool int_is(json_t *o, const char *key, uint64_t want)
{
	json_t *v = json_object_get(o, key);
	return json_is_integer(v) && json_integer_value(v) >= 0 &&
	       (uint64_t)json_integer_value(v) == want;
}

char *store_attempt_text(const struct store_key *k, const char *id,
			 const struct store_writer *self, uid_t uid)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:{s:s, s:s}, s:I}",
			      "format", "ckpt-attempt-1", "id", id, "job", k->job, "run", k->run,
			      "name", k->name, "step", (json_int_t)k->step, "attempt",
			      (json_int_t)k->attempt, "world", (json_int_t)k->world, "uid",
			      (json_int_t)uid, "daemon", "id", self->id, "instance",
			      self->instance, "created", (json_int_t)time(NULL));
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	return text;
}

int store_attempt_judge(const char *text, size_t len, const struct store_key *k, const char *id,
			const struct store_writer *self, bool check_uid, uid_t uid)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	int r;

	if (!str_is(j, "format", "ckpt-attempt-1") || !str_is(j, "id", id) ||
	    !str_is(j, "job", k->job) || !str_is(j, "run", k->run) ||
	    !str_is(j, "name", k->name) || !int_is(j, "step", k->step) ||
	    !int_is(j, "attempt", k->attempt) || !int_is(j, "world", k->world))
		r = -EEXIST;
	else if (check_uid && !int_is(j, "uid", uid))
		r = -EPERM;
	else {
		json_t *d = json_object_get(j, "daemon");
		r = str_is(d, "id", self->id) && !str_is(d, "instance", self->instance) ? 1 : 0;
	}
	json_decref(j);
	return r;
}

int store_claim_new(const struct store_writer *self, char nonce[STORE_ID_LEN + 1], char **ret)
{
	unsigned char rnd[16];
	json_t *j;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EIO;
	for (int i = 0; i < 16; i++)
		snprintf(nonce + 2 * i, 3, "%02x", rnd[i]);
	j = json_pack("{s:s, s:s, s:s, s:I}", "nonce", nonce, "daemon", self->id, "instance",
		      self->instance, "time", (json_int_t)time(NULL));
	*ret = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return *ret ? 0 : -ENOMEM;
}

int store_claim_nonce(const char *text, size_t len, char ret[STORE_ID_LEN + 1])
{
	json_t *j = json_loadb(text, len, 0, NULL);
	const char *nonce = json_string_value(json_object_get(j, "nonce"));
	int r = nonce && strlen(nonce) == STORE_ID_LEN ? 0 : -EBADMSG;

	if (r == 0)
		memcpy(ret, nonce, STORE_ID_LEN + 1);
	json_decref(j);
	return r;
}

bool store_claim_foreign(const char *text, size_t len, const char *self_id)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	const char *by = json_string_value(json_object_get(j, "daemon"));
	bool foreign = !by || strcmp(by, self_id) != 0;

	json_decref(j);
	return foreign;
}

bool store_index_addressed(const char *text, size_t len, const char *nonce)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	bool ok = str_is(j, "to", nonce);

	json_decref(j);
	return ok;
}

static bool in_sorted(const uint32_t *v, size_t n, uint32_t x)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (v[mid] == x)
			return true;
		if (v[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

int store_count_delivered(index_fetch_fn fetch, void *ud, uint32_t world, const char *nonce,
			  const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			  size_t errlen)
{
	while (*io_n < world) {
		char *text, why[384] = "";
		size_t len;
		bool ok;
		int r;

		if (in_sorted(local, n_local, *io_n)) {
			(*io_n)++;
			continue;
		}
		r = fetch(ud, *io_n, &text, &len, why, sizeof(why));
		if (r == -ENOENT)
			break;
		if (r < 0) {
			snprintf(err, errlen, "rank %u: %s", *io_n, why[0] ? why : strerror(-r));
			return r;
		}
		/* Only an index addressed to this claim counts. */
		ok = store_index_addressed(text, len, nonce);
		free(text);
		if (!ok)
			break;
		(*io_n)++;
	}
	return 0;
}
