"""The supervisor's watchdog (an embedded part of the supervisor program): where no cgroup bounds the sandbox, a
thread sums, every 20 ms, the memory of the sandbox's whole process tree (each process's anonymous and shared-memory
pages, private or shared, each page divided among the processes mapping it (Pss), so that memory shared by many
counts once; plus the sandbox's tmpfs, looked at every 80 ms), its CPU time (the live processes' and, through their `cutime`, the
reaped ones') and its process count, and kills the whole sandbox (its namespace's init) past the budget. Between two
looks a process can grow by at most what RLIMIT_AS leaves it, so the total stays within budget + one look's growth.
"""

from __future__ import annotations

_WATCHDOG = r'''
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
    shared, in memory or swapped), each divided among the processes that map it: smaps_rollup's Pss_Anon +
    Pss_Shmem + SwapPss (Linux 5.7+). Where that file is unreadable or older, /proc/PID/status's RssAnon +
    RssShmem + VmSwap, which counts a shared page once per process that maps it (more, never less); before Linux
    4.5, statm's whole resident size (file pages included)."""
    try:
        fields = dict(line.split()[:2] for line in read_proc("/proc/%d/smaps_rollup" % pid).splitlines()[1:])
        return (int(fields[b"Pss_Anon:"]) + int(fields[b"Pss_Shmem:"]) + int(fields.get(b"SwapPss:", 0))) << 10
    except (OSError, KeyError, ValueError):
        pass
    fields = dict(line.split()[:2] for line in read_proc("/proc/%d/status" % pid).splitlines() if line.count(b":") == 1
                  and len(line.split()) >= 2)
    if b"RssAnon:" in fields and b"RssShmem:" in fields:
        return (int(fields[b"RssAnon:"]) + int(fields[b"RssShmem:"]) + int(fields.get(b"VmSwap:", 0))) << 10
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
    budget, files, look = cfg["memory_mb"] << 20, 0, 0
    while (alive(root) if pidfd is None else not select.select([pidfd], [], [], 0)[0]):
        memory, cpu, count, seen = sandbox_usage(root, look % 4 == 0)  # the tmpfs every fourth look (80 ms)
        files = files if seen is None else seen
        memory += files
        look += 1
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
        time.sleep(0.02)
'''
