/* SPDX-License-Identifier: MIT */
/*
 * save.c - the save/rank state machine (save.h).  Every transition of a save
 * or a rank is a function here; the connection code only routes messages to
 * them, the writer only reports finished extents through the rank's
 * wtarget, and the storage backend is reached only through store_ops, on
 * worker threads for anything that may block.
 */
#include "daemon/save.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/conn.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/pending.h"
#include "daemon/resident.h"
#include "daemon/retention.h"
#include "daemon/server.h"
#include "daemon/testgate.h"
#include "format/index.h"
#include "store/fsutil.h"
#include "store/s3_addr.h"
#include "store/s3_retry.h"
#include "store/store_spill.h"

#define RETRY_FIRST_MS 1000 /* a pending save's first wait, at most */

/* A job of a save or a rank: what run() needs, owned by the job, so the
 * worker never reads loop state that may change. */
struct sjob {
	struct work w;
	struct save *s;
	struct rank *r;
	/* inputs */
	struct store_key key;
	char id[STORE_ID_LEN + 1];
	char root[PATH_MAX];
	struct store_attempt *att;
	struct store_shard *shard;
	uint64_t extent;         /* shard: the connection's slot size */
	const struct config *cfg;
	struct registry *reg;
	const struct store_ops *store;
	struct store_writer self;
	struct creds daemon_creds;
	const struct creds *owner; /* the save's (it outlives its jobs) */
	bool coordinator, delivered, created, noted, pending;
	bool mark;               /* cleanup: leave the failure marker */
	bool spill;              /* finish: the shard spills (forwarded next) */
	bool addressed;          /* finish: an index addressed to nonce was sent */
	bool forwarded;          /* upload: the store has the file already */
	uint64_t gen;            /* finish of a spilled rank: its record's */
	uint32_t n_present;
	char nonce[STORE_ID_LEN + 1];
	struct index_local *local;
	size_t n_local;
	uint32_t *ranks;         /* local ranks, sorted (count, cleanup) */
	size_t n_ranks;
	struct rank **rk;        /* poll: local ranks (read-only), n_ranks */
	char (*to)[STORE_ID_LEN + 1]; /* poll: their addressees, updated */
	char msg[PROTO_MSG_LEN];
	/* outputs */
	struct store_shard *out_shard;
	struct store_shard **out_shards; /* resume: one per rk[] */
	struct store_attempt *out_att;
	bool out_created;
	bool out_recorded;       /* finish: the spilled rank's record is written */
	bool out_forwarded;      /* upload: the file reached the store */
	bool out_committed;      /* resume: the attempt had committed already */
	char out_note[PROTO_MSG_LEN]; /* finish: why it was not recorded */
	int img_err;             /* shard: making the rank's image failed */
	char out_root[PATH_MAX];
	int poll;
	int64_t t0;              /* now_us() when it was made (metrics.h phases) */
};

static void save_kick(struct save *s);
static void rank_tell(struct rank *r);
static void save_images_ready(struct save *s);

static struct sjob *sjob_new(struct save *s, struct rank *r, void (*run)(struct work *),
			     void (*done)(struct work *), const struct creds *creds)
{
	struct sjob *j = calloc(1, sizeof(*j));
	struct server *srv = s->srv;

	if (!j)
		return NULL;
	j->w.run = run;
	j->w.done = done;
	j->w.creds = creds;
	j->s = s;
	j->r = r;
	j->key = s->key;
	memcpy(j->id, s->id, sizeof(j->id));
	snprintf(j->root, sizeof(j->root), "%s", s->root);
	j->att = s->att;
	j->cfg = &srv->cfg;
	j->reg = &srv->reg;
	j->store = srv->store;
	j->self = srv->self;
	j->daemon_creds = srv->creds;
	j->owner = &s->creds;
	j->coordinator = s->coordinator;
	j->delivered = s->delivered;
	j->created = s->created;
	j->noted = s->noted;
	j->pending = s->pending;
	j->n_present = s->n_present;
	memcpy(j->nonce, s->nonce, sizeof(j->nonce));
	j->t0 = now_us();
	return j;
}

static void sjob_free(struct sjob *j)
{
	if (j->out_shards) {
		for (size_t i = 0; i < j->n_ranks; i++)
			j->store->shard_close(j->out_shards[i]);
		free(j->out_shards);
	}
	free(j->local);
	free(j->ranks);
	free(j->rk);
	free(j->to);
	free(j);
}

/* ---- lookups ---------------------------------------------------------------- */

static bool save_final(const struct save *s)
{
	return s->state == SAVE_COMMITTED || s->state == SAVE_FAILED;
}

static struct save *find_live(struct server *srv, const char *job, const char *name)
{
	struct list *p;

	list_for_each(p, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		if (!save_final(s) && !strcmp(s->key.job, job) && !strcmp(s->key.name, name))
			return s;
	}
	return NULL;
}

static struct save *find_final(struct server *srv, const char *id)
{
	struct list *p;

	list_for_each(p, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		if (save_final(s) && !strcmp(s->id, id))
			return s;
	}
	return NULL;
}

struct rank *rank_find(struct conn *c, uint32_t token)
{
	struct list *p;

	list_for_each(p, &c->ranks)
	{
		struct rank *r = list_entry(p, struct rank, clink);
		if (r->token == token)
			return r;
	}
	return NULL;
}

size_t saves_live_ids(struct server *srv, char (*ids)[STORE_ID_LEN + 1], size_t max)
{
	struct list *p;
	size_t n = 0;

	list_for_each(p, &srv->saves)
	{
		if (n == max)
			break;
		memcpy(ids[n++], list_entry(p, struct save, link)->id, STORE_ID_LEN + 1);
	}
	return n;
}

const char *save_state_name(const struct save *s)
{
	bool staging = false, writing = false, uploading = false;
	struct list *p;

	switch (s->state) {
	case SAVE_OPENING:
		return "opening";
	case SAVE_COMMITTING:
		return "committing";
	case SAVE_COMMITTED:
		return "committed";
	case SAVE_FAILED:
		return "failed";
	case SAVE_ACTIVE:
		break;
	}
	list_for_each(p, &s->ranks)
	{
		enum rank_state st = list_entry(p, struct rank, slink)->state;
		staging |= st == RANK_OPENING || st == RANK_STAGING;
		writing |= st == RANK_WRITING || st == RANK_FINISHING;
		uploading |= st == RANK_UPLOADING;
	}
	return staging ? "staging" : writing ? "writing" : uploading ? "uploading" : "waiting";
}

/* ---- telling ranks ---------------------------------------------------------- */

/* The one message a rank still expects: its ACK if it never got one, else
 * SAVE_DONE.  Once. */
static void rank_tell(struct rank *r)
{
	struct save *s = r->save;
	bool acked = r->state != RANK_OPENING;
	int err;

	if (r->told)
		return;
	r->told = true;
	if (!r->conn || r->conn->state == CONN_CLOSED)
		return;
	if (s->state == SAVE_COMMITTED) {
		conn_send_result(r->conn, PROTO_SAVE_DONE, r->token, 0, "");
		return;
	}
	err = r->err ? r->err : s->err ? s->err : -EIO;
	conn_send_result(r->conn, acked ? PROTO_SAVE_DONE : PROTO_SAVE_ACK, r->token, err, s->msg);
}

/* SAVE_DURABLE: the rank's bytes reached the first tier (where: `how`). */
static void rank_durable_tell(struct rank *r, const char *how)
{
	if (!r->told && r->conn && r->conn->state != CONN_CLOSED)
		conn_send_result(r->conn, PROTO_SAVE_DURABLE, r->token, 0, how);
}

/* Whose rights a job of rank r acts with: its client's, or (a rank a
 * later life resumed) the save's owner's. */
static const struct creds *rank_creds(const struct rank *r)
{
	return r->conn ? &r->conn->creds : &r->save->creds;
}

/* ---- failure ---------------------------------------------------------------- */

void save_fail(struct save *s, int err, const char *fmt, ...)
{
	struct list *p;
	va_list ap;

	/* A commit in flight decides for itself (it may already be visible). */
	if (save_final(s) || s->state == SAVE_COMMITTING)
		return;
	s->state = SAVE_FAILED;
	s->err = err < 0 ? err : -EIO;
	va_start(ap, fmt);
	vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
	va_end(ap);
	s->srv->saves_failed++;
	metrics_save_end(s->srv, s);
	log_warn("save '%s/%s' (job '%s', attempt %s) failed: %s", s->root, s->key.name,
		 s->key.job, s->id, s->msg);
	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		/* Slots still queued for a checksum are given back quickly. */
		r->wt.no_crc = true;
		if (r->wt.held && r->conn && r->conn->writer_ok)
			writer_crc_due(&r->conn->w);
		/* An upload in flight stops soon (then the cleanup can run). */
		if (r->state == RANK_UPLOADING && r->job_busy && r->shard &&
		    s->srv->store->shard_cancel)
			s->srv->store->shard_cancel(r->shard);
		rank_tell(r);
	}
	save_kick(s);
}

