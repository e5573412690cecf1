# SPDX-License-Identifier: MIT
"""The targets of benchmark protocol v2 and the views of a results file: the
table run.py prints and the Markdown kept in bench/RESULTS.md
(`python3 bench/run.py --markdown FILE`).  Formatting and judging only:
nothing here measures or keeps a figure."""

MIB = 1 << 20

# (scenario, key, op, bound, kind): kind "value" judges scenario[key];
# "ratio" the median of ratios[key]; "peer" the same, except that when the
# ratio's ceiling is below the bound, the target counts as met at median >=
# 0.9 x ceiling (BENCH.md: on a slow disk every writer is disk-bound).
TARGETS = [
    ("save-2g", "call_ms", "<=", 1.0, "value"),
    ("save-2g", "staging_vs_copy_limit", ">=", 0.9, "ratio"),
    ("save-2g", "commit_vs_disk_limit", ">=", 0.9, "ratio"),
    ("save-2g", "durable_speedup_vs_torch", ">=", 3.0, "peer"),
    ("save-2g", "durable_speedup_vs_dcp", ">=", 3.0, "peer"),
    ("save-2g", "staged_speedup_vs_dcp", ">=", 1.5, "peer"),
    ("save-2g", "max_loop_stall_ms", "<=", 10.0, "value"),
    ("save-many", "vs_one_tensor", "<=", 1.5, "ratio"),
    ("save-8ranks", "commit_vs_disk_limit", ">=", 0.85, "ratio"),
    ("save-gpu-2g", "call_ms", "<=", 1.0, "value"),
    ("save-gpu-2g", "staging_vs_d2h_limit", ">=", 0.9, "ratio"),
    ("save-gpu-2g", "staged_speedup_vs_dcp", ">=", 1.5, "peer"),
    ("save-s3-1g", "s3_vs_awscli", ">=", 1.0, "ratio"),
    ("s3-sink-2g", "s3_client_vs_awscli", ">=", 3.0, "ratio"),
    ("s3-sink-2g", "staging_vs_copy_limit", ">=", 0.9, "ratio"),
    # Issue 11: a save while 900 checkpoints are pruned stages as fast as alone.
    ("prune-1000", "stall_during_prune", "<=", 1.05, "ratio"),
]
PEER_CEILING_SHARE = 0.9

RATIOS = ["staging_vs_copy_limit", "staging_vs_d2h_limit", "commit_vs_disk_limit", "durable_speedup_vs_torch", "durable_speedup_vs_dcp",
          "staged_speedup_vs_dcp", "blocking_speedup_vs_dcp", "vs_one_tensor", "stall_vs_alone",
          "staging_vs_copy_during_write", "s3_vs_awscli", "s3_client_vs_awscli", "stall_during_prune"]


def _cmp(v, op, bound):
    return v <= bound if op == "<=" else v >= bound


def check_targets(scenarios):
    """Each target of a scenario that is in the results, with its value,
    ceiling, the rule applied and met (true/false, null if no value)."""
    out = []
    for name, key, op, bound, kind in TARGETS:
        if name not in scenarios:
            continue
        s = scenarios[name]
        t = {"scenario": name, "key": key, "target": "%s %s %g" % (key, op, bound), "value": None,
             "ceiling": None, "rule": "median %s %g" % (op, bound), "met": None}
        if s.get("fake_cuda"):
            # Against the tests' fake CUDA runtime: the code ran, no GPU did.
            rat = s.get("ratios", {}).get(key) or {}
            t["value"] = s.get(key) if kind == "value" else rat.get("median")
            t["rule"] = "not judged: fake CUDA runtime (BENCH_FAKE_CUDA)"
            t["why_null"] = "measured against the fake CUDA runtime, not a GPU"
            out.append(t)
            continue
        if kind == "value":
            t["value"] = s.get(key)
            t["rule"] = "%s %s %g" % ("median" if key.endswith("_ms") and key != "max_loop_stall_ms" else "value",
                                      op, bound)
        else:
            rat = s.get("ratios", {}).get(key) or {}
            t["value"] = rat.get("median")
            t["ceiling"] = rat.get("ceiling")
            c = t["ceiling"]
            if kind == "peer" and c is not None and not _cmp(c, op, bound):
                t["rule"] = "ceiling %.2f %s %g: median %s %.2f x ceiling = %.2f" % (
                    c, "<" if op == ">=" else ">", bound, op, PEER_CEILING_SHARE, PEER_CEILING_SHARE * c)
                if t["value"] is not None:
                    t["met"] = _cmp(t["value"], op, PEER_CEILING_SHARE * c)
                out.append(t)
                continue
        if t["value"] is not None:
            t["met"] = _cmp(t["value"], op, bound)
        else:
            notes = s.get("notes", [])
            t["why_null"] = "; ".join([n for n in notes if key in n] or notes[:1]) or "not measured"
        out.append(t)
    return out


