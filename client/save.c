/* SPDX-License-Identifier: MIT */
/*
 * save.c - the save API (begin, add_*, commit, free), the save state
 * machine, and the save thread.
 *
 * The caller's thread only records what to save: names, shapes and data
 * pointers.  ckpt_save_commit() queues the save and returns; the save thread
 * does the layout, the safetensors header and the descriptor, hands the
 * descriptor to the daemon, and publishes the save's extents to the copy
 * threads (copy.c).  One save stages at a time, in commit order; the daemon's
 * write and commit of a save overlap the staging of the next.
 *
 * Copies start as soon as SAVE_BEGIN is out, not when the daemon accepts it:
 * the answer waits for the daemon to create the shard file on a worker
 * thread (1-5 ms, a few percent of a 2 GiB staging).  Slots filled before
 * then are parked (client.parked) and sent by the save thread once the
 * daemon has accepted the save, or given back if it refused.
 *
 * States (internal.h describes each) and who moves a save between them, all
 * under the client lock and all through set_state_locked():
 *
 *   BUILDING   -> QUEUED       ckpt_save_commit (caller)
 *   QUEUED     -> BEGUN        save thread takes it
 *              -> FINISHED     connection already lost
 *   BEGUN      -> STAGING      SAVE_ACK ok (receiver)
 *              -> ABORTING     SAVE_ACK ok after a copy failed (receiver)
 *              -> DRAINING     SAVE_ACK refusal, connection lost, once
 *                              copies may have started
 *              -> FINISHED     layout failed, connection lost before
 *   STAGING    -> STAGED       last extent sent (copy thread)
 *              -> DONE_EARLY   SAVE_DONE ok before that was counted (receiver)
 *              -> ABORTING     a copy failed (copy thread)
 *              -> DRAINING     SAVE_DONE failure, connection lost
 *   DONE_EARLY -> FINISHED     last extent counted
 *              -> DRAINING     a failure after all
 *   ABORTING   -> DRAINING     SAVE_DONE, connection lost
 *              -> FINISHED     no copy in flight any more (save thread;
 *                              then SAVE_ABORT is sent)
 *   DRAINING   -> FINISHED     no copy in flight any more (save thread)
 *   STAGED     -> FINISHED     SAVE_DONE, connection lost, disconnect
 *
 * Futures complete only on the way into STAGED (staged) and FINISHED (staged
 * if not yet, then committed), so staged never completes after committed;
 * and only once no copy thread reads the caller's memory for the save: all
 * extents sent, or (ABORTING/DRAINING) none in flight.  A copy that fails
 * while BEGUN only records the failure: the daemon will answer SAVE_BEGIN
 * either way, and the answer decides between ABORTING and DRAINING.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client/internal.h"
#include "format/desc.h"
#include "format/errmsg.h"
#include "format/names.h"
#include "format/nameset.h"
#include "format/safetensors.h"

/* ---- the state machine ---- */

#define BIT(st) (1u << (st))

static const unsigned allowed[SAVE_STATE_COUNT] = {
	[SAVE_BUILDING] = BIT(SAVE_QUEUED),
	[SAVE_QUEUED] = BIT(SAVE_BEGUN) | BIT(SAVE_FINISHED),
	[SAVE_BEGUN] = BIT(SAVE_STAGING) | BIT(SAVE_ABORTING) | BIT(SAVE_DRAINING) |
		       BIT(SAVE_FINISHED),
	[SAVE_STAGING] = BIT(SAVE_STAGED) | BIT(SAVE_DONE_EARLY) | BIT(SAVE_ABORTING) |
			 BIT(SAVE_DRAINING),
	[SAVE_DONE_EARLY] = BIT(SAVE_FINISHED) | BIT(SAVE_DRAINING),
	[SAVE_ABORTING] = BIT(SAVE_DRAINING) | BIT(SAVE_FINISHED),
	[SAVE_DRAINING] = BIT(SAVE_FINISHED),
	[SAVE_STAGED] = BIT(SAVE_FINISHED),
	[SAVE_FINISHED] = 0,
};

static enum save_state state_of(const struct ckpt_save *s)
{
	return (enum save_state)atomic_load_explicit(&s->state, memory_order_relaxed);
}

/* The daemon holds the save and will report SAVE_DONE. */
static bool awaits_done(enum save_state st)
{
	return st == SAVE_STAGING || st == SAVE_ABORTING || st == SAVE_STAGED;
}

bool save_copying(const struct ckpt_save *s)
{
	enum save_state st = state_of(s);
	return st == SAVE_STAGING || st == SAVE_DONE_EARLY || (st == SAVE_BEGUN && !s->fail_err);
}

