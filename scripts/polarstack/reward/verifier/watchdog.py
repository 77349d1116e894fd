"""The supervisor's watchdog (an embedded part of the supervisor program): where no cgroup bounds the sandbox, a
thread sums, every 20 ms, the memory of the sandbox's whole process tree (plus the sandbox's tmpfs, looked at every
80 ms), its CPU time (the live processes' and, through their `cutime`, the reaped ones') and its process count,
and kills the whole sandbox (its namespace's init) past the budget.

Each look costs O(1) per process of the sandbox, never O(its mappings): the memory is the kernel's per-process
counters (/proc/PID/status RssAnon + RssShmem + VmSwap), not smaps_rollup's Pss, which walks every mapping and
page table under the process's mmap lock (issue 33: 18 processes of 60,000 mappings each made every look cost
seconds, and the candidate held 5-11 GiB against a 1 GiB budget). The price: a page shared by several processes
counts once per process that maps it, more than it uses, never less, so sharing is no way around the budget.

The look cannot be outrun unnoticed: the sandbox runs in a session of its own at a lower priority (sandbox_side:
setsid, nice SANDBOX_NICE), and a look that finds the sandbox used more than LATE_CPU seconds of CPU since the
previous one kills it (the sandbox can only outrun the watchdog by using CPU; a busy node slows both, so a right
answer on a loaded node does not trip it). Between two looks the sandbox's memory can grow by what LATE_CPU seconds
of CPU fault in, and by at most what each process's RLIMIT_AS leaves it (docs/tasks.md states the worst case).
"""

from __future__ import annotations

LATE_CPU = 0.25  # seconds of the sandbox's CPU between two looks, past which the watchdog kills it (fell behind)

_WATCHDOG = r'''
LATE_CPU = @LATE_CPU@
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def read_proc(path):
    """A /proc file's bytes (os.open and one read: this runs every 20 ms)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


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
                todo.extend(int(c) for c in read_proc("/proc/%d/task/%s/children" % (pid, tid)).split())
            except FileNotFoundError:
                if scanned is None:
                    scanned = {}
                    for entry in os.listdir("/proc"):
                        if entry.isdigit():
                            try:
                                text = read_proc("/proc/%s/stat" % entry)
                                scanned.setdefault(int(text[text.rindex(b")") + 2:].split()[1]), []).append(int(entry))
                            except (OSError, ValueError):
                                pass
                todo.extend(scanned.get(pid, []))
                break
            except (OSError, ValueError):
                pass
    return pids


def process_memory(pid):
    """Bytes of `pid`'s anonymous and shared-memory pages (MAP_SHARED|MAP_ANONYMOUS, /dev/zero, tmpfs files mapped
    shared, in memory or swapped): /proc/PID/status's RssAnon + RssShmem + VmSwap, the kernel's mm counters (O(1):
    no walk of the mappings, no mmap lock), which count a shared page once per process that maps it (more, never
    less). Before Linux 4.5 (no RssAnon), statm's whole resident size (file pages included)."""
    fields = {}
    for line in read_proc("/proc/%d/status" % pid).splitlines():
        key, _, value = line.partition(b":")
        if key in (b"RssAnon", b"RssShmem", b"VmSwap"):
            fields[key] = int(value.split()[0])
    if b"RssAnon" in fields and b"RssShmem" in fields:
        return (fields[b"RssAnon"] + fields[b"RssShmem"] + fields.get(b"VmSwap", 0)) << 10
    return int(read_proc("/proc/%d/statm" % pid).split()[1]) * PAGE


def sandbox_usage(root, with_files=True):
    """(bytes in processes, CPU seconds, processes, bytes in its tmpfs or None) of the sandbox whose first process
    is `root`; the tmpfs is looked at only `with_files` (a statvfs per process)."""
    memory, ticks, filesystems = 0, 0, {}
    pids = sandbox_tree(root)
    for pid in pids:
        try:
            memory += process_memory(pid)
            text = read_proc("/proc/%d/stat" % pid)
            ticks += sum(int(v) for v in text[text.rindex(b")") + 2:].split()[11:15])  # utime stime cutime cstime
            if with_files:
                vfs = os.statvfs("/proc/%d/root/" % pid)
                filesystems[vfs.f_fsid] = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        except (OSError, ValueError, IndexError):
            pass
    if not with_files:
        return memory, ticks / TICKS, len(pids), None
    filesystems.pop(os.statvfs("/").f_fsid, None)  # the host's root (the sandbox side's, or isolation off)
    return memory, ticks / TICKS, len(pids), sum(filesystems.values())


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def watchdog(root, pidfd, cfg, kill):
    """Until the sandbox's first process `root` ends (its pidfd readable): past its budget, record why
    (state["over_budget"]) and kill all of it."""
    budget, files, look, most_cpu, previous = cfg["memory_mb"] << 20, 0, 0, 0.0, time.monotonic()
    state["watchdog_longest_gap"] = state["watchdog_peak_mib"] = 0
    while (alive(root) if pidfd is None else not select.select([pidfd], [], [], 0)[0]):
        memory, cpu, count, seen = sandbox_usage(root, look % 4 == 0)  # the tmpfs every fourth look (80 ms)
        now = time.monotonic()  # the wall time between the ends of two looks, and the most memory seen (reported)
        state["watchdog_longest_gap"], previous = max(state["watchdog_longest_gap"], round(now - previous, 4)), now
        files = files if seen is None else seen
        memory += files
        look += 1
        state["watchdog_peak_mib"] = max(state["watchdog_peak_mib"], memory >> 20)
        # CPU since the previous look, against the most seen so far (a process missed by one look, as it is
        # reparented, makes the sum dip: its return is no lateness).
        late, most_cpu = cpu - most_cpu, max(most_cpu, cpu)
        if look > 1:
            state["watchdog_most_late"] = max(state.get("watchdog_most_late", 0), round(late, 3))
        over = None
        if look > 1 and late > LATE_CPU:
            over = ("late: the sandbox used %.2f s of CPU between two of the watchdog's looks, over the bound of "
                    "%.2f s (it outran the watchdog)" % (late, LATE_CPU))
        elif memory > budget:
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
        time.sleep(0.02)
'''.replace("@LATE_CPU@", repr(LATE_CPU))
