/* SPDX-License-Identifier: MIT */
/* status.c - the JSON status report (schema in status.h). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/server.h"
#include "daemon/status.h"

static const char *save_state(const struct save *s)
{
	bool staged = true, durable = true;

	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
		const struct rank_save *rs = list_entry(p, struct rank_save, slink);
		staged &= rs->staged;
		durable &= rs->durable;
	}
	if (!staged)
		return "staging";
	return durable ? "waiting" : "writing";
}

static json_t *save_json(const struct save *s, int64_t now)
{
	json_t *ranks = json_array();
	uint64_t bytes = 0, staged = 0, written = 0;
	double age = (double)(now - s->started_ms) / 1000.0;

	for (struct list *p = s->ranks.next; p != &s->ranks; p = p->next) {
		const struct rank_save *rs = list_entry(p, struct rank_save, slink);
		bytes += rs->layout.file_size;
		staged += rs->bytes_received;
		written += rs->bytes_written;
		json_array_append_new(
			ranks, json_pack("{s:I, s:o, s:I, s:I, s:I, s:b}", "rank", (json_int_t)rs->rank,
					 "client", rs->client->gone ? json_null() :
								      json_integer(rs->client->id),
					 "bytes", (json_int_t)rs->layout.file_size, "staged",
					 (json_int_t)rs->bytes_received, "written",
					 (json_int_t)rs->bytes_written, "durable", rs->durable));
	}
	return json_pack("{s:s, s:s, s:s, s:I, s:s, s:o, s:I, s:I, s:I, s:f, s:f}", "job", s->job,
			 "name", s->name, "root", s->root, "world", (json_int_t)s->world, "state",
			 save_state(s), "ranks", ranks, "bytes", (json_int_t)bytes, "staged",
			 (json_int_t)staged, "written", (json_int_t)written, "age_s", age,
			 "write_gibps",
			 age > 0 ? (double)written / age / (double)(1ull << 30) : 0.0);
}

int status_report(struct server *srv, char **ret_json)
{
	const struct config *cfg = &srv->cfg;
	int64_t now = now_ms();
	json_t *roots = json_array(), *clients = json_array(), *saves = json_array();
	json_t *top;
	char *text;

	for (size_t i = 0; i < cfg->n_roots; i++)
		json_array_append_new(roots, json_string(cfg->roots[i]));
	for (struct list *p = srv->clients.next; p != &srv->clients; p = p->next) {
		const struct client *c = list_entry(p, struct client, link);
		if (c->role != PROTO_ROLE_CLIENT)
			continue;
		json_array_append_new(
			clients,
			json_pack("{s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "id",
				  (json_int_t)c->id, "pid", (json_int_t)c->pid, "uid",
				  (json_int_t)c->uid, "job", c->job, "rank", (json_int_t)c->rank,
				  "world", (json_int_t)c->world, "arena_bytes",
				  (json_int_t)c->arena_bytes, "slot_bytes", (json_int_t)c->slot_bytes,
				  "slots", (json_int_t)c->n_slots, "slots_in_use",
				  (json_int_t)c->slots_held, "connected", !c->gone));
	}
	for (struct list *p = srv->saves.next; p != &srv->saves; p = p->next) {
		const struct save *s = list_entry(p, struct save, link);
		if (s->state == SAVE_ACTIVE)
			json_array_append_new(saves, save_json(s, now));
	}
	top = json_pack(
		"{s:s, s:I, s:f, s:{s:s, s:o, s:I, s:I, s:I, s:I}, s:I, s:o, s:o, s:{s:I, s:I, s:I}}",
		"version", CKPT_VERSION, "pid", (json_int_t)getpid(), "uptime_s",
		(double)(now - srv->start_ms) / 1000.0, "config", "socket", cfg->socket_path,
		"roots", roots, "arena_max", (json_int_t)cfg->arena_max, "arena_total",
		(json_int_t)cfg->arena_total, "uring_depth", (json_int_t)cfg->uring_depth,
		"commit_deadline_ms", (json_int_t)cfg->commit_deadline_ms, "arena_bytes_total",
		(json_int_t)srv->arena_in_use, "clients", clients, "saves", saves, "totals",
		"saves_committed", (json_int_t)srv->saves_committed, "saves_failed",
		(json_int_t)srv->saves_failed, "bytes_written", (json_int_t)srv->bytes_written);
	if (!top)
		return -ENOMEM;
	text = json_dumps(top, JSON_COMPACT);
	json_decref(top);
	if (!text)
		return -ENOMEM;
	*ret_json = text;
	return 0;
}
