"""In-sandbox probe: runs *inside* a sandbox under Debian's /usr/bin/python3.

Reads one JSON request per line on stdin and answers one JSON line on stdout, so one probe
sandbox can be asked many questions. Only the standard library is available (the sandbox
sees the host's /usr, not the test venv). Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
_kept: list[socket.socket] = []


def _errno_of(exc: OSError) -> dict[str, object]:
    return {"ok": False, "errno": exc.errno, "error": errno.errorcode.get(exc.errno or 0, "?")}


def op_ping(_: dict[str, object]) -> dict[str, object]:
    return {"ok": True, "pid": os.getpid(), "uid": os.getuid()}


def op_status(_: dict[str, object]) -> dict[str, object]:
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return {"ok": True, "status": fields}


def op_limits(_: dict[str, object]) -> dict[str, object]:
    with open("/proc/self/limits") as fh:
        return {"ok": True, "limits": fh.read()}


def op_connect(req: dict[str, object]) -> dict[str, object]:
    host, port = str(req["host"]), int(str(req["port"]))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_DGRAM if req.get("udp") else socket.SOCK_STREAM
    sock = socket.socket(family, kind)
    sock.settimeout(5)
    try:
        sock.connect((host, port))
        if req.get("udp"):
            sock.send(b"probe")
            return {"ok": True}
        payload = str(req.get("send", ""))
        if payload:
            sock.sendall(payload.encode())
            return {"ok": True, "reply": sock.recv(1024).decode()}
        return {"ok": True}
    except OSError as exc:
        return _errno_of(exc)
    finally:
        sock.close()


def op_syscall(req: dict[str, object]) -> dict[str, object]:
    args = [ctypes.c_long(int(str(a))) for a in list(req["args"])]  # type: ignore[call-overload]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(int(str(req["nr"]))), *args)
    return {"ok": True, "ret": ret, "errno": ctypes.get_errno() if ret == -1 else 0}


def op_x32(_: dict[str, object]) -> dict[str, object]:
    # getpid through the x32 ABI (syscall number | __X32_SYSCALL_BIT), in a child.
    pid = os.fork()
    if pid == 0:
        libc.syscall(ctypes.c_long(0x40000000 | 39))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return {"ok": True, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0}


def op_exists(req: dict[str, object]) -> dict[str, object]:
    return {"ok": True, "exists": {p: os.path.lexists(p) for p in list(req["paths"])}}  # type: ignore[call-overload]


def op_listdir(req: dict[str, object]) -> dict[str, object]:
    try:
        return {"ok": True, "entries": sorted(os.listdir(str(req["path"])))}
    except OSError as exc:
        return _errno_of(exc)


def op_write(req: dict[str, object]) -> dict[str, object]:
    try:
        with open(str(req["path"]), "w") as fh:
            fh.write(str(req.get("data", "")))
    except OSError as exc:
        return _errno_of(exc)
    return {"ok": True}


def op_read(req: dict[str, object]) -> dict[str, object]:
    try:
        with open(str(req["path"])) as fh:
            return {"ok": True, "data": fh.read()}
    except OSError as exc:
        return _errno_of(exc)


def op_fds(_: dict[str, object]) -> dict[str, object]:
    fd_dir = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds = {}
        for name in os.listdir(fd_dir):
            if int(name) == fd_dir:
                continue
            try:
                fds[name] = os.readlink(name, dir_fd=fd_dir)
            except OSError:
                continue  # the listing's own transient descriptor
        return {"ok": True, "fds": fds}
    finally:
        os.close(fd_dir)


def op_abstract_bind(req: dict[str, object]) -> dict[str, object]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind("\0" + str(req["name"]))
        sock.listen(1)
    except OSError as exc:
        sock.close()
        return _errno_of(exc)
    _kept.append(sock)
    return {"ok": True}


def op_abstract_connect(req: dict[str, object]) -> dict[str, object]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + str(req["name"]))
    except OSError as exc:
        return _errno_of(exc)
    finally:
        sock.close()
    return {"ok": True}


def op_forkbomb(_: dict[str, object]) -> dict[str, object]:
    # Every process forks until the kernel refuses, then parks; the root reports.
    forked = 0
    while True:
        try:
            pid = os.fork()
        except OSError as exc:
            return {"ok": True, "forked": forked, "errno": exc.errno}
        if pid == 0:
            _bomb_child()
        forked += 1


def _bomb_child() -> None:
    while True:
        try:
            if os.fork() == 0:
                continue
        except OSError:
            while True:
                signal.pause()


def op_balloon(req: dict[str, object]) -> dict[str, object]:
    chunk = int(str(req.get("chunk_mb", 8))) << 20
    limit = int(str(req.get("max_mb", 2048))) << 20
    pid = os.fork()
    if pid == 0:
        held, total = [], 0
        while total < limit:
            held.append(b"x" * chunk)  # b"x" * n writes every page, unlike calloc'd zeros
            total += chunk
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"ok": True, "signal": os.WTERMSIG(status)}
    return {"ok": True, "exit": os.WEXITSTATUS(status)}


def op_daemon(_: dict[str, object]) -> dict[str, object]:
    # Classic double fork + setsid: the grandchild is reparented away from us.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            while True:
                signal.pause()
        os._exit(0)
    os.waitpid(pid, 0)
    grandchild = int(os.read(read_end, 32))
    os.close(read_end)
    os.close(write_end)
    return {"ok": True, "pid": grandchild}


def op_trap_term(_: dict[str, object]) -> dict[str, object]:
    def on_term(signum: int, frame: object) -> None:
        sys.stderr.write("probe: got SIGTERM, exiting cleanly\n")
        sys.stderr.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    return {"ok": True}


def op_ignore_term(_: dict[str, object]) -> dict[str, object]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return {"ok": True}


def op_symlink(req: dict[str, object]) -> dict[str, object]:
    try:
        os.symlink(str(req["target"]), str(req["path"]))
    except OSError as exc:
        return _errno_of(exc)
    return {"ok": True}


def op_fill(req: dict[str, object]) -> dict[str, object]:
    # Write 1 MiB blocks until the file system (a size-limited tmpfs) refuses.
    written = 0
    block = b"x" * (1 << 20)
    try:
        with open(str(req["path"]), "wb") as fh:
            while written < int(str(req.get("max_mb", 4096))) << 20:
                fh.write(block)
                fh.flush()
                written += len(block)
    except OSError as exc:
        return {**_errno_of(exc), "written": written}
    return {"ok": True, "written": written}


def op_open_files(_: dict[str, object]) -> dict[str, object]:
    fds = []
    try:
        while len(fds) < 1_000_000:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as exc:
        return {**_errno_of(exc), "opened": len(fds)}
    finally:
        for fd in fds:
            os.close(fd)
    return {"ok": True, "opened": len(fds)}


def op_env(_: dict[str, object]) -> dict[str, object]:
    return {"ok": True, "env": dict(os.environ), "cwd": os.getcwd()}


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        started = time.monotonic()
        try:
            reply = OPS[req["op"]](req)
        except Exception as exc:  # report, keep serving
            reply = {"ok": False, "exception": repr(exc)}
        reply["elapsed"] = time.monotonic() - started
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
