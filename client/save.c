/* SPDX-License-Identifier: MIT */
/*
 * save.c - the save API (begin, add_*, commit, free) and the save thread.
 *
 * The caller's thread only records what to save: names, shapes and data
 * pointers.  ckpt_save_commit() queues the save and returns; the save thread
 * does the layout, the safetensors header and the descriptor, hands the
 * descriptor to the daemon, and publishes the save's extents to the copy
 * threads (copy.c).  One save stages at a time, in commit order; the daemon's
 * write and commit of a save overlap the staging of the next.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client/internal.h"
#include "format/desc.h"
#include "format/names.h"
#include "format/safetensors.h"

/* ---- lifetime ---- */

static void save_destroy(struct ckpt_save *s)
{
	layout_free(&s->layout);
	free(s->src);
	free(s->set);
	free(s->hdr);
	future_destroy(&s->staged);
	future_destroy(&s->committed_f);
	free(s);
}

void save_unref(struct ckpt_save *s)
{
	/* Partner: every other decrement; the last one sees all writes. */
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
		save_destroy(s);
}

void ckpt_save_free(struct ckpt_save *save)
{
	if (save)
		save_unref(save);
}

int ckpt_save_begin(struct ckpt_client *client, const char *root, const char *name,
		    uint64_t step, struct ckpt_save **ret_save)
{
	struct ckpt_save *s;
	char err[256];
	int r;

	if (!client || !ret_save) {
		cli_set_error("ckpt_save_begin: client or ret_save is NULL");
		return -EINVAL;
	}
	if (!name_checkpoint_ok(name, err, sizeof(err))) {
		cli_set_error("ckpt_save_begin: %s", err);
		return -EINVAL;
	}
	if (!name_root_ok(root, err, sizeof(err))) {
		cli_set_error("ckpt_save_begin: %s", err);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		goto out_nomem;
	s->client = client;
	atomic_init(&s->refs, 1);
	r = future_init(&s->staged);
	if (r < 0) {
		free(s);
		goto out_nomem;
	}
	r = future_init(&s->committed_f);
	if (r < 0) {
		future_destroy(&s->staged);
		free(s);
		goto out_nomem;
	}
	r = layout_init(&s->layout, root, name, step);
	if (r < 0) {
		save_destroy(s);
		goto out_nomem;
	}
	*ret_save = s;
	return 0;

out_nomem:
	cli_set_error("ckpt_save_begin: out of memory");
	return -ENOMEM;
}

/* ---- metadata and metrics ---- */

/* Returns the object `*slot`, creating it if the layout has none yet. */
static json_t *meta_object(void **slot)
{
	if (!*slot)
		*slot = json_object();
	return *slot;
}

static int meta_check(struct ckpt_save *save, const char *fn, const char *key, json_t *obj)
{
	char err[256];

	if (save->committed) {
		cli_set_error("%s: the save is already committed", fn);
		return -EBUSY;
	}
	if (!name_item_ok(key, err, sizeof(err))) {
		cli_set_error("%s: %s", fn, err);
		return -EINVAL;
	}
	if (!obj) {
		cli_set_error("%s: out of memory", fn);
		return -ENOMEM;
	}
	if (json_object_get(obj, key)) {
		cli_set_error("%s: key '%s' is already set", fn, key);
		return -EEXIST;
	}
	if (json_object_size(obj) >= CKPT_MAX_META_KEYS) {
		cli_set_error("%s: more than %u keys", fn, CKPT_MAX_META_KEYS);
		return -E2BIG;
	}
	return 0;
}

int ckpt_save_set_metadata(struct ckpt_save *save, const char *key, const char *value)
{
	json_t *obj, *v;
	int r;

	if (!save || !key || !value) {
		cli_set_error("ckpt_save_set_metadata: NULL argument");
		return -EINVAL;
	}
	obj = save->committed ? NULL : meta_object(&save->layout.meta);
	r = meta_check(save, "ckpt_save_set_metadata", key, obj);
	if (r < 0)
		return r;
	size_t vlen = strlen(value);
	if (vlen > CKPT_MAX_META_LEN) {
		cli_set_error("ckpt_save_set_metadata: value of '%s' is %zu bytes, at most %u", key,
			      vlen, CKPT_MAX_META_LEN);
		return -EINVAL;
	}
	v = json_stringn(value, vlen);
	if (!v) {
		cli_set_error("ckpt_save_set_metadata: value of '%s' is not valid UTF-8", key);
		return -EINVAL;
	}
	if (json_object_set_new(obj, key, v) < 0) {
		cli_set_error("ckpt_save_set_metadata: out of memory");
		return -ENOMEM;
	}
	return 0;
}

int ckpt_save_set_metric(struct ckpt_save *save, const char *key, double value)
{
	json_t *obj, *v;
	int r;

	if (!save || !key) {
		cli_set_error("ckpt_save_set_metric: NULL argument");
		return -EINVAL;
	}
	obj = save->committed ? NULL : meta_object(&save->layout.metrics);
	r = meta_check(save, "ckpt_save_set_metric", key, obj);
	if (r < 0)
		return r;
	if (!isfinite(value)) {
		cli_set_error("ckpt_save_set_metric: metric '%s' is not a finite number", key);
		return -EINVAL;
	}
	v = json_real(value);
	if (!v || json_object_set_new(obj, key, v) < 0) {
		cli_set_error("ckpt_save_set_metric: out of memory");
		return -ENOMEM;
	}
	return 0;
}

/* ---- items ---- */

static uint64_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h ^ (h >> 29);
}

