"""The system-call filter a systemd unit declares, built with the real libseccomp the way
systemd builds it, to load into a test's child process before it executes the service.

systemd's semantics, mirrored (systemd.exec(5), SystemCallFilter=):

* the first ``SystemCallFilter=`` line decides the mode: a list without ``~`` is an allow
  list (``@default`` is added to it implicitly); later lines add names, ``~`` lines remove;
* ``@set`` names are expanded by ``systemd-analyze syscall-filter``, i.e. by the systemd on
  this machine, nested sets included;
* a call outside the list kills the process with SIGSYS, unless ``SystemCallErrorNumber=``
  names an errno, which the call then returns;
* ``NoNewPrivileges`` is what libseccomp sets before loading (its default);
  ``SystemCallArchitectures=native`` is libseccomp's default context (other ABIs are killed).

Only the filter is reproduced: the unit's other sandboxing (DynamicUser, ProtectSystem...)
needs systemd as PID 1, which a test machine may not have.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import subprocess

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000


def SCMP_ACT_ERRNO(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@functools.cache
def expand(name: str) -> frozenset[str]:
    """The system calls a filter name stands for: a set expanded by systemd, else itself."""
    if not name.startswith("@"):
        return frozenset({name})
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        calls |= expand(word)
    return frozenset(calls)


def unit_filter(unit_text: str) -> tuple[frozenset[str], int]:
    """(allowed system calls, action for the rest) of a unit's [Service] settings."""
    lines = [line.split("=", 1)[1].strip() for line in unit_text.splitlines()
             if line.startswith("SystemCallFilter=")]
    if not lines or lines[0].startswith("~"):
        raise ValueError("the unit has no allow-list SystemCallFilter= (not mirrored here)")
    allowed: set[str] = set(expand("@default"))
    for value in lines:
        deny = value.startswith("~")
        names = {c for word in value.lstrip("~").split() for c in expand(word)}
        allowed = allowed - names if deny else allowed | names
    action = SCMP_ACT_KILL_PROCESS
    for line in unit_text.splitlines():
        if line.startswith("SystemCallErrorNumber="):
            action = SCMP_ACT_ERRNO(getattr(errno, line.split("=", 1)[1].strip()))
    return frozenset(allowed), action


def load(allowed: frozenset[str], default_action: int) -> None:
    """Load the filter into this process (inherited by what it executes next)."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(default_action)
    if not ctx:
        raise OSError("seccomp_init failed")
    for name in sorted(allowed):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a call of this architecture (systemd skips those too)
            continue
        rc = lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, number, 0)
        if rc < 0 and rc != -errno.EEXIST:
            raise OSError(-rc, f"seccomp_rule_add({name})")
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        raise OSError(-rc, "seccomp_load")
