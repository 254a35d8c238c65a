"""The seccomp filter every local sandbox process runs under. Standard library only, any
Python >= 3.9: it is copied beside runner.py into the sandbox's directory and installed by the
runner before anything else runs (so its init, its checkpoint copies, its forks and whatever
user code starts all inherit it; a filter can never be removed).

The policy (docs/sandboxes.md, "Seccomp"): a denied call fails with EPERM, never a kill, so
sandbox code sees an ordinary error. Denied:
- sockets of any family but AF_UNIX, AF_INET and AF_INET6 (AF_VSOCK reaches the hypervisor
  and no network namespace covers it; AF_NETLINK, AF_PACKET, AF_ALG, ... are kernel surface
  a REPL never needs); socketpair of any family but AF_UNIX;
- io_uring, bpf, perf_event_open, userfaultfd, the keyring (add_key, request_key, keyctl);
- mounting in any form (mount, umount2, pivot_root, the fsopen/fsmount/open_tree family);
- new namespaces (unshare, setns, clone with a CLONE_NEW* flag: a user namespace would hand
  the sandbox capabilities inside it); clone3, whose flags sit behind a pointer a filter
  cannot read, answers ENOSYS so the C library falls back to clone;
- ptrace and process_vm_readv/writev: a pid namespace per fork family already keeps every
  process outside the family unnamed, and no sandbox needs to trace its own;
- kernel modules, kexec, handles (open_by_handle_at), quotactl, swap, reboot, chroot, and a
  foreign syscall ABI (i386 or x32 on x86_64), which would dodge every number below.
"""

from __future__ import annotations

import ctypes
import platform
import struct

EPERM = 1
ENOSYS = 38
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
CLONE_NEW = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian on both arches)
NR, ARCH, ARG0 = 0, 4, 16
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW = 0x7FFF0000
ERRNO = 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
X32_BIT = 0x40000000


class Arch:
    def __init__(self, audit: int, numbers: dict[str, int], x32: bool = False) -> None:
        self.audit = audit
        self.numbers = numbers
        self.x32 = x32


# Checked against asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64).
_COMMON = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443,
}  # fmt: skip
ARCHES = {
    "x86_64": Arch(0xC000003E, {
        **_COMMON, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101,
        "pivot_root": 155, "chroot": 161, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176,
        "quotactl": 179, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303,
        "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323,
    }, x32=True),
    "aarch64": Arch(0xC00000B7, {
        **_COMMON, "socket": 198, "socketpair": 199, "clone": 220, "ptrace": 117,
        "pivot_root": 41, "chroot": 51, "mount": 40, "umount2": 39, "swapon": 224,
        "swapoff": 225, "reboot": 142, "init_module": 105, "delete_module": 106,
        "quotactl": 60, "kexec_load": 104, "add_key": 217, "request_key": 218, "keyctl": 219,
        "unshare": 97, "perf_event_open": 241, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "finit_module": 273, "kexec_file_load": 294, "bpf": 280,
        "userfaultfd": 282,
    }),
}  # fmt: skip
DENIED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "add_key", "request_key", "keyctl", "mount", "umount2", "pivot_root",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "name_to_handle_at",
    "open_by_handle_at", "quotactl", "quotactl_fd", "swapon", "swapoff", "reboot", "chroot",
)  # fmt: skip


class Program:
    """A classic BPF program with forward jumps to named labels."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, str | int, str | int]] = []  # (op, k, jt, jf)
        self.labels: dict[str, int] = {}

    def op(self, op: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((op, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = b""
        for at, (op, k, jt, jf) in enumerate(self.code):
            out += struct.pack("<HBBI", op, self._jump(at, jt), self._jump(at, jf), k)
        return out

    def _jump(self, at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - at - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"seccomp jump to {target} out of range ({offset})")
        return offset


def program(arch: Arch) -> bytes:
    n = arch.numbers
    p = Program()
    p.op(LD_ABS, ARCH)
    p.op(JEQ, arch.audit, 0, "deny")
    p.op(LD_ABS, NR)
    if arch.x32:
        p.op(JGE, X32_BIT, "deny", 0)
    for name in DENIED:
        p.op(JEQ, n[name], "deny", 0)
    p.op(JEQ, n["clone3"], "nosys", 0)
    p.op(JEQ, n["socket"], "socket", 0)
    p.op(JEQ, n["socketpair"], "socketpair", 0)
    p.op(JEQ, n["clone"], "clone", 0)
    p.op(RET, ALLOW)
    p.label("socket")
    p.op(LD_ABS, ARG0)
    p.op(JEQ, AF_UNIX, "allow", 0)
    p.op(JEQ, AF_INET, "allow", 0)
    p.op(JEQ, AF_INET6, "allow", "deny")
    p.label("socketpair")
    p.op(LD_ABS, ARG0)
    p.op(JEQ, AF_UNIX, "allow", "deny")
    p.label("clone")
    p.op(LD_ABS, ARG0)
    p.op(JSET, CLONE_NEW, "deny", "allow")
    p.label("allow")
    p.op(RET, ALLOW)
    p.label("deny")
    p.op(RET, ERRNO | EPERM)
    p.label("nosys")
    p.op(RET, ERRNO | ENOSYS)
    return p.assemble()


def install() -> None:
    """No new privileges, then the filter, on this thread (call it before any other thread
    exists: threads started later inherit it). Raises OSError when the kernel refuses."""
    arch = ARCHES.get(platform.machine())
    if arch is None:
        raise OSError(f"no seccomp policy for the {platform.machine()!r} architecture")
    code = program(arch)
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                      ctypes.c_ulong]  # fmt: skip
    if prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    filters = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("<HxxxxxxQ", len(code) // 8, ctypes.addressof(filters))
    fprog_buf = ctypes.create_string_buffer(fprog, len(fprog))
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog_buf), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def installed() -> bool:
    with open("/proc/self/status") as status:
        return any(line.split() == ["Seccomp:", "2"] for line in status)