bool save_awaits_ack(const struct ckpt_save *s)
{
	return state_of(s) == SAVE_BEGUN;
}

static double ms_since(uint64_t t0)
{
	return (double)(cli_now_ns() - t0) / 1e6;
}

/*
 * The one place a save changes state.  Entering STAGED completes the staged
 * future; entering FINISHED completes staged with staged_err (unless it
 * completed before) and then committed with commit_err, both with msg.
 * Keeps the pending list equal to the [pending] states.  May drop the
 * pending list's reference, the last one: s must not be used afterwards.
 */
static void set_state_locked(struct ckpt_client *c, struct ckpt_save *s, enum save_state to,
			     int staged_err, int commit_err, const char *msg)
{
	enum save_state from = state_of(s);
	bool drop = false;

	assert(allowed[from] & BIT(to));
	/* Log first: a caller that saw a future complete finds its line. */
	bool staging_ends = to == SAVE_STAGED || (to == SAVE_FINISHED && from != SAVE_STAGED);
	if (staging_ends) {
		s->t_staged_ns = cli_now_ns();
		if (to == SAVE_STAGED || staged_err == 0)
			cli_log(CKPT_LOG_DEBUG, "save '%s' (token %u, attempt %u): %llu bytes "
				"staged in %.1f ms", s->layout.name, s->token, s->attempt,
				(unsigned long long)s->layout.file_size,
				ms_since(s->t_commit_ns));
	}
	if (to == SAVE_FINISHED && commit_err)
		cli_log(CKPT_LOG_ERROR, "save '%s' (token %u, attempt %u) failed after %.1f ms: %s",
			s->layout.name, s->token, s->attempt, ms_since(s->t_commit_ns),
			msg ? msg : strerror(-commit_err));
	else if (to == SAVE_FINISHED)
		cli_log(CKPT_LOG_DEBUG, "save '%s' (token %u, attempt %u): committed in %.1f ms "
			"(%.1f ms after staged)", s->layout.name, s->token, s->attempt,
			ms_since(s->t_commit_ns), ms_since(s->t_staged_ns));
	if (staging_ends) {
		/* No copy of s is queued or running any more (a failed save
		 * ends staging only once none is in flight): its start events
		 * are done with, and the client is still there to free them. */
		cli_cuda_save_free(s);
		future_complete(&s->staged, to == SAVE_STAGED ? 0 : staged_err, msg);
	}
	/* Durable never before staged: a SAVE_DURABLE that came while the
	 * last extent was not yet counted completes it now.  At the end it
	 * takes the save's outcome unless it completed before. */
	if (to == SAVE_STAGED && s->durable_seen)
		future_complete(&s->durable, 0, NULL);
	if (to == SAVE_FINISHED) {
		future_complete(&s->durable, commit_err, msg);
		future_complete(&s->committed, commit_err, msg);
	}
	atomic_store_explicit(&s->state, to, memory_order_relaxed);

	if (!awaits_done(from) && awaits_done(to)) {
		atomic_fetch_add(&s->refs, 1);
		s->p_next = c->pending;
		c->pending = s;
	} else if (awaits_done(from) && !awaits_done(to)) {
		struct ckpt_save **pp = &c->pending;
		while (*pp && *pp != s)
			pp = &(*pp)->p_next;
		if (*pp)
			*pp = s->p_next;
		s->p_next = NULL;
		drop = true;
	}
	/* Copy threads wait for slots and work, the save thread for ACK and
	 * the end of staging: each re-checks the state when woken. */
	pthread_cond_broadcast(&c->slot_cv);
	pthread_cond_broadcast(&c->copy_cv);
	pthread_cond_broadcast(&c->save_cv);
	if (drop)
		save_unref(s);
}

static void record_failure(struct ckpt_save *s, int err, const char *msg)
{
	if (!s->fail_err) {
		s->fail_err = err;
		proto_set_msg(s->fail_msg, msg);
	}
}

