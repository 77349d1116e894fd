"""Pins issue 25's red-team findings 3 and 4 (follow-up) in the seccomp program itself, run by a small interpreter
of the classic-BPF instructions it uses, on both architectures' numbers: semget, msgget (unaccounted System V
kernel memory) and socketpair answer EPERM, socket() answers EPERM for every family but AF_INET and AF_INET6
(its first argument), another architecture is killed, x32 refused, and ordinary calls allowed."""

import ctypes
import errno
import os
import struct

import pytest

from polarstack.reward.verifier.seccomp import _SECCOMP

ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM


def _fail(message):
    raise AssertionError(message)


@pytest.fixture(scope="module")
def seccomp():
    namespace = {"ctypes": ctypes, "errno": errno, "os": os, "fail": _fail, "libc": None}
    exec(_SECCOMP, namespace)
    return namespace


def _run(program, nr, arch, args=(0,) * 6):
    """The filter's answer for struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]} (little-endian)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if acc == k else jf
        elif code == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += jt if acc >= k else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unknown instruction {code:#x}")
        pc += 1


NUMBERS = {  # arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h
    "x86_64": {"semget": 64, "msgget": 68, "shmget": 29, "socketpair": 53, "socket": 41, "read": 0, "mmap": 9},
    "aarch64": {"semget": 190, "msgget": 186, "shmget": 194, "socketpair": 199, "socket": 198, "read": 63, "mmap": 222},
}
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17, "AF_VSOCK": 40}


@pytest.mark.parametrize("machine", sorted(NUMBERS))
def test_system_v_creation_and_socketpair_answer_eperm(seccomp, machine):
    audit, x32, denied, socket_nr = seccomp["SECCOMP_ARCHES"][machine]
    program = seccomp["seccomp_program"](audit, x32, denied, socket_nr)
    numbers = NUMBERS[machine]
    assert socket_nr == numbers["socket"]
    for name in ("semget", "msgget", "shmget", "socketpair"):
        assert _run(program, numbers[name], audit, (1, 1, 0, 0, 0, 0)) == EPERM, name
    for name in ("read", "mmap"):
        assert _run(program, numbers[name], audit) == ALLOW, name
    assert _run(program, numbers["read"], audit ^ 1) == KILL  # another architecture's entry
    if x32:
        assert _run(program, numbers["read"] | 0x40000000, audit) == EPERM


@pytest.mark.parametrize("machine", sorted(NUMBERS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_socket_is_refused_for_every_family_but_inet(seccomp, machine, family):
    audit, x32, denied, socket_nr = seccomp["SECCOMP_ARCHES"][machine]
    program = seccomp["seccomp_program"](audit, x32, denied, socket_nr)
    answer = _run(program, socket_nr, audit, (FAMILIES[family], 1, 0, 0, 0, 0))
    assert answer == (ALLOW if family in ("AF_INET", "AF_INET6") else EPERM)
    # the family is an int: a high word does not make AF_UNIX pass, nor refuse AF_INET (the kernel truncates)
    high = (1 << 32) | FAMILIES[family]
    assert _run(program, socket_nr, audit, (high, 1, 0, 0, 0, 0)) == answer


# Issue 32: every way to make a process, a thread or a namespace (arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h, written out here rather than read from the filter's own table); aarch64 has no
# fork nor vfork. Calls next to them (wait4, exit_group, execve, getpid) stay allowed.
CREATION = {
    "x86_64": {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "unshare": 272, "setns": 308},
    "aarch64": {"clone": 220, "clone3": 435, "unshare": 97, "setns": 268},
}
NEIGHBOURS = {
    "x86_64": {"wait4": 61, "exit_group": 231, "execve": 59, "getpid": 39},
    "aarch64": {"wait4": 260, "exit_group": 94, "execve": 221, "getpid": 172},
}


@pytest.mark.parametrize("machine", sorted(CREATION))
def test_process_thread_and_namespace_creation_answer_eperm(seccomp, machine):
    audit, x32, denied, socket_nr = seccomp["SECCOMP_ARCHES"][machine]
    program = seccomp["seccomp_program"](audit, x32, denied, socket_nr)
    for name, nr in CREATION[machine].items():
        # thread flags, plain fork flags (SIGCHLD) and no flags at all: refused whatever the arguments
        for args in ((0x3D0F00, 0, 0, 0, 0, 0), (17, 0, 0, 0, 0, 0), (0,) * 6):
            assert _run(program, nr, audit, args) == EPERM, (machine, name, args)
    for name, nr in NEIGHBOURS[machine].items():
        assert _run(program, nr, audit) == ALLOW, (machine, name)
