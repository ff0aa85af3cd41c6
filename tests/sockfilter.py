"""A seccomp filter that makes chosen socket options fail the way an old kernel's do, and a
child process that runs a netprobe self-test (both ends, loopback) under it.

An old kernel answers an option it does not know with ENOPROTOOPT (UDP_SEGMENT before
4.18, UDP_GRO before 5.0), or EINVAL/EOPNOTSUPP. The filter matches setsockopt and
getsockopt by their level and optname arguments (seccomp compares the raw register
values, never the user memory behind the pointers) and returns that errno; every other
call is allowed. Loaded with the real libseccomp through ctypes, as tests/unitfilter.py
does for the systemd unit. A filter cannot shorten what a call returns, so a short
TCP_INFO is not made here (see tests/test_old_kernels.py).

Run as ``python -m tests.sockfilter RULES SPEC``: RULES a JSON list of
[call, level, optname, errno name], SPEC a TestSpec's JSON; prints the Result's JSON.
SPEC ``core-udp`` instead sends 300 datagrams of 1400 bytes with the core's own udp_send
(gso=True) over loopback and prints the sender's packets and messages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import subprocess
import sys
from pathlib import Path

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4  # enum scmp_compare: NE=1, LT, LE, EQ, GE, GT, MASKED_EQ


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    # struct scmp_arg_cmp (seccomp.h)
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def available() -> bool:
    """Whether a filter can be loaded here and does what it says: libseccomp is installed,
    and a child that refuses one option sees exactly that refusal. Under qemu-user (the ARM
    wheels' suite) the guest's filter never reaches the host's kernel as written, so the
    child fails or is killed: no."""
    if ctypes.util.find_library("seccomp") is None:
        return False
    probe = ("import errno, socket, sys\n"
             "from tests import sockfilter\n"
             "sockfilter.refuse([('getsockopt', socket.SOL_SOCKET, socket.SO_RCVLOWAT, "
             "'ENOPROTOOPT')])\n"
             "s = socket.socket()\n"
             "try:\n"
             "    s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)\n"
             "except OSError as exc:\n"
             "    sys.exit(0 if exc.errno == errno.ENOPROTOOPT else 3)\n"
             "sys.exit(4)\n")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60,
                              cwd=str(Path(__file__).resolve().parents[1]))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def refuse(rules: list[tuple[str, int, int, str]]) -> None:
    """Load a filter into this process: each (call, level, optname, errno name) makes that
    call on that option fail with that errno; everything else is allowed."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    for call, level, optname, name in rules:
        number = lib.seccomp_syscall_resolve_name(call.encode())
        if number < 0:
            raise OSError(f"no system call {call} here")
        # setsockopt/getsockopt(fd, level, optname, ...): arguments 1 and 2
        cmps = (_ArgCmp * 2)(_ArgCmp(1, SCMP_CMP_EQ, level, 0),
                             _ArgCmp(2, SCMP_CMP_EQ, optname, 0))
        rc = lib.seccomp_rule_add_array(ctx, _errno_action(getattr(errno, name)), number, 2,
                                        cmps)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add_array({call}, {level}, {optname})")
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        raise OSError(-rc, "seccomp_load")


def _core_udp() -> dict[str, int]:
    import socket

    from netprobe import core

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        tx.connect(rx.getsockname())
        c = core.Counters()
        core.udp_send(tx.fileno(), c, length=1400, max_packets=300, gso=True)
        return {"packets": c.packets, "messages": c.messages}


def main(argv: list[str]) -> int:
    """Filter this process, then run the self-test and print its Result."""
    rules = [tuple(r) for r in json.loads(argv[0])]
    refuse(rules)  # type: ignore[arg-type]
    # Imported after the filter: nothing of netprobe has touched a socket before it.
    if argv[1] == "core-udp":
        print(json.dumps(_core_udp()))
        return 0
    from netprobe.convert import to_json
    from netprobe.schema import TestSpec
    from netprobe.tools.native import NativeTool

    class _Quiet:
        def interval(self, sample: object) -> None:
            pass

        def note(self, message: str) -> None:
            pass

    spec = TestSpec(**json.loads(argv[1]))
    result = NativeTool().run(spec, _Quiet())  # type: ignore[arg-type]
    print(to_json(result, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
