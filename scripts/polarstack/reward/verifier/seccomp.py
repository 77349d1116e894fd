"""The candidate's seccomp filter and its fresh session keyring (an embedded part of the supervisor program).

Keyrings are not namespaced (keyrings(7)): a key added to a uid's user keyring outlives the run and is found by
the next one, and a sandbox would otherwise inherit the launcher's session keyring (runc gives every container
one) with full rights. So, in the candidate's process, after no_new_privs and before exec:
- keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) gives it a fresh anonymous session keyring (before the uid switch);
- a classic-BPF filter (seccomp(2), built with ctypes) kills any system call made through another architecture's
  entry point (the filter's numbers are this architecture's: on x86_64 the i386 `int 0x80` entry reports
  AUDIT_ARCH_I386) and answers EPERM to the x32 entry (nr | 0x40000000, which reports AUDIT_ARCH_X86_64) and to
  the calls below. EPERM, not ENOSYS: it is what Docker's default profile answers for the same calls
  (moby profiles/seccomp/default.json, defaultErrnoRet 1), and it says "refused", not "this kernel lacks it", so
  no library falls back to an older path that may exist (inotify_init1 -> inotify_init, io_uring -> ...).

Denied (the survey in docs/tasks.md, "Kernel state namespaces do not isolate", gives the reason for each): the
keyring calls add_key, request_key and keyctl; inotify and fanotify (watches on the read-only binds shared with
the host and other runs); perf_event_open, bpf and userfaultfd (kernel attack surface and timing side channels); io_uring
(its operations bypass system-call filtering); ptrace (no debugger is needed to answer calls); shmget, memfd_create
and memfd_secret (memory no file system of the sandbox holds: a System V segment or a memfd lives without any
mapping, where neither the watchdog's look at the processes nor at the sandbox's tmpfs would count it); semget and
msgget (System V semaphore sets and message queues: kernel memory no look of the watchdog's counts, held
in the IPC namespace until the run ends); socketpair, and socket() for every address family but AF_INET and
AF_INET6 (the filter reads the first argument, seccomp_data.args[0]): a unix-domain socket's buffers (up to
SO_SNDBUF each, queued in the peer) are unaccounted kernel memory too, and AF_UNIX (abstract names included),
AF_NETLINK, AF_PACKET and the rest are nothing a solution needs; inet sockets stay, in the sandbox's empty
network namespace (no interface but a down loopback), so that layer stays what the network tests pin.

Denied too, in every shape the sandbox runs in: every way to make a process or a thread, clone, clone3, fork and
vfork (aarch64 has no fork nor vfork: glibc's fork is a clone there), and unshare and setns. The candidate is one
single-threaded process, so its own RLIMIT_AS and RLIMIT_CPU bound the sandbox's whole memory (with the tmpfs,
which the cgroup or the watchdog counts) and CPU time. RLIMIT_NPROC alone could not: where the host's user
namespace maps uid 0 alone (an Apptainer session of the trainer, docs/tasks.md), the candidate runs as that uid,
the kernel's global root, which copy_process (kernel/fork.c) exempts from RLIMIT_NPROC. With clone3 and clone
refused, pthread_create fails (Python's threading.Thread.start raises RuntimeError) and os.fork raises OSError;
the sandbox's environment sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS to 1 so that numerical
libraries start no thread of their own.
"""

from __future__ import annotations

_SECCOMP = r'''
# Numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (aarch64); the audit
# architectures: include/uapi/linux/audit.h.
SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, True, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253, "inotify_init1": 294,
        "fanotify_init": 300, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 101, "shmget": 29, "memfd_create": 319,
        "memfd_secret": 447, "semget": 64, "msgget": 68, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58,
        "clone3": 435, "unshare": 272, "setns": 308}, 41),
    "aarch64": (0xC00000B7, False, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "inotify_init1": 26, "fanotify_init": 262,
        "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "ptrace": 117, "shmget": 194, "memfd_create": 279, "memfd_secret": 447,
        "semget": 190, "msgget": 186, "socketpair": 199, "clone": 220, "clone3": 435, "unshare": 97,
        "setns": 268}, 198),
}
X32_SYSCALL_BIT = 0x40000000
SOCKET_FAMILIES = (2, 10)  # AF_INET, AF_INET6 (include/linux/socket.h): the only ones socket() may create


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_arch():
    """(audit arch, has an x32 entry, denied numbers, socket's number) of this machine, or None where the filter
    has no numbers."""
    return SECCOMP_ARCHES.get(os.uname().machine)


def seccomp_program(audit_arch, x32, numbers, socket_nr):
    """Classic BPF over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}: another architecture -> kill
    the process; x32 or a denied number -> EPERM; socket() -> EPERM unless its first argument (the family, an int:
    the low word of args[0] at offset 16, both architectures being little-endian) is in SOCKET_FAMILIES; anything
    else -> allow."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, kill_process, errno_ret = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
    program = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, audit_arch), (ret_k, 0, 0, kill_process), (ld_w_abs, 0, 0, 0)]
    tests = ([(jge_k, X32_SYSCALL_BIT)] if x32 else []) + [(jeq_k, n) for n in sorted(set(numbers.values()))]
    # After the tests: [socket? -> family check | allow], [load family], [one test per family], deny, allow.
    deny_at = len(program) + len(tests) + 3 + len(SOCKET_FAMILIES)
    for code, k in tests:
        program.append((code, deny_at - len(program) - 1, 0, k))
    program += [(jeq_k, 1, 0, socket_nr), (ret_k, 0, 0, allow), (ld_w_abs, 0, 0, 16)]
    for family in SOCKET_FAMILIES:
        program.append((jeq_k, deny_at + 1 - len(program) - 1, 0, family))
    program += [(ret_k, 0, 0, errno_ret), (ret_k, 0, 0, allow)]
    if len(program) != deny_at + 2 or not all(0 <= jt < 256 for _, jt, _, _ in program):
        fail("the seccomp program's jumps do not add up")
    return program


def join_fresh_session_keyring(keyctl_nr):
    """A new anonymous session keyring for this process (keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)), so nothing of
    the launcher's is possessed. ENOSYS (no keyrings) and EPERM/EACCES (an outer filter denies keyctl) leave the
    candidate without keyrings anyway; any other failure refuses the sandbox."""
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(1), ctypes.c_void_p(None)) < 0:
        if ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM, errno.EACCES):
            fail("a fresh session keyring: %s" % os.strerror(ctypes.get_errno()))


def install_seccomp(required):
    """The filter on this process (inherited across fork and exec); `required` (isolated) refuses without it."""
    arch = seccomp_arch()
    if arch is None:
        if required:
            fail("no seccomp filter for the %s architecture (the verifier knows x86_64 and aarch64)"
                 % os.uname().machine)
        return
    program = seccomp_program(*arch)
    filters = (SockFilter * len(program))(*[SockFilter(*ins) for ins in program])
    fprog = SockFprog(len(program), filters)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0 and required:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        fail("seccomp filter: %s" % os.strerror(ctypes.get_errno()))
'''
