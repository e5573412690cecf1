/* SPDX-License-Identifier: MIT */
/*
 * spill.c - ckptctl spill list | spill drop ID|ROOT/NAME: the saves the
 * running daemon owes a commit through the spill tier, and giving one up.
 *
 * A spilled save is durable on the node once its ranks' files are fsynced
 * there: the daemon keeps it (across S3 outages, the trainer's exit and its
 * own restarts) until S3 takes it (daemon/save.h).  `list` shows those
 * saves from the status report ("pending"); `drop` asks the daemon
 * (SPILL_DROP of proto.h) to give one up: it fails the save and removes
 * its spilled copy, its records and what it left in S3.  The daemon lets
 * only the save's owner, or root, drop it.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "shm/proto.h"

static uint64_t num(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) :
								 0;
}

static const char *str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "?";
}

/* One pending save in text: the attempt, where, whose, how far, and what
 * the store said last. */
static int print_one(const json_t *s)
{
	const json_t *pd = json_object_get(s, "pending");
	char *where = NULL, *job = NULL, *why = NULL, a[32], b[32], t1[32], t2[32];
	char path[8192];
	const char *last = json_string_value(json_object_get(pd, "last_error"));
	json_t *next = json_object_get(pd, "next_try_s");
	json_t *age = json_object_get(pd, "last_error_age_s");

	snprintf(path, sizeof(path), "%s/%s", str(s, "root"), str(s, "name"));
	where = ctl_display(path);
	job = ctl_display(str(s, "job"));
	why = last ? ctl_display(last) : NULL;
	if (!where || !job || (last && !why)) {
		free(where);
		free(job);
		free(why);
		return -ENOMEM;
	}
	printf("%s  %s  job %s  step %llu  %s%s, %s of %s in S3\n", str(s, "attempt"), where,
	       job, (unsigned long long)num(s, "step"), str(s, "state"),
	       json_is_true(json_object_get(pd, "resumed")) ? " (resumed)" : "",
	       ctl_human_size(num(s, "s3_uploaded"), a, sizeof(a)),
	       ctl_human_size(num(s, "bytes"), b, sizeof(b)));
	if (why)
		printf("    %llu tr%s failed, the last %s ago: %s%s%s\n",
		       (unsigned long long)num(pd, "tries"), num(pd, "tries") == 1 ? "y" : "ies",
		       ctl_human_duration(json_is_number(age) ? json_number_value(age) : -1, t1,
					  sizeof(t1)),
		       why, json_is_number(next) ? "; next try in " : "",
		       json_is_number(next) ?
			       ctl_human_duration(json_number_value(next), t2, sizeof(t2)) :
			       "");
	free(where);
	free(job);
	free(why);
	return 0;
}

static int spill_list(const char *path, bool json)
{
	json_t *st, *saves, *s;
	size_t i, n = 0;
	int r;

	r = ctl_status_get(path, &st);
	if (r < 0)
		return ctl_daemon_gone(r) ? CTL_EXIT_NO_DAEMON : CTL_EXIT_ERROR;
	saves = json_object_get(st, "saves");
	json_array_foreach(saves, i, s)
	{
		if (!json_is_object(json_object_get(s, "pending")))
			continue;
		n++;
		r = json ? ctl_json_print(s, JSON_REAL_PRECISION(15)) : print_one(s);
		if (r < 0)
			break;
	}
	if (r == 0 && !json && !n)
		printf("no spilled save is waiting for S3%s\n",
		       json_is_true(json_object_get(st, "all_users")) ? "" : " (of yours)");
	json_decref(st);
	if (r < 0) {
		ctl_err("out of memory");
		return CTL_EXIT_ERROR;
	}
	return 0;
}

static int spill_drop(const char *path, const char *what, bool json)
{
	_Alignas(8) unsigned char buf[PROTO_MSG_MAX];
	const struct proto_spill_reply *rep = (const void *)buf;
	struct proto_spill_drop req;
	int sock, r;

	if (strlen(what) >= sizeof(req.what)) {
		ctl_err("spill drop: '%s' is too long: name the save by its attempt id "
			"(ckptctl spill list)", what);
		return CTL_EXIT_USAGE;
	}
	sock = ctl_session(path);
	if (sock < 0)
		return ctl_daemon_gone(sock) ? CTL_EXIT_NO_DAEMON : CTL_EXIT_ERROR;
	proto_init(&req.h, PROTO_SPILL_DROP, sizeof(req));
	snprintf(req.what, sizeof(req.what), "%s", what);
	r = proto_send(sock, &req, sizeof(req), -1);
	if (r < 0) {
		ctl_err("sending to '%s': %s", path, strerror(-r));
		close(sock);
		return ctl_daemon_gone(r) ? CTL_EXIT_NO_DAEMON : CTL_EXIT_ERROR;
	}
	r = ctl_expect(sock, path, PROTO_SPILL_REPLY, buf, NULL);
	close(sock);
	if (r == -ECONNRESET) {
		ctl_err("(a ckptd older than this ckptctl does not know `spill drop`)");
		return CTL_EXIT_ERROR;
	}
	if (r < 0)
		return CTL_EXIT_ERROR;
	if (rep->err < 0) {
		ctl_err("spill drop: %s", rep->msg);
		return rep->err == -EPERM ? CTL_EXIT_REFUSED : CTL_EXIT_ERROR;
	}
	if (json) {
		json_t *j = json_pack("{s:s, s:b, s:s}", "what", what, "dropped", 1, "message",
				      rep->msg);
		r = j ? ctl_json_line(j) : -ENOMEM;
		json_decref(j);
		if (r < 0) {
			ctl_err("out of memory");
			return CTL_EXIT_ERROR;
		}
	} else {
		char *m = ctl_display(rep->msg);
		printf("%s\n", m ? m : "dropped");
		free(m);
	}
	return 0;
}

int ctl_spill(const char *opt_socket, const char *opt_config, const char *sub,
	      const char *what, bool json)
{
	char *path = ctl_socket_path(opt_socket, opt_config);
	int ret;

	if (!path)
		return CTL_EXIT_ERROR;
	ret = !strcmp(sub, "list") ? spill_list(path, json) : spill_drop(path, what, json);
	free(path);
	return ret;
}