static void rank_fail(struct rank *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void rank_fail(struct rank *r, int err, const char *fmt, ...)
{
	char msg[PROTO_MSG_LEN];
	va_list ap;

	if (r->state == RANK_FAILED || save_final(r->save))
		return;
	r->state = RANK_FAILED;
	r->err = err;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* The rank's own client gets its own errno; every other rank learns
	 * that this one failed. */
	save_fail(r->save, -ECANCELED, "%s", msg);
}

void rank_abort(struct rank *r, int err, const char *why)
{
	if (r->state == RANK_OPENING || r->state == RANK_STAGING)
		rank_fail(r, err, "rank %u %s", r->rank, why);
}

/* ---- pending saves (the spill tier) ------------------------------------------ */

/* Every rank of the save is local and spilled to this node's disk: nothing
 * but the store is left to wait for, and no deadline runs out on it. */
static bool save_whole_here(const struct save *s)
{
	const struct list *p;
	uint32_t n = 0;

	if (!s->pending || !s->coordinator)
		return false;
	list_for_each(p, &s->ranks)
	{
		const struct rank *r = list_entry(p, struct rank, slink);
		if (!r->spill || (r->state != RANK_UPLOADING && r->state != RANK_DURABLE))
			return false;
		n++;
	}
	return n == s->key.world;
}

/* A failure of the store a pending save outlives: anything but a refusal
 * no retry can mend (the copy on the node's disk no longer matches, the
 * name is another save's, another daemon failed the save). */
static bool store_trouble(int err)
{
	return err < 0 && err != -ECANCELED && err != -EBADMSG && err != -EEXIST;
}

/* Errors that say the store refuses rather than fails to answer: logged
 * as errors, for an operator (credentials, a bucket, a policy). */
static bool store_refuses(int err)
{
	return err == -EACCES || err == -EPERM || err == -ENOENT || err == -EINVAL ||
	       err == -EFBIG || err == -ENOTSUP;
}

static void save_park(struct save *s)
{
	struct list *p;

	if (save_final(s) || s->state == SAVE_COMMITTING)
		return;
	s->state = SAVE_FAILED;
	s->parked = true;
	s->err = -ESHUTDOWN;
	snprintf(s->msg, sizeof(s->msg), "ckptd stopped before the S3 commit; the save is "
		 "durable on this node and the next start of ckptd commits it");
	log_info("save '%s/%s' (job '%s', attempt %s) is left for the next start of ckptd: "
		 "its ranks are durable on this node", s->root, s->key.name, s->key.job, s->id);
	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		if (r->state == RANK_UPLOADING && r->job_busy && r->shard &&
		    s->srv->store->shard_cancel)
			s->srv->store->shard_cancel(r->shard);
		rank_tell(r);
	}
}

/*
 * A step of pending save s met the store failing (err, msg): it is tried
 * again after a random wait of at most 1 s doubled each time up to
 * s3_spill_retry_cap, for as long as it takes (save.h).  A save not whole
 * on this node has its deadline moved: it counts only while the store
 * answers.
 */
static void save_trouble(struct save *s, int err, const char *msg)
{
	static uint64_t seed;
	struct server *srv = s->srv;
	int64_t now = now_ms();
	bool same = !strcmp(s->last_err, msg);
	uint64_t wait;

	if (!seed)
		seed = (uint64_t)now_us() ^ ((uint64_t)getpid() << 32);
	s->rounds++;
	/* Full jitter, as S3 requests back off: daemons that met one outage
	 * do not all come back at once. */
	wait = s3_backoff_ms(s->rounds, RETRY_FIRST_MS < srv->cfg.s3_spill_retry_cap_ms ?
						RETRY_FIRST_MS : srv->cfg.s3_spill_retry_cap_ms,
			     srv->cfg.s3_spill_retry_cap_ms, &seed);
	s->retry_ms = now + (int64_t)wait;
	s->last_err_ms = now;
	snprintf(s->last_err, sizeof(s->last_err), "%s", msg);
	if (!save_whole_here(s) && s->deadline_ms < now + (int64_t)srv->cfg.commit_deadline_ms)
		s->deadline_ms = now + (int64_t)srv->cfg.commit_deadline_ms;
	/* Once per new reason, then at rounds 2, 4, 8, ...: an outage of a
	 * day does not fill the journal. */
	if (!same || !(s->rounds & (s->rounds - 1))) {
		if (store_refuses(err))
			log_err("save '%s/%s' (job '%s', attempt %s): the store refuses it (%s); its "
				"spilled copy is kept and tried again in %.1f s (try %u); "
				"`ckptctl spill drop %s` gives it up",
				s->root, s->key.name, s->key.job, s->id, msg, (double)wait / 1000.0,
				s->rounds, s->id);
		else
			log_warn("save '%s/%s' (job '%s', attempt %s): %s; its spilled copy is kept "
				 "and tried again in %.1f s (try %u)",
				 s->root, s->key.name, s->key.job, s->id, msg, (double)wait / 1000.0,
				 s->rounds);
	}
	if (srv->parking)
		save_park(s);
}

/* ---- jobs -------------------------------------------------------------------- */

/* A job acting as the daemon for a moment (the registry, the spill
 * directory), then as its client again. */
static int as_daemon(struct sjob *j)
{
	char err[PROTO_MSG_LEN];

	return creds_apply(&j->daemon_creds, err, sizeof(err));
}

static void as_client(struct sjob *j)
{
	char err[PROTO_MSG_LEN];

	if (j->w.creds)
		creds_apply(j->w.creds, err, sizeof(err));
}

static void registry_note(struct sjob *j, bool add)
{
	/* The registry is the daemon's: switch to ourselves for it. */
	if (as_daemon(j) < 0)
		return;
	if (add) {
		if (registry_add(j->reg, j->id, j->out_root[0] ? j->out_root : j->root,
				 j->w.creds ? j->w.creds : &j->daemon_creds, j->self.instance) < 0)
			log_warn("registry: cannot note work area %s", j->id);
	} else {
		registry_del(j->reg, j->id);
	}
	as_client(j);
}

/* The save ended for good (committed, or failed and cleaned up): what the
 * daemon kept of it goes, its registry entry if `registry`, and the
 * records of a pending save (pending.h). */
static void forget(struct sjob *j, bool registry)
{
	if (!registry && !j->pending)
		return;
	if (as_daemon(j) < 0)
		return;
	if (registry)
		registry_del(j->reg, j->id);
	if (j->pending)
		pending_remove(j->reg->path, j->id);
	as_client(j);
}

static void open_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	const char *base;
	int r, rootfd = -1;

	bool s3 = s3_is_url(j->root);

	if (s3) {
		/* One spelling of an S3 location, the one config_root_base
		 * compares with. */
		struct s3_loc loc;
		char canon[PATH_MAX];
		if (s3_url_parse(j->root, &loc, w->err, sizeof(w->err)) < 0 ||
		    s3_url_format(&loc, canon, sizeof(canon)) < 0) {
			w->res = -EINVAL;
			return;
		}
		snprintf(j->root, sizeof(j->root), "%s", canon);
	}
	if (!config_root_base(j->cfg, j->root)) {
		w->res = -EACCES;
		snprintf(w->err, sizeof(w->err), "root '%.400s' is not inside an allowed root of this ckptd",
			 j->root);
		return;
	}
	if (!s3) {
		/* Its spelling without links, to check and to walk (and the
		 * one the registry and retention know it by).  Only a
		 * spelling: root_open checks what it names as it opens it. */
		char canon[PATH_MAX];
		size_t n;

		r = fs_resolve_existing(j->root, canon, sizeof(canon));
		if (r < 0) {
			w->res = r;
			snprintf(w->err, sizeof(w->err), "cannot resolve root '%.400s': %s", j->root,
				 strerror(-r));
			return;
		}
		for (n = strlen(canon); n > 1 && canon[n - 1] == '/';)
			canon[--n] = '\0';
		if (!config_root_base(j->cfg, canon)) {
			w->res = -EACCES;
			snprintf(w->err, sizeof(w->err), "root '%.400s' resolves outside the allowed roots",
				 j->root);
			return;
		}
		snprintf(j->root, sizeof(j->root), "%s", canon);
	}
	base = config_root_base(j->cfg, j->root);
	if (s3 && store_spill_on()) {
		/* The user's spill directory is made by the daemon. */
		r = as_daemon(j);
		if (r == 0) {
			r = store_spill_prepare(j->w.creds->uid, j->w.creds->gid, w->err,
						sizeof(w->err));
			as_client(j);
		}
		if (r < 0) {
			w->res = r;
			return;
		}
	}
	/* Checked and opened in one walk from the allowed root, as the
	 * client: the directory it ends in is the one the save uses, and no
	 * link below the allowed root is followed (store.h, root_open). */
	r = j->store->root_open(base, j->root, &rootfd, w->err, sizeof(w->err));
	if (r < 0) {
		w->res = r;
		return;
	}
	testgate("root-open");
	snprintf(j->out_root, sizeof(j->out_root), "%s", j->root);
	/* Noted before it exists, so a crash right after mkdir leaves nothing
	 * the sweep does not know about. */
	registry_note(j, true);
	r = j->store->attempt_open(j->root, rootfd, &j->key, j->id, &j->self, j->w.creds->uid,
				   &j->out_att, &j->out_created, w->err, sizeof(w->err));
	if (rootfd >= 0)
		close(rootfd);
	/* Kept when this daemon made the area, or (spill tier) has a local
	 * area of its own for it: the sweep removes either after a crash. */
	j->noted = r == 0 && (j->out_created || (s3 && store_spill_on()));
	if (!j->noted)
		registry_note(j, false);
	w->res = r;
}