/* Returns the slot of `name` in the set: where it is, or the empty slot
 * where it would go.  The set is never full (load <= 1/2). */
static size_t set_slot(const struct ckpt_save *s, const char *name)
{
	size_t mask = s->set_cap - 1;
	size_t i = (size_t)name_hash(name) & mask;

	while (s->set[i] && strcmp(s->layout.items[s->set[i] - 1].name, name) != 0)
		i = (i + 1) & mask;
	return i;
}

static bool set_contains(const struct ckpt_save *s, const char *name)
{
	return s->set_cap && s->set[set_slot(s, name)] != 0;
}

/* Makes room for one more entry (and one more src entry). */
static int set_reserve(struct ckpt_save *s)
{
	size_t n = s->layout.n_items;

	if (n + 1 > s->cap_src) {
		size_t cap = s->cap_src ? s->cap_src * 2 : 64;
		struct save_src *src = realloc(s->src, cap * sizeof(*src));
		if (!src)
			return -ENOMEM;
		s->src = src;
		s->cap_src = cap;
	}
	if ((n + 1) * 2 > s->set_cap) {
		size_t cap = s->set_cap ? s->set_cap * 2 : 128;
		uint32_t *old = s->set;
		size_t old_cap = s->set_cap;
		uint32_t *set = calloc(cap, sizeof(*set));
		if (!set)
			return -ENOMEM;
		s->set = set;
		s->set_cap = cap;
		for (size_t i = 0; i < old_cap; i++)
			if (old[i])
				s->set[set_slot(s, s->layout.items[old[i] - 1].name)] = old[i];
		free(old);
	}
	return 0;
}

/* Appends an item through layout_add and records its source.  The name was
 * checked for uniqueness by the caller. */
static int add_item(struct ckpt_save *s, const char *fn, enum item_kind kind, const char *name,
		    enum ckpt_dtype dtype, unsigned ndim, const uint64_t *shape,
		    const uint64_t *gshape, const uint64_t *offs, const void *data,
		    const struct copy_engine *engine)
{
	char err[256];
	size_t idx = s->layout.n_items;
	int r;

	if (idx >= CKPT_MAX_ITEMS) {
		cli_set_error("%s: more than %u tensors and blobs in one save", fn, CKPT_MAX_ITEMS);
		return -E2BIG;
	}
	r = set_reserve(s);
	if (r < 0) {
		cli_set_error("%s: out of memory", fn);
		return r;
	}
	err[0] = '\0';
	r = layout_add(&s->layout, kind, name, dtype, ndim, shape, gshape, offs, err, sizeof(err));
	if (r < 0) {
		if (r == -ENOMEM)
			cli_set_error("%s: out of memory", fn);
		else
			cli_set_error("%s: %s", fn, err[0] ? err : strerror(-r));
		return r;
	}
	s->src[idx].data = data;
	s->src[idx].engine = engine;
	s->set[set_slot(s, s->layout.items[idx].name)] = (uint32_t)idx + 1;
	return 0;
}

/* Checks what layout_add also checks, so that skipped replicas are held to
 * the same rules as written chunks. */
