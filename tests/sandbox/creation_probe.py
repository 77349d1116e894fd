"""A program for the sandbox (issue 32): it tries every way to make a process, a thread or a namespace and exits 0
only when each one was refused with EPERM by the seccomp filter (threading's RuntimeError for a thread); otherwise
it exits naming what it made or what answered otherwise. The sandbox tests run it in each shape the verifier knows:
root with CAP_SYS_ADMIN, root without it (the helper-mapped sandbox uid), an unprivileged user, and uid 0 of a user
namespace that maps root alone (test_verifier_one_uid.py)."""

NO_CREATION = r"""
import ctypes, errno, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
wrong = []
def refused(name, action):
    try:
        action()
    except PermissionError:
        return
    except OSError as exc:
        wrong.append("%s: %s" % (name, errno.errorcode.get(exc.errno, exc.errno)))
        return
    wrong.append(name + ": allowed")
def fork():
    if os.fork() == 0:
        os._exit(0)
refused("fork", fork)  # glibc's fork is the clone system call
refused("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {}))  # clone(CLONE_VM | CLONE_VFORK)
try:
    threading.Thread(target=lambda: None).start()
    wrong.append("thread: started")
except RuntimeError:
    pass
def raw(name, result):
    if result >= 0 or ctypes.get_errno() != errno.EPERM:
        wrong.append("%s: %s" % (name, "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno())))
raw("unshare", libc.unshare(0))  # flags 0: the kernel would allow it
raw("setns", libc.setns(-1, 0))  # the kernel would answer EBADF
if os.uname().machine == "x86_64":
    raw("clone3", libc.syscall(ctypes.c_long(435), None, ctypes.c_long(0)))  # the kernel would answer EINVAL
if wrong:
    sys.exit("made or not refused by the filter: %s" % wrong)
"""