void save_fail_locked(struct ckpt_client *c, struct ckpt_save *s, int err, const char *msg,
		      bool daemon_done)
{
	switch (state_of(s)) {
	case SAVE_BEGUN:
		if (!daemon_done) {
			/* A copy failed before the daemon answered: its answer
			 * comes all the same, and decides (save_on_ack_locked). */
			record_failure(s, err, msg);
			break;
		}
		if (c->awaiting_ack == s)
			c->awaiting_ack = NULL;
		if (c->active == s) {
			/* Copies may be in flight: the save thread finishes
			 * it once none is. */
			record_failure(s, err, msg);
			set_state_locked(c, s, SAVE_DRAINING, 0, 0, NULL);
			break;
		}
		set_state_locked(c, s, SAVE_FINISHED, err, err, msg);
		break;
	case SAVE_QUEUED:
		set_state_locked(c, s, SAVE_FINISHED, err, err, msg);
		break;
	case SAVE_STAGING:
		record_failure(s, err, msg);
		set_state_locked(c, s, daemon_done ? SAVE_DRAINING : SAVE_ABORTING, 0, 0, NULL);
		break;
	case SAVE_DONE_EARLY:
		record_failure(s, err, msg);
		set_state_locked(c, s, SAVE_DRAINING, 0, 0, NULL);
		break;
	case SAVE_ABORTING:
		record_failure(s, err, msg);
		if (daemon_done)
			set_state_locked(c, s, SAVE_DRAINING, 0, 0, NULL);
		break;
	case SAVE_STAGED:
		set_state_locked(c, s, SAVE_FINISHED, 0, err, msg);
		break;
	case SAVE_BUILDING:  /* not in the pipeline: nothing fails it */
	case SAVE_DRAINING:  /* already failed */
	case SAVE_FINISHED:
	case SAVE_STATE_COUNT:
		break;
	}
}

void save_extent_sent_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	if (++s->sent != s->n_ext)
		return;
	/* Every byte is in the arena: staged, without waiting for the save
	 * thread to wake up. */
	if (state_of(s) == SAVE_STAGING)
		set_state_locked(c, s, SAVE_STAGED, 0, 0, NULL);
	else if (state_of(s) == SAVE_DONE_EARLY)
		set_state_locked(c, s, SAVE_FINISHED, 0, 0, NULL);
}

/* ABORTING or DRAINING with no copy in flight: both futures fail (staged
 * succeeds if every extent went out before the failure).  Returns true if
 * the daemon must be told (SAVE_ABORT). */
static bool save_drained_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	bool tell = state_of(s) == SAVE_ABORTING && !c->dead;

	set_state_locked(c, s, SAVE_FINISHED, s->sent == s->n_ext ? 0 : s->fail_err, s->fail_err,
			 s->fail_msg);
	return tell;
}

int save_on_ack_locked(struct ckpt_client *c, const struct proto_save_result *m, char *detail,
		       size_t dlen)
{
	struct ckpt_save *s = c->awaiting_ack;
	char msg[PROTO_MSG_LEN];

	if (!s || s->token != m->token) {
		snprintf(detail, dlen, "SAVE_ACK for save %u, which awaits no ACK", m->token);
		return -EBADMSG;
	}
	/* The daemon has read the descriptor: its slots are free again,
	 * whether the save was accepted or not. */
	if (arena_slots_put(&c->slots, s->desc_first, s->desc_count) < 0) {
		snprintf(detail, dlen, "descriptor slots of save %u already free", m->token);
		return -EBADMSG;
	}
	c->awaiting_ack = NULL;
	if (m->err == 0) {
		/* The daemon holds the save now: a copy that failed meanwhile
		 * makes it abort (and the daemon is told). */
		s->accepted = true;
		set_state_locked(c, s, s->fail_err ? SAVE_ABORTING : SAVE_STAGING, 0, 0, NULL);
		return 0;
	}
	if (m->msg[0])
		proto_set_msg(msg, m->msg);
	else
		snprintf(msg, sizeof(msg), "ckptd refused save '%s': %s", s->layout.name,
			 strerror(-m->err));
	if (c->active == s) {
		/* The refusal is the reason, whatever a copy said before. */
		s->fail_err = m->err;
		proto_set_msg(s->fail_msg, msg);
		set_state_locked(c, s, SAVE_DRAINING, 0, 0, NULL);
		return 0;
	}
	set_state_locked(c, s, SAVE_FINISHED, m->err, m->err, msg);
	return 0;
}

int save_on_durable_locked(struct ckpt_client *c, const struct proto_save_result *m,
			   char *detail, size_t dlen)
{
	struct ckpt_save *s = c->pending;

	while (s && s->token != m->token)
		s = s->p_next;
	if (!s) {
		/* As for SAVE_DONE: a save given up may still be reported. */
		if (m->token == 0 || m->token >= c->next_token) {
			snprintf(detail, dlen, "SAVE_DURABLE for unknown save %u", m->token);
			return -EBADMSG;
		}
		return 0;
	}
	if (s->durable_seen) {
		snprintf(detail, dlen, "a second SAVE_DURABLE for save %u", m->token);
		return -EBADMSG;
	}
	s->durable_seen = true;
	if (state_of(s) == SAVE_STAGED)
		future_complete(&s->durable, 0, NULL);
	return 0;
}