static int check_tensor(const struct ckpt_tensor *t, uint64_t *ret_bytes)
{
	char err[256];
	uint64_t bytes;

	if (!name_item_ok(t->name, err, sizeof(err))) {
		cli_set_error("ckpt_save_add_tensor: %s", err);
		return -EINVAL;
	}
	if ((unsigned)t->dtype >= CKPT_DTYPE_COUNT) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': unknown dtype %d", t->name,
			      (int)t->dtype);
		return -EINVAL;
	}
	if (t->ndim > CKPT_MAX_NDIM) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': %u dimensions, at most %u",
			      t->name, t->ndim, CKPT_MAX_NDIM);
		return -EINVAL;
	}
	if (t->ndim && !t->shape) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': shape is NULL", t->name);
		return -EINVAL;
	}
	if (!t->global_shape != !t->offsets) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': global_shape and offsets must "
			      "both be given or both be NULL", t->name);
		return -EINVAL;
	}
	bytes = ckpt_dtype_size(t->dtype);
	for (unsigned d = 0; d < t->ndim; d++) {
		if (__builtin_mul_overflow(bytes, t->shape[d], &bytes)) {
			cli_set_error("ckpt_save_add_tensor: tensor '%s': size overflows", t->name);
			return -EINVAL;
		}
		if (t->global_shape &&
		    (t->offsets[d] > t->global_shape[d] ||
		     t->shape[d] > t->global_shape[d] - t->offsets[d])) {
			cli_set_error("ckpt_save_add_tensor: tensor '%s': dimension %u: chunk "
				      "[%llu, +%llu) lies outside the global size %llu", t->name, d,
				      (unsigned long long)t->offsets[d],
				      (unsigned long long)t->shape[d],
				      (unsigned long long)t->global_shape[d]);
			return -EINVAL;
		}
	}
	if (bytes > (uint64_t)INT64_MAX) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': size overflows", t->name);
		return -EINVAL;
	}
	if (bytes && !t->data) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': data is NULL", t->name);
		return -EINVAL;
	}
	*ret_bytes = bytes;
	return 0;
}

int ckpt_save_add_tensor(struct ckpt_save *save, const struct ckpt_tensor *tensor)
{
	const struct copy_engine *engine;
	char err[256];
	uint64_t bytes;
	int r;

	if (!save || !tensor) {
		cli_set_error("ckpt_save_add_tensor: NULL argument");
		return -EINVAL;
	}
	if (save->committed) {
		cli_set_error("ckpt_save_add_tensor: the save is already committed");
		return -EBUSY;
	}
	r = check_tensor(tensor, &bytes);
	if (r < 0)
		return r;
	engine = copy_engine_select(tensor->device, tensor->device_index, &r, err, sizeof(err));
	if (!engine) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': %s", tensor->name, err);
		return r;
	}
	/* Data-parallel copies: replica 0 writes the chunk for everyone. */
	if (tensor->replica != 0)
		return 0;
	if (set_contains(save, tensor->name)) {
		cli_set_error("ckpt_save_add_tensor: name '%s' is already in this save",
			      tensor->name);
		return -EEXIST;
	}
	return add_item(save, "ckpt_save_add_tensor", ITEM_TENSOR, tensor->name, tensor->dtype,
			tensor->ndim, tensor->shape, tensor->global_shape, tensor->offsets,
			tensor->data, engine);
}

int ckpt_save_add_blob(struct ckpt_save *save, const char *key, const void *data, size_t len)
{
	char err[256];
	uint64_t shape;

	if (!save) {
		cli_set_error("ckpt_save_add_blob: save is NULL");
		return -EINVAL;
	}
	if (save->committed) {
		cli_set_error("ckpt_save_add_blob: the save is already committed");
		return -EBUSY;
	}
	if (!name_item_ok(key, err, sizeof(err))) {
		cli_set_error("ckpt_save_add_blob: %s", err);
		return -EINVAL;
	}
	if (len && !data) {
		cli_set_error("ckpt_save_add_blob: blob '%s': data is NULL", key);
		return -EINVAL;
	}
	if ((uint64_t)len > (uint64_t)INT64_MAX) {
		cli_set_error("ckpt_save_add_blob: blob '%s' is too large", key);
		return -EINVAL;
	}
	if (set_contains(save, key)) {
		cli_set_error("ckpt_save_add_blob: name '%s' is already in this save", key);
		return -EEXIST;
	}
	shape = len;
	return add_item(save, "ckpt_save_add_blob", ITEM_BLOB, key, CKPT_U8, 1, &shape, NULL, NULL,
			data, &copy_engine_host);
}

/* ---- commit ---- */

int ckpt_save_commit(struct ckpt_save *save, struct ckpt_future **ret_staged,
		     struct ckpt_future **ret_committed)
{
	struct ckpt_client *c;