static void shard_submit(struct rank *r);

static void open_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;
	struct list *p, *t;

	char err[PROTO_MSG_LEN];
	int res = w->res;

	s->job_busy = false;
	if (res == 0) {
		s->att = j->out_att;
		s->created = j->out_created;
		s->noted = j->noted;
		snprintf(s->root, sizeof(s->root), "%s", j->out_root);
	}
	snprintf(err, sizeof(err), "%s", w->err);
	sjob_free(j);
	if (save_final(s)) {
		save_kick(s); /* failed meanwhile: clean up what was made */
		return;
	}
	if (res < 0) {
		s->srv->saves_refused++;
		save_fail(s, res, "%s", err);
		return;
	}
	s->state = SAVE_ACTIVE;
	s->renew_due_ms = now_ms() + (int64_t)s->srv->cfg.s3_heartbeat_ms;
	log_info("save '%s/%s' (job '%s', attempt %s): work area %s", s->root, s->key.name,
		 s->key.job, s->id, s->created ? "created" : "joined (made by another daemon)");
	list_for_each_safe(p, t, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		if (r->state == RANK_OPENING && !r->job_busy)
			shard_submit(r);
	}
}

static void shard_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;

	/* The rank's image (resident.h) is made before the ACK, so the first
	 * checksum finds it; failing to make it costs the image, not the save. */
	if (j->r->img && !j->r->img->map)
		j->img_err = image_make(j->r->img);
	testgate("shard");
	w->res = j->store->shard_create(j->att, j->r->rank, j->r->layout.file_size,
					j->extent, j->cfg->o_direct, &j->out_shard, w->err,
					sizeof(w->err));
	/* Rank 0's daemon coordinates: it claims the area once its shard is
	 * its own (the exclusive create decides between two claimants). */
	if (w->res == 0 && j->r->rank == 0)
		w->res = j->store->attempt_claim(j->att, &j->self, j->nonce, w->err,
						 sizeof(w->err));
}

static void extent_done(struct wtarget *t, uint64_t bytes, int res);

static void shard_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct rank *r = j->r;
	struct save *s = r->save;

	r->job_busy = false;
	if (j->out_shard) {
		const struct store_ops *st = s->srv->store;
		r->shard = j->out_shard;
		r->made = true;
		r->spill = st->shard_spills && st->shard_spills(r->shard);
	} else if (w->res < 0) {
		r->create_err = w->res;
	}
	if (w->res == 0 && r->rank == 0) {
		/* The exclusive create of rank 0's shard and the claim made
		 * this daemon the coordinator: before that it was not, even
		 * with rank 0 here (another daemon's rank 0 may have won). */
		memcpy(s->nonce, j->nonce, sizeof(s->nonce));
		s->coordinator = true;
		log_info("save '%s/%s' (job '%s', attempt %s): coordinating (rank 0's shard and "
			 "the claim are this daemon's)", s->root, s->key.name, s->key.job, s->id);
	}
	if (w->res < 0 && r->state == RANK_OPENING && !save_final(s)) {
		/* This rank never started: refuse it, and fail the save for the
		 * ranks that did (their files must not be committed). */
		r->err = w->res;
		s->srv->saves_refused++;
		if (s->ranks.next == &r->slink && s->ranks.prev == &r->slink)
			save_fail(s, w->res, "%s", w->err);
		else
			save_fail(s, -ECANCELED, "rank %u: %s", r->rank, w->err);
	} else if (r->state == RANK_OPENING && !save_final(s)) {
		r->state = RANK_STAGING;
		const struct store_ops *st = s->srv->store;

		if (j->img_err)
			log_warn("save '%s/%s' (job '%s'): rank %u: no resident image: %s", s->root,
				 s->key.name, s->key.job, r->rank, strerror(-j->img_err));
		r->wt = (struct wtarget){ .shard = r->shard, .layout = &r->layout, .crcs = r->crcs,
					  .image = r->img && !r->img->broken ? r->img->map : NULL,
					  .crc_first = st->shard_wants_crc &&
						       st->shard_wants_crc(r->shard),
					  .extent_done = extent_done };
		conn_send_result(r->conn, PROTO_SAVE_ACK, r->token, 0, "");
		log_info("save '%s/%s' (job '%s'): rank %u/%u began, %llu bytes, %zu items", s->root,
			 s->key.name, s->key.job, r->rank, s->key.world,
			 (unsigned long long)r->layout.file_size, r->layout.n_items);
		if (r->conn->state == CONN_CLOSED)
			rank_abort(r, -ECONNRESET, "disconnected before its shard was staged");
	}
	sjob_free(j);
	save_kick(s);
}

static void shard_submit(struct rank *r)
{
	struct sjob *j = sjob_new(r->save, r, shard_run, shard_done, &r->conn->creds);

	if (!j) {
		rank_fail(r, -ENOMEM, "out of memory");
		return;
	}
	j->extent = r->conn->slot_bytes;
	r->job_busy = true;
	workers_submit(&r->save->srv->work, &j->w);
}

/* Builds rank r's index addressed to `to` and publishes it. */
static int publish(struct sjob *j, const struct rank *r, const char *to, char *err, size_t errlen)
{
	struct index_origin o = { j->id, j->self.id, j->self.instance, to,
				  j->store->attempt_tag(j->att), false, 0 };
	char *text = NULL;
	int res;

	/* The rank's layout and checksums no longer change. */
	res = index_build_origin(&r->layout, r->crcs, j->key.job, r->rank, j->key.world, &o,
				 &text);
	if (res < 0) {
		snprintf(err, errlen, "building the index of rank %u: %s", r->rank, strerror(-res));
		return res;
	}
	res = j->store->rank_publish(j->att, r->rank, text, err, errlen);
	free(text);
	return res;
}

/* Publishes a durable rank's index: the last step of its finish (or, for
 * a spilled shard, upload) job. */
static void deliver(struct sjob *j)
{
	struct work *w = &j->w;

	/* The coordinator addresses its own ranks to its claim; other daemons
	 * to the claim they find (none yet: "", re-addressed when polling). */
	if (!j->coordinator || !j->nonce[0]) {
		j->nonce[0] = '\0';
		if (!j->coordinator && j->store->attempt_addressee(j->att, j->nonce) < 0)
			j->nonce[0] = '\0';
	}
	/* Sent is as good as delivered: a PUT whose answer was lost may
	 * have landed, and the coordinator may commit it. */
	j->addressed = j->nonce[0] != '\0';
	w->res = publish(j, j->r, j->nonce, w->err, sizeof(w->err));
}

/* A spilled rank durable on this node: what finishes its save without its
 * client, and after a restart, goes to the state directory (pending.h)
 * before SAVE_DURABLE says so.  Its layout and CRCs no longer change. */
static void record(struct sjob *j)
{
	const struct rank *r = j->r;

	if (as_daemon(j) < 0) {
		snprintf(j->out_note, sizeof(j->out_note), "cannot act as the daemon");
		return;
	}
	j->out_recorded = pending_record(j->reg->path, j->id, &j->key, j->root, j->owner, j->ranks,
					 j->n_ranks, j->gen, r->rank, j->extent, &r->layout, r->crcs,
					 j->out_note, sizeof(j->out_note)) == 0;
	as_client(j);
}

static void finish_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;

	w->res = j->store->shard_finish(j->shard, j->r->layout.file_size, w->err, sizeof(w->err));
	/* A spilled shard is durable on this node now; it is uploaded (and
	 * its index published) by the next job. */
	if (w->res == 0 && j->spill)
		record(j);
	if (w->res == 0 && !j->spill)
		deliver(j);
}

/* The spill tier's check of what the node's disk gives back: every CRC
 * piece of the range against the checksum taken from the arena. */
static int check_spilled(void *ud, const uint8_t *buf, uint64_t off, uint64_t len, char *err,
			 size_t errlen)
{
	const struct rank *r = ud;
	uint64_t bad;

	if (writer_crc_verify(&r->layout, r->crcs, buf, off, len, &bad) == 0)
		return 0;
	snprintf(err, errlen, "the spilled copy of rank %u does not match its checksum in "
			      "the CRC block at byte %llu (the node's disk changed it): not "
			      "uploaded",
		 r->rank, (unsigned long long)bad);
	return -EBADMSG;
}

static void upload_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;

	/* The rank is read-only here (its layout and checksums are final),
	 * but for `uploaded`, which the backend writes atomically. */
	if (!j->forwarded) {
		w->res = j->store->shard_forward(j->shard, check_spilled, j->r, &j->r->uploaded,
						 w->err, sizeof(w->err));
		j->out_forwarded = w->res == 0;
	}
	if (w->res == 0) {
		deliver(j);
		/* An index S3 refused as damaged however often it was sent
		 * (BadDigest) is the way's fault, not the copy's: tried again. */
		if (w->res == -EBADMSG || w->res == -EEXIST)
			w->res = -EIO;
	}
}

static void finish_done(struct work *w);