def fmt(v, nd=2):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if abs(v) >= 1000:
            return "%.0f" % v
        return ("%." + str(nd) + "f") % v
    return str(v)


def fmt_ratio(r, nd=2):
    """'median [min-max]', plus '/ ceiling c' where a ceiling is defined and
    is not simply 1.0."""
    if not r or r.get("median") is None:
        return "n/a"
    s = "%s [%s-%s]" % (fmt(r["median"], nd), fmt(r["min"], nd), fmt(r["max"], nd))
    c = r.get("ceiling")
    if c is not None and c != 1.0:
        s += " c %s" % fmt(c, nd)
    return s


def _is_two(s):
    return "second_bytes" in s


def _val(key, nd, save_only=True):
    def get(s):
        if save_only and _is_two(s):
            return "-"
        if key not in s:
            return "-"
        return fmt(s.get(key), nd)
    return get


def _two(key, nd):
    def get(s):
        if not _is_two(s):
            return "-"
        return fmt(s.get(key), nd)
    return get


def _size(s):
    if _is_two(s):
        return "%.0f + %.0f MiB" % (s["bytes"] / MIB, s["second_bytes"] / MIB)
    return "%.0f MiB" % (s["bytes"] / MIB)


def _shape(s):
    if _is_two(s):
        return "1 x %d, 1 x %d" % (s["tensors"], s["second_tensors"])
    return "%d x %d" % (s.get("ranks", 1), s.get("tensors", 0))


ROWS = [
    ("bytes (all ranks)", _size),
    ("ranks x tensors", _shape),
    ("rounds", lambda s: str(s.get("rounds", "n/a"))),
    ("call_ms", _val("call_ms", 3)),
    ("staged_ms", _val("staged_ms", 1)),
    ("committed_ms", _val("committed_ms", 1)),
    ("first_committed_ms", _val("first_committed_ms", 1)),
    ("connect_ms", _val("connect_ms", 1)),
    ("copy_threads (per client)", _val("copy_threads", 0)),
    ("copy_limit_gibps", _val("copy_limit_gibps", 2)),
    ("d2h_limit_gibps", _val("d2h_limit_gibps", 2)),
    ("copy_during_write_gibps (not a limit)", _val("copy_during_write_gibps", 2)),
    ("disk_limit_gibps", _val("disk_limit_gibps", 2)),
    ("torch_save_s", _val("torch_save_s", 2)),
    ("dcp_async_call_ms", _val("dcp_async_call_ms", 1)),
    ("dcp_async_staged_ms", _val("dcp_async_staged_ms", 1)),
    ("dcp_async_committed_ms", _val("dcp_async_committed_ms", 1)),
    ("dcp_thread_count", _val("dcp_thread_count", 0)),
    ("one_tensor_committed_ms", _val("one_tensor_committed_ms", 1)),
    ("committed_gibps (S3)", _val("committed_gibps", 3)),
    ("awscli_s (best setting)", _val("awscli_s", 2)),
    ("awscli setting", _val("awscli_config", 0)),
    ("server CPU s, ckptd save", _val("server_cpu_s_ckptd", 2)),
    ("server CPU s, awscli", _val("server_cpu_s_awscli", 2)),
    ("client CPU s, ckptd daemon", _val("client_cpu_s_ckptd", 2)),
    ("client CPU s, awscli", _val("client_cpu_s_awscli", 2)),
    ("2nd job staged_ms alone", _two("alone_staged_ms", 1)),
    ("2nd job staged_ms during 1st commit", _two("staged_ms", 1)),
    ("1st job committed_ms", _two("first_job_committed_ms", 1)),
    ("checkpoints pruned (of the root)", lambda s: "%d of %d" % (s["removed"], s["checkpoints"])
     if "checkpoints" in s else "-"),
    ("one checkpoint copied (MiB, files)", lambda s: "%.1f, %d" % (s["checkpoint_bytes"] / MIB, s["checkpoint_files"])
     if s.get("checkpoint_bytes") is not None else "-"),
    ("prune_local_s", _val("prune_local_s", 2)),
    ("first_prune_local_s", _val("first_prune_local_s", 2)),
    ("prune_s3_s (moto)", _val("prune_s3_s", 2)),
    ("first_prune_s3_s (moto)", _val("first_prune_s3_s", 2)),
    ("save_alone_staged_ms", _val("save_alone_staged_ms", 1)),
    ("save_during_prune_staged_ms", _val("save_during_prune_staged_ms", 1)),
    ("save_alone_committed_ms", _val("save_alone_committed_ms", 1)),
    ("save_during_prune_committed_ms", _val("save_during_prune_committed_ms", 1)),
    ("prune_during_save_s (local)", _val("prune_during_save_s", 2)),
    ("staged_overlap (share inside the prune)", _val("staged_overlap", 2)),
    ("max_loop_stall_ms", lambda s: fmt(s.get("max_loop_stall_ms"), 2)),
    ("max_loop_cpu_ms", lambda s: fmt(s.get("max_loop_cpu_ms"), 2)),
]