int save_on_done_locked(struct ckpt_client *c, const struct proto_save_result *m, char *detail,
			size_t dlen)
{
	struct ckpt_save *s = c->pending;
	char msg[PROTO_MSG_LEN];

	while (s && s->token != m->token)
		s = s->p_next;
	if (!s) {
		/* A save this client gave up (SAVE_ABORT) may still be
		 * reported; a token never issued is a protocol error. */
		if (m->token == 0 || m->token >= c->next_token) {
			snprintf(detail, dlen, "SAVE_DONE for unknown save %u", m->token);
			return -EBADMSG;
		}
		return 0;
	}
	if (m->err) {
		if (m->msg[0])
			proto_set_msg(msg, m->msg);
		else
			snprintf(msg, sizeof(msg), "ckptd failed the save: %s", strerror(-m->err));
		save_fail_locked(c, s, m->err, msg, true);
	} else if (state_of(s) == SAVE_STAGING) {
		/* The last EXTENT is out but its copy thread has not counted
		 * it yet: the committed future must wait for the staged one. */
		set_state_locked(c, s, SAVE_DONE_EARLY, 0, 0, NULL);
	} else if (state_of(s) == SAVE_STAGED) {
		set_state_locked(c, s, SAVE_FINISHED, 0, 0, NULL);
	} else {
		/* ABORTING: a copy failed here, so the daemon cannot have had
		 * every byte; keep our failure and stop waiting for it. */
		save_fail_locked(c, s, -EPROTO, "ckptd reported a commit of a save whose staging "
				 "failed", true);
	}
	return 0;
}

void saves_conn_lost_locked(struct ckpt_client *c)
{
	/* Each leaves the pending list (to DRAINING or FINISHED). */
	while (c->pending)
		save_fail_locked(c, c->pending, -ECONNRESET, c->dead_msg, true);
	if (c->awaiting_ack)
		save_fail_locked(c, c->awaiting_ack, -ECONNRESET, c->dead_msg, true);
	/* QUEUED saves fail when the save thread takes them; a DONE_EARLY
	 * save completes when its last extent is counted. */
}

void saves_abandon_locked(struct ckpt_client *c)
{
	static const char why[] = "client disconnected before the daemon reported the commit";

	while (c->pending) {
		struct ckpt_save *s = c->pending;
		atomic_fetch_add(&s->refs, 1); /* s outlives its transitions here */
		save_fail_locked(c, s, -ECONNABORTED, why, true);
		/* Only reachable if a thread stopped mid-save: no copy is in
		 * flight any more (they are joined). */
		if (state_of(s) == SAVE_DRAINING)
			save_drained_locked(c, s);
		save_unref(s);
	}
}

/* ---- lifetime ---- */

