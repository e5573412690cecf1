/* SPDX-License-Identifier: MIT */
/* status.c - the JSON status report (schema in status.h). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/conn.h"
#include "daemon/metrics.h"
#include "daemon/resident.h"
#include "daemon/save.h"
#include "daemon/server.h"
#include "daemon/share.h"
#include "daemon/status.h"
#include "daemon/users.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

static json_t *any_string(const char *s);

/* Seconds with millisecond precision: 43.101, not 43.100999999999999. */
static json_t *seconds(int64_t ms)
{
	return json_real((double)ms / 1000.0);
}

static json_t *save_json(const struct save *s, int64_t now)
{
	json_t *ranks = json_array();
	uint64_t bytes = 0, staged = 0, written = 0, uploaded = 0;
	bool spill = false, local_durable = true;
	int64_t age_ms = now - s->started_ms;
	const struct list *p;
	json_t *o;

	list_for_each(p, &s->ranks)
	{
		const struct rank *r = list_entry(p, struct rank, slink);
		uint64_t up = __atomic_load_n(&r->uploaded, __ATOMIC_RELAXED);
		bool here = r->state == RANK_UPLOADING || r->state == RANK_DURABLE;
		json_t *rj;

		bytes += r->layout.file_size;
		staged += r->bytes_in;
		written += r->bytes_written;
		uploaded += up;
		spill |= r->spill;
		local_durable &= here;
		rj = json_pack("{s:I, s:o, s:I, s:I, s:I, s:b}", "rank", (json_int_t)r->rank,
			       "client", !r->conn || r->conn->state == CONN_CLOSED ?
						 json_null() :
						 json_integer(r->conn->id),
			       "bytes", (json_int_t)r->layout.file_size, "staged",
			       (json_int_t)r->bytes_in, "written", (json_int_t)r->bytes_written,
			       "durable", r->state == RANK_DURABLE);
		/* A spilled rank: durable on this node's disk ("spilled") once
		 * written and fsynced, then uploaded from there. */
		if (rj && r->spill) {
			json_object_set_new(rj, "spilled", json_boolean(here));
			json_object_set_new(rj, "uploaded", json_integer((json_int_t)up));
		}
		json_array_append_new(ranks, rj);
	}
	o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:s, s:o, s:I, s:I, s:I, s:o, s:f}", "job",
			 s->key.job, "name", s->key.name, "root", s->root, "attempt", s->id, "step",
			 (json_int_t)s->key.step, "world", (json_int_t)s->key.world, "state",
			 save_state_name(s), "ranks", ranks, "bytes", (json_int_t)bytes, "staged",
			 (json_int_t)staged, "written", (json_int_t)written, "age_s", seconds(age_ms),
			 "write_gibps",
			 age_ms > 0 ? (double)written / ((double)age_ms / 1000.0) /
					      (double)(1ull << 30) :
				      0.0);
	/* The S3 backend calls an extent written when S3 acknowledged its
	 * part (or its PUT): so, for such a root, what is uploaded; with the
	 * spill tier, written is what the node's disk has, and the upload
	 * comes after. */
	if (o && s3_is_url(s->root))
		json_object_set_new(o, "s3_uploaded",
				    json_integer((json_int_t)(spill ? uploaded : written)));
	if (o && spill)
		json_object_set_new(o, "local_durable",
				    json_boolean(local_durable && !list_empty(&s->ranks)));
	/* Owed a commit (save.h): what `ckptctl spill list` shows. */
	if (o && s->pending)
		json_object_set_new(
			o, "pending",
			json_pack("{s:b, s:I, s:o, s:o, s:o}", "resumed", s->resumed, "tries",
				  (json_int_t)s->rounds, "last_error",
				  s->last_err_ms ? any_string(s->last_err) : json_null(),
				  "last_error_age_s",
				  s->last_err_ms ? seconds(now - s->last_err_ms) : json_null(),
				  "next_try_s",
				  s->retry_ms > now ? seconds(s->retry_ms - now) : json_null()));
	return o;
}

void status_tick(struct server *srv)
{
	struct status_rate *w = &srv->s3_up;
	struct s3_client *c = store_s3_client();
	struct s3_stats st;
	int64_t now;

	if (!c)
		return;
	now = now_ms();
	if (w->n && now - w->t_ms[(w->next + STATUS_RATE_SAMPLES - 1) % STATUS_RATE_SAMPLES] <
			    STATUS_RATE_EVERY_MS)
		return;
	s3_client_stats(c, &st);
	w->t_ms[w->next] = now;
	w->bytes[w->next] = st.bytes_up;
	w->next = (w->next + 1) % STATUS_RATE_SAMPLES;
	if (w->n < STATUS_RATE_SAMPLES)
		w->n++;
}