/* Submits (again) the upload of spilled rank r. */
static void rank_upload(struct rank *r)
{
	struct save *s = r->save;
	struct sjob *u = sjob_new(s, r, upload_run, finish_done, rank_creds(r));

	if (!u) {
		rank_fail(r, -ENOMEM, "out of memory");
		return;
	}
	u->shard = r->shard;
	u->forwarded = r->forwarded;
	r->job_busy = true;
	workers_submit(&s->srv->uploads, &u->w);
}

static void save_progress(struct save *s);

static void finish_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct rank *r = j->r;
	struct save *s = r->save;

	r->job_busy = false;
	if (j->addressed)
		memcpy(r->to, j->nonce, sizeof(r->to));
	if (j->out_forwarded)
		r->forwarded = true;
	if (w->res < 0 && r->state == RANK_UPLOADING && store_trouble(w->res) && !save_final(s)) {
		/* Durable on this node: the store's failure waits, never
		 * fails it (save.h). */
		save_trouble(s, w->res, w->err);
	} else if (w->res < 0) {
		rank_fail(r, w->res, "%s", w->err);
	} else if (r->state == RANK_FINISHING && r->spill) {
		r->state = RANK_UPLOADING;
		r->recorded = j->out_recorded;
		s->pending = true;
		metrics_observe(s->srv, METRICS_WRITE, now_us() - r->t_staged);
		/* Durable means it survives the trainer, the store's outages
		 * and ckptd's restarts: only what is recorded for a restart
		 * is reported so (SAVE_DURABLE may never come). */
		if (r->recorded)
			rank_durable_tell(r, "on the node's disk (spill tier); uploading");
		else
			log_warn("save '%s/%s' (job '%s'): rank %u is on this node's disk but cannot "
				 "be recorded for a restart (%s): not reported durable",
				 s->root, s->key.name, s->key.job, r->rank, j->out_note);
		log_debug("save '%s/%s': rank %u spilled: staged after %.1f ms, written +%.1f ms, "
			  "fsync +%.1f ms",
			  s->root, s->key.name, r->rank, (double)(r->t_staged - r->t_begin) / 1000.0,
			  (double)(r->t_written - r->t_staged) / 1000.0,
			  (double)(now_us() - r->t_written) / 1000.0);
		if (!save_final(s))
			rank_upload(r);
	} else if (r->state == RANK_FINISHING || r->state == RANK_UPLOADING) {
		if (r->state == RANK_FINISHING) {
			rank_durable_tell(r, "");
			metrics_observe(s->srv, METRICS_WRITE, now_us() - r->t_staged);
		} else {
			/* j is the upload job (its last round). */
			metrics_observe(s->srv, METRICS_UPLOAD, now_us() - j->t0);
			metrics_written(s->srv, METRICS_S3, r->layout.file_size);
		}
		r->state = RANK_DURABLE;
		s->srv->store->shard_close(r->shard);
		r->shard = NULL;
		log_debug("save '%s/%s': rank %u durable: staged after %.1f ms, written +%.1f ms, "
			  "fsync and index +%.1f ms",
			  s->root, s->key.name, r->rank, (double)(r->t_staged - r->t_begin) / 1000.0,
			  (double)(r->t_written - r->t_staged) / 1000.0,
			  (double)(now_us() - r->t_written) / 1000.0);
	}
	sjob_free(j);
	save_progress(s);
	save_kick(s);
}

/* Every extent of a staged rank is written and checksummed: make it
 * durable and publish its index (on a worker). */
static void rank_maybe_finish(struct rank *r)
{
	struct sjob *j;

	if (r->state != RANK_WRITING || r->extents_done != r->n_extents || r->wt.held ||
	    r->job_busy)
		return;
	r->state = RANK_FINISHING;
	r->t_written = now_us();
	j = sjob_new(r->save, r, finish_run, finish_done, rank_creds(r));
	if (!j) {
		rank_fail(r, -ENOMEM, "out of memory");
		return;
	}
	j->shard = r->shard;
	j->spill = r->spill;
	if (r->spill) {
		/* Its record lists the save's local ranks as they are now. */
		struct list *p;
		size_t n = 0;

		list_for_each(p, &r->save->ranks)
			n++;
		j->ranks = calloc(n ? n : 1, sizeof(*j->ranks));
		if (!j->ranks) {
			sjob_free(j);
			rank_fail(r, -ENOMEM, "out of memory");
			return;
		}
		list_for_each(p, &r->save->ranks)
			j->ranks[j->n_ranks++] = list_entry(p, struct rank, slink)->rank;
		j->extent = r->extent;
		j->gen = ++r->save->rec_gen;
	}
	r->job_busy = true;
	workers_submit(&r->save->srv->work, &j->w);
}

static void extent_done(struct wtarget *t, uint64_t bytes, int res)
{
	struct rank *r = (struct rank *)((char *)t - offsetof(struct rank, wt));
	struct save *s = r->save;

	if (res < 0) {
		const struct store_ops *st = s->srv->store;
		const char *why = st->shard_error ? st->shard_error(r->shard) : NULL;

		if (why) {
			rank_fail(r, res, "writing the shard of rank %u in '%s': %s", r->rank,
				  s->root, why);
			return;
		}
		rank_fail(r, res, "writing the shard of rank %u in '%s': %s%s", r->rank, s->root,
			  strerror(-res),
			  res == -EFBIG || res == -EINVAL ?
				  " (a write past ckptd's file size limit, RLIMIT_FSIZE or systemd's "
				  "LimitFSIZE=, fails like this)" :
				  "");
		return;
	}
	r->bytes_written += bytes;
	r->extents_done++;
	s->srv->bytes_written += bytes;
	metrics_written(s->srv, r->spill ? METRICS_SPILL : s3_is_url(s->root) ? METRICS_S3 :
									 METRICS_LOCAL,
			bytes);
	rank_maybe_finish(r);
}

/* ---- commit ------------------------------------------------------------------ */

/* How many local ranks the save has if every one of them is durable, else
 * 0: a rank not durable yet must never be merged or published. */
static size_t durable_ranks(const struct save *s)
{
	const struct list *p;
	size_t n = 0;

	list_for_each(p, &s->ranks)
	{
		if (list_entry(p, struct rank, slink)->state != RANK_DURABLE)
			return 0;
		n++;
	}
	return n;
}

static bool local_ranks_durable(const struct save *s)
{
	return durable_ranks(s) > 0;
}

static void commit_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct store_merge m = { &j->key, j->id, j->nonce, &j->self, j->local, j->n_local,
				 time(NULL) };
	int r;

	r = j->store->attempt_count(j->att, j->key.world, j->nonce, j->ranks, j->n_ranks,
				    &j->n_present, w->err, sizeof(w->err));
	if (r == -ECANCELED) {
		w->res = r;
		snprintf(w->err, sizeof(w->err), "another daemon of this save gave up on it (its "
			 "'failed' marker is in the work area): its ranks will not come");
		return;
	}
	if (r < 0) {
		w->res = r;
		char why[sizeof(w->err)];

		snprintf(why, sizeof(why), "%s", w->err[0] ? w->err : strerror(-r));
		snprintf(w->err, sizeof(w->err), "looking for the ranks' indexes: %.*s",
			 (int)sizeof(w->err) - 40, why);
		return;
	}
	if (j->n_present < j->key.world) {
		w->res = -EAGAIN;
		return;
	}
	testgate("commit");
	w->res = j->store->attempt_commit(j->att, &m, w->err, sizeof(w->err));
	if (w->res == 0)
		forget(j, j->noted);
}

static void commit_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;
	struct list *p;

	s->job_busy = false;
	s->n_present = j->n_present;
	s->state = SAVE_ACTIVE;
	if (w->res == -EAGAIN) {
		sjob_free(j);
		/* A rank that failed meanwhile could not fail the save while
		 * the commit job was in flight. */
		list_for_each(p, &s->ranks)
		{
			struct rank *r = list_entry(p, struct rank, slink);
			if (r->state == RANK_FAILED) {
				save_fail(s, -ECANCELED, "rank %u failed while the save waited for "
							 "other ranks", r->rank);
				break;
			}
		}
		return; /* retried at the next tick */
	}
	if (w->res < 0 && s->pending && store_trouble(w->res)) {
		char msg[PROTO_MSG_LEN + 32];

		snprintf(msg, sizeof(msg), "cannot commit: %s", w->err);
		/* A shard of ours gone from the store (removed by hand or a
		 * bucket rule): the node's copy is sent again. */
		s->resend = w->res == -ENODATA;
		save_trouble(s, w->res, msg);
	} else if (w->res < 0) {
		save_fail(s, w->res, "cannot commit: %s", w->err);
	} else {
		s->state = SAVE_COMMITTED;
		s->srv->saves_committed++;
		metrics_observe(s->srv, METRICS_COMMIT, now_us() - j->t0);
		metrics_save_end(s->srv, s);
		save_images_ready(s);
		/* The committer's daemon (only it: one pass per commit) runs
		 * the directory's retention, in the background. */
		retention_after_commit(s->srv, s->root, &s->creds);
		log_info("committed '%s/%s' (job '%s', %u ranks, %llu bytes here) in %lld ms", s->root,
			 s->key.name, s->key.job, s->key.world, (unsigned long long)s->bytes,
			 (long long)(now_ms() - s->started_ms));
		list_for_each(p, &s->ranks)
			rank_tell(list_entry(p, struct rank, slink));
	}
	sjob_free(j);
}

