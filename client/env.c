/* SPDX-License-Identifier: MIT */
/*
 * env.c - what the library learns from the process it runs in: the CPUs it
 * may use, its umask, and the run id that launchers put in the environment.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/internal.h"
#include "format/names.h"

/* ---- CPUs and copy threads ---- */

unsigned env_cpu_count(void)
{
	/* The affinity mask, not the machine: a rank pinned to 4 of 64 CPUs
	 * (by a launcher, cgroup cpuset or taskset) has 4.  Grow the set until
	 * the kernel's mask fits (machines with more than 1024 CPUs). */
	for (size_t n = 1024; n <= (1u << 20); n *= 2) {
		cpu_set_t *set = CPU_ALLOC(n);
		size_t sz = CPU_ALLOC_SIZE(n);
		int count;

		if (!set)
			break;
		if (sched_getaffinity(0, sz, set) == 0) {
			count = CPU_COUNT_S(sz, set);
			CPU_FREE(set);
			return count > 0 ? (unsigned)count : 1;
		}
		CPU_FREE(set);
		if (errno != EINVAL)
			break;
	}
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	return online > 0 ? (unsigned)online : 1;
}

unsigned env_copy_threads_default(unsigned cpus, const char *local_world_size, char *why,
				  size_t whylen)
{
	unsigned long local = 1;
	const char *note = "";
	unsigned n;

	if (local_world_size) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(local_world_size, &end, 10);
		if (errno || !isdigit((unsigned char)*local_world_size) || *end || v < 1 ||
		    v > CKPT_MAX_WORLD) {
			note = " (LOCAL_WORLD_SIZE is not a number in 1..65536: ignored)";
			cli_log(CKPT_LOG_WARNING, "$LOCAL_WORLD_SIZE '%.40s' is not a number in "
				"1..%u: copy threads count this process as the only rank on "
				"the node", local_world_size, CKPT_MAX_WORLD);
		} else {
			local = v;
		}
	}
	if (cpus == 0)
		cpus = 1;
	n = (unsigned)(cpus / local);
	if (n < 1)
		n = 1;
	if (n > CLI_MAX_COPY_THREADS)
		n = CLI_MAX_COPY_THREADS;
	snprintf(why, whylen, "default: %u usable CPUs / %lu local rank%s = %u%s%s", cpus, local,
		 local == 1 ? "" : "s", n, cpus / local > CLI_MAX_COPY_THREADS ? " (the cap)" : "",
		 note);
	return n;
}

/* ---- copy threads' priority ---- */

/*
 * How much lower than the trainer's threads the host copy threads run:
 * $CKPT_COPY_NICE, 0..19, added to their nice value.  Staging shares the
 * CPUs with the training step that runs while it copies; the step's own
 * threads (torch's intra-op pool) wait for each other, so a copy thread
 * that takes a CPU from one of them stalls all of them.  A higher nice
 * value gives the step's threads the CPUs whenever they want them and the
 * copies the rest; a trainer that waits for staging leaves every CPU to
 * them.  Not set or not a number in range: the default (logged).
 */
int env_copy_nice(const char *value)
{
	char *end;
	long v;

	if (!value || !*value)
		return CLI_COPY_NICE_DEFAULT;
	errno = 0;
	v = strtol(value, &end, 10);
	if (errno || *end || !isdigit((unsigned char)*value) || v > 19) {
		cli_log(CKPT_LOG_WARNING, "$CKPT_COPY_NICE '%.40s' is not a number in 0..19: the "
			"copy threads use the default, %d", value, CLI_COPY_NICE_DEFAULT);
		return CLI_COPY_NICE_DEFAULT;
	}
	return (int)v;
}

/* ---- umask ---- */

int env_parse_umask(const char *status, unsigned *ret_umask)
{
	const char *p = status;
	unsigned v = 0;
	int digits = 0;

	for (;;) {
		if (strncmp(p, "Umask:", 6) == 0)
			break;
		p = strchr(p, '\n');
		if (!p)
			return -ENOENT;
		p++;
	}
	p += 6;
	while (*p == ' ' || *p == '\t')
		p++;
	for (; *p >= '0' && *p <= '7'; p++) {
		v = v * 8 + (unsigned)(*p - '0');
		if (++digits > 4)
			return -EBADMSG;
	}
	if (digits == 0 || (*p != '\n' && *p != '\0') || v > 0777)
		return -EBADMSG;
	*ret_umask = v;
	return 0;
}

int env_umask(unsigned *ret_umask)
{
	/* procfs reports a size of 0, so read up to a fixed cap rather than
	 * by the file size (fs_read_file_at); "Umask:" is among the first
	 * lines (Linux >= 4.7). */
	char buf[4096];
	size_t len = 0;
	int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	int r;

	if (fd < 0)
		return -errno;
	while (len < sizeof(buf) - 1) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			close(fd);
			return r;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return env_parse_umask(buf, ret_umask);
}

/* ---- run id ---- */

/* Makes `raw` a valid run id in out: outside characters become '_'; a value
 * too long keeps its start and ends in "-" and a hash of the whole, so that
 * two long ids differing only at the end stay different. */
static void run_sanitise(const char *raw, char out[CKPT_MAX_RUN_LEN + 1])
{
	size_t n = strlen(raw);

	if (n > CKPT_MAX_RUN_LEN) {
		uint32_t h = 2166136261u; /* FNV-1a */
		for (size_t i = 0; i < n; i++) {
			h ^= (unsigned char)raw[i];
			h *= 16777619u;
		}
		size_t keep = CKPT_MAX_RUN_LEN - 9;
		for (size_t i = 0; i < keep; i++)
			out[i] = name_portable_char(raw[i]) ? raw[i] : '_';
		snprintf(out + keep, CKPT_MAX_RUN_LEN + 1 - keep, "-%08x", h);
		return;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = name_portable_char(raw[i]) ? raw[i] : '_';
	out[n] = '\0';
}

static const char *nonempty(env_get_fn get, const char *name)
{
	const char *v = get(name);
	return v && *v ? v : NULL;
}

int env_run_id(const char *opt_run, env_get_fn get, char ret_run[CKPT_MAX_RUN_LEN + 1],
	       const char **ret_source, char *err, size_t errlen)
{
	char raw[2 * 4096 + 2];
	const char *v, *count;

	if (opt_run) {
		if (!name_run_ok(opt_run, err, errlen))
			return -EINVAL;
		memcpy(ret_run, opt_run, strlen(opt_run) + 1);
		*ret_source = "options";
		return 0;
	}
	if ((v = nonempty(get, "CKPT_RUN_ID"))) {
		snprintf(raw, sizeof(raw), "%.4096s", v);
		*ret_source = "CKPT_RUN_ID";
	} else if ((v = nonempty(get, "TORCHELASTIC_RUN_ID"))) {
		count = nonempty(get, "TORCHELASTIC_RESTART_COUNT");
		snprintf(raw, sizeof(raw), "%.4096s-%.4096s", v, count ? count : "0");
		*ret_source = "TORCHELASTIC_RUN_ID-TORCHELASTIC_RESTART_COUNT";
	} else if ((v = nonempty(get, "SLURM_JOB_ID"))) {
		count = nonempty(get, "SLURM_RESTART_COUNT");
		snprintf(raw, sizeof(raw), "%.4096s.%.4096s", v, count ? count : "0");
		*ret_source = "SLURM_JOB_ID.SLURM_RESTART_COUNT";
	} else {
		ret_run[0] = '\0';
		*ret_source = "none";
		return 0;
	}
	run_sanitise(raw, ret_run);
	return 0;
}