def _rows(result):
    sc = result["scenarios"]
    names = list(sc)
    rows = [(label, [f(sc[n]) for n in names]) for label, f in ROWS]
    # Rows no scenario of this run has (e.g. two-jobs' rows in a run
    # without it) are left out.
    rows = [r for r in rows if any(v != "-" for v in r[1])]
    for k in RATIOS:
        if any(k in sc[n].get("ratios", {}) for n in names):
            rows.append((k, [fmt_ratio(sc[n]["ratios"][k]) if k in sc[n].get("ratios", {}) else "-"
                             for n in names]))
    return names, rows


def _targets_line(result):
    parts = []
    for t in result.get("targets", []):
        state = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        s = "%s %s: %s (%s" % (state, t["scenario"], t["target"], fmt(t["value"], 3))
        if t["rule"] and (t["rule"].startswith("ceiling") or
                          any(w in t["rule"] for w in ("not judgeable", "bootstrap", "broken limit"))):
            s += "; " + t["rule"]
        parts.append(s + ")")
    return "; ".join(parts)


def _header(result):
    m = result.get("machine", {})
    return "%s%s, commit %s, protocol v%s, %s rounds: %s cpus, %s GiB, kernel %s, %s, %s, torch %s" % (
        result.get("started", "?"), " (QUICK)" if result.get("quick") else "",
        "%s%s" % (result.get("commit"), " + uncommitted changes" if result.get("worktree_dirty") else ""),
        result.get("protocol", 1), result.get("rounds", "?"), m.get("cpus"), m.get("mem_gib"), m.get("kernel"),
        m.get("fs"), m.get("fio"), m.get("torch")) + "".join(
        "; %s measured against the FAKE CUDA runtime (no GPU)" % n
        for n, s in result.get("scenarios", {}).items() if s.get("fake_cuda")) + (
        "; NOT RECORDABLE (protocol v3: see its notes)"
        if result.get("recordable") is False and not result.get("quick") else "")


def text_table(result):
    """The table run.py prints after a run."""
    names, rows = _rows(result)
    w0 = max(len(r[0]) for r in rows) + 2
    widths = [max(len(n), *(len(r[1][i]) for r in rows)) + 2 for i, n in enumerate(names)]
    lines = [_header(result), "", " " * w0 + "".join(n.rjust(w) for n, w in zip(names, widths))]
    sep = False
    for label, vals in rows:
        if label in RATIOS and not sep:
            lines.append("-" * (w0 + sum(widths)))
            sep = True
        lines.append(label.ljust(w0) + "".join(v.rjust(w) for v, w in zip(vals, widths)))
    lines.append("")
    lines.append("ratios: median [min-max] over rounds, c = ceiling (what a perfect implementation would get)")
    lines.append("")
    lines.append("targets%s:" % (" (QUICK sizes: indicative only)" if result.get("quick") else ""))
    for t in result.get("targets", []):
        state = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
        lines.append("  %s  %-12s %-34s value %-8s %s" % (state, t["scenario"], t["target"], fmt(t["value"], 3),
                                                         t["rule"]))
    for n, s in result["scenarios"].items():
        for note in s.get("notes", []):
            lines.append("note (%s): %s" % (n, note.splitlines()[0] if note else note))
    for note in result.get("notes", []):
        lines.append("note: " + note)
    return "\n".join(lines)


def markdown(result):
    """The run as Markdown for bench/RESULTS.md's history."""
    names, rows = _rows(result)
    lines = [_header(result), ""]
    lines.append("| | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for label, vals in rows:
        lines.append("| %s | %s |" % (label, " | ".join(vals)))
    lines.append("")
    lines.append("Ratios: median [min-max] over rounds, c = ceiling.")
    lines.append("")
    lines.append("Targets: " + _targets_line(result) + ".")
    return "\n".join(lines)