/* The "s3" object (status.h), or NULL without an S3 client. */
static json_t *s3_json(struct server *srv, int64_t now)
{
	const struct status_rate *w = &srv->s3_up;
	struct s3_client *c = store_s3_client();
	const struct s3_conf *conf;
	struct s3_stats st;
	double rate = 0.0, window_ms = 0.0;
	json_t *o;

	if (!c)
		return NULL;
	conf = s3_client_conf(c);
	s3_client_stats(c, &st);
	/* From the oldest sample still held to now (the newest figure). */
	if (w->n) {
		unsigned oldest = (w->next + STATUS_RATE_SAMPLES - w->n) % STATUS_RATE_SAMPLES;
		window_ms = (double)(now - w->t_ms[oldest]);
		if (window_ms > 0 && st.bytes_up >= w->bytes[oldest])
			rate = (double)(st.bytes_up - w->bytes[oldest]) / (window_ms / 1000.0);
	}
	o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
			 "endpoint", conf->endpoint, "region", conf->region, "parts_in_flight_max",
			 (json_int_t)conf->parts_in_flight, "requests", (json_int_t)st.requests,
			 "retries", (json_int_t)st.retries, "failures", (json_int_t)st.failures,
			 "bytes_up", (json_int_t)st.bytes_up, "bytes_down",
			 (json_int_t)st.bytes_down, "parts_done", (json_int_t)st.parts_done,
			 "in_flight", (json_int_t)st.in_flight, "queued", (json_int_t)st.queued,
			 "up_bytes_per_s", (json_int_t)(rate + 0.5), "rate_window_s",
			 seconds((int64_t)window_ms));
	/* The spill tier's directory, or null: off. */
	if (o)
		json_object_set_new(o, "spill_dir", srv->cfg.s3_spill_dir ?
							    json_string(srv->cfg.s3_spill_dir) :
							    json_null());
	return o;
}

/* A string of the user's or the admin's choosing (a root, a path) is any
 * bytes, not always the UTF-8 JSON needs: bytes that are not printable
 * ASCII are shown as '?' rather than failing the whole report. */
static json_t *any_string(const char *s)
{
	json_t *j;
	char *copy;

	if (!s)
		return json_null();
	j = json_string(s);
	if (j)
		return j;
	copy = strdup(s);
	for (char *p = copy; p && *p; p++)
		if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
			*p = '?';
	j = copy ? json_string(copy) : NULL;
	free(copy);
	return j ? j : json_null();
}

/* "last_commit": the newest commit the asker may see (as "saves": their
 * own, everyone's for root), or null. */
static json_t *last_commit_json(struct server *srv, uid_t uid, bool all, int64_t now)
{
	const struct metrics_commit *c = metrics_last_commit(srv, uid, all);
	json_t *o;

	if (!c)
		return json_null();
	o = json_pack("{s:o, s:s, s:s, s:I, s:I, s:o}", "root", any_string(c->root), "name",
		      c->name, "job", c->job, "step", (json_int_t)c->step, "bytes",
		      (json_int_t)c->bytes, "age_s", seconds(now - c->at_ms));
	return o ? o : json_null();
}