/* The save committed: each local rank's image (complete: a durable rank
 * had every extent checksummed, and copied, before) is what a restart
 * loads from now, before SAVE_DONE tells the client; older images of the
 * same path are stale. */
static void save_images_ready(struct save *s)
{
	struct list *p;

	images_replaced(s->srv, s);
	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		if (r->img && r->state == RANK_DURABLE && !r->wt.held) {
			image_finish(s->srv, r->img, s, true);
			r->img = NULL;
		}
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void commit_submit(struct save *s)
{
	struct sjob *j = sjob_new(s, NULL, commit_run, commit_done, &s->creds);
	struct list *p;
	size_t n = 0;

	if (!j)
		return; /* retried at the next tick */
	n = durable_ranks(s);
	if (!n) {
		sjob_free(j);
		return;
	}
	j->local = calloc(n ? n : 1, sizeof(*j->local));
	j->ranks = calloc(n ? n : 1, sizeof(*j->ranks));
	if (!j->local || !j->ranks) {
		sjob_free(j);
		return;
	}
	list_for_each(p, &s->ranks)
	{
		const struct rank *r = list_entry(p, struct rank, slink);
		/* Read-only on the worker: a durable rank's layout and CRCs
		 * do not change, and the rank outlives the job. */
		j->local[j->n_local++] = (struct index_local){ r->rank, &r->layout, r->crcs };
		j->ranks[j->n_ranks++] = r->rank;
	}
	qsort(j->ranks, j->n_ranks, sizeof(*j->ranks), cmp_u32);
	s->state = SAVE_COMMITTING;
	s->job_busy = true;
	workers_submit(&s->srv->work, &j->w);
}

static void poll_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	char nonce[STORE_ID_LEN + 1];

	/* Deliver to the current claim: a coordinator that claimed after our
	 * ranks were durable (or claimed again) gets them re-addressed. */
	if (j->store->attempt_addressee(j->att, nonce) == 0) {
		for (size_t i = 0; i < j->n_ranks; i++) {
			if (!strcmp(j->to[i], nonce))
				continue;
			/* Recorded before it is sent: see finish_run. */
			memcpy(j->to[i], nonce, sizeof(nonce));
			if (publish(j, j->rk[i], nonce, w->err, sizeof(w->err)) < 0) {
				j->poll = -EAGAIN; /* the store's trouble (poll_done) */
				return;
			}
		}
	}
	j->poll = j->store->attempt_poll(j->att, j->id, w->err, sizeof(w->err));
	if (j->poll == 1)
		forget(j, j->noted);
}

static void poll_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;
	struct list *p;

	s->job_busy = false;
	for (size_t i = 0; i < j->n_ranks; i++)
		memcpy(j->rk[i]->to, j->to[i], sizeof(j->to[i]));
	if (j->poll == -EAGAIN && s->pending && !save_final(s)) {
		save_trouble(s, -EAGAIN, w->err);
	} else if (j->poll < 0) {
		save_fail(s, j->poll == -EAGAIN ? -EIO : j->poll, "%s", w->err);
	} else if (j->poll == 1 && !save_final(s)) {
		s->state = SAVE_COMMITTED;
		s->srv->saves_committed++;
		metrics_save_end(s->srv, s);
		save_images_ready(s);
		log_info("committed '%s/%s' (job '%s') by rank 0's daemon", s->root, s->key.name,
			 s->key.job);
		list_for_each(p, &s->ranks)
			rank_tell(list_entry(p, struct rank, slink));
	}
	sjob_free(j);
}

static void poll_submit(struct save *s)
{
	struct sjob *j = sjob_new(s, NULL, poll_run, poll_done, &s->creds);
	struct list *p;
	size_t n = 0;

	if (!j)
		return;
	/* Only durable ranks are ever addressed (published). */
	n = durable_ranks(s);
	if (!n) {
		sjob_free(j);
		return;
	}
	j->rk = calloc(n ? n : 1, sizeof(*j->rk));
	j->to = calloc(n ? n : 1, sizeof(*j->to));
	if (!j->rk || !j->to) {
		sjob_free(j);
		return;
	}
	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		j->rk[j->n_ranks] = r;
		memcpy(j->to[j->n_ranks++], r->to, sizeof(r->to));
	}
	s->job_busy = true;
	workers_submit(&s->srv->work, &j->w);
}

/* Something changed: move the save on if it can. */
static void save_progress(struct save *s)
{
	if (s->state != SAVE_ACTIVE || s->job_busy || !local_ranks_durable(s) ||
	    now_ms() < s->retry_ms)
		return;
	s->delivered = true;
	if (s->coordinator)
		commit_submit(s);
	/* Other daemons poll for rank 0's commit at every tick. */
}

/* ---- heartbeat ---------------------------------------------------------------- */

static void renew_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;

	w->res = j->store->attempt_renew(j->att, &j->self, w->err, sizeof(w->err));
}

static void renew_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;

	s->renew_busy = false;
	if (w->res == -EOPNOTSUPP || w->res == -ENOENT) {
		s->renew_off = true; /* nothing (more) to renew */
	} else if (w->res < 0 && !s->renew_failing) {
		/* Once per run of failures: an outage is not a log line a
		 * heartbeat. */
		log_warn("save '%s/%s' (attempt %s): its heartbeat failed (tried again every "
			 "s3_heartbeat): %s", s->root, s->key.name, s->id, w->err);
		s->renew_failing = true;
	} else if (w->res == 0) {
		s->renew_failing = false;
	}
	sjob_free(j);
}

/*
 * Every s3_heartbeat while the save is not final, whatever job of it is in
 * flight (a commit whose manifest PUT is slow included): the work area's
 * activity, which `ckptctl gc` and other daemons' sweeps age it by.  On
 * threads of its own (srv->renewals), so that no slow job holds it back.
 */
static void renew_submit(struct save *s, int64_t now)
{
	struct server *srv = s->srv;
	struct sjob *j;

	if (save_final(s) || !s->att || s->renew_busy || s->renew_off || !srv->renewals.n ||
	    !srv->store->attempt_renew || now < s->renew_due_ms)
		return;
	j = sjob_new(s, NULL, renew_run, renew_done, NULL);
	if (!j)
		return;
	s->renew_due_ms = now + (int64_t)srv->cfg.s3_heartbeat_ms;
	s->renew_busy = true;
	workers_submit(&srv->renewals, &j->w);
}

/* ---- cleanup ----------------------------------------------------------------- */

static void cleanup_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	int r;

	struct store_fail f = { .coordinator = j->coordinator, .delivered = j->delivered,
				.mark = j->mark, .created = j->created, .made = j->ranks,
				.n_made = j->n_ranks, .msg = j->msg };

	/* A resumed save that never found its attempt again (att NULL) leaves
	 * its areas to the sweep: its registry entry still names the life
	 * that made them. */
	testgate("cleanup");
	r = j->att ? j->store->attempt_fail(j->att, &f) : 0;
	if (r < 0 && j->noted) {
		/* Not forgotten: the entry stays, and the periodic sweep
		 * (registry_sweep) removes what is left once the storage
		 * answers again. */
		log_warn("save '%s/%s' (attempt %s): its cleanup is incomplete (%s): the sweep "
			 "tries again", j->root, j->key.name, j->id, strerror(-r));
		/* A pending save's records go all the same: it failed, and
		 * must never be resumed by a later life. */
		forget(j, false);
		return;
	}
	if (r < 0)
		log_warn("save '%s/%s' (attempt %s): its cleanup is incomplete (%s): left for "
			 "the work area's creator and `ckptctl gc`", j->root, j->key.name, j->id,
			 strerror(-r));
	/* An area this daemon made stays noted while another daemon may
	 * still commit it; a spill area alone is gone now. */
	forget(j, (j->created && (j->coordinator || !j->delivered)) || (j->noted && !j->created));
}

static void cleanup_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;

	s->job_busy = false;
	/* The attempt id is free for a new save from the next round on
	 * (saves_reap frees this one at the end of this one). */
	log_debug("save '%s/%s' (attempt %s): its failure is cleaned up", s->root, s->key.name,
		  s->id);
	sjob_free(j);
}

/* Runs the failure cleanup of a failed save once no other job of it is in
 * flight. */
static void save_kick(struct save *s)
{
	struct list *p;
	struct sjob *j;
	size_t n = 0;

	if (s->state != SAVE_FAILED || s->cleaned || s->job_busy || s->renew_busy || s->parked ||
	    (!s->att && !s->resumed))
		return;
	list_for_each(p, &s->ranks)
		if (list_entry(p, struct rank, slink)->job_busy)
			return; /* a shard job may still create a file */
	j = sjob_new(s, NULL, cleanup_run, cleanup_done, &s->creds);
	if (!j)
		return;
	list_for_each(p, &s->ranks)
		n++;
	j->ranks = calloc(n ? n : 1, sizeof(*j->ranks));
	if (!j->ranks) {
		sjob_free(j);
		return;
	}
	j->delivered = false;
	j->mark = false;
	list_for_each(p, &s->ranks)
	{
		const struct rank *r = list_entry(p, struct rank, slink);
		/* Only shards this daemon created are its to remove: a rank
		 * refused because its shard exists belongs to another daemon
		 * (another run saving the same attempt), whose commit may
		 * take it. */
		if (r->made)
			j->ranks[j->n_ranks++] = r->rank;
		/* The marker fails the attempt for every daemon: left for a
		 * rank this daemon holds (made) or that failed for a reason of
		 * its own, never for one another daemon holds. */
		j->mark |= r->made || (r->create_err && r->create_err != -EEXIST);
		/* Addressed to a claim: the coordinator may use it at any
		 * moment, so nothing more is written into the area. */
		j->delivered |= r->to[0] != '\0';
	}
	snprintf(j->msg, sizeof(j->msg), "%s", s->msg);
	s->cleaned = true;
	s->job_busy = true;
	workers_submit(&s->srv->work, &j->w);
}

