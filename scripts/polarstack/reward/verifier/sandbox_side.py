"""The sandbox side of the supervisor (an embedded program): namespaces, the chroot into a fresh tmpfs, the
sandbox uid and rlimits, the namespace's init, and the helper that maps the sandbox uid for root without
CAP_SYS_ADMIN."""

from __future__ import annotations

# --- the supervisor: one trusted process per run, outside the sandbox. It forks the sandbox side first (from a
# memory that holds only the candidate's own files), then reads the tests and the secret, judges, tears the
# sandbox down and reports on a pipe only it holds. ----------------------------------------------------------

_SANDBOX_SIDE = r'''
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 4096, 16384, 1 << 18, 1 << 21
NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
STATUS = -1


def fail(message):
    os.write(STATUS, ("error " + message + "\n").encode())
    os._exit(125)


def check(result, what):
    if result != 0:
        fail("%s: %s" % (what, os.strerror(ctypes.get_errno())))


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount %s" % target)


def remount_readonly(target, device=False):
    """Every mount at or under target becomes read-only, nosuid and nodev (keeping the flags it has); a `device`
    node's bind read-only, nosuid and noexec, not nodev (the node must stay usable: a read-only mount refuses
    chmod, chown and utime of the shared inode, while reads and writes of a device node go to its driver)."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].encode().decode("unicode_escape") for line in handle]
    added = MS_RDONLY | MS_NOSUID | (MS_NOEXEC if device else MS_NODEV)
    for point in points:
        if point == target or point.startswith(target + "/"):
            current = os.statvfs(point).f_flag
            flags = current & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048)
            flags |= MS_RELATIME if current & 4096 else 0
            mount(None, point, None, MS_REMOUNT | MS_BIND | added | flags)


def build_root(cfg, root):
    """A fresh tmpfs as /, read-only binds of the system directories, private /tmp /var/tmp /dev/shm, its /proc."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,nr_inodes=16384,mode=755" % cfg["tmpfs_mb"])
    for path in cfg["binds"]:
        os.makedirs(root + path, exist_ok=True)
        mount(path, root + path, None, MS_BIND | MS_REC)
        remount_readonly(root + path)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), root + "/" + name)
        elif os.path.isdir("/" + name) and "/" + name not in cfg["binds"]:
            os.makedirs(root + "/" + name)
            mount("/" + name, root + "/" + name, None, MS_BIND | MS_REC)
            remount_readonly(root + "/" + name)
    os.makedirs(root + "/dev")
    for device in ("null", "zero", "full", "random", "urandom"):
        if not os.path.exists("/dev/" + device):  # apptainer's staged /dev (`mount dev = minimal`) has no /dev/full
            continue
        open(root + "/dev/" + device, "w").close()
        mount("/dev/" + device, root + "/dev/" + device, None, MS_BIND)
        remount_readonly(root + "/dev/" + device, device=True)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + link)
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        os.makedirs(root + path)
        os.chmod(root + path, 0o1777)
    os.makedirs(root + "/proc")
    # Its own /proc; where the kernel refuses one to a user namespace (a masked /proc, as in a default Docker
    # container: "mount_too_revealing"), none at all: the program then sees no process, not even itself. None
    # either when the program runs as uid 0 of a namespace that maps root alone (cfg["one_uid"]): that uid is the
    # kernel's global root, and /proc/sys and /proc/sysrq-trigger grant it their owner bits without any capability
    # (fs/proc/proc_sysctl.c test_perm: euid == GLOBAL_ROOT_UID takes the owner bits).
    if cfg["one_uid"]:
        pass
    elif libc.mount(b"proc", (root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        if ctypes.get_errno() not in (errno.EPERM, errno.EACCES) or not cfg["unshare_flags"] & NEWUSER:
            fail("mount %s/proc: %s" % (root, os.strerror(ctypes.get_errno())))
    else:  # keyrings are not namespaced: the keys any uid may view (the launcher's too) stay out of sight
        for name in ("keys", "key-users"):
            if os.path.exists(root + "/proc/" + name):
                mount(root + "/dev/null", root + "/proc/" + name, None, MS_BIND)
    os.makedirs(root + "/sandbox", mode=0o700)
    write_files(cfg, root + "/sandbox")
    os.chroot(root)
    os.chdir("/sandbox")
    libc.sethostname(b"sandbox", 7)


def write_files(cfg, directory):
    """The candidate's files into the sandbox. A failure to write them (a full tmpfs: ENOSPC, EDQUOT; no inode
    left; a name too long; text that cannot be encoded) is caused by the files, not by the host: it is reported
    as "files <why>", which the verifier counts as a wrong answer, never as "the host cannot isolate"."""
    for name, text in cfg["files"].items():
        try:
            with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        except (OSError, ValueError) as exc:
            why = "%s: %s" % (name[:60], exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__)
            os.write(STATUS, ("files " + why + "\n").encode())
            os._exit(125)
        if cfg["uid"] >= 0:
            os.chown(os.path.join(directory, name), cfg["uid"], cfg["uid"])
    if cfg["uid"] >= 0:
        os.chown(directory, cfg["uid"], cfg["uid"])


def exit_code(status):
    return os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


# prctl options (include/uapi/linux/prctl.h) and securebits (include/uapi/linux/securebits.h).
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_GET_SECUREBITS, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 23, 24, 27, 28, 47
PR_CAP_AMBIENT_IS_SET, PR_CAP_AMBIENT_CLEAR_ALL = 1, 4
# NOROOT, NOROOT_LOCKED, NO_SETUID_FIXUP, NO_SETUID_FIXUP_LOCKED, KEEP_CAPS_LOCKED (KEEP_CAPS itself off): uid 0
# gains no capability at exec, none is kept or regained across a uid change, and nothing of it can be undone.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20
AMBIENT_SECUREBITS = 0x40 | 0x80  # NO_CAP_AMBIENT_RAISE and its lock (Linux 4.3+; EPERM before: not set)
CAP_HEADER_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


def drop_bounding_set(last_cap, required):
    """Every capability up to `last_cap` out of the bounding set, then the securebits: before the uid switch, which
    needs CAP_SETUID, and while CAP_SETPCAP is held. Where the program will run as a sandbox uid (not `required`) an
    EPERM (a root without CAP_SETPCAP) leaves them: that uid holds nothing after the switch and no_new_privs keeps
    it so; where it stays uid 0, each step must hold."""
    for cap in range(last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:  # beyond this kernel's last capability (a cap_last_cap that was not read)
                break
            if required or code != errno.EPERM:
                fail("dropping capability %d from the bounding set: %s" % (cap, os.strerror(code)))
            return
    if libc.prctl(PR_SET_SECUREBITS, SECUREBITS | AMBIENT_SECUREBITS, 0, 0, 0) != 0:
        if libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) != 0 and required:
            fail("securebits: %s" % os.strerror(ctypes.get_errno()))


def drop_capabilities(last_cap, as_root):
    """No capability left, in any set: ambient cleared, effective, permitted and inheritable emptied (capset), then
    each read back; and, where the program stays uid 0 (`as_root`), the bounding set empty and the securebits
    locked, so that exec as uid 0 gives none back."""
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: no ambient set
    header = (ctypes.c_uint32 * 2)(CAP_HEADER_VERSION_3, 0)
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    data = (ctypes.c_uint32 * 6)()
    check(libc.capget(header, data), "capget")
    if any(data):
        fail("capabilities left after capset: %s" % list(data))
    for cap in range(last_cap + 1):
        if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1:
            fail("ambient capability %d left" % cap)
    if as_root:
        for cap in range(64):
            if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
                fail("capability %d left in the bounding set" % cap)
        if libc.prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) & SECUREBITS != SECUREBITS:
            fail("the securebits did not hold")


def worker(cfg, channel):
    """Limits, the sandbox uid, the channel on fds 3 and 4, the status, then exec the program."""
    global STATUS
    # Move the status and channel fds above 10 first, so that placing the channel on 3 and 4 overwrites neither.
    STATUS, *channel = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in [STATUS, *channel]]
    null = os.open("/dev/null", os.O_RDWR)
    # stdin and stdout: /dev/null (prints cost nothing and prove nothing); stderr: the verifier's diagnostics.
    for target, fd in zip((0, 1, 3, 4), [null, null, *(channel or [null, null])]):
        os.dup2(fd, target)
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_size_mb"] * mb, cfg["file_size_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if seccomp_arch() is not None:  # nothing of the launcher's session keyring, before the uid switch
        join_fresh_session_keyring(seccomp_arch()[2]["keyctl"])
    as_root = cfg["uid"] < 0 and os.getuid() == 0
    if cfg["isolate"]:  # while CAP_SETPCAP is held: required where the program stays uid 0
        drop_bounding_set(cfg["cap_last_cap"], as_root)
    if cfg["uid"] >= 0:
        try:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        except OSError as exc:
            fail("cannot switch to the sandbox uid %d (%s)" % (cfg["uid"], exc.strerror))
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    if cfg["isolate"]:
        drop_capabilities(cfg["cap_last_cap"], as_root)
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # cleared by the uid switch; dies with its parent
    install_seccomp(cfg["isolate"])  # no keyrings, no other kernel state that outlives the run (seccomp.py)
    os.write(STATUS, b"isolated\n" if cfg["isolate"] else b"unisolated\n")
    os.closerange(5, STATUS)
    os.closerange(STATUS + 1, 1 << 16)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    try:
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except OSError as exc:
        os.write(2, ("polarstack-verifier: cannot run %s (%s)\n" % (cfg["argv"][0], exc.strerror)).encode())
        os._exit(127)


def init(cfg, channel):
    """PID 1 of the sandbox: build its root, start the program, reap; when it exits the kernel kills the rest."""
    check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    libc.prctl(4, 0, 0, 0, 0)  # not dumpable: the program cannot read this process's memory through /proc
    build_root(cfg, "/tmp")
    program = os.fork()
    if program == 0:
        worker(cfg, channel)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            os._exit(exit_code(status))


def unshare_mapped_by_helper(cfg):
    """Root without CAP_SYS_ADMIN: unshare with a user namespace, whose uid and gid maps a helper left in the parent
    namespace writes (a process inside may map only its own uid; one outside holding CAP_SETUID and CAP_SETGID may
    map more): 0 -> the host's root (the namespace's init) and the sandbox uid -> itself (the program). So the
    program runs as the sandbox uid, as on the direct path: never as the host's root, which RLIMIT_NPROC exempts
    (kernel/fork.c copy_process: `real_cred->user != INIT_USER`) and /proc/sys and /proc/sysrq-trigger obey."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    parent = os.getpid()
    helper = os.fork()
    if helper == 0:
        answer, name = b"ok", "uid_map"
        try:
            os.close(go_w)
            os.close(done_r)
            if os.read(go_r, 1) != b"u":  # the parent could not unshare (or died): nothing to map
                os._exit(0)
            for name, outside in (("uid_map", os.geteuid()), ("gid_map", os.getegid())):
                with open("/proc/%d/%s" % (parent, name), "w") as handle:
                    handle.write("0 %d 1\n%d %d 1\n" % (outside, cfg["uid"], cfg["uid"]))
        except OSError as exc:
            answer = ("%s: %s" % (name, exc.strerror)).encode()
        except BaseException as exc:
            answer = repr(exc).encode()
        finally:
            try:
                os.write(done_w, answer)
            finally:
                os._exit(0)
    os.close(go_r)
    os.close(done_w)
    check(libc.unshare(cfg["unshare_flags"]), "unshare")
    os.write(go_w, b"u")
    answer = os.read(done_r, 300)
    os.waitpid(helper, 0)
    os.close(go_w)
    os.close(done_r)
    if answer != b"ok":
        fail("mapping the sandbox uid into the user namespace (%s)" % answer.decode("utf-8", "replace"))


SANDBOX_NICE = 5


def yield_to_the_watchdog():
    """Before anything is forked: the sandbox in a session of its own (not the supervisor's, where the watchdog
    thread runs: on a host where the kernel's autogroup applies, a session is a scheduling group) and at nice
    SANDBOX_NICE for every process of it, which none can undo (RLIMIT_NICE 0; lowering a nice value needs
    CAP_SYS_NICE in the host's user namespace), so a look of the watchdog's is not queued behind the candidate's
    processes. Autogroup does not apply inside a container's cpu cgroup (the trainer's), where the nice value
    alone weighs; where it applies, the session's group gets the same nice (/proc/self/autogroup). Not
    SCHED_IDLE: on a loaded node an idle-class candidate would get no CPU at all and a right answer would time
    out; nice 5 weighs 335 against a nice-0 task's 1024 (kernel/sched/core.c sched_prio_to_weight)."""
    os.setsid()
    os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), SANDBOX_NICE))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    try:
        with open("/proc/self/autogroup", "w") as handle:
            handle.write(str(SANDBOX_NICE))
    except OSError:  # no autogroup in this kernel, or not writable here: the nice value is what weighs
        pass


def sandbox_side(cfg, channel, status):
    """The forked child: unshare, then the namespace's init (or, isolation off, the program in its own session);
    it forwards the program's exit code, and SIGTERM makes it kill the init (everything) or the process group."""
    global STATUS
    STATUS = status
    try:
        check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # dies with the supervisor
        yield_to_the_watchdog()
        if cfg["cgroup"]:  # the sandbox's own cgroup (cgroup.py), joined before anything else is forked
            with open(cfg["cgroup"] + "/cgroup.procs", "w") as handle:
                handle.write(str(os.getpid()))
        if cfg["isolate"] and cfg["map_by_helper"]:
            unshare_mapped_by_helper(cfg)
        elif cfg["isolate"]:
            check(libc.unshare(cfg["unshare_flags"]), "unshare")
            if cfg["unshare_flags"] & NEWUSER:  # a user: only its own uid and gid (the kernel allows that)
                for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (os.getuid(), os.getuid())),
                                   ("gid_map", "%d %d 1" % (os.getgid(), os.getgid()))):
                    with open("/proc/self/" + name, "w") as handle:
                        handle.write(text)
        libc.prctl(4, 0, 0, 0, 0)  # not dumpable (after the maps: it makes /proc/self root's)
        child = os.fork()
        if child == 0:
            if cfg["isolate"]:
                init(cfg, channel)
            os.setsid()
            os.chdir(cfg["workdir"])
            worker(cfg, channel)
    except OSError as exc:
        fail("%s (%s)" % (exc.strerror, exc.filename))
    except BaseException as exc:
        fail(repr(exc))
    kill = (lambda *_: os.kill(child, 9)) if cfg["isolate"] else (lambda *_: os.killpg(child, 9))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, kill)
    _, status = os.waitpid(child, 0)
    try:
        kill()
    except OSError:
        pass
    os._exit(exit_code(status))
'''