int status_report(struct server *srv, uid_t uid, char **ret_json)
{
	const struct config *cfg = &srv->cfg;
	int64_t now = now_ms();
	json_t *roots = json_array(), *clients = json_array(), *saves = json_array();
	bool all = uid == 0;
	const struct list *p;
	json_t *top;
	char *text;

	for (size_t i = 0; i < cfg->n_roots; i++)
		json_array_append_new(roots, json_string(cfg->roots[i]));
	/* A user sees their own jobs; root sees everything. */
	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);
		if (!c->job[0] || (!all && c->creds.uid != uid) ||
		    (c->state == CONN_CLOSED && list_empty(&c->ranks)))
			continue;
		json_array_append_new(
			clients,
			json_pack("{s:I, s:I, s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "id",
				  (json_int_t)c->id, "pid", (json_int_t)c->pid, "uid",
				  (json_int_t)c->creds.uid, "job", c->job, "run", c->run, "rank",
				  (json_int_t)c->rank, "world", (json_int_t)c->world, "arena_bytes",
				  (json_int_t)c->arena_bytes, "slot_bytes", (json_int_t)c->slot_bytes,
				  "slots", (json_int_t)(c->writer_ok ? c->w.n_slots : 0),
				  "slots_in_use", (json_int_t)(c->writer_ok ? c->w.held : 0),
				  "connected", c->state != CONN_CLOSED));
	}
	list_for_each(p, &srv->saves)
	{
		const struct save *s = list_entry(p, struct save, link);
		if ((s->state == SAVE_COMMITTED || s->state == SAVE_FAILED) ||
		    (!all && s->creds.uid != uid))
			continue;
		json_array_append_new(saves, save_json(s, now));
	}
	top = json_pack("{s:s, s:I, s:o, s:{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:I, s:o, s:o, "
			"s:{s:I, s:I, s:I, s:I}, s:f, s:f, s:b}",
			"version", CKPT_VERSION, "pid", (json_int_t)getpid(), "uptime_s",
			seconds(now - srv->start_ms), "config", "socket", cfg->socket_path, "roots",
			roots, "arena_max", (json_int_t)cfg->arena_max, "arena_total",
			(json_int_t)cfg->arena_total, "uring_depth", (json_int_t)cfg->uring_depth,
			"disk_depth", (json_int_t)cfg->disk_depth,
			"commit_deadline_ms", (json_int_t)cfg->commit_deadline_ms, "max_clients",
			(json_int_t)cfg->max_clients, "max_clients_per_uid",
			(json_int_t)cfg->max_clients_per_uid, "arena_bytes_total",
			(json_int_t)srv->arena_in_use, "clients", clients, "saves", saves, "totals",
			"saves_committed", (json_int_t)srv->saves_committed, "saves_failed",
			(json_int_t)srv->saves_failed, "saves_refused",
			(json_int_t)srv->saves_refused, "bytes_written",
			(json_int_t)srv->bytes_written, "max_loop_stall_ms",
			(double)srv->max_stall_us / 1000.0, "max_loop_cpu_ms",
			(double)srv->max_busy_us / 1000.0, "all_users", all);
	if (!top)
		return -ENOMEM;
	{
		/* The retention policies of the config (retention.h), and what
		 * the daemon's passes removed. */
		json_t *ret = json_array(), *cfgj = json_object_get(top, "config");

		for (size_t i = 0; ret && i < cfg->n_retention; i++)
			json_array_append_new(ret, json_pack("{s:s, s:s}", "root",
							     cfg->retention[i].root, "policy",
							     cfg->retention[i].text));
		if (!ret || !cfgj || json_object_set_new(cfgj, "retention", ret) < 0 ||
		    json_object_set_new(cfgj, "retention_sweep_s",
					json_integer((json_int_t)(cfg->retention_sweep_ms / 1000))) <
			    0 ||
		    json_object_set_new(top, "retention",
					json_pack("{s:I, s:I}", "removed",
						  (json_int_t)srv->prune_deleted, "errors",
						  (json_int_t)srv->prune_errors)) < 0) {
			json_decref(top);
			return -ENOMEM;
		}
	}
	{
		/* Each user's part of the node (users.h): what it holds against
		 * arena_per_uid and max_clients_per_uid; a user sees its own. */
		json_t *users = users_json(srv, uid, all), *cfgj = json_object_get(top, "config");
		if (!users || !cfgj || json_object_set_new(top, "users", users) < 0 ||
		    json_object_set_new(cfgj, "arena_per_uid",
					json_integer((json_int_t)cfg->arena_per_uid)) < 0 ||
		    json_object_set_new(top, "connections_evicted",
					json_integer((json_int_t)srv->conns_evicted)) < 0) {
			json_decref(top);
			return -ENOMEM;
		}
	}
	{
		json_t *res = resident_json(srv, uid, all);
		if (!res || json_object_set_new(top, "resident", res) < 0 ||
		    json_object_set_new(top, "resident_bytes",
					json_integer((json_int_t)srv->resident_bytes)) < 0) {
			json_decref(top);
			return -ENOMEM;
		}
	}
	{
		json_t *pools = json_array();
		if (pools)
			share_status(srv, pools, uid, all);
		/* The node's totals for root; a user sees its own pools. */
		if (!pools ||
		    json_object_set_new(top, "loads",
					all ? json_pack("{s:I, s:I, s:I, s:I, s:o}", "disk_bytes",
							(json_int_t)srv->load_disk_bytes, "s3_bytes",
							(json_int_t)srv->load_s3_bytes, "shared_bytes",
							(json_int_t)srv->load_shared_bytes, "pool_bytes",
							(json_int_t)srv->share_bytes, "pools", pools) :
					      json_pack("{s:o}", "pools", pools)) < 0) {
			json_decref(top);
			return -ENOMEM;
		}
	}
	if (json_object_set_new(top, "last_commit", last_commit_json(srv, uid, all, now)) < 0 ||
	    json_object_set_new(top, "metrics",
				json_pack("{s:o, s:o}", "listen",
					  any_string(metrics_listen_addr(srv)), "textfile",
					  any_string(cfg->metrics_textfile))) < 0) {
		json_decref(top);
		return -ENOMEM;
	}
	if (store_s3_client()) {
		json_t *s3 = s3_json(srv, now);
		if (!s3 || json_object_set_new(top, "s3", s3) < 0) {
			json_decref(top);
			return -ENOMEM;
		}
	}
	/* Three decimals are what the figures carry. */
	text = json_dumps(top, JSON_COMPACT | JSON_REAL_PRECISION(10));
	json_decref(top);
	if (!text)
		return -ENOMEM;
	*ret_json = text;
	return 0;
}