/* ---- begin ------------------------------------------------------------------- */

static struct save *save_new(struct server *srv, struct conn *c, const struct store_key *k,
			     const char *id, const char *root)
{
	struct save *s = calloc(1, sizeof(*s));
	struct sjob *j;

	if (!s)
		return NULL;
	s->srv = srv;
	s->state = SAVE_OPENING;
	s->key = *k;
	memcpy(s->id, id, sizeof(s->id));
	snprintf(s->root, sizeof(s->root), "%s", root);
	snprintf(s->asked_root, sizeof(s->asked_root), "%s", root);
	s->creds = c->creds;
	s->started_ms = now_ms();
	s->deadline_ms = s->started_ms + (int64_t)srv->cfg.commit_deadline_ms;
	list_init(&s->ranks);
	j = sjob_new(s, NULL, open_run, open_done, &s->creds);
	if (!j) {
		free(s);
		return NULL;
	}
	list_add_tail(&srv->saves, &s->link);
	s->job_busy = true;
	workers_submit(&srv->work, &j->w);
	return s;
}

/*
 * A SAVE_BEGIN for a rank the save in progress (the same attempt: same
 * key) already has.  A trainer restarted after its client was killed saves
 * the same name and step again with the same key (the attempt number
 * starts again at 0): if the earlier client's rank is staged, the daemon
 * finishes it without that client, so the new save is not needed, and is
 * told so, with where to watch it (-EALREADY).  Otherwise two live clients
 * claim one rank: -EEXIST.
 */
static int rank_taken(const struct save *s, const struct rank *o, char *err, size_t errlen)
{
	bool gone = !o->conn || o->conn->state == CONN_CLOSED;

	if (gone && o->state == RANK_UPLOADING) {
		snprintf(err, errlen, "rank %u of '%s' (step %llu, this same attempt) is already "
				      "durable on this node: an earlier client of job '%s' saved it, "
				      "and ckptd uploads and commits it without a client (%s%s); "
				      "this save is not needed: `ckptctl spill list` shows it, "
				      "`ckptctl wait` waits for its commit",
			 o->rank, s->key.name, (unsigned long long)s->key.step, s->key.job,
			 s->last_err_ms ? "S3 failing: " : "uploading",
			 s->last_err_ms ? s->last_err : "");
		return -EALREADY;
	}
	if (gone && o->state != RANK_OPENING && o->state != RANK_STAGING &&
	    o->state != RANK_FAILED) {
		snprintf(err, errlen, "rank %u of '%s' (step %llu, this same attempt) was staged "
				      "by an earlier client of job '%s' that is gone, and ckptd "
				      "commits it without that client: this save is not needed "
				      "(`ckptctl wait` waits for its commit)",
			 o->rank, s->key.name, (unsigned long long)s->key.step, s->key.job);
		return -EALREADY;
	}
	snprintf(err, errlen, "rank %u of job '%s' is already saving '%s'", o->rank, s->key.job,
		 s->key.name);
	return -EEXIST;
}

static bool key_same(const struct store_key *a, const struct store_key *b)
{
	return !strcmp(a->job, b->job) && !strcmp(a->run, b->run) && !strcmp(a->name, b->name) &&
	       a->step == b->step && a->attempt == b->attempt && a->world == b->world;
}

int save_begin(struct server *srv, struct conn *c, uint32_t token, uint32_t attempt,
	       struct layout *l, char *err, size_t errlen)
{
	struct store_key k = { .step = l->step, .attempt = attempt, .world = c->world };
	char id[STORE_ID_LEN + 1];
	struct save *s;
	struct rank *r;
	struct list *p;

	if (srv->stopping) {
		snprintf(err, errlen, "ckptd is shutting down");
		return -ESHUTDOWN;
	}
	snprintf(k.job, sizeof(k.job), "%s", c->job);
	snprintf(k.run, sizeof(k.run), "%s", c->run);
	snprintf(k.name, sizeof(k.name), "%s", l->name);
	store_key_id(&k, id);

	s = find_live(srv, c->job, l->name);
	if (s) {
		/* A begin that does not fit the save in progress is refused;
		 * the save in progress is not touched. */
		if (!key_same(&s->key, &k)) {
			snprintf(err, errlen,
				 "rank %u saves '%s' as step %llu, attempt %u, world %u, run '%s'; "
				 "the save in progress is step %llu, attempt %u, world %u, run '%s'",
				 c->rank, l->name, (unsigned long long)k.step, k.attempt, k.world,
				 k.run, (unsigned long long)s->key.step, s->key.attempt,
				 s->key.world, s->key.run);
			return -EINVAL;
		}
		list_for_each(p, &s->ranks)
		{
			const struct rank *o = list_entry(p, struct rank, slink);
			if (o->rank == c->rank)
				return rank_taken(s, o, err, errlen);
		}
		/* The root as the ranks wrote it (no path lookups on the loop). */
		if (strcmp(l->root, s->asked_root) != 0) {
			snprintf(err, errlen, "rank %u saves '%s' to '%s', other ranks to '%s'",
				 c->rank, l->name, l->root, s->asked_root);
			return -EINVAL;
		}
	} else {
		struct save *old = find_final(srv, id);
		if (old) {
			snprintf(err, errlen, "this attempt of '%s' %s%s", l->name,
				 old->state == SAVE_COMMITTED ? "is already committed" :
								"already failed: ",
				 old->state == SAVE_COMMITTED ? "" : old->msg);
			return old->state == SAVE_COMMITTED ? -EEXIST : -ECANCELED;
		}
	}

	r = calloc(1, sizeof(*r));
	if (!r)
		goto nomem;
	r->conn = c;
	r->state = RANK_OPENING;
	r->rank = c->rank;
	r->token = token;
	r->extent = c->slot_bytes;
	r->n_extents = (uint32_t)((l->file_size + c->slot_bytes - 1) / c->slot_bytes);
	r->crcs = calloc(l->n_crcs ? l->n_crcs : 1, sizeof(uint32_t));
	r->got = calloc(r->n_extents / 8 + 1, 1);
	r->t_begin = now_us();
	if (!r->crcs || !r->got)
		goto nomem;
	if (!s) {
		s = save_new(srv, c, &k, id, l->root);
		if (!s)
			goto nomem;
	}
	r->save = s;
	r->layout = *l;
	memset(l, 0, sizeof(*l));
	list_add_tail(&s->ranks, &r->slink);
	list_add_tail(&c->ranks, &r->clink);
	s->delivered = false; /* not every local rank is durable any more */
	s->bytes += r->layout.file_size;
	if (c->resident) {
		char why[256];

		r->img = image_take(srv, c->creds.uid, c->job, c->rank, r->layout.file_size, why,
				    sizeof(why));
		if (!r->img)
			log_info("save '%s' (job '%s'): rank %u keeps no image in memory: %s",
				 r->layout.name, c->job, c->rank, why);
	}
	if (s->state != SAVE_OPENING)
		shard_submit(r);
	return 0;

nomem:
	if (r) {
		free(r->crcs);
		free(r->got);
		free(r);
	}
	snprintf(err, errlen, "ckptd is out of memory");
	return -ENOMEM;
}

int rank_extent(struct rank *r, uint32_t slot, uint64_t file_off, uint64_t len, char *err,
		size_t errlen)
{
	struct conn *c = r->conn;
	uint64_t ext, want;

	if (r->state == RANK_OPENING) {
		snprintf(err, errlen, "EXTENT for save token %u before its SAVE_ACK", r->token);
		return -EPROTO;
	}
	if (r->state != RANK_STAGING || save_final(r->save))
		return 1; /* failed while the client still had extents on the way */
	if (file_off % c->slot_bytes || file_off >= r->layout.file_size) {
		snprintf(err, errlen, "EXTENT file offset %llu is not an extent of the file",
			 (unsigned long long)file_off);
		return -EPROTO;
	}
	ext = file_off / c->slot_bytes;
	want = r->layout.file_size - file_off;
	if (want > c->slot_bytes)
		want = c->slot_bytes;
	if (len != want || (r->got[ext / 8] & (1u << (ext % 8)))) {
		snprintf(err, errlen, "EXTENT %llu: length %llu (expected %llu) or sent twice",
			 (unsigned long long)ext, (unsigned long long)len, (unsigned long long)want);
		return -EPROTO;
	}
	r->got[ext / 8] |= (uint8_t)(1u << (ext % 8));
	r->extents_in++;
	r->bytes_in += len;
	if (r->extents_in == r->n_extents) {
		/* Staged: the daemon owns the rank now. */
		r->state = RANK_WRITING;
		r->t_staged = now_us();
		r->wt.crc_now = true;
		metrics_observe(c->srv, METRICS_STAGE, r->t_staged - r->t_begin);
	}
	writer_extent(&c->w, slot, &r->wt, file_off, len);
	return 0;
}

