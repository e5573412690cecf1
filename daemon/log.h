/* SPDX-License-Identifier: MIT */
/*
 * log.h - daemon logging: one line per event on stderr, with the "<N>"
 * priority prefix journald understands (sd-daemon(3)).
 */
#ifndef CKPTD_LOG_H
#define CKPTD_LOG_H

#include <syslog.h>

/* Lines below this priority are dropped (LOG_INFO by default; -v: LOG_DEBUG). */
void log_set_level(int level);

void log_msg(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)   log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
