"""The supervisor's watchdog (an embedded part of the supervisor program): where no cgroup bounds the sandbox, a
thread sums, every 10 ms, the memory of the sandbox's whole process tree (each process's resident memory less what
it shares with files, plus the sandbox's tmpfs), its CPU time (the live processes' and, through their `cutime`, the
reaped ones') and its process count, and kills the whole sandbox (its namespace's init) past the budget. Between two
looks a process can grow by at most what RLIMIT_AS leaves it, so the total stays within budget + one look's growth.
"""

from __future__ import annotations

_WATCHDOG = r'''
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def sandbox_tree(root):
    """The pids of `root` and its descendants (/proc/PID/task/TID/children; a scan of /proc where it is absent)."""
    pids, todo, scanned = [], [root], None
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            tasks = os.listdir("/proc/%d/task" % pid)
        except OSError:
            continue
        for tid in tasks:
            try:
                with open("/proc/%d/task/%s/children" % (pid, tid)) as handle:
                    todo.extend(int(c) for c in handle.read().split())
            except FileNotFoundError:
                if scanned is None:
                    scanned = {}
                    for entry in os.listdir("/proc"):
                        if entry.isdigit():
                            try:
                                with open("/proc/%s/stat" % entry) as handle:
                                    text = handle.read()
                                scanned.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
                            except (OSError, ValueError):
                                pass
                todo.extend(scanned.get(pid, []))
                break
            except (OSError, ValueError):
                pass
    return pids


def sandbox_usage(root):
    """(bytes, CPU seconds, processes) of the sandbox whose first process is `root`."""
    memory, ticks, filesystems = 0, 0, {}
    pids = sandbox_tree(root)
    for pid in pids:
        try:
            with open("/proc/%d/statm" % pid) as handle:
                fields = handle.read().split()
            memory += (int(fields[1]) - int(fields[2])) * PAGE  # resident less file-backed and shared
            with open("/proc/%d/stat" % pid) as handle:
                text = handle.read()
            stat = text[text.rindex(")") + 2:].split()
            ticks += sum(int(v) for v in stat[11:15])  # utime stime cutime cstime
            vfs = os.statvfs("/proc/%d/root/" % pid)
            filesystems[vfs.f_fsid] = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        except (OSError, ValueError, IndexError):
            pass
    filesystems.pop(os.statvfs("/").f_fsid, None)  # the host's root (the sandbox side's, or isolation off)
    return memory + sum(filesystems.values()), ticks / TICKS, len(pids)


def watchdog(root, pidfd, cfg, kill):
    """Until the sandbox's first process `root` ends (its pidfd readable): past its budget, record why
    (state["over_budget"]) and kill all of it."""
    budget = cfg["memory_mb"] << 20
    while not select.select([pidfd], [], [], 0)[0]:
        memory, cpu, count = sandbox_usage(root)
        over = None
        if memory > budget:
            over = "memory: the sandbox used %d MiB, over its budget of %d MiB" % (memory >> 20, cfg["memory_mb"])
        elif cpu > cfg["cpu"]:
            over = "cpu: the sandbox used %.1f s of CPU, over its budget of %d s" % (cpu, cfg["cpu"])
        elif count > cfg["nproc"] + 2:  # the sandbox side and its init are not the program's
            over = "pids: the sandbox ran %d processes, over its budget of %d" % (count - 2, cfg["nproc"])
        if over:
            state["over_budget"] = over
            try:
                kill()
            except OSError:
                pass
            return
        time.sleep(0.01)
'''