/* ---- time and shutdown --------------------------------------------------------- */

static void save_deadline(struct save *s)
{
	char missing[256] = "";
	size_t n = 0, shown = 0;
	struct list *p;

	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		if ((r->state == RANK_OPENING || r->state == RANK_STAGING) && shown < 8) {
			n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u",
					      shown ? ", " : "", r->rank);
			shown++;
		}
	}
	if (shown) {
		save_fail(s, -ETIMEDOUT, "rank(s) %s did not finish staging within the commit "
					 "deadline (%llu ms)",
			  missing, (unsigned long long)s->srv->cfg.commit_deadline_ms);
		return;
	}
	if (!s->coordinator) {
		save_fail(s, -ETIMEDOUT,
			  "rank 0's daemon did not commit within the commit deadline (%llu ms)",
			  (unsigned long long)s->srv->cfg.commit_deadline_ms);
		return;
	}
	for (uint32_t r = s->n_present; r < s->key.world && shown < 8; r++) {
		bool local_done = false;
		list_for_each(p, &s->ranks)
		{
			const struct rank *lr = list_entry(p, struct rank, slink);
			local_done |= lr->rank == r && lr->state == RANK_DURABLE;
		}
		/* A local rank still uploading (spill tier) is late too. */
		if (local_done)
			continue;
		n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u", shown ? ", " : "", r);
		shown++;
	}
	save_fail(s, -ETIMEDOUT, "rank(s) %s did not save within the commit deadline (%llu ms)",
		  shown ? missing : "?", (unsigned long long)s->srv->cfg.commit_deadline_ms);
}

/* The commit deadline of a pending save counts only the time it waits for
 * ranks of other daemons: not while it is being resumed or one of its own
 * spilled ranks is still on its way to the store (and not at all when it
 * is whole on this node). */
static bool deadline_held(const struct save *s)
{
	const struct list *p;

	if (!s->pending || save_final(s))
		return false;
	if (s->state == SAVE_OPENING || save_whole_here(s))
		return true;
	list_for_each(p, &s->ranks)
		if (list_entry(p, struct rank, slink)->state == RANK_UPLOADING)
			return true;
	return false;
}

/* Uploads of pending save s whose last round met the store failing. */
static void uploads_again(struct save *s)
{
	struct list *p, *t;

	list_for_each_safe(p, t, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);
		if (r->state == RANK_UPLOADING && !r->job_busy && r->shard)
			rank_upload(r);
	}
}

static void resume_submit(struct save *s);

/* A pending save whose commit found a shard of its own gone from the store:
 * once nothing of it is in flight, it starts over as a save resumed from
 * its records would (resume_run: the area joined, rank 0's daemon claims
 * afresh, every rank sent again unless the store has it whole). */
static void save_resend(struct save *s)
{
	struct list *p;

	if (s->job_busy || s->renew_busy)
		return;
	list_for_each(p, &s->ranks)
		if (list_entry(p, struct rank, slink)->job_busy)
			return;
	log_warn("save '%s/%s' (job '%s', attempt %s): a shard of it is gone from the store: "
		 "sending the node's copy again", s->root, s->key.name, s->key.job, s->id);
	list_for_each(p, &s->ranks)
	{
		struct rank *r = list_entry(p, struct rank, slink);

		s->srv->store->shard_close(r->shard);
		r->shard = NULL;
		r->state = RANK_UPLOADING;
		r->forwarded = false;
		/* Delivered once: never deleted by a failure (as resume_one). */
		snprintf(r->to, sizeof(r->to), "?");
	}
	s->srv->store->attempt_close(s->att);
	s->att = NULL;
	s->resend = false;
	s->resumed = true;
	s->state = SAVE_OPENING;
}

void saves_tick(struct server *srv)
{
	int64_t now = now_ms();
	struct list *p, *t;

	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		int64_t deadline;

		if (deadline_held(s) && s->deadline_ms < now + (int64_t)srv->cfg.commit_deadline_ms)
			s->deadline_ms = now + (int64_t)srv->cfg.commit_deadline_ms;
		deadline = s->deadline_ms;

		/* A daemon that delivered waits a little longer than rank 0's
		 * daemon, which decides (its own deadline comes first). */
		if (!s->coordinator && s->delivered) {
			int64_t grace = (int64_t)srv->cfg.commit_deadline_ms;
			deadline += grace < 60000 ? grace : 60000;
		}
		/* The deadline first: past it, no new commit or poll starts.
		 * A save whole on this node waits for the store only, and
		 * that for as long as it takes (save.h). */
		if ((s->state == SAVE_ACTIVE || s->state == SAVE_OPENING) && now > deadline)
			save_deadline(s);
		if (save_final(s) || now < s->retry_ms) {
			/* Waiting for the store to come back is still being
			 * alive: a collector must not take the area for dead. */
			if (!save_final(s))
				renew_submit(s, now);
			save_kick(s);
			continue;
		}
		if (s->resend && !save_final(s))
			save_resend(s);
		/* A pending save's steps that met the store failing, again. */
		if (s->state == SAVE_OPENING && s->resumed && !s->att && !s->job_busy)
			resume_submit(s);
		if (s->state == SAVE_ACTIVE && s->pending)
			uploads_again(s);
		/* Every local rank must be durable now: a rank that joined
		 * after the others were must not be merged or published
		 * before its own bytes are (a torn checkpoint otherwise). */
		if (s->state == SAVE_ACTIVE && !s->job_busy && local_ranks_durable(s)) {
			if (s->coordinator) {
				commit_submit(s);
			} else {
				poll_submit(s);
			}
		}
		renew_submit(s, now);
		save_kick(s);
	}
}

void saves_stop(struct server *srv, bool all)
{
	struct list *p, *t, *q;

	if (all)
		srv->parking = true;
	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		bool staged = true, spilled = true;

		list_for_each(q, &s->ranks)
		{
			const struct rank *r = list_entry(q, struct rank, slink);
			staged &= r->state != RANK_OPENING && r->state != RANK_STAGING;
			spilled &= r->spill && (r->state == RANK_UPLOADING || r->state == RANK_DURABLE);
		}
		/* Owed a commit: never failed by a stop, parked for the next
		 * life once the daemon goes (its records are on disk). */
		if (s->pending && spilled) {
			if (all)
				save_park(s);
			continue;
		}
		if (all || !staged || s->state == SAVE_OPENING)
			save_fail(s, -ESHUTDOWN, all ? "ckptd stopped before the save committed" :
						       "ckptd is shutting down");
	}
}

static bool rank_free(struct rank *r)
{
	if (r->wt.held || r->job_busy)
		return false;
	if (!r->told)
		rank_tell(r);
	r->save->srv->store->shard_close(r->shard);
	/* A committed save's images became READY at the commit
	 * (save_images_ready); one still here was not complete then: it
	 * holds nothing a restart may load. */
	if (r->img)
		image_finish(r->save->srv, r->img, r->save, false);
	free(r->crcs);
	free(r->got);
	layout_free(&r->layout);
	list_del(&r->slink);
	list_del(&r->clink);
	free(r);
	return true;
}

void saves_reap(struct server *srv)
{
	struct list *p, *t, *q, *u;

	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);

		if (!save_final(s))
			continue;
		save_kick(s);
		if (s->job_busy || s->renew_busy)
			continue; /* a job of the save may read its ranks or attempt */
		list_for_each_safe(q, u, &s->ranks)
			rank_free(list_entry(q, struct rank, slink));
		if (!list_empty(&s->ranks) || s->job_busy ||
		    (s->state == SAVE_FAILED && !s->parked && (s->att || s->resumed) && !s->cleaned))
			continue;
		srv->store->attempt_close(s->att);
		list_del(&s->link);
		free(s);
	}
}

bool saves_busy(struct server *srv)
{
	struct list *p, *q;

	list_for_each(p, &srv->saves)
	{
		const struct save *s = list_entry(p, struct save, link);

		/* A pending save between two tries has nothing to do now: the
		 * next life tries again as well as this one would. */
		if (!s->pending || save_final(s) || s->job_busy || !s->last_err_ms)
			return true;
		list_for_each(q, &s->ranks)
			if (list_entry(q, struct rank, slink)->job_busy)
				return true;
	}
	return false;
}

/* ---- resuming: a later life of the daemon ------------------------------------------ */