	if (!save || !ret_staged || !ret_committed) {
		cli_set_error("ckpt_save_commit: NULL argument");
		return -EINVAL;
	}
	c = save->client;
	pthread_mutex_lock(&c->lock);
	if (save->committed) {
		pthread_mutex_unlock(&c->lock);
		cli_set_error("ckpt_save_commit: the save is already committed");
		return -EBUSY;
	}
	if (c->dead || c->stopping) {
		cli_set_error("ckpt_save_commit: %s",
			      c->dead ? c->dead_msg : "the client is disconnecting");
		pthread_mutex_unlock(&c->lock);
		return -ENOTCONN;
	}
	save->committed = true;
	save->token = c->next_token++;
	if (c->next_token == 0)
		c->next_token = 1;
	atomic_fetch_add(&save->refs, 1); /* the pipeline's */
	save->q_next = NULL;
	if (c->q_tail)
		c->q_tail->q_next = save;
	else
		c->q_head = save;
	c->q_tail = save;
	c->staging++;
	pthread_cond_broadcast(&c->save_cv);
	pthread_mutex_unlock(&c->lock);

	*ret_staged = &save->staged;
	*ret_committed = &save->committed_f;
	return 0;
}

/* ---- the save thread ---- */

/* Fails a save that never published extents: both futures, staged first.
 * Caller holds c->lock. */
static void fail_unstarted_locked(struct ckpt_save *s, int err, const char *msg)
{
	s->staging_done = true;
	future_complete(&s->staged, err, msg);
	future_complete(&s->committed_f, err, msg);
}

/* Lays the save out and builds its descriptor.  Returns 0, or -errno with
 * the reason in msg. */
static int prepare(struct ckpt_client *c, struct ckpt_save *s, char **ret_desc, size_t *ret_len,
		   char *msg, size_t msglen)
{
	char *json = NULL;
	size_t json_len;
	int r;

	r = layout_pack(&s->layout);
	if (r < 0) {
		snprintf(msg, msglen, "save '%s': laying out the shard: %s", s->layout.name,
			 strerror(-r));
		return r;
	}
	r = st_header_json(&s->layout, c->rank, &json, &json_len);
	if (r < 0) {
		snprintf(msg, msglen, "save '%s': building the safetensors header: %s",
			 s->layout.name, strerror(-r));
		return r;
	}
	r = layout_place(&s->layout, json_len);
	if (r < 0) {
		snprintf(msg, msglen, "save '%s': placing the shard: %s", s->layout.name,
			 strerror(-r));
		goto out_json;
	}
	s->hdr = malloc(s->layout.data_start);
	if (!s->hdr) {
		r = -ENOMEM;
		snprintf(msg, msglen, "save '%s': out of memory for the header", s->layout.name);
		goto out_json;
	}
	st_header_write(&s->layout, json, json_len, s->hdr);
	r = desc_build(&s->layout, ret_desc, ret_len);
	if (r < 0)
		snprintf(msg, msglen, "save '%s': building the descriptor: %s", s->layout.name,
			 strerror(-r));
out_json:
	free(json);
	return r;
}

bool save_stage_end_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	bool abort_it = false;

	if (s->staging_done)
		return false;
	if (s->sent != s->n_ext) {
		if (!s->failed) {
			s->failed = true;
			s->fail_err = -ECONNRESET;
			proto_set_msg(s->fail_msg, c->dead_msg);
		}
		/* The daemon has not finished the save on its own: tell it we
		 * give up, and stop waiting for its SAVE_DONE. */
		abort_it = !c->dead && !s->has_done;
		save_finish_locked(c, s, s->fail_err, s->fail_msg);
	}
	s->staging_done = true;
	if (s->failed && s->sent != s->n_ext)
		future_complete(&s->staged, s->fail_err, s->fail_msg);
	else
		future_complete(&s->staged, 0, NULL);
	if (s->has_done)
		future_complete(&s->committed_f, s->done_err, s->done_msg);
	return abort_it;
}