static void save_destroy(struct ckpt_save *s)
{
	layout_free(&s->layout);
	free(s->src);
	nameset_free(&s->names);
	free(s->hdr);
	future_destroy(&s->staged);
	future_destroy(&s->committed);
	future_destroy(&s->durable);
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

/* ---- building: begin, and the first failure ---- */

int ckpt_save_begin_opts(struct ckpt_client *client, const struct ckpt_save_opts *opts,
			 struct ckpt_save **ret_save)
{
	struct ckpt_save_opts o;
	struct ckpt_save *s;
	char err[256];
	int r;

	if (!client || !opts || !ret_save) {
		cli_set_error("ckpt_save_begin: client, opts or ret_save is NULL");
		return -EINVAL;
	}
	r = abi_copy_in(&abi_save_opts, &o, opts, "ckpt_save_begin");
	if (r < 0)
		return r;
	if (o.flags) {
		cli_set_error("ckpt_save_begin: unknown flags 0x%x", o.flags);
		return -EINVAL;
	}
	if (!name_checkpoint_ok(o.name, err, sizeof(err))) {
		cli_set_error("ckpt_save_begin: %s", err);
		return -EINVAL;
	}
	if (!name_root_ok(o.root, err, sizeof(err))) {
		cli_set_error("ckpt_save_begin: %s", err);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		goto out_nomem;
	s->client = client;
	atomic_init(&s->refs, 1);
	atomic_init(&s->state, SAVE_BUILDING);
	r = future_init(&s->staged);
	if (r < 0) {
		free(s);
		goto out_nomem;
	}
	r = future_init(&s->committed);
	if (r < 0) {
		future_destroy(&s->staged);
		free(s);
		goto out_nomem;
	}
	r = future_init(&s->durable);
	if (r < 0) {
		future_destroy(&s->staged);
		future_destroy(&s->committed);
		free(s);
		goto out_nomem;
	}
	r = layout_init(&s->layout, o.root, o.name, o.step);
	if (r < 0) {
		save_destroy(s);
		goto out_nomem;
	}
	pthread_mutex_lock(&client->lock);
	s->attempt = cli_attempt_locked(client, o.name);
	pthread_mutex_unlock(&client->lock);
	*ret_save = s;
	return 0;

out_nomem:
	cli_set_error("ckpt_save_begin: out of memory");
	return -ENOMEM;
}

int ckpt_save_begin(struct ckpt_client *client, const char *root, const char *name,
		    uint64_t step, struct ckpt_save **ret_save)
{
	struct ckpt_save_opts o = { CKPT_SAVE_OPTS_INIT, .root = root, .name = name, .step = step };

	return ckpt_save_begin_opts(client, &o, ret_save);
}

/* The caller's thread is the only one to change a BUILDING save, so it may
 * read the state without the lock. */
static bool building(const struct ckpt_save *s)
{
	return state_of(s) == SAVE_BUILDING;
}

/*
 * Passes the result r of a set_* / add_* call on; a failure while building
 * makes the save incomplete, remembered with the message of the call
 * (ckpt_last_error(), which names it).  -EBUSY is the save being committed
 * already: nothing to spoil.
 */
static int spoil(struct ckpt_save *s, int r)
{
	if (r < 0 && r != -EBUSY && s && building(s) && !s->poison_err) {
		s->poison_err = r;
		proto_set_msg(s->poison_msg, ckpt_last_error());
	}
	return r;
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

	if (!building(save)) {
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

static int set_metadata(struct ckpt_save *save, const char *key, const char *value)
{
	json_t *obj, *v;
	int r;

	if (!save || !key || !value) {
		cli_set_error("ckpt_save_set_metadata: NULL argument");
		return -EINVAL;
	}
	obj = building(save) ? meta_object(&save->layout.meta) : NULL;
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

int ckpt_save_set_metadata(struct ckpt_save *save, const char *key, const char *value)
{
	return spoil(save, set_metadata(save, key, value));
}

static int set_metric(struct ckpt_save *save, const char *key, double value)
{
	json_t *obj, *v;
	int r;

	if (!save || !key) {
		cli_set_error("ckpt_save_set_metric: NULL argument");
		return -EINVAL;
	}
	obj = building(save) ? meta_object(&save->layout.metrics) : NULL;
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

int ckpt_save_set_metric(struct ckpt_save *save, const char *key, double value)
{
	return spoil(save, set_metric(save, key, value));
}

/* ---- items ---- */

static bool set_contains(const struct ckpt_save *s, const char *name)
{
	return nameset_get(&s->names, name) >= 0;
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
	/* Doubling, so adding n names costs O(n) in all. */
	if (n + 1 > s->names.max)
		return nameset_reserve(&s->names, n + 1 < 64 ? 64 : 2 * (n + 1));
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
	/* The set borrows the layout's copy of the name, which lives as long
	 * as the save. */
	nameset_put(&s->names, s->layout.items[idx].name, (uint32_t)idx);
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


static int add_tensor(struct ckpt_save *save, const struct ckpt_tensor *tensor)
{
	const struct copy_engine *engine;
	struct ckpt_tensor t;
	char err[256];
	uint64_t bytes;
	int r;

	if (!save || !tensor) {
		cli_set_error("ckpt_save_add_tensor: NULL argument");
		return -EINVAL;
	}
	if (!building(save)) {
		cli_set_error("ckpt_save_add_tensor: the save is already committed");
		return -EBUSY;
	}
	r = abi_copy_in(&abi_tensor, &t, tensor, "ckpt_save_add_tensor");
	if (r < 0)
		return r;
	r = check_tensor(&t, &bytes);
	if (r < 0)
		return r;
	engine = copy_engine_select(t.device, t.device_index, &r, err, sizeof(err));
	if (engine == &copy_engine_cuda)
		r = cli_cuda_check(save->client, t.data, bytes, t.device_index, err, sizeof(err));
	if (!engine || r < 0) {
		cli_set_error("ckpt_save_add_tensor: tensor '%s': %s", t.name, err);
		return r;
	}
	/* Data-parallel copies: replica 0 writes the chunk for everyone. */
	if (t.replica != 0)
		return 0;
	if (set_contains(save, t.name)) {
		cli_set_error("ckpt_save_add_tensor: name '%s' is already in this save", t.name);
		return -EEXIST;
	}
	r = add_item(save, "ckpt_save_add_tensor", ITEM_TENSOR, t.name, t.dtype, t.ndim, t.shape,
		     t.global_shape, t.offsets, t.data, engine);
	if (r == 0 && engine == &copy_engine_cuda) {
		struct save_src *src = &save->src[save->layout.n_items - 1];

		src->device = t.device_index;
		src->stream_set = t.cuda_stream != NULL;
		src->stream = t.cuda_stream;
	}
	return r;
}

int ckpt_save_add_tensor(struct ckpt_save *save, const struct ckpt_tensor *tensor)
{
	return spoil(save, add_tensor(save, tensor));
}

static int add_tensors(struct ckpt_save *save, const struct ckpt_tensor *tensors, size_t n)
{
	const unsigned char *at = (const unsigned char *)tensors;
	uint32_t stride;

	if (!save || (n && !tensors)) {
		cli_set_error("ckpt_save_add_tensors: NULL argument");
		return -EINVAL;
	}
	if (!building(save)) {
		cli_set_error("ckpt_save_add_tensors: the save is already committed");
		return -EBUSY;
	}
	if (n == 0)
		return 0;
	/* The array's element size is the caller's sizeof(struct ckpt_tensor),
	 * which CKPT_TENSOR_INIT put into every element's first field (a
	 * size the first element's checks refuse stops the call before the
	 * array is stepped; one that is no multiple of the struct's
	 * alignment is no array of it). */
	memcpy(&stride, at, sizeof(stride));
	if (stride % _Alignof(struct ckpt_tensor) != 0) {
		cli_set_error("ckpt_save_add_tensors: tensor 0 has size %u, not a multiple of %zu: "
			      "initialise every element with CKPT_TENSOR_INIT", stride,
			      _Alignof(struct ckpt_tensor));
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++, at += stride) {
		uint32_t size;
		int r;

		memcpy(&size, at, sizeof(size));
		if (size != stride) {
			cli_set_error("ckpt_save_add_tensors: tensor %zu of %zu has size %u, tensor 0 "
				      "%u: every element of the array must be initialised with "
				      "CKPT_TENSOR_INIT", i, n, size, stride);
			return -EINVAL;
		}
		r = add_tensor(save, (const struct ckpt_tensor *)at);
		if (r < 0) {
			char msg[PROTO_MSG_LEN];
			const char *why = ckpt_last_error();
			static const char prefix[] = "ckpt_save_add_tensor: ";

			if (strncmp(why, prefix, sizeof(prefix) - 1) == 0)
				why += sizeof(prefix) - 1;
			snprintf(msg, sizeof(msg), "%s", why);
			cli_set_error("ckpt_save_add_tensors: tensor %zu of %zu: %s", i, n, msg);
			return r;
		}
	}
	return 0;
}

int ckpt_save_add_tensors(struct ckpt_save *save, const struct ckpt_tensor *tensors, size_t n)
{
	return spoil(save, add_tensors(save, tensors, n));
}

static int add_blob(struct ckpt_save *save, const char *key, const void *data, size_t len)
{
	char err[256];
	uint64_t shape;

	if (!save) {
		cli_set_error("ckpt_save_add_blob: save is NULL");
		return -EINVAL;
	}
	if (!building(save)) {
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

int ckpt_save_add_blob(struct ckpt_save *save, const char *key, const void *data, size_t len)
{
	return spoil(save, add_blob(save, key, data, len));
}

static int set_cuda_stream(struct ckpt_save *save, void *stream)
{
	if (!save) {
		cli_set_error("ckpt_save_set_cuda_stream: save is NULL");
		return -EINVAL;
	}
	if (!building(save)) {
		cli_set_error("ckpt_save_set_cuda_stream: the save is already committed");
		return -EBUSY;
	}
	save->cuda_stream = stream;
	return 0;
}

int ckpt_save_set_cuda_stream(struct ckpt_save *save, void *stream)
{
	return spoil(save, set_cuda_stream(save, stream));
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
	/* Only the caller's thread touches a BUILDING save. */
	if (!building(save)) {
		cli_set_error("ckpt_save_commit: the save is already committed");
		return -EBUSY;
	}
	if (save->poison_err) {
		/* Committing what is left would make a valid checkpoint that
		 * silently lacks an item. */
		cli_set_error("ckpt_save_commit: save '%s' is incomplete and is not committed: %s",
			      save->layout.name, save->poison_msg);
		return save->poison_err;
	}
	/* Here, on the caller's thread, before any copy can start, and without
	 * the client's lock (CUDA calls may wait, e.g. for a full launch
	 * queue): the events that order the device copies after the caller's
	 * work. */
	char err[PROTO_MSG_LEN];
	int r = cli_cuda_commit(c, save, err, sizeof(err));
	if (r < 0) {
		cli_set_error("ckpt_save_commit: save '%s': %s", save->layout.name, err);
		cli_cuda_save_free(save);
		return spoil(save, r);
	}
	pthread_mutex_lock(&c->lock);
	if (c->dead || c->stopping) {
		cli_set_error("ckpt_save_commit: %s",
			      c->dead ? c->dead_msg : "the client is disconnecting");
		pthread_mutex_unlock(&c->lock);
		cli_cuda_save_free(save);
		return -ENOTCONN;
	}
	save->token = c->next_token++;
	if (c->next_token == 0)
		c->next_token = 1;
	save->t_commit_ns = cli_now_ns();
	atomic_fetch_add(&save->refs, 1); /* the pipeline's */
	save->q_next = NULL;
	if (c->q_tail)
		c->q_tail->q_next = save;
	else
		c->q_head = save;
	c->q_tail = save;
	c->staging++;
	set_state_locked(c, save, SAVE_QUEUED, 0, 0, NULL);
	pthread_mutex_unlock(&c->lock);

	*ret_staged = &save->staged;
	*ret_committed = &save->committed;
	return 0;
}

struct ckpt_future *ckpt_save_durable(struct ckpt_save *save)
{
	if (!save) {
		cli_set_error("ckpt_save_durable: save is NULL");
		return NULL;
	}
	if (state_of(save) == SAVE_BUILDING) {
		cli_set_error("ckpt_save_durable: the save is not committed yet");
		return NULL;
	}
	return &save->durable;
}

/* ---- the save thread ---- */

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

/* Fails a save before any extent was published: both futures, staged
 * first.  Caller holds c->lock. */
static void fail_unstarted_locked(struct ckpt_client *c, struct ckpt_save *s, int err,
				  const char *msg)
{
	set_state_locked(c, s, SAVE_FINISHED, err, err, msg);
}

/* Lays s out, takes slots for its descriptor and sends SAVE_BEGIN.  Returns
 * with the lock held, s BEGUN and awaiting its ACK, or FINISHED. */
static void begin_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	struct proto_save_begin begin;
	char msg[PROTO_MSG_LEN];
	char *desc = NULL;
	size_t desc_len = 0;
	uint64_t n;
	int64_t first;
	int r;

	if (c->dead) {
		fail_unstarted_locked(c, s, -ECONNRESET, c->dead_msg);
		return;
	}
	set_state_locked(c, s, SAVE_BEGUN, 0, 0, NULL);
	pthread_mutex_unlock(&c->lock);
	/* BEGUN: nothing but this thread touches the layout now. */
	r = prepare(c, s, &desc, &desc_len, msg, sizeof(msg));
	pthread_mutex_lock(&c->lock);
	if (r < 0 || c->dead) {
		/* (A connection lost meanwhile fails only the saves it finds
		 * awaiting an ACK or SAVE_DONE.) */
		fail_unstarted_locked(c, s, r < 0 ? r : -ECONNRESET, r < 0 ? msg : c->dead_msg);
		goto out;
	}
	n = cli_div_up(desc_len, c->slot_bytes);
	if (n == 0 || n > c->slots.n_slots) {
		snprintf(msg, sizeof(msg), "save '%s': its descriptor (%zu bytes for %zu items) "
			 "does not fit the %llu-byte staging arena", s->layout.name, desc_len,
			 s->layout.n_items, (unsigned long long)c->arena_bytes);
		fail_unstarted_locked(c, s, -E2BIG, msg);
		goto out;
	}
	while ((first = arena_slots_take(&c->slots, (uint32_t)n)) < 0 && !c->dead)
		pthread_cond_wait(&c->slot_cv, &c->lock);
	if (first < 0) {
		fail_unstarted_locked(c, s, -ECONNRESET, c->dead_msg);
		goto out;
	}
	s->desc_first = (uint32_t)first;
	s->desc_count = (uint32_t)n;
	s->n_ext = cli_div_up(s->layout.file_size, c->slot_bytes);
	s->next_ext = s->sent = s->inflight = 0;
	c->awaiting_ack = s;
	/* Laid out, header built: the copy threads may start (they park
	 * what they fill until the daemon accepts the save). */
	c->active = s;
	c->n_parked = 0;
	pthread_cond_broadcast(&c->copy_cv);
	pthread_mutex_unlock(&c->lock);

	memcpy((char *)c->arena + (uint64_t)first * c->slot_bytes, desc, desc_len);
	proto_init(&begin.h, PROTO_SAVE_BEGIN, sizeof(begin));
	begin.token = s->token;
	begin.attempt = s->attempt;
	begin.desc_off = (uint64_t)first * c->slot_bytes;
	begin.desc_len = desc_len;
	r = proto_send(c->sock, &begin, sizeof(begin), -1);

	pthread_mutex_lock(&c->lock);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "sending SAVE_BEGIN: %s", strerror(-r));
		cli_conn_dead_locked(c, msg); /* fails s too */
	}
out:
	free(desc);
}

/* Sends the extents filled before the daemon accepted s; gives their slots
 * back if it did not (or s failed meanwhile).  Caller holds c->lock; it is
 * dropped while sending.  The extents count as in flight until sent, so
 * an abort waits for them. */
static void send_parked_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	uint32_t n = c->n_parked;

	c->n_parked = 0;
	cli_log(CKPT_LOG_DEBUG, "save '%s' (token %u): %u extent%s filled before ckptd answered: %s",
		s->layout.name, s->token, n, n == 1 ? "" : "s",
		state_of(s) == SAVE_STAGING ? "sending" : "giving the slots back");
	if (state_of(s) != SAVE_STAGING) {
		for (uint32_t i = 0; i < n; i++)
			arena_slots_put(&c->slots, c->parked[i].slot, 1);
		pthread_cond_broadcast(&c->slot_cv);
		return;
	}
	s->inflight += n;
	for (uint32_t i = 0; i < n;) {
		struct proto_extent ext[PROTO_SEND_MANY_MAX];
		unsigned k = n - i < PROTO_SEND_MANY_MAX ? n - i : PROTO_SEND_MANY_MAX;

		/* The array stays as it is meanwhile: no copy parks a slot of
		 * s any more, and the next save begins after this one. */
		for (unsigned j = 0; j < k; j++)
			cli_extent_msg(c, s, c->parked[i + j].slot, c->parked[i + j].ext, &ext[j]);
		cli_send_extents_locked(c, s, ext, k);
		i += k;
	}
}

static void run_save(struct ckpt_client *c, struct ckpt_save *s)
{
	bool tell = false;

	pthread_mutex_lock(&c->lock);
	begin_locked(c, s);
	/* The receiver moves s on when the ACK arrives, or the connection
	 * loss fails it. */
	while (state_of(s) == SAVE_BEGUN && !c->dead)
		pthread_cond_wait(&c->save_cv, &c->lock);
	if (state_of(s) == SAVE_BEGUN)
		save_fail_locked(c, s, -ECONNRESET, c->dead_msg, true);
	/* No copy parks a slot once the save has left BEGUN. */
	if (c->active == s && c->n_parked)
		send_parked_locked(c, s);

	/* Wait until staging is over and no copy thread works on s. */
	for (;;) {
		enum save_state st = state_of(s);
		if (s->inflight == 0) {
			if (st == SAVE_STAGED || st == SAVE_FINISHED)
				break;
			if (st == SAVE_ABORTING || st == SAVE_DRAINING) {
				tell = save_drained_locked(c, s);
				break;
			}
			if (c->dead || c->stopping) {
				/* Copies stopped with extents unsent. */
				const char *why = c->dead ? c->dead_msg
							  : "the client is disconnecting";
				save_fail_locked(c, s, -ECONNRESET, why, true);
				continue;
			}
		}
		pthread_cond_wait(&c->save_cv, &c->lock);
	}
	if (c->active == s)
		c->active = NULL;
	pthread_mutex_unlock(&c->lock);

	if (tell) {
		struct proto_save_abort ab;
		int r;

		proto_init(&ab.h, PROTO_SAVE_ABORT, sizeof(ab));
		ab.token = s->token;
		r = proto_send(c->sock, &ab, sizeof(ab), -1);
		if (r < 0) {
			char msg[PROTO_MSG_LEN];
			pthread_mutex_lock(&c->lock);
			snprintf(msg, sizeof(msg), "sending SAVE_ABORT: %s", strerror(-r));
			cli_conn_dead_locked(c, msg);
			pthread_mutex_unlock(&c->lock);
		}
	}
	/* Copy threads are done with the header; the daemon has its bytes. */
	free(s->hdr);
	s->hdr = NULL;
}

void *save_thread_main(void *arg)
{
	struct ckpt_client *c = arg;

	pthread_setname_np(pthread_self(), "ckpt-save");
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