static void resume_run(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	int r;

	/* The configuration may have changed since the save was recorded:
	 * a root no longer allowed is not written to (the copy waits). */
	if (!config_root_allowed(j->cfg, j->root)) {
		w->res = -EACCES;
		snprintf(w->err, sizeof(w->err), "root '%.400s' is no longer an allowed root of "
			 "this ckptd", j->root);
		return;
	}
	r = j->store->attempt_resume(j->root, &j->key, j->id, &j->self, j->owner->uid,
				     j->coordinator, &j->out_att, w->err, sizeof(w->err));
	if (r < 0) {
		w->res = r;
		return;
	}
	/* This life owns the areas now: a crash of it leaves them to the
	 * next one (its records make the sweep pass them by). */
	snprintf(j->out_root, sizeof(j->out_root), "%s", j->root);
	registry_note(j, true);
	j->noted = true;
	if (r == 1) {
		j->out_committed = true;
		forget(j, true);
		return;
	}
	/* A claim of this life: ranks of other daemons re-address their
	 * indexes to it (store.h), and none addressed to the earlier life's
	 * claim is merged. */
	if (j->coordinator) {
		w->res = j->store->attempt_claim(j->out_att, &j->self, j->nonce, w->err,
						 sizeof(w->err));
		if (w->res < 0)
			return;
	}
	for (size_t i = 0; i < j->n_ranks; i++) {
		const struct rank *rk = j->rk[i];

		w->res = j->store->shard_resume(j->out_att, rk->rank, rk->layout.file_size,
						rk->extent, &j->out_shards[i], w->err,
						sizeof(w->err));
		if (w->res < 0)
			return;
	}
}

static void resume_done(struct work *w)
{
	struct sjob *j = (struct sjob *)w;
	struct save *s = j->s;
	struct list *p;
	size_t i = 0;

	s->job_busy = false;
	if (j->noted)
		s->noted = true;
	/* Tried again from the start after the store's trouble; else kept
	 * (for the failure's cleanup, or the commit). */
	if (j->out_att && w->res < 0 && store_trouble(w->res) && w->res != -EBADMSG &&
	    !save_final(s)) {
		s->srv->store->attempt_close(j->out_att);
		j->out_att = NULL;
	}
	if (j->out_att)
		s->att = j->out_att;
	if (save_final(s)) {
		/* dropped, or parked, meanwhile */
	} else if (j->out_committed) {
		s->state = SAVE_COMMITTED;
		s->srv->saves_committed++;
		metrics_save_end(s->srv, s);
		log_info("resumed '%s/%s' (job '%s', attempt %s): it had committed before ckptd "
			 "stopped", s->root, s->key.name, s->key.job, s->id);
	} else if (w->res < 0 && store_trouble(w->res) && w->res != -EBADMSG) {
		save_trouble(s, w->res, w->err);
	} else if (w->res < 0) {
		save_fail(s, w->res, "cannot resume: %s", w->err);
	} else {
		list_for_each(p, &s->ranks)
		{
			struct rank *r = list_entry(p, struct rank, slink);
			r->shard = j->out_shards[i];
			j->out_shards[i++] = NULL;
		}
		memcpy(s->nonce, j->nonce, sizeof(s->nonce));
		s->state = SAVE_ACTIVE;
		log_info("resumed '%s/%s' (job '%s', attempt %s, %zu rank%s spilled here): "
			 "uploading", s->root, s->key.name, s->key.job, s->id, i, i == 1 ? "" : "s");
		uploads_again(s);
	}
	sjob_free(j);
	save_kick(s);
}

static void resume_submit(struct save *s)
{
	struct sjob *j = sjob_new(s, NULL, resume_run, resume_done, &s->creds);
	struct list *p;
	size_t n = 0;

	if (!j)
		return; /* the next tick tries again */
	list_for_each(p, &s->ranks)
		n++;
	j->rk = calloc(n ? n : 1, sizeof(*j->rk));
	j->out_shards = calloc(n ? n : 1, sizeof(*j->out_shards));
	if (!j->rk || !j->out_shards) {
		sjob_free(j);
		return;
	}
	list_for_each(p, &s->ranks)
		j->rk[j->n_ranks++] = list_entry(p, struct rank, slink);
	s->job_busy = true;
	workers_submit(&s->srv->work, &j->w);
}

static bool recorded_rank(const struct pending_save *p, uint32_t rank)
{
	for (size_t i = 0; i < p->n_ranks; i++)
		if (p->ranks[i].rank == rank)
			return true;
	return false;
}

/* A pending save found in the records: a save with no client, whose ranks
 * are spilled, made durable and about to be uploaded again. */
static void resume_one(void *ud, struct pending_save *p)
{
	struct server *srv = ud;
	struct save *s = calloc(1, sizeof(*s));
	uint32_t lost = UINT32_MAX;

	if (!s) {
		log_err("spill: out of memory resuming attempt %s", p->id);
		pending_free(p);
		return;
	}
	s->srv = srv;
	s->state = SAVE_OPENING;
	s->key = p->key;
	memcpy(s->id, p->id, sizeof(s->id));
	snprintf(s->root, sizeof(s->root), "%s", p->root);
	snprintf(s->asked_root, sizeof(s->asked_root), "%s", p->root);
	s->creds = p->owner;
	s->started_ms = now_ms();
	s->deadline_ms = s->started_ms + (int64_t)srv->cfg.commit_deadline_ms;
	s->pending = s->resumed = true;
	list_init(&s->ranks);
	for (size_t i = 0; i < p->n_ranks; i++) {
		struct pending_rank *pr = &p->ranks[i];
		struct rank *r = calloc(1, sizeof(*r));

		if (!r) {
			lost = pr->rank;
			break;
		}
		r->save = s;
		r->state = RANK_UPLOADING;
		r->rank = pr->rank;
		r->spill = r->recorded = r->told = true;
		r->extent = pr->extent;
		r->layout = pr->layout;
		memset(&pr->layout, 0, sizeof(pr->layout));
		r->crcs = pr->crcs;
		pr->crcs = NULL;
		r->n_extents = r->extents_in = r->extents_done =
			(uint32_t)((r->layout.file_size + r->extent - 1) / r->extent);
		r->bytes_in = r->bytes_written = r->layout.file_size;
		r->t_begin = r->t_staged = r->t_written = now_us();
		/* The earlier life may have delivered its index (sent is as good
		 * as delivered): the coordinator may use it, so a failure here
		 * must not delete the rank's shard (attempt_fail).  Not a nonce:
		 * the current claim gets it again (poll_run). */
		snprintf(r->to, sizeof(r->to), "?");
		list_init(&r->clink);
		list_add_tail(&s->ranks, &r->slink);
		s->bytes += r->layout.file_size;
		if (r->rank == 0)
			s->coordinator = true;
	}
	/* A local rank that began but was never recorded was not durable
	 * when the earlier life ended: its bytes are gone, so the save can
	 * never commit. */
	for (size_t i = 0; i < p->n_local && lost == UINT32_MAX; i++)
		if (!recorded_rank(p, p->local[i]))
			lost = p->local[i];
	list_add_tail(&srv->saves, &s->link);
	log_info("resuming '%s/%s' (job '%s', attempt %s, uid %u): spilled on this node before "
		 "ckptd stopped", s->root, s->key.name, s->key.job, s->id, (unsigned)s->creds.uid);
	if (lost != UINT32_MAX) {
		save_fail(s, -ECANCELED, "rank %u was not durable on this node when ckptd stopped: "
			  "the save cannot commit", lost);
		pending_free(p);
		return;
	}
	pending_free(p);
	resume_submit(s);
}

static void resume_bad(void *ud, const char *id, const char *why, bool removed)
{
	struct server *srv = ud;

	if (removed)
		log_info("spill: '%s/%s/%s': %s: removed", srv->reg.path, PENDING_DIR, id, why);
	else
		log_err("spill: the save recorded in '%s/%s/%s' cannot be resumed: %s; it is "
			"left there (remove that directory, and the attempt's work area in the "
			"spill directory, to give it up)", srv->reg.path, PENDING_DIR, id, why);
}

unsigned saves_resume(struct server *srv)
{
	return pending_load_all(srv->reg.path, resume_one, resume_bad, srv);
}

/* ---- an operator's drop -------------------------------------------------------------- */

int save_drop(struct server *srv, uid_t uid, const char *what, char *msg, size_t msglen)
{
	struct list *p;

	if (!what[0]) {
		snprintf(msg, msglen, "name the pending save to drop: its attempt id or ROOT/NAME");
		return -EINVAL;
	}
	list_for_each(p, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		char path[sizeof(s->root) + CKPT_MAX_NAME_LEN + 2];

		if (!s->pending || save_final(s))
			continue;
		snprintf(path, sizeof(path), "%s/%s", s->root, s->key.name);
		if (strcmp(what, s->id) && strcmp(what, path))
			continue;
		if (uid != 0 && uid != s->creds.uid) {
			snprintf(msg, msglen, "the pending save %s belongs to another user: only its "
				 "owner or root may drop it", s->id);
			return -EPERM;
		}
		if (s->state == SAVE_COMMITTING) {
			snprintf(msg, msglen, "the commit of %s is in flight (it may commit): try "
				 "again in a moment", s->id);
			return -EBUSY;
		}
		log_warn("save '%s/%s' (job '%s', attempt %s): dropped by uid %u (ckptctl spill "
			 "drop)", s->root, s->key.name, s->key.job, s->id, (unsigned)uid);
		save_fail(s, -ECANCELED, "dropped by uid %u with `ckptctl spill drop`: its spilled "
			  "copy is removed", (unsigned)uid);
		snprintf(msg, msglen, "dropped '%s' (attempt %s): it will not commit; its spilled "
			 "copy, its records and what it left in S3 are being removed", path, s->id);
		return 0;
	}
	snprintf(msg, msglen, "no pending spilled save '%s' in this ckptd (`ckptctl spill list` "
		 "shows them)", what);
	return -ENOENT;
}