static void run_save(struct ckpt_client *c, struct ckpt_save *s)
{
	struct proto_save_begin begin;
	char msg[PROTO_MSG_LEN];
	char *desc = NULL;
	size_t desc_len = 0;
	uint64_t n;
	int64_t first;
	int r;

	pthread_mutex_lock(&c->lock);
	if (c->dead) {
		fail_unstarted_locked(s, -ECONNRESET, c->dead_msg);
		goto out_unlock;
	}
	pthread_mutex_unlock(&c->lock);

	r = prepare(c, s, &desc, &desc_len, msg, sizeof(msg));
	pthread_mutex_lock(&c->lock);
	if (r < 0) {
		fail_unstarted_locked(s, r, msg);
		goto out_unlock;
	}

	n = cli_div_up(desc_len, c->slot_bytes);
	if (n == 0 || n > c->slots.n_slots) {
		snprintf(msg, sizeof(msg), "save '%s': its descriptor (%zu bytes for %zu items) "
			 "does not fit the %llu-byte staging arena", s->layout.name, desc_len,
			 s->layout.n_items, (unsigned long long)c->arena_bytes);
		fail_unstarted_locked(s, -E2BIG, msg);
		goto out_unlock;
	}
	while ((first = arena_slots_take(&c->slots, (uint32_t)n)) < 0 && !c->dead)
		pthread_cond_wait(&c->slot_cv, &c->lock);
	if (first < 0) {
		fail_unstarted_locked(s, -ECONNRESET, c->dead_msg);
		goto out_unlock;
	}
	s->desc_first = (uint32_t)first;
	s->desc_count = (uint32_t)n;
	s->acked = false;
	c->awaiting_ack = s;
	pthread_mutex_unlock(&c->lock);

	memcpy((char *)c->arena + (uint64_t)first * c->slot_bytes, desc, desc_len);
	free(desc);
	desc = NULL;
	proto_init(&begin.h, PROTO_SAVE_BEGIN, sizeof(begin));
	begin.token = s->token;
	begin.desc_off = (uint64_t)first * c->slot_bytes;
	begin.desc_len = desc_len;
	r = proto_send(c->sock, &begin, sizeof(begin), -1);

	pthread_mutex_lock(&c->lock);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "sending SAVE_BEGIN: %s", strerror(-r));
		cli_conn_dead_locked(c, msg);
	}
	while (!s->acked && !c->dead)
		pthread_cond_wait(&c->save_cv, &c->lock);
	if (!s->acked) {
		if (c->awaiting_ack == s)
			c->awaiting_ack = NULL;
		fail_unstarted_locked(s, -ECONNRESET, c->dead_msg);
		goto out_unlock;
	}
	if (s->ack_err) {
		if (!s->ack_msg[0])
			snprintf(s->ack_msg, sizeof(s->ack_msg), "ckptd refused save '%s': %s",
				 s->layout.name, strerror(-s->ack_err));
		fail_unstarted_locked(s, s->ack_err, s->ack_msg);
		goto out_unlock;
	}

	/* Accepted (the receiver put it on the pending list): hand the
	 * extents to the copy threads and wait until none works on it. */
	s->n_ext = cli_div_up(s->layout.file_size, c->slot_bytes);
	s->next_ext = s->sent = s->inflight = 0;
	c->active = s;
	pthread_cond_broadcast(&c->copy_cv);
	while (!((s->next_ext == s->n_ext || s->failed || c->dead) && s->inflight == 0))
		pthread_cond_wait(&c->save_cv, &c->lock);
	c->active = NULL;
	bool abort_it = save_stage_end_locked(c, s);
	pthread_mutex_unlock(&c->lock);

	if (abort_it) {
		struct proto_save_abort ab;
		proto_init(&ab.h, PROTO_SAVE_ABORT, sizeof(ab));
		ab.token = s->token;
		r = proto_send(c->sock, &ab, sizeof(ab), -1);
		if (r < 0) {
			pthread_mutex_lock(&c->lock);
			snprintf(msg, sizeof(msg), "sending SAVE_ABORT: %s", strerror(-r));
			cli_conn_dead_locked(c, msg);
			pthread_mutex_unlock(&c->lock);
		}
	}
	goto out;

out_unlock:
	pthread_mutex_unlock(&c->lock);
out:
	free(desc);
	/* Copy threads are done with the header; the daemon has its bytes. */
	free(s->hdr);
	s->hdr = NULL;
}

void *save_thread_main(void *arg)
{
	struct ckpt_client *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct ckpt_save *s;

		while (!c->q_head && !c->stopping)
			pthread_cond_wait(&c->save_cv, &c->lock);
		s = c->q_head;
		if (!s)
			break;
		c->q_head = s->q_next;
		if (!c->q_head)
			c->q_tail = NULL;
		s->q_next = NULL;
		pthread_mutex_unlock(&c->lock);

		run_save(c, s);

		pthread_mutex_lock(&c->lock);
		c->staging--;
		pthread_cond_broadcast(&c->save_cv);
		pthread_mutex_unlock(&c->lock);
		save_unref(s); /* the pipeline's reference */
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}
